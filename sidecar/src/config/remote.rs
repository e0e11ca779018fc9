//! Fast config propagation through Redis, for configs that name a policy.
//!
//! The operator writes the rendered YAML to key `sluice:{<ns>/<name>}:config` and publishes on the channel
//! of the same name. Each sidecar subscribes, and on a message, at start, and every
//! [`REPORT_INTERVAL`] GETs the key; a config with a higher policy generation than the running one is
//! validated and applied exactly like a file reload. Each sidecar reports what it enforces with
//! `HSET sluice:{<ns>/<name>}:enforced <pod> "<generation> <unix_ms>"` every [`REPORT_INTERVAL`] and
//! after each apply. The keys and the report are the contract's ([`sluice_crds::contract::redis`]).
//!
//! Before each config fetch (every [`REPORT_INTERVAL`] and on each message) it reads
//! `sluice:{<ns>/<name>}:pods`, how many pods enforce the policy as the operator counts them (signed the
//! same way), and hands it to the limiter, which divides each limit by it under `failureMode: local`
//! instead of the fixed `expectedReplicas`.
//!
//! Whoever can write to the Redis could push a config through this channel, so a config from Redis is
//! applied only if [`admit`] lets it in: signed by the operator when the sidecar has the operator's
//! public key (`SLUICE_CONFIG_VERIFY_KEY`, which the webhook sets in every injected sidecar), and for the
//! policy this sidecar started with. Anything else is refused like an invalid file (logged, counted in
//! `sluice_config_reloads_total{source="Redis",outcome="Rejected"}`), and the running config stays.

use std::{sync::Arc, time::Duration};

use fred::prelude::*;
use ring::signature::{ED25519, UnparsedPublicKey};
use sluice_crds::{
    contract::{
        env::CONFIG_VERIFY_KEY,
        redis::{EnforcingPods, Report, config_key, enforced_key, pods_key, split_signed},
    },
    sidecar_config::PolicyRef,
};
use tokio_util::sync::CancellationToken;

use super::{
    ConfigErrors, Effective,
    env::Env,
    load,
    reload::{ConfigSink, ReloadSource, offer},
};
use crate::clock::SharedClock;

/// How often the enforced generation is reported (and the config key re-read).
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// Deadline of each config-channel Redis command (off the request path, so longer than the limiter's).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// What the remote config task needs.
pub struct Remote {
    /// Redis URL (the limiter's).
    pub redis_url: String,
    /// CA certificates trusted for a TLS Redis besides the system's (the limiter's `caFile`).
    pub ca_file: Option<String>,
    /// The policy whose keys are watched (from the config the sidecar started with).
    pub policy: PolicyRef,
    /// Name reported in the `enforced` hash.
    pub pod: String,
    /// Env overrides applied to every fetched config.
    pub env: Arc<dyn Env>,
    /// Wall clock for the report's timestamp.
    pub clock: SharedClock,
    /// Told how many pods enforce the policy whenever the operator's count is read.
    pub on_enforcing_pods: Arc<dyn Fn(u32) + Send + Sync>,
}

/// How configs from Redis are authenticated, from `SLUICE_CONFIG_VERIFY_KEY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// No key: signed and unsigned configs alike (a sidecar run by hand, or injected by an operator that
    /// does not sign).
    Off,
    /// The operator's Ed25519 public key: only configs it signed.
    Key(Vec<u8>),
    /// The variable is set but is no key: every config from Redis is refused (fail closed).
    Broken(String),
}

