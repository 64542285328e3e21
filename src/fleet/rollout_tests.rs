use super::*;

const NEW: &str = "r2";

fn key(name: &str) -> ClusterKey {
    ClusterKey::new("ns", name)
}

fn standing(wave: Wave, progress: RolloutProgress) -> Standing {
    Standing {
        group: Some("base".into()),
        chain: vec!["child".into(), "base".into()],
        image: "valkey-9-1-2".into(),
        wave,
        target: NEW.into(),
        progress,
    }
}

fn fleet(members: &[(&str, Wave, RolloutProgress)]) -> BTreeMap<ClusterKey, Standing> {
    members
        .iter()
        .map(|(name, wave, progress)| (key(name), standing(*wave, *progress)))
        .collect()
}

/// A policy with a cap and no windows (leaked: a test's few bytes, for its `Asking`).
fn cap(max_concurrent: Option<u32>) -> &'static Policy {
    Box::leak(Box::new(Policy {
        max_concurrent,
        windows: Windows::default(),
    }))
}

fn noon() -> Timestamp {
    "2026-12-04T12:00:00Z".parse().unwrap()
}

fn ask<'a>(key: &'a ClusterKey, standing: &'a Standing, max: Option<u32>) -> Asking<'a> {
    Asking {
        key,
        standing,
        policy: Some(cap(max)),
        now: noon(),
        paused: false,
        started: false,
        mid_shard: false,
        members: &[],
        learning: true,
    }
}

#[test]
fn a_new_leader_starts_nobody_until_it_has_seen_every_member() {
    let fleet = fleet(&[("a", Wave::Last, RolloutProgress::Rolling)]);
    let me = key("me");
    let mine = standing(Wave::Last, RolloutProgress::Queued);
    let members = [key("a"), key("me"), key("b")];
    let mut asking = ask(&me, &mine, Some(2));
    asking.members = &members;
    assert_eq!(
        gate(&asking, &fleet),
        Verdict::Wait(WaitFor::Learning { unseen: 1 })
    );
    asking.learning = false;
    assert_eq!(gate(&asking, &fleet), Verdict::Go, "past the learning time");
    asking.learning = true;
    asking.members = &members[..2];
    assert_eq!(gate(&asking, &fleet), Verdict::Go);
}

#[test]
fn without_a_policy_everything_starts_at_once_unless_paused() {
    let fleet = fleet(&[
        ("a", Wave::Last, RolloutProgress::Rolling),
        ("b", Wave::Last, RolloutProgress::Stalled),
    ]);
    let me = key("c");
    let mine = standing(Wave::Last, RolloutProgress::Queued);
    let mut asking = ask(&me, &mine, None);
    asking.policy = None;
    assert_eq!(gate(&asking, &fleet), Verdict::Go);
    asking.paused = true;
    assert_eq!(gate(&asking, &fleet), Verdict::Wait(WaitFor::Paused));
}

#[test]
fn the_cap_counts_members_rolling_on_the_same_target() {
    let mut fleet = fleet(&[
        ("a", Wave::Last, RolloutProgress::Rolling),
        ("b", Wave::Last, RolloutProgress::Rolling),
        ("c", Wave::Last, RolloutProgress::UpToDate),
    ]);
    let me = key("d");
    let mine = standing(Wave::Last, RolloutProgress::Queued);
    assert_eq!(
        gate(&ask(&me, &mine, Some(2)), &fleet),
        Verdict::Wait(WaitFor::Capped { rolling: 2 })
    );
    // A member rolling onto another target (an older change) does not count.
    if let Some(b) = fleet.get_mut(&key("b")) {
        b.target = "r1".into();
    }
    assert_eq!(gate(&ask(&me, &mine, Some(2)), &fleet), Verdict::Go);
    // Nor does a member of another group.
    if let Some(a) = fleet.get_mut(&key("a")) {
        a.group = Some("other".into());
    }
    assert_eq!(gate(&ask(&me, &mine, Some(1)), &fleet), Verdict::Go);
}

#[test]
fn a_wave_starts_once_every_earlier_wave_is_up_to_date() {
    let mut fleet = fleet(&[
        ("canary", Wave::Numbered(0), RolloutProgress::Rolling),
        ("other", Wave::Last, RolloutProgress::Queued),
    ]);
    let me = key("me");
    let mine = standing(Wave::Last, RolloutProgress::Queued);
    assert_eq!(
        gate(&ask(&me, &mine, None), &fleet),
        Verdict::Wait(WaitFor::EarlierWave {
            wave: Wave::Numbered(0),
            behind: key("canary"),
        })
    );
    // Up to date, but on the change before (its last pass predates this one): not done yet.
    if let Some(canary) = fleet.get_mut(&key("canary")) {
        canary.progress = RolloutProgress::UpToDate;
        canary.target = "r1".into();
    }
    assert!(matches!(
        gate(&ask(&me, &mine, None), &fleet),
        Verdict::Wait(WaitFor::EarlierWave { .. })
    ));
    if let Some(canary) = fleet.get_mut(&key("canary")) {
        canary.target = NEW.into();
    }
    assert_eq!(gate(&ask(&me, &mine, None), &fleet), Verdict::Go);
}

