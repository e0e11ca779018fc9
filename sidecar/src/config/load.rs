//! Reading a config: YAML text → [`SidecarConfig`] (serde errors keep the field path) → env overrides →
//! seed tiers when no rules are named → [`validate`](super::validate()).

use std::{
    hash::{DefaultHasher, Hasher},
    path::Path,
};

use sluice_crds::sidecar_config::{SidecarConfig, default_rules};

use super::{
    ConfigErrors, Effective,
    env::{self, Env},
    validate,
};

/// Parses YAML into the schema. A serde error (unknown field, wrong type, bad duration) names the field
/// at fault by its path. serde_yaml's own path stops at the enclosing mapping for errors a value raises
/// (a bad duration), so the path is tracked with `serde_path_to_error`, which reaches the field itself.
pub fn parse(text: &str) -> Result<SidecarConfig, ConfigErrors> {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| {
        let tracked = e.path().to_string();
        let inner = e.inner().to_string();
        // serde_yaml prefixes its message with its own (shorter) path; keep only the message.
        let message = split_path(&inner).map_or(inner.as_str(), |(_, m)| m);
        let path = if tracked == "." { "" } else { tracked.as_str() };
        let mut errs = ConfigErrors::default();
        errs.push(path, message);
        errs
    })
}

/// `a.b[0].c: message` → (`a.b[0].c`, `message`); `None` when the message names no path.
fn split_path(msg: &str) -> Option<(&str, &str)> {
    let (path, rest) = msg.split_once(": ")?;
    let looks_like_path = !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']' | '_' | '-'));
    looks_like_path.then_some((path, rest))
}

/// Turns a parsed file into what runs: env overrides applied, the seed tiers filled in when the file
/// names no rules, everything validated.
pub fn resolve(mut config: SidecarConfig, env: &dyn Env) -> Result<Effective, ConfigErrors> {
    let settings = env::apply(&mut config, env)?;
    let seed_tiers = config.limits.rules.is_empty();
    if seed_tiers {
        config.limits.rules = default_rules(settings.tiers);
    }
    validate(&config)?;
    Ok(Effective {
        config,
        limiting_enabled: settings.enabled,
        seed_tiers,
    })
}

/// Parses and resolves YAML text.
pub fn from_yaml(text: &str, env: &dyn Env) -> Result<Effective, ConfigErrors> {
    resolve(parse(text)?, env)
}

/// The config of a sidecar started without `--config`: defaults, env overrides, the seed tiers.
pub fn from_env(env: &dyn Env) -> Result<Effective, ConfigErrors> {
    resolve(SidecarConfig::default(), env)
}

/// Reads a file (following symlinks, as a ConfigMap volume needs) and returns its text and its hash.
pub fn read(path: &Path) -> Result<(String, u64), ConfigErrors> {
    let bytes = std::fs::read(path).map_err(|e| {
        let mut errs = ConfigErrors::default();
        errs.push("", format!("cannot read {}: {e}", path.display()));
        errs
    })?;
    let hash = content_hash(&bytes);
    let text = String::from_utf8(bytes).map_err(|_| {
        let mut errs = ConfigErrors::default();
        errs.push("", format!("{} is not UTF-8 text", path.display()));
        errs
    })?;
    Ok((text, hash))
}

/// Reads, parses and resolves a config file.
pub fn from_file(path: &Path, env: &dyn Env) -> Result<Effective, ConfigErrors> {
    let (text, _) = read(path)?;
    from_yaml(&text, env)
}

/// A hash of the file's bytes: reload compares it, not modification times, which a ConfigMap symlink
/// swap does not reliably change.
pub fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_ENV: &[(&str, &str); 0] = &[];

    #[test]
    fn an_unknown_field_is_named_with_its_path() {
        let err = parse("limits:\n  rules:\n  - name: a\n    limit: {requests: 1, window: 1m, brust: 3}\n")
            .unwrap_err();
        let field = err.fields().next().unwrap();
        assert_eq!(field.path, "limits.rules[0].limit.brust");
        assert!(field.message.contains("unknown field `brust`"), "{err}");
    }

    #[test]
    fn a_wrong_type_is_named_with_its_path() {
        let err = parse("limits:\n  expectedReplicas: many\n").unwrap_err();
        assert_eq!(err.fields().next().unwrap().path, "limits.expectedReplicas");
    }

    #[test]
    fn a_bad_duration_is_named_with_its_path() {
        let err =
            parse("limits:\n  rules:\n  - name: a\n    limit: {requests: 1, window: 5x}\n").unwrap_err();
        assert_eq!(err.fields().next().unwrap().path, "limits.rules[0].limit.window");
    }

    #[test]
    fn no_rules_means_the_seed_tiers() {
        let e = from_yaml("version: 1\n", NO_ENV).unwrap();
        assert!(e.seed_tiers);
        let names: Vec<_> = e.config.limits.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["auth", "write", "read", "protocol"]);
    }

    #[test]
    fn running_on_env_vars_alone_honours_the_adr_variables() {
        let env = &[(sluice_crds::contract::env::RATE_LIMIT_READ, "7")];
        let e = from_env(env).unwrap();
        let read = e.config.limits.rules.iter().find(|r| r.name == "read").unwrap();
        assert_eq!(read.limit.requests, 7);
        assert!(e.limiting_enabled);
    }
}
