//! Environment overrides, one mechanism for both roles: connection settings (`SLUICE_LISTEN`,
//! `SLUICE_UPSTREAM`, `SLUICE_REDIS_URL`, `SLUICE_DATABASE_URL`, ...) that come from the pod spec and
//! Secrets rather than the rendered ConfigMap, and the seed tiers' `RATE_LIMIT__*` variables for running on
//! env vars alone. The names are the contract's ([`sluice_crds::contract::env`]); every variable at fault
//! is named, not only the first.

use std::collections::HashMap;

use sluice_crds::{
    contract::env::*,
    sidecar_config::{
        ApiAuthMode, ConfigErrors, CounterKey, LoopbackCallers, QueueConfig, SidecarConfig, TierLimits,
        validate::check_upstream_url,
    },
};

/// Where overrides are read from: the process environment in the binary, a map in tests.
pub trait Env: Send + Sync {
    /// The value of `name`, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;

    /// Whether `name` is set at all, even empty or not UTF-8 (for a variable whose absence means
    /// something else than a bad value).
    fn is_set(&self, name: &str) -> bool;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }

    fn is_set(&self, name: &str) -> bool {
        std::env::var_os(name).is_some()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned().filter(|v| !v.trim().is_empty())
    }

    fn is_set(&self, name: &str) -> bool {
        self.contains_key(name)
    }
}

impl<const N: usize> Env for [(&str, &str); N] {
    fn var(&self, name: &str) -> Option<String> {
        self.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
            .filter(|v| !v.trim().is_empty())
    }

