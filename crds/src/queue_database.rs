//! `QueueDatabase` (`sluice.dev/v1alpha1`, cluster-scoped): a PostgreSQL database an admin registers
//! for JobQueues, the way a `StorageClass` or an `IngressClass` is registered for claims and Ingresses.
//!
//! The database owner's URL (the login owning the `sluice` schema, with `CREATEROLE`) stays in a Secret
//! in the operator's own namespace; a JobQueue names the `QueueDatabase` (`spec.database.
//! queueDatabaseRef`) instead of a Secret of its own. The operator prepares the schema and provisions
//! the namespace's tenant role with the owner's login, and the namespace gets only the tenant's URL: who
//! can read Secrets or run pods there never holds the owner's rights over other namespaces' jobs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{
    CustomResource,
    core::{Selector, SelectorExt as _},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::secret_ref::SecretKeyRef;

/// A PostgreSQL database an admin registers for JobQueues, with the owner's URL kept in the operator's
/// namespace.
///
/// JobQueues name it in `spec.database.queueDatabaseRef`; only those in namespaces `namespaceSelector`
/// admits may use it, and always with row-level security: their workers log in as the namespace's
/// tenant role, whose URL the operator writes to a Secret in their namespace. The owner's URL never
/// leaves the operator's namespace.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "QueueDatabase",
    plural = "queuedatabases",
    singular = "queuedatabase",
    shortname = "qdb",
    category = "sluice",
    status = "QueueDatabaseStatus",
    derive = "PartialEq",
    doc = "A PostgreSQL database registered by an admin for JobQueues: the owner's URL stays in a Secret in the operator's namespace, and the namespaces the selector admits get tenant logins only.",
    printcolumn = r#"{"name":"Secret","type":"string","jsonPath":".spec.secretRef.name","description":"The Secret, in the operator's namespace, holding the owner's URL"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QueueDatabaseSpec {
    /// The Secret, in the operator's own namespace (the namespace Sluice is installed in), holding the
    /// URL of the login that owns the `sluice` schema and may create roles
    /// (`postgres://owner:password@host:5432/db`). The operator reads it to prepare the schema, provision
    /// tenant roles and read depth; it is never copied to another namespace or given to a pod.
    pub secret_ref: SecretKeyRef,

    /// Which namespaces' JobQueues may use this database, by the namespaces' labels
    /// (`kubernetes.io/metadata.name` names one). Absent: no namespace may (state it to admit any);
    /// `{}`: every namespace. A JobQueue in a namespace it does not admit is `Ready=False`, reason
    /// `NamespaceNotAllowed`, its workers scaled to zero, and nothing is provisioned for it. A namespace
    /// it stops admitting (and every namespace, when the QueueDatabase is deleted) loses its tenant
    /// login: the operator takes LOGIN from the tenant role it registered in the database, ends the
    /// role's sessions and deletes the namespace's tenant Secrets for the database, and says so in the
    /// QueueDatabase's `Ready` condition and Events. An invalid selector revokes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// What the operator last did for a [`QueueDatabase`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDatabaseStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: `True` when every namespace of the database the selector no longer admits has been
    /// revoked (the message names those revoked by the last reconcile); `False` with the reason
    /// (`RevocationFailed`, `SecretNotFound`, `InvalidSpec`, `DatabaseUnreachable`) and the namespaces
    /// whose revocation is incomplete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The operator's finalizer on a QueueDatabase: it holds a deleted QueueDatabase until every namespace
/// it admitted is revoked.
pub const REVOKE_FINALIZER: &str = "sluice.dev/revoke-tenants";

impl QueueDatabase {
    /// Whether the operator has taken it over (it carries [`REVOKE_FINALIZER`]) and it is not being
    /// deleted: only then may a namespace be provisioned through it, since only then would deleting it
    /// revoke what was provisioned.
    pub fn serves(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && self
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == REVOKE_FINALIZER))
    }

    /// The condition of type `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// A JobQueue's reference to a [`QueueDatabase`] (`spec.database.queueDatabaseRef`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDatabaseRef {
    /// Name of the QueueDatabase (cluster-scoped).
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

