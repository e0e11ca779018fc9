//! The operator's command line: one typed config, every flag also an environment variable (the Helm
//! chart sets those). Doc comments are the `--help` text.

use std::{net::SocketAddr, path::PathBuf};

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::ResourceRequirements;

/// Default sidecar image: the release matching this operator.
pub const SIDECAR_IMAGE_DEFAULT: &str =
    concat!("ghcr.io/sluice-dev/sluice-sidecar:", env!("CARGO_PKG_VERSION"));
/// Default address of the webhook (HTTPS).
pub const WEBHOOK_LISTEN_DEFAULT: &str = "0.0.0.0:9443";
/// Default address of `/metrics`, `/healthz` and `/readyz` (HTTP).
pub const METRICS_LISTEN_DEFAULT: &str = "0.0.0.0:8080";
/// Default address of the external metrics API (HTTPS).
pub const EXTERNAL_METRICS_LISTEN_DEFAULT: &str = "0.0.0.0:6443";
/// Default bound on the reconciles one controller runs at once (per watched namespace with
/// `--watch-namespaces`). It must let the controller keep up with its periodic requeues: with 1,000
/// JobQueues requeued every 30 s and reconciles of ~0.65 s against the test API server, 8 sustained
/// ~12 reconciles a second of the 33 needed, and new JobQueues waited minutes for their first one.
pub const CONCURRENT_RECONCILES_DEFAULT: u16 = 64;
/// Default sidecar resources when none are configured.
pub const SIDECAR_RESOURCES_DEFAULT: &str =
    r#"{"requests":{"cpu":"50m","memory":"32Mi"},"limits":{"memory":"64Mi"}}"#;

/// Sluice's control plane.
#[derive(Debug, Parser)]
#[command(name = "sluice-operator", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers, the injection webhook and the metrics endpoint.
    Run(Box<RunArgs>),
    /// Write the CRD YAML generated from the Rust types into a directory.
    Crdgen {
        /// Directory to write `<plural>.<group>.yaml` files into.
        #[arg(long, default_value = "crds")]
        dir: PathBuf,
    },
    /// GET a URL and exit 0 on a 2xx answer, trying again for up to 30 s (the chart's `helm test` hook
    /// uses it).
    Probe {
        /// `http://host:port/path`, e.g. the operator's `/readyz`.
        url: String,
    },
}

/// Whether injected sidecars are native sidecars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NativeSidecar {
    /// Native when the API server is 1.29 or newer (nodes must be, too).
    Auto,
    /// Always an init container with `restartPolicy: Always`.
    True,
    /// Always a plain container.
    False,
}

