//! Row-level security on a real PostgreSQL: a namespace's tenant role, logged in on its own connection,
//! runs the whole queue (enqueue, claim, heartbeat, complete, dependencies, cancel, rescue, retention,
//! schedules) on its namespace's queues, and raw SQL through that connection can neither read, claim,
//! complete, cancel, insert nor move another namespace's jobs, nor turn the limits off.

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, GraphJob, NewJob, QueueSettings, QueueStore, UniqueMode,
    schedule::MissedRuns,
    schema,
    store::{Finish, Finished, Schedule},
};
use sluice_testsupport::PgServer;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

async fn connect(url: &str) -> PgPool {
    sluice_queue::pool::options(4)
        .connect(url)
        .await
        .expect("connect")
}

/// The server, the owner's store (the operator's login), and tenant `a`'s store (logged in as its role).
async fn setup() -> (PgServer, QueueStore, QueueStore) {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let owner = QueueStore::new(connect(&pg.url()).await);
    schema::migrate(owner.pool()).await.unwrap();
    for (role, ns) in [("sluice_tenant_a", "a"), ("sluice_tenant_b", "b")] {
        owner.ensure_tenant(role, ns, "secret-1").await.unwrap();
        owner.ensure_tenant(role, ns, "secret-2").await.unwrap();
    }
    for q in ["a/q", "b/q"] {
        owner.upsert_queue(&QueueSettings::defaults(q)).await.unwrap();
    }
    let url = pg
        .url()
        .replace("postgres://postgres@", "postgres://sluice_tenant_a:secret-2@");
    let tenant = QueueStore::new(connect(&url).await);
    (pg, owner, tenant)
}

fn job(n: i64) -> NewJob {
    NewJob::new("work", json!({ "n": n }))
}

async fn db_code<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> String {
    let e = r.expect_err("refused");
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_else(|| panic!("not a database error: {e}"))
}

