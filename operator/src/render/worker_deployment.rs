//! A `JobQueue` rendered into its worker: the sidecar's `worker.yaml` (in a ConfigMap) and the worker
//! Deployment (the team's handler container plus `sluice-sidecar worker`). Pure: no I/O.
//!
//! Invariants the tests hold:
//! - the database URL reaches pods only through `secretKeyRef`, never as text in the pod spec or the
//!   ConfigMap;
//! - `terminationGracePeriodSeconds` exceeds the job timeout, and the worker's shutdown grace equals it,
//!   so a scale-in lets a running job finish instead of killing it;
//! - the sidecar runs non-root, read-only, without privilege escalation and with every capability
//!   dropped;
//! - a config change changes the pod template (a hash annotation), so workers roll onto it;
//! - with the queue APIs checking callers, a `protocol: grpc` worker's sidecar checks its gRPC workers
//!   too, and the handler container has a projected token (audience `sluice`) to send.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{ConfigMap, ConfigMapVolumeSource, Container, EnvVar, PodSpec, Volume},
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{Resource, ResourceExt, api::ObjectMeta};
use sluice_crds::{
    job_queue::{DatabaseSource, HandlerProtocol, JobQueue, JobQueueSchedule, RowLevelSecurity},
    sidecar_config::{
        CONFIG_VERSION, GrpcConfig, HandlerConfig, QueueApiConfig, QueueConfig, ScheduleSpec, SidecarConfig,
        WorkerConfig,
    },
};

use sluice_crds::contract::{
    SIDECAR_CONTAINER as SIDECAR_CONTAINER_NAME,
    annotation::CONFIG_HASH as CONFIG_HASH_ANNOTATION,
    env,
    label::{JOB_QUEUE as JOB_QUEUE_LABEL, MANAGED_BY},
    path::{CONFIG_DIR as WORKER_CONFIG_DIR, WORKER_CONFIG_FILE as WORKER_CONFIG_KEY},
    port::{self, WORKER_METRICS as WORKER_METRICS_PORT},
};

use super::caller_token::{self, KUBE_API_VOLUME, QUEUE_API_TOKEN_VOLUME};
use super::sidecar_container::{SidecarContainer, SidecarSettings, env_from_secret, http_probe};

/// Name of the config volume added to worker pods.
pub const WORKER_CONFIG_VOLUME: &str = "sluice-worker-config";
/// Time added to the job timeout in `terminationGracePeriodSeconds`: the worker's own shutdown steps
/// (handing back unstarted jobs, the last completion batch) happen after in-flight jobs end.
pub const TERMINATION_MARGIN_SECS: i64 = 30;

/// Why a JobQueue that passed the CRD's validation cannot be rendered. The message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The pod template has no containers.
    #[error("spec.worker.template.spec.containers: the template needs the handler container")]
    NoContainers,
    /// `handler.container` names no container of the template.
    #[error("spec.worker.handler.container: {0:?} is not a container of spec.worker.template")]
    NoSuchHandler(String),
    /// A template container is named like the sidecar.
    #[error("spec.worker.template.spec.containers: the name {0:?} is reserved for the Sluice worker sidecar")]
    ReservedName(String),
    /// The handler port collides with the sidecar's metrics port.
    #[error("spec.worker.handler.port: {0} is the Sluice worker's metrics port; use another")]
    PortInUse(u16),
    /// `spec.database` names both or neither of `secretRef` and `queueDatabaseRef`.
    #[error("spec.database: name exactly one of secretRef or queueDatabaseRef")]
    NoSingleDatabase,
    /// `queueDatabaseRef` with `rowLevelSecurity: Disabled`, which would hand workers the owner's login.
    #[error(
        "spec.database.rowLevelSecurity: Disabled cannot be used with queueDatabaseRef: the \
         QueueDatabase's owner login is never given to a namespace's workers; set it to Enabled"
    )]
    OwnerLoginForWorkers,
    /// A template volume is named like one the gRPC worker API's caller checks add.
    #[error(
        "spec.worker.template.spec.volumes: the name {0:?} is reserved for the gRPC worker's token and the \
         Sluice worker sidecar's API credentials"
    )]
    ReservedVolume(String),
}

