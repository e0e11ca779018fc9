//! How Sluice lays out its data in Redis. Every key starts with [`KEY_PREFIX`] and a Redis Cluster hash
//! tag in braces, so all keys of one policy (config and reports) or of one counter share a slot.
//!
//! - `sluice:{<ns>/<policy>}:config`: the rendered config YAML, written by the operator, its first line
//!   the operator's signature of the rest ([`signed`], [`SIGNATURE_PREFIX`]); also the channel it
//!   announces a new generation on ([`config_key`]).
//! - `sluice:{<ns>/<policy>}:pods`: how many pods enforce the policy, as the operator counts them
//!   ([`pods_key`], [`EnforcingPods`]), signed like the config; sidecars divide limits by it under
//!   `failureMode: local`.
//! - `sluice:{<ns>/<policy>}:enforced`: hash of pod name → [`Report`] (`"<generation> <unix_ms>"`),
//!   written by each sidecar every few seconds and after each apply ([`enforced_key`]).
//! - `sluice:{<ns>/<policy>/<rule>/<32 hex digits>}:<algorithm tag>:<window ms>[:<window index>]`: a
//!   rule's counters, one hash per key value ([`rule_key_prefix`] is the part before the hex digits).
//!   Keys never contain limit values or rule order, so changing a limit keeps the counters. The hex
//!   digits are an HMAC keyed with the namespace's [`COUNTER_KEY_SECRET`] (see
//!   [`super::env::COUNTER_KEY`]), so they reveal nothing of the key value to whoever reads them.

/// The Secret, in each namespace with a RateLimitPolicy, holding the key its sidecars hash counter names
/// with ([`super::env::COUNTER_KEY`]): written once by the operator (random, [`COUNTER_KEY_MIN_LEN`]
/// characters or more), never rotated by it, as a new key starts every counter afresh.
pub const COUNTER_KEY_SECRET: &str = "sluice-counter-key";
/// The key of [`COUNTER_KEY_SECRET`] holding the counter key.
pub const COUNTER_KEY_SECRET_KEY: &str = "key";
/// Fewest characters of a counter key: 32 random alphanumerics are about 190 bits.
pub const COUNTER_KEY_MIN_LEN: usize = 32;

/// The start of every key.
pub const KEY_PREFIX: &str = "sluice:";

/// `sluice:{<ns>/<name>}:config`: the key holding a policy's rendered YAML, and the channel announcing
/// a new generation of it.
pub fn config_key(namespace: &str, policy: &str) -> String {
    format!("{KEY_PREFIX}{{{namespace}/{policy}}}:config")
}

/// The first line of a signed config: this, then the Ed25519 signature of everything after the line's
/// `\n` as 128 hex digits. A YAML comment, so a reader that does not verify parses the config as it is.
pub const SIGNATURE_PREFIX: &str = "# sluice-signature: ed25519 ";

/// `signature_hex` and `body` as the config key holds them.
pub fn signed(signature_hex: &str, body: &str) -> String {
    format!("{SIGNATURE_PREFIX}{signature_hex}\n{body}")
}

/// The signature (hex) and the signed body of a config key's value; `None` when it carries no signature
/// line.
pub fn split_signed(value: &str) -> Option<(&str, &str)> {
    let rest = value.strip_prefix(SIGNATURE_PREFIX)?;
    let (signature, body) = rest.split_once('\n')?;
    Some((signature.trim_end_matches('\r'), body))
}

/// `sluice:{<ns>/<name>}:pods`: the [`EnforcingPods`] count of a policy.
pub fn pods_key(namespace: &str, policy: &str) -> String {
    format!("{KEY_PREFIX}{{{namespace}/{policy}}}:pods")
}

/// How many pods enforce a policy, as the operator counts them (governed pods that are running). The
/// signed body names the policy, so a count cannot be replayed onto another policy's key:
/// `"<ns>/<name> <pods>"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnforcingPods {
    /// The policy's namespace.
    pub namespace: String,
    /// The policy's name.
    pub name: String,
    /// The count (at least 1 when published).
    pub pods: u32,
}

