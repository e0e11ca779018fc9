//! Wiring for `sluice-operator run`: every replica serves the webhook, the external metrics API and
//! `/metrics`; the holder of the one Lease also runs both controllers (RateLimitPolicy and JobQueue).
//! The binary only parses flags, starts tracing and calls [`run`].

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, routing::get};
use futures::StreamExt;
use kube::{
    Client,
    runtime::{WatchStreamExt, reflector, watcher},
};
use sluice_crds::{job_queue::JobQueue, rate_limit_policy::RateLimitPolicy};
use tokio::{net::TcpListener, sync::watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    Result,
    budget::{self, Budget},
    certs,
    clock::system_clock,
    config::{NativeSidecar, RunArgs},
    controller::{Context, Namespaces, job_queue, queue_database, rate_limit_policy, reviewer_binding},
    external_metrics, leader,
    metrics::Metrics,
    propagation::Publisher,
    render::sidecar_container::SidecarSettings,
    scaling::{Databases, JobQueueMetrics},
    serve::{Limits, Serving, serve},
    signing::{self, ConfigSigner},
    webhook::{
        inject::InjectConfig,
        job_queue_access::SubjectAccessReviews,
        server::{self, Caches, WebhookState},
    },
};

/// What `/readyz` waits for: a certificate the API server trusts, synced policy and JobQueue caches, and
/// every server's accept loop running; `/healthz` fails when one of those loops has stopped, which no
/// wait mends.
#[derive(Debug, Default)]
pub struct Health {
    /// The webhook serves a certificate that the `caBundle` trusts.
    pub cert_ready: AtomicBool,
    /// The policy cache has listed every `RateLimitPolicy` once.
    pub policies_synced: AtomicBool,
    /// The JobQueue cache has listed every `JobQueue` once.
    pub job_queues_synced: AtomicBool,
    /// The servers whose accept loops must run, by name (the webhook, the external metrics API, the
    /// metrics server itself).
    pub servers: std::sync::Mutex<Vec<(&'static str, Serving)>>,
}

impl Health {
    /// Registers a server whose accept loop must run; returns the flag to hand to [`serve`].
    pub fn server(&self, name: &'static str) -> Serving {
        let serving = Serving::default();
        self.servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, serving.clone()));
        serving
    }

    /// The servers whose accept loop has stopped (or not started yet).
    pub fn stopped_servers(&self) -> Vec<&'static str> {
        self.servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, s)| !s.is_serving())
            .map(|(name, _)| *name)
            .collect()
    }

    /// Why the replica is not ready, or `None` when it is.
    pub fn not_ready(&self) -> Option<String> {
        let stopped = self.stopped_servers();
        if !stopped.is_empty() {
            return Some(format!("not serving: {}", stopped.join(", ")));
        }
        let ready = self.cert_ready.load(Ordering::Relaxed)
            && self.policies_synced.load(Ordering::Relaxed)
            && self.job_queues_synced.load(Ordering::Relaxed);
        (!ready).then(|| "waiting for the webhook certificate and the policy and JobQueue caches".to_owned())
    }
}

/// Both metric sets `/metrics` serves.
#[derive(Clone)]
pub struct AllMetrics {
    /// Controllers, admissions, leadership.
    pub operator: Arc<Metrics>,
    /// JobQueue depth, scale decisions, external-metric requests.
    pub job_queues: Arc<JobQueueMetrics>,
}

/// `/metrics` (the operator's and the JobQueues' metrics), `/healthz`, `/readyz`.
pub fn metrics_router(metrics: AllMetrics, health: Arc<Health>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State((m, _)): State<(AllMetrics, Arc<Health>)>| async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    // The JobQueue part comes without its `# EOF`, so the whole is one exposition.
                    format!("{}{}", m.job_queues.encode(), m.operator.encode()),
                )
            }),
        )
        .route(
            "/healthz",
            get(|State((_, h)): State<(AllMetrics, Arc<Health>)>| async move {
                let stopped = h.stopped_servers();
                if stopped.is_empty() {
                    (StatusCode::OK, "ok".to_owned())
                } else {
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("not serving: {}", stopped.join(", ")),
                    )
                }
            }),
        )
        .route(
            "/readyz",
            get(|State((_, h)): State<(AllMetrics, Arc<Health>)>| async move {
                match h.not_ready() {
                    None => (StatusCode::OK, "ready".to_owned()),
                    Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                }
            }),
        )
        .with_state((metrics, health))
}

