//! Loading the sidecar config: the YAML file, env overrides, validation naming the field at fault, and
//! hot reload (file polling and the Redis channel).
//!
//! Layout: [`load`] (parse, env, seed tiers, validate), [`env`](mod@env) (overrides), [`reload`] (file watch by
//! content hash), [`remote`] (Redis channel and the `enforced` report). The validation itself is the
//! config schema's, in `sluice_crds::sidecar_config::validate`, shared with the operator.

pub mod env;
pub mod load;
pub mod reload;
pub mod remote;

use sluice_crds::sidecar_config::SidecarConfig;

pub use sluice_crds::sidecar_config::{ConfigErrors, FieldError, validate};

/// A config ready to run: env overrides applied, seed tiers filled in, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// The config, with `limits.rules` never empty.
    pub config: SidecarConfig,
    /// `RATE_LIMIT__ENABLED`: when false, requests are forwarded without a decision.
    pub limiting_enabled: bool,
    /// Whether the rules are the seed tiers because the config named none.
    pub seed_tiers: bool,
}

impl Effective {
    /// The policy generation this config was rendered from (0 when it names no policy).
    pub fn generation(&self) -> i64 {
        self.config.policy.as_ref().map_or(0, |p| p.generation)
    }
}