    fn is_set(&self, name: &str) -> bool {
        self.iter().any(|(k, _)| *k == name)
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
    if let Some(v) = env.var(LISTEN) {
        match v.trim().parse() {
            Ok(addr) => config.limits.listen = addr,
            Err(_) => errs.push(LISTEN, format!("{v:?} is not an address like 0.0.0.0:8080")),
        }
    }
    if let Some(v) = env.var(ADMIN_LISTEN) {
        match v.trim().parse() {
            Ok(addr) => config.limits.admin_listen = addr,
            Err(_) => errs.push(ADMIN_LISTEN, format!("{v:?} is not an address like 0.0.0.0:9901")),
        }
    }
    if let Some(v) = env.var(UPSTREAM) {
        match check_upstream_url(v.trim()) {
            Ok(_) => config.limits.upstream = v.trim().to_owned(),
            Err(msg) => errs.push(UPSTREAM, msg),
        }
    }
    if let Some(v) = env.var(REDIS_URL) {
        config.limits.redis.url = Some(v.trim().to_owned());
    }
    if let Some(v) = env.var(REDIS_CA_FILE) {
        config.limits.redis.ca_file = Some(v.trim().to_owned());
    }
    // Set but unusable is an error, not "unset": sidecars with and without a key would count apart.
    match env.var(COUNTER_KEY) {
        Some(v) => match CounterKey::new(&v) {
            Ok(key) => config.limits.redis.counter_key = Some(key),
            Err(msg) => errs.push(COUNTER_KEY, format!("the key {msg}")),
        },
        None if env.is_set(COUNTER_KEY) => {
            errs.push(COUNTER_KEY, "is set but empty, blank or not UTF-8".to_owned());
        }
        None => {}
    }
    let enabled = match env.var(RATE_LIMIT_ENABLED).as_deref().map(str::trim) {
        None => true,
        Some("true" | "1" | "yes" | "on") => true,
        Some("false" | "0" | "no" | "off") => false,
        Some(other) => {
            errs.push(RATE_LIMIT_ENABLED, format!("{other:?} is not true or false"));
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
        auth: tier(RATE_LIMIT_AUTH, defaults.auth),
        write: tier(RATE_LIMIT_WRITE, defaults.write),
        read: tier(RATE_LIMIT_READ, defaults.read),
        protocol: tier(RATE_LIMIT_PROTOCOL, defaults.protocol),
    };
    if errs.is_empty() {
        Ok(EnvSettings { enabled, tiers })
    } else {
        Err(errs)
    }
}

/// Applies the queue overrides (`SLUICE_DATABASE_URL`, `SLUICE_QUEUES`, `SLUICE_QUEUE_NAMESPACE`,
/// `SLUICE_HANDLER_URL`, `SLUICE_WORKER_CONCURRENCY`, `SLUICE_WORKER_CLAIM_BATCH`,
/// `SLUICE_API_LISTEN`, `SLUICE_API_ANSWER_DEADLINE`, `SLUICE_API_AUTH`,
/// `SLUICE_API_AUTH_LOOPBACK`, `SLUICE_POD_NAMESPACE`, `SLUICE_POD_SERVICE_ACCOUNT`, `SLUICE_METRICS_LISTEN`,
/// `SLUICE_GRPC_LISTEN`) to the
/// `queue:` section:
/// the worker role's whole config when it runs without a file, and the proxy role's queue API.
pub fn apply_queue(cfg: &mut QueueConfig, env: &dyn Env) -> Result<(), ConfigErrors> {
    let mut errs = ConfigErrors::default();
    if let Some(v) = env.var(DATABASE_URL) {
        cfg.database_url = Some(v);
    }
    if let Some(v) = env.var(QUEUES) {
        cfg.queues = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
    }
    if let Some(v) = env.var(QUEUE_NAMESPACE) {
        let v = v.trim();
        cfg.namespace = (!v.is_empty()).then(|| v.to_owned());
    }
    if let Some(v) = env.var(HANDLER_URL) {
        cfg.handler.url = v;
    }
    if let Some(v) = env.var(WORKER_CONCURRENCY) {
        match v.trim().parse() {
            Ok(n) => cfg.worker.concurrency = n,
            Err(_) => errs.push(WORKER_CONCURRENCY, format!("{v:?} is not a number")),
        }
    }
    if let Some(v) = env.var(WORKER_CLAIM_BATCH) {
        match v.trim().parse() {
            Ok(n) if n > 0 => cfg.worker.claim_batch = n,
            _ => errs.push(WORKER_CLAIM_BATCH, format!("{v:?} is not a number above 0")),
        }
    }
    if let Some(v) = env.var(API_LISTEN) {
        match v.trim().parse() {
            Ok(addr) => cfg.api.listen = Some(addr),
            Err(_) => errs.push(API_LISTEN, format!("{v:?} is not an address like 127.0.0.1:7070")),
        }
    }
    if let Some(v) = env.var(API_ANSWER_DEADLINE) {
        match v.trim().parse::<sluice_crds::duration::Duration>() {
            Ok(d) if !d.get().is_zero() => cfg.api.answer_deadline = d,
            _ => errs.push(
                API_ANSWER_DEADLINE,
                format!("{v:?} is not a duration above 0 like 5s or 500ms"),
            ),
        }
    }
    if let Some(v) = env.var(METRICS_LISTEN) {
        match v.trim().parse() {
            Ok(addr) => cfg.worker.metrics_listen = addr,
            Err(_) => errs.push(
                METRICS_LISTEN,
                format!("{v:?} is not an address like 0.0.0.0:9902"),
            ),
        }
    }
    if let Some(v) = env.var(API_AUTH) {
        match v.trim() {
            "off" => cfg.api.auth.mode = ApiAuthMode::Off,
            "kubernetes" => cfg.api.auth.mode = ApiAuthMode::Kubernetes,
            _ => errs.push(API_AUTH, format!("{v:?} is neither `kubernetes` nor `off`")),
        }
    }
    if let Some(v) = env.var(API_AUTH_LOOPBACK) {
        match v.trim() {
            "pod" => cfg.api.auth.loopback = LoopbackCallers::Pod,
            "token" => cfg.api.auth.loopback = LoopbackCallers::Token,
            _ => errs.push(API_AUTH_LOOPBACK, format!("{v:?} is neither `pod` nor `token`")),
        }
    }
    if let Some(v) = env.var(POD_NAMESPACE).filter(|v| !v.trim().is_empty()) {
        cfg.api.auth.namespace = Some(v.trim().to_owned());
    }
    if let Some(v) = env.var(POD_SERVICE_ACCOUNT).filter(|v| !v.trim().is_empty()) {
        cfg.api.auth.service_account = Some(v.trim().to_owned());
    }
    if let Some(v) = env.var(API_JOB_QUEUES) {
        for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((queue, jq)) if !queue.trim().is_empty() && !jq.trim().is_empty() => {
                    cfg.api
                        .auth
                        .job_queues
                        .insert(queue.trim().to_owned(), jq.trim().to_owned());
                }
                _ => errs.push(API_JOB_QUEUES, format!("{pair:?} is not queue=jobqueue")),
            }
        }
    }
    if let Some(v) = env.var(GRPC_LISTEN) {
        match v.trim().parse() {
            Ok(addr) => cfg.grpc.listen = Some(addr),
            Err(_) => errs.push(
                GRPC_LISTEN,
                format!("{v:?} is not an address like 127.0.0.1:9903"),
            ),
        }
    }
    errs.into_result()
}

