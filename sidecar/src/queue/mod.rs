//! The PostgreSQL job queue: schema, store, worker engine, HTTP dispatch, HTTP API and client library.
//!
//! Layout (dependencies point down): [`backoff`] (pure retry math) and [`job`] (types); [`sql`] (named
//! statements); [`schema`] (migrations) and [`store`] (typed SQL calls, [`QueueStore`]); [`metrics`];
//! [`worker`] (the engine: claim loop, heartbeats, batch completer, maintenance); [`dispatch`] (the
//! sidecar's HTTP handler); [`api`] (the HTTP API for apps); [`client`] (the Rust client library).
//!
//! For the operator: [`schema::migrate`], [`QueueStore::upsert_queue`], [`QueueStore::depth`] /
//! [`QueueStore::depth_all`] ([`job::Depth::demand`] is ready + running), NOTIFY channel
//! [`worker::NOTIFY_CHANNEL`] (payload: the queue name), [`api::router`] / [`api::serve`].

pub mod api;
pub mod backoff;
pub mod client;
pub mod dispatch;
pub mod job;
pub mod listen;
pub mod metrics;
pub mod schema;
pub mod sql;
pub mod store;
pub mod worker;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use sluice_crds::sidecar_config::{QueueConfig, SidecarConfig};
use sqlx::{PgPool, postgres::PgPoolOptions};
use tokio_util::sync::CancellationToken;

pub use job::{ClaimedJob, Depth, Enqueued, Job, JobState, NewJob, QueueSettings};
pub use store::QueueStore;
pub use worker::{Handler, Outcome, Worker, WorkerOptions};

use crate::clock::SystemClock;

