//! What lets a pod's containers take part in the queue API's caller checks (`--queue-api-auth
//! kubernetes`): a projected token for the audience `sluice` for the containers that call the sidecar
//! (app containers of an injected pod, a gRPC worker's handler), and the pod's ServiceAccount API
//! credentials for the sidecar, which reviews those tokens. The webhook and the worker Deployment add the
//! same two volumes.

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath, ObjectFieldSelector,
    ProjectedVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use sluice_crds::sidecar_config::API_TOKEN_AUDIENCE;

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