#[test]
fn a_stall_halts_new_starts_and_rolling_members_stop_between_shards() {
    let fleet = fleet(&[
        ("canary", Wave::Numbered(0), RolloutProgress::Stalled),
        ("rolling", Wave::Numbered(1), RolloutProgress::Rolling),
    ]);
    let me = key("me");
    let mine = standing(Wave::Numbered(1), RolloutProgress::Queued);
    let halted = Verdict::Wait(WaitFor::Halted {
        stalled: key("canary"),
    });
    assert_eq!(gate(&ask(&me, &mine, None), &fleet), halted);
    let rolling = key("rolling");
    let its = standing(Wave::Numbered(1), RolloutProgress::Rolling);
    let mut going_on = ask(&rolling, &its, None);
    going_on.started = true;
    going_on.mid_shard = true;
    assert_eq!(
        gate(&going_on, &fleet),
        Verdict::Go,
        "it finishes its shard"
    );
    going_on.mid_shard = false;
    assert_eq!(gate(&going_on, &fleet), halted, "then waits");
}

#[test]
fn a_started_cluster_between_shards_waits_for_a_place_under_the_cap() {
    let fleet = fleet(&[
        ("a", Wave::Last, RolloutProgress::Rolling),
        ("b", Wave::Last, RolloutProgress::Rolling),
    ]);
    let me = key("me");
    let mine = standing(Wave::Last, RolloutProgress::Rolling);
    let mut asking = ask(&me, &mine, Some(2));
    asking.started = true;
    asking.mid_shard = true;
    assert_eq!(gate(&asking, &fleet), Verdict::Go, "its shard first");
    asking.mid_shard = false;
    assert_eq!(
        gate(&asking, &fleet),
        Verdict::Wait(WaitFor::Capped { rolling: 2 })
    );
}

#[test]
fn a_pause_stops_starts_and_holds_rolling_members_between_shards() {
    let fleet = fleet(&[]);
    let me = key("me");
    let mine = standing(Wave::Last, RolloutProgress::Rolling);
    let mut asking = ask(&me, &mine, None);
    asking.paused = true;
    asking.started = true;
    asking.mid_shard = true;
    assert_eq!(gate(&asking, &fleet), Verdict::Go);
    asking.mid_shard = false;
    assert_eq!(gate(&asking, &fleet), Verdict::Wait(WaitFor::Paused));
}

#[test]
fn waves_come_from_the_annotation_and_unnumbered_clusters_go_last() {
    assert_eq!(Wave::from_annotation(Some("0")), Wave::Numbered(0));
    assert_eq!(Wave::from_annotation(Some(" 3 ")), Wave::Numbered(3));
    assert_eq!(Wave::from_annotation(Some("canary")), Wave::Last);
    assert_eq!(Wave::from_annotation(None), Wave::Last);
    assert!(Wave::Numbered(u32::MAX) < Wave::Last);
}

#[test]
fn tallies_count_each_cluster_for_every_config_of_its_chain_and_its_image() {
    let fleet = fleet(&[
        ("a", Wave::Last, RolloutProgress::UpToDate),
        ("b", Wave::Last, RolloutProgress::Rolling),
        ("c", Wave::Last, RolloutProgress::Stalled),
    ]);
    let (configs, images) = tallies(&fleet);
    let expected = Tally {
        clusters: 3,
        up_to_date: 1,
        rolling: 1,
        queued: 0,
        stalled: 1,
        halting: 1,
        held: 0,
    };
    assert_eq!(configs.get("base"), Some(&expected));
    assert_eq!(configs.get("child"), Some(&expected));
    assert_eq!(images.get("valkey-9-1-2"), Some(&expected));
    assert_eq!(expected.phase(false), "Halted");
    let done = Tally {
        clusters: 2,
        up_to_date: 2,
        ..Tally::default()
    };
    assert_eq!(done.phase(true), "Complete");
    // Stuck for a cause of its own: counted, but nobody is halted.
    let stuck = self::fleet(&[
        ("a", Wave::Last, RolloutProgress::UpToDate),
        ("c", Wave::Last, RolloutProgress::Stuck),
    ]);
    let (configs, _) = tallies(&stuck);
    let tally = configs["base"];
    assert_eq!((tally.stalled, tally.halting), (1, 0));
    assert_eq!(tally.phase(false), "Rolling");
}

