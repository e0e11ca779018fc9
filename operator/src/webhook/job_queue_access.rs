//! Who may create or change a `JobQueue`: the `POST /validate-jobqueue` admission check.
//!
//! A JobQueue becomes a worker Deployment that the operator creates with its own rights, running the
//! pod template the JobQueue holds. Without a check, whoever may write JobQueues in a namespace could run
//! any pod there, as any ServiceAccount there, which RBAC may deny them directly. So the webhook asks the
//! API server, by `SubjectAccessReview` for the requesting user (the AdmissionReview's `userInfo`, with
//! its groups, uid and extra), what creating the worker by hand would take:
//!
//! - `create` `deployments.apps` in the JobQueue's namespace;
//! - when the template names a ServiceAccount other than `default` (`serviceAccountName`, or the
//!   deprecated `serviceAccount`): `impersonate` `serviceaccounts` of that name in the namespace.
//!
//! Kubernetes has no "use this ServiceAccount" verb: whoever may create pods in a namespace may run them
//! as any of its ServiceAccounts. The built-in `edit` and `admin` roles grant `impersonate` on
//! `serviceaccounts` for that reason (running a pod as an account is acting as it), and multi-tenant
//! controllers such as Flux's run a tenant's objects by impersonating its ServiceAccount. Asking for
//! `impersonate` on the named account keeps the usual roles working and lets a cluster grant JobQueue
//! authors a narrower set of accounts (a Role with `resourceNames`) than everything in the namespace.
//!
//! Checked on CREATE, and on UPDATE when `spec` changes (pausing through an annotation needs no more than
//! RBAC on JobQueues). Denials name what is missing; a review that cannot be made denies (fail closed).
//!
//! The same request also refuses `spec.schedules[]` whose cron expression or time zone cannot be read
//! (422, naming the schedule), with the parser the workers use to decide fire times.

use std::{collections::BTreeMap, sync::Arc};

use futures::future::BoxFuture;
use k8s_openapi::api::{
    authentication::v1::UserInfo,
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{
    Api, Client,
    api::PostParams,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, Operation},
    },
};
use serde_json::Value;

/// Path the `ValidatingWebhookConfiguration` calls.
pub const VALIDATE_JOB_QUEUE_PATH: &str = "/validate-jobqueue";
/// The ServiceAccount pods run as when the template names none: no check beyond creating Deployments.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// One thing the requesting user must be allowed.
pub fn required(namespace: &str, service_account: Option<&str>) -> Vec<ResourceAttributes> {
    let mut out = vec![ResourceAttributes {
        namespace: Some(namespace.into()),
        verb: Some("create".into()),
        group: Some("apps".into()),
        resource: Some("deployments".into()),
        ..ResourceAttributes::default()
    }];
    if let Some(sa) = service_account.filter(|sa| *sa != DEFAULT_SERVICE_ACCOUNT) {
        out.push(ResourceAttributes {
            namespace: Some(namespace.into()),
            verb: Some("impersonate".into()),
            group: Some(String::new()),
            resource: Some("serviceaccounts".into()),
            name: Some(sa.into()),
            ..ResourceAttributes::default()
        });
    }
    out
}

/// `verb resource[.group] "name" in namespace "ns"`, for messages.
pub fn describe(a: &ResourceAttributes) -> String {
    let group = a.group.as_deref().filter(|g| !g.is_empty());
    format!(
        "{} {}{}{} in namespace {:?}",
        a.verb.as_deref().unwrap_or_default(),
        a.resource.as_deref().unwrap_or_default(),
        group.map(|g| format!(".{g}")).unwrap_or_default(),
        a.name.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default(),
        a.namespace.as_deref().unwrap_or_default(),
    )
}

/// The ServiceAccount the JobQueue's workers run as, as its template names it (`None`: not named).
pub fn service_account(job_queue: &Value) -> Option<String> {
    let spec = &job_queue["spec"]["worker"]["template"]["spec"];
    ["serviceAccountName", "serviceAccount"]
        .iter()
        .find_map(|k| spec[*k].as_str().filter(|s| !s.is_empty()).map(String::from))
}

/// Why `spec.schedules[]` of `job_queue` cannot run, naming the first schedule that cannot, if any: its
/// cron expression or time zone cannot be read by [`sluice_queue::schedule::CronSchedule::parse`], the
/// parser the workers use.
pub fn schedules_problem(job_queue: &Value) -> Option<String> {
    let schedules = job_queue["spec"]["schedules"].as_array()?;
    schedules.iter().enumerate().find_map(|(i, s)| {
        let cron = s["cron"].as_str().unwrap_or_default();
        let time_zone = s["timeZone"].as_str();
        sluice_queue::schedule::CronSchedule::parse(cron, time_zone)
            .err()
            .map(|e| {
                let name = s["name"].as_str().unwrap_or_default();
                format!("spec.schedules[{i}] ({name:?}): {e}")
            })
    })
}

/// What an authorizer answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the user may.
    pub allowed: bool,
    /// The authorizer's reason, when it gave one.
    pub reason: String,
}

/// Decides whether a user may do something: the API server's `SubjectAccessReview` in the operator
/// ([`SubjectAccessReviews`]); tests pass their own rules.
pub trait Authorize: Send + Sync {
    /// Whether `user` may do `attributes`. An error means nobody could be asked.
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attributes: &'a ResourceAttributes,
    ) -> BoxFuture<'a, Result<Decision, kube::Error>>;
}

