//! The injection patch, as a pure function of the pod, its annotations, the policies in its namespace
//! and the operator's settings. No I/O: the server ([`super::server`]) resolves nothing itself.
//!
//! What injection does (docs/injection.md shows before/after specs):
//! - adds the `sluice-sidecar` container (native sidecar by default: an init container with
//!   `restartPolicy: Always`), its config volume, Redis URL from the policy's Secret, probes, resources
//!   and a locked-down security context;
//! - moves the app's *named* port to the sidecar, so Services that target the port by name reach the
//!   sidecar without edits, while the app keeps listening where it did;
//! - rewrites the app container's probes and lifecycle hooks that used that name to the number, so
//!   kubelet keeps reaching the app directly;
//! - labels the pod `sluice.dev/policy=<name>`, which is how the controller finds the pods it governs;
//! - with `sluice.dev/job-queues: a,b`, makes the sidecar serve the queue HTTP API for those JobQueues
//!   on `127.0.0.1:7070` (database URL by `secretKeyRef` to their Secret, never as text) and tells the
//!   app containers where (`SLUICE_QUEUE_API`). With no RateLimitPolicy for the pod, the sidecar only
//!   serves that API: no port takeover, rate limiting off, nothing listening beyond localhost but its
//!   health port. With the operator's `--queue-api-auth kubernetes` the API checks its callers: the app
//!   containers get a projected ServiceAccount token for the audience `sluice`
//!   (`SLUICE_QUEUE_API_TOKEN_FILE`), the sidecar the pod's API credentials, namespace and
//!   ServiceAccount name, and, in a host-network pod, no tokenless loopback callers.
//!
//! Invariants: a pod that already has the container is left alone (re-admission changes nothing), and
//! every check runs before anything is changed, so a pod is either injected completely or rejected.

#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::core::v1::{ConfigMapVolumeSource, Container, ContainerPort, EnvVar, Pod, PodSpec, Probe, Volume},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::core::{Selector, SelectorExt};
use sluice_crds::{
    contract::{
        SIDECAR_CONTAINER as SIDECAR_CONTAINER_NAME,
        env::{self, QUEUE_API as QUEUE_API_ENV},
        label::POLICY as POLICY_LABEL,
        path::{CONFIG_DIR as CONFIG_MOUNT_DIR, POLICY_CONFIG_FILE as CONFIG_KEY},
        port::{ADMIN as SIDECAR_ADMIN_PORT, LISTEN_DEFAULT as SIDECAR_LISTEN_PORT_DEFAULT, QUEUE_API},
        port_name,
        redis::{COUNTER_KEY_SECRET, COUNTER_KEY_SECRET_KEY},
    },
    job_queue::JobQueue,
    rate_limit_policy::{RateLimitPolicy, SecretKeyRef},
};

use super::annotations::{self, AnnotationError, InjectAnnotations, PortRef};
use crate::render::{
    caller_token::{self, KUBE_API_VOLUME, QUEUE_API_TOKEN_VOLUME},
    sidecar_config::config_map_name,
    sidecar_container::{QUEUE_API_LISTEN, SidecarContainer, SidecarSettings, http_probe, queue_api_env},
};

/// Name of the config volume added to injected pods.
pub const CONFIG_VOLUME: &str = "sluice-config";
/// Name given to the sidecar's listen port when the app port had no name to take over.
pub const LISTEN_PORT_NAME: &str = port_name::LISTEN;
/// Name of the sidecar's admin port (health, readiness, metrics).
pub const ADMIN_PORT_NAME: &str = port_name::ADMIN;
/// The port name fronted when no `sluice.dev/app-port` annotation says otherwise.
pub const APP_PORT_NAME_DEFAULT: &str = "http";
/// The operator's injection settings (flags `--sidecar-*`).
#[derive(Clone, Debug, PartialEq)]
pub struct InjectConfig {
    /// Image, pull policy and resources of the sidecar container.
    pub sidecar: SidecarSettings,
    /// Inject a native sidecar (init container with `restartPolicy: Always`) unless the pod says
    /// otherwise; `false` for clusters older than 1.29.
    pub native: bool,
    /// The operator's config-signing public key (hex), given to each rate-limiting sidecar as
    /// `SLUICE_CONFIG_VERIFY_KEY` so it applies only configs from Redis the operator signed.
    pub config_verify_key: Option<String>,
    /// The queue API checks its callers (`--queue-api-auth kubernetes`): each app container gets a token
    /// for it, the sidecar what it needs to review them.
    pub queue_api_auth: bool,
}

