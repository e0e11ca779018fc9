//! Publishing rendered config through Redis, and reading back which generation each pod enforces.
//!
//! The sidecar's side of this contract is `sluice_sidecar::config::remote`: sidecars subscribe to
//! channel `sluice:{<ns>/<name>}:config`, GET the key of the same name when a message arrives, apply a
//! higher generation like a file reload, and report `HSET sluice:{<ns>/<name>}:enforced <pod>
//! "<generation> <unix_ms>"` every 5 s and after each apply. A ConfigMap volume alone takes about a
//! minute to reach a running pod; this path takes well under a second.

use std::{collections::HashMap, time::Duration};

use fred::prelude::*;
use sluice_crds::sidecar_config::PolicyRef;
use sluice_sidecar::config::remote;
use tokio::sync::Mutex;

use crate::{Error, Result};

/// Deadline of connecting and of each command the operator sends.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

fn policy_ref(namespace: &str, name: &str) -> PolicyRef {
    PolicyRef {
        namespace: namespace.into(),
        name: name.into(),
        generation: 0,
    }
}

/// `sluice:{<ns>/<name>}:config`: the key holding the rendered YAML, and the channel announcing it.
/// The sidecar's own function, so both ends of the contract spell it the same.
pub fn config_key(namespace: &str, name: &str) -> String {
    remote::config_key(&policy_ref(namespace, name))
}

/// `sluice:{<ns>/<name>}:enforced`: hash of pod name → `"<generation> <unix_ms>"`.
pub fn enforced_key(namespace: &str, name: &str) -> String {
    remote::enforced_key(&policy_ref(namespace, name))
}

/// One pod's report: the generation it enforces and when it said so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Policy generation the sidecar enforces.
    pub generation: i64,
    /// When it reported, in Unix milliseconds.
    pub at_ms: i64,
}

/// Parse one `enforced` hash value (`"<generation> <unix_ms>"`); `None` for anything else.
pub fn parse_report(value: &str) -> Option<Report> {
    let (generation, at) = value.trim().split_once(' ')?;
    Some(Report {
        generation: generation.parse().ok()?,
        at_ms: at.trim().parse().ok()?,
    })
}

/// Redis clients by URL, connected on first use and reused across reconciles. A client whose command
/// fails is dropped, so the next reconcile connects afresh.
#[derive(Default)]
pub struct Publisher {
    clients: Mutex<HashMap<String, Client>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the URLs: they carry passwords.
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    async fn client(&self, url: &str) -> Result<Client> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(url) {
            return Ok(c.clone());
        }
        let config = Config::from_url(url).map_err(|e| Error::Redis(format!("invalid Redis URL: {e}")))?;
        let client = Builder::from_config(config)
            .with_connection_config(|c| c.connection_timeout = COMMAND_TIMEOUT)
            .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT)
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
            .build()?;
        match tokio::time::timeout(COMMAND_TIMEOUT, client.init()).await {
            Ok(Ok(_task)) => {}
            Ok(Err(e)) => {
                let _ = client.quit().await;
                return Err(e.into());
            }
            Err(_) => {
                let _ = client.quit().await;
                return Err(Error::Redis(format!("no connection within {COMMAND_TIMEOUT:?}")));
            }
        }
        clients.insert(url.to_owned(), client.clone());
        Ok(client)
    }

    async fn forget(&self, url: &str) {
        if let Some(c) = self.clients.lock().await.remove(url) {
            let _ = c.quit().await;
        }
    }

    /// Store the rendered config at the policy's key and announce its generation on the channel.
    pub async fn publish(
        &self,
        url: &str,
        namespace: &str,
        name: &str,
        yaml: &str,
        generation: i64,
    ) -> Result<()> {
        let key = config_key(namespace, name);
        let result: Result<()> = async {
            let c = self.client(url).await?;
            let () = c.set(&key, yaml, None, None, false).await?;
            let _receivers: i64 = c.publish(&key, generation.to_string()).await?;
            Ok(())
        }
        .await;
        if result.is_err() {
            self.forget(url).await;
        }
        result
    }

    /// Every pod's report for the policy, by pod name. Malformed values are skipped.
    pub async fn reports(&self, url: &str, namespace: &str, name: &str) -> Result<HashMap<String, Report>> {
        let result: Result<HashMap<String, String>> = async {
            let c = self.client(url).await?;
            Ok(c.hgetall(enforced_key(namespace, name)).await?)
        }
        .await;
        match result {
            Ok(raw) => Ok(raw
                .into_iter()
                .filter_map(|(pod, v)| parse_report(&v).map(|r| (pod, r)))
                .collect()),
            Err(e) => {
                self.forget(url).await;
                Err(e)
            }
        }
    }

    /// Remove what the policy left in Redis (its config key and reports), on deletion.
    pub async fn clear(&self, url: &str, namespace: &str, name: &str) -> Result<()> {
        let c = self.client(url).await?;
        let _: i64 = c
            .del(vec![config_key(namespace, name), enforced_key(namespace, name)])
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_cluster_slot_per_policy() {
        assert_eq!(config_key("shop", "api"), "sluice:{shop/api}:config");
        assert_eq!(enforced_key("shop", "api"), "sluice:{shop/api}:enforced");
    }

    #[test]
    fn reports_parse_and_garbage_is_skipped() {
        assert_eq!(
            parse_report("7 1700000000000"),
            Some(Report {
                generation: 7,
                at_ms: 1_700_000_000_000
            })
        );
        for bad in ["", "7", "x 1", "7 y", "7 1 2"] {
            assert_eq!(parse_report(bad), None, "{bad}");
        }
    }
}
