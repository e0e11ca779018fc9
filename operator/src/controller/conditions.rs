//! Setting `metav1.Condition`s the way the API conventions ask: `lastTransitionTime` changes only when
//! `status` does.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

/// A condition to set, without its bookkeeping fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// `Ready`, `Degraded`, …
    pub type_: &'static str,
    /// `"True"` or `"False"`.
    pub status: bool,
    /// A `PascalCase` reason.
    pub reason: &'static str,
    /// A message for humans.
    pub message: String,
}

/// `existing` with each of `desired` set for `generation` at `now_ms`; other conditions are kept.
pub fn set(existing: &[Condition], desired: &[Desired], generation: i64, now_ms: i64) -> Vec<Condition> {
    let now = Time(Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH));
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for d in desired {
        let status = if d.status { "True" } else { "False" };
        let previous = existing.iter().find(|c| c.type_ == d.type_);
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now.clone(),
        };
        out.push(Condition {
            type_: d.type_.into(),
            status: status.into(),
            reason: d.reason.into(),
            message: d.message.clone(),
            observed_generation: Some(generation),
            last_transition_time,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(status: bool, reason: &'static str) -> Desired {
        Desired {
            type_: "Ready",
            status,
            reason,
            message: reason.into(),
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let first = set(&[], &[ready(false, "Propagating")], 1, 1_000);
        assert_eq!(first[0].last_transition_time.0.as_millisecond(), 1_000);
        let same_status = set(&first, &[ready(false, "SecretNotFound")], 2, 5_000);
        assert_eq!(same_status[0].last_transition_time.0.as_millisecond(), 1_000);
        assert_eq!(same_status[0].reason, "SecretNotFound");
        assert_eq!(same_status[0].observed_generation, Some(2));
        let flipped = set(&same_status, &[ready(true, "Enforced")], 2, 9_000);
        assert_eq!(flipped[0].last_transition_time.0.as_millisecond(), 9_000);
        assert_eq!(flipped[0].status, "True");
    }

    #[test]
    fn other_conditions_are_kept() {
        let both = set(
            &[],
            &[
                ready(true, "Enforced"),
                Desired {
                    type_: "Degraded",
                    status: false,
                    reason: "AsExpected",
                    message: String::new(),
                },
            ],
            1,
            0,
        );
        let after = set(&both, &[ready(false, "RedisUnreachable")], 1, 10);
        assert_eq!(after.len(), 2);
        assert_eq!(after[0].type_, "Degraded");
    }
}