/// The policy a pod is governed by, as far as injection needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyTarget {
    /// Name of the `RateLimitPolicy` (in the pod's namespace).
    pub name: String,
    /// Where the Redis URL is.
    pub redis_secret: SecretKeyRef,
}

/// The JobQueues a pod enqueues to, as far as injection needs to know. One sidecar serves the queue
/// API of one database, so they all share one `spec.database.secretRef`.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueTarget {
    /// The JobQueues' names, as the annotation gives them.
    pub job_queues: Vec<String>,
    /// The sidecar's env for the queue API: the database URL by `secretKeyRef`, the queue names
    /// (`SLUICE_QUEUES`), and `SLUICE_API_LISTEN`.
    pub env: Vec<EnvVar>,
}

/// Why a pod cannot be injected. The message is what `kubectl` shows the user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// An annotation value is malformed.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    /// The annotations are well-formed but do not fit the pod or the namespace.
    #[error("annotation {annotation}: {message}")]
    Mismatch {
        /// The annotation to change.
        annotation: &'static str,
        /// What does not fit.
        message: String,
    },
}

fn mismatch(annotation: &'static str, message: impl Into<String>) -> InjectError {
    InjectError::Mismatch {
        annotation,
        message: message.into(),
    }
}

/// Whether the pod already has the sidecar (in `containers` or `initContainers`).
pub fn already_injected(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == SIDECAR_CONTAINER_NAME)
    })
}

/// Decide what to do with a pod at admission: `Ok(None)` leaves it as it is, `Ok(Some(pod))` is the
/// injected pod, `Err` rejects it. `policies` and `job_queues` are those in the pod's namespace.
pub fn admit(
    pod: &Pod,
    policies: &[Arc<RateLimitPolicy>],
    job_queues: &[Arc<JobQueue>],
    config: &InjectConfig,
) -> Result<Option<Pod>, InjectError> {
    let empty = BTreeMap::new();
    let ann = InjectAnnotations::parse(pod.metadata.annotations.as_ref().unwrap_or(&empty))?;
    if !ann.inject || already_injected(pod) {
        return Ok(None);
    }
    let queues = resolve_job_queues(pod, &ann, job_queues)?;
    // A pod that only enqueues needs no policy; one that names a policy, or that a policy selects,
    // gets rate limiting as well.
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let queue_only = queues.is_some() && ann.policy.is_none() && !policies.iter().any(|p| selects(p, labels));
    let target = if queue_only {
        None
    } else {
        Some(resolve_policy(pod, &ann, policies)?)
    };
    inject(pod, &ann, target.as_ref(), queues.as_ref(), config).map(Some)
}

