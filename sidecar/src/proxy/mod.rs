//! The rate-limiting reverse proxy and its admin endpoints.
//!
//! Layout: [`server`] (accept loop, graceful shutdown), [`capacity`] (the connection cap and the budget
//! of long request heads), [`admit`] (body limit and the limiter's verdict, for both paths below),
//! [`h1`] (the HTTP/1.1 fast path every connection starts on), [`fallback`] and [`forward`] (hyper, for
//! what the fast path hands over: h2c, HTTP/1.0, upgrades, odd framing), [`watched`] (the hyper path's
//! client timeouts), [`target`] (the path, host and method read one way, for the rules and the app
//! alike), [`app_connection`] (the hyper path's kept-alive connection to the app), [`client_body`] (a
//! request body on the hyper path), [`upgrade`] (allowed upgrades, tunnels), [`forwarded`] (how heads
//! are rewritten; hop-by-hop fields are [`crate::http1::hop_by_hop`]), [`end_to_end`] (the fields the
//! limiter reads: those the app will receive), [`headers`] (quota headers), [`reject`] (the proxy's own
//! responses: the 429 and its sampled log line, 413, 502), [`admin`] (`/healthz`, `/readyz`,
//! `/metrics`), [`state`] (the running config, swapped on reload), [`limit`] (the seam to the limiter),
//! [`metrics`], [`demo`] (`sluice-sidecar demo`).

pub mod admin;
pub mod admit;
pub mod app_connection;
pub mod capacity;
pub mod client_body;
pub mod demo;
pub mod end_to_end;
pub mod fallback;
pub mod forward;
pub mod forwarded;
pub mod h1;
pub mod headers;
pub mod limit;
pub mod metrics;
pub mod reject;
pub mod server;
pub mod state;
pub mod target;
pub mod upgrade;
pub mod watched;

use std::{path::PathBuf, sync::Arc};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::{SharedClock, SystemClock},
    config::{ConfigErrors, Effective, env::Env, load, reload, remote},
};
use metrics::ProxyMetrics;
use state::ProxyState;

/// Body of a request forwarded to the app on the hyper path: the client's, guarded (capped at
/// `limits.maxRequestBody`, a deadline between reads, stopped once the app answers).
pub type RequestBody = client_body::ClientBody;
/// Body of a response: the app's, streamed, or a short one the proxy made itself.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// Command-line arguments of the proxy role.
#[derive(clap::Args, Debug, Default)]
pub struct ProxyArgs {
    /// The config file (YAML). Without it the sidecar runs on env vars alone, with the seed tiers as rules.
    #[arg(long, env = sluice_crds::contract::env::CONFIG)]
    pub config: Option<PathBuf>,
    /// Validate FILE (with the env overrides) and exit: 0 when valid, 1 naming every field at fault.
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
    /// How often the config file is re-read for hot reload.
    #[arg(long, env = sluice_crds::contract::env::CONFIG_POLL, default_value = "1s")]
    pub config_poll: sluice_crds::Duration,
}

/// Validates a config file as `--check-config` does; returns a one-line summary when it is valid.
pub fn check_config(path: &std::path::Path, env: &dyn Env) -> Result<String, ConfigErrors> {
    let e = load::from_file(path, env)?;
    crate::redis::check(&e.config.limits.redis)?;
    Ok(format!(
        "{}: valid ({} rules{}, generation {})",
        path.display(),
        e.config.limits.rules.len(),
        if e.seed_tiers { ", the seed tiers" } else { "" },
        e.generation()
    ))
}

/// Builds the proxy state for `effective`: the limiter (which never fails because Redis is down), its
/// metrics and the proxy's in one registry.
pub async fn build_state(effective: Effective, clock: SharedClock) -> crate::Result<Arc<ProxyState>> {
    let mut registry = Registry::default();
    let limiter = limit::connect(
        &effective.config.limits,
        effective.config.policy.as_ref(),
        clock.clone(),
        &mut registry,
    )
    .await?;
    let metrics = ProxyMetrics::register(&mut registry);
    Ok(Arc::new(ProxyState::new(
        effective,
        Arc::new(limiter),
        metrics,
        registry,
        clock,
    )?))
}

