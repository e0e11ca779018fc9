//! Tenant provisioning (`spec.database.rowLevelSecurity`) by the JobQueue controller, against the
//! in-memory test API server and a real PostgreSQL that asks every role but the superuser for its
//! password: the tenant Secret's URL logs in and sees its namespace only; JobQueues of one namespace on
//! one database share the role and its password (through one Secret, or two); two namespaces get two
//! roles, and one namespace on two databases of one server a role in each (which the role name an
//! earlier release gave, made by someone else, does not block); a namespace's registered tenant keeps
//! its role, whatever its name, unless that role is the owner's login or could otherwise step out of
//! row-level security; an owner without CREATEROLE gets `TenantNotProvisioned` and no worker;
//! `Disabled` hands the workers the JobQueue's own Secret. With a `QueueDatabase`, the owner's URL stays
//! in the operator's namespace and the JobQueue's gets the tenant's only; a namespace its selector does
//! not admit, or a QueueDatabase that does not exist, is refused with the reason, and admitted once
//! that is fixed; a queue an earlier release named without a namespace is never adopted by a tenant.
//! A namespace the QueueDatabase stops admitting (or every namespace, when it is deleted) loses its
//! tenant's login and sessions whatever it did to its own objects first, and gets them back when
//! admitted again.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{
        apps::v1::Deployment,
        core::v1::{Secret, SecretKeySelector},
    },
};
use kube::ResourceExt as _;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use sluice_crds::{job_queue::JobQueue, queue_database::QueueDatabase};
use sluice_e2e::{Env, TestNamespace, wait_for};
use sluice_operator::{
    controller::{Context, job_queue, queue_database},
    metrics::Metrics,
    render::sidecar_container::SidecarSettings,
    scaling::{Databases, JobQueueMetrics},
    tenant,
};
use sluice_queue::{NewJob, QueueSettings, QueueStore};
use sluice_testsupport::PgServer;
use sqlx::Connection as _;
use tokio_util::sync::CancellationToken;

/// How long any awaited condition may take. Generous: waiting ends as soon as the condition holds, and
/// the provisioning-lock test alone spends its 5 s lock timeout plus a retry's backoff (12 s on a quiet
/// machine) before its condition can appear.
const DEADLINE: Duration = Duration::from_secs(60);

struct Fixture {
    env: Env,
    pg: PgServer,
    stop: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An API server with the CRDs, a PostgreSQL asking for passwords, and the JobQueue and QueueDatabase
/// controllers.
async fn fixture() -> Fixture {
    fixture_with(true).await
}

/// [`fixture`], with the QueueDatabase controller only if `queue_databases`.
async fn fixture_with(queue_databases: bool) -> Fixture {
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let pg = tokio::task::spawn_blocking(|| {
        let pg = PgServer::start();
        pg.require_passwords();
        pg
    })
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let settings = job_queue::Settings {
        databases: Arc::new(Databases::with_ttl(Duration::ZERO)),
        metrics: Arc::new(JobQueueMetrics::default()),
        sidecar: SidecarSettings {
            image: "sluice-sidecar:test".into(),
            ..SidecarSettings::default()
        },
        namespace: "sluice-system".into(),
        external_metrics: true,
        namespaces: Default::default(),
    };
    let (state, wakes) = job_queue::State::new(settings, stop.clone());
    let ctx = Arc::new(Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        Some("test".into()),
        sluice_operator::clock::system_clock(),
        state,
    ));
    tokio::spawn(job_queue::run(ctx, wakes, stop.clone().cancelled_owned()));
    if !queue_databases {
        return Fixture { env, pg, stop };
    }
    let queue_databases = Arc::new(Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        Some("test".into()),
        sluice_operator::clock::system_clock(),
        queue_database::State {
            namespace: "sluice-system".into(),
        },
    ));
    tokio::spawn(queue_database::run(
        queue_databases,
        stop.clone().cancelled_owned(),
    ));
    Fixture { env, pg, stop }
}

/// Role `limited` (`attributes`, password `limited-pw`) owning database `queues`, and in namespace
/// shop the JobQueue `emails` whose Secret `pg` logs in as `limited`. Returns the namespace and that URL.
async fn emails_on_a_database_owned_by_limited(f: &Fixture, attributes: &str) -> (TestNamespace, String) {
    f.pg.psql(&format!("CREATE ROLE limited {attributes} PASSWORD 'limited-pw'"));
    f.pg.psql("CREATE DATABASE queues OWNER limited");
    let ns = f.env.namespace("shop").await.unwrap();
    let url =
        f.pg.url_for("queues")
            .replace("postgres://postgres@", "postgres://limited:limited-pw@");
    ns.create_secret("pg", "url", &url).await.unwrap();
    ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
        .await
        .unwrap();
    (ns, url)
}

/// No tenant Secret in `ns`: nothing was provisioned for it.
async fn assert_no_tenant_secret(ns: &TestNamespace) {
    let secrets = ns.api::<Secret>().list(&Default::default()).await.unwrap();
    assert!(secrets.items.iter().all(|s| {
        !s.metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with(tenant::SECRET_PREFIX)
    }));
}

fn job_queue_yaml(name: &str, secret: &str, rls: Option<&str>) -> String {
    let rls = rls
        .map(|r| format!(", rowLevelSecurity: {r}"))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {{name: {name}}}
spec:
  database: {{secretRef: {{name: {secret}}}{rls}}}
  worker:
    template:
      spec:
        containers: [{{name: handler, image: "mail:1"}}]
  scaling: {{pollingInterval: 1s}}
"#
    )
}

/// Waits until JobQueue `name`'s condition `type_` has `status` and `reason`.
async fn wait_condition(ns: &TestNamespace, name: &str, type_: &str, status: &str, reason: &str) -> JobQueue {
    let api = ns.api::<JobQueue>();
    wait_for(&format!("{name}: {type_}={status} {reason}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let jq = api.get(name).await.ok()?;
            let c = jq.condition(type_)?;
            (c.status == status && c.reason == reason).then_some(jq.clone())
        }
    })
    .await
    .unwrap()
}

/// The Secret key the worker Deployment's sidecar reads `SLUICE_DATABASE_URL` from.
async fn workers_database_secret(ns: &TestNamespace, job_queue: &str) -> SecretKeySelector {
    let d = ns
        .api::<Deployment>()
        .get(&format!("{job_queue}-worker"))
        .await
        .unwrap();
    let spec = d.spec.unwrap().template.spec.unwrap();
    let sidecar = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == "sluice-sidecar")
        .unwrap();
    let var = sidecar
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "SLUICE_DATABASE_URL")
        .unwrap();
    assert_eq!(var.value, None, "never as text");
    var.value_from.clone().unwrap().secret_key_ref.unwrap()
}

async fn secret_value(ns: &TestNamespace, name: &str, key: &str) -> String {
    let s = ns.api::<Secret>().get(name).await.unwrap();
    String::from_utf8(s.data.unwrap()[key].0.clone()).unwrap()
}

/// Creates the sluice schema as the login `url` names (the schema's owner).
async fn migrate(url: &str) {
    let pool = sluice_queue::pool::options(1).connect(url).await.expect("log in");
    sluice_queue::schema::migrate(&pool).await.unwrap();
}

async fn connect(url: &str) -> QueueStore {
    QueueStore::new(sluice_queue::pool::options(1).connect(url).await.expect("log in"))
}

/// The tenant role a JobQueue's status names; one the operator named has this database's hash in it.
fn tenant_role(jq: &JobQueue) -> String {
    jq.status
        .as_ref()
        .and_then(|s| s.tenant_role.clone())
        .expect("status.tenantRole")
}

/// Whether `role` has the shape of a tenant role the operator names for namespace `ns`.
fn named_by_the_operator(role: &str, ns: &str) -> bool {
    let re = regex::Regex::new(&format!("^sluice_[0-9a-f]{{10}}_{}$", regex::escape(ns))).unwrap();
    re.is_match(role)
}

