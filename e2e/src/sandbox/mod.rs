//! The local sandbox (`make sandbox`): Sluice on this machine without a cluster, with a short scripted
//! demo of both CRDs and a live view.
//!
//! It starts a throwaway `redis-server` and PostgreSQL (when their binaries are installed), installs
//! Sluice from the real chart on the in-memory API server ([`crate::system`]: the real operator binary,
//! the kubelet/Deployment/HPA/Service stand-ins), applies `examples/sandbox/`, sends steady traffic to
//! the rate-limited `web` pods, enqueues jobs for the `thumbnails` queue, and prints one line a second:
//! requests allowed/limited, queue depth and worker replicas. Along the way it raises the limit with
//! kubectl, stops and restarts Redis, and enqueues a second wave, printing what it does. It runs until
//! Ctrl-C (or `--duration`), then stops every process it started and removes every temp dir, except
//! PostgreSQL's `initdb` template (`$TMPDIR/sluice-pg-template-<version>`, a cache the tests share).
//!
//! Layout: [`traffic`] (the client load), [`progress`] (the live view).

pub mod progress;
pub mod traffic;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;
use sluice_testsupport::{PgServer, RedisServer};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::system::{SluiceSystem, SystemOptions};
use crate::wait_for;
use progress::{QueueSample, Sample};

/// The namespace the examples go to.
pub const NAMESPACE: &str = "demo";
/// Requests per second sent to the `web` pods.
pub const TRAFFIC_PER_SECOND: u32 = 50;
/// The limit in `examples/sandbox/web.yaml`, and what the demo raises it to.
pub const LIMIT: u64 = 20;
/// The raised limit.
pub const RAISED_LIMIT: u64 = 30;
/// Jobs in each enqueued wave.
pub const WAVE: usize = 2_000;
/// How long the examples may take to come up.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// What happens when, in seconds since the demo started.
/// Longest wait for one read of the per-second line.
const SAMPLE_DEADLINE: Duration = Duration::from_secs(5);

const SCRIPT: &[(u64, Step)] = &[
    (3, Step::Enqueue),
    (12, Step::RaiseLimit),
    (20, Step::StopRedis),
    (27, Step::StartRedis),
    (35, Step::Enqueue),
];

#[derive(Clone, Copy, Debug)]
enum Step {
    Enqueue,
    RaiseLimit,
    StopRedis,
    StartRedis,
}

/// How to run.
#[derive(Clone, Debug)]
pub struct SandboxOptions {
    /// Stop after this long of demo (after everything is up); `None`: until interrupted.
    pub duration: Option<Duration>,
    /// The demo app binary.
    pub demo_app: PathBuf,
    /// `examples/sandbox`.
    pub examples: PathBuf,
    /// Run on a real control plane (etcd, kube-apiserver, kube-controller-manager; the chart installed
    /// with `helm install`) instead of the in-memory API server.
    pub real_control_plane: bool,
}

/// Runs the sandbox until `interrupt` resolves or the duration is over, then stops everything.
pub async fn run(options: SandboxOptions, interrupt: impl std::future::Future<Output = ()>) -> Result<()> {
    tokio::pin!(interrupt);
    println!("Sluice sandbox: the real operator and sidecars on this machine, no cluster needed.");
    let mut redis = if on_path("redis-server") {
        let r = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .map_err(|e| Error::Config(format!("redis-server did not start: {e}")))?;
        println!("  Redis        {} (throwaway)", r.url());
        Some(r)
    } else {
        println!(
            "  Redis        not found: sidecars limit in memory, each pod on its own share (limit ÷ \
             expectedReplicas).\n               Install redis-server for cluster-wide limits."
        );
        None
    };
    let pg = if postgres_available() {
        match tokio::task::spawn_blocking(PgServer::start).await {
            Ok(pg) => {
                println!("  PostgreSQL   {} (throwaway)", pg.url());
                Some(Arc::new(pg))
            }
            Err(_) => {
                println!("  PostgreSQL   did not start: the queue demo is off.");
                None
            }
        }
    } else {
        println!(
            "  PostgreSQL   not found: the queue demo is off. Install postgresql to see JobQueues scale."
        );
        None
    };
    let mut system_options = SystemOptions::new(&options.demo_app);
    if options.real_control_plane {
        println!(
            "  Installing   charts/sluice with helm install on a real control plane (etcd, kube-apiserver, \
             kube-controller-manager), operator starting..."
        );
        system_options = system_options.real();
    } else {
        println!(
            "  Installing   charts/sluice with kubectl on an in-memory API server, operator starting..."
        );
    }
    let install = SluiceSystem::install(system_options);
    let system = tokio::select! {
        s = install => s?,
        _ = &mut interrupt => { println!("Interrupted."); return Ok(()) }
    };
    let outcome = demo(&system, &options, &mut redis, pg.clone(), &mut interrupt).await;
    println!("Stopping: pods' processes, the operator, Redis and PostgreSQL...");
    system.shutdown().await;
    drop(pg);
    drop(redis);
    outcome?;
    println!("Stopped. Nothing left running; temp dirs removed.");
    Ok(())
}

