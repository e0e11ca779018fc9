//! Environment overrides: connection settings (`SLUICE_LISTEN`, `SLUICE_UPSTREAM`, `SLUICE_REDIS_URL`)
//! that come from the pod spec and Secrets rather than the rendered ConfigMap, and the seed ADR's
//! `RATE_LIMIT__*` variables for running on env vars alone.

use std::collections::HashMap;

use sluice_crds::sidecar_config::{SidecarConfig, TierLimits};

use super::validate::{ConfigErrors, check_upstream_url};

/// Overrides `limits.listen`.
pub const LISTEN_VAR: &str = "SLUICE_LISTEN";
/// Overrides `limits.upstream`.
pub const UPSTREAM_VAR: &str = "SLUICE_UPSTREAM";
/// Overrides `limits.redis.url`.
pub const REDIS_URL_VAR: &str = "SLUICE_REDIS_URL";
/// Overrides `limits.adminListen`.
pub const ADMIN_LISTEN_VAR: &str = "SLUICE_ADMIN_LISTEN";
/// `false` turns rate limiting off (the proxy still forwards, reports and logs).
pub const ENABLED_VAR: &str = "RATE_LIMIT__ENABLED";
/// Per-minute limit of the seed `auth` tier.
pub const AUTH_VAR: &str = "RATE_LIMIT__AUTH_REQUESTS_PER_MINUTE";
/// Per-minute limit of the seed `write` tier.
pub const WRITE_VAR: &str = "RATE_LIMIT__WRITE_REQUESTS_PER_MINUTE";
/// Per-minute limit of the seed `read` tier.
pub const READ_VAR: &str = "RATE_LIMIT__READ_REQUESTS_PER_MINUTE";
/// Per-minute limit of the seed `protocol` tier.
pub const PROTOCOL_VAR: &str = "RATE_LIMIT__PROTOCOL_REQUESTS_PER_MINUTE";

/// Where overrides are read from: the process environment in the binary, a map in tests.
pub trait Env: Send + Sync {
    /// The value of `name`, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned().filter(|v| !v.trim().is_empty())
    }
}

impl<const N: usize> Env for [(&str, &str); N] {
    fn var(&self, name: &str) -> Option<String> {
        self.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
            .filter(|v| !v.trim().is_empty())
    }
}

/// What the environment says beyond the file: whether limiting is on, and the seed tiers' limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvSettings {
    /// `RATE_LIMIT__ENABLED` (default true).
    pub enabled: bool,
    /// `RATE_LIMIT__*_REQUESTS_PER_MINUTE`, used when the config names no rules.
    pub tiers: TierLimits,
}

/// Applies the connection overrides to `config` and reads the `RATE_LIMIT__*` settings; names the
/// variable at fault.
pub fn apply(config: &mut SidecarConfig, env: &dyn Env) -> Result<EnvSettings, ConfigErrors> {
    let mut errs = ConfigErrors::default();
    if let Some(v) = env.var(LISTEN_VAR) {
        match v.trim().parse() {
            Ok(addr) => config.limits.listen = addr,
            Err(_) => errs.push(LISTEN_VAR, format!("{v:?} is not an address like 0.0.0.0:8080")),
        }
    }
    if let Some(v) = env.var(ADMIN_LISTEN_VAR) {
        match v.trim().parse() {
            Ok(addr) => config.limits.admin_listen = addr,
            Err(_) => errs.push(
                ADMIN_LISTEN_VAR,
                format!("{v:?} is not an address like 0.0.0.0:9901"),
            ),
        }
    }
    if let Some(v) = env.var(UPSTREAM_VAR) {
        match check_upstream_url(v.trim()) {
            Ok(_) => config.limits.upstream = v.trim().to_owned(),
            Err(msg) => errs.push(UPSTREAM_VAR, msg),
        }
    }
    if let Some(v) = env.var(REDIS_URL_VAR) {
        config.limits.redis.url = Some(v.trim().to_owned());
    }
    let enabled = match env.var(ENABLED_VAR).as_deref().map(str::trim) {
        None => true,
        Some("true" | "1" | "yes" | "on") => true,
        Some("false" | "0" | "no" | "off") => false,
        Some(other) => {
            errs.push(ENABLED_VAR, format!("{other:?} is not true or false"));
            true
        }
    };
    let defaults = TierLimits::default();
    let mut tier = |name: &str, default: u64| match env.var(name) {
        None => default,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                errs.push(name, format!("{v:?} is not a whole number of requests above 0"));
                default
            }
        },
    };
    let tiers = TierLimits {
        auth: tier(AUTH_VAR, defaults.auth),
        write: tier(WRITE_VAR, defaults.write),
        read: tier(READ_VAR, defaults.read),
        protocol: tier(PROTOCOL_VAR, defaults.protocol),
    };
    if errs.is_empty() {
        Ok(EnvSettings { enabled, tiers })
    } else {
        Err(errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_overrides_replace_file_values() {
        let mut c = SidecarConfig::default();
        let env = &[
            (LISTEN_VAR, "127.0.0.1:1234"),
            (UPSTREAM_VAR, "http://127.0.0.1:9"),
            (REDIS_URL_VAR, "redis://r:6380"),
        ];
        apply(&mut c, env).unwrap();
        assert_eq!(c.limits.listen.to_string(), "127.0.0.1:1234");
        assert_eq!(c.limits.upstream, "http://127.0.0.1:9");
        assert_eq!(c.limits.redis.url.as_deref(), Some("redis://r:6380"));
    }

    #[test]
    fn the_adr_tier_variables_set_the_seed_limits() {
        let env = &[(AUTH_VAR, "3"), (ENABLED_VAR, "false")];
        let s = apply(&mut SidecarConfig::default(), env).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.tiers.auth, 3);
        assert_eq!(s.tiers.read, TierLimits::default().read);
    }

    #[test]
    fn a_bad_variable_is_named() {
        let env = &[(WRITE_VAR, "lots"), (LISTEN_VAR, "8080")];
        let err = apply(&mut SidecarConfig::default(), env).unwrap_err().to_string();
        assert!(err.contains(LISTEN_VAR) && err.contains(WRITE_VAR), "{err}");
    }
}