#[tokio::test]
async fn the_workers_log_in_as_their_namespace_s_tenant_and_see_only_its_queues() {
    let f = fixture().await;
    let (shop, blog) = (
        f.env.namespace("shop").await.unwrap(),
        f.env.namespace("blog").await.unwrap(),
    );
    for ns in [&shop, &blog] {
        ns.create_secret("pg", "url", &f.pg.url()).await.unwrap();
        ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
            .await
            .unwrap();
    }
    let mut roles = Vec::new();
    for ns in [&shop, &blog] {
        let jq = wait_condition(ns, "emails", "Ready", "True", "AsExpected").await;
        let role = tenant_role(&jq);
        assert!(named_by_the_operator(&role, ns.name()), "{role}");
        assert!(jq.condition("Ready").unwrap().message.contains(&role));
        roles.push(role.clone());
        // The workers read the tenant Secret, by reference.
        let r = workers_database_secret(ns, "emails").await;
        let name = tenant::secret_name(jq.spec.database.source().unwrap());
        assert_eq!((r.name.as_str(), r.key.as_str()), (name.as_str(), "url"));
        assert_eq!(secret_value(ns, &name, "username").await, role);
        let password = secret_value(ns, &name, "password").await;
        assert!(password.len() >= 32);
        let status = serde_json::to_string(&jq.status).unwrap();
        assert!(!status.contains(&password), "the password is not in the status");
    }
    // Two namespaces, two roles.
    let registered = f
        .pg
        .psql("SELECT string_agg(role_name || '=' || namespace, ',' ORDER BY namespace) FROM sluice.tenants");
    assert_eq!(
        registered,
        format!("{}={},{}={}", roles[1], blog.name(), roles[0], shop.name())
    );

    // The tenant's URL logs in (a wrong password does not) and reaches its namespace's queue only.
    let name = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::SecretRef(
        &sluice_crds::job_queue::SecretKeyRef {
            name: "pg".into(),
            key: "url".into(),
        },
    ));
    let url = secret_value(&shop, &name, "url").await;
    let store = connect(&url).await;
    let (mine, theirs) = (
        format!("{}/emails", shop.name()),
        format!("{}/emails", blog.name()),
    );
    store
        .enqueue(&mine, &NewJob::new("send", serde_json::json!({})))
        .await
        .unwrap();
    assert!(
        store
            .enqueue(&theirs, &NewJob::new("send", serde_json::json!({})))
            .await
            .is_err()
    );
    let visible: Vec<String> = sqlx::query_scalar("SELECT name FROM sluice.queues ORDER BY name")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(visible, [mine]);
    let wrong = url.replace(&secret_value(&shop, &name, "password").await, "wrong-password");
    assert!(sluice_queue::pool::options(1).connect(&wrong).await.is_err());
}