impl EnforcingPods {
    /// `"<ns>/<name> <pods>"`.
    pub fn encode(&self) -> String {
        format!("{}/{} {}", self.namespace, self.name, self.pods)
    }

    /// Reads a body; `None` for anything but `"<ns>/<name> <pods>"`.
    pub fn parse(body: &str) -> Option<Self> {
        let (policy, pods) = body.trim().split_once(' ')?;
        let (namespace, name) = policy.split_once('/')?;
        Some(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            pods: pods.trim().parse().ok()?,
        })
    }
}

/// `sluice:{<ns>/<name>}:enforced`: hash of pod name → [`Report`].
pub fn enforced_key(namespace: &str, policy: &str) -> String {
    format!("{KEY_PREFIX}{{{namespace}/{policy}}}:enforced")
}

/// `sluice:{<ns>/<policy>/<rule>/`: the readable start of every counter key of a rule. Braces and `%` in
/// the names are percent-encoded, so a name cannot close the hash tag early.
pub fn rule_key_prefix(namespace: &str, policy: &str, rule: &str) -> String {
    format!(
        "{KEY_PREFIX}{{{}/{}/{}/",
        escape(namespace),
        escape(policy),
        escape(rule)
    )
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out
}

/// One pod's entry in the `enforced` hash: the policy generation its sidecar enforces, and when it said
/// so. Written as `"<generation> <unix_ms>"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Policy generation the sidecar enforces.
    pub generation: i64,
    /// When it reported, in Unix milliseconds.
    pub at_ms: i64,
}

impl Report {
    /// The hash value: `"<generation> <unix_ms>"`.
    pub fn encode(&self) -> String {
        format!("{} {}", self.generation, self.at_ms)
    }

    /// Reads a hash value; `None` for anything but `"<generation> <unix_ms>"`.
    pub fn parse(value: &str) -> Option<Self> {
        let (generation, at) = value.trim().split_once(' ')?;
        Some(Self {
            generation: generation.parse().ok()?,
            at_ms: at.trim().parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policys_keys_share_one_cluster_slot() {
        assert_eq!(config_key("shop", "api"), "sluice:{shop/api}:config");
        assert_eq!(enforced_key("shop", "api"), "sluice:{shop/api}:enforced");
    }

    #[test]
    fn a_signed_value_splits_into_signature_and_body() {
        let v = signed("ab12", "policy:\n  generation: 3\n");
        assert!(v.starts_with("# sluice-signature: ed25519 ab12\n"));
        assert_eq!(split_signed(&v), Some(("ab12", "policy:\n  generation: 3\n")));
        assert_eq!(split_signed("policy: {}\n"), None);
    }

    #[test]
    fn enforcing_pods_round_trip_and_name_their_policy() {
        let p = EnforcingPods {
            namespace: "shop".into(),
            name: "api".into(),
            pods: 7,
        };
        assert_eq!(p.encode(), "shop/api 7");
        assert_eq!(EnforcingPods::parse(&p.encode()), Some(p));
        assert_eq!(pods_key("shop", "api"), "sluice:{shop/api}:pods");
        for bad in ["", "7", "shop 7", "shop/api x", "shop/api -1"] {
            assert_eq!(EnforcingPods::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_cannot_close_the_hash_tag() {
        assert_eq!(rule_key_prefix("a", "b}", "c%"), "sluice:{a/b%7D/c%25/");
    }

    #[test]
    fn reports_round_trip_and_garbage_is_refused() {
        let r = Report {
            generation: 7,
            at_ms: 1_700_000_000_000,
        };
        assert_eq!(r.encode(), "7 1700000000000");
        assert_eq!(Report::parse(&r.encode()), Some(r));
        for bad in ["", "7", "x 1", "7 y", "7 1 2"] {
            assert_eq!(Report::parse(bad), None, "{bad}");
        }
    }
}