/// Whether the queue API of injected sidecars checks its callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QueueApiAuth {
    /// ServiceAccount tokens (audience `sluice`) by TokenReview, RBAC by SubjectAccessReview.
    Kubernetes,
    /// Anyone who reaches the API (the pod's loopback) may call it.
    Off,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// Settings of `sluice-operator run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Namespace the operator runs in: its Lease and certificate Secrets live there, the webhook never
    /// injects pods there, and an external metrics APIService whose service is there is Sluice's.
    #[arg(long, env = "SLUICE_NAMESPACE", default_value = "sluice-system")]
    pub namespace: String,
    /// Namespaces whose RateLimitPolicies and JobQueues the operator reconciles and whose policies and
    /// JobQueues the webhook injects for, comma-separated; empty: every namespace. With a list, every
    /// watch and write is confined to those namespaces (the chart's `watchNamespaces` grants Roles
    /// there instead of cluster-wide write access).
    #[arg(long, env = "SLUICE_WATCH_NAMESPACES", value_delimiter = ',', num_args = 0..)]
    pub watch_namespaces: Vec<String>,
    /// This replica's name (its identity in leader election and Events); defaults to the host name.
    #[arg(long, env = "SLUICE_POD_NAME")]
    pub pod_name: Option<String>,
    /// Elect a leader among replicas with a Lease; only the leader reconciles.
    #[arg(long, env = "SLUICE_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the Lease.
    #[arg(long, env = "SLUICE_LEASE_NAME", default_value = "sluice-operator")]
    pub lease_name: String,
    /// Address of the HTTPS admission webhook.
    #[arg(long, env = "SLUICE_WEBHOOK_LISTEN", default_value = WEBHOOK_LISTEN_DEFAULT)]
    pub webhook_listen: SocketAddr,
    /// Name of the Service in front of the webhook (the serving certificate is issued for it).
    #[arg(long, env = "SLUICE_WEBHOOK_SERVICE", default_value = "sluice-webhook")]
    pub webhook_service: String,
    /// Name of the MutatingWebhookConfiguration whose caBundle the operator keeps current.
    #[arg(long, env = "SLUICE_WEBHOOK_CONFIG_NAME", default_value = "sluice")]
    pub webhook_config_name: String,
    /// Secret holding the webhook's CA and serving certificate.
    #[arg(
        long,
        env = "SLUICE_WEBHOOK_CERT_SECRET",
        default_value = "sluice-webhook-tls"
    )]
    pub webhook_cert_secret: String,
    /// cert-manager issues the serving certificate and injects the caBundle: read `tls.crt`/`tls.key`
    /// from `--webhook-cert-dir` instead of generating them.
    #[arg(long, env = "SLUICE_CERT_MANAGER", default_value_t = false, action = ArgAction::Set)]
    pub cert_manager: bool,
    /// Where the cert-manager certificate is mounted.
    #[arg(
        long,
        env = "SLUICE_WEBHOOK_CERT_DIR",
        default_value = "/var/run/sluice/webhook-tls"
    )]
    pub webhook_cert_dir: PathBuf,
    /// Secret (in `--namespace`) holding the Ed25519 key that signs the configs published through
    /// Redis; created with a new key when missing. Injected sidecars get its public key.
    #[arg(
        long,
        env = "SLUICE_CONFIG_SIGNING_SECRET",
        default_value = "sluice-config-signing"
    )]
    pub config_signing_secret: String,
    /// Most distinct Redis servers, and most distinct databases, the objects of one namespace make the
    /// operator connect to; an object beyond it is not connected (`Ready=False`, `TooManyEndpoints`).
    #[arg(long, env = "SLUICE_MAX_ENDPOINTS_PER_NAMESPACE", default_value_t = crate::budget::PER_NAMESPACE_DEFAULT)]
    pub max_endpoints_per_namespace: usize,
    /// Most distinct Redis servers, and most distinct databases, the operator connects to in all.
    #[arg(long, env = "SLUICE_MAX_ENDPOINTS", default_value_t = crate::budget::TOTAL_DEFAULT)]
    pub max_endpoints: usize,
    /// Most reconciles each controller (RateLimitPolicy, JobQueue) runs at once; the others wait their
    /// turn. Unbounded, a thousand JobQueues created together queued for the pooled connections to
    /// their database, past their 3 s acquire deadline (`DatabaseUnreachable`).
    #[arg(
        long,
        env = "SLUICE_CONCURRENT_RECONCILES",
        default_value_t = CONCURRENT_RECONCILES_DEFAULT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub concurrent_reconciles: u16,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "SLUICE_METRICS_LISTEN", default_value = METRICS_LISTEN_DEFAULT)]
    pub metrics_listen: SocketAddr,
    /// Serve `external.metrics.k8s.io` (queue depth for HPAs); set false when KEDA or
    /// prometheus-adapter owns that API.
    #[arg(long, env = "SLUICE_EXTERNAL_METRICS", default_value_t = true, action = ArgAction::Set)]
    pub external_metrics: bool,
    /// Address of the external metrics API (HTTPS).
    #[arg(long, env = "SLUICE_EXTERNAL_METRICS_LISTEN", default_value = EXTERNAL_METRICS_LISTEN_DEFAULT)]
    pub external_metrics_listen: SocketAddr,
    /// Service in front of the external metrics API (the APIService's): its serving certificate is
    /// issued for this Service's names.
    #[arg(
        long,
        env = "SLUICE_EXTERNAL_METRICS_SERVICE",
        default_value = "sluice-metrics-api"
    )]
    pub external_metrics_service: String,
    /// Secret holding the external metrics API's CA and serving certificate (written by cert-manager
    /// when `--cert-manager`).
    #[arg(
        long,
        env = "SLUICE_EXTERNAL_METRICS_CERT_SECRET",
        default_value = "sluice-metrics-api-tls"
    )]
    pub external_metrics_cert_secret: String,
    /// Image of the injected sidecar.
    #[arg(long, env = "SLUICE_SIDECAR_IMAGE", default_value = SIDECAR_IMAGE_DEFAULT)]
    pub sidecar_image: String,
    /// imagePullPolicy of the injected sidecar.
    #[arg(long, env = "SLUICE_SIDECAR_IMAGE_PULL_POLICY")]
    pub sidecar_image_pull_policy: Option<String>,
    /// Inject native sidecars (init containers with restartPolicy: Always).
    #[arg(long, env = "SLUICE_SIDECAR_NATIVE", value_enum, default_value_t = NativeSidecar::Auto)]
    pub sidecar_native: NativeSidecar,
    /// Whether the queue API of sidecars injected for `sluice.dev/job-queues` checks its callers
    /// (docs/queue.md, "Who may call the API").
    #[arg(long, env = "SLUICE_QUEUE_API_AUTH", value_enum, default_value_t = QueueApiAuth::Kubernetes)]
    pub queue_api_auth: QueueApiAuth,
    /// ClusterRoleBinding (created by the chart, without subjects) that grants the ServiceAccounts of
    /// namespaces holding a JobQueue the right to create TokenReviews and SubjectAccessReviews, which
    /// injected sidecars need to check the queue API's callers. When set, the leader keeps its subjects
    /// to the groups `system:serviceaccounts:<ns>` of exactly those namespaces. Only without
    /// `--watch-namespaces` (the chart binds listed namespaces statically).
    #[arg(long, env = "SLUICE_QUEUE_API_REVIEWER_BINDING")]
    pub queue_api_reviewer_binding: Option<String>,
    /// Resources of the injected sidecar, as JSON (`{"requests":{...},"limits":{...}}`).
    #[arg(long, env = "SLUICE_SIDECAR_RESOURCES", default_value = SIDECAR_RESOURCES_DEFAULT, value_parser = parse_resources)]
    pub sidecar_resources: ResourceRequirements,
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}

