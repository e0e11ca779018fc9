//! Scenarios that need the real RBAC authorizer, so they run on the real control plane only
//! (`tests/real_control_plane.rs`): the in-memory server has one all-powerful token and a deny-list
//! stand-in for SubjectAccessReview.
//!
//! - [`job_queue_authors`]: the JobQueue validating webhook (`/validate-jobqueue`) judges users as RBAC
//!   sees them. A user bound to Roles that let them create JobQueues but not Deployments, or not
//!   impersonate the ServiceAccount the worker template names, is refused by the API server with the
//!   webhook's message naming the missing right; a user with both is admitted.
//! - [`queue_api_reviewers`]: the ClusterRoleBinding that lets ServiceAccounts create TokenReviews and
//!   SubjectAccessReviews names the ServiceAccounts of a namespace while it holds a JobQueue, and no
//!   longer once the JobQueue is deleted; never the group of every ServiceAccount. Upgrades the release
//!   to `queueApi.auth: kubernetes` unless it is on already.
//! - [`watch_namespaces`]: `helm upgrade` with `watchNamespaces`: the chart's Roles exist in the watched
//!   namespace only, the operator's ServiceAccount has no rights elsewhere (`kubectl auth can-i --as`)
//!   but reads QueueDatabases, namespaces, and Secrets of the release namespace by name only; a JobQueue
//!   naming a QueueDatabase with `rowLevelSecurity: Disabled` is refused by the CRD's rule; the operator
//!   reconciles a RateLimitPolicy in the watched namespace and leaves one in another alone, and both
//!   webhooks are called for the watched namespace only.
//!
//! Requests that should be admitted are sent with `--dry-run=server`: the API server runs the whole
//! admission chain, webhooks included (they declare `sideEffects: None`), and stores nothing, so no
//! worker Deployment is made for a JobQueue whose database does not exist.

use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role};
use kube::api::{Api, ListParams};
use sluice_crds::rate_limit_policy::RateLimitPolicy;

use crate::system::{RELEASE_NAMESPACE, SluiceSystem};
use crate::wait_for;

const DEADLINE: Duration = Duration::from_secs(30);

/// The operator's ServiceAccount, as RBAC names it.
fn operator_user() -> String {
    format!(
        "system:serviceaccount:{RELEASE_NAMESPACE}:{}",
        crate::system::OPERATOR_DEPLOYMENT
    )
}

/// A JobQueue whose workers run as ServiceAccount `mailer` (`None`: as `default`).
fn job_queue(service_account: Option<&str>) -> String {
    let sa = service_account
        .map(|sa| format!("serviceAccountName: {sa}, "))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {{name: mail}}
spec:
  database: {{secretRef: {{name: db}}}}
  worker:
    template: {{spec: {{{sa}containers: [{{name: handler, image: example/sluice-demo-app:1}}]}}}}
"#
    )
}

/// Roles for JobQueue authors in `ns`: `jobqueue-author` (write JobQueues), `deployer` (create
/// Deployments), `use-mailer` (impersonate ServiceAccount `mailer` only), bound to users as `grants` says.
fn author_roles(ns: &str, grants: &[(&str, &[&str])]) -> String {
    let mut yaml = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: mailer, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: jobqueue-author, namespace: {ns}}}