/// A cache of every `K` in the watched namespaces, kept by one watch per namespace (or one for the
/// cluster) for as long as the process runs; `synced` runs once every watch has listed its objects.
fn cache<K>(client: &Client, namespaces: &Namespaces, synced: impl FnOnce() + Send + 'static) -> Caches<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let stores: Vec<reflector::Store<K>> = namespaces
        .apis::<K>(client)
        .into_iter()
        .map(|api| {
            let (store, writer) = reflector::store::<K>();
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff()
                .touched_objects()
                .for_each(|_| async {});
            tokio::spawn(stream);
            store
        })
        .collect();
    let ready = stores.clone();
    tokio::spawn(async move {
        let all = futures::future::join_all(ready.iter().map(|s| s.wait_until_ready())).await;
        if all.iter().all(Result::is_ok) {
            synced();
        }
    });
    Caches(stores)
}

/// The config signer from its Secret (made on first start), trying again every second until it can be
/// read or `shutdown` fires.
pub async fn load_signer(
    client: &Client,
    namespace: &str,
    secret: &str,
    shutdown: &CancellationToken,
) -> Result<ConfigSigner> {
    loop {
        match signing::load_or_create(client, namespace, secret).await {
            Ok(signer) => {
                info!(public_key = signer.public_key_hex(), "config signing key loaded");
                return Ok(signer);
            }
            Err(e) => warn!(error = %e, "config signing key: Secret {namespace}/{secret} not readable yet"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = shutdown.cancelled() => return Err(crate::Error::Tls("shut down before the config signing key was loaded".into())),
        }
    }
}

/// Whether to inject native sidecars, deciding `auto` from the API server's version (1.29+).
pub async fn native_sidecars(client: &Client, choice: NativeSidecar) -> bool {
    match choice {
        NativeSidecar::True => true,
        NativeSidecar::False => false,
        NativeSidecar::Auto => match client.apiserver_version().await {
            Ok(v) => {
                let minor: u32 = v.minor.trim_end_matches('+').parse().unwrap_or(0);
                v.major == "1" && minor >= 29 || v.major.parse::<u32>().unwrap_or(0) > 1
            }
            Err(e) => {
                warn!(error = %e, "cannot read the API server version; injecting plain containers");
                false
            }
        },
    }
}

/// Run until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> Result<()> {
    let client = Client::try_default().await?;
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            info!("shutting down");
            shutdown.cancel();
        });
    }
    run_with(client, args, shutdown).await
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Run with a given client until `shutdown` is cancelled. Tests call this against the test API server.
pub async fn run_with(client: Client, args: RunArgs, shutdown: CancellationToken) -> Result<()> {
    let identity = args.identity();
    let metrics = Arc::new(Metrics::default());
    let job_queue_metrics = Arc::new(JobQueueMetrics::default());
    let budget = || {
        Budget::new(
            args.max_endpoints_per_namespace,
            args.max_endpoints,
            budget::IDLE_DEFAULT,
        )
    };
    let databases = Arc::new(Databases::default().with_budget(budget()));
    let health = Arc::new(Health::default());

    // Policy and JobQueue caches for the webhook (every replica); `/readyz` waits for both.
    let namespaces = Namespaces::from_list(&args.watch_namespaces);
    let policies = cache::<RateLimitPolicy>(&client, &namespaces, {
        let health = health.clone();
        move || health.policies_synced.store(true, Ordering::Relaxed)
    });
    let job_queues = cache::<JobQueue>(&client, &namespaces, {
        let health = health.clone();
        move || health.job_queues_synced.store(true, Ordering::Relaxed)
    });

    // Serving certificate, rotated and trusted.
    let cert_store = Arc::new(certs::CertStore::default());
    let keeper = certs::Keeper {
        settings: certs::CertSettings {
            namespace: args.namespace.clone(),
            secret: args.webhook_cert_secret.clone(),
            service: args.webhook_service.clone(),
            ca_name: certs::WEBHOOK_CA_NAME.into(),
        },
        trust: certs::Trust::Webhook(args.webhook_config_name.clone()),
        source: if args.cert_manager {
            certs::Source::Directory(args.webhook_cert_dir.clone())
        } else {
            certs::Source::Generated
        },
        interval: certs::CHECK_INTERVAL,
        clock: system_clock(),
    };
    {
        let health = health.clone();
        tokio::spawn(certs::keep(
            client.clone(),
            keeper,
            cert_store.clone(),
            move |trusted| health.cert_ready.store(trusted, Ordering::Relaxed),
            shutdown.clone(),
        ));
    }

    // The key that signs configs published through Redis; its public half goes into injected sidecars.
    let signer =
        Arc::new(load_signer(&client, &args.namespace, &args.config_signing_secret, &shutdown).await?);

    // The webhook (every replica).
    let native = native_sidecars(&client, args.sidecar_native).await;
    let sidecar = SidecarSettings {
        image: args.sidecar_image.clone(),
        image_pull_policy: args.sidecar_image_pull_policy.clone(),
        resources: Some(args.sidecar_resources.clone()),
        queue_api_auth: args.queue_api_auth == crate::config::QueueApiAuth::Kubernetes,
    };
    let state = Arc::new(WebhookState {
        policies,
        job_queues,
        config: InjectConfig {
            sidecar: sidecar.clone(),
            native,
            config_verify_key: Some(signer.public_key_hex().to_owned()),
            queue_api_auth: args.queue_api_auth == crate::config::QueueApiAuth::Kubernetes,
        },
        metrics: metrics.clone(),
        authorizer: Arc::new(SubjectAccessReviews(client.clone())),
    });
    let webhook_listener = TcpListener::bind(args.webhook_listen).await?;
    info!(addr = %args.webhook_listen, native_sidecars = native, "webhook listening");
    let tls = cert_store.server_config()?;
    let webhook = tokio::spawn(serve(
        "webhook",
        webhook_listener,
        Some(tls),
        server::router(state),
        Limits::default(),
        health.server("webhook"),
        shutdown.clone().cancelled_owned(),
    ));

    // The external metrics API (every replica), with its own rotated certificate.
    if args.external_metrics {
        let listener = TcpListener::bind(args.external_metrics_listen).await?;
        let keeper = certs::Keeper {
            settings: certs::CertSettings {
                namespace: args.namespace.clone(),
                secret: args.external_metrics_cert_secret.clone(),
                service: args.external_metrics_service.clone(),
                ca_name: certs::METRICS_API_CA_NAME.into(),
            },
            trust: certs::Trust::ApiService,
            source: if args.cert_manager {
                certs::Source::Secret
            } else {
                certs::Source::Generated
            },
            interval: certs::CHECK_INTERVAL,
            clock: system_clock(),
        };
        let serving = external_metrics::server::run(
            client.clone(),
            listener,
            keeper,
            databases.clone(),
            job_queue_metrics.clone(),
            health.server("external-metrics"),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!(error = %e, "the external metrics API stopped");
            }
        });
    }

    // Metrics and health (every replica).
    let metrics_listener = TcpListener::bind(args.metrics_listen).await?;
    let metrics_app = metrics_router(
        AllMetrics {
            operator: metrics.clone(),
            job_queues: job_queue_metrics.clone(),
        },
        health.clone(),
    );
    tokio::spawn(serve(
        "metrics",
        metrics_listener,
        None,
        metrics_app,
        Limits::default(),
        health.server("metrics"),
        shutdown.clone().cancelled_owned(),
    ));

    // Leadership, then controllers on the leader only.
    let (leading_tx, leading) = watch::channel(!args.leader_election);
    let election = args.leader_election.then(|| {
        let settings = leader::LeaseSettings::new(&args.namespace, &args.lease_name, &identity);
        tokio::spawn(leader::run(
            client.clone(),
            settings,
            leading_tx,
            shutdown.clone().cancelled_owned(),
        ))
    });
    let reviewer_binding = args
        .queue_api_reviewer_binding
        .clone()
        .filter(|name| !name.is_empty());
    if reviewer_binding.is_some() && namespaces != Namespaces::All {
        warn!("--queue-api-reviewer-binding is ignored with --watch-namespaces");
    }
    let controllers = Controllers {
        reviewer_binding: reviewer_binding.filter(|_| namespaces == Namespaces::All),
        client: client.clone(),
        identity,
        metrics: metrics.clone(),
        signer,
        redis_budget: (args.max_endpoints_per_namespace, args.max_endpoints),
        concurrency: args.concurrent_reconciles,
        job_queues: job_queue::Settings {
            databases,
            metrics: job_queue_metrics,
            sidecar,
            namespace: args.namespace.clone(),
            external_metrics: args.external_metrics,
            namespaces: namespaces.clone(),
        },
    };
    supervise_controllers(controllers, leading, shutdown.clone()).await;
    // The election releases the Lease on shutdown: wait for it (briefly), or the process exits first and
    // the next operator (a rolling update's new pod) waits out the Lease's duration before it leads.
    if let Some(election) = election
        && tokio::time::timeout(LEASE_RELEASE_GRACE, election).await.is_err()
    {
        tracing::warn!("the Lease was not released in time; the next leader waits for it to expire");
    }
    let _ = webhook.await;
    Ok(())
}