async fn demo(
    system: &SluiceSystem,
    options: &SandboxOptions,
    redis: &mut Option<RedisServer>,
    pg: Option<Arc<PgServer>>,
    interrupt: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<()> {
    let kubeconfig = system.kubeconfig_path().display().to_string();
    let ns_yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n");
    system.kubectl_ok(&["apply", "-f", "-"], Some(&ns_yaml)).await?;
    // The operator reads the Redis and database Secrets there (enforced on a real control plane).
    system.grant_secret_access(NAMESPACE).await?;
    let redis_url = redis
        .as_ref()
        .map(RedisServer::url)
        // Nothing listens on port 1: the sidecars' breaker stays open and they limit locally.
        .unwrap_or_else(|| "redis://127.0.0.1:1".into());
    let mut secrets = secret("redis", &redis_url);
    if let Some(pg) = &pg {
        secrets.push_str("---\n");
        secrets.push_str(&secret("db", &pg.url()));
    }
    system
        .kubectl_ok(&["apply", "-n", NAMESPACE, "-f", "-"], Some(&secrets))
        .await?;
    let mut files = vec!["web.yaml"];
    if pg.is_some() {
        files.extend(["thumbnails.yaml", "shop.yaml"]);
    }
    for file in &files {
        let path = options.examples.join(file).display().to_string();
        // A pod naming a JobQueue is refused until the webhook's cache has seen the queue (a few
        // milliseconds after it is created): retry as a ReplicaSet would.
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            match system
                .kubectl_ok(&["apply", "-n", NAMESPACE, "-f", &path], None)
                .await
            {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        println!("  Applied      {}", Path::new(&path).display());
    }
    wait_ready(system, "app=web", 2).await?;
    let api_port = match &pg {
        Some(_) => {
            wait_ready(system, "app=shop", 1).await?;
            system.kubelet().port(NAMESPACE, "shop", "7070")
        }
        None => None,
    };

    println!();
    println!("Sluice is running. In another terminal:");
    println!("  export KUBECONFIG={kubeconfig}");
    println!("  kubectl get ratelimitpolicies,jobqueues,deployments,hpa -n {NAMESPACE}");
    println!(
        "Demo: {TRAFFIC_PER_SECOND} requests/s to the 2 `web` pods (policy `web`: {LIMIT}/s per client); \
         jobs for queue `thumbnails`. Ctrl-C stops everything."
    );
    println!();
    println!("{}", progress::header());

    let counters = Arc::new(traffic::Counters::default());
    let (stop, _) = watch::channel(false);
    let mut stopped = stop.subscribe();
    let load = tokio::spawn(traffic::run(
        system.env().client(),
        system.kubelet().clone(),
        NAMESPACE.into(),
        "app=web".into(),
        TRAFFIC_PER_SECOND,
        counters.clone(),
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
    ));

    let started = Instant::now();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut last = counters.snapshot();
    let mut limit = LIMIT;
    let mut step = 0;
    let mut baseline_done = 0u64;
    let outcome = loop {
        tokio::select! {
            _ = &mut *interrupt => { println!("Interrupted."); break Ok(()) }
            _ = tick.tick() => {}
        }
        let second = started.elapsed().as_secs();
        let now = counters.snapshot();
        let queue = match &pg {
            Some(pg) => match queue_sample(system, pg.clone()).await {
                Ok(sample) => sample,
                Err(slow) => {
                    println!("      ▸ {slow}");
                    None
                }
            },
            None => None,
        };
        let sample = Sample {
            second,
            allowed: now.0 - last.0,
            limited: now.1 - last.1,
            errors: now.2 - last.2,
            limit,
            redis_up: redis.as_ref().map(|r| r.pid().is_some()),
            queue: queue.map(|mut q| {
                if second <= 1 {
                    baseline_done = q.succeeded;
                }
                q.succeeded -= baseline_done.min(q.succeeded);
                q
            }),
        };
        last = now;
        println!("{}", progress::line(&sample));
        while step < SCRIPT.len() && SCRIPT[step].0 <= second {
            let result = match SCRIPT[step].1 {
                Step::Enqueue => match api_port {
                    Some(port) => enqueue(port, WAVE).await.map(|()| {
                        format!("enqueued {WAVE} jobs through the shop pod's sidecar (POST /v1/queues/thumbnails/jobs/batch)")
                    }),
                    None => Ok(String::new()),
                },
                Step::RaiseLimit => {
                    let patch = json!([{"op": "replace", "path": "/spec/rules/0/limit/requests", "value": RAISED_LIMIT}]).to_string();
                    system
                        .kubectl_ok(&["patch", "ratelimitpolicies.sluice.dev", "web", "-n", NAMESPACE, "--type", "json", "-p", &patch], None)
                        .await
                        .map(|_| {
                            limit = RAISED_LIMIT;
                            format!("kubectl patch: limit raised to {RAISED_LIMIT}/s; the sidecars pick it up in about a second")
                        })
                }
                Step::StopRedis => match redis.as_mut() {
                    Some(r) => {
                        r.kill();
                        Ok("Redis stopped: failureMode local, each pod allows its share (limit ÷ 2) on its own".into())
                    }
                    None => Ok(String::new()),
                },
                Step::StartRedis => match redis.as_mut() {
                    Some(r) => {
                        // Same port, so the sidecars' Secret still points at it; it starts empty.
                        tokio::task::block_in_place(|| r.restart());
                        Ok("Redis back (empty): limits are cluster-wide again within about half a second".into())
                    }
                    None => Ok(String::new()),
                },
            };
            match result {
                Ok(msg) if !msg.is_empty() => println!("      ▸ {msg}"),
                Ok(_) => {}
                Err(e) => println!("      ▸ step failed: {e}"),
            }
            step += 1;
        }
        if options.duration.is_some_and(|d| started.elapsed() >= d) {
            break Ok(());
        }
    };
    let _ = stop.send(true);
    let _ = load.await;
    outcome
}

fn secret(name: &str, url: &str) -> String {
    crate::system::secret_yaml(name, "url", url)
}

/// Waits for `count` Ready pods with these labels in the demo namespace.
async fn wait_ready(system: &SluiceSystem, labels: &str, count: usize) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(system.env().client(), NAMESPACE);
    wait_for(&format!("{count} pods {labels} Ready"), READY_DEADLINE, || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(labels)).await.ok()?;
            (list
                .items
                .iter()
                .filter(|p| crate::deployments::is_ready(p))
                .count()
                >= count)
                .then_some(())
        }
    })
    .await
}

