//! What lets a pod's containers take part in the queue API's caller checks (`--queue-api-auth
//! kubernetes`): a projected token for the audience `sluice` for the containers that call the sidecar
//! (app containers of an injected pod, a gRPC worker's handler), and the pod's ServiceAccount API
//! credentials for the sidecar, which reviews those tokens. The webhook and the worker Deployment add the
//! same two volumes.

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIProjection, DownwardAPIVolumeFile, EnvVar, EnvVarSource,
    KeyToPath, ObjectFieldSelector, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume,
    VolumeMount, VolumeProjection,
};
use sluice_crds::{contract::env, sidecar_config::API_TOKEN_AUDIENCE};

/// Volume of the callers' token for the queue API.
pub const QUEUE_API_TOKEN_VOLUME: &str = "sluice-queue-api-token";
/// Where the callers find it.
pub const QUEUE_API_TOKEN_DIR: &str = "/var/run/secrets/sluice.dev";
/// The token file in [`QUEUE_API_TOKEN_DIR`].
pub const QUEUE_API_TOKEN_PATH: &str = "/var/run/secrets/sluice.dev/token";
/// Lifetime asked for the callers' token (the kubelet refreshes it at 80 %; 600 s is the least allowed).
pub const QUEUE_API_TOKEN_SECONDS: i64 = 600;
/// Volume of the sidecar's API server credentials (the pod's ServiceAccount), which it needs to review
/// callers: the ServiceAccount admission plugin mounts them only in the containers the pod was created
/// with, before the webhook adds the sidecar (and never in a container that mounts this path itself).
pub const KUBE_API_VOLUME: &str = "sluice-kube-api";
/// Where a container finds its ServiceAccount's API credentials.
pub const KUBE_API_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A read-only mount of volume `name` at `path`.
pub fn read_only_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// `name=value`.
pub fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// The sidecar's side: its settings to check callers (the pod's namespace and ServiceAccount from the
/// downward API; on the host network, tokens even from loopback) and its API server credentials
/// mounted from [`KUBE_API_VOLUME`] (replacing any mount at [`KUBE_API_DIR`]).
pub fn let_sidecar_check_callers(sidecar: &mut Container, host_network: bool) {
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let vars = sidecar.env.get_or_insert_with(Vec::new);
    vars.extend([
        var(env::API_AUTH, "kubernetes"),
        field(env::POD_NAMESPACE, "metadata.namespace"),
        field(env::POD_SERVICE_ACCOUNT, "spec.serviceAccountName"),
    ]);
    if host_network {
        vars.push(var(env::API_AUTH_LOOPBACK, "token"));
    }
    let mounts = sidecar.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.mount_path != KUBE_API_DIR);
    mounts.push(read_only_mount(KUBE_API_VOLUME, KUBE_API_DIR));
}

/// A caller's side: the token mounted at [`QUEUE_API_TOKEN_DIR`] and `SLUICE_QUEUE_API_TOKEN_FILE`
/// naming it, each unless the container has its own already.
pub fn give_caller_a_token(c: &mut Container) {
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| m.mount_path == QUEUE_API_TOKEN_DIR) {
        mounts.push(read_only_mount(QUEUE_API_TOKEN_VOLUME, QUEUE_API_TOKEN_DIR));
    }
    let vars = c.env.get_or_insert_with(Vec::new);
    if !vars.iter().any(|e| e.name == env::QUEUE_API_TOKEN_FILE) {
        vars.push(var(env::QUEUE_API_TOKEN_FILE, QUEUE_API_TOKEN_PATH));
    }
}

/// The two volumes: [`QUEUE_API_TOKEN_VOLUME`] (a `sluice` token living [`QUEUE_API_TOKEN_SECONDS`])
/// and [`KUBE_API_VOLUME`] (what the ServiceAccount admission plugin mounts as `kube-api-access-*`).
pub fn volumes() -> [Volume; 2] {
    let projected = |sources: Vec<VolumeProjection>| ProjectedVolumeSource {
        sources: Some(sources),
        ..ProjectedVolumeSource::default()
    };
    let token = |audience: Option<&str>, seconds: i64| VolumeProjection {
        service_account_token: Some(ServiceAccountTokenProjection {
            audience: audience.map(Into::into),
            expiration_seconds: Some(seconds),
            path: "token".into(),
        }),
        ..VolumeProjection::default()
    };
    let queue_api_token = Volume {
        name: QUEUE_API_TOKEN_VOLUME.into(),
        projected: Some(projected(vec![token(
            Some(API_TOKEN_AUDIENCE),
            QUEUE_API_TOKEN_SECONDS,
        )])),
        ..Volume::default()
    };
    let kube_api = Volume {
        name: KUBE_API_VOLUME.into(),
        projected: Some(projected(vec![
            token(None, 3607),
            VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: "kube-root-ca.crt".into(),
                    items: Some(vec![KeyToPath {
                        key: "ca.crt".into(),
                        path: "ca.crt".into(),
                        mode: None,
                    }]),
                    optional: None,
                }),
                ..VolumeProjection::default()
            },
            VolumeProjection {
                downward_api: Some(DownwardAPIProjection {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "namespace".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.namespace".into(),
                            api_version: Some("v1".into()),
                        }),
                        ..DownwardAPIVolumeFile::default()
                    }]),
                }),
                ..VolumeProjection::default()
            },
        ])),
        ..Volume::default()
    };
    [queue_api_token, kube_api]
}