#[test]
fn waves_are_the_policys_and_an_owners_annotation_counts_only_where_it_allows() {
    use crate::api::{RolloutPolicy, RolloutWave};
    let wave = |clusters: &[&str]| RolloutWave {
        clusters: clusters.iter().map(|c| c.to_string()).collect(),
    };
    let mut policy = RolloutPolicy {
        max_concurrent: Some(2),
        waves: vec![wave(&["payments/canary"]), wave(&["search/*"])],
        allow_wave_annotation: false,
        ..Default::default()
    };
    let at = |namespace: &str, name: &str| ClusterKey::new(namespace, name);
    assert_eq!(
        wave_of(&at("payments", "canary"), &policy, None),
        Wave::Numbered(0)
    );
    assert_eq!(
        wave_of(&at("search", "any"), &policy, None),
        Wave::Numbered(1)
    );
    assert_eq!(
        wave_of(&at("payments", "orders"), &policy, None),
        Wave::Last
    );
    // An owner asking for wave 0: not allowed, the last wave.
    let intruder = at("payments", "intruder");
    assert_eq!(wave_of(&intruder, &policy, Some("0")), Wave::Last);
    // Allowed: after the policy's own waves, never before them.
    policy.allow_wave_annotation = true;
    assert_eq!(wave_of(&intruder, &policy, Some("0")), Wave::Numbered(2));
    assert_eq!(wave_of(&intruder, &policy, Some("x")), Wave::Last);
    // The policy's word wins over the annotation.
    assert_eq!(
        wave_of(&at("search", "a"), &policy, Some("0")),
        Wave::Numbered(1)
    );
}

#[test]
fn a_cluster_stuck_for_its_own_cause_holds_no_later_wave_and_halts_nobody() {
    let mut fleet = fleet(&[
        ("canary", Wave::Numbered(0), RolloutProgress::Stuck),
        ("other", Wave::Last, RolloutProgress::Queued),
    ]);
    let key = key("other");
    let standing = fleet.remove(&key).unwrap();
    let members: Vec<ClusterKey> = fleet.keys().cloned().chain([key.clone()]).collect();
    let asking = Asking {
        key: &key,
        standing: &standing,
        policy: Some(cap(Some(1))),
        now: noon(),
        paused: false,
        started: false,
        mid_shard: false,
        members: &members,
        learning: false,
    };
    assert_eq!(gate(&asking, &fleet), Verdict::Go);
    let canary = self::key("canary");
    fleet.get_mut(&canary).unwrap().progress = RolloutProgress::Stalled;
    assert!(matches!(
        gate(&asking, &fleet),
        Verdict::Wait(WaitFor::Halted { .. })
    ));
}

#[test]
fn a_held_cluster_holds_no_later_wave_and_no_place_under_the_cap() {
    let mut fleet = fleet(&[
        ("canary", Wave::Numbered(0), RolloutProgress::Held),
        ("held", Wave::Last, RolloutProgress::Held),
        ("other", Wave::Last, RolloutProgress::Queued),
    ]);
    let key = key("other");
    let standing = fleet.remove(&key).unwrap();
    let asking = ask(&key, &standing, Some(1));
    assert_eq!(gate(&asking, &fleet), Verdict::Go);
    // Released, the canary is an earlier wave not yet up to date again.
    let canary = self::key("canary");
    fleet.get_mut(&canary).unwrap().progress = RolloutProgress::Queued;
    assert!(matches!(
        gate(&asking, &fleet),
        Verdict::Wait(WaitFor::EarlierWave { .. })
    ));
}

#[test]
fn a_rollout_whose_only_outdated_clusters_are_held_reads_held() {
    let mut tally = Tally::default();
    for progress in [
        RolloutProgress::UpToDate,
        RolloutProgress::Held,
        RolloutProgress::UpToDate,
    ] {
        tally.count(progress);
    }
    assert_eq!((tally.clusters, tally.up_to_date, tally.held), (3, 2, 1));
    assert_eq!(tally.phase(false), "Held");
    tally.count(RolloutProgress::Queued);
    assert_eq!(tally.phase(false), "Rolling");
    assert_eq!(tally.phase(true), "Paused");
}

#[test]
fn outside_its_windows_a_cluster_waits_for_the_next_but_finishes_a_shard_in_flight() {
    use crate::api::MaintenanceWindow;
    let fleet = fleet(&[("a", Wave::Last, RolloutProgress::UpToDate)]);
    let me = key("me");
    let mine = standing(Wave::Last, RolloutProgress::Queued);
    let nightly = MaintenanceWindow {
        days: vec![],
        start: "02:00".into(),
        duration_minutes: 60,
    };
    let policy = Policy {
        max_concurrent: None,
        windows: Windows::of(&[nightly]).unwrap(),
    };
    let mut asking = ask(&me, &mine, None);
    asking.policy = Some(&policy);
    asking.learning = false;
    let opens: Timestamp = "2026-12-05T02:00:00Z".parse().unwrap();
    assert_eq!(
        gate(&asking, &fleet),
        Verdict::Wait(WaitFor::OutsideWindow { opens })
    );
    asking.now = "2026-12-05T02:30:00Z".parse().unwrap();
    assert_eq!(gate(&asking, &fleet), Verdict::Go, "inside the window");
    asking.now = noon();
    asking.started = true;
    asking.mid_shard = true;
    assert_eq!(
        gate(&asking, &fleet),
        Verdict::Go,
        "a shard in flight finishes"
    );
}