#[tokio::test]
async fn a_tenant_runs_its_own_queues_and_sees_nothing_of_another_namespace() {
    let (_pg, owner, a) = setup().await;
    // b's jobs: one waiting, one running (held by b's worker), one dead.
    let b_waiting = owner.enqueue("b/q", &job(1)).await.unwrap().id;
    let b_running = owner.enqueue("b/q", &job(2)).await.unwrap().id;
    let held = owner
        .claim_batch("b/q", "b-worker", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let b_attempt = held.iter().find(|j| j.id == b_running).unwrap().attempt;
    let b_first = held.iter().find(|j| j.id == b_waiting).unwrap().attempt;
    owner
        .finish_batch(
            "b-worker",
            &[Finished {
                id: b_waiting,
                attempt: b_first,
                finish: Finish::Permanent { error: "x".into() },
            }],
        )
        .await
        .unwrap();
    let b_dead = b_waiting;

    // The tenant's own worker path works, migrations included (nothing to do, nothing to create).
    schema::migrate(a.pool())
        .await
        .expect("a current schema needs no rights");
    a.ensure_queue("a/q").await.unwrap();
    a.upsert_queue(&QueueSettings::defaults("a/other")).await.unwrap();
    let parent = a.enqueue("a/q", &job(10)).await.unwrap().id;
    let child = a.enqueue("a/q", &job(11).depends_on([parent])).await.unwrap().id;
    let claimed = a
        .claim_batch("a/q", "a-worker", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [parent]);
    let beat = a
        .heartbeat("a-worker", &[(parent, 1)], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(beat.len(), 1);
    a.finish_batch(
        "a-worker",
        &[Finished {
            id: parent,
            attempt: 1,
            finish: Finish::Succeeded,
        }],
    )
    .await
    .unwrap();
    let c = a.get(child).await.unwrap().unwrap();
    assert_eq!(c.state.to_string(), "pending", "the trigger released the child");
    a.cancel(child).await.unwrap();
    assert_eq!(a.depth("a/q").await.unwrap().unwrap().ready, 0);

    // Nothing of b can be seen ...
    assert!(a.depth("b/q").await.unwrap().is_none());
    let all: Vec<String> = a
        .depth_all()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.queue)
        .collect();
    assert_eq!(all, ["a/other", "a/q"]);
    for id in [b_dead, b_running] {
        assert!(a.get(id).await.unwrap().is_none());
        assert!(a.queues_of(&[id]).await.unwrap().is_empty());
    }
    // ... claimed, completed, renewed, handed back, cancelled, retried or rescued ...
    owner.enqueue("b/q", &job(3)).await.unwrap();
    assert!(
        a.claim_batch("b/q", "a-worker", 10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty()
    );
    let forged = [Finished {
        id: b_running,
        attempt: b_attempt,
        finish: Finish::Succeeded,
    }];
    assert!(a.finish_batch("b-worker", &forged).await.unwrap().is_empty());
    assert!(
        a.heartbeat("b-worker", &[(b_running, b_attempt)], Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        a.release("b-worker", &[(b_running, b_attempt)])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(a.cancel(b_running).await, Err(Error::NotFound(_))));
    assert!(matches!(a.retry_dead(b_dead).await, Err(Error::NotFound(_))));
    assert_eq!(a.rescue_expired(&["b/q".into()], 100).await.unwrap(), 0);
    // ... enqueued into, depended on, paused or adopted.
    assert!(matches!(a.enqueue("b/q", &job(4)).await, Err(Error::NotFound(_))));
    assert!(a.enqueue("a/q", &job(5).depends_on([b_running])).await.is_err());
    assert!(a.set_paused("b/q", true).await.is_err());
    // Adopting is the owner's alone (it locks the jobs table for every namespace).
    assert!(matches!(
        a.adopt_queue("b/q", "a/stolen").await,
        Err(Error::Database(sqlx::Error::Database(e))) if e.code().as_deref() == Some("42501")
    ));

    // b is as it was.
    let running = owner.get(b_running).await.unwrap().unwrap();
    assert_eq!(running.state.to_string(), "running");
    assert_eq!(
        owner.get(b_dead).await.unwrap().unwrap().state.to_string(),
        "dead"
    );
    assert_eq!(owner.depth("b/q").await.unwrap().unwrap().ready, 1);
    assert!(!owner.queue("b/q").await.unwrap().unwrap().paused);
}

#[tokio::test]
async fn raw_sql_on_a_tenant_connection_cannot_reach_another_namespace_or_lift_the_limits() {
    let (_pg, owner, a) = setup().await;
    let b_job = owner.enqueue("b/q", &job(1)).await.unwrap().id;
    owner
        .claim_batch("b/q", "b-worker", 1, Duration::from_secs(60))
        .await
        .unwrap();
    owner.enqueue("a/q", &job(2)).await.unwrap();
    let mut conn = a.pool().acquire().await.unwrap();
    let count = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql);

    assert_eq!(
        count("SELECT count(*) FROM sluice.jobs")
            .fetch_one(&mut *conn)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM sluice.queues")
            .fetch_one(&mut *conn)
            .await
            .unwrap(),
        1
    );
    // Writes to b's rows match nothing.
    for sql in [
        "UPDATE sluice.jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL WHERE queue = 'b/q'",
        "UPDATE sluice.jobs SET cancel_requested = true",
        "DELETE FROM sluice.jobs WHERE queue <> 'a/q'",
        "UPDATE sluice.queues SET paused = true WHERE name = 'b/q'",
        "DELETE FROM sluice.queues WHERE name = 'b/q'",
    ] {
        let done = sqlx::query(sql).execute(&mut *conn).await.unwrap();
        let touched_b = sql.contains("b/q") || sql.contains("<>");
        assert!(!touched_b || done.rows_affected() == 0, "{sql}");
    }
    sqlx::query("UPDATE sluice.jobs SET cancel_requested = false")
        .execute(&mut *conn)
        .await
        .unwrap();
    // Rows cannot be written into b's namespace, nor moved there.
    let insert = "INSERT INTO sluice.jobs (id, queue, kind, payload, max_attempts) VALUES (gen_random_uuid(), 'b/q', 'x', '{}', 1)";
    assert_eq!(
        db_code(sqlx::query(insert).execute(&mut *conn).await).await,
        "42501"
    );
    let moved = "UPDATE sluice.jobs SET queue = 'b/q' WHERE queue = 'a/q'";
    assert_eq!(
        db_code(sqlx::query(moved).execute(&mut *conn).await).await,
        "42501"
    );
    let queue = "INSERT INTO sluice.queues (name) VALUES ('b/mine')";
    assert_eq!(
        db_code(sqlx::query(queue).execute(&mut *conn).await).await,
        "42501"
    );
    let subscribe =
        "INSERT INTO sluice.event_subscriptions (queue, subscriber, expires_at) VALUES ('b/q', 'x', now())";
    assert_eq!(
        db_code(sqlx::query(subscribe).execute(&mut *conn).await).await,
        "42501"
    );
    let unprefixed = "INSERT INTO sluice.queues (name) VALUES ('global')";
    assert_eq!(
        db_code(sqlx::query(unprefixed).execute(&mut *conn).await).await,
        "42501"
    );
    // The limits cannot be lifted: no other role, no owner's rights, no bypass, no new tenant row.
    for sql in [
        "SET ROLE postgres",
        "SET ROLE sluice_tenant_b",
        "SET SESSION AUTHORIZATION postgres",
        "ALTER TABLE sluice.jobs DISABLE ROW LEVEL SECURITY",
        "DROP POLICY jobs_tenant ON sluice.jobs",
        "UPDATE sluice.tenants SET namespace = 'b'",
        "INSERT INTO sluice.tenants (role_name, namespace) VALUES ('sluice_tenant_a', 'b')",
        "CREATE FUNCTION sluice.tenant_prefix_2() RETURNS text LANGUAGE sql AS $$ SELECT '' $$",
        "CREATE OR REPLACE FUNCTION sluice.tenant_prefix() RETURNS text LANGUAGE sql AS $$ SELECT '' $$",
        "SELECT sluice.ensure_tenant('sluice_tenant_a', 'b', 'x')",
        "ALTER ROLE sluice_tenant_a BYPASSRLS",
        // The key the operator names new tenant roles with is the owner's alone.
        "SELECT key FROM sluice.tenant_naming",
    ] {
        let code = db_code(sqlx::query(sql).execute(&mut *conn).await).await;
        assert!(
            ["42501", "42P01", "42883", "SL409"].contains(&code.as_str()),
            "{sql}: {code}"
        );
    }
    // RESET ROLE is no way out: the tenant logged in as itself.
    sqlx::query("RESET ROLE").execute(&mut *conn).await.unwrap();
    assert_eq!(
        count("SELECT count(*) FROM sluice.jobs")
            .fetch_one(&mut *conn)
            .await
            .unwrap(),
        1
    );
    // Turning row security off makes queries fail rather than see more.
    sqlx::query("SET row_security = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        db_code(
            count("SELECT count(*) FROM sluice.jobs")
                .fetch_one(&mut *conn)
                .await
        )
        .await,
        "42501"
    );
    drop(conn);

    // b's job is untouched, and the owner still sees every namespace.
    let b = owner.get(b_job).await.unwrap().unwrap();
    assert_eq!(
        (b.state.to_string(), b.cancel_requested),
        ("running".into(), false)
    );
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(owner.pool())
        .await
        .unwrap();
    assert_eq!(all, 2);
    assert!(!owner.queue("b/q").await.unwrap().unwrap().paused);
}

#[tokio::test]
async fn a_tenant_role_is_not_taken_from_elsewhere() {
    let (_pg, owner, _a) = setup().await;
    sqlx::query("CREATE ROLE app LOGIN")
        .execute(owner.pool())
        .await
        .unwrap();
    // A role that exists and is no tenant is not turned into one; a namespace keeps its one role.
    assert!(matches!(
        owner.ensure_tenant("app", "c", "p").await,
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        owner.ensure_tenant("sluice_tenant_other", "a", "p").await,
        Err(Error::Conflict(_))
    ));
    // A role that is no tenant keeps what its grants give it (here: nothing; the owner everything).
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.queues")
        .fetch_one(owner.pool())
        .await
        .unwrap();
    assert_eq!(n, 2);
}

#[tokio::test]
async fn a_tenant_that_may_create_objects_cannot_shadow_what_the_policies_call() {
    let (_pg, owner, a) = setup().await;
    owner.enqueue("b/q", &job(1)).await.unwrap();
    owner.enqueue("a/q", &job(2)).await.unwrap();
    // As `public` is on PostgreSQL 14 and older: a schema the tenant may create objects in.
    sqlx::raw_sql("CREATE SCHEMA scratch; GRANT USAGE, CREATE ON SCHEMA scratch TO sluice_tenant_a")
        .execute(owner.pool())
        .await
        .unwrap();
    let mut conn = a.pool().acquire().await.unwrap();
    // Its own `text || text` that yields '', searched before pg_catalog: were the policies' prefix
    // built with it, the prefix would be '' and every namespace's rows would match.
    sqlx::raw_sql(
        "CREATE FUNCTION scratch.empty(text, text) RETURNS text LANGUAGE sql AS $$ SELECT ''::text $$; \
         CREATE OPERATOR scratch.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = scratch.empty); \
         SET search_path = scratch, pg_catalog",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let shadowed: String = sqlx::query_scalar("SELECT 'a'::text || '/'::text")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(shadowed, "", "the operator is in effect in this session");
    let visible: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(visible, 1, "the tenant still sees its own job only");

    // Nor can it adopt queues (a lock on the whole jobs table) or make tenants.
    for sql in [
        "SELECT sluice.adopt_queue('a/q', 'a/r')",
        "SELECT sluice.ensure_tenant('sluice_tenant_a', 'a', 'x')",
    ] {
        assert_eq!(
            db_code(sqlx::query(sql).execute(&mut *conn).await).await,
            "42501",
            "{sql}"
        );
    }
}

#[tokio::test]
async fn a_tenant_role_that_is_a_member_of_another_role_is_refused() {
    let (_pg, owner, _a) = setup().await;
    // A membership granted after the tenant was made: the tenant could SET ROLE to `reporting` and act
    // as a login that row-level security does not limit.
    sqlx::raw_sql("CREATE ROLE reporting; GRANT reporting TO sluice_tenant_a")
        .execute(owner.pool())
        .await
        .unwrap();
    let e = sqlx::query(sluice_queue::sql::TENANT_ENSURE)
        .bind("sluice_tenant_a")
        .bind("a")
        .bind("secret-3")
        .execute(owner.pool())
        .await
        .expect_err("a member of another role");
    let db = e.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("SL409"));
    assert!(db.message().contains("member of reporting"), "{}", db.message());
    // Without the membership, it is a tenant to ensure again.
    sqlx::query("REVOKE reporting FROM sluice_tenant_a")
        .execute(owner.pool())
        .await
        .unwrap();
    owner
        .ensure_tenant("sluice_tenant_a", "a", "secret-3")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_tenant_role_stays_with_its_namespace() {
    let (_pg, owner, _a) = setup().await;
    // a's role named for namespace c: refused (before, a's password was reset and the call answered ok).
    assert!(matches!(
        owner.ensure_tenant("sluice_tenant_a", "c", "other").await,
        Err(Error::Conflict(_))
    ));
    let namespace: String =
        sqlx::query_scalar("SELECT namespace FROM sluice.tenants WHERE role_name = 'sluice_tenant_a'")
            .fetch_one(owner.pool())
            .await
            .unwrap();
    assert_eq!(namespace, "a");
}

/// A schema owner that is a CREATEROLE login and no superuser (the usual owner on a managed PostgreSQL)
/// provisions a namespace's tenant again, as the operator does with every new tenant Secret: the
/// existing role gets the new password and keeps none of the attributes a tenant must not have. Until
/// migration 0026 the function's ALTER named NOSUPERUSER, NOREPLICATION and NOBYPASSRLS, which only a
/// superuser may name, and every provisioning of an existing tenant failed for such an owner.
#[tokio::test]
async fn a_createrole_owner_provisions_an_existing_tenant_again() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    pg.psql(
        "CREATE ROLE createrole_owner LOGIN CREATEROLE; ALTER DATABASE postgres OWNER TO createrole_owner",
    );
    let url = pg
        .url()
        .replace("postgres://postgres@", "postgres://createrole_owner@");
    let owner = QueueStore::new(connect(&url).await);
    schema::migrate(owner.pool()).await.unwrap();
    let superuser = connect(&pg.url()).await;
    let verifier = || {
        let superuser = superuser.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT rolpassword FROM pg_authid WHERE rolname = 'sluice_tenant_a'",
            )
            .fetch_one(&superuser)
            .await
            .unwrap()
        }
    };
    owner
        .ensure_tenant("sluice_tenant_a", "a", "secret-1")
        .await
        .unwrap();
    let first = verifier().await;
    // Attributes the owner's ALTER names again: INHERIT (any CREATEROLE login may take it away) and
    // CREATEDB (on PostgreSQL 16 only a login with CREATEDB may: this owner refuses the role, SL409).
    sqlx::query("ALTER ROLE sluice_tenant_a INHERIT CREATEDB")
        .execute(&superuser)
        .await
        .unwrap();
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::integer")
        .fetch_one(&superuser)
        .await
        .unwrap();
    let again = owner.ensure_tenant("sluice_tenant_a", "a", "secret-2").await;
    if version >= 160000 {
        assert!(
            matches!(&again, Err(Error::Conflict(m)) if m.contains("CREATEDB")),
            "{again:?}"
        );
        sqlx::query("ALTER ROLE sluice_tenant_a NOCREATEDB")
            .execute(&superuser)
            .await
            .unwrap();
        owner
            .ensure_tenant("sluice_tenant_a", "a", "secret-2")
            .await
            .expect("a CREATEROLE owner sets an existing tenant's password");
    } else {
        again.expect("a CREATEROLE owner sets an existing tenant's password");
    }
    assert_ne!(verifier().await, first, "the password changed");
    let attributes: (bool, bool, bool, bool, bool, bool, bool) = sqlx::query_as(
        "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication, rolinherit \
           FROM pg_roles WHERE rolname = 'sluice_tenant_a'",
    )
    .fetch_one(&superuser)
    .await
    .unwrap();
    assert_eq!(attributes, (true, false, false, false, false, false, false));

    // Attributes no CREATEROLE login may take away: the role is refused, and its password kept.
    for attribute in ["BYPASSRLS", "CREATEROLE"] {
        let before = verifier().await;
        sqlx::query(AssertSqlSafe(format!("ALTER ROLE sluice_tenant_a {attribute}")))
            .execute(&superuser)
            .await
            .unwrap();
        let refused = owner.ensure_tenant("sluice_tenant_a", "a", "secret-3").await;
        assert!(
            matches!(&refused, Err(Error::Conflict(m)) if m.contains(attribute)),
            "{attribute}: {refused:?}"
        );
        assert_eq!(verifier().await, before, "{attribute}: the password is kept");
        sqlx::query(AssertSqlSafe(format!("ALTER ROLE sluice_tenant_a NO{attribute}")))
            .execute(&superuser)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_failed_ensure_tenant_carries_no_password() {
    // An owner without CREATEROLE: the schema is its own, creating the role is refused.
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    pg.psql("CREATE ROLE limited LOGIN; GRANT CREATE ON DATABASE postgres TO limited");
    let url = pg.url().replace("postgres://postgres@", "postgres://limited@");
    let owner = QueueStore::new(connect(&url).await);
    schema::migrate(owner.pool()).await.unwrap();
    let password = "do-not-show-this-password-0123456789";
    let e = sqlx::query(sluice_queue::sql::TENANT_ENSURE)
        .bind("sluice_ns_a")
        .bind("a")
        .bind(password)
        .execute(owner.pool())
        .await
        .expect_err("no CREATEROLE");
    let db = e.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("42501"));
    let pg_err = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().unwrap();
    let everything = format!("{e} {e:?} {:?} {:?}", pg_err.r#where(), pg_err.detail());
    assert!(!everything.contains(password), "{everything}");
    assert!(everything.contains("permission denied"), "{everything}");
}

#[tokio::test]
async fn a_registered_role_that_could_step_out_of_row_level_security_is_refused() {
    let (pg, owner, _a) = setup().await;
    // Roles an admin might register by hand (a raw INSERT into sluice.tenants): were their password set
    // to a tenant's, the namespace's workers would log in as them.
    sqlx::raw_sql(
        "CREATE ROLE table_owner LOGIN; CREATE TABLE public.owned (x int); \
         ALTER TABLE public.owned OWNER TO table_owner; \
         CREATE ROLE admin_like LOGIN CREATEROLE; \
         CREATE ROLE bypasser LOGIN BYPASSRLS; \
         CREATE ROLE grouped LOGIN; CREATE ROLE someone LOGIN; GRANT grouped TO someone; \
         INSERT INTO sluice.tenants (role_name, namespace) VALUES \
           ('postgres', 'p'), ('table_owner', 'o'), ('admin_like', 'c'), ('bypasser', 'x'), ('grouped', 'g')",
    )
    .execute(owner.pool())
    .await
    .unwrap();
    let verifier_shape = "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0c2FsdA==$do-not-show-this";
    for (role, ns, says) in [
        ("postgres", "p", "is the login making tenants"),
        ("table_owner", "o", "owns objects"),
        ("admin_like", "c", "CREATEROLE"),
        ("bypasser", "x", "BYPASSRLS"),
        ("grouped", "g", "has members (someone)"),
    ] {
        let e = sqlx::query(sluice_queue::sql::TENANT_ENSURE)
            .bind(role)
            .bind(ns)
            .bind(verifier_shape)
            .execute(owner.pool())
            .await
            .expect_err(role);
        let db = e.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("SL409"), "{role}: {}", db.message());
        assert!(db.message().contains(says), "{role}: {}", db.message());
        let pg_err = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().unwrap();
        let everything = format!("{e} {e:?} {:?} {:?}", pg_err.r#where(), pg_err.detail());
        assert!(!everything.contains("do-not-show-this"), "{everything}");
    }
    // None of them got the tenant's password: the owner still logs in with no password set, the table
    // owner has none.
    let has_password: bool =
        sqlx::query_scalar("SELECT rolpassword IS NOT NULL FROM pg_authid WHERE rolname = 'table_owner'")
            .fetch_one(owner.pool())
            .await
            .unwrap();
    assert!(!has_password);
    // A role owning something in another database of the server counts too.
    pg.psql("CREATE DATABASE other");
    sqlx::raw_sql("DROP TABLE public.owned; ALTER DATABASE other OWNER TO table_owner")
        .execute(owner.pool())
        .await
        .unwrap();
    assert!(matches!(
        owner.ensure_tenant("table_owner", "o", "p").await,
        Err(Error::Conflict(m)) if m.contains("owns objects")
    ));
    // Once it owns nothing, it is a tenant like any other; and the tenants made here stay ensurable.
    sqlx::query("ALTER DATABASE other OWNER TO postgres")
        .execute(owner.pool())
        .await
        .unwrap();
    owner.ensure_tenant("table_owner", "o", "p").await.unwrap();
    owner
        .ensure_tenant("sluice_tenant_a", "a", "secret-4")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_tenant_that_may_create_in_public_runs_nothing_as_the_owner() {
    let (_pg, owner, a) = setup().await;
    // PostgreSQL before 15 (and a cluster pg_upgraded from one) let every role create in `public`.
    sqlx::raw_sql("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .execute(owner.pool())
        .await
        .unwrap();
    // Tenant a defines better matches than pg_catalog's for calls the schema's functions make: `format`
    // with (unknown, text...) arguments (`ensure_tenant`, `release_dependents`), `set_bit(bytea,
    // integer, integer)` (`uuid_v7`, every enqueue), `cardinality(uuid[])` (the enqueue paths, the
    // cascade). Each records who ran it and, run by anyone but a, drops the policy on the jobs.
    sqlx::raw_sql(
        "CREATE TABLE public.ran (who text, what text); \
         GRANT INSERT ON public.ran TO PUBLIC; \
         CREATE FUNCTION public.ran_as(p_what text) RETURNS void LANGUAGE plpgsql AS $$ \
         BEGIN \
             INSERT INTO public.ran VALUES (current_user, p_what); \
             IF current_user <> 'sluice_tenant_a' THEN \
                 DROP POLICY IF EXISTS jobs_tenant ON sluice.jobs; \
             END IF; \
         END $$; \
         CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('format'); RETURN pg_catalog.format($1, $2); END $$; \
         CREATE FUNCTION public.format(text, text, text) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('format'); RETURN pg_catalog.format($1, $2, $3); END $$; \
         CREATE FUNCTION public.format(text, text, text, text) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('format'); RETURN pg_catalog.format($1, $2, $3, $4); END $$; \
         CREATE FUNCTION public.format(text, name, text) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('format'); RETURN pg_catalog.format($1, $2, $3); END $$; \
         CREATE FUNCTION public.format(text, uuid, text) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('format'); RETURN pg_catalog.format($1, $2, $3); END $$; \
         CREATE FUNCTION public.set_bit(bytea, integer, integer) RETURNS bytea LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('set_bit'); RETURN pg_catalog.set_bit($1, $2, $3); END $$; \
         CREATE FUNCTION public.cardinality(uuid[]) RETURNS integer LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM public.ran_as('cardinality'); RETURN pg_catalog.cardinality($1); END $$;",
    )
    .execute(a.pool())
    .await
    .unwrap();
    let own = a.enqueue("a/q", &job(1)).await.unwrap().id;
    sqlx::raw_sql("DELETE FROM public.ran")
        .execute(a.pool())
        .await
        .unwrap();

    // The operator provisions another namespace and runs the owner's other paths.
    owner
        .ensure_tenant("sluice_tenant_c", "c", "secret-1")
        .await
        .unwrap();
    owner
        .ensure_tenant("sluice_tenant_c", "c", "secret-2")
        .await
        .unwrap();
    owner
        .upsert_queue(&QueueSettings::defaults("c/old"))
        .await
        .unwrap();
    owner.enqueue("c/old", &job(2)).await.unwrap();
    assert_eq!(owner.adopt_queue("c/old", "c/q").await.unwrap(), Some(1));
    owner.ensure_queue("c/q").await.unwrap();
    let parent = owner.enqueue("c/q", &job(3)).await.unwrap().id;
    owner.enqueue("c/q", &job(4).depends_on([parent])).await.unwrap();
    owner
        .enqueue("c/q", &job(5).unique("k", UniqueMode::Replace))
        .await
        .unwrap();
    owner
        .enqueue_many("c/q", &[job(6), job(7).idempotency_key("i")])
        .await
        .unwrap();
    owner
        .enqueue_graph(
            "c/q",
            &[
                GraphJob::new("x", job(8)),
                GraphJob::new("y", job(9).unique("u", UniqueMode::Preserve)).depends_on(["x"]),
            ],
        )
        .await
        .unwrap();
    owner.cancel(parent).await.unwrap();

    let ran: Vec<(String, String)> =
        sqlx::query_as("SELECT DISTINCT who, what FROM public.ran ORDER BY 1, 2")
            .fetch_all(owner.pool())
            .await
            .unwrap();
    assert_eq!(ran, [], "the tenant's functions ran");
    let policy: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_policies WHERE schemaname = 'sluice' AND policyname = 'jobs_tenant'",
    )
    .fetch_one(owner.pool())
    .await
    .unwrap();
    assert_eq!(policy, 1, "the policy on the jobs is still there");
    let (memberships, privileged): (i64, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid), \
                r.rolsuper OR r.rolcreaterole OR r.rolbypassrls \
           FROM pg_roles r WHERE r.rolname = 'sluice_tenant_a'",
    )
    .fetch_one(owner.pool())
    .await
    .unwrap();
    assert_eq!(
        (memberships, privileged),
        (0, false),
        "the tenant gained no rights"
    );
    let visible: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM sluice.jobs")
        .fetch_all(a.pool())
        .await
        .unwrap();
    assert_eq!(visible, [own], "the tenant still sees its own job only");
}

/// Every function in `sluice` runs with `search_path` pinned to pg_catalog (migrations 0014, 0020,
/// 0024-0025): a new function that forgets it would resolve names through its caller's path, where a
/// tenant may have put its own functions and operators. And none is SECURITY DEFINER: each runs with
/// its caller's rights, so a caller gains nothing by calling it (a tenant's calls stay under row-level
/// security).
/// What `sluice` is made of (constraints, defaults, policies, indexes, triggers) binds its operators
/// and functions when it is created, on the migrating login's search path: an operator of exactly the
/// types compared, planted in `public` by a role that could create there before Sluice was installed,
/// would be bound for good and run as every writer. Migration 0001's CHECK on `backoff_multiplier`
/// (a double precision against an integer, for which pg_catalog has no exact operator) was one;
/// migration 0027 makes it again with pg_catalog's operator.
#[tokio::test]
async fn nothing_the_schema_is_made_of_uses_what_a_role_planted_in_public_before_it() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let owner = connect(&pg.url()).await;
    sqlx::raw_sql(
        "GRANT CREATE ON SCHEMA public TO PUBLIC; \
         CREATE ROLE early; \
         SET ROLE early; \
         CREATE FUNCTION public.ge(double precision, integer) RETURNS boolean LANGUAGE sql \
             AS 'SELECT $1 OPERATOR(pg_catalog.>=) $2::double precision'; \
         CREATE OPERATOR public.>= (LEFTARG = double precision, RIGHTARG = integer, FUNCTION = public.ge); \
         RESET ROLE;",
    )
    .execute(&owner)
    .await
    .unwrap();
    let planted_in = |what: &'static str| {
        format!(
            "SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) FROM pg_catalog.pg_depend d \
              JOIN pg_catalog.pg_operator o ON d.refclassid = 'pg_catalog.pg_operator'::regclass AND o.oid = d.refobjid \
             WHERE o.oprnamespace = 'public'::regnamespace AND d.classid <> 'pg_catalog.pg_operator'::regclass \
               AND pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) LIKE '%{what}%' ORDER BY 1"
        )
    };
    // The planted operator wins on an unqualified comparison of those types.
    sqlx::raw_sql("CREATE TABLE public.probe (x double precision CHECK (x >= 1))")
        .execute(&owner)
        .await
        .unwrap();
    let probe: Vec<String> = sqlx::query_scalar(AssertSqlSafe(planted_in("probe")))
        .fetch_all(&owner)
        .await
        .unwrap();
    assert_eq!(probe.len(), 1, "the planted operator is bound: {probe:?}");

    schema::migrate(&owner).await.unwrap();
    let bound: Vec<String> = sqlx::query_scalar(AssertSqlSafe(planted_in("sluice.")))
        .fetch_all(&owner)
        .await
        .unwrap();
    assert_eq!(bound, Vec::<String>::new());
}

