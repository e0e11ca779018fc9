//! Condition types and reasons shared by Sluice's custom resources.
//!
//! Conditions are standard `metav1.Condition`s (`type`, `status`, `reason`, `message`,
//! `observedGeneration`, `lastTransitionTime`). The names live here, next to the API types, so that
//! users, the docs and the controllers agree on one spelling.

/// The resource does what it asks for: for a `RateLimitPolicy`, its config is rendered, published
/// and enforced by every selected pod.
pub const READY: &str = "Ready";
/// The resource works, but not fully: some pods lag behind, or a dependency is sick.
pub const DEGRADED: &str = "Degraded";

/// Reasons a condition may carry. Each is a short `PascalCase` word, as the API conventions ask.
pub mod reason {
    /// Every selected pod enforces the current generation.
    pub const ENFORCED: &str = "Enforced";
    /// The config is published and some selected pods do not enforce it yet.
    pub const PROPAGATING: &str = "Propagating";
    /// The config is published and no pod is selected yet.
    pub const NO_PODS: &str = "NoPods";
    /// The spec passed the CRD's validation but cannot be rendered (e.g. a regular expression the
    /// sidecar's engine rejects).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The Secret named by `spec.redis.secretRef` does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The Secret exists but lacks the key named by `spec.redis.secretRef.key`.
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// Redis could not be reached to publish the config.
    pub const REDIS_UNREACHABLE: &str = "RedisUnreachable";
    /// Some selected pods report an older generation, or nothing at all, well after publication.
    pub const PODS_LAGGING: &str = "PodsLagging";
    /// Nothing is wrong.
    pub const AS_EXPECTED: &str = "AsExpected";
}