/// The JobQueues `sluice.dev/job-queues` names, all of which must exist in the pod's namespace and use
/// one database. `Ok(None)` when the pod names none.
pub fn resolve_job_queues(
    pod: &Pod,
    ann: &InjectAnnotations,
    job_queues: &[Arc<JobQueue>],
) -> Result<Option<QueueTarget>, InjectError> {
    let Some(first_name) = ann.job_queues.first() else {
        return Ok(None);
    };
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut found: Vec<&JobQueue> = vec![];
    for name in &ann.job_queues {
        let jq = job_queues
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(name.as_str()))
            .ok_or_else(|| {
                mismatch(
                    annotations::JOB_QUEUES,
                    format!(
                        "JobQueue {name:?} does not exist in namespace {ns:?}; create it first \
                         (controllers retry creating the pod)"
                    ),
                )
            })?;
        found.push(jq);
    }
    let first = found[0];
    // The Secret the sidecar would read: the tenant Secret, or the JobQueue's own with row-level
    // security disabled.
    let secret = |q: &JobQueue| {
        let r = crate::tenant::workers_secret(q);
        (r.name, r.key)
    };
    if let Some((other_name, other)) = ann
        .job_queues
        .iter()
        .zip(&found)
        .find(|(_, q)| secret(q) != secret(first))
    {
        let ((a_secret, a_key), (b_secret, b_key)) = (secret(first), secret(other));
        return Err(mismatch(
            annotations::JOB_QUEUES,
            format!(
                "JobQueues {first_name:?} (Secret {a_secret}, key {a_key}) and {other_name:?} (Secret \
                 {b_secret}, key {b_key}) use different database Secrets; one sidecar serves the queue \
                 API of one database: name only JobQueues that share spec.database.secretRef (or \
                 spec.database.queueDatabaseRef) and spec.database.rowLevelSecurity"
            ),
        ));
    }
    let mut env = queue_api_env(first);
    let names: Vec<String> = found.iter().map(|q| q.database_queue_name()).collect();
    for var in &mut env {
        if var.name == env::QUEUES {
            var.value = Some(names.join(","));
        }
    }
    // Callers are authorized on the JobQueue; say which one a queue with another name is (by its name
    // within the namespace, as the API's paths and its authorization name queues).
    let short: Vec<String> = found.iter().map(|q| q.queue_name()).collect();
    let renamed: Vec<String> = ann
        .job_queues
        .iter()
        .zip(&short)
        .filter(|(jq, queue)| jq != queue)
        .map(|(jq, queue)| format!("{queue}={jq}"))
        .collect();
    if !renamed.is_empty() {
        env.push(EnvVar {
            name: env::API_JOB_QUEUES.into(),
            value: Some(renamed.join(",")),
            ..EnvVar::default()
        });
    }
    Ok(Some(QueueTarget {
        job_queues: ann.job_queues.clone(),
        env,
    }))
}

fn selects(policy: &RateLimitPolicy, labels: &BTreeMap<String, String>) -> bool {
    policy
        .spec
        .selector
        .clone()
        .and_then(|s| Selector::try_from(s).ok())
        .is_some_and(|s| s.matches(labels))
}