/// Name of the worker Deployment (and its HPA): `<jobqueue>-worker`.
pub fn worker_name(jq: &JobQueue) -> String {
    format!("{}-worker", jq.name_any())
}

/// Name of the ConfigMap holding the worker config: `<jobqueue>-worker-config`.
pub fn config_map_name(jq: &JobQueue) -> String {
    format!("{}-worker-config", jq.name_any())
}

/// Labels of every object rendered for `jq`.
pub fn labels(jq: &JobQueue) -> BTreeMap<String, String> {
    BTreeMap::from([
        (JOB_QUEUE_LABEL.to_owned(), jq.name_any()),
        ("app.kubernetes.io/name".to_owned(), "sluice-worker".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), jq.name_any()),
        (MANAGED_BY.to_owned(), crate::FIELD_MANAGER.to_owned()),
    ])
}

/// Metadata of an object owned (controller reference) by `jq`.
pub fn owned_meta(jq: &JobQueue, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: jq.namespace(),
        labels: Some(labels(jq)),
        owner_references: jq.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// The sidecar config the worker reads: the queue to serve, concurrency, the handler URL and timeout.
/// The database URL is left out (it comes from `SLUICE_DATABASE_URL`), and so are the queue's settings
/// (the operator registers them once, so workers of an older generation cannot write old ones back).
pub fn render_worker_config(jq: &JobQueue) -> SidecarConfig {
    let w = &jq.spec.worker;
    SidecarConfig {
        version: CONFIG_VERSION,
        policy: None,
        limits: Default::default(),
        queue: Some(QueueConfig {
            database_url: None,
            pool_size: None,
            queues: vec![jq.database_queue_name()],
            namespace: Some(jq.namespace_or_default().to_owned()),
            queue_settings: vec![],
            worker: WorkerConfig {
                concurrency: w.concurrency,
                // Jobs in flight at SIGTERM get the whole job timeout to finish.
                shutdown_grace: w.job_timeout,
                metrics_listen: ([0, 0, 0, 0], WORKER_METRICS_PORT).into(),
                ..WorkerConfig::default()
            },
            handler: HandlerConfig {
                url: format!("http://127.0.0.1:{}{}", w.handler.port, w.handler.path),
                timeout: w.job_timeout,
                permanent_failure_statuses: w.handler.permanent_failure_statuses.clone(),
            },
            api: QueueApiConfig::default(),
            grpc: match w.handler.protocol {
                HandlerProtocol::Http => GrpcConfig::default(),
                // Loopback: only the pod's own handler container takes jobs from it.
                HandlerProtocol::Grpc => GrpcConfig {
                    listen: Some(([127, 0, 0, 1], port::WORKER_GRPC).into()),
                    ..GrpcConfig::default()
                },
            },
            schedules: worker_schedules(jq),
        }),
    }
}

/// The JobQueue's schedules in the worker config's form. A schedule whose cron expression or time zone
/// cannot be read is left out, so workers never refuse to start over it; its status says why.
pub fn worker_schedules(jq: &JobQueue) -> Vec<ScheduleSpec> {
    let queue = jq.database_queue_name();
    jq.spec
        .schedules
        .iter()
        .filter(|s| schedule_problem(s).is_none())
        .map(|s| ScheduleSpec {
            name: s.name.clone(),
            queue: Some(queue.clone()),
            cron: s.cron.clone(),
            time_zone: s.time_zone.clone(),
            kind: s.kind.clone(),
            payload: s.payload.clone(),
            priority: s.priority,
            missed_runs: s.missed_runs,
        })
        .collect()
}

/// Why a schedule cannot run (its cron expression or time zone cannot be read), if it cannot.
pub fn schedule_problem(s: &JobQueueSchedule) -> Option<String> {
    sluice_queue::schedule::CronSchedule::parse(&s.cron, s.time_zone.as_deref()).err()
}

/// The worker config as the YAML file the sidecar reads.
pub fn worker_config_yaml(jq: &JobQueue) -> String {
    // Plain data: serialising cannot fail.
    serde_yaml::to_string(&render_worker_config(jq)).expect("worker config serialises")
}

/// The ConfigMap holding `worker.yaml`, owned by the JobQueue.
pub fn render_config_map(jq: &JobQueue) -> ConfigMap {
    ConfigMap {
        metadata: owned_meta(jq, config_map_name(jq)),
        data: Some(BTreeMap::from([(
            WORKER_CONFIG_KEY.to_owned(),
            worker_config_yaml(jq),
        )])),
        ..ConfigMap::default()
    }
}

/// The worker Deployment with `spec.replicas` set to `replicas`; `None` leaves it out (the controller
/// renders with `None` to check a spec before anything else, and applies with the replicas it decided).
pub fn render_worker_deployment(
    jq: &JobQueue,
    sidecar: &SidecarSettings,
    replicas: Option<i32>,
) -> Result<Deployment, RenderError> {
    let w = &jq.spec.worker;
    let mut template = w.template.clone();
    let mut pod = template.spec.take().unwrap_or_default();
    if pod.containers.is_empty() {
        return Err(RenderError::NoContainers);
    }
    if let Some(c) = pod.containers.iter().find(|c| c.name == SIDECAR_CONTAINER_NAME) {
        return Err(RenderError::ReservedName(c.name.clone()));
    }
    if let Some(handler) = &w.handler.container
        && !pod.containers.iter().any(|c| &c.name == handler)
    {
        return Err(RenderError::NoSuchHandler(handler.clone()));
    }
    if w.handler.port == WORKER_METRICS_PORT {
        return Err(RenderError::PortInUse(w.handler.port));
    }
    match jq.spec.database.source() {
        None => return Err(RenderError::NoSingleDatabase),
        Some(DatabaseSource::QueueDatabase(_))
            if jq.spec.database.row_level_security == RowLevelSecurity::Disabled =>
        {
            return Err(RenderError::OwnerLoginForWorkers);
        }
        Some(_) => {}
    }
    let checks_grpc_callers = sidecar.queue_api_auth && w.handler.protocol == HandlerProtocol::Grpc;
    if checks_grpc_callers
        && let Some(v) = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == QUEUE_API_TOKEN_VOLUME || v.name == KUBE_API_VOLUME)
    {
        return Err(RenderError::ReservedVolume(v.name.clone()));
    }

    pod.containers.push(sidecar_container(jq, sidecar));
    if checks_grpc_callers {
        check_grpc_callers(jq, &mut pod);
    }
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: WORKER_CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(jq),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
    pod.termination_grace_period_seconds =
        Some(termination_grace_seconds(jq).max(pod.termination_grace_period_seconds.unwrap_or(0)));

    let mut meta = template.metadata.take().unwrap_or_default();
    meta.labels.get_or_insert_with(BTreeMap::new).extend(labels(jq));
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_HASH_ANNOTATION.into(), config_hash(jq));
    template.metadata = Some(meta);
    template.spec = Some(pod);

    Ok(Deployment {
        metadata: owned_meta(jq, worker_name(jq)),
        spec: Some(DeploymentSpec {
            replicas,
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(JOB_QUEUE_LABEL.to_owned(), jq.name_any())])),
                ..LabelSelector::default()
            },
            template,
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    })
}

