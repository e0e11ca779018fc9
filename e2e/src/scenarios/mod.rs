//! The whole-system scenarios: Sluice installed from its chart ([`crate::system::SluiceSystem`]), driven
//! through `kubectl` and traffic as users drive it. The same code runs on the in-memory control plane
//! (`tests/scenario_*.rs`) and on the real one (`tests/real_control_plane.rs`, `make e2e-real`).
//!
//! Each scenario works in a namespace of its own and starts the Redis or PostgreSQL it needs, so several
//! run one after the other on one installed system. A scenario panics, naming what failed.

pub mod access;
pub mod bad_input;
pub mod grpc_queue;
pub mod job_queue;
pub mod queue_api_auth;
pub mod rate_limit;

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::system::SluiceSystem;

/// A scenario by name.
pub struct Scenario {
    /// How reports name it.
    pub name: &'static str,
    /// Runs it.
    pub run: for<'a> fn(&'a SluiceSystem) -> BoxFuture<'a, ()>,
}

/// Every scenario, in the order they run.
pub const ALL: &[Scenario] = &[
    Scenario {
        name: "rate limit",
        run: |s| Box::pin(rate_limit::run(s)),
    },
    Scenario {
        name: "job queue",
        run: |s| Box::pin(job_queue::run(s)),
    },
    Scenario {
        name: "gRPC job queue",
        run: |s| Box::pin(grpc_queue::run(s)),
    },
    Scenario {
        name: "bad input",
        run: |s| Box::pin(bad_input::run(s)),
    },
];

/// Scenarios that need the real RBAC authorizer and Helm, run after [`ALL`] on the real control plane
/// only; the last one upgrades the release to `watchNamespaces`.
pub const REAL_ONLY: &[Scenario] = &[
    Scenario {
        name: "job queue authors (RBAC users)",
        run: |s| Box::pin(access::job_queue_authors(s)),
    },
    Scenario {
        name: "queue API reviewers follow JobQueues",
        run: |s| Box::pin(access::queue_api_reviewers(s)),
    },
    Scenario {
        name: "queue API callers checked (auth: kubernetes)",
        run: |s| Box::pin(queue_api_auth::run(s)),
    },
    Scenario {
        name: "watchNamespaces (helm upgrade)",
        run: |s| Box::pin(access::watch_namespaces(s)),
    },
];

/// How one scenario went.
#[derive(Debug)]
pub struct Outcome {
    /// The scenario's name.
    pub name: &'static str,
    /// How long it took.
    pub took: Duration,
    /// `Err` with the panic message when it failed.
    pub result: Result<(), String>,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.result {
            Ok(()) => write!(f, "{}: passed ({:.1} s)", self.name, self.took.as_secs_f64()),
            Err(e) => write!(f, "{}: FAILED ({:.1} s): {e}", self.name, self.took.as_secs_f64()),
        }
    }
}

/// Runs the scenarios one after the other on `system`, each to its end even when an earlier one failed.
pub async fn run_all(system: &SluiceSystem, scenarios: &[Scenario]) -> Vec<Outcome> {
    let mut outcomes = vec![];
    for scenario in scenarios {
        let started = Instant::now();
        let result = std::panic::AssertUnwindSafe((scenario.run)(system))
            .catch_unwind()
            .await
            .map_err(|panic| {
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into())
            });
        outcomes.push(Outcome {
            name: scenario.name,
            took: started.elapsed(),
            result,
        });
    }
    outcomes
}