#[tokio::test]
async fn job_queues_of_one_namespace_on_one_database_share_the_role_and_its_password() {
    let f = fixture().await;
    let ns = f.env.namespace("shop").await.unwrap();
    // Two Secrets naming the same database (with another parameter), and two JobQueues on the first.
    ns.create_secret("pg", "url", &f.pg.url()).await.unwrap();
    ns.create_secret("pg-too", "url", &format!("{}?application_name=other", f.pg.url()))
        .await
        .unwrap();
    for (jq, secret) in [("emails", "pg"), ("thumbs", "pg"), ("reports", "pg-too")] {
        ns.apply_yaml(&job_queue_yaml(jq, secret, None)).await.unwrap();
    }
    let mut secrets = Vec::new();
    for jq in ["emails", "thumbs", "reports"] {
        wait_condition(&ns, jq, "Ready", "True", "AsExpected").await;
        secrets.push(workers_database_secret(&ns, jq).await.name);
    }
    assert_eq!(secrets[0], secrets[1], "one Secret for one reference");
    assert_ne!(secrets[0], secrets[2]);
    let shared = ns.api::<Secret>().get(&secrets[0]).await.unwrap();
    let mut owners: Vec<String> = shared
        .metadata
        .owner_references
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    owners.sort();
    assert_eq!(owners, ["emails", "thumbs"]);
    // One password for the role: both Secrets log in.
    assert_eq!(
        secret_value(&ns, &secrets[0], "password").await,
        secret_value(&ns, &secrets[2], "password").await
    );
    for s in [&secrets[0], &secrets[2]] {
        let url = secret_value(&ns, s, "url").await;
        connect(&url)
            .await
            .queue(&format!("{}/emails", ns.name()))
            .await
            .unwrap();
    }
    assert!(
        secret_value(&ns, &secrets[2], "url")
            .await
            .contains("application_name=other")
    );
    assert_eq!(f.pg.psql("SELECT count(*) FROM sluice.tenants"), "1");

    // The Secret goes with the last JobQueue using it, not before.
    let jqs = ns.api::<JobQueue>();
    jqs.delete("emails", &DeleteParams::default()).await.unwrap();
    let deployments = ns.api::<Deployment>();
    wait_for("emails' workers to be collected", DEADLINE, || {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt("emails-worker")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
    let api = ns.api::<Secret>();
    assert!(
        api.get_opt(&secrets[0]).await.unwrap().is_some(),
        "thumbs still uses it"
    );
    jqs.delete("thumbs", &DeleteParams::default()).await.unwrap();
    wait_for("the shared Secret to be collected", DEADLINE, || {
        let (api, name) = (api.clone(), secrets[0].clone());
        async move { api.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_owner_without_createrole_gets_a_condition_and_no_worker() {
    let f = fixture().await;
    let (ns, _) = emails_on_a_database_owned_by_limited(&f, "LOGIN").await;
    let jq = wait_condition(&ns, "emails", "Ready", "False", "TenantNotProvisioned").await;
    let message = jq.condition("Ready").unwrap().message.clone();
    assert!(message.contains("CREATEROLE"), "{message}");
    assert!(message.contains("rowLevelSecurity: Disabled"), "{message}");
    // No worker at all, so none with the owner's login; no tenant Secret either.
    assert!(
        ns.api::<Deployment>()
            .get_opt("emails-worker")
            .await
            .unwrap()
            .is_none()
    );
    assert_no_tenant_secret(&ns).await;

    // Granted the right, the next try provisions it.
    f.pg.psql("ALTER ROLE limited CREATEROLE");
    wait_condition(&ns, "emails", "Ready", "True", "AsExpected").await;
    assert_eq!(
        workers_database_secret(&ns, "emails").await.name,
        tenant::secret_name(jq.spec.database.source().unwrap())
    );
}

#[tokio::test]
async fn disabled_hands_the_workers_the_job_queue_s_own_secret() {
    let f = fixture().await;
    let ns = f.env.namespace("shop").await.unwrap();
    ns.create_secret("pg", "url", &f.pg.url()).await.unwrap();
    ns.apply_yaml(&job_queue_yaml("emails", "pg", Some("Disabled")))
        .await
        .unwrap();
    let jq = wait_condition(&ns, "emails", "Ready", "True", "AsExpected").await;
    assert!(jq.condition("Ready").unwrap().message.contains("not isolated"));
    let r = workers_database_secret(&ns, "emails").await;
    assert_eq!((r.name.as_str(), r.key.as_str()), ("pg", "url"));
    assert_eq!(f.pg.psql("SELECT count(*) FROM sluice.tenants"), "0");
    // The queue is still there for the user's login.
    let store = connect(&f.pg.url()).await;
    store
        .upsert_queue(&QueueSettings::defaults(format!("{}/other", ns.name())))
        .await
        .unwrap();
}

#[tokio::test]
async fn two_operator_replicas_provisioning_at_once_agree_on_one_password() {
    // Two replicas (each its own pool and memory) provision, at the same moment, two JobQueues of one
    // namespace that name two Secrets of one database: both tenant Secrets end with the one password
    // the role has, whichever replica went first.
    let f = fixture().await;
    f.stop.cancel(); // this test drives provisioning itself
    let ns = f.env.namespace("shop").await.unwrap();
    ns.create_secret("pg", "url", &f.pg.url()).await.unwrap();
    ns.create_secret("pg-too", "url", &format!("{}?application_name=other", f.pg.url()))
        .await
        .unwrap();
    let mut queues = Vec::new();
    for (jq, secret) in [("emails", "pg"), ("reports", "pg-too")] {
        ns.apply_yaml(&job_queue_yaml(jq, secret, None)).await.unwrap();
        queues.push(ns.api::<JobQueue>().get(jq).await.unwrap());
    }
    sluice_queue::schema::migrate(&sluice_queue::pool::connect_lazy(&f.pg.url(), 2).unwrap())
        .await
        .unwrap();
    for _ in 0..3 {
        let runs = queues.iter().map(|jq| {
            let client = f.env.client();
            let owner = format!(
                "{}{}",
                f.pg.url(),
                if jq
                    .spec
                    .database
                    .secret_ref
                    .as_ref()
                    .is_some_and(|r| r.name == "pg")
                {
                    ""
                } else {
                    "?application_name=other"
                }
            );
            async move {
                let pool = sluice_queue::pool::connect_lazy(&owner, 2).unwrap();
                tenant::provision(&client, &pool, &Default::default(), jq, &owner, None).await
            }
        });
        for r in futures::future::join_all(runs).await {
            r.unwrap();
        }
    }
    let names: Vec<String> = queues
        .iter()
        .map(|jq| tenant::secret_name(jq.spec.database.source().unwrap()))
        .collect();
    let a = secret_value(&ns, &names[0], "password").await;
    assert_eq!(a, secret_value(&ns, &names[1], "password").await);
    for name in &names {
        connect(&secret_value(&ns, name, "url").await).await;
    }
}

#[tokio::test]
async fn a_secret_that_logs_in_as_the_namespace_s_tenant_is_used_as_it_is() {
    let f = fixture().await;
    let ns = f.env.namespace("shop").await.unwrap();
    // The setup documented before automatic provisioning: the admin makes the namespace's tenant (the
    // schema made first, by its owner) and gives the namespace the tenant's URL only.
    migrate(&f.pg.url()).await;
    f.pg.psql(&format!(
        "SELECT sluice.ensure_tenant('shop_app', '{}', 'shop-app-pw')",
        ns.name()
    ));
    let url =
        f.pg.url()
            .replace("postgres://postgres@", "postgres://shop_app:shop-app-pw@");
    ns.create_secret("pg", "url", &url).await.unwrap();
    ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
        .await
        .unwrap();
    let jq = wait_condition(&ns, "emails", "Ready", "True", "AsExpected").await;
    let message = jq.condition("Ready").unwrap().message.clone();
    assert!(message.contains("isolated as tenant \"shop_app\""), "{message}");
    let status = jq.status.clone().unwrap();
    assert_eq!(status.tenant_role.as_deref(), Some("shop_app"));
    // The workers get the JobQueue's own Secret; nothing was provisioned.
    let r = workers_database_secret(&ns, "emails").await;
    assert_eq!((r.name.as_str(), r.key.as_str()), ("pg", "url"));
    assert_eq!(
        f.pg.psql("SELECT string_agg(role_name, ',') FROM sluice.tenants"),
        "shop_app"
    );
    assert_no_tenant_secret(&ns).await;
}

#[tokio::test]
async fn a_failed_reprovisioning_keeps_the_workers_and_their_scaling() {
    let f = fixture().await;
    let (ns, url) = emails_on_a_database_owned_by_limited(&f, "LOGIN CREATEROLE").await;
    let jq = wait_condition(&ns, "emails", "Ready", "True", "AsExpected").await;
    let name = tenant::secret_name(jq.spec.database.source().unwrap());

    // The owner loses CREATEROLE, and a changed tenant Secret makes the operator ensure the role again.
    f.pg.psql("ALTER ROLE limited NOCREATEROLE");
    let secrets = ns.api::<Secret>();
    let mut s = secrets.get(&name).await.unwrap();
    s.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("touched".into(), "yes".into());
    secrets.replace(&name, &PostParams::default(), &s).await.unwrap();
    let jq = wait_condition(&ns, "emails", "Degraded", "True", "TenantNotProvisioned").await;
    assert_eq!(jq.condition("Ready").unwrap().status, "True");
    let message = jq.condition("Degraded").unwrap().message.clone();
    assert!(message.contains("CREATEROLE"), "{message}");

    // Scaling goes on: a job wakes the queue from zero, with the tenant Secret the workers had.
    connect(&url)
        .await
        .enqueue(
            &format!("{}/emails", ns.name()),
            &NewJob::new("send", serde_json::json!({})),
        )
        .await
        .unwrap();
    let deployments = ns.api::<Deployment>();
    wait_for("the workers to scale to 1", DEADLINE, || {
        let api = deployments.clone();
        async move {
            let d = api.get("emails-worker").await.ok()?;
            (d.spec?.replicas? >= 1).then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(workers_database_secret(&ns, "emails").await.name, name);
}

#[tokio::test]
async fn a_session_holding_the_provisioning_lock_delays_its_namespace_only() {
    use sqlx::Connection;
    let f = fixture().await;
    let (shop, blog) = (
        f.env.namespace("shop").await.unwrap(),
        f.env.namespace("blog").await.unwrap(),
    );
    migrate(&f.pg.url()).await;
    // A session of the schema's owner (here the superuser) holding the namespace's row, in an open
    // transaction.
    let mut holder = sqlx::PgConnection::connect(&f.pg.url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query(
        "INSERT INTO sluice.tenant_locks (namespace) VALUES ($1) \
         ON CONFLICT (namespace) DO UPDATE SET namespace = EXCLUDED.namespace",
    )
    .bind(shop.name())
    .execute(&mut holder)
    .await
    .unwrap();
    for ns in [&shop, &blog] {
        ns.create_secret("pg", "url", &f.pg.url()).await.unwrap();
        ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
            .await
            .unwrap();
    }
    wait_condition(&blog, "emails", "Ready", "True", "AsExpected").await;
    let jq = wait_condition(&shop, "emails", "Ready", "False", "TenantNotProvisioned").await;
    let message = jq.condition("Ready").unwrap().message.clone();
    assert!(message.contains("provisioning lock"), "{message}");

    holder.close().await.unwrap();
    wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
}

#[tokio::test]
async fn a_tenant_cannot_hold_up_another_namespaces_provisioning() {
    use sqlx::Connection;
    let f = fixture().await;
    let (shop, blog) = (
        f.env.namespace("shop").await.unwrap(),
        f.env.namespace("blog").await.unwrap(),
    );
    blog.create_secret("pg", "url", &f.pg.url()).await.unwrap();
    blog.apply_yaml(&job_queue_yaml("emails", "pg", None))
        .await
        .unwrap();
    wait_condition(&blog, "emails", "Ready", "True", "AsExpected").await;
    let tenant_url = secret_value(&blog, &workers_database_secret(&blog, "emails").await.name, "url").await;

    // Blog's tenant holds the advisory lock an earlier release provisioned shop under, and may not
    // lock shop's row of the table provisioning locks now.
    let mut tenant = sqlx::PgConnection::connect(&tenant_url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('sluice.tenant/' || $1, 0))")
        .bind(shop.name())
        .execute(&mut tenant)
        .await
        .unwrap();
    let denied = sqlx::query("SELECT namespace FROM sluice.tenant_locks FOR UPDATE")
        .execute(&mut tenant)
        .await
        .unwrap_err();
    assert_eq!(
        denied.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("42501"),
        "{denied}"
    );

    shop.create_secret("pg", "url", &f.pg.url()).await.unwrap();
    shop.apply_yaml(&job_queue_yaml("emails", "pg", None))
        .await
        .unwrap();
    wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
    tenant.close().await.unwrap();
}

#[tokio::test]
async fn a_new_tenant_password_rolls_the_workers() {
    let f = fixture().await;
    let ns = f.env.namespace("shop").await.unwrap();
    ns.create_secret("pg", "url", &f.pg.url()).await.unwrap();
    ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
        .await
        .unwrap();
    let jq = wait_condition(&ns, "emails", "Ready", "True", "AsExpected").await;
    let name = tenant::secret_name(jq.spec.database.source().unwrap());
    let deployments = ns.api::<Deployment>();
    let annotation = |d: Deployment| {
        d.spec?
            .template
            .metadata?
            .annotations?
            .get("sluice.dev/tenant-password-hash")
            .cloned()
    };
    let first = secret_value(&ns, &name, "password").await;
    let before = annotation(deployments.get("emails-worker").await.unwrap());
    assert_eq!(before, Some(tenant::password_hash(&first)));
    assert!(!before.unwrap().contains(&first));

    // Rotating by hand: the Secret deleted, the next reconcile makes a new password.
    ns.api::<Secret>()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let rotated = wait_for("a new password in the workers' template", DEADLINE, || {
        let (deployments, secrets) = (deployments.clone(), ns.api::<Secret>());
        let name = name.clone();
        async move {
            let password = secrets.get_opt(&name).await.ok()??.data?["password"].0.clone();
            let password = String::from_utf8(password).ok()?;
            let hash = annotation(deployments.get("emails-worker").await.ok()?)?;
            (hash == tenant::password_hash(&password)).then_some(password)
        }
    })
    .await
    .unwrap();
    assert_ne!(rotated, first);
}

#[tokio::test]
async fn one_namespace_gets_a_tenant_in_each_database_of_one_server() {
    let f = fixture().await;
    let ns = f.env.namespace("shop").await.unwrap();
    // The name an earlier release gave the namespace's tenant in every database, made first by another
    // login of the server: it stands in the way of nothing now.
    f.pg.psql(&format!(
        "CREATE ROLE \"sluice_ns_{}\" LOGIN PASSWORD 'squatter-pw'",
        ns.name()
    ));
    f.pg.psql("CREATE DATABASE second");
    let owners = [f.pg.url(), f.pg.url_for("second")];
    ns.create_secret("pg", "url", &owners[0]).await.unwrap();
    ns.create_secret("pg-second", "url", &owners[1]).await.unwrap();
    for (jq, secret) in [("emails", "pg"), ("reports", "pg-second")] {
        ns.apply_yaml(&job_queue_yaml(jq, secret, None)).await.unwrap();
    }
    let mut tenants = Vec::new();
    for name in ["emails", "reports"] {
        let jq = wait_condition(&ns, name, "Ready", "True", "AsExpected").await;
        let role = tenant_role(&jq);
        assert!(named_by_the_operator(&role, ns.name()), "{role}");
        let secret = workers_database_secret(&ns, name).await.name;
        assert_eq!(secret_value(&ns, &secret, "username").await, role);
        let url = secret_value(&ns, &secret, "url").await;
        tenants.push((role, url, format!("{}/{name}", ns.name())));
    }
    assert_ne!(tenants[0].0, tenants[1].0, "one role per database");

    for (i, (role, url, queue)) in tenants.iter().enumerate() {
        // Each tenant works in its own database and sees that database's rows only.
        connect(&owners[i])
            .await
            .enqueue(queue, &NewJob::new("send", serde_json::json!({})))
            .await
            .unwrap();
        let store = connect(url).await;
        let visible: Vec<String> = sqlx::query_scalar("SELECT queue FROM sluice.jobs")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(&visible, std::slice::from_ref(queue), "{role}");
        // In the other database it may log in (PUBLIC's CONNECT) but is no tenant and reads nothing.
        let other = ["postgres", "second"][1 - i];
        let (base, _) = url.rsplit_once('/').unwrap();
        let there = connect(&format!("{base}/{other}")).await;
        let e = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sluice.jobs")
            .fetch_one(there.pool())
            .await
            .expect_err("no grant in the other database");
        assert_eq!(
            e.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("42501"),
            "{role}: {e}"
        );
    }
    assert_eq!(
        f.pg.psql("SELECT count(*) FROM sluice.tenants WHERE role_name LIKE 'sluice\\_ns\\_%'"),
        "0"
    );
}

#[tokio::test]
async fn a_namespace_s_registered_tenant_keeps_its_role_whatever_its_name() {
    use sluice_crds::{
        contract::label::{MANAGED_BY, MANAGED_BY_VALUE},
        secret_ref::SecretKeyRef,
    };
    let f = fixture().await;
    let (shop, blog) = (
        f.env.namespace("shop").await.unwrap(),
        f.env.namespace("blog").await.unwrap(),
    );
    // The database as the previous release left it: the schema through migration 0016, shop's tenant
    // `sluice_ns_shop` with the tenant Secret the operator wrote for it, and blog's tenant made by the
    // database's admin under a name of their own.
    let owner = f.pg.url();
    let pool = sluice_queue::pool::options(1).connect(&owner).await.unwrap();
    sluice_queue::schema::migrator_through(16)
        .run(&pool)
        .await
        .unwrap();
    let old_role = format!("sluice_ns_{}", shop.name());
    let password = tenant::generate_password().unwrap();
    sqlx::query(sluice_queue::sql::TENANT_ENSURE)
        .bind(&old_role)
        .bind(shop.name())
        .bind(tenant::scram_verifier(&password).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    f.pg.psql(&format!(
        "SELECT sluice.ensure_tenant('blog_app', '{}', 'blog-app-pw')",
        blog.name()
    ));
    let source = SecretKeyRef {
        name: "pg".into(),
        key: "url".into(),
    };
    let tenant_secret = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::SecretRef(&source));
    let old = Secret {
        metadata: ObjectMeta {
            name: Some(tenant_secret.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.into(), MANAGED_BY_VALUE.into()),
                (
                    tenant::DATABASE_LABEL.into(),
                    tenant::database_id(&owner).unwrap(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (
                tenant::URL_KEY.into(),
                ByteString(
                    tenant::tenant_url(&owner, &old_role, &password)
                        .unwrap()
                        .into_bytes(),
                ),
            ),
            (
                tenant::USERNAME_KEY.into(),
                ByteString(old_role.clone().into_bytes()),
            ),
            (
                tenant::PASSWORD_KEY.into(),
                ByteString(password.clone().into_bytes()),
            ),
        ])),
        ..Secret::default()
    };
    shop.api::<Secret>()
        .create(&PostParams::default(), &old)
        .await
        .unwrap();

    // The new operator: both namespaces' JobQueues on the owner's Secret.
    for ns in [&shop, &blog] {
        ns.create_secret("pg", "url", &owner).await.unwrap();
        ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
            .await
            .unwrap();
    }
    let jq = wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
    assert_eq!(tenant_role(&jq), old_role);
    // The same role and password: the workers log in as before and are not rolled.
    assert_eq!(workers_database_secret(&shop, "emails").await.name, tenant_secret);
    assert_eq!(secret_value(&shop, &tenant_secret, "password").await, password);
    let worker = shop.api::<Deployment>().get("emails-worker").await.unwrap();
    let template = worker.spec.unwrap().template.metadata.unwrap();
    assert_eq!(
        template.annotations.unwrap()["sluice.dev/tenant-password-hash"],
        tenant::password_hash(&password)
    );
    let store = connect(&secret_value(&shop, &tenant_secret, "url").await).await;
    store
        .enqueue(
            &format!("{}/emails", shop.name()),
            &NewJob::new("send", serde_json::json!({})),
        )
        .await
        .unwrap();

    // The admin's tenant is the one the operator provisions, with a password of its own.
    let jq = wait_condition(&blog, "emails", "Ready", "True", "AsExpected").await;
    assert_eq!(tenant_role(&jq), "blog_app");
    assert_eq!(secret_value(&blog, &tenant_secret, "username").await, "blog_app");
    let queue = connect(&secret_value(&blog, &tenant_secret, "url").await)
        .await
        .queue(&format!("{}/emails", blog.name()))
        .await
        .unwrap();
    assert!(queue.is_some());
    assert_eq!(
        f.pg.psql("SELECT string_agg(role_name, ',' ORDER BY role_name) FROM sluice.tenants"),
        format!("blog_app,{old_role}")
    );
}

/// The operator's own namespace (the fixture's `Settings::namespace`), holding `owner-pg`, the URL of
/// role `owner` (`CREATEROLE`, password `owner-pw`) owning database `queues`; and QueueDatabase
/// `shared` on it, admitting namespaces labelled `team: <team>`. Returns the owner's URL.
async fn shared_queue_database(f: &Fixture, team: &str) -> String {
    f.pg.psql("CREATE ROLE owner LOGIN CREATEROLE PASSWORD 'owner-pw'");
    f.pg.psql("CREATE DATABASE queues OWNER owner");
    let url =
        f.pg.url_for("queues")
            .replace("postgres://postgres@", "postgres://owner:owner-pw@");
    f.env
        .apply_yaml(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: sluice-system}\n",
            None,
        )
        .await
        .unwrap();
    let secrets: kube::Api<Secret> = kube::Api::namespaced(f.env.client(), "sluice-system");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("owner-pg".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "url".into(),
            ByteString(url.clone().into_bytes()),
        )])),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    f.env
        .apply_yaml(&queue_database_yaml("shared", team), None)
        .await
        .unwrap();
    url
}

fn queue_database_yaml(name: &str, team: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: QueueDatabase\nmetadata: {{name: {name}}}\nspec:\n  \
         secretRef: {{name: owner-pg}}\n  namespaceSelector: {{matchLabels: {{team: {team}}}}}\n"
    )
}

fn job_queue_on_queue_database_yaml(name: &str, database: &str) -> String {
    job_queue_yaml(name, "unused", None).replace(
        "database: {secretRef: {name: unused}}",
        &format!("database: {{queueDatabaseRef: {{name: {database}}}}}"),
    )
}

async fn label_namespace(f: &Fixture, ns: &TestNamespace, key: &str, value: &str) {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(f.env.client());
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    namespaces
        .patch(
            ns.name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn with_a_queue_database_the_namespace_holds_the_tenant_s_url_and_never_the_owner_s() {
    let f = fixture().await;
    let owner_url = shared_queue_database(&f, "shop").await;
    let shop = f.env.namespace("shop").await.unwrap();
    label_namespace(&f, &shop, "team", "shop").await;
    shop.apply_yaml(&job_queue_on_queue_database_yaml("emails", "shared"))
        .await
        .unwrap();
    let jq = wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
    let role = jq.status.clone().unwrap().tenant_role.unwrap();
    assert!(jq.condition("Ready").unwrap().message.contains(&role));

    // The workers read the tenant Secret, named for the QueueDatabase.
    let name = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::QueueDatabase("shared"));
    let r = workers_database_secret(&shop, "emails").await;
    assert_eq!((r.name.as_str(), r.key.as_str()), (name.as_str(), "url"));
    assert_eq!(secret_value(&shop, &name, "username").await, role);

    // No Secret in the namespace holds the owner's URL or password.
    for s in shop
        .api::<Secret>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
    {
        for (key, value) in s.data.unwrap_or_default() {
            let value = String::from_utf8_lossy(&value.0).into_owned();
            assert!(
                !value.contains("owner-pw") && !value.contains("owner:") && value != owner_url,
                "Secret {:?} key {key} holds the owner's credentials",
                s.metadata.name
            );
        }
    }

    // The tenant's URL logs in as the tenant and reaches this namespace's queue only.
    let store = connect(&secret_value(&shop, &name, "url").await).await;
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(user, role);
    let visible: Vec<String> = sqlx::query_scalar("SELECT name FROM sluice.queues ORDER BY name")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(visible, [format!("{}/emails", shop.name())]);
}

#[tokio::test]
async fn a_namespace_the_selector_does_not_admit_is_refused_until_it_is_labelled() {
    let f = fixture().await;
    shared_queue_database(&f, "shop").await;
    let blog = f.env.namespace("blog").await.unwrap();
    blog.apply_yaml(&job_queue_on_queue_database_yaml("emails", "shared"))
        .await
        .unwrap();
    let jq = wait_condition(&blog, "emails", "Ready", "False", "NamespaceNotAllowed").await;
    let message = &jq.condition("Ready").unwrap().message;
    assert!(
        message.contains("\"shared\"")
            && message.contains(blog.name())
            && message.contains("namespaceSelector"),
        "{message}"
    );
    assert_no_tenant_secret(&blog).await;
    assert!(
        blog.api::<Deployment>()
            .get_opt("emails-worker")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        f.pg.psql(&format!(
            "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'sluice%' AND rolname LIKE '%{}'",
            blog.name()
        )),
        "0",
        "no tenant role was made"
    );

    // Labelled as the selector asks, the namespace is admitted without touching the JobQueue.
    label_namespace(&f, &blog, "team", "shop").await;
    wait_condition(&blog, "emails", "Ready", "True", "AsExpected").await;
}

#[tokio::test]
async fn a_missing_queue_database_is_reported_and_used_once_created() {
    let f = fixture().await;
    shared_queue_database(&f, "shop").await;
    let shop = f.env.namespace("shop").await.unwrap();
    label_namespace(&f, &shop, "team", "shop").await;
    shop.apply_yaml(&job_queue_on_queue_database_yaml("emails", "later"))
        .await
        .unwrap();
    let jq = wait_condition(&shop, "emails", "Ready", "False", "QueueDatabaseNotFound").await;
    assert!(jq.condition("Ready").unwrap().message.contains("\"later\""));
    assert_no_tenant_secret(&shop).await;

    // Created, it is used without touching the JobQueue.
    f.env
        .apply_yaml(&queue_database_yaml("later", "shop"), None)
        .await
        .unwrap();
    wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
    let name = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::QueueDatabase("later"));
    assert_eq!(workers_database_secret(&shop, "emails").await.name, name);
}

#[tokio::test]
async fn a_queue_named_before_namespaces_on_a_queue_database_is_never_adopted_by_a_tenant() {
    let f = fixture().await;
    let owner_url = shared_queue_database(&f, "shop").await;
    // Another team's queue `emails`, named without a namespace by an earlier release, with jobs.
    migrate(&owner_url).await;
    let owner = connect(&owner_url).await;
    owner
        .upsert_queue(&QueueSettings::defaults("emails"))
        .await
        .unwrap();
    for n in 0..2 {
        owner
            .enqueue("emails", &NewJob::new("send", serde_json::json!({ "n": n })))
            .await
            .unwrap();
    }
    // An admitted namespace's JobQueue of that name, the only one claiming it, does not take it.
    let shop = f.env.namespace("shop").await.unwrap();
    label_namespace(&f, &shop, "team", "shop").await;
    shop.apply_yaml(&job_queue_on_queue_database_yaml("emails", "shared"))
        .await
        .unwrap();
    // Adoption is decided before the status is written, in the same reconcile: once Ready, it is done.
    // (The Degraded condition reports the missing external metrics API first, in this fixture.)
    let jq = wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
    assert_eq!(jq.status.unwrap().depth.unwrap().ready, 0);
    assert!(
        owner.queue("emails").await.unwrap().is_some(),
        "the old queue stays"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE queue = 'emails'")
        .fetch_one(owner.pool())
        .await
        .unwrap();
    assert_eq!(left, 2, "nothing moved into the namespace");
}

#[tokio::test]
async fn a_registered_tenant_that_could_step_out_of_row_level_security_is_refused() {
    let f = fixture().await;
    // The schema's owner `limited`, registered by hand as the namespace's tenant: were it provisioned,
    // the workers would log in as the tables' owner, which the policies do not limit.
    f.pg.psql("CREATE ROLE limited LOGIN CREATEROLE PASSWORD 'limited-pw'");
    f.pg.psql("CREATE DATABASE queues OWNER limited");
    let ns = f.env.namespace("shop").await.unwrap();
    let url =
        f.pg.url_for("queues")
            .replace("postgres://postgres@", "postgres://limited:limited-pw@");
    migrate(&url).await;
    let owner = connect(&url).await;
    let register = |role: &'static str| {
        sqlx::query("INSERT INTO sluice.tenants (role_name, namespace) VALUES ($1, $2)")
            .bind(role)
            .bind(ns.name().to_owned())
            .execute(owner.pool())
    };
    register("limited").await.unwrap();
    ns.create_secret("pg", "url", &url).await.unwrap();
    ns.apply_yaml(&job_queue_yaml("emails", "pg", None))
        .await
        .unwrap();
    let jq = wait_condition(&ns, "emails", "Ready", "False", "TenantNotProvisioned").await;
    let message = jq.condition("Ready").unwrap().message.clone();
    assert!(
        message.contains("row-level security does not limit it"),
        "{message}"
    );
    assert!(
        message.contains("DELETE FROM sluice.tenants WHERE role_name = 'limited'"),
        "{message}"
    );
    assert!(
        ns.api::<Deployment>()
            .get_opt("emails-worker")
            .await
            .unwrap()
            .is_none()
    );
    assert_no_tenant_secret(&ns).await;
    // Workers never got its login, and its password is the one it had.
    connect(&url).await;

    // A role that owns a table: refused by ensure_tenant, which the operator explains.
    let admin = connect(&f.pg.url_for("queues")).await;
    sqlx::raw_sql(
        "DELETE FROM sluice.tenants; CREATE ROLE reporting LOGIN; CREATE TABLE public.report (x int); \
         ALTER TABLE public.report OWNER TO reporting",
    )
    .execute(admin.pool())
    .await
    .unwrap();
    register("reporting").await.unwrap();
    let api = ns.api::<JobQueue>();
    wait_for("the refusal of reporting", DEADLINE, || {
        let api = api.clone();
        async move {
            let jq = api.get("emails").await.ok()?;
            let c = jq.condition("Ready")?;
            (c.reason == "TenantNotProvisioned" && c.message.contains("owns objects"))
                .then_some(c.message.clone())
        }
    })
    .await
    .map(|m| {
        assert!(
            m.contains("DELETE FROM sluice.tenants WHERE role_name = 'reporting'"),
            "{m}"
        )
    })
    .unwrap();
    assert_no_tenant_secret(&ns).await;

    // Without the row, the operator makes the namespace a tenant role of its own.
    sqlx::query("DELETE FROM sluice.tenants")
        .execute(owner.pool())
        .await
        .unwrap();
    let jq = wait_condition(&ns, "emails", "Ready", "True", "AsExpected").await;
    assert!(
        named_by_the_operator(&tenant_role(&jq), ns.name()),
        "{}",
        tenant_role(&jq)
    );
}

// Revocation: a namespace QueueDatabase `shared` stops admitting loses its tenant's login, whatever the
// namespace did to its own objects first. Each test below does one thing a namespace controls before
// the admin removes its label; the role is revoked all the same, because the operator reads the
// database's registry, not the namespace's JobQueues or Secrets.

/// Namespace shop, admitted by QueueDatabase `shared`, with JobQueue `emails` Ready on it. Returns the
/// namespace, its tenant role and the tenant's URL.
async fn admitted_shop(f: &Fixture) -> (TestNamespace, String, String) {
    shared_queue_database(f, "shop").await;
    let shop = f.env.namespace("shop").await.unwrap();
    label_namespace(f, &shop, "team", "shop").await;
    shop.apply_yaml(&job_queue_on_queue_database_yaml("emails", "shared"))
        .await
        .unwrap();
    let jq = wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
    let role = tenant_role(&jq);
    let name = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::QueueDatabase("shared"));
    let url = secret_value(&shop, &name, "url").await;
    (shop, role, url)
}

/// `rolcanlogin` of `role`, as the superuser reads it.
fn can_log_in(f: &Fixture, role: &str) -> String {
    f.pg.psql(&format!(
        "SELECT rolcanlogin FROM pg_roles WHERE rolname = '{role}'"
    ))
}

/// Removes the label QueueDatabase `shared` admits `ns` by, then waits until its Ready condition says
/// it revoked `ns` (from what the database answered) and checks that the role may not log in.
async fn deadmit_and_await_revocation(f: &Fixture, ns: &TestNamespace, role: &str, url: &str) {
    label_namespace(f, ns, "team", "elsewhere").await;
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    let needle = format!("{} (role \"{role}\": may no longer log in", ns.name());
    wait_for("QueueDatabase shared reports the revocation", DEADLINE, || {
        let (api, needle) = (api.clone(), needle.clone());
        async move {
            let qdb = api.get("shared").await.ok()?;
            let c = qdb.condition("Ready")?;
            (c.status == "True" && c.message.contains(&needle)).then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(can_log_in(f, role), "f");
    // Refused (with the password the namespace holds, if it still holds the first one).
    let refused = sluice_queue::pool::options(1).connect(url).await.unwrap_err();
    assert!(
        ["not permitted to log in", "password authentication failed"]
            .iter()
            .any(|m| refused.to_string().contains(m)),
        "{refused}"
    );
    // The owner kept no membership in the tenant.
    assert_eq!(
        f.pg.psql(&format!(
            "SELECT count(*) FROM pg_auth_members WHERE roleid = '{role}'::regrole"
        )),
        "0"
    );
}

#[tokio::test]
async fn a_namespace_that_deleted_its_job_queues_is_revoked_all_the_same() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    shop.api::<JobQueue>()
        .delete("emails", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("emails is gone", DEADLINE, || {
        let api = shop.api::<JobQueue>();
        async move { api.get_opt("emails").await.unwrap().is_none().then_some(()) }
    })
    .await
    .unwrap();
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
}

#[tokio::test]
async fn a_namespace_that_switched_to_a_secret_of_its_own_is_revoked_all_the_same() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    // The tenant's URL copied into a Secret of the namespace's own, the JobQueue pointed at it: it no
    // longer names the QueueDatabase, and its login is the namespace's registered tenant.
    shop.create_secret("copied", "url", &url).await.unwrap();
    shop.api::<JobQueue>()
        .patch(
            "emails",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"spec": {"database": {
                "queueDatabaseRef": null,
                "secretRef": {"name": "copied"},
            }}})),
        )
        .await
        .unwrap();
    wait_for("emails uses its own Secret", DEADLINE, || {
        let api = shop.api::<JobQueue>();
        async move {
            let jq = api.get("emails").await.ok()?;
            (jq.status?.tenant_login == Some(sluice_crds::job_queue::TenantLogin::SecretRef)).then_some(())
        }
    })
    .await
    .unwrap();
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
}

#[tokio::test]
async fn a_namespace_that_relabelled_its_tenant_secret_is_revoked_all_the_same() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    let name = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::QueueDatabase("shared"));
    shop.api::<Secret>()
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"metadata": {"labels": {
                "app.kubernetes.io/managed-by": null,
                tenant::DATABASE_LABEL: "another",
            }}})),
        )
        .await
        .unwrap();
    // The JobQueue goes too, so nothing writes the labels back.
    shop.api::<JobQueue>()
        .delete("emails", &DeleteParams::default())
        .await
        .unwrap();
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
}