impl Verification {
    /// Reads `SLUICE_CONFIG_VERIFY_KEY` (64 hex digits).
    pub fn from_env(env: &dyn Env) -> Self {
        match env.var(CONFIG_VERIFY_KEY) {
            None => Verification::Off,
            Some(v) => match unhex(v.trim()) {
                Some(key) if key.len() == 32 => Verification::Key(key),
                _ => Verification::Broken(format!(
                    "{v:?} is not an Ed25519 public key (64 hex digits); configs from Redis are refused"
                )),
            },
        }
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn refused(path: &str, message: impl Into<String>) -> ConfigErrors {
    let mut errs = ConfigErrors::default();
    errs.push(path, message);
    errs
}

/// The count of pods enforcing `policy` from the value of its `pods` key, if `verification` admits it
/// and it names `policy`.
pub fn admit_pods(text: &str, verification: &Verification, policy: &PolicyRef) -> Option<u32> {
    let body = match verification {
        Verification::Off => split_signed(text).map_or(text, |(_, body)| body),
        Verification::Broken(_) => return None,
        Verification::Key(key) => {
            let (signature, body) = split_signed(text)?;
            let sig = unhex(signature)?;
            UnparsedPublicKey::new(&ED25519, key)
                .verify(body.as_bytes(), &sig)
                .ok()?;
            body
        }
    };
    let count = EnforcingPods::parse(body)?;
    (count.namespace == policy.namespace && count.name == policy.name && count.pods > 0).then_some(count.pods)
}

/// Whether a config read from the policy's Redis key may be offered: its signature verifies (per
/// `verification`), it parses and validates, and it names `policy` (the one this sidecar started
/// with). The error names what is wrong.
pub fn admit(
    text: &str,
    verification: &Verification,
    policy: &PolicyRef,
    env: &dyn Env,
) -> Result<Effective, ConfigErrors> {
    let body = match verification {
        Verification::Off => split_signed(text).map_or(text, |(_, body)| body),
        Verification::Broken(message) => return Err(refused(CONFIG_VERIFY_KEY, message.clone())),
        Verification::Key(key) => {
            let Some((signature, body)) = split_signed(text) else {
                return Err(refused(
                    "signature",
                    "the config in Redis is not signed by the operator: ignored",
                ));
            };
            let valid = unhex(signature).is_some_and(|sig| {
                UnparsedPublicKey::new(&ED25519, key)
                    .verify(body.as_bytes(), &sig)
                    .is_ok()
            });
            if !valid {
                return Err(refused(
                    "signature",
                    "the config in Redis does not carry the operator's signature of its content: ignored",
                ));
            }
            body
        }
    };
    let candidate = load::from_yaml(body, env)?;
    match &candidate.config.policy {
        Some(p) if p.namespace == policy.namespace && p.name == policy.name => Ok(candidate),
        other => Err(refused(
            "policy",
            format!(
                "the config in Redis names policy {:?}, not {}/{} which this sidecar enforces: ignored",
                other.as_ref().map(|p| format!("{}/{}", p.namespace, p.name)),
                policy.namespace,
                policy.name
            ),
        )),
    }
}

/// Runs until `shutdown`: subscribes, fetches, applies, reports. Redis being down only delays it.
pub async fn run(
    remote: Remote,
    sink: Arc<dyn ConfigSink>,
    mut applied: tokio::sync::watch::Receiver<i64>,
    shutdown: CancellationToken,
) -> crate::Result<()> {
    let config = crate::redis::config(&remote.redis_url, remote.ca_file.as_deref())?;
    let mut builder = Builder::from_config(config);
    builder
        .with_connection_config(|c| c.connection_timeout = COMMAND_TIMEOUT)
        .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT)
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2));
    let client = builder.build().map_err(|e| crate::Error::Redis(e.to_string()))?;
    let subscriber = builder
        .build_subscriber_client()
        .map_err(|e| crate::Error::Redis(e.to_string()))?;
    client.connect();
    subscriber.connect();
    let _resubscribe = subscriber.manage_subscriptions();
    let mut messages = subscriber.message_rx();
    let key = config_key(&remote.policy.namespace, &remote.policy.name);
    let enforced = enforced_key(&remote.policy.namespace, &remote.policy.name);
    let pods = pods_key(&remote.policy.namespace, &remote.policy.name);

    let subscribe = {
        let subscriber = subscriber.clone();
        let key = key.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                match subscriber.subscribe(key.as_str()).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, "config channel: subscribe failed, retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            () = stop.cancelled() => return,
                        }
                    }
                }
            }
        })
    };

    let verification = Verification::from_env(&*remote.env);
    if let Verification::Broken(message) = &verification {
        tracing::error!("{CONFIG_VERIFY_KEY}: {message}");
    }
    let mut ticker = tokio::time::interval(REPORT_INTERVAL);
    let mut last_seen = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                fetch_pods(&client, &pods, &remote, &verification).await;
                fetch(&client, &key, &remote, &verification, &*sink, &mut last_seen).await;
                report(&client, &enforced, &remote, sink.running_generation()).await;
            }
            msg = messages.recv() => {
                match msg {
                    // The count first: once a new generation is applied (and reported), the share it
                    // runs with is the operator's latest.
                    Ok(m) if m.channel.as_bytes() == key.as_bytes() => {
                        fetch_pods(&client, &pods, &remote, &verification).await;
                        fetch(&client, &key, &remote, &verification, &*sink, &mut last_seen).await;
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        fetch_pods(&client, &pods, &remote, &verification).await;
                        fetch(&client, &key, &remote, &verification, &*sink, &mut last_seen).await;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => messages = subscriber.message_rx(),
                }
            }
            changed = applied.changed() => {
                if changed.is_ok() {
                    let generation = *applied.borrow_and_update();
                    report(&client, &enforced, &remote, generation).await;
                }
            }
            () = shutdown.cancelled() => break,
        }
    }
    subscribe.abort();
    let _ = subscriber.quit().await;
    let _ = client.quit().await;
    Ok(())
}