#[tokio::test]
async fn every_function_of_the_schema_pins_its_search_path() {
    let (_pg, owner, _a) = setup().await;
    let unpinned: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
          WHERE p.pronamespace = 'sluice'::regnamespace \
            AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false) \
          ORDER BY 1",
    )
    .fetch_all(owner.pool())
    .await
    .unwrap();
    assert_eq!(unpinned, Vec::<String>::new());
    let definers: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
          WHERE p.pronamespace = 'sluice'::regnamespace AND p.prosecdef ORDER BY 1",
    )
    .fetch_all(owner.pool())
    .await
    .unwrap();
    assert_eq!(definers, Vec::<String>::new(), "SECURITY DEFINER functions");
}

/// What tenant `a` plants in `public` for the statements Sluice sends itself, each recording who ran
/// it: overloads whose argument types are exactly those Sluice passes, where pg_catalog's function or
/// operator is polymorphic (`unnest(anyarray)`, `array_agg(anynonarray)`, `anycompatiblearray ||
/// anycompatiblearray`) or needs a cast (`float8 * interval`, `numeric * numeric`, `oid = oid`). On
/// a statement that does not qualify the name, each of them wins over the built-in although
/// pg_catalog is searched first ([`UNQUALIFIED`] shows it). Built-ins with an exact match in
/// pg_catalog (`now()`, `count(*)`, `uuid = uuid`) cannot be taken over that way and are not planted.
const OVERLOADS: &str = "\
    CREATE TABLE public.ran (who text, what text); \
    GRANT SELECT, INSERT, DELETE ON public.ran TO PUBLIC; \
    CREATE FUNCTION public.ran_as(p_what text) RETURNS void LANGUAGE plpgsql AS $$ \
    BEGIN INSERT INTO public.ran VALUES (current_user, p_what); END $$; \
    CREATE FUNCTION public.unnest(a uuid[]) RETURNS SETOF uuid LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('unnest(uuid[])'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$; \
    CREATE FUNCTION public.unnest(a integer[]) RETURNS SETOF integer LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('unnest(integer[])'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$; \
    CREATE FUNCTION public.unnest(a text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('unnest(text[])'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$; \
    CREATE FUNCTION public.unnest(a bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('unnest(bigint[])'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$; \
    CREATE FUNCTION public.append(s interval[], v interval) RETURNS interval[] LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('array_agg(interval)'); RETURN pg_catalog.array_append(s, v); END $$; \
    CREATE AGGREGATE public.array_agg(interval) (SFUNC = public.append, STYPE = interval[]); \
    CREATE FUNCTION public.append(s bigint[], v bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('array_agg(bigint)'); RETURN pg_catalog.array_append(s, v); END $$; \
    CREATE AGGREGATE public.array_agg(bigint) (SFUNC = public.append, STYPE = bigint[]); \
    CREATE FUNCTION public.times(a bigint, b interval) RETURNS interval LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('* (bigint, interval)'); \
          RETURN a::double precision OPERATOR(pg_catalog.*) b; END $$; \
    CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.times); \
    CREATE FUNCTION public.times(a numeric, b integer) RETURNS numeric LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('* (numeric, integer)'); \
          RETURN a OPERATOR(pg_catalog.*) b::numeric; END $$; \
    CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.times); \
    CREATE FUNCTION public.cat(a uuid[], b uuid[]) RETURNS uuid[] LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('|| (uuid[], uuid[])'); RETURN pg_catalog.array_cat(a, b); END $$; \
    CREATE OPERATOR public.|| (LEFTARG = uuid[], RIGHTARG = uuid[], FUNCTION = public.cat); \
    CREATE FUNCTION public.eq(a oid, b regnamespace) RETURNS boolean LANGUAGE plpgsql AS $$ \
    BEGIN PERFORM public.ran_as('= (oid, regnamespace)'); RETURN a OPERATOR(pg_catalog.=) b::oid; END $$; \
    CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regnamespace, FUNCTION = public.eq);";

