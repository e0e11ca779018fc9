//! Job events: what the `jobs_notify_events` trigger (migration 0011) sends on [`JOB_EVENTS_CHANNEL`]
//! when a job changes state, while some process streams the job's queue
//! ([`crate::QueueStore::subscribe_events`]).
//!
//! Notifications arrive in commit order. A reader that reads a job's state ([`JobStatus`], with the
//! snapshot it was read under) and also receives notifications needs to know which of them the read
//! already saw: [`Snapshot::saw`] answers it from the notification's transaction id, so that a stream
//! never goes back to an older state.

use std::str::FromStr;

use serde::Deserialize;
use uuid::Uuid;

use crate::JobState;

/// The channel the trigger notifies on.
pub const JOB_EVENTS_CHANNEL: &str = "sluice_job_events";

/// One notification: job `id` of `queue` is now in `state` (at `attempt`), written by transaction `xid`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct JobChange {
    /// The job.
    pub id: Uuid,
    /// Its queue.
    pub queue: String,
    /// The state it entered.
    pub state: JobState,
    /// Its attempts so far.
    pub attempt: i32,
    /// The transaction that changed it (decimal, `pg_current_xact_id()`).
    pub xid: String,
}

impl JobChange {
    /// Parses a notification's payload.
    pub fn parse(payload: &str) -> Option<Self> {
        serde_json::from_str(payload).ok()
    }
}

/// A job's state as read, with the snapshot it was read under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStatus {
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: JobState,
    /// Its attempts so far.
    pub attempt: i32,
    /// The snapshot of the read.
    pub snapshot: Snapshot,
}

/// A PostgreSQL snapshot (`pg_current_snapshot()`, `xmin:xmax:xip,...`): which transactions' writes
/// a read saw.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Snapshot {
    xmin: u64,
    xmax: u64,
    in_progress: Vec<u64>,
}

impl Snapshot {
    /// Whether a read under this snapshot saw the writes of committed transaction `xid` (an `xid` that
    /// does not parse is taken as not seen).
    pub fn saw(&self, xid: &str) -> bool {
        let Ok(xid) = xid.parse::<u64>() else {
            return false;
        };
        xid < self.xmin || (xid < self.xmax && !self.in_progress.contains(&xid))
    }
}

impl FromStr for Snapshot {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("snapshot {s:?}: expected xmin:xmax:xip,...");
        let mut parts = s.split(':');
        let (Some(xmin), Some(xmax), Some(xip), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let in_progress = xip
            .split(',')
            .filter(|x| !x.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        Ok(Self {
            xmin: xmin.parse().map_err(|_| bad())?,
            xmax: xmax.parse().map_err(|_| bad())?,
            in_progress,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_sees_what_committed_before_it() {
        let s: Snapshot = "100:105:101,103".parse().unwrap();
        assert!(s.saw("99"));
        assert!(s.saw("100"));
        assert!(!s.saw("101"));
        assert!(s.saw("102"));
        assert!(!s.saw("103"));
        assert!(s.saw("104"));
        assert!(!s.saw("105"));
        assert!(!s.saw("7000000000"));
        assert!(!s.saw("not a number"));
        let empty: Snapshot = "834:834:".parse().unwrap();
        assert!(empty.saw("833") && !empty.saw("834"));
        assert!("1:2".parse::<Snapshot>().is_err());
        assert!("a:2:".parse::<Snapshot>().is_err());
    }

    #[test]
    fn parses_the_trigger_payload() {
        let c = JobChange::parse(
            r#"{"id" : "f5bf0c65-a19c-4a3b-9d05-3fb5ae786b2a", "queue" : "q", "state" : "retrying", "attempt" : 1, "xid" : "832"}"#,
        )
        .unwrap();
        assert_eq!(c.state, JobState::Retrying);
        assert_eq!((c.queue.as_str(), c.attempt, c.xid.as_str()), ("q", 1, "832"));
        assert!(JobChange::parse("{}").is_none());
    }
}