/// Starts the background config sources for a running proxy: the file watch (when started from a
/// file) and the Redis channel (when the config names a policy and Redis is configured).
pub fn spawn_config_sources(
    state: &Arc<ProxyState>,
    file: Option<(PathBuf, u64)>,
    poll: std::time::Duration,
    env: Arc<dyn Env>,
    shutdown: &CancellationToken,
) {
    if let Some((path, hash)) = file {
        tokio::spawn(reload::watch_file(
            path,
            env.clone(),
            poll,
            hash,
            state.clone(),
            shutdown.clone(),
        ));
    }
    let snap = state.snapshot();
    let cfg = &snap.effective.config;
    if let (Some(policy), Some(url)) = (&cfg.policy, &cfg.limits.redis.url) {
        let remote = remote::Remote {
            redis_url: url.clone(),
            ca_file: cfg.limits.redis.ca_file.clone(),
            policy: policy.clone(),
            pod: crate::config::env::pod_name(&*env),
            env,
            clock: state.clock.clone(),
            on_enforcing_pods: {
                let (limiter, gauge) = (state.limiter.clone(), state.metrics.enforcing_pods.clone());
                Arc::new(move |pods| {
                    limiter.set_enforcing_pods(pods);
                    gauge.set(i64::from(pods));
                })
            },
        };
        let applied = state.generation_changes();
        let sink = state.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = remote::run(remote, sink, applied, stop).await {
                tracing::error!(error = %e, "config channel disabled");
            }
        });
    }
}

/// Runs the proxy role until `shutdown` fires: load and validate the config (before binding any port),
/// bind, serve (with the queue HTTP API beside it when `queue.api.listen` or `SLUICE_API_LISTEN` asks),
/// hot-reload, drain.
pub async fn run(args: &ProxyArgs, env: Arc<dyn Env>, shutdown: CancellationToken) -> crate::Result<()> {
    let (effective, file) = match &args.config {
        Some(path) => {
            let (text, hash) = load::read(path)?;
            let effective = load::from_yaml(&text, &*env)
                .map_err(|e| crate::Error::Config(format!("invalid config {}:\n{e}", path.display())))?;
            (effective, Some((path.clone(), hash)))
        }
        None => (
            load::from_env(&*env).map_err(|e| crate::Error::Config(format!("invalid environment:\n{e}")))?,
            None,
        ),
    };
    // Pods that enqueue through the sidecar get the queue HTTP API beside the proxy; without
    // `queue.api.listen` (or SLUICE_API_LISTEN) it is off.
    crate::redis::check(&effective.config.limits.redis)?;
    let mut queue = effective.config.queue.clone().unwrap_or_default();
    crate::config::env::apply_queue(&mut queue, &*env)?;
    let limits = &effective.config.limits;
    let fd_limit = capacity::raise_fd_limit();
    let listener = bind("limits.listen", limits.listen).await?;
    let admin = bind("limits.adminListen", limits.admin_listen).await?;
    tracing::info!(
        listen = %limits.listen,
        admin = %limits.admin_listen,
        upstream = %limits.upstream,
        redis = limits.redis.url.is_some(),
        rules = limits.rules.len(),
        seed_tiers = effective.seed_tiers,
        limiting = effective.limiting_enabled,
        "sluice-sidecar proxy starting"
    );
    let clock: SharedClock = Arc::new(SystemClock);
    let state = build_state(effective, clock).await?;
    let caps = state.capacity.caps();
    tracing::info!(
        max_connections = caps.max_connections,
        head_budget = caps.head_budget,
        fd_limit,
        "client connection caps"
    );
    // Prepared here so that a queue API that cannot start stops the sidecar now, naming why.
    let queue_api = crate::queue::role::prepare_api(&queue).await?;
    let queue_api = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            match queue_api {
                Some(api) => api.serve(shutdown).await,
                None => Ok(()),
            }
        }
    });
    spawn_config_sources(&state, file, args.config_poll.get(), env, &shutdown);
    server::run(listener, admin, state, shutdown).await?;
    queue_api
        .await
        .map_err(|e| crate::Error::Io(std::io::Error::other(format!("queue API task: {e}"))))??;
    tracing::info!("stopped");
    Ok(())
}

/// Binds `addr`, naming the config field it came from when that fails.
async fn bind(field: &str, addr: std::net::SocketAddr) -> crate::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        crate::Error::Io(std::io::Error::new(
            e.kind(),
            format!("binding {field} {addr}: {e}"),
        ))
    })
}
