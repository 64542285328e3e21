//! What every nemesis (faults drawn at random from a seed) shares: the dice a seed's schedule is
//! drawn with, the seeds a run takes from its environment variable, the windows that excuse a
//! lost write, a schedule in a row's words, and the run's final check that no seed failed.

use std::fmt::{Debug, Display};
use std::time::Duration;

use tokio::time::Instant;

/// SplitMix64: a seed's whole schedule, the same on every run and every machine.
pub struct Dice(u64);

impl Dice {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number of the sequence.
    pub fn roll(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.roll() % n
    }

    /// One of `choices`.
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len() as u64) as usize]
    }
}

/// The seeds `variable` names (`3`, `1,4,9`, `1-50`), or `default` when it is unset. A seed
/// that is not a number fails the run with the variable's name.
pub fn seeds(variable: &str, default: &[u64]) -> Vec<u64> {
    let Ok(text) = std::env::var(variable) else {
        return default.to_vec();
    };
    let number = |word: &str| -> u64 {
        word.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{variable}={text}: {word:?} is not a seed"))
    };
    text.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (number(a)..=number(b)).collect::<Vec<_>>(),
            None => vec![number(part)],
        })
        .collect()
}

/// Stretches of time within which an acknowledged write may be lost (a primary died, or was cut
/// off in the minority, with writes no replica had yet).
#[derive(Default)]
pub struct Windows(Vec<(Instant, Instant)>);

impl Windows {
    /// Writes acknowledged from `from` to `to` may be lost.
    pub fn excuse(&mut self, from: Instant, to: Instant) {
        self.0.push((from, to));
    }

    /// Whether a write acknowledged at `acknowledged` falls in a window, or within `slack`
    /// before one (the copy to the replica trails the acknowledgement).
    pub fn excuses(&self, acknowledged: Instant, slack: Duration) -> bool {
        self.0
            .iter()
            .any(|&(from, to)| acknowledged <= to && acknowledged + slack >= from)
    }
}

/// A schedule in a row's words: `Change: fault@1.2s, fault@3.4s`.
pub fn schedule_words(change: &impl Debug, faults: &[(Duration, impl Display)]) -> String {
    let faults: Vec<String> = faults
        .iter()
        .map(|(at, fault)| format!("{fault}@{:.1}s", at.as_secs_f64()))
        .collect();
    format!("{change:?}: {}", faults.join(", "))
}

/// Fails the run unless no seed failed: `failures` are each seed's failure, if any; the message
/// says how to replay one with `variable`.
pub fn assert_no_failing_seeds<'a>(
    failures: impl IntoIterator<Item = (u64, Option<&'a String>)>,
    variable: &str,
) {
    let failed: Vec<String> = failures
        .into_iter()
        .filter_map(|(seed, failure)| Some(format!("seed {seed}: {}", failure?)))
        .collect();
    assert!(
        failed.is_empty(),
        "failing seeds (replay with {variable}=<seed>): {failed:#?}"
    );
}