#[tokio::test]
async fn a_tenant_owning_a_large_object_and_holding_a_temporary_table_is_revoked() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    // A job waiting, so the operator runs a worker.
    connect(&url)
        .await
        .enqueue(
            &format!("{}/emails", shop.name()),
            &NewJob::new("send", serde_json::json!({})),
        )
        .await
        .unwrap();
    let replicas = |n: i32| {
        let api = shop.api::<Deployment>();
        move || {
            let api = api.clone();
            async move {
                let d = api.get("emails-worker").await.ok()?;
                (d.spec?.replicas == Some(n)).then_some(())
            }
        }
    };
    wait_for("one worker", DEADLINE, replicas(1)).await.unwrap();
    let mut held = sqlx::postgres::PgConnection::connect(&url).await.unwrap();
    sqlx::query("SELECT lo_create(0)")
        .execute(&mut held)
        .await
        .unwrap();
    sqlx::query("CREATE TEMP TABLE hold ()")
        .execute(&mut held)
        .await
        .unwrap();
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
    // The session holding the temporary table was ended, and the workers scaled to zero.
    assert!(sqlx::query("SELECT 1").execute(&mut held).await.is_err());
    wait_condition(&shop, "emails", "Ready", "False", "NamespaceNotAllowed").await;
    wait_for("no worker", DEADLINE, replicas(0)).await.unwrap();
}