/// The positive control: for each overload of [`OVERLOADS`] (what it records), a statement that calls
/// the name unqualified with the types Sluice passes, as Sluice's statements did, and so runs it.
const UNQUALIFIED: [(&str, &str); 9] = [
    (
        "unnest(uuid[])",
        "SELECT * FROM unnest('{0190f3e4-0000-7000-8000-000000000001}'::uuid[])",
    ),
    ("unnest(integer[])", "SELECT * FROM unnest('{1}'::integer[])"),
    ("unnest(text[])", "SELECT * FROM unnest('{q}'::text[])"),
    (
        "unnest(bigint[])",
        "SELECT * FROM unnest('{1}'::bigint[]) WITH ORDINALITY AS u(ms, n)",
    ),
    (
        "array_agg(interval)",
        "SELECT array_agg(interval '1 millisecond')",
    ),
    (
        "array_agg(bigint)",
        "SELECT array_agg(version ORDER BY version) FROM sluice._sqlx_migrations",
    ),
    (
        "* (bigint, interval)",
        "SELECT now() + 30000::bigint * interval '1 millisecond'",
    ),
    (
        "* (numeric, integer)",
        "SELECT (extract(epoch FROM now() - now()) * 1000)::bigint",
    ),
    (
        "|| (uuid[], uuid[])",
        "SELECT ARRAY['0190f3e4-0000-7000-8000-000000000001'::uuid] || ARRAY[pg_catalog.gen_random_uuid()]",
    ),
];

