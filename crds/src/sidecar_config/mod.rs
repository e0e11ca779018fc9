//! The sidecar's config file: the one YAML document the operator renders from a `RateLimitPolicy` (and a
//! `JobQueue`) and `sluice-sidecar --config FILE` reads. Field names are camelCase like the CRDs'.
//!
//! Connection settings are normally left out of the file and come from the environment
//! (`SLUICE_LISTEN`, `SLUICE_UPSTREAM`, `SLUICE_REDIS_URL`, `SLUICE_DATABASE_URL`), so credentials live in
//! Secrets, never in the rendered ConfigMap. Reference: docs/sidecar-config.md.
//!
//! Layout: [`limits`] (rules, keys, algorithms, failure mode), [`queue`] (worker and queue API),
//! [`validate`](mod@validate) (every field at fault, by path).

pub mod limits;
pub mod queue;
pub mod validate;

use serde::{Deserialize, Serialize};

pub use limits::*;
pub use queue::*;
pub use validate::{ConfigErrors, FieldError, validate};

/// The version of this format the sidecar understands; a file naming another is refused.
pub const CONFIG_VERSION: u32 = 1;

/// The whole sidecar config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarConfig {
    /// Format version; must be [`CONFIG_VERSION`].
    #[serde(default = "default_version")]
    pub version: u32,
    /// Which policy this config was rendered from and at which generation (reported back as enforced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
    /// Rate limiting in front of the app. Absent: the seed tiers apply (see [`limits::default_rules`]).
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Job queue roles: the worker and the queue HTTP API for the app. Absent: neither runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueConfig>,
}

impl Default for SidecarConfig {
    /// The current format version, no policy, default limits (the seed tiers), no queue.
    fn default() -> Self {
        Self {
            version: CONFIG_VERSION,
            policy: None,
            limits: LimitsConfig::default(),
            queue: None,
        }
    }
}

/// Identity of the `RateLimitPolicy` a config was rendered from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRef {
    /// Namespace of the policy (part of every Redis key).
    pub namespace: String,
    /// Name of the policy (part of every Redis key).
    pub name: String,
    /// `metadata.generation` of the policy this config was rendered from.
    #[serde(default)]
    pub generation: i64,
}

fn default_version() -> u32 {
    CONFIG_VERSION
}
