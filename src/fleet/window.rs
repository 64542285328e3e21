//! Maintenance windows: the weekly UTC windows of a rollout policy (`spec.rollout.
//! maintenanceWindows`) in which a cluster may start rolling (see [`crate::fleet::rollout`]).
//! No I/O: the caller gives the time.

use std::fmt;

use k8s_openapi::jiff::civil::Date;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Span, Timestamp};

use crate::api::{MaintenanceWindow, Weekday};

/// A policy's windows, read. No windows: any time is open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows(Vec<Window>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Window {
    /// Monday first; all false stands for every day.
    days: [bool; 7],
    /// Minutes after midnight UTC.
    start: i64,
    minutes: i64,
}

/// Whether a rollout may start clusters at some moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// No windows: always.
    Always,
    /// Inside a window, which closes then.
    OpenUntil(Timestamp),
    /// Outside every window; the next opens then.
    ClosedUntil(Timestamp),
}

/// A window's `start` that is not `HH:MM` (the CRD's pattern refuses it first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadStart(pub String);

impl fmt::Display for BadStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "maintenance window start {:?} is not HH:MM (UTC)",
            self.0
        )
    }
}

impl Windows {
    /// The windows of a policy.
    pub fn of(windows: &[MaintenanceWindow]) -> Result<Self, BadStart> {
        windows
            .iter()
            .map(Window::of)
            .collect::<Result<_, _>>()
            .map(Windows)
    }

    /// Whether a roll may start at `now`, and until when that holds.
    pub fn at(&self, now: Timestamp) -> Opening {
        if self.0.is_empty() {
            return Opening::Always;
        }
        let occurrences = self.occurrences_around(now);
        let open_until = occurrences
            .iter()
            .filter(|(start, end)| *start <= now && now < *end)
            .map(|(_, end)| *end)
            .max();
        if let Some(closes) = open_until {
            return Opening::OpenUntil(closes);
        }
        match occurrences
            .iter()
            .map(|(start, _)| *start)
            .filter(|s| *s > now)
            .min()
        {
            Some(opens) => Opening::ClosedUntil(opens),
            // Every window opens at least weekly: unreachable, but never a panic.
            None => Opening::Always,
        }
    }

    /// When a window next opens after `now`, if the policy has windows.
    pub fn next_opening(&self, now: Timestamp) -> Option<Timestamp> {
        self.occurrences_around(now)
            .into_iter()
            .map(|(start, _)| start)
            .filter(|start| *start > now)
            .min()
    }

    /// Every window's openings from a week before `now`'s day to eight days after, with when
    /// each closes: enough to see the one open now (at most a week long) and the next.
    fn occurrences_around(&self, now: Timestamp) -> Vec<(Timestamp, Timestamp)> {
        let today = now.to_zoned(TimeZone::UTC).date();
        (-7..=8)
            .filter_map(|offset| today.checked_add(Span::new().days(offset)).ok())
            .flat_map(|day| self.0.iter().filter_map(move |w| w.occurrence(day)))
            .collect()
    }
}

impl Window {
    fn of(window: &MaintenanceWindow) -> Result<Self, BadStart> {
        let bad = || BadStart(window.start.clone());
        let (hours, minutes) = window.start.split_once(':').ok_or_else(bad)?;
        let hours: i64 = hours.parse().map_err(|_| bad())?;
        let minutes: i64 = minutes.parse().map_err(|_| bad())?;
        if !(0..24).contains(&hours) || !(0..60).contains(&minutes) {
            return Err(bad());
        }
        let mut days = [false; 7];
        for day in &window.days {
            days[monday_first(*day)] = true;
        }
        Ok(Window {
            days,
            start: hours * 60 + minutes,
            minutes: i64::from(window.duration_minutes.max(1)),
        })
    }

    /// This window's opening on `day`, if it opens that day, with its closing.
    fn occurrence(&self, day: Date) -> Option<(Timestamp, Timestamp)> {
        let weekday = usize::try_from(day.weekday().to_monday_zero_offset()).ok()?;
        let every_day = !self.days.contains(&true);
        if !every_day && !self.days.get(weekday).copied().unwrap_or(false) {
            return None;
        }
        let midnight = day.to_zoned(TimeZone::UTC).ok()?.timestamp();
        let start = midnight.checked_add(Span::new().minutes(self.start)).ok()?;
        let end = start.checked_add(Span::new().minutes(self.minutes)).ok()?;
        Some((start, end))
    }
}

fn monday_first(day: Weekday) -> usize {
    match day {
        Weekday::Mon => 0,
        Weekday::Tue => 1,
        Weekday::Wed => 2,
        Weekday::Thu => 3,
        Weekday::Fri => 4,
        Weekday::Sat => 5,
        Weekday::Sun => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time: &str) -> Timestamp {
        time.parse().unwrap()
    }

    fn window(days: &[Weekday], start: &str, minutes: u32) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: start.into(),
            duration_minutes: minutes,
        }
    }

    #[test]
    fn no_windows_is_always_open() {
        let windows = Windows::of(&[]).unwrap();
        assert_eq!(windows.at(at("2026-12-04T12:00:00Z")), Opening::Always);
        assert_eq!(windows.next_opening(at("2026-12-04T12:00:00Z")), None);
    }

    #[test]
    fn a_daily_window_is_open_inside_and_says_when_it_opens_outside() {
        let windows = Windows::of(&[window(&[], "02:00", 120)]).unwrap();
        assert_eq!(
            windows.at(at("2026-12-04T03:00:00Z")),
            Opening::OpenUntil(at("2026-12-04T04:00:00Z"))
        );
        assert_eq!(
            windows.at(at("2026-12-04T04:00:00Z")),
            Opening::ClosedUntil(at("2026-12-05T02:00:00Z")),
            "the end is outside"
        );
        assert_eq!(
            windows.at(at("2026-12-04T01:59:00Z")),
            Opening::ClosedUntil(at("2026-12-04T02:00:00Z"))
        );
    }

    #[test]
    fn a_weekly_window_opens_on_its_days_only_and_may_run_past_midnight() {
        // 2026-12-04 is a Friday.
        let windows = Windows::of(&[window(&[Weekday::Sat], "22:00", 240)]).unwrap();
        assert_eq!(
            windows.at(at("2026-12-04T23:00:00Z")),
            Opening::ClosedUntil(at("2026-12-05T22:00:00Z"))
        );
        assert_eq!(
            windows.at(at("2026-12-06T01:00:00Z")),
            Opening::OpenUntil(at("2026-12-06T02:00:00Z")),
            "Saturday's window is still open early on Sunday"
        );
        assert_eq!(
            windows.at(at("2026-12-06T02:00:00Z")),
            Opening::ClosedUntil(at("2026-12-12T22:00:00Z"))
        );
    }

    #[test]
    fn overlapping_windows_stay_open_until_the_last_closes() {
        let windows = Windows::of(&[
            window(&[], "10:00", 60),
            window(&[Weekday::Fri], "10:30", 90),
        ])
        .unwrap();
        assert_eq!(
            windows.at(at("2026-12-04T10:45:00Z")),
            Opening::OpenUntil(at("2026-12-04T12:00:00Z"))
        );
        assert_eq!(
            windows.next_opening(at("2026-12-04T10:45:00Z")),
            Some(at("2026-12-05T10:00:00Z"))
        );
    }

    #[test]
    fn a_start_that_is_not_a_time_of_day_is_refused() {
        for start in ["24:00", "7", "ab:cd", "12:60"] {
            assert_eq!(
                Windows::of(&[window(&[], start, 10)]),
                Err(BadStart(start.into()))
            );
        }
    }
}