/// How long a stopping operator waits for the election to hand its Lease back.
const LEASE_RELEASE_GRACE: Duration = Duration::from_secs(5);

/// What the leader runs the controllers with. Their contexts are made fresh at each term of leadership,
/// so a new leader starts with no stale memory of policies or queues.
pub struct Controllers {
    /// The client.
    pub client: Client,
    /// This replica's identity (Events' reporter instance).
    pub identity: String,
    /// Reconcile metrics (and the leader gauge), shared with `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Signs the configs the RateLimitPolicy controller publishes.
    pub signer: Arc<ConfigSigner>,
    /// Bounds on distinct Redis servers: per namespace, in all.
    pub redis_budget: (usize, usize),
    /// Most reconciles each controller runs at once.
    pub concurrency: u16,
    /// What the JobQueue controller is built from.
    pub job_queues: job_queue::Settings,
    /// The queue API reviewers' ClusterRoleBinding whose subjects follow the namespaces holding
    /// JobQueues; `None`: the chart binds them statically.
    pub reviewer_binding: Option<String>,
}

/// Run the controllers while `leading` is true; stop them (gracefully) when it turns false.
pub async fn supervise_controllers(
    controllers: Controllers,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let Controllers {
        client,
        identity,
        metrics,
        signer,
        redis_budget,
        concurrency,
        job_queues,
        reviewer_binding,
    } = controllers;
    loop {
        while !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => return,
            }
        }
        metrics.set_leader(true);
        info!("leading: starting controllers");
        let term = CancellationToken::new();
        let rlp = tokio::spawn(rate_limit_policy::run(
            context(
                &client,
                &metrics,
                &identity,
                concurrency,
                rate_limit_policy::State {
                    signer: Some(signer.clone()),
                    namespaces: job_queues.namespaces.clone(),
                    publisher: Publisher::with_budget(Budget::new(
                        redis_budget.0,
                        redis_budget.1,
                        budget::IDLE_DEFAULT,
                    )),
                    ..rate_limit_policy::State::default()
                },
            ),
            term.clone().cancelled_owned(),
        ));
        let (state, wakes) = job_queue::State::new(job_queues.clone(), term.clone());
        let jobs = tokio::spawn(job_queue::run(
            context(&client, &metrics, &identity, concurrency, state),
            wakes,
            term.clone().cancelled_owned(),
        ));
        let queue_databases = tokio::spawn(queue_database::run(
            context(
                &client,
                &metrics,
                &identity,
                concurrency,
                queue_database::State {
                    namespace: job_queues.namespace.clone(),
                },
            ),
            term.clone().cancelled_owned(),
        ));
        let reviewers = reviewer_binding.clone().map(|name| {
            tokio::spawn(reviewer_binding::run(
                client.clone(),
                name,
                term.clone().cancelled_owned(),
            ))
        });
        loop {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() || !*leading.borrow() { break },
                () = shutdown.cancelled() => break,
            }
        }
        term.cancel();
        let _ = rlp.await;
        let _ = jobs.await;
        let _ = queue_databases.await;
        if let Some(reviewers) = reviewers {
            let _ = reviewers.await;
        }
        metrics.set_leader(false);
        info!("stopped controllers");
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// A controller's context for this replica, on the real clock.
fn context<S>(
    client: &Client,
    metrics: &Arc<Metrics>,
    identity: &str,
    concurrency: u16,
    state: S,
) -> Arc<Context<S>> {
    Arc::new(
        Context::new(
            client.clone(),
            metrics.clone(),
            Some(identity.to_owned()),
            system_clock(),
            state,
        )
        .with_concurrency(concurrency),
    )
}
