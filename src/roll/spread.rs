//! How crowded a cluster's primaries stand over zones and hosts: what heirs are chosen by and
//! what rule 12 lowers by planned switchovers, so that one host's or one zone's loss takes as
//! few primaries as it can (never a majority, where the cluster's nodes allow it).

use std::collections::BTreeMap;

use super::model::Location;

/// How crowded a set of primaries stands: for zones, then for hosts, the sum over each place of
/// the square of how many primaries stand there. Compared in that order, lower is better
/// spread. Squares are what make rebalancing end: moving one primary from a place holding `n`
/// to one holding `m` lowers the sum exactly when `m ≤ n − 2`, so every move that lowers it
/// leaves the place it left no emptier than the one it went to, and no later move brings it
/// back. Places that are unknown are not counted (nothing is learnt about them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crowding {
    zones: u64,
    hosts: u64,
}

impl Crowding {
    /// The crowding of primaries standing at `locations`.
    pub fn of<'a>(locations: impl IntoIterator<Item = &'a Location>) -> Self {
        let mut zones: BTreeMap<&str, u64> = BTreeMap::new();
        let mut hosts: BTreeMap<&str, u64> = BTreeMap::new();
        for location in locations {
            if let Some(zone) = &location.zone {
                *zones.entry(zone).or_default() += 1;
            }
            if let Some(host) = &location.host {
                *hosts.entry(host).or_default() += 1;
            }
        }
        let squares = |counts: BTreeMap<&str, u64>| counts.values().map(|n| n * n).sum();
        Self {
            zones: squares(zones),
            hosts: squares(hosts),
        }
    }
}

/// The most ways of choosing every shard's primary [`best_choice`] weighs; beyond it (a cluster
/// of more than ten shards with a replica each, say) it says nothing, and the caller moves
/// one primary at a time to wherever that alone lowers the crowding.
pub const MAX_WAYS: usize = 1024;

/// Where each shard's primary should stand. `candidates[s]` are the places shard `s`'s primary
/// may stand (its primary's and its synced replicas', in an order that does not depend on
/// which of them is primary now, e.g. by name) and `current[s]` the index of its primary's.
/// Of every way to choose one per shard: the least crowded, then the one moving the fewest
/// primaries from where they stand, then the first in the candidates' order. Moving one shard
/// to its choice leaves the choice of every shard the same (any other way would have had to
/// win before), so each shard moves at most once, straight to it. `None` past [`MAX_WAYS`].
pub fn best_choice(candidates: &[Vec<&Location>], current: &[usize]) -> Option<Vec<usize>> {
    let ways = candidates
        .iter()
        .try_fold(1usize, |ways, c| ways.checked_mul(c.len().max(1)))?;
    if ways > MAX_WAYS || candidates.iter().any(Vec::is_empty) {
        return None;
    }
    let mut choice = vec![0; candidates.len()];
    let mut best: Option<(Crowding, usize, Vec<usize>)> = None;
    loop {
        let crowding = Crowding::of(choice.iter().zip(candidates).map(|(&i, c)| c[i]));
        let moves = choice.iter().zip(current).filter(|(i, c)| i != c).count();
        if best
            .as_ref()
            .is_none_or(|(c, m, _)| (crowding, moves) < (*c, *m))
        {
            best = Some((crowding, moves, choice.clone()));
        }
        // The next way, the last shard's choice turning fastest (so ways come in order).
        let Some(shard) = (0..choice.len())
            .rev()
            .find(|&s| choice[s] + 1 < candidates[s].len())
        else {
            break;
        };
        choice[shard] += 1;
        for later in &mut choice[shard + 1..] {
            *later = 0;
        }
    }
    best.map(|(_, _, choice)| choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(zone: &str, host: &str) -> Location {
        Location {
            host: Some(host.into()),
            zone: Some(zone.into()),
        }
    }

    #[test]
    fn zones_weigh_before_hosts_and_unknown_places_count_for_nothing() {
        let two_in_a = Crowding::of(&[at("a", "h1"), at("a", "h2"), at("b", "h3")]);
        let spread = Crowding::of(&[at("a", "h1"), at("b", "h2"), at("c", "h3")]);
        let one_host = Crowding::of(&[at("a", "h1"), at("b", "h1"), at("c", "h1")]);
        assert!(spread < two_in_a);
        // Three zones on one host are better than two in one zone on three hosts.
        assert!(one_host < two_in_a);
        assert!(spread < one_host);
        let unknown = Location::default();
        assert_eq!(
            Crowding::of(&[unknown.clone(), unknown]),
            Crowding::default()
        );
    }

    #[test]
    fn a_move_lowers_crowding_only_from_a_place_holding_two_more() {
        // Host h1 holds 2, h2 holds 1, h3 none (all one zone).
        let before = Crowding::of(&[at("z", "h1"), at("z", "h1"), at("z", "h2")]);
        let to_h2 = Crowding::of(&[at("z", "h1"), at("z", "h2"), at("z", "h2")]);
        let to_h3 = Crowding::of(&[at("z", "h1"), at("z", "h3"), at("z", "h2")]);
        assert_eq!(to_h2, before, "2 → 1 only swaps which host holds two");
        assert!(to_h3 < before);
    }

    #[test]
    fn the_best_choice_may_need_two_moves_where_no_single_one_helps() {
        // Shards 0 and 2 primary on b, shard 1 on c; their replicas on c, a and c. Moving any
        // one primary alone lowers nothing; moving shard 1 to a and then shard 0 (or 2) to c
        // spreads them.
        let (a, b, c) = (at("a", "a"), at("b", "b"), at("c", "c"));
        let candidates = vec![vec![&b, &c], vec![&c, &a], vec![&b, &c]];
        let choice = best_choice(&candidates, &[0, 0, 0]);
        assert_eq!(choice, Some(vec![0, 1, 1]));
        // Once shard 1 has moved, the choice stands.
        assert_eq!(best_choice(&candidates, &[0, 1, 0]), Some(vec![0, 1, 1]));
        // Already spread: nothing moves.
        assert_eq!(best_choice(&candidates, &[0, 1, 1]), Some(vec![0, 1, 1]));
    }

    #[test]
    fn too_many_ways_are_not_weighed() {
        let here = at("a", "a");
        let candidates = vec![vec![&here, &here]; 11];
        assert_eq!(best_choice(&candidates, &[0; 11]), None);
    }
}
