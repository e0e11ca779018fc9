//! Periodic jobs: the one place that decides when a cron schedule fires and which missed fire times are
//! caught up. Pure: the store ([`crate::QueueStore::fire_schedule`]) reads the database clock and the
//! schedule's last fire time under a row lock, asks [`due`], and enqueues what it says.
//!
//! Cron expressions have five fields (`minute hour day-of-month month day-of-week`) or six with seconds
//! first (`*/10 * * * * *`), parsed by the `croner` crate, and are evaluated in an IANA time zone
//! (`chrono-tz`; UTC when none is given). Daylight saving time, as croner implements the Open Cron
//! Pattern Specification:
//! - **Spring forward** (a wall-clock hour that does not exist, e.g. 02:00-03:00): a job at a fixed time
//!   in the gap (`30 2 * * *`) runs once, at the first time after the gap (03:00); interval and
//!   wildcard jobs (`*/15 * * * *`) skip the times in the gap.
//! - **Fall back** (a wall-clock hour that happens twice): a fixed-time job (`30 1 * * *`) runs once, at
//!   the first pass; interval and wildcard jobs run at their times in both passes (they are distinct
//!   instants).
//!
//! A fire time is never enqueued twice: fire times are instants, and the store records the last one it
//! handled in the same transaction that enqueues.

use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use croner::{
    Cron,
    parser::{CronParser, Seconds},
};

/// Most fire times one catch-up enqueues (`missedRuns: all`).
pub const MAX_CATCH_UP: usize = 100;

/// How late a fire time may be seen and still count as on time rather than missed: a worker ticks
/// every second, so a fire time older than this was missed (no scheduler was running).
pub const ON_TIME_GRACE: TimeDelta = TimeDelta::seconds(60);

/// What to do with fire times that passed while no scheduler ran (`skip`, `runOnce`, `all`); the config
/// and the CRD share it.
pub use sluice_crds::sidecar_config::MissedRuns;

/// A parsed cron expression in a time zone.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    cron: Cron,
    tz: Tz,
}

impl CronSchedule {
    /// Parses `expr` (five fields, or six with seconds first) in `time_zone` (an IANA name such as
    /// `Europe/Berlin`; UTC when `None`). The error names what is wrong.
    pub fn parse(expr: &str, time_zone: Option<&str>) -> Result<Self, String> {
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| format!("cron {expr:?}: {e}"))?;
        let tz = match time_zone {
            None => Tz::UTC,
            Some(name) => Tz::from_str(name)
                .map_err(|_| format!("timeZone {name:?}: not an IANA time zone (e.g. Europe/Berlin)"))?,
        };
        Ok(Self { cron, tz })
    }

    /// The first fire time strictly after `t`, if any (a pattern like `0 0 30 2 *` never fires).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// Fire times in (`after`, `until`], oldest first; with more than `keep`, only the latest `keep` (the
    /// search walks back from `until`, so a long gap costs no more than `keep` steps).
    fn fire_times(&self, after: DateTime<Utc>, until: DateTime<Utc>, keep: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = until.with_timezone(&self.tz);
        let inclusive = true;
        let mut first = true;
        while out.len() < keep {
            let Ok(prev) = self.cron.find_previous_occurrence(&t, first && inclusive) else {
                break;
            };
            first = false;
            let utc = prev.with_timezone(&Utc);
            if utc <= after {
                break;
            }
            out.push(utc);
            t = prev;
        }
        out.reverse();
        out
    }
}