/// The policy governing `pod`: the one its annotation names, else the one whose selector matches.
pub fn resolve_policy(
    pod: &Pod,
    ann: &InjectAnnotations,
    policies: &[Arc<RateLimitPolicy>],
) -> Result<PolicyTarget, InjectError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let target = |p: &RateLimitPolicy| PolicyTarget {
        name: p.metadata.name.clone().unwrap_or_default(),
        redis_secret: p.spec.redis.secret_ref.clone(),
    };
    if let Some(name) = &ann.policy {
        return policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .map(|p| target(p))
            .ok_or_else(|| {
                mismatch(
                    annotations::POLICY,
                    format!(
                        "RateLimitPolicy {name:?} does not exist in namespace {ns:?}; create it first \
                         (controllers retry creating the pod)"
                    ),
                )
            });
    }
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let selecting: Vec<&RateLimitPolicy> = policies
        .iter()
        .filter(|p| selects(p, labels))
        .map(|p| p.as_ref())
        .collect();
    match selecting.as_slice() {
        [one] => Ok(target(one)),
        [] => Err(mismatch(
            annotations::POLICY,
            format!(
                "absent, and no RateLimitPolicy in namespace {ns:?} selects this pod's labels: name the \
                 policy in the annotation or give a policy a matching spec.selector"
            ),
        )),
        many => Err(mismatch(
            annotations::POLICY,
            format!(
                "absent, and RateLimitPolicies {} all select this pod: name one in the annotation",
                many.iter()
                    .map(|p| format!("{:?}", p.metadata.name.as_deref().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// The pod with the sidecar injected: rate limiting for `target` (when there is one) and the queue API
/// for `queues` (when asked for). At least one of the two is given.
pub fn inject(
    pod: &Pod,
    ann: &InjectAnnotations,
    target: Option<&PolicyTarget>,
    queues: Option<&QueueTarget>,
    config: &InjectConfig,
) -> Result<Pod, InjectError> {
    let mut pod = pod.clone();
    let spec = pod.spec.get_or_insert_with(Default::default);
    let listen = ann.listen_port.unwrap_or(SIDECAR_LISTEN_PORT_DEFAULT);

    if let Some(q) = queues {
        let api_port = i32::from(QUEUE_API);
        let taken = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .any(|p| p.container_port == api_port);
        if taken {
            return Err(mismatch(
                annotations::JOB_QUEUES,
                format!(
                    "port {api_port} is used by a container of this pod, and the sidecar serves the queue \
                     API of {:?} there",
                    q.job_queues
                ),
            ));
        }
        if config.queue_api_auth
            && let Some(v) = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == QUEUE_API_TOKEN_VOLUME || v.name == KUBE_API_VOLUME)
        {
            return Err(mismatch(
                annotations::JOB_QUEUES,
                format!(
                    "the pod already has a volume named {:?}, which the sidecar needs",
                    v.name
                ),
            ));
        }
    }
    let Some(target) = target else {
        let Some(q) = queues else {
            return Err(mismatch(
                annotations::INJECT,
                "nothing to inject: no policy and no JobQueue",
            ));
        };
        return Ok(inject_queue_only(pod, ann, q, config));
    };

    // --- checks first: nothing below may fail once the pod is being changed ---
    let app = find_app_port(&spec.containers, ann.app_port.as_ref())?;
    let all_ports = || {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
    };
    if listen == app.number || all_ports().any(|p| p.container_port == i32::from(listen)) {
        return Err(mismatch(
            annotations::LISTEN_PORT,
            format!("port {listen} is already used by a container of this pod: choose a free port"),
        ));
    }
    if listen == SIDECAR_ADMIN_PORT
        || app.number == SIDECAR_ADMIN_PORT
        || all_ports().any(|p| p.container_port == i32::from(SIDECAR_ADMIN_PORT))
    {
        return Err(mismatch(
            annotations::LISTEN_PORT,
            format!("port {SIDECAR_ADMIN_PORT} is reserved for the sidecar's health and metrics endpoints"),
        ));
    }
    let listen_name = app.name.clone().unwrap_or_else(|| LISTEN_PORT_NAME.to_owned());
    for reserved in [LISTEN_PORT_NAME, ADMIN_PORT_NAME] {
        let taken_elsewhere = all_ports().any(|p| p.name.as_deref() == Some(reserved));
        if taken_elsewhere && app.name.as_deref() != Some(reserved) {
            return Err(mismatch(
                annotations::APP_PORT,
                format!("the pod already has a port named {reserved:?}, which the sidecar needs"),
            ));
        }
    }
    if spec.volumes.iter().flatten().any(|v| v.name == CONFIG_VOLUME) {
        return Err(mismatch(
            annotations::INJECT,
            format!("the pod already has a volume named {CONFIG_VOLUME:?}, which the sidecar needs"),
        ));
    }

    // --- the app keeps its port number; its name moves to the sidecar ---
    if let (Some(name), Some(index)) = (&app.name, app.container) {
        let container = &mut spec.containers[index];
        for port in container.ports.iter_mut().flatten() {
            if port.name.as_deref() == Some(name) {
                port.name = None;
            }
        }
        rewrite_named_probes(container, name, app.number);
    }

    let mut sidecar = proxy_container(target, config, listen, &listen_name, app.number);
    if let Some(q) = queues {
        sidecar = q.env.iter().cloned().fold(sidecar, SidecarContainer::env_var);
        tell_apps_where_the_queue_api_is(&mut spec.containers);
    }
    add_sidecar(spec, sidecar, ann.native_sidecar.unwrap_or(config.native));
    if queues.is_some() && config.queue_api_auth {
        check_queue_api_callers(spec);
    }
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(&target.name),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POLICY_LABEL.into(), target.name.clone());
    Ok(pod)
}

/// A sidecar that only serves the queue API: no config file (rate limiting off by
/// `RATE_LIMIT__ENABLED=false`), its proxy port on localhost only, the app's ports untouched.
fn inject_queue_only(
    mut pod: Pod,
    ann: &InjectAnnotations,
    queues: &QueueTarget,
    config: &InjectConfig,
) -> Pod {
    let spec = pod.spec.get_or_insert_with(Default::default);
    let listen = ann.listen_port.unwrap_or(SIDECAR_LISTEN_PORT_DEFAULT);
    let sidecar = injected(config)
        .pod_name_env()
        .env(env::LISTEN, format!("127.0.0.1:{listen}"))
        .env(env::RATE_LIMIT_ENABLED, "false");
    let sidecar = queues
        .env
        .iter()
        .cloned()
        .fold(sidecar, SidecarContainer::env_var)
        .port(ADMIN_PORT_NAME, SIDECAR_ADMIN_PORT);
    tell_apps_where_the_queue_api_is(&mut spec.containers);
    add_sidecar(spec, sidecar, ann.native_sidecar.unwrap_or(config.native));
    if config.queue_api_auth {
        check_queue_api_callers(spec);
    }
    pod
}

/// Makes the queue API check its callers (docs/queue.md, "Who may call the API"): every app container
/// gets a projected ServiceAccount token for the audience `sluice` at [`QUEUE_API_TOKEN_PATH`]
/// (`SLUICE_QUEUE_API_TOKEN_FILE`); the sidecar gets the pod's API credentials at [`KUBE_API_DIR`], its
/// namespace and ServiceAccount name, and `SLUICE_API_AUTH=kubernetes`; in a host-network pod, whose
/// loopback is the node's, every caller needs a token (`SLUICE_API_AUTH_LOOPBACK=token`).
fn check_queue_api_callers(spec: &mut PodSpec) {
    let host_network = spec.host_network == Some(true);
    if let Some(sidecar) = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .find(|c| c.name == SIDECAR_CONTAINER_NAME)
    {
        caller_token::let_sidecar_check_callers(sidecar, host_network);
    }
    for c in spec
        .containers
        .iter_mut()
        .filter(|c| c.name != SIDECAR_CONTAINER_NAME)
    {
        caller_token::give_caller_a_token(c);
    }
    spec.volumes
        .get_or_insert_with(Vec::new)
        .extend(caller_token::volumes());
}

/// `SLUICE_QUEUE_API=http://127.0.0.1:7070` in every app container that does not set it already.
fn tell_apps_where_the_queue_api_is(containers: &mut [Container]) {
    for c in containers {
        let env = c.env.get_or_insert_with(Vec::new);
        if !env.iter().any(|e| e.name == QUEUE_API_ENV) {
            env.push(EnvVar {
                name: QUEUE_API_ENV.into(),
                value: Some(format!("http://{QUEUE_API_LISTEN}")),
                ..EnvVar::default()
            });
        }
    }
}

/// Adds the sidecar: a native sidecar (init container, `restartPolicy: Always`) or a plain container.
fn add_sidecar(spec: &mut PodSpec, sidecar: SidecarContainer, native: bool) {
    let mut sidecar = sidecar.build();
    if native {
        sidecar.restart_policy = Some("Always".into());
        // A native sidecar's startup probe holds back the app containers until the config is loaded.
        sidecar.startup_probe = Some(admin_probe("/readyz", 1, 120));
        spec.init_containers.get_or_insert_with(Vec::new).push(sidecar);
    } else {
        spec.containers.push(sidecar);
    }
}

/// The JSON patch that turns `original` into `injected`.
pub fn patch(original: &Pod, injected: &Pod) -> json_patch::Patch {
    // Pods are plain data: serialising them cannot fail.
    let from = serde_json::to_value(original).expect("pod serialises");
    let to = serde_json::to_value(injected).expect("pod serialises");
    json_patch::diff(&from, &to)
}

/// The port the sidecar fronts.
#[derive(Debug)]
struct AppPort {
    /// Index of the container declaring it, if any does.
    container: Option<usize>,
    /// Its name, which moves to the sidecar.
    name: Option<String>,
    /// Its number, which the app keeps listening on.
    number: u16,
}

fn find_app_port(containers: &[Container], wanted: Option<&PortRef>) -> Result<AppPort, InjectError> {
    let declared = || {
        containers
            .iter()
            .enumerate()
            .flat_map(|(i, c)| c.ports.iter().flatten().map(move |p| (i, p)))
    };
    let found = |(i, p): (usize, &ContainerPort)| AppPort {
        container: Some(i),
        name: p.name.clone(),
        number: u16::try_from(p.container_port).unwrap_or_default(),
    };
    match wanted {
        Some(PortRef::Name(name)) => declared()
            .find(|(_, p)| p.name.as_deref() == Some(name))
            .map(found)
            .ok_or_else(|| {
                mismatch(
                    annotations::APP_PORT,
                    format!("no container of this pod has a port named {name:?}"),
                )
            }),
        Some(PortRef::Number(n)) => Ok(declared()
            .find(|(_, p)| p.container_port == i32::from(*n))
            .map(found)
            // The app may listen on a port it does not declare: front it all the same.
            .unwrap_or(AppPort {
                container: None,
                name: None,
                number: *n,
            })),
        None => {
            if let Some(http) = declared().find(|(_, p)| p.name.as_deref() == Some(APP_PORT_NAME_DEFAULT)) {
                return Ok(found(http));
            }
            let tcp: Vec<_> = declared()
                .filter(|(_, p)| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
                .collect();
            match tcp.as_slice() {
                [only] => Ok(found(*only)),
                [] => Err(mismatch(
                    annotations::APP_PORT,
                    "absent, and no container declares a port: name the port the app serves HTTP on",
                )),
                _ => Err(mismatch(
                    annotations::APP_PORT,
                    "absent, and the pod declares several ports and none is named \"http\": name the port \
                     the app serves HTTP on",
                )),
            }
        }
    }
}

/// Point the container's probes and lifecycle hooks that use port `name` at `number` instead, because
/// the name now belongs to the sidecar and kubelet must keep reaching the app directly.
fn rewrite_named_probes(container: &mut Container, name: &str, number: u16) {
    let fix = |port: &mut IntOrString| {
        if matches!(port, IntOrString::String(s) if s == name) {
            *port = IntOrString::Int(i32::from(number));
        }
    };
    let probes = [
        container.liveness_probe.as_mut(),
        container.readiness_probe.as_mut(),
        container.startup_probe.as_mut(),
    ];
    for probe in probes.into_iter().flatten() {
        if let Some(h) = probe.http_get.as_mut() {
            fix(&mut h.port);
        }
        if let Some(t) = probe.tcp_socket.as_mut() {
            fix(&mut t.port);
        }
    }
    if let Some(lifecycle) = container.lifecycle.as_mut() {
        for hook in [lifecycle.post_start.as_mut(), lifecycle.pre_stop.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(h) = hook.http_get.as_mut() {
                fix(&mut h.port);
            }
            if let Some(t) = hook.tcp_socket.as_mut() {
                fix(&mut t.port);
            }
        }
    }
}

/// A probe of the sidecar's admin port, with a one-second timeout.
fn admin_probe(path: &str, period: i32, failure_threshold: i32) -> Probe {
    http_probe(path, SIDECAR_ADMIN_PORT, period, Some(failure_threshold))
}

/// What every injected sidecar has beyond the common container: readiness and liveness on its admin
/// port.
fn injected(config: &InjectConfig) -> SidecarContainer {
    SidecarContainer::new(&config.sidecar)
        .readiness(admin_probe("/readyz", 2, 3))
        .liveness(admin_probe("/healthz", 10, 3))
}

/// The proxy role: reads the policy's rendered config from the mounted ConfigMap, listens on `listen`
/// (taking the app port's name), forwards to the app on `app_port`, and reaches Redis with the URL from
/// the policy's Secret, naming counters with the namespace's counter key (a Secret the policy's
/// reconcile writes). A pod admitted before it exists waits for it (as for any missing Secret) rather
/// than start counting apart from its keyed peers; where the operator may not write it, the policy's
/// status says so and what to do.
fn proxy_container(
    target: &PolicyTarget,
    config: &InjectConfig,
    listen: u16,
    listen_name: &str,
    app_port: u16,
) -> SidecarContainer {
    let sidecar = injected(config)
        .args(["--config".to_owned(), format!("{CONFIG_MOUNT_DIR}/{CONFIG_KEY}")])
        .pod_name_env()
        .env(env::LISTEN, format!("0.0.0.0:{listen}"))
        .env(env::UPSTREAM, format!("http://127.0.0.1:{app_port}"))
        .env_from_secret(env::REDIS_URL, &target.redis_secret)
        .env_from_secret(
            env::COUNTER_KEY,
            &SecretKeyRef {
                name: COUNTER_KEY_SECRET.into(),
                key: COUNTER_KEY_SECRET_KEY.into(),
            },
        );
    let sidecar = match &config.config_verify_key {
        Some(key) => sidecar.env(env::CONFIG_VERIFY_KEY, key.clone()),
        None => sidecar,
    };
    sidecar
        .port(listen_name, listen)
        .port(ADMIN_PORT_NAME, SIDECAR_ADMIN_PORT)
        .config_mount(CONFIG_VOLUME)
}