/// `terminationGracePeriodSeconds` of worker pods: the job timeout plus [`TERMINATION_MARGIN_SECS`].
pub fn termination_grace_seconds(jq: &JobQueue) -> i64 {
    let timeout = jq.spec.worker.job_timeout.get().as_secs_f64().ceil() as i64;
    timeout + TERMINATION_MARGIN_SECS
}

/// A short hash of the worker config, for [`CONFIG_HASH_ANNOTATION`].
pub fn config_hash(jq: &JobQueue) -> String {
    crate::digest::short_hash(worker_config_yaml(jq).as_bytes(), 8)
}

/// Makes the worker sidecar check who calls its gRPC worker API (docs/queue.md, "gRPC worker API"),
/// as the webhook does for an injected sidecar's queue HTTP API: the sidecar gets
/// `SLUICE_API_AUTH=kubernetes`, the pod's namespace and ServiceAccount name, the JobQueue its queue is
/// authorized on when `spec.queueName` differs, `SLUICE_API_AUTH_LOOPBACK=token` in a host-network pod
/// (whose loopback is the node's), and the pod's API credentials at [`KUBE_API_DIR`] (mounted even when
/// the template turns automounting off); the handler container gets a projected ServiceAccount token
/// for the audience `sluice` at [`QUEUE_API_TOKEN_PATH`], named by `SLUICE_QUEUE_API_TOKEN_FILE`, to send
/// as `authorization: Bearer <token>`. A token bound to the pod lets its handler take the JobQueue's jobs
/// without a Role.
fn check_grpc_callers(jq: &JobQueue, pod: &mut PodSpec) {
    let host_network = pod.host_network == Some(true);
    if let Some(sidecar) = pod
        .containers
        .iter_mut()
        .find(|c| c.name == SIDECAR_CONTAINER_NAME)
    {
        caller_token::let_sidecar_check_callers(sidecar, host_network);
        let queue = jq.queue_name();
        if queue != jq.name_any() {
            let job_queues = format!("{queue}={}", jq.name_any());
            sidecar
                .env
                .get_or_insert_with(Vec::new)
                .push(caller_token::var(env::API_JOB_QUEUES, job_queues));
        }
    }
    let handler = match &jq.spec.worker.handler.container {
        Some(name) => pod.containers.iter_mut().find(|c| &c.name == name),
        None => pod.containers.first_mut(),
    };
    if let Some(handler) = handler {
        caller_token::give_caller_a_token(handler);
    }
    pod.volumes
        .get_or_insert_with(Vec::new)
        .extend(caller_token::volumes());
}

