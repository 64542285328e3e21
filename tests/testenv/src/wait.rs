//! Waiting for a condition instead of sleeping for a guessed time: the one polling helper of the
//! tests. It lives here, the lowest of the test crates, so testenv's own tests can use it without
//! a dependency cycle; the `harness` crate re-exports it for everything else.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::Instant;

/// The first pause between checks; it doubles up to [`LONGEST_PAUSE`], so a condition that
/// holds almost at once is seen almost at once, and a slow one does not flood the API server.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// What a check returns. `Some`, `Ok` and `true` end the wait with their value; `None`, `Err`
/// and `false` mean "not yet", and an `Err`'s text is shown as the last state seen if the wait
/// times out.
pub trait Outcome {
    type Value;
    fn into_result(self) -> Result<Self::Value, String>;
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_result(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn into_result(self) -> Result<T, String> {
        self.map_err(|error| error.to_string())
    }
}

impl Outcome for bool {
    type Value = ();
    fn into_result(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

/// Runs `check` until it succeeds and returns its value; panics once `within` has passed,
/// naming `what` and the last state the check reported.
///
/// ```no_run
/// # async fn demo(pods: &[u32]) {
/// use std::time::Duration;
/// let first = testenv::eventually("a Pod", Duration::from_secs(60), async || pods.first()).await;
/// # }
/// ```
pub async fn eventually<O: Outcome>(
    what: impl Display,
    within: Duration,
    check: impl AsyncFnMut() -> O,
) -> O::Value {
    match until(within, check).await {
        Ok(value) => value,
        Err(last) if last.is_empty() => panic!("timed out after {within:?} waiting for {what}"),
        Err(last) => panic!("timed out after {within:?} waiting for {what}; last seen:\n{last}"),
    }
}

/// [`eventually`] that returns the last state seen when `within` has passed, instead of
/// panicking (for a caller that reports a timeout as one result among others).
pub async fn until<O: Outcome>(
    within: Duration,
    mut check: impl AsyncFnMut() -> O,
) -> Result<O::Value, String> {
    let deadline = Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match check().await.into_result() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(last);
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_success() {
        let mut calls = 0;
        let value = eventually("the third call", Duration::from_secs(5), async || {
            calls += 1;
            (calls == 3).then_some(calls)
        })
        .await;
        assert_eq!(value, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 50ms waiting for nothing; last seen:\nstill no")]
    async fn panics_with_what_and_the_last_state() {
        eventually("nothing", Duration::from_millis(50), async || {
            Err::<(), _>("still no")
        })
        .await;
    }
}