/// Which fire times to enqueue at `now` for a schedule that last handled fire times up to `last`:
/// every on-time fire time (within [`ON_TIME_GRACE`] of `now`), and of the missed ones before them
/// none, the latest, or the latest [`MAX_CATCH_UP`], by `missed`. Oldest first.
pub fn due(
    schedule: &CronSchedule,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
    missed: MissedRuns,
) -> Vec<DateTime<Utc>> {
    if now <= last {
        return Vec::new();
    }
    let cutoff = now - ON_TIME_GRACE;
    let on_time = schedule.fire_times(last.max(cutoff), now, usize::MAX);
    let keep = match missed {
        MissedRuns::Skip => 0,
        MissedRuns::RunOnce => 1,
        MissedRuns::All => MAX_CATCH_UP,
    };
    let mut out = if keep > 0 && last < cutoff {
        schedule.fire_times(last, cutoff, keep)
    } else {
        Vec::new()
    };
    out.extend(on_time);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn five_and_six_field_expressions_fire_when_they_say() {
        let s = CronSchedule::parse("*/10 * * * * *", None).unwrap();
        assert_eq!(
            s.next_after(utc("2026-01-01T00:00:05Z")),
            Some(utc("2026-01-01T00:00:10Z"))
        );
        let s = CronSchedule::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            s.next_after(utc("2026-01-10T00:00:00Z")),
            Some(utc("2026-01-10T01:30:00Z")),
            "02:30 in Berlin in winter is 01:30 UTC"
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_by_name() {
        let e = CronSchedule::parse("61 * * * *", None).unwrap_err();
        assert!(e.starts_with("cron \"61 * * * *\""), "{e}");
        let e = CronSchedule::parse("* * * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(e.contains("timeZone \"Mars/Olympus\""), "{e}");
    }

    #[test]
    fn spring_forward_runs_a_fixed_time_job_once_after_the_gap() {
        // Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        let s = CronSchedule::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        let day = s.fire_times(utc("2026-03-28T12:00:00Z"), utc("2026-03-29T12:00:00Z"), 10);
        assert_eq!(day, vec![utc("2026-03-29T01:00:00Z")], "once, at 03:00 CEST");
        let every = CronSchedule::parse("*/30 * * * *", Some("Europe/Berlin")).unwrap();
        let night = every.fire_times(utc("2026-03-29T00:00:00Z"), utc("2026-03-29T01:30:00Z"), 10);
        assert_eq!(
            night,
            vec![
                utc("2026-03-29T00:30:00Z"), // 01:30 CET
                utc("2026-03-29T01:00:00Z"), // 03:00 CEST: 02:00 and 02:30 do not exist
                utc("2026-03-29T01:30:00Z"),
            ]
        );
    }

    #[test]
    fn fall_back_runs_a_fixed_time_job_once() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
        let s = CronSchedule::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        let day = s.fire_times(utc("2026-10-24T12:00:00Z"), utc("2026-10-25T12:00:00Z"), 10);
        assert_eq!(day, vec![utc("2026-10-25T00:30:00Z")], "once, at the first 02:30");
    }

    #[test]
    fn missed_runs_are_skipped_run_once_or_all_bounded() {
        let s = CronSchedule::parse("0 * * * *", None).unwrap();
        let last = utc("2026-01-01T00:00:00Z");
        let now = utc("2026-01-01T05:00:30Z"); // 01:00..05:00 passed; 05:00 is on time
        assert_eq!(
            due(&s, last, now, MissedRuns::Skip),
            vec![utc("2026-01-01T05:00:00Z")]
        );
        assert_eq!(
            due(&s, last, now, MissedRuns::RunOnce),
            vec![utc("2026-01-01T04:00:00Z"), utc("2026-01-01T05:00:00Z")]
        );
        assert_eq!(due(&s, last, now, MissedRuns::All).len(), 5);
        let long_ago = utc("2020-01-01T00:00:00Z");
        let all = due(&s, long_ago, now, MissedRuns::All);
        assert_eq!(all.len(), MAX_CATCH_UP + 1, "100 missed and the on-time one");
        assert_eq!(all.last(), Some(&utc("2026-01-01T05:00:00Z")));
        assert!(due(&s, now, now, MissedRuns::All).is_empty());
        let quiet = utc("2026-01-01T05:10:00Z");
        assert!(due(&s, now, quiet, MissedRuns::All).is_empty(), "nothing between");
    }
}