#[tokio::test]
async fn with_a_noinherit_owner_the_tenant_s_open_sessions_are_ended() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    f.pg.psql("ALTER ROLE owner NOINHERIT");
    let mut open = sqlx::postgres::PgConnection::connect(&url).await.unwrap();
    sqlx::query("SELECT 1").execute(&mut open).await.unwrap();
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
    assert!(sqlx::query("SELECT 1").execute(&mut open).await.is_err());
    assert_eq!(
        f.pg.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'"
        )),
        "0"
    );
}

#[tokio::test]
async fn a_login_taken_behind_the_operator_s_back_is_given_back_while_the_namespace_is_admitted() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    // A revocation that committed NOLOGIN and stopped there (the operator restarted before deleting
    // the tenant Secret), then the namespace admitted again: the Secret is the very version this
    // process provisioned, and the JobQueue's next reconcile must not take it as done.
    f.pg.psql(&format!("ALTER ROLE \"{role}\" NOLOGIN"));
    wait_for("the tenant may log in again", DEADLINE, || {
        let ok = can_log_in(&f, &role) == "t";
        async move { ok.then_some(()) }
    })
    .await
    .unwrap();
    connect(&url).await;
    wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;

    // Revoked for real, then admitted again: LOGIN comes back with a new Secret.
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
    label_namespace(&f, &shop, "team", "shop").await;
    wait_for("the tenant may log in again", DEADLINE, || {
        let ok = can_log_in(&f, &role) == "t";
        async move { ok.then_some(()) }
    })
    .await
    .unwrap();
    let name = tenant::secret_name(sluice_crds::job_queue::DatabaseSource::QueueDatabase("shared"));
    wait_for("a new tenant Secret", DEADLINE, || {
        let api = shop.api::<Secret>();
        let name = name.clone();
        async move { api.get_opt(&name).await.ok()?.map(|_| ()) }
    })
    .await
    .unwrap();
    connect(&secret_value(&shop, &name, "url").await).await;
}

