//! The operator's own scaling decisions, pure and clock-free: the caller passes `now`.
//!
//! The operator decides replicas only where an HPA cannot: 0 → 1 when work arrives (activation), N → 0
//! after `cooldownPeriod` with nothing ready or running, and up to `minReplicaCount`. Between 1 and N the
//! HPA (or KEDA) decides — unless no autoscaler can run (another provider owns the external metrics API
//! and `provider: builtin` was asked), in which case the operator applies the HPA's formula itself.
//!
//! Two safety rules, from KEDA's experience: a missing metric never scales anything (replicas are kept,
//! like KEDA's `fallback` with `currentReplicas`), and depth counts running jobs, so a queue whose last
//! jobs are still running is never scaled to zero.

use std::time::Duration;

/// The replicas an HPA with this target settles on for `depth` (its formula for `AverageValue`,
/// ignoring the 10 % tolerance): `ceil(depth / target)`, clamped to `[min, max]`.
pub fn hpa_replicas(depth: i64, target: u32, min: i32, max: i32) -> i32 {
    let target = i64::from(target.max(1));
    let want = (depth.max(0) + target - 1) / target;
    i32::try_from(want).unwrap_or(i32::MAX).clamp(min, max.max(min))
}

/// What the decision knows about the queue and its workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Jobs ready to run now; `None` when the depth could not be read.
    pub ready: Option<i64>,
    /// Jobs running now; `None` when the depth could not be read.
    pub running: Option<i64>,
    /// The Deployment's `spec.replicas` now.
    pub replicas: i32,
    /// Unix ms when the queue was last seen with ready or running jobs (or the operator first saw it).
    pub last_active_ms: i64,
    /// Unix ms now.
    pub now_ms: i64,
}

/// The JobQueue's scaling settings, as the decision needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `minReplicaCount`.
    pub min: i32,
    /// `maxReplicaCount`.
    pub max: i32,
    /// `targetJobsPerReplica` (resolved).
    pub target: u32,
    /// `activationThreshold`: depth must exceed it to wake a queue at zero.
    pub activation: i64,
    /// `cooldownPeriod`.
    pub cooldown: Duration,
    /// The `sluice.dev/paused` annotation.
    pub paused: bool,
    /// Who scales between 1 and N.
    pub autoscaler: Autoscaler,
}

/// Who scales between 1 and N.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Autoscaler {
    /// An HPA on the operator's external metric.
    Hpa,
    /// KEDA, which also does 0↔1: the operator decides nothing.
    Keda,
    /// Nobody (the external metrics API is someone else's): the operator applies the HPA formula.
    Operator,
}

/// Why replicas are what they are. The names are metric labels and `status.lastScaleReason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Work arrived at a queue with no workers.
    Activated,
    /// Idle for `cooldownPeriod`: workers go to zero.
    CooledDown,
    /// Idle, but the cooldown has not passed yet.
    CoolingDown,
    /// Below `minReplicaCount`.
    BelowMin,
    /// Above `maxReplicaCount`.
    AboveMax,
    /// The operator applies the HPA formula (no autoscaler available).
    DepthChanged,
    /// Work and workers: the autoscaler decides.
    Active,
    /// Nothing to do and no workers.
    Idle,
    /// The depth could not be read: replicas are kept.
    MetricUnavailable,
    /// Paused by annotation: replicas are kept.
    Paused,
    /// KEDA decides.
    ExternalScaler,
}

impl Reason {
    /// The `PascalCase` name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Activated => "Activated",
            Reason::CooledDown => "CooledDown",
            Reason::CoolingDown => "CoolingDown",
            Reason::BelowMin => "BelowMin",
            Reason::AboveMax => "AboveMax",
            Reason::DepthChanged => "DepthChanged",
            Reason::Active => "Active",
            Reason::Idle => "Idle",
            Reason::MetricUnavailable => "MetricUnavailable",
            Reason::Paused => "Paused",
            Reason::ExternalScaler => "ExternalScaler",
        }
    }
}

