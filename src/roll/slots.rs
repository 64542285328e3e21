//! Slot arithmetic for the planner: the even share of the 16384 hash slots each shard should
//! own, the contiguous layout used at bootstrap, and picking which slots to move.

use super::model::SlotRange;

/// Number of hash slots in a Valkey cluster.
pub const SLOT_COUNT: u32 = 16384;

/// How many slots shard `shard` owns once `shards` shards are balanced: an even split, the
/// remainder going to the lowest shards. Shards at or above `shards` own none.
pub fn target_count(shard: u32, shards: u32) -> u32 {
    if shard >= shards {
        return 0;
    }
    SLOT_COUNT / shards + u32::from(shard < SLOT_COUNT % shards)
}

/// The contiguous range shard `shard` owns in a freshly bootstrapped cluster of `shards`.
pub fn bootstrap_range(shard: u32, shards: u32) -> SlotRange {
    let start: u32 = (0..shard).map(|s| target_count(s, shards)).sum();
    let end = start + target_count(shard, shards) - 1;
    SlotRange::new(to_slot(start), to_slot(end))
}

fn to_slot(slot: u32) -> u16 {
    // Slots are below SLOT_COUNT by construction, so this never saturates.
    u16::try_from(slot).unwrap_or(u16::MAX)
}

/// Which of the 16384 slots are covered by `ranges`.
pub fn coverage<'a>(ranges: impl IntoIterator<Item = &'a SlotRange>) -> Vec<bool> {
    let mut covered = vec![false; SLOT_COUNT as usize];
    for range in ranges {
        for slot in range.start..=range.end.min(to_slot(SLOT_COUNT - 1)) {
            covered[usize::from(slot)] = true;
        }
    }
    covered
}

/// The parts of `range` not marked in `covered`, as ranges.
pub fn uncovered_parts(range: SlotRange, covered: &[bool]) -> Vec<SlotRange> {
    compress(
        (range.start..=range.end)
            .filter(|&slot| !covered.get(usize::from(slot)).copied().unwrap_or(false)),
    )
}

/// The `count` highest slots of `ranges` (fewer if they hold fewer), as sorted ranges.
pub fn take_highest(ranges: &[SlotRange], count: u32) -> Vec<SlotRange> {
    let mut sorted = ranges.to_vec();
    sorted.sort();
    let mut taken: Vec<u16> = sorted
        .iter()
        .rev()
        .flat_map(|range| (range.start..=range.end).rev())
        .take(count as usize)
        .collect();
    taken.reverse();
    compress(taken.into_iter())
}

/// Sorted, distinct slots into the fewest ranges.
pub fn compress(slots: impl Iterator<Item = u16>) -> Vec<SlotRange> {
    let mut out: Vec<SlotRange> = Vec::new();
    for slot in slots {
        match out.last_mut() {
            Some(last) if u32::from(last.end) + 1 == u32::from(slot) => last.end = slot,
            _ => out.push(SlotRange::new(slot, slot)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_layout_covers_every_slot_once() {
        for shards in 1..=7 {
            let ranges: Vec<SlotRange> = (0..shards).map(|s| bootstrap_range(s, shards)).collect();
            let total: u32 = ranges.iter().map(SlotRange::count).sum();
            assert_eq!(total, SLOT_COUNT);
            assert!(coverage(&ranges).iter().all(|&c| c));
            assert_eq!(ranges[0].start, 0);
        }
        assert_eq!(bootstrap_range(0, 3), SlotRange::new(0, 5461));
        assert_eq!(bootstrap_range(2, 3), SlotRange::new(10923, 16383));
    }

    #[test]
    fn take_highest_takes_from_the_top_across_ranges() {
        let ranges = [SlotRange::new(10, 12), SlotRange::new(0, 3)];
        assert_eq!(
            take_highest(&ranges, 5),
            vec![SlotRange::new(2, 3), SlotRange::new(10, 12)]
        );
        assert_eq!(take_highest(&ranges, 50).len(), 2);
    }

    #[test]
    fn uncovered_parts_skip_owned_slots() {
        let covered = coverage(&[SlotRange::new(5, 6)]);
        assert_eq!(
            uncovered_parts(SlotRange::new(3, 8), &covered),
            vec![SlotRange::new(3, 4), SlotRange::new(7, 8)]
        );
    }
}