#[tokio::test]
async fn deleting_the_queue_database_revokes_every_namespace_it_admitted() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    wait_for("the finalizer is set", DEADLINE, || {
        let api = api.clone();
        async move {
            let qdb = api.get("shared").await.ok()?;
            qdb.finalizers()
                .iter()
                .any(|x| x == queue_database::FINALIZER)
                .then_some(())
        }
    })
    .await
    .unwrap();
    api.delete("shared", &DeleteParams::default()).await.unwrap();
    wait_for("QueueDatabase shared is gone", DEADLINE, || {
        let api = api.clone();
        async move { api.get_opt("shared").await.unwrap().is_none().then_some(()) }
    })
    .await
    .unwrap();
    assert_eq!(can_log_in(&f, &role), "f");
    assert!(sluice_queue::pool::options(1).connect(&url).await.is_err());
    wait_condition(&shop, "emails", "Ready", "False", "QueueDatabaseNotFound").await;
}

#[tokio::test]
async fn a_namespace_another_queue_database_on_the_database_admits_keeps_its_login() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    // QueueDatabase `other`, on the same database (the same owner Secret), admits namespaces labelled
    // `also: yes`.
    f.env
        .apply_yaml(
            &queue_database_yaml("other", "unused").replace("{team: unused}", "{also: 'yes'}"),
            None,
        )
        .await
        .unwrap();
    label_namespace(&f, &shop, "also", "yes").await;
    label_namespace(&f, &shop, "team", "elsewhere").await;
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    let needle = format!(
        "{} (another QueueDatabase admits it: 1 tenant Secret(s) deleted)",
        shop.name()
    );
    wait_for("shared reports the release", DEADLINE, || {
        let (api, needle) = (api.clone(), needle.clone());
        async move {
            let c = api.get("shared").await.ok()?.condition("Ready")?.clone();
            (c.status == "True" && c.message.contains(&needle)).then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(can_log_in(&f, &role), "t");
    connect(&url).await;
}

#[tokio::test]
async fn an_invalid_selector_revokes_nothing() {
    let f = fixture().await;
    let (_shop, role, url) = admitted_shop(&f).await;
    f.env
        .apply_yaml(
            &queue_database_yaml("shared", "shop").replace(
                "{matchLabels: {team: shop}}",
                "{matchExpressions: [{key: team, operator: In}]}",
            ),
            None,
        )
        .await
        .unwrap();
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    wait_for("shared reports its invalid selector", DEADLINE, || {
        let api = api.clone();
        async move {
            let c = api.get("shared").await.ok()?.condition("Ready")?.clone();
            (c.status == "False" && c.reason == "NamespaceNotAllowed").then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(can_log_in(&f, &role), "t");
    connect(&url).await;
}

/// Waits until a statement containing `text` waits on a lock, as `probe` (a superuser's pool) sees it.
async fn await_lock_wait(probe: &sqlx::PgPool, text: &str, what: &str) {
    wait_for(what, DEADLINE, || {
        let (probe, like) = (probe.clone(), format!("%{text}%"));
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
            )
            .bind(like)
            .fetch_one(&probe)
            .await
            .ok()?;
            (waiting >= 1).then_some(())
        }
    })
    .await
    .unwrap();
}

/// Whether QueueDatabase `shared` admitted namespace `shop` and, if so, revoked it since.
fn admission(pg: &PgServer) -> String {
    pg.psql(
        "SELECT coalesce((SELECT revoked_at IS NOT NULL FROM sluice.tenant_admissions \
         WHERE namespace = 'shop' AND queue_database = 'shared')::text, 'none')",
    )
}

/// Whether provisioning through QueueDatabase `shared` refuses namespace `shop`, read as provisioning
/// reads it: under the namespace's provisioning lock.
async fn provisioning_refused(owner: &QueueStore) -> bool {
    let mut tx = owner.pool().begin().await.unwrap();
    sqlx::query(tenant::LOCK_NAMESPACE)
        .bind("shop")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query_scalar(sluice_queue::sql::TENANT_ADMISSION_REVOKED)
        .bind("shop")
        .bind("shared")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
}

// A JobQueue reconcile that checked the admission before the namespace was de-admitted (held up, even
// by the tenant's own lock on its queue row) and provisions once it gets the namespace's lock: if it
// holds the lock first, taking LOGIN waits for it and revokes after; if it comes after, it finds the
// admission marked revoked and refuses. Only the QueueDatabase's pass that finds the namespace
// admitted again clears the mark.
#[tokio::test]
async fn a_provisioning_under_way_during_a_revocation_cannot_give_the_login_back() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    migrate(&pg.url()).await;
    let owner = connect(&pg.url()).await;
    owner.ensure_tenant("sluice_t_shop", "shop", "pw").await.unwrap();
    sqlx::query(sluice_queue::sql::TENANT_ADMISSION_PROVISIONED)
        .bind("shop")
        .bind("shared")
        .execute(owner.pool())
        .await
        .unwrap();
    assert_eq!(admission(&pg), "false");
    assert!(!provisioning_refused(&owner).await);

    // A provisioning under way holds the namespace's lock and gives LOGIN; taking it waits.
    let mut provisioning = owner.pool().begin().await.unwrap();
    sqlx::query(tenant::LOCK_NAMESPACE)
        .bind("shop")
        .execute(&mut *provisioning)
        .await
        .unwrap();
    sqlx::query("ALTER ROLE sluice_t_shop LOGIN")
        .execute(&mut *provisioning)
        .await
        .unwrap();
    let pool = sluice_queue::pool::options(1).connect(&pg.url()).await.unwrap();
    let take = tokio::spawn(async move {
        sluice_operator::revocation::take_login(&pool, "shared", "shop", "sluice_t_shop").await
    });
    let probe = sluice_queue::pool::options(1).connect(&pg.url()).await.unwrap();
    await_lock_wait(
        &probe,
        "tenant_locks",
        "taking LOGIN waits for the namespace's lock",
    )
    .await;
    provisioning.commit().await.unwrap();
    assert_eq!(take.await.unwrap(), Ok(true));
    assert_eq!(
        pg.psql("SELECT rolcanlogin FROM pg_roles WHERE rolname = 'sluice_t_shop'"),
        "f"
    );
    assert_eq!(admission(&pg), "true");

    // A provisioning after it is refused, and its record would not clear the mark.
    assert!(provisioning_refused(&owner).await);
    sqlx::query(sluice_queue::sql::TENANT_ADMISSION_PROVISIONED)
        .bind("shop")
        .bind("shared")
        .execute(owner.pool())
        .await
        .unwrap();
    assert_eq!(admission(&pg), "true");

    // The QueueDatabase's pass that finds the namespace admitted again clears it.
    sqlx::query(sluice_queue::sql::TENANT_ADMISSIONS_RECORD)
        .bind(vec!["shop".to_owned()])
        .bind("shared")
        .execute(owner.pool())
        .await
        .unwrap();
    assert_eq!(admission(&pg), "false");
    assert!(!provisioning_refused(&owner).await);
}

// A sweep the database stops part way (here it refuses to record an admission, after the revocation)
// reports what it revoked before it stopped, in a TenantsRevoked Event (and the status, until the next
// pass), and the status says why it stopped.
#[tokio::test]
async fn a_sweep_stopped_part_way_reports_what_it_revoked() {
    let f = fixture().await;
    let (shop, role, _url) = admitted_shop(&f).await;
    // Another namespace the selector admits, with a tenant registered by hand: the sweep records its
    // admission after revoking shop, and the database refuses that.
    let superuser = sluice_queue::pool::options(1)
        .connect(&f.pg.url_for("queues"))
        .await
        .unwrap();
    let blog = f.env.namespace("blog").await.unwrap();
    sqlx::query("INSERT INTO sluice.tenants (role_name, namespace) VALUES ('blog_by_hand', $1)")
        .bind(blog.name())
        .execute(&superuser)
        .await
        .unwrap();
    for statement in [
        "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$BEGIN RAISE EXCEPTION 'admissions refused'; END$$",
        "CREATE TRIGGER refuse BEFORE INSERT ON sluice.tenant_admissions \
         FOR EACH STATEMENT EXECUTE FUNCTION public.refuse()",
    ] {
        sqlx::query(statement).execute(&superuser).await.unwrap();
    }
    label_namespace(&f, &blog, "team", "shop").await;
    label_namespace(&f, &shop, "team", "elsewhere").await;

    // The pass that revoked shop is the one to report it: the next finds it forgotten. Its Events
    // stay; the status says why the passes stop.
    let revoked = format!("revoked: {} (role \"{role}\": may no longer log in", shop.name());
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(f.env.client());
    wait_for("a TenantsRevoked Event names shop", DEADLINE, || {
        let (events, revoked) = (events.clone(), revoked.clone());
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("TenantsRevoked")
                        && e.note.as_deref().is_some_and(|n| n.contains(&revoked))
                })
                .then_some(())
        }
    })
    .await
    .unwrap();
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    let qdb = api.get("shared").await.unwrap();
    let c = qdb.condition("Ready").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "RevocationFailed"),
        "{}",
        c.message
    );
    assert!(c.message.contains("stopped before the end"), "{}", c.message);
    assert_eq!(can_log_in(&f, &role), "f");
}