/// The outcome: the replicas to set, if the operator sets them, and what the queue asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Set `spec.replicas` to this; `None`: leave it to the autoscaler (or keep it).
    pub scale_to: Option<i32>,
    /// Replicas the depth asks for (`status.desiredReplicas`).
    pub desired: i32,
    /// Why.
    pub reason: Reason,
    /// Decide again after this long at the latest (the end of a cooldown).
    pub recheck_after: Option<Duration>,
}

impl Decision {
    fn keep(replicas: i32, reason: Reason) -> Self {
        Decision {
            scale_to: None,
            desired: replicas,
            reason,
            recheck_after: None,
        }
    }
    fn scale(to: i32, replicas: i32, reason: Reason) -> Self {
        Decision {
            scale_to: (to != replicas).then_some(to),
            desired: to,
            reason,
            recheck_after: None,
        }
    }
}

/// Decides replicas for one queue.
pub fn decide(obs: Observation, policy: Policy) -> Decision {
    let replicas = obs.replicas;
    if policy.paused {
        return Decision::keep(replicas, Reason::Paused);
    }
    if policy.autoscaler == Autoscaler::Keda {
        return Decision::keep(replicas, Reason::ExternalScaler);
    }
    let (Some(ready), Some(running)) = (obs.ready, obs.running) else {
        return Decision::keep(replicas, Reason::MetricUnavailable);
    };
    let min = policy.min.max(0);
    let max = policy.max.max(min).max(1);
    let depth = ready.max(0) + running.max(0);
    let busy = depth > 0;
    let formula = hpa_replicas(depth, policy.target, min.max(1), max);

    if replicas == 0 {
        if depth > policy.activation {
            let to = match policy.autoscaler {
                Autoscaler::Operator => formula,
                _ => min.max(1),
            };
            return Decision::scale(to, replicas, Reason::Activated);
        }
        if min > 0 {
            return Decision::scale(min, replicas, Reason::BelowMin);
        }
        return Decision::keep(0, Reason::Idle);
    }
    if replicas < min {
        return Decision::scale(min, replicas, Reason::BelowMin);
    }
    if replicas > max {
        return Decision::scale(max, replicas, Reason::AboveMax);
    }
    if !busy && min == 0 {
        let idle_for = obs.now_ms.saturating_sub(obs.last_active_ms).max(0) as u64;
        let cooldown = policy.cooldown.as_millis() as u64;
        if idle_for >= cooldown {
            return Decision::scale(0, replicas, Reason::CooledDown);
        }
        return Decision {
            recheck_after: Some(Duration::from_millis(cooldown - idle_for)),
            ..Decision::keep(replicas, Reason::CoolingDown)
        };
    }
    match policy.autoscaler {
        Autoscaler::Operator => Decision::scale(formula, replicas, Reason::DepthChanged),
        _ => Decision {
            desired: formula,
            ..Decision::keep(replicas, Reason::Active)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(300);

    fn policy() -> Policy {
        Policy {
            min: 0,
            max: 10,
            target: 5,
            activation: 0,
            cooldown: COOLDOWN,
            paused: false,
            autoscaler: Autoscaler::Hpa,
        }
    }

    /// (ready, running, replicas, idle for seconds) under `policy`.
    fn run(p: Policy, ready: Option<i64>, running: Option<i64>, replicas: i32, idle_s: i64) -> Decision {
        let now_ms = 1_000_000_000;
        decide(
            Observation {
                ready,
                running,
                replicas,
                last_active_ms: now_ms - idle_s * 1000,
                now_ms,
            },
            p,
        )
    }

    #[test]
    fn scaling_table() {
        let hpa = policy();
        let threshold = Policy { activation: 3, ..hpa };
        let min2 = Policy { min: 2, ..hpa };
        let own = Policy {
            autoscaler: Autoscaler::Operator,
            ..hpa
        };
        // (name, policy, ready, running, replicas, idle seconds) → (scale_to, desired, reason)
        type Row = (
            &'static str,
            Policy,
            Option<i64>,
            Option<i64>,
            i32,
            i64,
            Option<i32>,
            i32,
            Reason,
        );
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            ("one job wakes an idle queue",             hpa, Some(1), Some(0), 0, 0,   Some(1), 1, Reason::Activated),
            ("a burst wakes it to one; the HPA grows",  hpa, Some(50), Some(0), 0, 0,  Some(1), 1, Reason::Activated),
            ("nothing to do at zero stays at zero",     hpa, Some(0), Some(0), 0, 999, None,    0, Reason::Idle),
            ("at the threshold stays asleep",           threshold, Some(3), Some(0), 0, 0, None, 0, Reason::Idle),
            ("above the threshold wakes",               threshold, Some(4), Some(0), 0, 0, Some(1), 1, Reason::Activated),
            ("idle but within cooldown keeps workers",  hpa, Some(0), Some(0), 1, 299, None,    1, Reason::CoolingDown),
            ("idle past cooldown goes to zero",         hpa, Some(0), Some(0), 1, 300, Some(0), 0, Reason::CooledDown),
            ("many idle workers go straight to zero",   hpa, Some(0), Some(0), 4, 301, Some(0), 0, Reason::CooledDown),
            ("a running job holds its worker",          hpa, Some(0), Some(1), 1, 9999, None,   1, Reason::Active),
            ("ready work holds the workers",            hpa, Some(7), Some(0), 2, 9999, None,   2, Reason::Active),
            ("the HPA decides between 1 and N",         hpa, Some(40), Some(10), 3, 0, None,    10, Reason::Active),
            ("a missing metric never scales to zero",   hpa, None, None, 3, 9999,     None,    3, Reason::MetricUnavailable),
            ("a missing metric never wakes either",     hpa, None, None, 0, 0,        None,    0, Reason::MetricUnavailable),
            ("min replicas are kept when idle",         min2, Some(0), Some(0), 2, 9999, None,  2, Reason::Active),
            ("below min is raised",                     min2, Some(0), Some(0), 0, 0,  Some(2), 2, Reason::BelowMin),
            ("above max is lowered",                    hpa, Some(1), Some(0), 12, 0,  Some(10), 10, Reason::AboveMax),
            ("without an HPA the operator scales out",  own, Some(23), Some(0), 1, 0,  Some(5), 5, Reason::DepthChanged),
            ("without an HPA it wakes straight to N",   own, Some(12), Some(0), 0, 0,  Some(3), 3, Reason::Activated),
            ("without an HPA it scales in to the work", own, Some(2), Some(3), 4, 0,   Some(1), 1, Reason::DepthChanged),
        ];
        for (name, p, ready, running, replicas, idle, scale_to, desired, reason) in table {
            let d = run(p, ready, running, replicas, idle);
            assert_eq!(
                (d.scale_to, d.desired, d.reason),
                (scale_to, desired, reason),
                "{name}"
            );
        }
    }

    #[test]
    fn hpa_formula_rounds_up_and_clamps() {
        assert_eq!(hpa_replicas(0, 10, 1, 5), 1);
        assert_eq!(hpa_replicas(1, 10, 1, 5), 1);
        assert_eq!(hpa_replicas(10, 10, 1, 5), 1);
        assert_eq!(hpa_replicas(11, 10, 1, 5), 2);
        assert_eq!(hpa_replicas(1000, 10, 1, 5), 5);
    }

    #[test]
    fn a_cooling_queue_asks_to_be_checked_when_the_cooldown_ends() {
        let d = run(policy(), Some(0), Some(0), 1, 100);
        assert_eq!(d.recheck_after, Some(Duration::from_secs(200)));
    }

    #[test]
    fn paused_and_keda_queues_are_left_alone() {
        let paused = Policy {
            paused: true,
            ..policy()
        };
        assert_eq!(run(paused, Some(100), Some(0), 0, 0).scale_to, None);
        assert_eq!(run(paused, Some(0), Some(0), 3, 9999).scale_to, None);
        let keda = Policy {
            autoscaler: Autoscaler::Keda,
            ..policy()
        };
        assert_eq!(run(keda, Some(100), Some(0), 0, 0).reason, Reason::ExternalScaler);
    }
}