/// GETs the config key and offers it when it is new text with a newer generation. `last_seen` (hash of
/// the last text looked at) keeps a bad config from being logged every few seconds.
async fn fetch(
    client: &Client,
    key: &str,
    remote: &Remote,
    verification: &Verification,
    sink: &dyn ConfigSink,
    last_seen: &mut u64,
) {
    let text: Option<String> = match client.get(key).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "config key: GET failed");
            return;
        }
    };
    let Some(text) = text else { return };
    let hash = load::content_hash(text.as_bytes());
    if hash == *last_seen {
        return;
    }
    *last_seen = hash;
    let candidate = admit(&text, verification, &remote.policy, &*remote.env);
    if let Ok(c) = &candidate
        && c.generation() <= sink.running_generation()
    {
        return;
    }
    offer(sink, candidate, ReloadSource::Redis);
}

/// GETs the operator's count of enforcing pods and hands it on when it is admitted.
async fn fetch_pods(client: &Client, key: &str, remote: &Remote, verification: &Verification) {
    let text: Option<String> = match client.get(key).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "pods key: GET failed");
            return;
        }
    };
    let Some(text) = text else { return };
    match admit_pods(&text, verification, &remote.policy) {
        Some(n) => (remote.on_enforcing_pods)(n),
        None => tracing::debug!("pods key: not the operator's signed count for this policy; ignored"),
    }
}

async fn report(client: &Client, enforced: &str, remote: &Remote, generation: i64) {
    let value = Report {
        generation,
        at_ms: i64::try_from(remote.clock.now_millis()).unwrap_or(i64::MAX),
    }
    .encode();
    if let Err(e) = client
        .hset::<(), _, _>(enforced, (remote.pod.as_str(), value))
        .await
    {
        tracing::debug!(error = %e, "enforced report: HSET failed");
    }
}

#[cfg(test)]
mod tests {
    use ring::{
        rand::SystemRandom,
        signature::{Ed25519KeyPair, KeyPair},
    };
    use sluice_crds::contract::redis::signed;

    use super::*;

    fn config(namespace: &str, generation: i64) -> String {
        format!(
            "version: 1\npolicy: {{namespace: {namespace}, name: checkout, generation: {generation}}}\n\
             limits:\n  upstream: http://127.0.0.1:8080\n  rules:\n  - name: all\n    limit: {{requests: 5, window: 1m}}\n"
        )
    }

