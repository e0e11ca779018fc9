//! The seam between the proxy and the limiter: the proxy asks a [`RateLimit`] for a verdict, so the
//! real Redis-backed [`Limiter`] runs in production and tests can stand in a limiter of their own.

use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use sluice_crds::sidecar_config::{LimitsConfig, PolicyRef};

use crate::{
    clock::SharedClock,
    limiter::{Limiter, RequestFacts, Verdict},
};

/// Decides requests; hot-reconfigurable without losing counters.
pub trait RateLimit: Send + Sync + 'static {
    /// Decides one request.
    fn check<'a>(&'a self, req: &'a RequestFacts<'a>) -> BoxFuture<'a, Verdict>;
    /// Takes a new config, keeping counters of rules that keep their names.
    fn reconfigure(&self, config: &LimitsConfig, policy: Option<&PolicyRef>) -> crate::Result<()>;
    /// Whether Redis answers (reported on `/readyz`); true when no Redis is configured.
    fn redis_healthy(&self) -> bool;
    /// Why Redis cannot be reached, if a connection failed (reported on `/readyz`).
    fn redis_problem(&self) -> Option<crate::redis::Problem> {
        None
    }
    /// How many pods enforce the policy, as the operator published it (divides limits under
    /// `failureMode: local`).
    fn set_enforcing_pods(&self, _pods: u32) {}
}

impl RateLimit for Limiter {
    fn check<'a>(&'a self, req: &'a RequestFacts<'a>) -> BoxFuture<'a, Verdict> {
        Box::pin(Limiter::check(self, req))
    }

    fn reconfigure(&self, config: &LimitsConfig, policy: Option<&PolicyRef>) -> crate::Result<()> {
        Limiter::reconfigure(self, config, policy)
    }

    fn redis_healthy(&self) -> bool {
        !self.uses_redis() || Limiter::redis_healthy(self)
    }

    fn redis_problem(&self) -> Option<crate::redis::Problem> {
        Limiter::redis_problem(self)
    }

    fn set_enforcing_pods(&self, pods: u32) {
        Limiter::set_enforcing_pods(self, pods);
    }
}

/// Builds the real limiter. Never fails because Redis is down: the limiter reconnects in the background
/// and applies its failure mode meanwhile.
pub async fn connect(
    config: &LimitsConfig,
    policy: Option<&PolicyRef>,
    clock: SharedClock,
    registry: &mut Registry,
) -> crate::Result<Limiter> {
    Limiter::connect(config, policy, config.redis.url.as_deref(), clock, registry).await
}