impl QueueDatabaseSpec {
    /// Whether a namespace with `labels` may use the database, with Kubernetes' label selector
    /// semantics: an absent selector admits none, an empty one every namespace; otherwise every
    /// `matchLabels` pair and `matchExpressions` requirement must hold. A selector Kubernetes would
    /// refuse (an unknown operator, `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values)
    /// admits nothing: the error says what is wrong with it.
    pub fn admits(&self, labels: &std::collections::BTreeMap<String, String>) -> Result<bool, String> {
        let Some(selector) = &self.namespace_selector else {
            return Ok(false);
        };
        for r in selector.match_expressions.iter().flatten() {
            let has_values = r.values.as_ref().is_some_and(|v| !v.is_empty());
            match (r.operator.as_str(), has_values) {
                ("In" | "NotIn", false) => {
                    return Err(format!(
                        "requirement on {:?}: operator {} needs values",
                        r.key, r.operator
                    ));
                }
                ("Exists" | "DoesNotExist", true) => {
                    return Err(format!(
                        "requirement on {:?}: operator {} takes no values",
                        r.key, r.operator
                    ));
                }
                _ => {}
            }
        }
        let selector = Selector::try_from(selector.clone()).map_err(|e| e.0)?;
        Ok(selector.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn spec(selector: &str) -> QueueDatabaseSpec {
        serde_yaml::from_str(&format!("secretRef: {{name: pg}}\n{selector}")).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_selector_admits_no_namespace_and_an_empty_one_admits_all() {
        let none = spec("");
        assert_eq!(none.secret_ref.key, "url");
        assert_eq!(none.admits(&labels(&[])), Ok(false));
        assert_eq!(none.admits(&labels(&[("team", "shop")])), Ok(false));
        let all = spec("namespaceSelector: {}");
        assert_eq!(all.admits(&labels(&[])), Ok(true));
        assert_eq!(all.admits(&labels(&[("team", "shop")])), Ok(true));
    }

    #[test]
    fn selectors_follow_kubernetes_label_selector_semantics() {
        let s = spec(
            "namespaceSelector:\n  matchLabels: {team: shop}\n  matchExpressions:\n    - {key: tier, operator: In, values: [prod, staging]}\n    - {key: frozen, operator: DoesNotExist}\n",
        );
        let admits = |s: &QueueDatabaseSpec, l: &[(&str, &str)]| s.admits(&labels(l)).unwrap();
        assert!(admits(&s, &[("team", "shop"), ("tier", "prod")]));
        assert!(!admits(&s, &[("team", "blog"), ("tier", "prod")]));
        assert!(!admits(&s, &[("team", "shop"), ("tier", "dev")]));
        assert!(!admits(&s, &[("team", "shop"), ("tier", "prod"), ("frozen", "")]));
        let not_in =
            spec("namespaceSelector:\n  matchExpressions: [{key: team, operator: NotIn, values: [blog]}]\n");
        assert!(admits(&not_in, &[]));
        assert!(!admits(&not_in, &[("team", "blog")]));
        let exists = spec("namespaceSelector:\n  matchExpressions: [{key: team, operator: Exists}]\n");
        assert!(admits(&exists, &[("team", "x")]));
        assert!(!admits(&exists, &[]));
    }

    #[test]
    fn a_selector_kubernetes_would_refuse_admits_nothing_and_says_why() {
        for (expression, why) in [
            ("{key: team, operator: Gt, values: ['1']}", "operator"),
            ("{key: team, operator: NotIn}", "NotIn needs values"),
            ("{key: team, operator: NotIn, values: []}", "NotIn needs values"),
            ("{key: team, operator: In}", "In needs values"),
            (
                "{key: team, operator: Exists, values: [x]}",
                "Exists takes no values",
            ),
            (
                "{key: team, operator: DoesNotExist, values: [x]}",
                "DoesNotExist takes no values",
            ),
        ] {
            let s = spec(&format!(
                "namespaceSelector:\n  matchExpressions: [{expression}]\n"
            ));
            for l in [&[][..], &[("team", "x")][..], &[("team", "2")][..]] {
                let e = s.admits(&labels(l)).expect_err(expression);
                assert!(e.contains(why), "{expression}: {e}");
            }
        }
    }
}
