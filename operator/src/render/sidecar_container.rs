//! The `sluice-sidecar` container, described once for the two places it runs: injected into app pods by
//! the webhook (proxy role, or the queue API alone) and beside the handler in worker pods (worker role).
//! Pure: no I/O.
//!
//! Every sidecar container gets, from [`SidecarContainer::new`]: the contract's name, the image, pull
//! policy and resources the operator was started with, and a security context that passes the
//! `restricted` Pod Security Standard ([`strict_security_context`]). The roles add their arguments, env,
//! ports, config mount and probes with the builder's methods. Credentials only ever arrive by
//! `secretKeyRef` ([`SidecarContainer::env_from_secret`]), never as text.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use k8s_openapi::{
    api::core::v1::{
        Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
        Probe, ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, VolumeMount,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use sluice_crds::{
    contract::{SIDECAR_CONTAINER, SIDECAR_UID, env, path::CONFIG_DIR, port},
    job_queue::JobQueue,
    secret_ref::SecretKeyRef,
};

/// What the operator's command line decides about every sidecar container (flags `--sidecar-*`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SidecarSettings {
    /// The `sluice-sidecar` image, e.g. `ghcr.io/sluice-dev/sluice-sidecar:0.1.0`.
    pub image: String,
    /// `imagePullPolicy`; absent: the cluster's default for the tag.
    pub image_pull_policy: Option<String>,
    /// Requests and limits.
    pub resources: Option<ResourceRequirements>,
    /// The queue APIs check their callers (`--queue-api-auth kubernetes`): the gRPC worker API of worker
    /// pods with `handler.protocol: grpc` too (the webhook's injected sidecars follow
    /// `InjectConfig::queue_api_auth`).
    pub queue_api_auth: bool,
}

/// A sidecar container being built. Methods add to it in the order called.
#[derive(Clone, Debug)]
pub struct SidecarContainer(Container);

impl SidecarContainer {
    /// The container every role starts from: name, image, pull policy, resources, security context.
    pub fn new(settings: &SidecarSettings) -> Self {
        Self(Container {
            name: SIDECAR_CONTAINER.into(),
            image: Some(settings.image.clone()),
            image_pull_policy: settings.image_pull_policy.clone(),
            resources: settings.resources.clone(),
            security_context: Some(strict_security_context()),
            ..Container::default()
        })
    }

    /// The command-line arguments.
    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.0.args = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// Env var `name` with a value.
    pub fn env(self, name: &str, value: impl Into<String>) -> Self {
        self.env_var(EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..EnvVar::default()
        })
    }

    /// Env var `name` from a key of a Secret (`secretKeyRef`, not optional).
    pub fn env_from_secret(self, name: &str, secret: &SecretKeyRef) -> Self {
        self.env_var(env_from_secret(name, secret))
    }

    /// `SLUICE_POD_NAME` from the downward API: the pod's name, which its reports and leases carry.
    pub fn pod_name_env(self) -> Self {
        self.env_var(EnvVar {
            name: env::POD_NAME.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        })
    }

    /// An env var as given.
    pub fn env_var(mut self, var: EnvVar) -> Self {
        self.0.env.get_or_insert_with(Vec::new).push(var);
        self
    }

    /// A TCP port named `name`.
    pub fn port(mut self, name: &str, number: u16) -> Self {
        self.0.ports.get_or_insert_with(Vec::new).push(ContainerPort {
            name: Some(name.into()),
            container_port: i32::from(number),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
        self
    }

    /// Mounts `volume` read-only at the contract's config directory.
    pub fn config_mount(mut self, volume: &str) -> Self {
        self.0
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: volume.into(),
                mount_path: CONFIG_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
        self
    }

    /// The readiness probe.
    pub fn readiness(mut self, probe: Probe) -> Self {
        self.0.readiness_probe = Some(probe);
        self
    }

    /// The liveness probe.
    pub fn liveness(mut self, probe: Probe) -> Self {
        self.0.liveness_probe = Some(probe);
        self
    }

    /// The container.
    pub fn build(self) -> Container {
        self.0
    }
}

/// Address the queue API listens on in pods that enqueue through the sidecar: localhost only.
pub const QUEUE_API_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port::QUEUE_API);