    fn ours() -> PolicyRef {
        PolicyRef {
            namespace: "shop".into(),
            name: "checkout".into(),
            generation: 1,
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    struct Operator(Ed25519KeyPair);

    impl Operator {
        fn new() -> Self {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
            Self(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
        }
        fn sign(&self, body: &str) -> String {
            signed(&hex(self.0.sign(body.as_bytes()).as_ref()), body)
        }
        fn verification(&self) -> Verification {
            let env = [(CONFIG_VERIFY_KEY, hex(self.0.public_key().as_ref()))];
            let env: std::collections::HashMap<String, String> =
                env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            Verification::from_env(&env)
        }
    }

    fn field(e: ConfigErrors) -> String {
        e.fields().map(|f| f.path.clone()).collect::<Vec<_>>().join(",")
    }

    const NO_ENV: [(&str, &str); 0] = [];

    #[test]
    fn with_the_key_only_the_operators_signature_of_this_policys_config_is_admitted() {
        let operator = Operator::new();
        let v = operator.verification();
        assert!(matches!(v, Verification::Key(_)));
        let good = admit(&operator.sign(&config("shop", 2)), &v, &ours(), &NO_ENV).unwrap();
        assert_eq!(good.generation(), 2);

        let unsigned = admit(&config("shop", 2), &v, &ours(), &NO_ENV).unwrap_err();
        assert_eq!(field(unsigned), "signature");
        let mut tampered = operator.sign(&config("shop", 2));
        tampered = tampered.replace("requests: 5", "requests: 9");
        assert_eq!(
            field(admit(&tampered, &v, &ours(), &NO_ENV).unwrap_err()),
            "signature"
        );
        let forged = Operator::new().sign(&config("shop", 2));
        assert_eq!(
            field(admit(&forged, &v, &ours(), &NO_ENV).unwrap_err()),
            "signature"
        );
        let garbage = format!("# sluice-signature: ed25519 zz\n{}", config("shop", 2));
        assert_eq!(
            field(admit(&garbage, &v, &ours(), &NO_ENV).unwrap_err()),
            "signature"
        );
    }

    #[test]
    fn another_policys_config_is_refused_even_when_signed_or_unverified() {
        let operator = Operator::new();
        let other = operator.sign(&config("other", 2));
        assert_eq!(
            field(admit(&other, &operator.verification(), &ours(), &NO_ENV).unwrap_err()),
            "policy"
        );
        assert_eq!(
            field(admit(&config("other", 2), &Verification::Off, &ours(), &NO_ENV).unwrap_err()),
            "policy"
        );
    }

    #[test]
    fn the_pods_count_is_admitted_only_signed_and_for_this_policy() {
        let operator = Operator::new();
        let v = operator.verification();
        assert_eq!(
            admit_pods(&operator.sign("shop/checkout 4"), &v, &ours()),
            Some(4)
        );
        assert_eq!(admit_pods("shop/checkout 4", &v, &ours()), None, "unsigned");
        assert_eq!(
            admit_pods(&Operator::new().sign("shop/checkout 4"), &v, &ours()),
            None
        );
        assert_eq!(admit_pods(&operator.sign("shop/other 4"), &v, &ours()), None);
        assert_eq!(admit_pods(&operator.sign("shop/checkout 0"), &v, &ours()), None);
        assert_eq!(
            admit_pods("shop/checkout 4", &Verification::Off, &ours()),
            Some(4)
        );
    }

    #[test]
    fn without_a_key_signed_and_unsigned_configs_are_admitted_and_a_bad_key_refuses_all() {
        let operator = Operator::new();
        for text in [config("shop", 2), operator.sign(&config("shop", 2))] {
            assert_eq!(
                admit(&text, &Verification::Off, &ours(), &NO_ENV)
                    .unwrap()
                    .generation(),
                2
            );
        }
        let broken = Verification::from_env(&[(CONFIG_VERIFY_KEY, "abc")]);
        assert!(matches!(broken, Verification::Broken(_)));
        assert_eq!(
            field(admit(&operator.sign(&config("shop", 2)), &broken, &ours(), &NO_ENV).unwrap_err()),
            CONFIG_VERIFY_KEY
        );
        assert_eq!(Verification::from_env(&NO_ENV), Verification::Off);
    }
}