// A QueueDatabase the operator has not taken over (no finalizer yet: created while the QueueDatabase
// controller is not running) provisions nobody, since deleting it would revoke nothing; once the
// finalizer is there, it does.
#[tokio::test]
async fn a_queue_database_without_its_finalizer_provisions_nobody() {
    let f = fixture_with(false).await;
    shared_queue_database(&f, "shop").await;
    let shop = f.env.namespace("shop").await.unwrap();
    label_namespace(&f, &shop, "team", "shop").await;
    shop.apply_yaml(&job_queue_on_queue_database_yaml("emails", "shared"))
        .await
        .unwrap();
    let jq = wait_condition(&shop, "emails", "Ready", "False", "QueueDatabasePending").await;
    let c = jq.condition("Ready").unwrap();
    assert!(c.message.contains("sluice.dev/revoke-tenants"), "{}", c.message);
    assert_no_tenant_secret(&shop).await;
    assert_eq!(
        f.pg.psql("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'sluice\\_%'"),
        "0"
    );
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    let patch = serde_json::json!({"metadata": {"finalizers": [queue_database::FINALIZER]}});
    api.patch(
        "shared",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    wait_condition(&shop, "emails", "Ready", "True", "AsExpected").await;
}

// Deleting a QueueDatabase retires it in the database, by uid, before revoking: the retirement waits
// for a provisioning through it that is under way (so the revocation sees its admission), and a
// provisioning that comes later is refused in the database, whatever its reconcile read of the
// QueueDatabase before: no admission is recorded after the revocation, when nothing would sweep it.
// Provisionings through another QueueDatabase (another uid, the same name made again included) neither
// wait nor are refused.
#[tokio::test]
async fn retiring_a_queue_database_waits_for_provisionings_through_it_and_refuses_later_ones() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    migrate(&pg.url()).await;
    let owner = QueueStore::new(sluice_queue::pool::options(4).connect(&pg.url()).await.unwrap());
    /// A provisioning's transaction through QueueDatabase uid `uid`, named `shared`, holding its row:
    /// whether it is retired.
    async fn provisioning(
        owner: &QueueStore,
        uid: &str,
    ) -> (sqlx::Transaction<'static, sqlx::Postgres>, bool) {
        let mut tx = owner.pool().begin().await.unwrap();
        sqlx::query(sluice_queue::sql::QUEUE_DATABASE_REGISTER)
            .bind(uid)
            .bind("shared")
            .execute(&mut *tx)
            .await
            .unwrap();
        let retired = sqlx::query_scalar(sluice_queue::sql::QUEUE_DATABASE_HELD_RETIRED)
            .bind(uid)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        (tx, retired)
    }
    // Under way through uid-1: it records the admission.
    let (mut under_way, retired) = provisioning(&owner, "uid-1").await;
    assert!(!retired);
    sqlx::query(sluice_queue::sql::TENANT_ADMISSION_PROVISIONED)
        .bind("shop")
        .bind("shared")
        .execute(&mut *under_way)
        .await
        .unwrap();
    let pool = sluice_queue::pool::options(1).connect(&pg.url()).await.unwrap();
    let retire =
        tokio::spawn(async move { sluice_operator::revocation::retire(&pool, "uid-1", "shared").await });
    let probe = sluice_queue::pool::options(1).connect(&pg.url()).await.unwrap();
    await_lock_wait(
        &probe,
        "INSERT INTO sluice.queue_databases",
        "the retirement waits for the provisioning",
    )
    .await;
    // Another QueueDatabase's provisioning does not wait behind it.
    let (other, retired) = provisioning(&owner, "uid-2").await;
    assert!(!retired);
    other.commit().await.unwrap();
    assert!(!retire.is_finished());
    under_way.commit().await.unwrap();
    retire.await.unwrap().unwrap();
    // The revocation after it sees the admission.
    assert_eq!(admission(&pg), "false");

    // A provisioning through uid-1 after it finds it retired; through uid-2 (the name made again) not.
    let (late, retired) = provisioning(&owner, "uid-1").await;
    assert!(retired);
    late.rollback().await.unwrap();
    let (again, retired) = provisioning(&owner, "uid-2").await;
    assert!(!retired);
    again.rollback().await.unwrap();
    // Retiring again changes nothing.
    sluice_operator::revocation::retire(owner.pool(), "uid-1", "shared")
        .await
        .unwrap();
    assert_eq!(
        pg.psql("SELECT uid, retired_at IS NOT NULL FROM sluice.queue_databases ORDER BY uid"),
        "uid-1|t\nuid-2|f"
    );
}