/// Asks the API server (the operator needs `create` on `subjectaccessreviews`).
pub struct SubjectAccessReviews(pub Client);

impl Authorize for SubjectAccessReviews {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attributes: &'a ResourceAttributes,
    ) -> BoxFuture<'a, Result<Decision, kube::Error>> {
        Box::pin(async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: user.username.clone(),
                    groups: user.groups.clone(),
                    uid: user.uid.clone(),
                    extra: user
                        .extra
                        .clone()
                        .map(|e| e.into_iter().collect::<BTreeMap<_, _>>()),
                    resource_attributes: Some(attributes.clone()),
                    non_resource_attributes: None,
                },
                ..SubjectAccessReview::default()
            };
            let status = Api::<SubjectAccessReview>::all(self.0.clone())
                .create(&PostParams::default(), &review)
                .await?
                .status
                .unwrap_or_default();
            Ok(Decision {
                allowed: status.allowed && status.denied != Some(true),
                reason: status.reason.or(status.evaluation_error).unwrap_or_default(),
            })
        })
    }
}

/// Answers one JobQueue admission request (see the module docs).
pub async fn review(
    authorizer: &Arc<dyn Authorize>,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(object) = request.object.as_ref() else {
        return response;
    };
    let new = serde_json::to_value(object).unwrap_or_default();
    match request.operation {
        Operation::Create => {}
        Operation::Update => {
            let old = request
                .old_object
                .as_ref()
                .map(|o| serde_json::to_value(o).unwrap_or_default());
            if old.is_some_and(|o| o["spec"] == new["spec"]) {
                return response;
            }
        }
        _ => return response,
    }
    if let Some(problem) = schedules_problem(&new) {
        return invalid(response, problem);
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    let user = &request.user_info;
    let who = user.username.as_deref().unwrap_or("(unknown user)");
    let sa = service_account(&new);
    for attributes in required(&namespace, sa.as_deref()) {
        match authorizer.authorize(user, &attributes).await {
            Ok(d) if d.allowed => {}
            Ok(d) => {
                return forbidden(
                    response,
                    format!(
                        "{who} may not {}, which this JobQueue's workers need: the operator would create \
                     them on the user's behalf{}",
                        describe(&attributes),
                        if d.reason.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", d.reason)
                        }
                    ),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                return unavailable(
                    response,
                    format!(
                        "could not check whether {who} may {}: {e}; try again",
                        describe(&attributes)
                    ),
                );
            }
        }
    }
    response
}

/// `response` refusing with `message`: 403 Forbidden, as the API server answers a user RBAC denies (a
/// webhook's denial without a code would be 403 too, but with the reason left empty).
fn forbidden(response: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result.code = 403;
    response.result.reason = "Forbidden".into();
    response
}

/// `response` refusing with `message` because the JobQueue's spec cannot work: 422, as the API server
/// answers a spec its schema refuses.
fn invalid(response: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result.code = 422;
    response.result.reason = "Invalid".into();
    response
}

/// `response` refusing with `message` because nobody could be asked: 503, try again.
fn unavailable(response: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result.code = 503;
    response.result.reason = "ServiceUnavailable".into();
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn creating_deployments_is_always_required_and_a_named_service_account_is_impersonated() {
        let only = required("shop", None);
        assert_eq!(only.len(), 1);
        assert_eq!(
            describe(&only[0]),
            "create deployments.apps in namespace \"shop\""
        );
        assert_eq!(required("shop", Some("default")).len(), 1);
        let both = required("shop", Some("mailer"));
        assert_eq!(
            describe(&both[1]),
            "impersonate serviceaccounts \"mailer\" in namespace \"shop\""
        );
    }

    #[test]
    fn schedules_that_cannot_be_read_are_named() {
        let jq = |schedules: Value| json!({"spec": {"schedules": schedules}});
        assert_eq!(schedules_problem(&json!({"spec": {}})), None);
        assert_eq!(
            schedules_problem(&jq(json!([
                {"name": "nightly", "cron": "30 2 * * *", "timeZone": "Europe/Berlin"},
                {"name": "often", "cron": "*/10 * * * * *"}
            ]))),
            None
        );
        let bad_cron = schedules_problem(&jq(json!([
            {"name": "nightly", "cron": "30 2 * * *"},
            {"name": "broken", "cron": "61 2 * * *"}
        ])))
        .unwrap();
        assert!(
            bad_cron.starts_with(r#"spec.schedules[1] ("broken"): cron "61 2 * * *""#),
            "{bad_cron}"
        );
        assert_eq!(
            schedules_problem(&jq(json!([
                {"name": "nightly", "cron": "30 2 * * *", "timeZone": "Mars/Olympus"}
            ]))),
            Some(
                r#"spec.schedules[0] ("nightly"): timeZone "Mars/Olympus": not an IANA time zone (e.g. Europe/Berlin)"#
                    .into()
            )
        );
    }

    #[test]
    fn the_service_account_comes_from_either_template_field() {
        let jq = |spec: Value| json!({"spec": {"worker": {"template": {"spec": spec}}}});
        assert_eq!(
            service_account(&jq(json!({"serviceAccountName": "a"}))),
            Some("a".into())
        );
        assert_eq!(
            service_account(&jq(json!({"serviceAccount": "b"}))),
            Some("b".into())
        );
        assert_eq!(service_account(&jq(json!({"serviceAccountName": ""}))), None);
        assert_eq!(service_account(&json!({})), None);
    }
}
