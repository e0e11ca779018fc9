//! Publishing rendered config through Redis, and reading back which generation each pod enforces.
//!
//! The keys and the report format are the contract's (`sluice_crds::contract::redis`); the sidecar's
//! side is its `config::remote` module. Sidecars subscribe to
//! channel `sluice:{<ns>/<name>}:config`, GET the key of the same name when a message arrives, apply a
//! higher generation like a file reload, and report `HSET sluice:{<ns>/<name>}:enforced <pod>
//! "<generation> <unix_ms>"` every 5 s and after each apply. A ConfigMap volume alone takes about a
//! minute to reach a running pod; this path takes well under a second.

use std::{collections::HashMap, time::Duration};

use fred::prelude::*;
pub use sluice_crds::contract::redis::Report;
use sluice_crds::contract::redis::{config_key, enforced_key, pods_key};
use tokio::sync::Mutex;

use crate::{
    Error, Result,
    budget::{Budget, endpoint_key},
};

/// Deadline of connecting and of each command the operator sends.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Redis clients by URL, connected on first use and reused across reconciles. A client whose command
/// fails is dropped, so the next reconcile connects afresh. Which URLs get a client is bounded per
/// namespace and in all by a [`Budget`]; a client no policy used for its idle time is closed.
#[derive(Default)]
pub struct Publisher {
    clients: Mutex<HashMap<String, Client>>,
    budget: Budget,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the URLs: they carry passwords.
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher whose Redis clients are bounded by `budget`.
    pub fn with_budget(budget: Budget) -> Self {
        Self {
            clients: Mutex::default(),
            budget,
        }
    }

    /// How many Redis servers have a client.
    pub async fn clients(&self) -> usize {
        self.clients.lock().await.len()
    }

    async fn client(&self, url: &str, namespace: &str) -> Result<Client> {
        let (admitted, released) =
            self.budget
                .admit(namespace, &endpoint_key(url), std::time::Instant::now());
        let mut clients = self.clients.lock().await;
        if !released.is_empty() {
            let gone: Vec<String> = clients
                .keys()
                .filter(|u| released.contains(&endpoint_key(u)))
                .cloned()
                .collect();
            for u in gone {
                if let Some(c) = clients.remove(&u) {
                    tokio::spawn(async move {
                        let _ = c.quit().await;
                    });
                }
            }
        }
        admitted.map_err(|e| Error::too_many(namespace, "Redis", e))?;
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
            let c = self.client(url, namespace).await?;
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

    /// Stores how many pods enforce the policy (`text`: the signed [`EnforcingPods`] body), where sidecars
    /// read it to divide limits under `failureMode: local`.
    ///
    /// [`EnforcingPods`]: sluice_crds::contract::redis::EnforcingPods
    pub async fn publish_pods(&self, url: &str, namespace: &str, name: &str, text: &str) -> Result<()> {
        let result: Result<()> = async {
            let c = self.client(url, namespace).await?;
            Ok(c.set(pods_key(namespace, name), text, None, None, false).await?)
        }
        .await;
        if result.is_err() {
            self.forget(url).await;
        }
        result
    }

    /// What the policy's config key holds now (`None`: nothing).
    pub async fn current(&self, url: &str, namespace: &str, name: &str) -> Result<Option<String>> {
        let result: Result<Option<String>> = async {
            let c = self.client(url, namespace).await?;
            Ok(c.get(config_key(namespace, name)).await?)
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
            let c = self.client(url, namespace).await?;
            Ok(c.hgetall(enforced_key(namespace, name)).await?)
        }
        .await;
        match result {
            Ok(raw) => Ok(raw
                .into_iter()
                .filter_map(|(pod, v)| Report::parse(&v).map(|r| (pod, r)))
                .collect()),
            Err(e) => {
                self.forget(url).await;
                Err(e)
            }
        }
    }

    /// Remove what the policy left in Redis (its config key and reports), on deletion.
    pub async fn clear(&self, url: &str, namespace: &str, name: &str) -> Result<()> {
        let c = self.client(url, namespace).await?;
        let _: i64 = c
            .del(vec![
                config_key(namespace, name),
                enforced_key(namespace, name),
                pods_key(namespace, name),
            ])
            .await?;
        Ok(())
    }
}
