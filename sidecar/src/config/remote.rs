//! Fast config propagation through Redis, for configs that name a policy.
//!
//! The operator writes the rendered YAML to key `sluice:{<ns>/<name>}:config` and publishes on the channel
//! of the same name. Each sidecar subscribes, and on a message, at start, and every
//! [`REPORT_INTERVAL`] GETs the key; a config with a higher policy generation than the running one is
//! validated and applied exactly like a file reload. Each sidecar reports what it enforces with
//! `HSET sluice:{<ns>/<name>}:enforced <pod> "<generation> <unix_ms>"` every [`REPORT_INTERVAL`] and
//! after each apply. The keys and the report are the contract's ([`sluice_crds::contract::redis`]).

use std::{sync::Arc, time::Duration};

use fred::prelude::*;
use sluice_crds::{
    contract::redis::{Report, config_key, enforced_key},
    sidecar_config::PolicyRef,
};
use tokio_util::sync::CancellationToken;

use super::{
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

    let mut ticker = tokio::time::interval(REPORT_INTERVAL);
    let mut last_seen = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                fetch(&client, &key, &remote, &*sink, &mut last_seen).await;
                report(&client, &enforced, &remote, sink.running_generation()).await;
            }
            msg = messages.recv() => {
                match msg {
                    Ok(m) if m.channel.as_bytes() == key.as_bytes() => fetch(&client, &key, &remote, &*sink, &mut last_seen).await,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => fetch(&client, &key, &remote, &*sink, &mut last_seen).await,
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
async fn fetch(client: &Client, key: &str, remote: &Remote, sink: &dyn ConfigSink, last_seen: &mut u64) {
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
    let candidate = load::from_yaml(&text, &*remote.env);
    if let Ok(c) = &candidate
        && c.generation() <= sink.running_generation()
    {
        return;
    }
    offer(sink, candidate, ReloadSource::Redis);
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
