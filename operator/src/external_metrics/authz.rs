//! What an authenticated caller may read, decided by the main API server with a `SubjectAccessReview`
//! (k8s.io/apiserver's delegated authorization), so the cluster's RBAC is the only policy. Answers are
//! cached briefly: allowed for [`ALLOW_CACHE_TTL`], denied for [`DENY_CACHE_TTL`] (shorter, so a fixed
//! RoleBinding takes effect soon).
//!
//! Attributes, as kube-apiserver's request-info derives them for this API:
//! `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}` is verb `list` on resource
//! `{metric}` of group `external.metrics.k8s.io` in namespace `{ns}` (the HPA controller's ClusterRole
//! grants exactly that); any other path (discovery) is a non-resource `get` of the path.

use std::time::Duration;

use kube::{Api, Client, api::PostParams};
use serde_json::json;

use super::{authn::User, cache::TtlCache};

/// How long an allowed decision is reused.
pub const ALLOW_CACHE_TTL: Duration = Duration::from_secs(10);
/// How long a denied decision is reused.
pub const DENY_CACHE_TTL: Duration = Duration::from_secs(5);
/// Most decisions kept at once.
pub const DECISION_CACHE_CAPACITY: usize = 4096;
/// The API group served.
pub const GROUP: &str = "external.metrics.k8s.io";
/// Its version.
pub const VERSION: &str = "v1beta1";

/// What a request asks to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attributes {
    /// A metric: `verb` on `resource` (the metric name) in `namespace`.
    Resource {
        /// `list` for a metric read.
        verb: String,
        /// The namespace in the path.
        namespace: String,
        /// The metric name.
        resource: String,
    },
    /// Anything else (discovery): `verb` on a URL path.
    NonResource {
        /// `get`.
        verb: String,
        /// The request path.
        path: String,
    },
}

impl Attributes {
    /// The attributes of a `method` request for `path`.
    pub fn of(method: &http::Method, path: &str) -> Self {
        let verb = method.as_str().to_ascii_lowercase();
        let prefix = format!("/apis/{GROUP}/{VERSION}/namespaces/");
        if let Some(rest) = path.strip_prefix(&prefix)
            && let [namespace, resource] = rest.split('/').collect::<Vec<_>>().as_slice()
            && !namespace.is_empty()
            && !resource.is_empty()
        {
            return Attributes::Resource {
                verb: if verb == "get" { "list".into() } else { verb },
                namespace: (*namespace).to_owned(),
                resource: (*resource).to_owned(),
            };
        }
        Attributes::NonResource {
            verb,
            path: path.to_owned(),
        }
    }

    /// `verb resource in namespace`, for messages.
    pub fn describe(&self) -> String {
        match self {
            Attributes::Resource {
                verb,
                namespace,
                resource,
            } => format!("{verb} {resource}.{GROUP} in namespace {namespace:?}"),
            Attributes::NonResource { verb, path } => format!("{verb} {path}"),
        }
    }
}

/// A decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The authorizer's reason, when it gave one.
    pub reason: String,
}

/// Asks the API server with SubjectAccessReviews, with a short cache.
pub struct Authorizer {
    client: Client,
    cache: TtlCache<(User, Attributes), Decision>,
}

impl Authorizer {
    /// Reviews through `client` (which needs `create` on `subjectaccessreviews`: `system:auth-delegator`).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: TtlCache::new(DECISION_CACHE_CAPACITY),
        }
    }

    /// Whether `user` may do `attributes`. An error means the API server could not be asked.
    pub async fn authorize(&self, user: &User, attributes: &Attributes) -> Result<Decision, kube::Error> {
        let key = (user.clone(), attributes.clone());
        if let Some(d) = self.cache.get(&key) {
            return Ok(d);
        }
        let mut spec = json!({
            "user": user.name, "groups": user.groups, "extra": user.extra,
        });
        if !user.uid.is_empty() {
            spec["uid"] = json!(user.uid);
        }
        match attributes {
            Attributes::Resource {
                verb,
                namespace,
                resource,
            } => {
                spec["resourceAttributes"] = json!({
                    "verb": verb, "namespace": namespace, "group": GROUP, "version": VERSION, "resource": resource,
                });
            }
            Attributes::NonResource { verb, path } => {
                spec["nonResourceAttributes"] = json!({"verb": verb, "path": path});
            }
        }
        let review = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
        }))
        .map_err(kube::Error::SerdeError)?;
        let api: Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> =
            Api::all(self.client.clone());
        let status = api
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        let decision = Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.or(status.evaluation_error).unwrap_or_default(),
        };
        let ttl = if decision.allowed {
            ALLOW_CACHE_TTL
        } else {
            DENY_CACHE_TTL
        };
        self.cache.insert(key, decision.clone(), ttl);
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_read_is_a_list_of_the_metric_in_its_namespace_and_discovery_a_non_resource_get() {
        assert_eq!(
            Attributes::of(
                &http::Method::GET,
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/sluice_jobqueue_depth"
            ),
            Attributes::Resource {
                verb: "list".into(),
                namespace: "shop".into(),
                resource: "sluice_jobqueue_depth".into()
            }
        );
        assert_eq!(
            Attributes::of(&http::Method::GET, "/apis/external.metrics.k8s.io/v1beta1"),
            Attributes::NonResource {
                verb: "get".into(),
                path: "/apis/external.metrics.k8s.io/v1beta1".into()
            }
        );
    }
}
