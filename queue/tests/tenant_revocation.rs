//! `sluice.revoke_tenant_login` and `sluice.end_tenant_sessions` (migration 0028) against a real
//! PostgreSQL: they act on a namespace's registered tenant only, never on the calling login or a
//! superuser; they are idempotent; a role owning objects is revoked all the same.

use sluice_queue::{QueueStore, schema, sql};
use std::time::Duration;

use sluice_testsupport::{PgServer, wait_for_async};
use sqlx::PgPool;

async fn connect(url: &str) -> PgPool {
    sluice_queue::pool::options(2)
        .connect(url)
        .await
        .expect("connect")
}

/// The server and the owner's pool, with tenant `sluice_tenant_a` registered for namespace `a`.
async fn setup() -> (PgServer, PgPool) {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let owner = QueueStore::new(connect(&pg.url()).await);
    schema::migrate(owner.pool()).await.unwrap();
    owner
        .ensure_tenant("sluice_tenant_a", "a", "secret-1")
        .await
        .unwrap();
    (pg, owner.pool().clone())
}

async fn revoke(pool: &PgPool, role: &str, ns: &str) -> Result<bool, String> {
    sqlx::query_scalar(sql::TENANT_REVOKE_LOGIN)
        .bind(role)
        .bind(ns)
        .fetch_one(pool)
        .await
        .map_err(|e| {
            let d = e.as_database_error().expect("a database error");
            format!("{}: {}", d.code().unwrap_or_default(), d.message())
        })
}

#[tokio::test]
async fn only_the_namespace_s_registered_tenant_is_revoked_and_twice_is_once() {
    let (pg, owner) = setup().await;
    let a = pg
        .url()
        .replace("postgres://postgres@", "postgres://sluice_tenant_a:secret-1@");
    // A tenant owning a large object and a temporary table, in a session kept open.
    let tenant = connect(&a).await;
    let mut held = tenant.acquire().await.unwrap();
    sqlx::query("SELECT lo_create(0)")
        .execute(&mut *held)
        .await
        .unwrap();
    sqlx::query("CREATE TEMP TABLE hold ()")
        .execute(&mut *held)
        .await
        .unwrap();

    for (role, ns) in [("sluice_tenant_a", "b"), ("nobody", "a")] {
        let e = revoke(&owner, role, ns).await.unwrap_err();
        assert!(
            e.starts_with("SL409") && e.contains("not the registered tenant"),
            "{e}"
        );
    }
    assert_eq!(revoke(&owner, "sluice_tenant_a", "a").await, Ok(true));
    assert_eq!(revoke(&owner, "sluice_tenant_a", "a").await, Ok(true));
    assert_eq!(
        pg.psql("SELECT rolcanlogin FROM pg_roles WHERE rolname = 'sluice_tenant_a'"),
        "f"
    );
    let ended: i32 = sqlx::query_scalar(sql::TENANT_END_SESSIONS)
        .bind("sluice_tenant_a")
        .bind("a")
        .fetch_one(&owner)
        .await
        .unwrap();
    assert!(ended >= 1, "{ended}");
    assert!(sqlx::query("SELECT 1").execute(&mut *held).await.is_err());
    // `pg_terminate_backend` returns once the signal is sent: the backend is listed until it exits.
    wait_for_async(
        "the tenant's sessions to end",
        Duration::from_secs(10),
        || async {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = 'sluice_tenant_a'")
                    .fetch_one(&owner)
                    .await
                    .unwrap();
            (left == 0).then_some(())
        },
    )
    .await;
    let again: i32 = sqlx::query_scalar(sql::TENANT_END_SESSIONS)
        .bind("sluice_tenant_a")
        .bind("a")
        .fetch_one(&owner)
        .await
        .unwrap();
    assert_eq!(again, 0);

    // A registered role that no longer exists: nothing to do.
    drop(held);
    tenant.close().await;
    pg.psql("DROP OWNED BY sluice_tenant_a; DROP ROLE sluice_tenant_a");
    assert_eq!(revoke(&owner, "sluice_tenant_a", "a").await, Ok(false));
}

#[tokio::test]
async fn the_calling_login_and_a_superuser_are_never_revoked() {
    let (pg, owner) = setup().await;
    pg.psql("CREATE ROLE admin SUPERUSER LOGIN");
    pg.psql("INSERT INTO sluice.tenants (role_name, namespace) VALUES ('postgres', 'p'), ('admin', 's')");
    let e = revoke(&owner, "postgres", "p").await.unwrap_err();
    assert!(
        e.starts_with("SL409") && e.contains("login revoking tenants"),
        "{e}"
    );
    let e = revoke(&owner, "admin", "s").await.unwrap_err();
    assert!(e.starts_with("SL409") && e.contains("superuser"), "{e}");
    assert_eq!(
        pg.psql("SELECT rolcanlogin FROM pg_roles WHERE rolname = 'admin'"),
        "t"
    );
}

