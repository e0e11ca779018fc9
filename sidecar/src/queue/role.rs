//! The sidecar's queue roles as library functions the binary wires: the `worker` subcommand
//! ([`load_worker_config`], [`run_worker`]), `migrate` ([`migrate`]), and the queue HTTP API beside the
//! proxy in app pods that enqueue through the sidecar ([`serve_api`]). Each runs until its `shutdown`
//! token fires; signals, tracing and exit codes are the binary's.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use sluice_crds::{
    contract::env as var,
    sidecar_config::{
        ConfigErrors, POOL_SIZE_DEFAULT, QueueConfig, SidecarConfig, queue::ScheduleSpec,
        validate::check_queue,
    },
};
use sluice_queue::{NewJob, QueueSettings, QueueStore, schema, store::Schedule};
use tokio_util::sync::CancellationToken;

use super::{
    api,
    auth::Authenticator,
    dispatch::HttpHandler,
    grpc,
    metrics::QueueMetrics,
    worker::{CLAIMERS_DEFAULT, Worker, WorkerOptions, default_owner},
};
use crate::{
    Error, Result,
    clock::SystemClock,
    config::env::{self, Env},
};

/// The worker's `queue:` config: the file's section (or defaults when there is no file), then the env
/// overrides, validated. Errors name every field at fault.
pub fn load_worker_config(file: Option<&str>, env: &dyn Env) -> Result<QueueConfig> {
    let mut cfg = match file {
        Some(text) => {
            let whole: SidecarConfig =
                serde_yaml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
            whole.queue.unwrap_or_default()
        }
        None => QueueConfig::default(),
    };
    env::apply_queue(&mut cfg, env)?;
    validate_worker_config(&cfg)?;
    Ok(cfg)
}

/// Checks what the worker role needs, naming every field at fault: the section as written (the same
/// checks `--check-config` runs) and, since the environment may supply them, a database and queues.
pub fn validate_worker_config(cfg: &QueueConfig) -> Result<(), ConfigErrors> {
    let mut errs = ConfigErrors::default();
    if cfg.database_url.is_none() {
        errs.push(
            "queue.databaseUrl",
            format!("not set (set {})", var::DATABASE_URL),
        );
    }
    if cfg.queues.is_empty() {
        errs.push(
            "queue.queues",
            format!("no queues to serve (set {}=a,b)", var::QUEUES),
        );
    }
    check_queue(cfg, &mut errs);
    for (i, s) in cfg.schedules.iter().enumerate() {
        if let Err(e) = schedule(cfg, s) {
            errs.push(format!("queue.schedules[{i}]"), e.to_string());
        }
    }
    errs.into_result()
}

/// The store's form of a configured schedule, with its queue (the first served one by default).
fn schedule(cfg: &QueueConfig, s: &ScheduleSpec) -> sluice_queue::Result<(String, Schedule)> {
    let queue = s
        .queue
        .clone()
        .or_else(|| cfg.queues.first().cloned())
        .unwrap_or_default();
    let job = NewJob::new(s.kind.clone(), s.payload.clone()).priority(s.priority);
    let parsed = Schedule::new(
        s.name.clone(),
        &s.cron,
        s.time_zone.as_deref(),
        job,
        s.missed_runs,
    )?;
    Ok((queue, parsed))
}

/// Serves the queue HTTP API alone until `shutdown`: for the proxy role in app pods that enqueue
/// through the sidecar. Returns at once when `cfg.api.listen` is unset. The schema is not migrated here
/// (the operator or the workers do that); an unprepared database answers 503 until it is.
pub async fn serve_api(cfg: &QueueConfig, shutdown: CancellationToken) -> Result<()> {
    match prepare_api(cfg).await? {
        Some(api) => api.serve(shutdown).await,
        None => Ok(()),
    }
}

/// The queue HTTP API, bound and configured, not yet serving.
pub struct PreparedApi {
    listener: tokio::net::TcpListener,
    state: api::ApiState,
}

impl PreparedApi {
    /// Serves until `shutdown`.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        api::serve(self.listener, self.state, shutdown.cancelled_owned()).await?;
        Ok(())
    }
}