/// Command-line arguments of the worker role.
#[derive(clap::Args, Debug, Default)]
pub struct WorkerArgs {
    /// The config file (YAML, its `queue:` section). Without it the worker runs on env vars alone:
    /// SLUICE_DATABASE_URL, SLUICE_QUEUES (comma-separated), SLUICE_HANDLER_URL, SLUICE_WORKER_CONCURRENCY,
    /// SLUICE_API_LISTEN.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

/// Command-line arguments of `migrate`.
#[derive(clap::Args, Debug, Default)]
pub struct MigrateArgs {
    /// The database to migrate.
    #[arg(long, env = "SLUICE_DATABASE_URL")]
    pub database_url: Option<String>,
}

/// Env vars the worker role reads, each overriding the config file.
pub const ENV_VARS: [&str; 7] = [
    "SLUICE_DATABASE_URL",
    "SLUICE_QUEUES",
    "SLUICE_HANDLER_URL",
    "SLUICE_WORKER_CONCURRENCY",
    "SLUICE_API_LISTEN",
    "SLUICE_METRICS_LISTEN",
    "SLUICE_POD_NAME",
];

/// The worker's `queue:` config: the file's section (or defaults), then env overrides from `env`,
/// validated. Errors name the field at fault.
pub fn load_worker_config(
    file: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> crate::Result<QueueConfig> {
    let mut cfg = match file {
        Some(text) => {
            let whole: SidecarConfig =
                serde_yaml::from_str(text).map_err(|e| crate::Error::Config(e.to_string()))?;
            whole.queue.unwrap_or_default()
        }
        None => QueueConfig::default(),
    };
    apply_env(&mut cfg, env)?;
    validate_worker_config(&cfg)?;
    Ok(cfg)
}

/// Applies the env overrides of [`ENV_VARS`] to `cfg` (for the worker role, and for the proxy role's queue
/// API: `SLUICE_API_LISTEN`, `SLUICE_DATABASE_URL`).
pub fn apply_env(cfg: &mut QueueConfig, env: impl Fn(&str) -> Option<String>) -> crate::Result<()> {
    let bad = |field: &str, v: &str, why: &str| crate::Error::Config(format!("{field}: {v:?} {why}"));
    if let Some(v) = env("SLUICE_DATABASE_URL") {
        cfg.database_url = Some(v);
    }
    if let Some(v) = env("SLUICE_QUEUES") {
        cfg.queues = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
    }
    if let Some(v) = env("SLUICE_HANDLER_URL") {
        cfg.handler.url = v;
    }
    if let Some(v) = env("SLUICE_WORKER_CONCURRENCY") {
        cfg.worker.concurrency = v
            .parse()
            .map_err(|_| bad("SLUICE_WORKER_CONCURRENCY", &v, "is not a number"))?;
    }
    if let Some(v) = env("SLUICE_API_LISTEN") {
        cfg.api.listen = Some(
            v.parse()
                .map_err(|_| bad("SLUICE_API_LISTEN", &v, "is not an address like 127.0.0.1:7070"))?,
        );
    }
    if let Some(v) = env("SLUICE_METRICS_LISTEN") {
        cfg.worker.metrics_listen = v
            .parse()
            .map_err(|_| bad("SLUICE_METRICS_LISTEN", &v, "is not an address like 0.0.0.0:9902"))?;
    }
    Ok(())
}

/// Checks what the worker role needs, naming every field at fault: the section as written (the same
/// checks `--check-config` runs) and, since the environment may supply them, a database and queues.
pub fn validate_worker_config(cfg: &QueueConfig) -> crate::Result<()> {
    let mut errs = crate::config::ConfigErrors::default();
    if cfg.database_url.is_none() {
        errs.push("queue.databaseUrl", "not set (set SLUICE_DATABASE_URL)");
    }
    if cfg.queues.is_empty() {
        errs.push("queue.queues", "no queues to serve (set SLUICE_QUEUES=a,b)");
    }
    crate::config::validate::check_queue(cfg, &mut errs);
    errs.into_result()
        .map_err(|e| crate::Error::Config(e.to_string()))
}

/// Serves the queue HTTP API alone until `shutdown` — for the proxy role in app pods that enqueue
/// through the sidecar. Returns at once when `cfg.api.listen` is unset. The schema is not migrated here
/// (the operator or the workers do that); an unprepared database answers 503 until it is.
pub async fn serve_api_role(cfg: &QueueConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let Some(addr) = cfg.api.listen else {
        return Ok(());
    };
    let url = cfg
        .database_url
        .clone()
        .context("queue.databaseUrl: not set (set SLUICE_DATABASE_URL) but queue.api.listen is")?;
    let pool = connect_lazy(
        &url,
        cfg.pool_size
            .unwrap_or(sluice_crds::sidecar_config::POOL_SIZE_DEFAULT),
    )?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding queue.api.listen {addr}"))?;
    let state = api::ApiState {
        max_batch: cfg.api.max_batch as usize,
        ..api::ApiState::new(QueueStore::new(pool))
    }
    .serving(&cfg.queues);
    api::serve(listener, state, async move { shutdown.cancelled().await }).await?;
    Ok(())
}

/// A pool for the queue: short acquire timeout so a dead database fails calls fast (they are retried).
pub fn connect_lazy(url: &str, size: u32) -> crate::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(size.max(2))
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy(url)?)
}