rules: [{{apiGroups: [sluice.dev], resources: [jobqueues], verbs: [get, list, create, update, patch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: deployer, namespace: {ns}}}
rules: [{{apiGroups: [apps], resources: [deployments], verbs: [create]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: use-mailer, namespace: {ns}}}
rules: [{{apiGroups: [""], resources: [serviceaccounts], verbs: [impersonate], resourceNames: [mailer]}}]
"#
    );
    for (user, roles) in grants {
        for role in *roles {
            yaml.push_str(&format!(
                r#"---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {user}-{role}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {role}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]
"#
            ));
        }
    }
    yaml
}

/// `kubectl create --dry-run=server` of `yaml` in `ns`, as `user` (impersonated by the administrator).
async fn create_as(system: &SluiceSystem, user: &str, ns: &str, yaml: &str) -> Output {
    let as_user = format!("--as={user}");
    system
        .kubectl(
            &[
                "create",
                "--dry-run=server",
                "-n",
                ns,
                &as_user,
                "-o",
                "yaml",
                "-f",
                "-",
            ],
            Some(yaml),
        )
        .await
        .unwrap()
}

fn assert_admitted(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_refused(out: &Output, what: &str, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: admitted: {stderr}");
    for e in expected {
        assert!(
            stderr.contains(e),
            "{what}: missing {e:?} in kubectl's error:\n{stderr}"
        );
    }
}

/// The JobQueue webhook against real RBAC users (see the module docs).
pub async fn job_queue_authors(system: &SluiceSystem) {
    let ns = system.env().namespace("jobqueue-authors").await.unwrap();
    let n = ns.name();
    system
        .kubectl_ok(
            &["apply", "-f", "-"],
            Some(&author_roles(
                n,
                &[
                    ("ana", &["jobqueue-author", "use-mailer"]),
                    ("ben", &["jobqueue-author", "deployer"]),
                    ("cleo", &["jobqueue-author", "deployer", "use-mailer"]),
                ],
            )),
        )
        .await
        .unwrap();
    // RBAC itself lets all three create JobQueues; only the webhook can refuse them.
    for user in ["ana", "ben", "cleo"] {
        let out = system
            .kubectl_ok(
                &[
                    "auth",
                    "can-i",
                    "create",
                    "jobqueues.sluice.dev",
                    "-n",
                    n,
                    &format!("--as={user}"),
                ],
                None,
            )
            .await
            .unwrap();
        assert_eq!(out.trim(), "yes", "{user}");
    }
    let webhook = r#"admission webhook "jobqueues.sluice.dev" denied the request"#;

    // May use `mailer` but not create Deployments: refused, naming the Deployments.
    let out = create_as(system, "ana", n, &job_queue(Some("mailer"))).await;
    assert_refused(
        &out,
        "ana (no Deployments)",
        &[
            webhook,
            &format!(r#"ana may not create deployments.apps in namespace "{n}""#),
            "which this JobQueue's workers need",
        ],
    );
    // May create Deployments but not use `mailer`: refused, naming the ServiceAccount.
    let out = create_as(system, "ben", n, &job_queue(Some("mailer"))).await;
    assert_refused(
        &out,
        "ben (no ServiceAccount)",
        &[
            webhook,
            &format!(r#"ben may not impersonate serviceaccounts "mailer" in namespace "{n}""#),
        ],
    );
    // Workers as `default` need no more than Deployments.
    let out = create_as(system, "ben", n, &job_queue(None)).await;
    assert_admitted(&out, "ben with the default ServiceAccount");
    // Both rights: admitted.
    let out = create_as(system, "cleo", n, &job_queue(Some("mailer"))).await;
    let stored = assert_admitted(&out, "cleo (both rights)");
    assert!(stored.contains("serviceAccountName: mailer"), "{stored}");
}

/// The queue API reviewers' binding follows the namespaces holding JobQueues (see the module docs).
pub async fn queue_api_reviewers(system: &SluiceSystem) {
    let queues = system.env().namespace("reviewers").await.unwrap();
    let n = queues.name();
    let group = format!("system:serviceaccounts:{n}");
    let bindings: Api<ClusterRoleBinding> = Api::all(system.env().client());
    let binding_groups = || {
        let bindings = bindings.clone();
        async move {
            let binding = bindings.get(REVIEWER_BINDING).await.unwrap();
            binding
                .subjects
                .unwrap_or_default()
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<String>>()
        }
    };
    // The queue API's checks on (the real control plane's default, see `SystemOptions::real`; upgraded
    // when a system runs with them off), and the operator Ready.
    system
        .upgrade(|values| values["queueApi"]["auth"] = serde_json::json!("kubernetes"))
        .await
        .unwrap();
    system.wait_operator_ready(UPGRADE_DEADLINE).await.unwrap();
    let can_review = || async {
        let as_user = format!("--as=system:serviceaccount:{n}:default");
        let out = system
            .kubectl(
                &[
                    "auth",
                    "can-i",
                    "create",
                    "tokenreviews.authentication.k8s.io",
                    &as_user,
                ],
                None,
            )
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(!binding_groups().await.contains(&group));
    assert_eq!(can_review().await, "no", "no JobQueue in {n} yet");

    system
        .kubectl_ok(&["create", "-n", n, "-f", "-"], Some(&job_queue(None)))
        .await
        .unwrap();
    // The upgraded operator leads once the previous one has handed over its Lease.
    wait_for(
        "the namespace's ServiceAccounts bound as reviewers",
        UPGRADE_DEADLINE,
        || async { binding_groups().await.contains(&group).then_some(()) },
    )
    .await
    .unwrap();
    let groups = binding_groups().await;
    assert!(
        groups
            .iter()
            .all(|g| g.starts_with("system:serviceaccounts:") && g != "system:serviceaccounts:"),
        "only namespaces' ServiceAccounts, never all of them: {groups:?}"
    );
    assert_eq!(can_review().await, "yes");

    system
        .kubectl_ok(&["delete", "jobqueue", "mail", "-n", n, "--wait"], None)
        .await
        .unwrap();
    wait_for("the namespace's ServiceAccounts unbound", DEADLINE, || async {
        (!binding_groups().await.contains(&group)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(can_review().await, "no", "the JobQueue in {n} is gone");
}

/// How long a `helm upgrade` may take to replace the operator and hand over leadership.
const UPGRADE_DEADLINE: Duration = Duration::from_secs(90);

/// The queue API reviewers' ClusterRoleBinding the chart creates for release `sluice`.
const REVIEWER_BINDING: &str = "sluice-queue-api-reviewer-jobqueues";

/// `kubectl auth can-i VERB RESOURCE [-n NS | -A]` as the operator's ServiceAccount: `yes` or `no`.
async fn operator_can(system: &SluiceSystem, verb: &str, resource: &str, ns: Option<&str>) -> String {
    let as_user = format!("--as={}", operator_user());
    let mut args = vec!["auth", "can-i", verb, resource, as_user.as_str()];
    match ns {
        Some(ns) => args.extend(["-n", ns]),
        None => args.push("--all-namespaces"),
    }
    let out = system.kubectl(&args, None).await.unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn policy(name: &str, redis_url: &str) -> String {
    let secret = crate::system::secret_yaml("redis", "url", redis_url);
    format!(
        r#"
{secret}
---
apiVersion: sluice.dev/v1alpha1
kind: RateLimitPolicy
metadata: {{name: {name}}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  redis: {{secretRef: {{name: redis}}}}
  rules:
    - name: per-client
      algorithm: slidingLog
      limit: {{requests: 100, window: 1m}}
"#
    )
}

const POD_WITHOUT_POLICY: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: orphan
  annotations:
    sluice.dev/inject: "true"
    sluice.dev/policy: missing
spec:
  containers:
    - name: app
      image: example/sluice-demo-app:1
      ports: [{name: http, containerPort: 8080}]
"#;

/// `watchNamespaces` on the real control plane (see the module docs). Upgrades the release: run it last.
pub async fn watch_namespaces(system: &SluiceSystem) {
    let watched = system.env().namespace("watched").await.unwrap();
    let other = system.env().namespace("unwatched").await.unwrap();
    let (w, o) = (watched.name(), other.name());
    let redis = sluice_testsupport::RedisServer::start();
    system.confine_to(&[w]).await.unwrap();

    // The chart's Roles: in the watched namespace only (and the release's own).
    let roles: Api<Role> = Api::all(system.env().client());
    let mut role_namespaces: Vec<String> = roles
        .list(&ListParams::default().labels("app.kubernetes.io/instance=sluice"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|r| r.metadata.namespace)
        .collect();
    role_namespaces.sort();
    role_namespaces.dedup();
    let mut expected = vec![w.to_string(), RELEASE_NAMESPACE.to_string()];
    expected.sort();
    assert_eq!(role_namespaces, expected);

    // What the operator's ServiceAccount may do, as the real authorizer says.
    for (verb, resource, ns, answer) in [
        ("watch", "ratelimitpolicies.sluice.dev", Some(w), "yes"),
        ("create", "deployments.apps", Some(w), "yes"),
        ("patch", "configmaps", Some(w), "yes"),
        ("get", "secrets", Some(w), "yes"),
        ("watch", "ratelimitpolicies.sluice.dev", Some(o), "no"),
        ("create", "deployments.apps", Some(o), "no"),
        ("patch", "configmaps", Some(o), "no"),
        ("get", "secrets", Some(o), "no"),
        ("patch", "pods", Some(o), "no"),
        ("create", "deployments.apps", Some("default"), "no"),
        ("list", "ratelimitpolicies.sluice.dev", None, "no"),
        ("patch", "deployments.apps", None, "no"),
        ("create", "horizontalpodautoscalers.autoscaling", None, "no"),
        ("get", "secrets", None, "no"),
        // QueueDatabases: read cluster-wide (patched for their finalizer and status only), their
        // owners' Secrets by name in the release namespace only.
        ("watch", "queuedatabases.sluice.dev", None, "yes"),
        ("create", "queuedatabases.sluice.dev", None, "no"),
        ("delete", "queuedatabases.sluice.dev", None, "no"),
        ("watch", "namespaces", None, "yes"),
        ("patch", "namespaces", None, "no"),
        ("get", "secrets", Some(RELEASE_NAMESPACE), "yes"),
        ("list", "secrets", Some(RELEASE_NAMESPACE), "no"),
        ("watch", "secrets", Some(RELEASE_NAMESPACE), "no"),
    ] {
        let got = operator_can(system, verb, resource, ns).await;
        assert_eq!(
            got,
            answer,
            "can the operator {verb} {resource} in {}?",
            ns.unwrap_or("every namespace")
        );
    }

    // The JobQueue CRD's rules on the real API server: a JobQueue naming a QueueDatabase must keep
    // row-level security (it would hand the owner's login to the namespace's workers).
    let disabled = job_queue(None).replace(
        "database: {secretRef: {name: db}}",
        "database: {queueDatabaseRef: {name: shared}, rowLevelSecurity: Disabled}",
    );
    assert_ne!(disabled, job_queue(None));
    let out = system
        .kubectl(&["apply", "-n", w, "-f", "-"], Some(&disabled))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("spec.database.rowLevelSecurity must be Enabled with queueDatabaseRef"),
        "{stderr}"
    );

    // A policy in the unwatched namespace first, then one in the watched namespace: the second is
    // reconciled (status, NetworkPolicy, ConfigMap), the first left alone.
    system
        .kubectl_ok(&["apply", "-n", o, "-f", "-"], Some(&policy("api", &redis.url())))
        .await
        .unwrap();
    system
        .kubectl_ok(&["apply", "-n", w, "-f", "-"], Some(&policy("api", &redis.url())))
        .await
        .unwrap();
    let policies: Api<RateLimitPolicy> = watched.api();
    wait_for("the watched namespace's policy reconciled", DEADLINE, || {
        let policies = policies.clone();
        async move {
            let p = policies.get("api").await.ok()?;
            let observed = p.status.as_ref()?.observed_generation?;
            (Some(observed) == p.metadata.generation).then_some(())
        }
    })
    .await
    .unwrap();
    assert!(
        watched
            .api::<NetworkPolicy>()
            .get_opt("sluice-policy-api")
            .await
            .unwrap()
            .is_some()
    );
    let rendered = |cms: Vec<ConfigMap>| {
        cms.into_iter()
            .filter(|c| c.metadata.name.as_deref() != Some("kube-root-ca.crt"))
            .count()
    };
    let cms = watched
        .api::<ConfigMap>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(rendered(cms.items), 1);
    let ignored = other.api::<RateLimitPolicy>().get("api").await.unwrap();
    assert!(ignored.status.is_none(), "{:?}", ignored.status);
    let cms = other
        .api::<ConfigMap>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(rendered(cms.items), 0);
    assert!(
        other
            .api::<NetworkPolicy>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The webhooks are called for the watched namespace only: an injection naming a missing policy is
    // refused there and passes untouched elsewhere; the JobQueue check judges authors there only.
    let out = system
        .kubectl(
            &["create", "--dry-run=server", "-n", w, "-f", "-"],
            Some(POD_WITHOUT_POLICY),
        )
        .await
        .unwrap();
    assert_refused(
        &out,
        "a pod in the watched namespace",
        &[r#"RateLimitPolicy "missing" does not exist"#],
    );
    let out = system
        .kubectl(
            &["create", "--dry-run=server", "-n", o, "-o", "yaml", "-f", "-"],
            Some(POD_WITHOUT_POLICY),
        )
        .await
        .unwrap();
    let pod = assert_admitted(&out, "a pod in the unwatched namespace");
    assert!(!pod.contains("sluice-sidecar"), "{pod}");
    for ns in [w, o] {
        system
            .kubectl_ok(
                &["apply", "-f", "-"],
                Some(&author_roles(ns, &[("ana", &["jobqueue-author", "use-mailer"])])),
            )
            .await
            .unwrap();
    }
    let out = create_as(system, "ana", w, &job_queue(Some("mailer"))).await;
    assert_refused(
        &out,
        "ana in the watched namespace",
        &[&format!(
            r#"ana may not create deployments.apps in namespace "{w}""#
        )],
    );
    let out = create_as(system, "ana", o, &job_queue(Some("mailer"))).await;
    assert_admitted(
        &out,
        "ana in the unwatched namespace (no operator there to run workers)",
    );
}