/// `SLUICE_DATABASE_URL` by reference: from the namespace's tenant Secret, or with
/// `rowLevelSecurity: Disabled` from the JobQueue's own Secret ([`crate::tenant::workers_secret`]).
pub fn database_url_env(jq: &JobQueue) -> EnvVar {
    env_from_secret(env::DATABASE_URL, &crate::tenant::workers_secret(jq))
}

/// The worker sidecar: `worker --config /etc/sluice/worker.yaml`, the database URL by reference, its
/// metrics port and a readiness probe on it.
fn sidecar_container(jq: &JobQueue, settings: &SidecarSettings) -> Container {
    SidecarContainer::new(settings)
        .args([
            "worker".to_owned(),
            "--config".to_owned(),
            format!("{WORKER_CONFIG_DIR}/{WORKER_CONFIG_KEY}"),
        ])
        .env_var(database_url_env(jq))
        .pod_name_env()
        .port("sluice-metrics", WORKER_METRICS_PORT)
        .readiness(http_probe("/healthz", WORKER_METRICS_PORT, 5, None))
        .config_mount(WORKER_CONFIG_VOLUME)
        .build()
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::render::caller_token::{KUBE_API_DIR, QUEUE_API_TOKEN_DIR, QUEUE_API_TOKEN_PATH};
    use sluice_crds::job_queue::JobQueueSpec;

    /// A JobQueue `emails` in `shop` from a YAML spec, with a uid so it can own objects.
    pub(crate) fn job_queue(spec_yaml: &str) -> JobQueue {
        let spec: JobQueueSpec = serde_yaml::from_str(spec_yaml).unwrap();
        let mut jq = JobQueue::new("emails", spec);
        jq.metadata.namespace = Some("shop".into());
        jq.metadata.uid = Some("0a0a0a0a-1111-2222-3333-444444444444".into());
        jq.metadata.generation = Some(3);
        jq
    }

    pub(crate) const BASIC: &str = r#"
database: {secretRef: {name: pg, key: dsn}}
worker:
  template:
    metadata: {labels: {team: mail}}
    spec:
      containers:
      - name: handler
        image: mail-handler:1.2
        ports: [{containerPort: 8080}]
  handler: {port: 8080, path: /run}
  concurrency: 4
  jobTimeout: 2m
"#;

    fn opts() -> SidecarSettings {
        SidecarSettings {
            image: "ghcr.io/sluice-dev/sluice-sidecar:0.1.0".into(),
            image_pull_policy: None,
            resources: None,
            queue_api_auth: false,
        }
    }

    fn pod(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn sidecar(d: &Deployment) -> &Container {
        pod(d)
            .containers
            .iter()
            .find(|c| c.name == SIDECAR_CONTAINER_NAME)
            .unwrap()
    }

    #[test]
    fn the_deployment_runs_the_handler_beside_the_sidecar_in_worker_role() {
        let jq = job_queue(BASIC);
        let d = render_worker_deployment(&jq, &opts(), Some(0)).unwrap();
        assert_eq!(d.metadata.name.as_deref(), Some("emails-worker"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("shop"));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("JobQueue", Some(true)));
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));
        let names: Vec<_> = pod(&d).containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["handler", "sluice-sidecar"]);
        let s = sidecar(&d);
        assert_eq!(
            s.args.as_ref().unwrap(),
            &["worker", "--config", "/etc/sluice/worker.yaml"]
        );
        assert_eq!(
            s.image.as_deref(),
            Some("ghcr.io/sluice-dev/sluice-sidecar:0.1.0")
        );
        let labels = d
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(labels["team"], "mail", "the user's labels are kept");
        assert_eq!(labels[JOB_QUEUE_LABEL], "emails");
        let selector = d.spec.as_ref().unwrap().selector.match_labels.as_ref().unwrap();
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "the selector selects the pods"
        );
    }

    #[test]
    fn with_a_queue_database_workers_read_the_tenant_secret_and_disabled_is_refused() {
        let with_qdb = BASIC.replace(
            "database: {secretRef: {name: pg, key: dsn}}",
            "database: {queueDatabaseRef: {name: shared}}",
        );
        let jq = job_queue(&with_qdb);
        let d = render_worker_deployment(&jq, &opts(), None).unwrap();
        let env = sidecar(&d).env.as_ref().unwrap();
        let url = env.iter().find(|e| e.name == "SLUICE_DATABASE_URL").unwrap();
        let r = url.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        let tenant = crate::tenant::secret_name(DatabaseSource::QueueDatabase("shared"));
        assert_eq!((r.name.as_str(), r.key.as_str()), (tenant.as_str(), "url"));
        let disabled =
            job_queue(&with_qdb.replace("name: shared}", "name: shared}, rowLevelSecurity: Disabled"));
        let e = render_worker_deployment(&disabled, &opts(), None).unwrap_err();
        assert!(matches!(e, RenderError::OwnerLoginForWorkers), "{e}");
        assert!(e.to_string().contains("set it to Enabled"));
        let both = job_queue(&BASIC.replace("key: dsn}", "key: dsn}, queueDatabaseRef: {name: shared}"));
        let e = render_worker_deployment(&both, &opts(), None).unwrap_err();
        assert!(matches!(e, RenderError::NoSingleDatabase), "{e}");
    }

    #[test]
    fn the_database_url_reaches_pods_only_by_secret_reference() {
        let jq = job_queue(BASIC);
        let d = render_worker_deployment(&jq, &opts(), None).unwrap();
        let env = sidecar(&d).env.as_ref().unwrap();
        let url = env.iter().find(|e| e.name == "SLUICE_DATABASE_URL").unwrap();
        assert!(url.value.is_none());
        let r = url.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        // By default from the namespace's tenant Secret; with row-level security off, from the JobQueue's.
        let tenant = crate::tenant::secret_name(jq.spec.database.source().unwrap());
        assert_eq!((r.name.as_str(), r.key.as_str()), (tenant.as_str(), "url"));
        let disabled = job_queue(&BASIC.replace("key: dsn}", "key: dsn}, rowLevelSecurity: Disabled"));
        let d2 = render_worker_deployment(&disabled, &opts(), None).unwrap();
        let var = sidecar(&d2)
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "SLUICE_DATABASE_URL");
        let r2 = var
            .unwrap()
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .clone()
            .unwrap();
        assert_eq!((r2.name.as_str(), r2.key.as_str()), ("pg", "dsn"));
        let pod_name = env.iter().find(|e| e.name == "SLUICE_POD_NAME").unwrap();
        assert_eq!(
            pod_name
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.name"
        );
        let cm = render_config_map(&jq);
        let text = &cm.data.as_ref().unwrap()[WORKER_CONFIG_KEY];
        assert!(!text.contains("databaseUrl"), "{text}");
        assert!(!serde_json::to_string(&d).unwrap().contains("postgres://"));
    }

    #[test]
    fn scale_in_waits_for_the_job_timeout() {
        let jq = job_queue(BASIC);
        let d = render_worker_deployment(&jq, &opts(), None).unwrap();
        assert_eq!(
            pod(&d).termination_grace_period_seconds,
            Some(120 + TERMINATION_MARGIN_SECS)
        );
        let cfg = render_worker_config(&jq).queue.unwrap();
        assert_eq!(cfg.worker.shutdown_grace, jq.spec.worker.job_timeout);
        assert!(termination_grace_seconds(&jq) > jq.spec.worker.job_timeout.get().as_secs() as i64);
    }

    #[test]
    fn a_longer_grace_period_of_the_users_template_is_kept() {
        let yaml = BASIC.replace(
            "      containers:",
            "      terminationGracePeriodSeconds: 900\n      containers:",
        );
        let d = render_worker_deployment(&job_queue(&yaml), &opts(), None).unwrap();
        assert_eq!(pod(&d).termination_grace_period_seconds, Some(900));
    }

    #[test]
    fn the_sidecar_security_context_is_strict() {
        let d = render_worker_deployment(&job_queue(BASIC), &opts(), None).unwrap();
        let sc = sidecar(&d).security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(), &["ALL"]);
    }

    #[test]
    fn schedules_reach_the_worker_config_unless_their_cron_cannot_be_read() {
        let jq = job_queue(&format!(
            "{BASIC}schedules:\n  - {{name: nightly, cron: '30 2 * * *', timeZone: Europe/Berlin, kind: digest, missedRuns: runOnce}}\n  - {{name: broken, cron: '61 * * * *', kind: k}}\n"
        ));
        let schedules = render_worker_config(&jq).queue.unwrap().schedules;
        assert_eq!(schedules.len(), 1, "{schedules:?}");
        assert_eq!(schedules[0].name, "nightly");
        assert_eq!(schedules[0].queue.as_deref(), Some("shop/emails"));
        assert_eq!(schedules[0].payload, serde_json::json!({}));
        let problem = schedule_problem(&jq.spec.schedules[1]).unwrap();
        assert!(problem.contains("61 * * * *"), "{problem}");
    }

    #[test]
    fn a_grpc_handler_takes_jobs_from_the_sidecars_worker_api_on_loopback() {
        let http = render_worker_config(&job_queue(BASIC));
        assert_eq!(
            http.queue.unwrap().grpc.listen,
            None,
            "http by default: jobs are POSTed"
        );
        let jq = job_queue(&BASIC.replace("handler: {port: 8080", "handler: {protocol: grpc, port: 8080"));
        let config = render_worker_config(&jq);
        let grpc = config.queue.unwrap().grpc;
        assert_eq!(grpc.listen, Some(([127, 0, 0, 1], port::WORKER_GRPC).into()));
        // What the worker reads back says the same (the field is written, not left at its default).
        let text = serde_yaml::to_string(&render_worker_config(&jq)).unwrap();
        assert!(text.contains("127.0.0.1:9903"), "{text}");
        let err = serde_yaml::from_str::<JobQueueSpec>(
            &BASIC.replace("handler: {port: 8080", "handler: {protocol: soap, port: 8080"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("soap"), "{err}");
    }

    /// The value of env var `name` of `c` as JSON (`value` or `valueFrom`), `Null` when absent.
    fn env_of(c: &Container, name: &str) -> serde_json::Value {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .map_or(serde_json::Value::Null, |e| {
                serde_json::to_value(e.value.clone().map_or_else(
                    || serde_json::to_value(&e.value_from).unwrap(),
                    serde_json::Value::String,
                ))
                .unwrap()
            })
    }

    #[test]
    fn with_queue_api_auth_a_grpc_workers_sidecar_checks_callers_and_the_handler_has_a_sluice_token() {
        let grpc = BASIC
            .replace("handler: {port: 8080", "handler: {protocol: grpc, port: 8080")
            .replace("database:", "queueName: mail.outbound\ndatabase:");
        let auth = SidecarSettings {
            queue_api_auth: true,
            ..opts()
        };
        let d = render_worker_deployment(&job_queue(&grpc), &auth, None).unwrap();
        let s = sidecar(&d);
        assert_eq!(env_of(s, env::API_AUTH), "kubernetes");
        assert_eq!(
            env_of(s, env::POD_SERVICE_ACCOUNT)["fieldRef"]["fieldPath"],
            "spec.serviceAccountName"
        );
        assert_eq!(
            env_of(s, env::POD_NAMESPACE)["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        assert_eq!(env_of(s, env::POD_NAME)["fieldRef"]["fieldPath"], "metadata.name");
        assert_eq!(env_of(s, env::API_JOB_QUEUES), "mail.outbound=emails");
        assert_eq!(env_of(s, env::API_AUTH_LOOPBACK), serde_json::Value::Null);
        let mounts = |c: &Container| -> Vec<(String, String)> {
            c.volume_mounts
                .iter()
                .flatten()
                .map(|m| (m.name.clone(), m.mount_path.clone()))
                .collect()
        };
        assert!(mounts(s).contains(&(KUBE_API_VOLUME.into(), KUBE_API_DIR.into())));
        let handler = &pod(&d).containers[0];
        assert_eq!(handler.name, "handler");
        assert_eq!(env_of(handler, env::QUEUE_API_TOKEN_FILE), QUEUE_API_TOKEN_PATH);
        assert_eq!(
            mounts(handler),
            vec![(QUEUE_API_TOKEN_VOLUME.to_owned(), QUEUE_API_TOKEN_DIR.to_owned())]
        );
        let volumes = serde_json::to_value(&pod(&d).volumes).unwrap();
        let token = volumes
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == QUEUE_API_TOKEN_VOLUME)
            .unwrap();
        assert_eq!(
            token["projected"]["sources"][0]["serviceAccountToken"],
            serde_json::json!({"audience": "sluice", "expirationSeconds": 600, "path": "token"})
        );
        let api = volumes
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == KUBE_API_VOLUME)
            .unwrap();
        assert_eq!(
            api["projected"]["sources"][1]["configMap"]["name"],
            "kube-root-ca.crt"
        );

        // On the host network, loopback is the node's: every caller needs a token.
        let host = grpc.replace("    spec:\n", "    spec:\n      hostNetwork: true\n");
        let d = render_worker_deployment(&job_queue(&host), &auth, None).unwrap();
        assert_eq!(pod(&d).host_network, Some(true));
        assert_eq!(env_of(sidecar(&d), env::API_AUTH_LOOPBACK), "token");

        // The handler named by handler.container gets the token, not the other containers.
        let two = grpc
            .replace("handler: {protocol: grpc,", "handler: {container: main, protocol: grpc,")
            .replace(
                "      containers:\n",
                "      containers:\n      - {name: log-shipper, image: shipper:1}\n      - {name: main, image: mail:1}\n",
            );
        let d = render_worker_deployment(&job_queue(&two), &auth, None).unwrap();
        let with_token: Vec<&str> = pod(&d)
            .containers
            .iter()
            .filter(|c| env_of(c, env::QUEUE_API_TOKEN_FILE) != serde_json::Value::Null)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(with_token, ["main"]);

        // A template volume of a reserved name is refused, naming it.
        let taken = grpc.replace(
            "    spec:\n",
            "    spec:\n      volumes: [{name: sluice-queue-api-token, emptyDir: {}}]\n",
        );
        let err = render_worker_deployment(&job_queue(&taken), &auth, None).unwrap_err();
        assert_eq!(err, RenderError::ReservedVolume(QUEUE_API_TOKEN_VOLUME.into()));
        assert!(err.to_string().contains("sluice-queue-api-token"), "{err}");

        // Without auth, or for an HTTP handler, none of it.
        for (spec, settings) in [(grpc.as_str(), opts()), (BASIC, auth.clone())] {
            let d = render_worker_deployment(&job_queue(spec), &settings, None).unwrap();
            assert_eq!(env_of(sidecar(&d), env::API_AUTH), serde_json::Value::Null);
            assert!(
                pod(&d)
                    .containers
                    .iter()
                    .all(|c| env_of(c, env::QUEUE_API_TOKEN_FILE) == serde_json::Value::Null)
            );
            assert_eq!(
                pod(&d).volumes.as_ref().map(Vec::len),
                Some(1),
                "the config volume only"
            );
        }
    }

    #[test]
    fn the_worker_config_points_at_the_handler_and_serves_the_queue() {
        let jq = job_queue(&BASIC.replace("database:", "queueName: mail.outbound\ndatabase:"));
        let cfg = render_worker_config(&jq);
        let q = cfg.queue.as_ref().unwrap();
        assert_eq!(q.queues, ["shop/mail.outbound"]);
        assert_eq!(q.namespace.as_deref(), Some("shop"));
        assert_eq!(q.handler.url, "http://127.0.0.1:8080/run");
        assert_eq!(q.worker.concurrency, 4);
        assert_eq!(q.handler.timeout.to_string(), "2m");
        // The file reads back as the sidecar reads it.
        let back: SidecarConfig = serde_yaml::from_str(&worker_config_yaml(&jq)).unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn a_config_change_rolls_the_workers() {
        let a = render_worker_deployment(&job_queue(BASIC), &opts(), None).unwrap();
        let b = render_worker_deployment(
            &job_queue(&BASIC.replace("concurrency: 4", "concurrency: 8")),
            &opts(),
            None,
        )
        .unwrap();
        let hash = |d: &Deployment| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap()
                .annotations
                .as_ref()
                .unwrap()[CONFIG_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn templates_that_cannot_run_a_worker_are_refused_naming_the_field() {
        let no_containers =
            job_queue("database: {secretRef: {name: pg}}\nworker: {template: {spec: {containers: []}}}\n");
        assert_eq!(
            render_worker_deployment(&no_containers, &opts(), None).unwrap_err(),
            RenderError::NoContainers
        );
        let wrong_handler =
            job_queue(&BASIC.replace("handler: {port: 8080", "handler: {container: nope, port: 8080"));
        let err = render_worker_deployment(&wrong_handler, &opts(), None).unwrap_err();
        assert!(err.to_string().contains("spec.worker.handler.container"), "{err}");
        let reserved = job_queue(&BASIC.replace("name: handler", "name: sluice-sidecar"));
        assert!(matches!(
            render_worker_deployment(&reserved, &opts(), None),
            Err(RenderError::ReservedName(_))
        ));
        let port = job_queue(&BASIC.replace("port: 8080, path", "port: 9902, path"));
        assert_eq!(
            render_worker_deployment(&port, &opts(), None).unwrap_err(),
            RenderError::PortInUse(9902)
        );
    }
}