/// Everything [`serve_api`] does before serving, so that a caller starting it in the background fails
/// at once on a config error (no database URL, auth without in-cluster credentials, a taken port)
/// rather than at shutdown. `None` when `cfg.api.listen` is unset.
pub async fn prepare_api(cfg: &QueueConfig) -> Result<Option<PreparedApi>> {
    let Some(addr) = cfg.api.listen else {
        return Ok(None);
    };
    let url = cfg.database_url.as_deref().ok_or_else(|| {
        Error::Config(format!(
            "queue.databaseUrl: not set (set {}) but queue.api.listen is",
            var::DATABASE_URL
        ))
    })?;
    let state = api_state(cfg, api_store(cfg, pool(url, cfg)?))?;
    let listener = bind("queue.api.listen", addr).await?;
    Ok(Some(PreparedApi { listener, state }))
}

/// Runs the worker role until `shutdown`: migrates (a no-op when the operator did it already), applies
/// `queue.queueSettings`, serves `/metrics` and `/healthz` (and the queue API when configured), and
/// runs the engine with the HTTP dispatcher, or, when `queue.grpc.listen` is set, serves the gRPC worker
/// API instead (each connected worker's stream runs the engine).
pub async fn run_worker(cfg: QueueConfig, shutdown: CancellationToken) -> Result<()> {
    let url = cfg
        .database_url
        .as_deref()
        .ok_or_else(|| Error::Config("queue.databaseUrl: not set".into()))?;
    let pool = pool(url, &cfg)?;
    if !migrate_until_done(&pool, &shutdown).await {
        return Ok(());
    }
    let store = QueueStore::new(pool);
    for s in &cfg.queue_settings {
        store
            .upsert_queue(&QueueSettings::from(s))
            .await
            .map_err(|e| Error::Config(format!("applying queue.queueSettings for {}: {e}", s.name)))?;
    }
    let schedules = cfg
        .schedules
        .iter()
        .map(|s| schedule(&cfg, s))
        .collect::<sluice_queue::Result<Vec<_>>>()
        .map_err(|e| Error::Config(format!("queue.schedules: {e}")))?;
    if !schedules.is_empty() {
        tracing::info!(schedules = schedules.len(), "scheduler starting");
        // A scheduler pass is one of the worker's loops: under its answer deadline, and ended by the
        // server within it (a pass given up is made again on the next tick).
        let deadline = cfg.worker.answer_deadline.get();
        let scheduler = store
            .clone()
            .with_answer_deadline(deadline)
            .with_server_deadline(deadline);
        tokio::spawn(scheduler.run_schedules(schedules, shutdown.clone()));
    }
    // The gRPC worker API's stream metrics are listed only where it is served.
    let metrics = Arc::new(if cfg.grpc.listen.is_some() {
        QueueMetrics::with_grpc_streams()
    } else {
        QueueMetrics::new()
    });
    serve_admin(&cfg, metrics.clone(), &shutdown).await?;
    if let Some(addr) = cfg.api.listen {
        let state = api_state(&cfg, api_store(&cfg, store.pool().clone()))?;
        let listener = bind("queue.api.listen", addr).await?;
        tokio::spawn(api::serve(listener, state, shutdown.clone().cancelled_owned()));
    }
    let engine = WorkerOptions {
        queues: cfg.queues.clone(),
        concurrency: cfg.worker.concurrency as usize,
        claim_batch: cfg.worker.claim_batch,
        claimers: CLAIMERS_DEFAULT,
        poll_interval: cfg.worker.poll_interval.get(),
        max_poll_interval: cfg.worker.max_poll_interval.get(),
        listen: cfg.worker.listen,
        job_timeout: cfg.handler.timeout.get(),
        shutdown_grace: cfg.worker.shutdown_grace.get(),
        heartbeat_interval: cfg.worker.heartbeat_interval.map(|d| d.get()),
        owner: default_owner(),
        kinds: Vec::new(),
        answer_deadline: cfg.worker.answer_deadline.get(),
    };
    if let Some(addr) = cfg.grpc.listen {
        // gRPC workers connect and take jobs; nothing is POSTed to the handler URL.
        let listener = bind("queue.grpc.listen", addr).await?;
        let auth = Authenticator::from_config(&cfg.api.auth)
            .map_err(|e| Error::Config(format!("queue.api.auth: {e}")))?
            .map(Arc::new);
        if let Some(auth) = &auth {
            tracing::info!(namespace = auth.namespace(), loopback = ?cfg.api.auth.loopback, "gRPC worker API: callers are checked by TokenReview and SubjectAccessReview");
        }
        let opts = grpc::GrpcOptions {
            database_url: url.to_owned(),
            queues: cfg.queues.clone(),
            namespace: cfg.namespace.clone(),
            engine,
            max_streams: cfg.grpc.max_streams,
            max_message_bytes: cfg.grpc.max_message_bytes as usize,
            auth,
            pod_name: std::env::var(var::POD_NAME).ok().filter(|v| !v.trim().is_empty()),
        };
        tracing::info!(%addr, queues = ?cfg.queues, "worker starting: jobs go to gRPC workers");
        grpc::serve(listener, opts, metrics, shutdown).await?;
        tracing::info!("worker stopped");
        return Ok(());
    }
    let handler = HttpHandler::new(
        &cfg.handler.url,
        cfg.handler.timeout.get(),
        cfg.handler.permanent_failure_statuses.clone(),
        Arc::new(SystemClock),
    )?;
    let opts = engine;
    tracing::info!(owner = %opts.owner, queues = ?opts.queues, handler = %cfg.handler.url, "worker starting");
    Worker::new(store, handler, opts)
        .with_metrics(metrics)
        .run(shutdown)
        .await?;
    tracing::info!("worker stopped");
    Ok(())
}