async fn enqueue(port: u16, jobs: usize) -> Result<()> {
    const BATCH: usize = 500;
    for start in (0..jobs).step_by(BATCH) {
        let batch: Vec<_> = (start..(start + BATCH).min(jobs))
            .map(|i| json!({"kind": "thumbnail", "payload": {"image": i, "sleepMs": 50}}))
            .collect();
        let reply = crate::http::post_json(
            port,
            "/v1/queues/thumbnails/jobs/batch",
            &json!({"jobs": batch}).to_string(),
        )
        .await?;
        if reply.status != 201 {
            return Err(Error::Config(format!(
                "enqueue: {} {}",
                reply.status,
                reply.body.trim()
            )));
        }
    }
    Ok(())
}

/// The queue's line of a second: job counts from PostgreSQL, workers from the API server. `Err` names a
/// read that did not answer within [`SAMPLE_DEADLINE`], so a stuck dependency shows on the screen instead
/// of freezing it.
async fn queue_sample(
    system: &SluiceSystem,
    pg: Arc<PgServer>,
) -> std::result::Result<Option<QueueSample>, String> {
    let counts = tokio::task::spawn_blocking(move || {
        pg.psql(
            "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'running'), \
             count(*) FILTER (WHERE state = 'succeeded') FROM sluice.jobs WHERE queue = 'demo/thumbnails'",
        )
    });
    let counts = match tokio::time::timeout(SAMPLE_DEADLINE, counts).await {
        Ok(Ok(counts)) => counts,
        Ok(Err(_)) => return Ok(None),
        Err(_) => {
            return Err(format!(
                "slow: PostgreSQL did not answer the job counts within {SAMPLE_DEADLINE:?}"
            ));
        }
    };
    let mut parts = counts.trim().split('|').map(|p| p.parse::<u64>().unwrap_or(0));
    let deployments: Api<Deployment> = Api::namespaced(system.env().client(), NAMESPACE);
    let d = match tokio::time::timeout(SAMPLE_DEADLINE, deployments.get_opt("thumbnails-worker")).await {
        Ok(d) => d.ok().flatten(),
        Err(_) => {
            return Err(format!(
                "slow: the API server did not answer a Deployment read within {SAMPLE_DEADLINE:?}"
            ));
        }
    };
    Ok(Some(QueueSample {
        ready: parts.next().unwrap_or(0),
        running: parts.next().unwrap_or(0),
        succeeded: parts.next().unwrap_or(0),
        replicas: d.as_ref().and_then(|d| d.spec.as_ref()?.replicas).unwrap_or(0),
        ready_replicas: d.and_then(|d| d.status?.ready_replicas).unwrap_or(0),
    }))
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(binary).is_file()))
}

fn postgres_available() -> bool {
    on_path("postgres")
        || std::fs::read_dir("/usr/lib/postgresql")
            .map(|versions| {
                versions
                    .flatten()
                    .any(|v| v.path().join("bin/postgres").is_file())
            })
            .unwrap_or(false)
}