/// The positive control's last overload: `=` between an oid and a `regnamespace`, as the operator's
/// check of a tenant login wrote it.
const UNQUALIFIED_OID_EQ: (&str, &str) = (
    "= (oid, regnamespace)",
    "SELECT count(*) FROM pg_catalog.pg_class c WHERE c.relnamespace = 'sluice'::regnamespace",
);

/// Runs every statement the store sends on `queue` (one of `store`'s login's namespace): the enqueue
/// paths with keys and periods, claims, the three heartbeats, a cancel of a running and of a waiting
/// job, completion as success, retry and permanent failure, a release with a cascade, rescue,
/// retention, depth, reads, schedules, event subscriptions and the tenant check of the login.
async fn every_statement_of_the_store(store: &QueueStore, queue: &str) {
    let owner = "worker-1";
    let lease = Duration::from_secs(30);
    let parent = store.enqueue(queue, &job(1)).await.unwrap().id;
    let child = store
        .enqueue(
            queue,
            &job(2)
                .depends_on([parent])
                .unique("k", UniqueMode::Replace)
                .unique_for(Duration::from_secs(60)),
        )
        .await
        .unwrap()
        .id;
    store
        .enqueue(queue, &job(9).debounce("d", Duration::from_secs(60)))
        .await
        .unwrap();
    store
        .enqueue_many(
            queue,
            &[
                job(3),
                job(4)
                    .idempotency_key("i")
                    .unique("m", UniqueMode::Preserve)
                    .unique_for(Duration::from_secs(60)),
            ],
        )
        .await
        .unwrap();
    store
        .enqueue_graph(
            queue,
            &[
                GraphJob::new("x", job(5)),
                GraphJob::new("y", job(6)).depends_on(["x"]),
            ],
        )
        .await
        .unwrap();
    let claimed = store.claim_batch(queue, owner, 100, lease).await.unwrap();
    store
        .claim_batch_of_kinds(queue, &["work".to_string()], owner, 1, lease)
        .await
        .unwrap();
    let by_n = |n: i64| {
        let c = claimed
            .iter()
            .find(|c| c.payload["n"] == n)
            .unwrap_or_else(|| panic!("job {n} claimed: {claimed:?}"));
        (c.id, c.attempt)
    };
    let held: Vec<(Uuid, i32)> = [1, 3, 4, 5].into_iter().map(by_n).collect();
    assert_eq!(store.heartbeat(owner, &held, lease).await.unwrap().len(), 4);
    store
        .heartbeat_waiting(owner, held[0], lease, Duration::from_secs(5))
        .await
        .unwrap();
    store.heartbeat_finishing(owner, &held, lease).await.unwrap();
    store.cancel(by_n(5).0).await.unwrap();
    let done = [
        (by_n(1), Finish::Succeeded),
        (
            by_n(3),
            Finish::Retry {
                delay: Duration::from_millis(1),
                error: "again".into(),
            },
        ),
        (by_n(4), Finish::Permanent { error: "no".into() }),
    ]
    .map(|((id, attempt), finish)| Finished { id, attempt, finish });
    assert_eq!(store.finish_batch(owner, &done).await.unwrap().len(), 3);
    assert_eq!(store.release(owner, &[by_n(5)]).await.unwrap().len(), 1);
    store.cancel(child).await.unwrap();
    store.retry_dead(by_n(4).0).await.unwrap();
    store.rescue_expired(&[queue.to_string()], 10).await.unwrap();
    store.delete_expired(queue, 10).await.unwrap();
    store.running_by_owner(queue).await.unwrap();
    store.depth(queue).await.unwrap().expect("the queue's depth");
    store.depth_all().await.unwrap();
    store.get(parent).await.unwrap().expect("the parent");
    store.list(queue, None, None, 10).await.unwrap();
    store.parents(child).await.unwrap();
    store.queues_of(&[parent, child]).await.unwrap();
    store.job_status(parent).await.unwrap().expect("its status");
    store.queue(queue).await.unwrap().expect("the queue");
    store.set_paused(queue, true).await.unwrap();
    store.set_paused(queue, false).await.unwrap();
    store
        .subscribe_events("sub-1", &[queue.to_string()], Duration::from_secs(60))
        .await
        .unwrap();
    let schedule = Schedule::new("tick", "* * * * *", None, job(7), MissedRuns::Skip).unwrap();
    store.fire_schedule(queue, &schedule).await.unwrap();
    store.schedules(queue).await.unwrap();
    sqlx::query(sluice_queue::sql::TENANT_OF_LOGIN)
        .fetch_optional(store.pool())
        .await
        .unwrap();
}