// The end-to-end form of the race above: a JobQueue reconcile that checked the admission is held up
// (here on its queue's row, which another session holds with `SELECT … FOR UPDATE`: the tenant can do
// that to its own queue, though ending its sessions would release it) until after the namespace was
// de-admitted and its revocation completed. When it goes on to provision, it finds the admission
// marked revoked and is refused: the role stays unable to log in.
#[tokio::test]
async fn a_reconcile_held_up_past_the_revocation_cannot_give_the_login_back() {
    let f = fixture().await;
    let (shop, role, _url) = admitted_shop(&f).await;
    let superuser = sluice_queue::pool::options(2)
        .connect(&f.pg.url_for("queues"))
        .await
        .unwrap();
    let mut held = superuser.begin().await.unwrap();
    let queue = format!("{}/emails", shop.name());
    sqlx::query("SELECT 1 FROM sluice.queues WHERE name = $1 FOR UPDATE")
        .bind(&queue)
        .fetch_one(&mut *held)
        .await
        .unwrap();
    // A change to the JobQueue: its reconcile passes the admission check and waits on the row.
    let patch = serde_json::json!({"metadata": {"annotations": {"touched": "1"}}});
    shop.api::<JobQueue>()
        .patch(
            "emails",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let probe = superuser.clone();
    await_lock_wait(&probe, "sluice.queues", "the reconcile waits on the queue's row").await;
    label_namespace(&f, &shop, "team", "elsewhere").await;
    let api: kube::Api<QueueDatabase> = kube::Api::all(f.env.client());
    wait_for("the revocation is complete", DEADLINE, || {
        let (api, probe, role, ns) = (api.clone(), probe.clone(), role.clone(), shop.name().to_owned());
        async move {
            let qdb = api.get("shared").await.ok()?;
            let c = qdb.condition("Ready")?;
            let (complete, login): (bool, bool) = sqlx::query_as(
                "SELECT (SELECT revocation_complete FROM sluice.tenant_admissions \
                          WHERE namespace = $1 AND queue_database = 'shared'), \
                        (SELECT rolcanlogin FROM pg_roles WHERE rolname = $2)",
            )
            .bind(ns)
            .bind(role)
            .fetch_one(&probe)
            .await
            .ok()?;
            (c.status == "True" && complete && !login).then_some(())
        }
    })
    .await
    .unwrap();
    // The held-up reconcile goes on, and the next one after it reports the namespace refused.
    held.rollback().await.unwrap();
    wait_condition(&shop, "emails", "Ready", "False", "NamespaceNotAllowed").await;
    assert_eq!(can_log_in(&f, &role), "f");
}

// A session of a revoked role that outlived its revocation (one that passed the login check as LOGIN was
// taken and was not listed yet when the sessions were ended; here made by hand) is ended by a later pass.
#[tokio::test]
async fn a_later_pass_ends_a_session_that_outlived_the_revocation() {
    let f = fixture().await;
    let (shop, role, url) = admitted_shop(&f).await;
    deadmit_and_await_revocation(&f, &shop, &role, &url).await;
    f.pg.psql(&format!("ALTER ROLE \"{role}\" LOGIN PASSWORD 'by-hand'"));
    let by_hand = url.replacen(
        &url[url.find("://").unwrap() + 3..url.find('@').unwrap()],
        &format!("{role}:by-hand"),
        1,
    );
    let tenant = sluice_queue::pool::options(1).connect(&by_hand).await.unwrap();
    let mut session = tenant.acquire().await.unwrap();
    f.pg.psql(&format!("ALTER ROLE \"{role}\" NOLOGIN"));
    sqlx::query("SELECT 1").execute(&mut *session).await.unwrap();
    // Any namespace's labels changing makes a pass.
    label_namespace(&f, &shop, "touched", "1").await;
    wait_for("the session is ended", DEADLINE, || {
        let role = role.clone();
        let pg = &f.pg;
        async move {
            let left = pg.psql(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'"
            ));
            (left == "0").then_some(())
        }
    })
    .await
    .unwrap();
    assert!(sqlx::query("SELECT 1").execute(&mut *session).await.is_err());
}