/// Env vars that give an app pod the sidecar's queue HTTP API for `jq` (for the pod webhook, when a pod
/// is annotated `sluice.dev/job-queues: <name>`): the database URL by `secretKeyRef` to the namespace's
/// tenant Secret, or the JobQueue's own with `rowLevelSecurity: Disabled` (never as text), the queue's database name (`<namespace>/<queue>`), the namespace the API's
/// paths name queues in, and the API's address on localhost.
///
/// One database per sidecar: the webhook ([`crate::webhook::inject::resolve_job_queues`]) refuses pods
/// naming JobQueues with different Secret references, and lists every queue name in `SLUICE_QUEUES`.
pub fn queue_api_env(jq: &JobQueue) -> Vec<EnvVar> {
    vec![
        env_from_secret(env::DATABASE_URL, &crate::tenant::workers_secret(jq)),
        EnvVar {
            name: env::QUEUES.into(),
            value: Some(jq.database_queue_name()),
            ..EnvVar::default()
        },
        EnvVar {
            name: env::QUEUE_NAMESPACE.into(),
            value: Some(jq.namespace_or_default().to_owned()),
            ..EnvVar::default()
        },
        EnvVar {
            name: env::API_LISTEN.into(),
            value: Some(QUEUE_API_LISTEN.to_string()),
            ..EnvVar::default()
        },
    ]
}

/// An HTTP GET probe of `path` on `port` every `period_seconds`. `failure_threshold` and a one-second
/// timeout are set only when `strict` (the injected sidecar's probes); otherwise Kubernetes' defaults
/// apply.
pub fn http_probe(path: &str, port: u16, period_seconds: i32, strict: Option<i32>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        failure_threshold: strict,
        timeout_seconds: strict.map(|_| 1),
        ..Probe::default()
    }
}

/// Env var `name` from a key of a Secret, by reference: the value never appears in the pod spec.
pub fn env_from_secret(name: &str, secret: &SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.name.clone(),
                key: secret.key.clone(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Non-root, read-only root filesystem, no privilege escalation, every capability dropped, the runtime's
/// seccomp profile: what the `restricted` Pod Security Standard asks.
pub fn strict_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SIDECAR_UID),
        run_as_group: Some(SIDECAR_UID),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::worker_deployment::tests::{BASIC, job_queue};

    fn settings() -> SidecarSettings {
        SidecarSettings {
            image: "ghcr.io/sluice-dev/sluice-sidecar:0.1.0".into(),
            image_pull_policy: Some("IfNotPresent".into()),
            resources: None,
            queue_api_auth: false,
        }
    }

    #[test]
    fn every_sidecar_runs_locked_down_under_the_contract_name() {
        let c = SidecarContainer::new(&settings()).build();
        assert_eq!(c.name, SIDECAR_CONTAINER);
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        let sc = c.security_context.unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(SIDECAR_UID));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    }

    #[test]
    fn secrets_arrive_by_reference_only() {
        let secret = SecretKeyRef {
            name: "pg".into(),
            key: "dsn".into(),
        };
        let c = SidecarContainer::new(&settings())
            .env_from_secret(env::DATABASE_URL, &secret)
            .build();
        let var = &c.env.unwrap()[0];
        assert!(var.value.is_none());
        let r = var.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("pg", "dsn"));
    }

    #[test]
    fn apps_get_the_queue_api_with_the_url_by_reference() {
        let env = queue_api_env(&job_queue(BASIC));
        let names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "SLUICE_DATABASE_URL",
                "SLUICE_QUEUES",
                "SLUICE_QUEUE_NAMESPACE",
                "SLUICE_API_LISTEN"
            ]
        );
        assert!(env[0].value.is_none());
        assert_eq!(env[1].value.as_deref(), Some("shop/emails"));
        assert_eq!(env[2].value.as_deref(), Some("shop"));
    }
}
