//! Who may check the queue API's callers: the ClusterRoleBinding that lets ServiceAccounts create
//! TokenReviews and SubjectAccessReviews (the injected sidecars review their callers with them) is kept
//! to the ServiceAccounts of the namespaces that hold at least one JobQueue. A queue-API sidecar exists
//! only there: the webhook injects one only for a JobQueue in the pod's own namespace.
//!
//! The chart creates the binding without subjects and names it by `--queue-api-reviewer-binding`; the
//! leader server-side applies its `subjects` whenever the set of those namespaces changes, an empty list
//! when there are none. It never creates the binding (RBAC cannot limit `create` to one name), so the
//! operator's rights on it are `get`, `patch` and `update` by name, and `bind` on its one ClusterRole.

use std::{collections::BTreeSet, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Subject};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;
use sluice_crds::job_queue::JobQueue;

use crate::{FIELD_MANAGER, Result};

/// The group of every ServiceAccount in a namespace is this prefix and the namespace's name.
pub const SERVICE_ACCOUNTS_GROUP_PREFIX: &str = "system:serviceaccounts:";

/// First retry delay after a failed apply; doubled per failure up to [`RETRY_MAX`].
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest retry delay.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// The namespaces that hold at least one of `job_queues`, sorted, each once.
pub fn namespaces_of<'a>(job_queues: impl IntoIterator<Item = &'a JobQueue>) -> BTreeSet<String> {
    job_queues
        .into_iter()
        .filter_map(|q| q.namespace())
        .filter(|ns| !ns.is_empty())
        .collect()
}

/// The binding's subjects for `namespaces`: the group `system:serviceaccounts:<ns>` of each, in order.
pub fn subjects(namespaces: &BTreeSet<String>) -> Vec<Subject> {
    namespaces
        .iter()
        .map(|ns| Subject {
            kind: "Group".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            name: format!("{SERVICE_ACCOUNTS_GROUP_PREFIX}{ns}"),
            namespace: None,
        })
        .collect()
}

/// Server-side applies `subjects` (the whole list) to the ClusterRoleBinding `name`, which must exist.
pub async fn apply(client: &Client, name: &str, subjects: &[Subject]) -> Result<()> {
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "subjects": subjects,
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Watches every JobQueue and keeps the binding `name`'s subjects to their namespaces until `shutdown`.
/// A failed apply is retried with a growing delay (and at the next change of JobQueues).
pub async fn run(client: Client, name: String, shutdown: impl Future<Output = ()>) {
    let (reader, writer) = reflector::store::<JobQueue>();
    let events = watcher(Api::<JobQueue>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut applied: Option<BTreeSet<String>> = None;
    let mut failures: u32 = 0;
    loop {
        let retry = (failures > 0).then(|| {
            RETRY_BASE
                .saturating_mul(1u32.checked_shl(failures - 1).unwrap_or(u32::MAX))
                .min(RETRY_MAX)
        });
        let retry_due = async {
            match retry {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return,
            () = retry_due => {}
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "JobQueue watch for the reviewer binding failed; it backs off");
                    continue;
                }
                // The cache holds a whole listing only once it is done.
                Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => continue,
                Some(Ok(_)) => {}
            },
        }
        let wanted = namespaces_of(reader.state().iter().map(|q| q.as_ref()));
        if applied.as_ref() == Some(&wanted) {
            continue;
        }
        match apply(&client, &name, &subjects(&wanted)).await {
            Ok(()) => {
                tracing::info!(binding = %name, namespaces = ?wanted, "queue API reviewers bound");
                applied = Some(wanted);
                failures = 0;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(binding = %name, error = %e, "could not update the queue API reviewers' binding");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(ns: Option<&str>, name: &str) -> JobQueue {
        let mut q: JobQueue = serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "JobQueue",
            "metadata": {"name": name},
            "spec": {
                "database": {"secretRef": {"name": "db"}},
                "worker": {"template": {"spec": {"containers": [{"name": "w", "image": "w:1"}]}}},
            },
        }))
        .unwrap();
        q.metadata.namespace = ns.map(str::to_owned);
        q
    }

    #[test]
    fn subjects_are_the_service_account_groups_of_namespaces_holding_a_job_queue_each_once() {
        let queues = [
            queue(Some("shop"), "mail"),
            queue(Some("billing"), "invoices"),
            queue(Some("shop"), "reports"),
            queue(None, "nowhere"),
        ];
        let subjects = subjects(&namespaces_of(&queues));
        let names: Vec<&str> = subjects.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["system:serviceaccounts:billing", "system:serviceaccounts:shop"]
        );
        assert!(subjects.iter().all(|s| s.kind == "Group"
            && s.api_group.as_deref() == Some("rbac.authorization.k8s.io")
            && s.namespace.is_none()));
    }

    #[test]
    fn no_job_queue_means_no_subject_never_every_service_account() {
        assert!(subjects(&namespaces_of(&[])).is_empty());
        let body = serde_json::to_value(subjects(&BTreeSet::new())).unwrap();
        assert_eq!(body, json!([]));
    }
}