/// This pod's name: `SLUICE_POD_NAME` (the downward API), else `HOSTNAME`, else `/etc/hostname`, else
/// `unknown`. Names the pod's `enforced` report and starts its workers' lease owner.
pub fn pod_name(env: &dyn Env) -> String {
    env.var(POD_NAME)
        .or_else(|| env.var("HOSTNAME"))
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_overrides_replace_file_values() {
        let mut c = SidecarConfig::default();
        let env = &[
            (LISTEN, "127.0.0.1:1234"),
            (UPSTREAM, "http://127.0.0.1:9"),
            (REDIS_URL, "redis://r:6380"),
        ];
        apply(&mut c, env).unwrap();
        assert_eq!(c.limits.listen.to_string(), "127.0.0.1:1234");
        assert_eq!(c.limits.upstream, "http://127.0.0.1:9");
        assert_eq!(c.limits.redis.url.as_deref(), Some("redis://r:6380"));
    }

    #[test]
    fn the_counter_key_comes_from_its_variable_and_never_shows() {
        let key = "k".repeat(40);
        let mut c = SidecarConfig::default();
        apply(&mut c, &[(COUNTER_KEY, key.as_str())]).unwrap();
        let got = c.limits.redis.counter_key.as_ref().expect("the key is set");
        assert_eq!(got.as_bytes(), key.as_bytes());
        // Neither a config's Debug nor its serialized form carries it.
        assert!(!format!("{c:?}").contains(&key), "Debug shows the key");
        assert!(
            !serde_yaml::to_string(&c).unwrap().contains(&key),
            "the YAML carries the key"
        );
    }

    #[test]
    fn a_short_or_padded_counter_key_is_refused_without_its_value() {
        for bad in ["short-key", &format!("{}\n", "k".repeat(40)), "", "  "] {
            let err = apply(&mut SidecarConfig::default(), &[(COUNTER_KEY, bad)])
                .unwrap_err()
                .to_string();
            assert!(err.contains(COUNTER_KEY), "{err}");
            assert!(
                !err.contains("short-key") && !err.contains("kkkk"),
                "the value shows: {err}"
            );
        }
    }

    #[test]
    fn the_tier_variables_set_the_seed_limits() {
        let env = &[(RATE_LIMIT_AUTH, "3"), (RATE_LIMIT_ENABLED, "false")];
        let s = apply(&mut SidecarConfig::default(), env).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.tiers.auth, 3);
        assert_eq!(s.tiers.read, TierLimits::default().read);
    }

    #[test]
    fn a_bad_variable_is_named() {
        let env = &[(RATE_LIMIT_WRITE, "lots"), (LISTEN, "8080")];
        let err = apply(&mut SidecarConfig::default(), env).unwrap_err().to_string();
        assert!(err.contains(LISTEN) && err.contains(RATE_LIMIT_WRITE), "{err}");
    }

    #[test]
    fn queue_variables_alone_configure_a_worker() {
        let mut cfg = QueueConfig::default();
        let env = &[
            (DATABASE_URL, "postgres://x/y"),
            (QUEUES, "emails, reports"),
            (HANDLER_URL, "http://127.0.0.1:9/jobs"),
            (WORKER_CONCURRENCY, "4"),
            (WORKER_CLAIM_BATCH, "250"),
            (API_LISTEN, "127.0.0.1:7070"),
            (API_ANSWER_DEADLINE, "1500ms"),
            (QUEUE_NAMESPACE, "shop"),
        ];
        apply_queue(&mut cfg, env).unwrap();
        assert_eq!(cfg.queues, vec!["emails", "reports"]);
        assert_eq!(cfg.namespace.as_deref(), Some("shop"));
        assert_eq!(cfg.worker.concurrency, 4);
        assert_eq!(cfg.worker.claim_batch, 250);
        assert_eq!(cfg.handler.url, "http://127.0.0.1:9/jobs");
        assert_eq!(cfg.api.listen, Some("127.0.0.1:7070".parse().unwrap()));
        assert_eq!(cfg.api.answer_deadline.as_millis(), 1500);
    }

    #[test]
    fn every_bad_queue_variable_is_named() {
        let env = &[
            (WORKER_CONCURRENCY, "many"),
            (WORKER_CLAIM_BATCH, "0"),
            (API_LISTEN, "7070"),
            (API_ANSWER_DEADLINE, "0s"),
        ];
        let err = apply_queue(&mut QueueConfig::default(), env)
            .unwrap_err()
            .to_string();
        for name in [
            WORKER_CONCURRENCY,
            WORKER_CLAIM_BATCH,
            API_LISTEN,
            API_ANSWER_DEADLINE,
        ] {
            assert!(err.contains(name), "{name} not in {err}");
        }
    }

    #[test]
    fn the_api_auth_variables_set_the_mode_loopback_callers_and_the_pods_identity() {
        let env = &[
            (API_AUTH, "kubernetes"),
            (API_AUTH_LOOPBACK, "token"),
            (POD_NAMESPACE, "shop"),
            (POD_SERVICE_ACCOUNT, "web"),
            (API_JOB_QUEUES, "email-jobs=emails, report-jobs=reports"),
        ];
        let mut cfg = QueueConfig::default();
        apply_queue(&mut cfg, env).unwrap();
        assert_eq!(cfg.api.auth.mode, ApiAuthMode::Kubernetes);
        assert_eq!(cfg.api.auth.loopback, LoopbackCallers::Token);
        assert_eq!(cfg.api.auth.namespace.as_deref(), Some("shop"));
        assert_eq!(cfg.api.auth.service_account.as_deref(), Some("web"));
        assert_eq!(cfg.api.auth.job_queues["email-jobs"], "emails");
        assert_eq!(cfg.api.auth.job_queues.len(), 2);
        let bad = &[
            (API_AUTH, "on"),
            (API_AUTH_LOOPBACK, "anyone"),
            (API_JOB_QUEUES, "emails"),
        ];
        let err = apply_queue(&mut QueueConfig::default(), bad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(API_AUTH) && err.contains(API_AUTH_LOOPBACK) && err.contains(API_JOB_QUEUES),
            "{err}"
        );
    }
}