/// Runs the worker role with `cfg` until `shutdown` fires: migrates, applies queue settings, serves
/// metrics (and the queue API when configured), and runs the engine with the HTTP dispatcher.
pub async fn run_worker_role(cfg: QueueConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let url = cfg.database_url.clone().context("queue.databaseUrl")?;
    let pool = connect_lazy(
        &url,
        cfg.pool_size
            .unwrap_or(sluice_crds::sidecar_config::POOL_SIZE_DEFAULT),
    )?;
    // The schema normally exists (the operator prepares it); migrating again is a cheap no-op under
    // an advisory lock, and makes the env-only mode work on an empty database.
    let mut wait = Duration::from_millis(100);
    loop {
        match schema::migrate(&pool).await {
            Ok(()) => break,
            Err(e) => tracing::warn!(error = %e, "migrating the queue schema failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
    let store = QueueStore::new(pool);
    for s in &cfg.queue_settings {
        store
            .upsert_queue(&QueueSettings::from(s))
            .await
            .with_context(|| format!("applying queue.queueSettings for {}", s.name))?;
    }
    let metrics = Arc::new(metrics::QueueMetrics::new());
    let metrics_listener = tokio::net::TcpListener::bind(cfg.worker.metrics_listen)
        .await
        .with_context(|| format!("binding queue.worker.metricsListen {}", cfg.worker.metrics_listen))?;
    let m = metrics.clone();
    let admin = axum::Router::new()
        .route("/metrics", axum::routing::get(move || async move { m.render() }))
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = axum::serve(metrics_listener, admin)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    if let Some(addr) = cfg.api.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding queue.api.listen {addr}"))?;
        let state = api::ApiState {
            max_batch: cfg.api.max_batch as usize,
            ..api::ApiState::new(store.clone())
        }
        .serving(&cfg.queues);
        let stop = shutdown.clone();
        tokio::spawn(api::serve(listener, state, async move { stop.cancelled().await }));
    }
    let handler = dispatch::HttpHandler::new(
        &cfg.handler.url,
        cfg.handler.timeout.get(),
        cfg.handler.permanent_failure_statuses.clone(),
        Arc::new(SystemClock),
    )?;
    let opts = WorkerOptions {
        queues: cfg.queues.clone(),
        concurrency: cfg.worker.concurrency as usize,
        claim_batch: cfg.worker.claim_batch,
        claimers: 2,
        poll_interval: cfg.worker.poll_interval.get(),
        max_poll_interval: cfg.worker.max_poll_interval.get(),
        listen: cfg.worker.listen,
        job_timeout: cfg.handler.timeout.get(),
        shutdown_grace: cfg.worker.shutdown_grace.get(),
        heartbeat_interval: cfg.worker.heartbeat_interval.map(|d| d.get()),
        owner: worker::default_owner(),
    };
    tracing::info!(owner = %opts.owner, queues = ?opts.queues, handler = %cfg.handler.url, "worker starting");
    Worker::new(store, handler, opts)
        .with_metrics(metrics)
        .run(shutdown)
        .await?;
    tracing::info!("worker stopped");
    Ok(())
}

/// A token cancelled on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                t.cancel();
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        t.cancel();
    });
    token
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the worker role until SIGTERM.
pub async fn worker_main(args: WorkerArgs) -> anyhow::Result<()> {
    init_tracing();
    let text = match &args.config {
        Some(path) => Some(
            std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?,
        ),
        None => None,
    };
    let cfg = load_worker_config(text.as_deref(), |k| {
        std::env::var(k).ok().filter(|v| !v.is_empty())
    })?;
    run_worker_role(cfg, shutdown_on_signals()).await
}

/// Applies the migrations and exits.
pub async fn migrate_main(args: MigrateArgs) -> anyhow::Result<()> {
    init_tracing();
    let url = args
        .database_url
        .context("--database-url or SLUICE_DATABASE_URL is required")?;
    let pool = connect_lazy(&url, 2)?;
    schema::migrate(&pool).await?;
    println!("queue schema is at version {}", schema::latest_version());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn env_vars_alone_configure_a_worker() {
        let cfg = load_worker_config(
            None,
            env(&[
                ("SLUICE_DATABASE_URL", "postgres://x/y"),
                ("SLUICE_QUEUES", "emails, reports"),
                ("SLUICE_HANDLER_URL", "http://127.0.0.1:9/jobs"),
                ("SLUICE_WORKER_CONCURRENCY", "4"),
                ("SLUICE_API_LISTEN", "127.0.0.1:7070"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.queues, vec!["emails", "reports"]);
        assert_eq!(cfg.worker.concurrency, 4);
        assert_eq!(cfg.handler.url, "http://127.0.0.1:9/jobs");
        assert_eq!(cfg.api.listen, Some("127.0.0.1:7070".parse().unwrap()));
    }

    #[test]
    fn a_worker_without_queues_is_refused_naming_the_field() {
        let err = load_worker_config(None, env(&[("SLUICE_DATABASE_URL", "postgres://x/y")])).unwrap_err();
        assert!(err.to_string().contains("queue.queues"), "{err}");
    }

    #[test]
    fn env_overrides_the_file() {
        let file = "queue:\n  databaseUrl: postgres://file/db\n  queues: [a]\n  worker: {concurrency: 2}\n";
        let cfg = load_worker_config(Some(file), env(&[("SLUICE_QUEUES", "b")])).unwrap();
        assert_eq!(cfg.queues, vec!["b"]);
        assert_eq!(cfg.worker.concurrency, 2);
        assert_eq!(cfg.database_url.as_deref(), Some("postgres://file/db"));
    }
}
