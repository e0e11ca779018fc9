//! Scaling a JobQueue's workers: pure decisions ([`decision`], [`deletion_cost`]) and the adapters
//! they need ([`databases`]: pooled connections, depth, leases; [`waker`]: LISTEN/NOTIFY for 0→1;
//! [`metrics`]).

pub mod databases;
pub mod decision;
pub mod deletion_cost;
pub mod metrics;
pub mod waker;

pub use databases::Databases;
pub use decision::{Autoscaler, Decision, Observation, Policy, Reason, decide};
pub use metrics::JobQueueMetrics;
pub use waker::{Wake, Waker, Wakes};