// A caller acting as another role than its login (SET ROLE, as an admin by hand or a login whose group
// owns the schema) ends the sessions as that role: the membership is made for it and revoked from it,
// and it acts as that role again afterwards, not as its login.
#[tokio::test]
async fn ending_sessions_under_set_role_leaves_no_membership_and_keeps_the_role() {
    let (pg, owner) = setup().await;
    pg.psql("CREATE ROLE grp SUPERUSER NOLOGIN");
    let a = pg
        .url()
        .replace("postgres://postgres@", "postgres://sluice_tenant_a:secret-1@");
    let tenant = connect(&a).await;
    let mut held = tenant.acquire().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *held).await.unwrap();

    let mut caller = owner.acquire().await.unwrap();
    sqlx::query("SET ROLE grp").execute(&mut *caller).await.unwrap();
    let ended: i32 = sqlx::query_scalar(sql::TENANT_END_SESSIONS)
        .bind("sluice_tenant_a")
        .bind("a")
        .fetch_one(&mut *caller)
        .await
        .unwrap();
    assert!(ended >= 1, "{ended}");
    assert!(sqlx::query("SELECT 1").execute(&mut *held).await.is_err());
    let acting: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *caller)
        .await
        .unwrap();
    assert_eq!(acting, "grp");
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_auth_members WHERE roleid = 'sluice_tenant_a'::regrole"),
        "0"
    );
    sqlx::query("RESET ROLE").execute(&mut *caller).await.unwrap();
}

// A revocation marks the admission; provisioning's record leaves the mark, and only the
// QueueDatabase's own pass finding the namespace admitted again clears it (and its completion).
#[tokio::test]
async fn a_revoked_admission_stays_marked_until_the_namespace_is_admitted_again() {
    let (pg, owner) = setup().await;
    let state = || {
        pg.psql(
            "SELECT revoked_at IS NOT NULL, revocation_complete FROM sluice.tenant_admissions \
             WHERE namespace = 'a' AND queue_database = 'shared'",
        )
    };
    let run = |statement: &'static str| sqlx::query(statement).bind("a").bind("shared").execute(&owner);
    let refused = || {
        sqlx::query_scalar::<_, bool>(sql::TENANT_ADMISSION_REVOKED)
            .bind("a")
            .bind("shared")
            .fetch_one(&owner)
    };
    run(sql::TENANT_ADMISSION_PROVISIONED).await.unwrap();
    assert_eq!(state(), "f|f");
    assert!(!refused().await.unwrap());
    // Completion needs a mark.
    run(sql::TENANT_ADMISSION_REVOCATION_COMPLETE).await.unwrap();
    assert_eq!(state(), "f|f");
    run(sql::TENANT_ADMISSION_MARK_REVOKED).await.unwrap();
    assert_eq!(state(), "t|f");
    assert!(refused().await.unwrap());
    run(sql::TENANT_ADMISSION_REVOCATION_COMPLETE).await.unwrap();
    assert_eq!(state(), "t|t");
    run(sql::TENANT_ADMISSION_PROVISIONED).await.unwrap();
    assert_eq!(state(), "t|t", "provisioning's record leaves the mark");
    sqlx::query(sql::TENANT_ADMISSIONS_RECORD)
        .bind(vec!["a".to_owned()])
        .bind("shared")
        .execute(&owner)
        .await
        .unwrap();
    assert_eq!(state(), "f|f");
    assert!(!refused().await.unwrap());
    // A mark outlives no registration: once an admin deleted the namespace's row of sluice.tenants
    // (the namespace deleted for good), a namespace of that name is a new tenant.
    run(sql::TENANT_ADMISSION_MARK_REVOKED).await.unwrap();
    assert!(refused().await.unwrap());
    pg.psql(
        "DELETE FROM sluice.tenants WHERE namespace = 'a'; \
         DROP OWNED BY sluice_tenant_a; DROP ROLE sluice_tenant_a",
    );
    assert!(!refused().await.unwrap());
    assert_eq!(
        pg.psql("SELECT count(*) FROM sluice.tenant_admissions WHERE namespace = 'a'"),
        "0",
        "the registration's admissions go with it"
    );
    // Registered anew, it starts with no admission.
    QueueStore::new(owner.clone())
        .ensure_tenant("sluice_tenant_a", "a", "secret-2")
        .await
        .unwrap();
    assert_eq!(
        pg.psql("SELECT count(*) FROM sluice.tenant_admissions WHERE namespace = 'a'"),
        "0"
    );
    assert!(!refused().await.unwrap());
    // Another QueueDatabase's admission of the namespace is its own.
    assert!(
        !sqlx::query_scalar::<_, bool>(sql::TENANT_ADMISSION_REVOKED)
            .bind("a")
            .bind("other")
            .fetch_one(&owner)
            .await
            .unwrap()
    );
}

// The registry counts a revocation as done only while the role cannot log in: one given LOGIN again
// (through another QueueDatabase, or by hand) is decided anew.
#[tokio::test]
async fn a_revoked_role_given_login_again_is_no_longer_counted_as_revoked() {
    let (pg, owner) = setup().await;
    let revoked = || async {
        let rows: Vec<(String, String, bool, bool, bool)> = sqlx::query_as(sql::TENANT_REGISTRY)
            .bind("shared")
            .fetch_all(&owner)
            .await
            .unwrap();
        rows[0].3
    };
    for statement in [
        sql::TENANT_ADMISSION_PROVISIONED,
        sql::TENANT_ADMISSION_MARK_REVOKED,
        sql::TENANT_ADMISSION_REVOCATION_COMPLETE,
    ] {
        sqlx::query(statement)
            .bind("a")
            .bind("shared")
            .execute(&owner)
            .await
            .unwrap();
    }
    assert_eq!(revoke(&owner, "sluice_tenant_a", "a").await, Ok(true));
    assert!(revoked().await);
    pg.psql("ALTER ROLE sluice_tenant_a LOGIN");
    assert!(!revoked().await);
}