fn parse_resources(s: &str) -> Result<ResourceRequirements, String> {
    serde_json::from_str(s).map_err(|e| format!("not a ResourceRequirements JSON object: {e}"))
}

impl RunArgs {
    /// This replica's identity.
    pub fn identity(&self) -> String {
        self.pod_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "sluice-operator".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_environment_parses() {
        let cli = Cli::try_parse_from([
            "sluice-operator",
            "run",
            "--leader-election",
            "false",
            "--sidecar-native",
            "true",
            "--queue-api-auth",
            "off",
            "--sidecar-resources",
            r#"{"requests":{"cpu":"10m"}}"#,
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("run")
        };
        assert!(!args.leader_election);
        assert_eq!(args.sidecar_native, NativeSidecar::True);
        assert_eq!(args.queue_api_auth, QueueApiAuth::Off);
        assert!(args.sidecar_resources.requests.unwrap().contains_key("cpu"));
    }

    #[test]
    fn concurrent_reconciles_default_to_a_bound_and_refuse_zero() {
        let Command::Run(args) = Cli::try_parse_from(["sluice-operator", "run"]).unwrap().command else {
            panic!("run")
        };
        assert_eq!(args.concurrent_reconciles, CONCURRENT_RECONCILES_DEFAULT);
        let err =
            Cli::try_parse_from(["sluice-operator", "run", "--concurrent-reconciles", "0"]).unwrap_err();
        assert!(err.to_string().contains("--concurrent-reconciles"), "{err}");
    }

    #[test]
    fn bad_resources_name_the_flag() {
        let err =
            Cli::try_parse_from(["sluice-operator", "run", "--sidecar-resources", "{oops"]).unwrap_err();
        assert!(err.to_string().contains("--sidecar-resources"), "{err}");
    }
}