/// The statements Sluice sends itself name pg_catalog's functions and operators (queue/src/sql.rs,
/// "Names"), so a tenant that may create in `public` and plants overloads that beat the built-ins on
/// an unqualified statement (shown first, on the same server) runs nothing: not as another tenant's
/// worker, on its own default-path pool (a transaction-mode PgBouncer allows no other), and not as the
/// schema's owner running the operator's statements.
#[tokio::test]
async fn statements_sluice_sends_run_nothing_a_tenant_planted_in_public() {
    let (pg, owner, a) = setup().await;
    sqlx::raw_sql("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .execute(owner.pool())
        .await
        .unwrap();
    sqlx::raw_sql(OVERLOADS).execute(a.pool()).await.unwrap();
    let ran = || async {
        sqlx::query_as::<_, (String, String)>("SELECT DISTINCT who, what FROM public.ran ORDER BY 1, 2")
            .fetch_all(owner.pool())
            .await
            .unwrap()
    };

    let b_url = pg
        .url()
        .replace("postgres://postgres@", "postgres://sluice_tenant_b:secret-2@");
    let b = QueueStore::new(connect(&b_url).await);
    for (what, statement) in UNQUALIFIED.into_iter().chain([UNQUALIFIED_OID_EQ]) {
        sqlx::raw_sql(statement).execute(b.pool()).await.unwrap();
        assert_eq!(
            ran().await,
            [("sluice_tenant_b".to_string(), what.to_string())],
            "{statement}"
        );
        sqlx::raw_sql("DELETE FROM public.ran")
            .execute(owner.pool())
            .await
            .unwrap();
    }

    every_statement_of_the_store(&b, "b/q").await;
    // The operator's statements, as the schema's owner: migrations checked, a tenant provisioned, a
    // queue made, adopted and measured, and KEDA's demand query.
    schema::migrate(owner.pool()).await.unwrap();
    owner
        .ensure_tenant("sluice_tenant_c", "c", "secret-1")
        .await
        .unwrap();
    sqlx::query(sluice_queue::sql::TENANT_ROLE_AND_NAMING_KEY)
        .bind("c")
        .fetch_one(owner.pool())
        .await
        .unwrap();
    owner
        .upsert_queue(&QueueSettings::defaults("c/old"))
        .await
        .unwrap();
    owner.enqueue("c/old", &job(8)).await.unwrap();
    assert_eq!(owner.adopt_queue("c/old", "c/q").await.unwrap(), Some(1));
    owner.ensure_queue("c/q").await.unwrap();
    sqlx::query(AssertSqlSafe(sluice_queue::sql::queue_demand_statement("c/q")))
        .fetch_one(owner.pool())
        .await
        .unwrap();
    every_statement_of_the_store(&owner, "c/q").await;
    // The operator's check of a login compares namespaces only for relations the login is a member of
    // the owner of (the cheaper test runs first): a login owning a table of the schema, what the check
    // is there to find.
    sqlx::raw_sql(
        "CREATE TABLE sluice.owned_by_b (x int); ALTER TABLE sluice.owned_by_b OWNER TO sluice_tenant_b",
    )
    .execute(owner.pool())
    .await
    .unwrap();
    let (_, _, unlimited): (String, String, bool) = sqlx::query_as(sluice_queue::sql::TENANT_OF_LOGIN)
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert!(unlimited, "b owns a table of the schema");

    assert_eq!(ran().await, [], "a planted overload ran");
}

/// A role given a forbidden attribute while `sluice.ensure_tenant` provisions it, after the checks and
/// before the ALTER (migration 0027): a CREATEROLE owner, which may not take BYPASSRLS away, refuses
/// it (SL409) instead of registering it again; CREATEDB, which it may take away on PostgreSQL 15, is
/// taken away; a superuser owner takes every one of them away in its ALTER. The provisioning is held
/// between the two by a lock on pg_authid that another session holds while it alters the role.
#[tokio::test]
async fn a_role_given_a_forbidden_attribute_during_its_provisioning_keeps_none() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    pg.psql(
        "CREATE ROLE createrole_owner LOGIN CREATEROLE; ALTER DATABASE postgres OWNER TO createrole_owner",
    );
    let url = pg
        .url()
        .replace("postgres://postgres@", "postgres://createrole_owner@");
    let createrole_owner = QueueStore::new(connect(&url).await);
    schema::migrate(createrole_owner.pool()).await.unwrap();
    let superuser = connect(&pg.url()).await;
    let superuser_owner = QueueStore::new(superuser.clone());
    createrole_owner
        .ensure_tenant("sluice_tenant_a", "a", "secret-1")
        .await
        .unwrap();
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::integer")
        .fetch_one(&superuser)
        .await
        .unwrap();

    for (who, store, attribute, refused) in [
        ("createrole owner", &createrole_owner, "BYPASSRLS", true),
        (
            "createrole owner",
            &createrole_owner,
            "CREATEDB",
            version >= 160000,
        ),
        ("superuser owner", &superuser_owner, "BYPASSRLS", false),
        ("superuser owner", &superuser_owner, "CREATEROLE", false),
    ] {
        let mut holder = superuser.begin().await.unwrap();
        sqlx::query("LOCK TABLE pg_catalog.pg_authid IN SHARE MODE")
            .execute(&mut *holder)
            .await
            .unwrap();
        let provisioning = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .ensure_tenant("sluice_tenant_a", "a", "do-not-show-this-password")
                    .await
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() \
                    AND query LIKE '%ensure_tenant%'",
            )
            .fetch_one(&superuser)
            .await
            .unwrap();
            if waiting == 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{who}: the provisioning never waited for pg_authid"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sqlx::query(AssertSqlSafe(format!("ALTER ROLE sluice_tenant_a {attribute}")))
            .execute(&mut *holder)
            .await
            .unwrap();
        holder.commit().await.unwrap();
        let result = provisioning.await.unwrap();
        let kept: bool = sqlx::query_scalar(
            "SELECT rolsuper OR rolcreaterole OR rolbypassrls OR rolreplication OR rolcreatedb \
               FROM pg_roles WHERE rolname = 'sluice_tenant_a'",
        )
        .fetch_one(&superuser)
        .await
        .unwrap();
        if refused {
            let Err(Error::Conflict(message)) = &result else {
                panic!("{who}, {attribute}: refused, not {result:?}");
            };
            assert!(message.contains(attribute), "{who}: {message}");
            assert!(!message.contains("do-not-show-this"), "{who}: {message}");
            sqlx::query(AssertSqlSafe(format!("ALTER ROLE sluice_tenant_a NO{attribute}")))
                .execute(&superuser)
                .await
                .unwrap();
        } else {
            result.unwrap_or_else(|e| panic!("{who}, {attribute}: {e}"));
            assert!(!kept, "{who}: the role kept {attribute}");
        }
    }
}