/// Applies the queue migrations to the database at `url`; returns the schema version it is at.
pub async fn migrate(url: &str) -> Result<i64> {
    let pool = sluice_queue::pool::connect_lazy(url, 2)?;
    schema::migrate(&pool).await?;
    Ok(schema::latest_version())
}

/// The schema normally exists (the operator prepares it); migrating again is a cheap no-op under an
/// advisory lock, and makes the env-only mode work on an empty database. Retries with backoff while the
/// database is unreachable; false when `shutdown` came first.
async fn migrate_until_done(pool: &sqlx::PgPool, shutdown: &CancellationToken) -> bool {
    let mut wait = Duration::from_millis(100);
    loop {
        match schema::migrate(pool).await {
            Ok(()) => return true,
            Err(e) => tracing::warn!(error = %e, "migrating the queue schema failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return false,
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// `/metrics` and `/healthz` on `queue.worker.metricsListen`, until `shutdown`.
async fn serve_admin(
    cfg: &QueueConfig,
    metrics: Arc<QueueMetrics>,
    shutdown: &CancellationToken,
) -> Result<()> {
    let listener = bind("queue.worker.metricsListen", cfg.worker.metrics_listen).await?;
    let admin = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || async move { metrics.render() }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, admin)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    Ok(())
}

fn pool(url: &str, cfg: &QueueConfig) -> Result<sqlx::PgPool> {
    Ok(sluice_queue::pool::connect_lazy(
        url,
        cfg.pool_size.unwrap_or(POOL_SIZE_DEFAULT),
    )?)
}

/// The queue HTTP API's store over `pool`: each statement given up when the database has not answered
/// within `queue.api.answerDeadline` (the request is answered 503), and each write ended by the server
/// itself within it, so that an enqueue given up cannot commit long after the app retried it.
pub fn api_store(cfg: &QueueConfig, pool: sqlx::PgPool) -> QueueStore {
    let deadline = cfg.api.answer_deadline.get();
    QueueStore::new(pool)
        .with_answer_deadline(deadline)
        .with_server_deadline(deadline)
}

/// The API's state: its store, limits, queues and, with `queue.api.auth.mode: kubernetes`, the
/// gatekeeper (an error names what it lacks: in-cluster credentials, the namespace).
fn api_state(cfg: &QueueConfig, store: QueueStore) -> Result<api::ApiState> {
    let state = api::ApiState {
        max_batch: cfg.api.max_batch as usize,
        ..api::ApiState::new(store)
    }
    .serving(&cfg.queues)
    .in_namespace(cfg.namespace.as_deref());
    match Authenticator::from_config(&cfg.api.auth)
        .map_err(|e| Error::Config(format!("queue.api.auth: {e}")))?
    {
        Some(auth) => {
            tracing::info!(namespace = auth.namespace(), loopback = ?cfg.api.auth.loopback, "queue api: callers are checked by TokenReview and SubjectAccessReview");
            Ok(state.with_auth(Arc::new(auth)))
        }
        None => Ok(state),
    }
}

/// Binds `addr`, naming the config field it came from when that fails.
async fn bind(field: &str, addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("binding {field} {addr}: {e}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_without_queues_is_refused_naming_the_field() {
        let err = load_worker_config(None, &[(var::DATABASE_URL, "postgres://x/y")]).unwrap_err();
        assert!(err.to_string().contains("queue.queues"), "{err}");
    }

    #[test]
    fn schedules_are_checked_naming_each_field_at_fault() {
        let file = r#"
queue:
  databaseUrl: postgres://file/db
  queues: [a]
  schedules:
    - {name: ok, cron: "*/10 * * * * *", timeZone: Europe/Berlin, kind: k, missedRuns: runOnce}
    - {name: bad-cron, cron: "61 * * * *", kind: k}
    - {name: bad-zone, cron: "* * * * *", timeZone: Mars/Base, kind: k}
    - {name: ok, queue: other, cron: "* * * * *", kind: k}
"#;
        let err = load_worker_config(Some(file), &[] as &[(&str, &str); 0])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("queue.schedules[1]") && err.contains("61 * * * *"),
            "{err}"
        );
        assert!(
            err.contains("queue.schedules[2]") && err.contains("Mars/Base"),
            "{err}"
        );
        assert!(err.contains("queue.schedules[3].queue"), "{err}");
        assert!(!err.contains("queue.schedules[0]"), "{err}");

        let good = "queue:\n  databaseUrl: postgres://x/y\n  queues: [a]\n  schedules:\n    - {name: s, cron: '0 3 * * *', kind: k}\n";
        let cfg = load_worker_config(Some(good), &[] as &[(&str, &str); 0]).unwrap();
        let (queue, parsed) = schedule(&cfg, &cfg.schedules[0]).unwrap();
        assert_eq!((queue.as_str(), parsed.name.as_str()), ("a", "s"));
    }

    #[test]
    fn the_grpc_api_is_off_unless_its_address_is_set() {
        let base = [(var::DATABASE_URL, "postgres://x/y"), (var::QUEUES, "a")];
        let cfg = load_worker_config(None, &base).unwrap();
        assert_eq!(cfg.grpc.listen, None);
        assert!(
            !serde_yaml::to_string(&cfg).unwrap().contains("grpc"),
            "defaults are not written"
        );
        let env = [base[0], base[1], (var::GRPC_LISTEN, "127.0.0.1:9903")];
        let cfg = load_worker_config(None, &env).unwrap();
        assert_eq!(cfg.grpc.listen, Some("127.0.0.1:9903".parse().unwrap()));
        let file = "queue:\n  grpc: {listen: 127.0.0.1:9903, maxStreams: 2}\n";
        let cfg = load_worker_config(Some(file), &base).unwrap();
        assert_eq!((cfg.grpc.listen.is_some(), cfg.grpc.max_streams), (true, 2));
        let bad = [base[0], base[1], (var::GRPC_LISTEN, "nine")];
        let err = load_worker_config(None, &bad).unwrap_err().to_string();
        assert!(err.contains(var::GRPC_LISTEN), "{err}");
    }

    #[test]
    fn env_overrides_the_file() {
        let file = "queue:\n  databaseUrl: postgres://file/db\n  queues: [a]\n  worker: {concurrency: 2}\n";
        let cfg = load_worker_config(Some(file), &[(var::QUEUES, "b")]).unwrap();
        assert_eq!(cfg.queues, vec!["b"]);
        assert_eq!(cfg.worker.concurrency, 2);
        assert_eq!(cfg.database_url.as_deref(), Some("postgres://file/db"));
    }
}
