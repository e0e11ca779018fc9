//! A namespace's tenant role in a JobQueue's database (`spec.database.rowLevelSecurity: Enabled`).
//!
//! The operator logs in with the URL of the JobQueue's own Secret (the schema's owner, which needs
//! `CREATEROLE`) and calls `sluice.ensure_tenant` for the JobQueue's namespace; workers and injected
//! sidecars get a URL that logs in as that tenant instead, from a Secret the operator writes in the
//! namespace:
//!
//! - **One role per (database, namespace)**: the role `sluice.tenants` of that database has for the
//!   namespace, whatever its name (`sluice_ns_<namespace>` from an earlier release, or one an admin
//!   registered); else a new one, [`role_name`]: `sluice_<hash>_<namespace>`, the hash of the namespace
//!   and the database's random naming key (`sluice.tenant_naming`, migration 0017, which only the
//!   schema's owner can read). Role names are the whole server's, tenants a database's: with the key in
//!   the name, a namespace gets a role of its own in each database of one server, and no login outside
//!   the database (another database's owner, with `CREATEROLE`) can know the name before the role
//!   exists, to create it first. The lookup happens under the namespace's lock (below), in the
//!   transaction that runs `ensure_tenant`. A name is at most 63 bytes and always passed quoted.
//! - **One Secret per (namespace, `spec.database.secretRef` or `queueDatabaseRef`)**: [`secret_name`],
//!   `sluice-tenant-<hash of the reference>`, key `url` (also `username`, `password`). The name depends
//!   on the JobQueue alone, so the worker Deployment and the pod webhook name it without reading any
//!   Secret. JobQueues that share a reference share the Secret (each is an owner of it: it goes when the
//!   last of them does).
//! - **One password per role**: JobQueues of a namespace that name different Secrets for one database
//!   get Secrets with the same password: a new Secret copies it from one the operator wrote for that
//!   database before (label [`DATABASE_LABEL`], a hash of `host:port/dbname`). A password is made only
//!   when none exists (40 characters from the OS's random generator) and never rotated by a reconcile.
//! - **Idempotent**: the work happens under a lock of the namespace's row of `sluice.tenant_locks` in
//!   that database (migration 0019, the schema owner's alone: no tenant can take or hold it), so two
//!   reconciles (of two JobQueues, or in two operator replicas) cannot set two
//!   passwords; `ensure_tenant` runs in the same transaction, after which the Secret is written.
//!   Once done, a reconcile only reads the Secret (and `ensure_tenant` runs again after a restart or
//!   when the Secret changed).
//! - **The password is never in a log, Event, status or error**, nor sent to the database: the role
//!   is given its SCRAM-SHA-256 verifier ([`scram_verifier`]), computed here; errors carry the
//!   database's message and code only, and Kubernetes errors name the Secret, not its content.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::{
    ByteString,
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use sluice_crds::{
    contract::label::{MANAGED_BY, MANAGED_BY_VALUE},
    job_queue::{DatabaseSource, JobQueue, RowLevelSecurity, TenantLogin},
    secret_ref::{SECRET_KEY_DEFAULT, SecretKeyRef},
};
use sqlx::PgPool;

use crate::digest::short_hash;
use crate::secret::Admitting;
use crate::{Error, Result};

/// Prefix of the tenant roles the operator names ([`role_name`]); tenants an earlier release made keep
/// their `sluice_ns_<namespace>`.
pub const ROLE_PREFIX: &str = "sluice_";
/// Prefix of the tenant Secrets' names.
pub const SECRET_PREFIX: &str = "sluice-tenant-";
/// Label on a tenant Secret: a hash of the database's `host:port/dbname` (see [`database_id`]).
pub const DATABASE_LABEL: &str = "sluice.dev/tenant-database";
/// Annotation on a tenant Secret naming the Secret and key it was made from (`<name>/<key>`).
pub const SOURCE_ANNOTATION: &str = "sluice.dev/tenant-of";
/// Key of the tenant's URL in its Secret.
pub const URL_KEY: &str = SECRET_KEY_DEFAULT;
/// Key of the tenant's role name in its Secret.
pub const USERNAME_KEY: &str = "username";
/// Key of the tenant's password in its Secret.
pub const PASSWORD_KEY: &str = "password";
/// Length of a generated password (alphanumeric, about 238 bits).
pub const PASSWORD_LEN: usize = 40;

/// PostgreSQL's limit on identifiers, in bytes.
const MAX_IDENTIFIER: usize = 63;
/// Hex digits of the hash in a tenant role's name.
const ROLE_HASH_DIGITS: usize = 10;
/// How much of the namespace a tenant role's name keeps: what 63 bytes leave after `sluice_`, the hash
/// and `_` (45).
const ROLE_NAMESPACE_LEN: usize = MAX_IDENTIFIER - ROLE_PREFIX.len() - ROLE_HASH_DIGITS - 1;

/// The name of a new tenant role for `namespace` in the database whose naming key
/// (`sluice.tenant_naming`) is `key`: `sluice_`, 10 hex digits of the SHA-256 of the key and the
/// namespace, `_` and the namespace, cut to its first 45 characters (the hash covers all of it, so two
/// cut names still differ). Always at most 63 bytes; the same for (key, namespace) every time; never
/// an earlier release's `sluice_ns_<namespace>` (`n` and `s` are no hex digits). Without the key the
/// name cannot be known, so nobody outside the database can create the role before the operator does.
pub fn role_name(key: &str, namespace: &str) -> String {
    let hash = short_hash(format!("{key}\n{namespace}").as_bytes(), ROLE_HASH_DIGITS / 2);
    // A namespace is ASCII (a DNS label); the boundary keeps this safe for anything else.
    let cut = &namespace[..namespace.floor_char_boundary(ROLE_NAMESPACE_LEN)];
    format!("{ROLE_PREFIX}{hash}_{cut}")
}

/// The name of the tenant Secret the operator writes for JobQueues naming `source`: `sluice-tenant-`
/// and 12 hex digits of a hash of `spec.database.secretRef`'s name and key, or of
/// `QueueDatabase/<name>` for `spec.database.queueDatabaseRef` (a `/` is in no Secret's name and a
/// newline in neither, so the two never hash the same text).
pub fn secret_name(source: DatabaseSource<'_>) -> String {
    let hashed = match source {
        DatabaseSource::SecretRef(r) => format!("{}\n{}", r.name, r.key),
        DatabaseSource::QueueDatabase(name) => format!("QueueDatabase/{name}"),
    };
    format!("{SECRET_PREFIX}{}", short_hash(hashed.as_bytes(), 6))
}

/// The tenant Secret's name for `jq` ([`secret_name`] of its database source). A spec naming no
/// single source (which the CRD refuses) gets a name no provisioning ever writes.
fn jq_secret_name(jq: &JobQueue) -> String {
    secret_name(
        jq.spec
            .database
            .source()
            .unwrap_or(DatabaseSource::QueueDatabase("")),
    )
}

/// What names the owner's URL, for messages: `spec.database.secretRef` or `QueueDatabase "<name>"`.
fn source_field(jq: &JobQueue) -> String {
    match jq.spec.database.source() {
        Some(DatabaseSource::QueueDatabase(name)) => format!("QueueDatabase {name:?}"),
        _ => "spec.database.secretRef".into(),
    }
}

/// The Secret key workers and injected sidecars read `SLUICE_DATABASE_URL` from: the tenant Secret's
/// `url` when `rowLevelSecurity` is `Enabled`, else the JobQueue's own `spec.database.secretRef` (also
/// when its login already is the namespace's registered tenant: `status.tenantLogin: SecretRef`).
/// With `queueDatabaseRef` always the tenant Secret: the owner's Secret is in no namespace but the
/// operator's.
pub fn workers_secret(jq: &JobQueue) -> SecretKeyRef {
    let own_login_is_tenant = jq.status.as_ref().and_then(|s| s.tenant_login) == Some(TenantLogin::SecretRef);
    let tenant = || SecretKeyRef {
        name: jq_secret_name(jq),
        key: URL_KEY.into(),
    };
    match (jq.spec.database.source(), jq.spec.database.row_level_security) {
        (Some(DatabaseSource::SecretRef(own)), RowLevelSecurity::Disabled) => own.clone(),
        (Some(DatabaseSource::SecretRef(own)), _) if own_login_is_tenant => own.clone(),
        _ => tenant(),
    }
}

/// The database a URL logs into, for telling databases apart: 16 hex digits of a hash of
/// `host:port/dbname` (the user, password and other parameters left out). `None` when the URL cannot
/// be read.
pub fn database_id(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let param = |name: &str| {
        u.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let host = param("host").unwrap_or_else(|| u.host_str().unwrap_or("").to_owned());
    let port = param("port")
        .or_else(|| u.port().map(|p| p.to_string()))
        .unwrap_or_else(|| "5432".into());
    let path = u.path().trim_start_matches('/');
    let db = param("dbname").unwrap_or_else(|| path.to_owned());
    Some(short_hash(format!("{host}:{port}/{db}").as_bytes(), 8))
}

/// The query parameters of the owner's URL a tenant's URL keeps ([`tenant_url`]): where the server is
/// and how to reach it safely. The others, the owner's credentials and files above all (`sslkey`,
/// `sslcert`, `sslpassword`, `passfile`, `service`) and its session settings (`options`), stay out of
/// every tenant namespace.
pub const TENANT_URL_PARAMETERS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "sslmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslnegotiation",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "channel_binding",
    "require_auth",
    "gssencmode",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "load_balance_hosts",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
];

/// `owner`'s URL with the user and password replaced by `role`'s; host, port and database kept, and of
/// the query parameters only those of [`TENANT_URL_PARAMETERS`]. `None` when the URL cannot be read.
pub fn tenant_url(owner: &str, role: &str, password: &str) -> Option<String> {
    let mut u = url::Url::parse(owner).ok()?;
    let kept: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| TENANT_URL_PARAMETERS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        u.set_query(None);
    } else {
        u.query_pairs_mut().clear().extend_pairs(kept);
    }
    u.set_username(role).ok()?;
    u.set_password(Some(password)).ok()?;
    Some(u.to_string())
}

/// A new password: [`PASSWORD_LEN`] characters of `[A-Za-z0-9]` from the OS's random generator.
pub fn generate_password() -> Result<String> {
    use ring::rand::{SecureRandom, SystemRandom};
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let rng = SystemRandom::new();
    let mut out = String::with_capacity(PASSWORD_LEN);
    let mut buf = [0u8; 64];
    while out.len() < PASSWORD_LEN {
        rng.fill(&mut buf)
            .map_err(|_| Error::Io(std::io::Error::other("the OS random generator failed")))?;
        // 248 = 4 × 62: bytes above it are dropped so that every character is equally likely.
        for b in buf.iter().filter(|b| **b < 248) {
            if out.len() == PASSWORD_LEN {
                break;
            }
            out.push(ALPHABET[usize::from(*b) % ALPHABET.len()] as char);
        }
    }
    Ok(out)
}

/// Iterations of PBKDF2 in a [`scram_verifier`]: PostgreSQL's default (`scram_iterations`).
pub const SCRAM_ITERATIONS: u32 = 4096;

/// The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (`SCRAM-SHA-256$<iterations>:<salt>$
/// <StoredKey>:<ServerKey>`, RFC 5803), with a fresh random salt. `CREATE ROLE … PASSWORD '<verifier>'`
/// stores it as it is, so the password itself never reaches the database server: not its statement
/// log, not `pg_stat_activity`, not an error. Logging in with the password works as usual.
pub fn scram_verifier(password: &str) -> Result<String> {
    use base64::{Engine, engine::general_purpose::STANDARD};
    use ring::{
        digest, hmac, pbkdf2,
        rand::{SecureRandom, SystemRandom},
    };
    let mut salt = [0u8; 16];
    SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| Error::Io(std::io::Error::other("the OS random generator failed")))?;
    let mut salted = [0u8; 32];
    let iterations = std::num::NonZeroU32::new(SCRAM_ITERATIONS).expect("non-zero");
    // The password is ASCII letters and digits, which SASLprep leaves as they are.
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        iterations,
        &salt,
        password.as_bytes(),
        &mut salted,
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&key, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let server_key = hmac::sign(&key, b"Server Key");
    Ok(format!(
        "SCRAM-SHA-256${SCRAM_ITERATIONS}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key.as_ref()),
        STANDARD.encode(server_key.as_ref())
    ))
}

/// What [`provision`] remembers between reconciles: (database id, namespace, Secret name,
/// `resourceVersion`) of tenant Secrets whose role was ensured by this process.
pub type Provisioned = std::sync::Mutex<HashSet<(String, String, String, String)>>;

/// How long one provisioning may take in all (the lock, `ensure_tenant`, the Secret's write); past it
/// the reconcile reports `TenantNotProvisioned` and retries.
pub const PROVISION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// How many times one provisioning writes the tenant Secret before a conflict fails the reconcile: the
/// JobQueues of a namespace share that Secret, and one created together with others finds it written
/// by another's provisioning between its read and its write (409). Reading it again at once takes the
/// other's; failing would send each of them into backoff and another full reconcile.
pub const SECRET_WRITE_ATTEMPTS: u32 = 5;
/// How long provisioning waits for the namespace's lock, in seconds.
pub const LOCK_TIMEOUT_SECS: u32 = 5;
/// Bounds the wait for locks in provisioning's transaction (the namespace's row lock included).
const SET_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// A transaction on `pool` whose lock waits end after [`LOCK_TIMEOUT_SECS`]: provisioning's, and the
/// owner's in revocation.
pub(crate) async fn begin_bounded(
    pool: &PgPool,
) -> std::result::Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(SET_LOCK_TIMEOUT).execute(&mut *tx).await?;
    Ok(tx)
}
/// Locks the namespace's row of `sluice.tenant_locks` (made the first time) until the transaction
/// ends. The table is the schema owner's alone (migration 0019): a tenant may not lock its rows.
pub const LOCK_NAMESPACE: &str = "INSERT INTO sluice.tenant_locks (namespace) VALUES ($1) \
                              ON CONFLICT (namespace) DO UPDATE SET namespace = EXCLUDED.namespace";

/// The role and namespace of `pool`'s login when it is a registered tenant (its own row of
/// `sluice.tenants`, the only one it can see), and whether row-level security fails to limit it: a
/// superuser, a `BYPASSRLS` role, or one that is (or is a member of) the owner of a table of the
/// schema, such as the schema's owner registered by hand. `None` for logins that are no tenant.
pub async fn login_tenant(pool: &PgPool) -> Result<Option<(String, String, bool)>> {
    sqlx::query_as(sluice_queue::sql::TENANT_OF_LOGIN)
        .fetch_optional(pool)
        .await
        .map_err(database)
}

/// Makes sure `jq`'s namespace has a tenant login for its workers, and says which Secret holds it.
///
/// When the login of `spec.database.secretRef` (`pool`'s) already is the namespace's registered tenant
/// (an admin ran `sluice.ensure_tenant` and handed the namespace the tenant's URL), nothing is
/// provisioned: [`TenantLogin::SecretRef`]. Otherwise `pool`'s login is taken for the schema's owner
/// and the tenant role is ensured in the database at `owner_url`, with the tenant Secret
/// [`workers_secret`] names holding its URL and `jq` among the Secret's owners
/// ([`TenantLogin::Provisioned`]). The whole of it is bounded by [`PROVISION_TIMEOUT`]. Failures the user
/// must fix are [`Error::TenantNotProvisioned`]; a database that does not answer is [`Error::Database`].
/// Returns where the login is, its role and, when provisioned, [`password_hash`] of its password.
pub async fn provision(
    client: &Client,
    pool: &PgPool,
    done: &Provisioned,
    jq: &JobQueue,
    owner_url: &str,
    admitting: Option<&Admitting>,
) -> Result<(TenantLogin, String, Option<String>)> {
    let ns = jq.namespace().unwrap_or_default();
    let not_provisioned = |why: String| Error::TenantNotProvisioned {
        namespace: ns.clone(),
        role: None,
        why,
    };
    let from_queue_database = matches!(jq.spec.database.source(), Some(DatabaseSource::QueueDatabase(_)));
    match login_tenant(pool).await? {
        Some((role, _, true)) => {
            return Err(not_provisioned(format!(
                "the login of {}, {role:?}, is registered in sluice.tenants as a tenant but row-level \
                 security does not limit it (it owns the schema's tables, or is a superuser or \
                 BYPASSRLS): remove that row as the schema's owner (DELETE FROM sluice.tenants WHERE \
                 role_name = {}) and the operator makes the namespace a tenant role of its own, or \
                 register a role of the namespace's own with sluice.ensure_tenant",
                source_field(jq),
                sql_literal(&role)
            )));
        }
        // A QueueDatabase serves many namespaces: its login must be the owner, never one's tenant.
        Some((_, of, _)) if from_queue_database => {
            return Err(not_provisioned(format!(
                "the login of {} is the tenant of namespace {of:?}, not the owner of the sluice schema: \
                 an admin must put the owner's URL in the QueueDatabase's Secret",
                source_field(jq)
            )));
        }
        Some((role, of, false)) if of == ns => return Ok((TenantLogin::SecretRef, role, None)),
        Some((_, of, false)) => {
            return Err(not_provisioned(format!(
                "the login of spec.database.secretRef is the tenant of namespace {of:?}, not of this \
                 one: give this namespace its own tenant's URL"
            )));
        }
        None => {}
    }
    let attempts = async {
        let mut attempt = 1;
        loop {
            match provision_as_owner(client, pool, done, jq, owner_url, admitting).await {
                Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 && attempt < SECRET_WRITE_ATTEMPTS => {
                    attempt += 1;
                }
                result => return result,
            }
        }
    };
    match tokio::time::timeout(PROVISION_TIMEOUT, attempts).await {
        Ok(r) => r.map(|(role, hash)| (TenantLogin::Provisioned, role, Some(hash))),
        Err(_) => Err(not_provisioned(format!(
            "provisioning took longer than {}s; the operator retries",
            PROVISION_TIMEOUT.as_secs()
        ))),
    }
}

/// The role and [`password_hash`] of the password in the tenant Secret of `jq`, if it exists for the
/// database at `owner_url`: written by an earlier provisioning, so workers can keep using it while a
/// new one fails (which may be because the database cannot be asked for the role).
pub async fn existing_secret(
    client: &Client,
    jq: &JobQueue,
    owner_url: &str,
) -> Result<Option<(String, String)>> {
    let ns = jq.namespace().unwrap_or_default();
    let Some(db) = database_id(owner_url) else {
        return Ok(None);
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    Ok(secrets
        .get_opt(&jq_secret_name(jq))
        .await?
        .and_then(|s| tenant_in(&s, &db))
        .map(|(role, p)| (role, password_hash(&p))))
}

/// 16 hex digits of the SHA-256 of a tenant password, for the worker pod template's annotation
/// `sluice.dev/tenant-password-hash`: a changed password changes the template and rolls the workers.
/// Not the password, and not enough of a hash to test guesses of a 40-character random one against.
pub fn password_hash(password: &str) -> String {
    short_hash(password.as_bytes(), 8)
}

/// Ensures the namespace's tenant role as the schema's owner and writes its Secret; returns the role and
/// [`password_hash`] of its password.
async fn provision_as_owner(
    client: &Client,
    pool: &PgPool,
    done: &Provisioned,
    jq: &JobQueue,
    owner_url: &str,
    admitting: Option<&Admitting>,
) -> Result<(String, String)> {
    let ns = jq.namespace().unwrap_or_default();
    let name = jq_secret_name(jq);
    // What the Secret was made from, for people reading it: `<secret>/<key>` or `QueueDatabase/<name>`.
    let source = match jq.spec.database.source() {
        Some(DatabaseSource::SecretRef(r)) => format!("{}/{}", r.name, r.key),
        Some(DatabaseSource::QueueDatabase(q)) => format!("QueueDatabase/{q}"),
        None => String::new(),
    };
    // The QueueDatabase the owner's URL comes from, if any: its owner login is an admin's to fix, not
    // the namespace's.
    let queue_database = match jq.spec.database.source() {
        Some(DatabaseSource::QueueDatabase(q)) => Some(q),
        _ => None,
    };
    // Provisioning through a QueueDatabase needs the one that admitted the namespace.
    let admitting = match (queue_database, admitting) {
        (Some(q), Some(a)) if a.name == q && !a.uid.is_empty() => Some(a),
        (Some(q), _) => return Err(Error::QueueDatabaseNotFound { name: q.into() }),
        (None, _) => None,
    };
    let not_provisioned = |role: Option<&str>, why: String| Error::TenantNotProvisioned {
        namespace: ns.clone(),
        role: role.map(str::to_owned),
        why,
    };
    let db = database_id(owner_url).ok_or_else(|| {
        not_provisioned(
            None,
            format!(
                "the URL of {} is not a postgres:// URL the operator can derive the tenant's URL from",
                source_field(jq)
            ),
        )
    })?;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    // One of the Secret's owners, not its controller: several JobQueues may own one.
    let owner = jq.owner_ref(&()).unwrap_or_default();
    let memo = |s: &Secret| {
        (
            db.clone(),
            ns.clone(),
            name.clone(),
            s.resource_version().unwrap_or_default(),
        )
    };

    // A Secret this process wrote (that very version) names the role it ensured, if the role may still
    // log in: a revocation (of a namespace a QueueDatabase stopped admitting, perhaps admitted again
    // since) takes LOGIN without this process seeing it, and only `ensure_tenant` gives it back.
    let current = secrets.get_opt(&name).await?;
    if let Some(current) = &current
        && let Some((role, password)) = tenant_in(current, &db)
        && done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&memo(current))
        && can_log_in(pool, &role).await?
    {
        if let Some(patched) = add_owner(&secrets, current, &owner).await?
            && patched.data == current.data
        {
            // Still what this process wrote, with one more owner: the next JobQueue reading this version
            // takes this path too, rather than provision again and race the others for the write.
            done.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(memo(&patched));
        }
        return Ok((role, password_hash(&password)));
    }

    // The Secret is read before the transaction, so it holds the lock for the database's statements
    // and the Secret's write (and, the first time, one list) only. The write is conditional (create, or
    // replace on the version read): when another reconcile wrote this Secret in between, it fails
    // (409), the transaction rolls back (and with it this password's verifier) and the retry reads
    // theirs.
    //
    // One namespace at a time in this database: the upsert locks the namespace's row of
    // sluice.tenant_locks until the transaction ends. Only the schema's owner (and a superuser) may
    // lock its rows, so a tenant cannot hold up another namespace's provisioning; the wait is bounded
    // all the same.
    let mut tx = begin_bounded(pool).await.map_err(database)?;
    sqlx::query(LOCK_NAMESPACE)
        .bind(&ns)
        .execute(&mut *tx)
        .await
        .map_err(
            |e| match e.as_database_error().and_then(|d| d.code()).as_deref() {
                Some("55P03") => not_provisioned(
                    None,
                    format!(
                        "another session of the database held the namespace's provisioning lock for \
                         more than {}s (the row of sluice.tenant_locks for namespace {ns:?}: a session \
                         of the schema's owner or a superuser); see pg_locks for who holds it; the \
                         operator retries",
                        LOCK_TIMEOUT_SECS
                    ),
                ),
                _ => database(e),
            },
        )?;
    // The namespace's registered tenant keeps its role, whatever its name; a new one is named with the
    // database's key. Under the lock, so two reconciles agree.
    let (registered, key): (Option<String>, Option<String>) =
        sqlx::query_as(sluice_queue::sql::TENANT_ROLE_AND_NAMING_KEY)
            .bind(&ns)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| match e.as_database_error() {
                Some(d) => not_provisioned(None, explain(d, &ns, None, queue_database)),
                None => database(e),
            })?;
    let role = match (registered, key) {
        (Some(role), _) => role,
        (None, Some(key)) => role_name(&key, &ns),
        (None, None) => {
            return Err(not_provisioned(
                None,
                "the database's key for naming tenant roles is gone (sluice.tenant_naming has no row): \
                 make a new one as the schema's owner (INSERT INTO sluice.tenant_naming DEFAULT VALUES)"
                    .into(),
            ));
        }
    };
    // A namespace's role registered by hand could be any role; the login provisioning runs as (which
    // owns the tables) is one `ensure_tenant` refuses too, and the operator says so before asking.
    if logs_in_as(owner_url, &role) {
        return Err(not_provisioned(
            Some(&role),
            format!(
                "the role registered as this namespace's tenant in sluice.tenants, {role:?}, is the login \
                 of {}, the schema's owner, which row-level security does not limit: remove that row \
                 (DELETE FROM sluice.tenants WHERE role_name = {}) and let the operator make the \
                 tenant, or register a role of the namespace's own with sluice.ensure_tenant",
                source_field(jq),
                sql_literal(&role)
            ),
        ));
    }
    // The password the role has: this Secret's, or that of another tenant Secret of the namespace for
    // this database (another JobQueue's, naming another Secret, may have set it, also while this one
    // waited for the lock); a new one only if there is none.
    let known = match current.as_ref().and_then(|s| tenant_in(s, &db)) {
        Some((r, p)) if r == role => Some(p),
        _ => sibling_password(&secrets, &db, &role).await?,
    };
    let password = match known {
        Some(p) => p,
        None => generate_password()?,
    };
    let verifier = scram_verifier(&password)?;
    let hash = password_hash(&password);
    if let Some(admitting) = admitting {
        admitted_still(&mut tx, admitting, &ns).await?;
    }
    // The role gets the password's SCRAM verifier, never the password.
    sqlx::query(sluice_queue::sql::TENANT_ENSURE)
        .bind(&role)
        .bind(&ns)
        .bind(verifier)
        .execute(&mut *tx)
        .await
        .map_err(|e| match e.as_database_error() {
            Some(d) => not_provisioned(Some(&role), explain(d, &ns, Some(&role), queue_database)),
            None => database(e),
        })?;
    // The QueueDatabase admitting the namespace, recorded where its revocation will look for it
    // (migration 0028), in the transaction that gives the role its login.
    if let Some(qdb) = queue_database {
        sqlx::query(sluice_queue::sql::TENANT_ADMISSION_PROVISIONED)
            .bind(&ns)
            .bind(qdb)
            .execute(&mut *tx)
            .await
            .map_err(database)?;
    }
    let url = tenant_url(owner_url, &role, &password)
        .ok_or_else(|| not_provisioned(Some(&role), "the tenant's URL cannot be built".into()))?;
    let data = BTreeMap::from([
        (URL_KEY.to_owned(), ByteString(url.into_bytes())),
        (USERNAME_KEY.to_owned(), ByteString(role.clone().into_bytes())),
        (PASSWORD_KEY.to_owned(), ByteString(password.into_bytes())),
    ]);
    let written = match current {
        Some(mut s) => {
            let mut owners = s.metadata.owner_references.take().unwrap_or_default();
            if !owners.iter().any(|o| o.uid == owner.uid) {
                owners.push(owner);
            }
            s.metadata.owner_references = Some(owners);
            s.labels_mut().insert(DATABASE_LABEL.into(), db.clone());
            s.labels_mut().insert(MANAGED_BY.into(), MANAGED_BY_VALUE.into());
            s.data = Some(data);
            s.string_data = None;
            // Replaced on the version read: a concurrent writer makes this fail (409) and retry.
            secrets.replace(&name, &PostParams::default(), &s).await?
        }
        None => {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(BTreeMap::from([
                        (MANAGED_BY.to_owned(), MANAGED_BY_VALUE.to_owned()),
                        (DATABASE_LABEL.to_owned(), db.clone()),
                    ])),
                    annotations: Some(BTreeMap::from([(SOURCE_ANNOTATION.to_owned(), source.clone())])),
                    owner_references: Some(vec![owner]),
                    ..ObjectMeta::default()
                },
                type_: Some("Opaque".into()),
                data: Some(data),
                ..Secret::default()
            };
            secrets.create(&PostParams::default(), &s).await?
        }
    };
    tx.commit().await.map_err(database)?;
    done.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(memo(&written));
    tracing::info!(namespace = %ns, role = %role, secret = %name, "tenant role ensured");
    Ok((role, hash))
}

/// Refuses to provision `namespace` through the QueueDatabase `admitting` (in provisioning's
/// transaction `tx`, under the namespace's lock, right before LOGIN is given) when the database says it
/// admits it no more, whatever this reconcile read of the QueueDatabase and the namespace's labels
/// before:
/// - the QueueDatabase was retired (it is being deleted). Its row of `sluice.queue_databases` is held
///   until the commit, so a retirement waits for this provisioning (and the deletion's revocation then
///   sees its admission), or this one sees it retired ([`Error::QueueDatabaseDeleted`]);
/// - it revoked the namespace, and its own pass has not found the namespace admitted again since
///   ([`Error::NamespaceNotAllowed`]).
async fn admitted_still(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    admitting: &Admitting,
    namespace: &str,
) -> Result<()> {
    sqlx::query(sluice_queue::sql::QUEUE_DATABASE_REGISTER)
        .bind(&admitting.uid)
        .bind(&admitting.name)
        .execute(&mut **tx)
        .await
        .map_err(database)?;
    let retired: bool = sqlx::query_scalar(sluice_queue::sql::QUEUE_DATABASE_HELD_RETIRED)
        .bind(&admitting.uid)
        .fetch_one(&mut **tx)
        .await
        .map_err(database)?;
    if retired {
        return Err(Error::QueueDatabaseDeleted {
            name: admitting.name.clone(),
        });
    }
    let revoked: bool = sqlx::query_scalar(sluice_queue::sql::TENANT_ADMISSION_REVOKED)
        .bind(namespace)
        .bind(&admitting.name)
        .fetch_one(&mut **tx)
        .await
        .map_err(database)?;
    if revoked {
        return Err(Error::NamespaceNotAllowed {
            name: admitting.name.clone(),
            namespace: namespace.into(),
        });
    }
    Ok(())
}

/// Whether `role` exists and may log in (one catalog read).
async fn can_log_in(pool: &PgPool, role: &str) -> Result<bool> {
    let login: Option<Option<bool>> = sqlx::query_scalar(sluice_queue::sql::TENANT_CAN_LOG_IN)
        .bind(role)
        .fetch_optional(pool)
        .await
        .map_err(database)?;
    Ok(login.flatten() == Some(true))
}

/// The role and password of a tenant Secret that is for database `db`, if it is one and its password
/// has the shape of one the operator makes (at least [`PASSWORD_LEN`] of `[A-Za-z0-9]`): the verifier
/// [`scram_verifier`] computes skips SASLprep, which leaves only such passwords unchanged. A Secret
/// edited to hold anything else gets a new password. The role is the one its `url` logs in as (what
/// workers use), and none when `username` names another: a Secret edited so is not trusted.
fn tenant_in(secret: &Secret, db: &str) -> Option<(String, String)> {
    if secret.labels().get(DATABASE_LABEL).map(String::as_str) != Some(db) {
        return None;
    }
    let data = secret.data.as_ref()?;
    let field = |k: &str| data.get(k).and_then(|v| String::from_utf8(v.0.clone()).ok());
    let role = field(USERNAME_KEY).filter(|r| logs_in_as(&field(URL_KEY).unwrap_or_default(), r))?;
    let password = field(PASSWORD_KEY).filter(|p| well_formed(p))?;
    Some((role, password))
}

/// Whether a connection to the postgres:// URL `url` logs in as `role` (read as the operator's pools
/// read it: the user name, percent-decoded, or a `user` parameter). False for a URL that cannot be read.
fn logs_in_as(url: &str, role: &str) -> bool {
    url.parse::<sqlx::postgres::PgConnectOptions>()
        .is_ok_and(|o| !role.is_empty() && o.get_username() == role)
}

/// `^[A-Za-z0-9]{40,}$`.
fn well_formed(password: &str) -> bool {
    password.len() >= PASSWORD_LEN && password.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The password of another tenant Secret of the namespace for the same database (JobQueues naming
/// different Secrets of one database share one role, so they must share its password).
async fn sibling_password(secrets: &Api<Secret>, db: &str, role: &str) -> Result<Option<String>> {
    let list = secrets
        .list(
            &ListParams::default().labels(&format!("{DATABASE_LABEL}={db},{MANAGED_BY}={MANAGED_BY_VALUE}")),
        )
        .await?;
    Ok(list
        .items
        .iter()
        .filter_map(|s| tenant_in(s, db))
        .find_map(|(r, p)| (r == role).then_some(p)))
}

/// Adds `owner` to the Secret's ownerReferences (a strategic merge by uid: concurrent additions keep
/// each other's); returns the Secret as written, or `None` when `owner` was one already.
async fn add_owner(secrets: &Api<Secret>, secret: &Secret, owner: &OwnerReference) -> Result<Option<Secret>> {
    if secret.owner_references().iter().any(|o| o.uid == owner.uid) {
        return Ok(None);
    }
    let patch = json!({"metadata": {"ownerReferences": [owner]}});
    let patched = secrets
        .patch(
            &secret.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await?;
    Ok(Some(patched))
}

/// `s` as an SQL string literal: in single quotes, each `'` doubled.
fn sql_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A database error while taking the lock or committing: the database's message only.
fn database(e: sqlx::Error) -> Error {
    Error::Database(sluice_queue::store::map_db_error(e))
}

/// What failed in looking up the namespace's role or in `ensure_tenant`, and the fix, from the
/// database's code and message only (the statement and its context, which would carry the password,
/// are left out). `role` is the role provisioning was ensuring, if it got that far. Only called for a
/// login that is no registered tenant ([`provision`] uses a tenant's Secret as it is). `queue_database`
/// is the QueueDatabase the JobQueue names, if it names one instead of a Secret: then the fix is an
/// admin's, on that QueueDatabase's owner login (the namespace can neither change that login nor opt
/// out of row-level security).
fn explain(
    db: &dyn sqlx::error::DatabaseError,
    namespace: &str,
    role: Option<&str>,
    queue_database: Option<&str>,
) -> String {
    let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
    advice(&code, db.message(), namespace, role, queue_database)
}

/// [`explain`] from the code and message.
fn advice(
    code: &str,
    message: &str,
    namespace: &str,
    role: Option<&str>,
    queue_database: Option<&str>,
) -> String {
    // Both go into SQL text the admin may paste: as literals, quotes doubled.
    let role_literal = role.map_or_else(|| "'<role>'".to_owned(), sql_literal);
    let role = role.unwrap_or("<role>");
    let ns_literal = sql_literal(namespace);
    // Registering a tenant by hand is the way out of every clash of names: the operator keeps the role
    // the namespace has in sluice.tenants, whatever its name, and sets its password.
    let by_hand = format!(
        "or have the database's admin make this namespace's tenant under a name of their choosing, as \
         the schema's owner (SELECT sluice.ensure_tenant('<name>', {ns_literal}, '<password>')): the \
         operator keeps the namespace's registered tenant role and sets its password"
    );
    // With a Secret of its own the namespace may opt out of row-level security; a JobQueue of a
    // QueueDatabase may not.
    let or_disabled = if queue_database.is_some() {
        ""
    } else {
        "; or set spec.database.rowLevelSecurity: Disabled"
    };
    match (code, queue_database) {
        // A QueueDatabase's owner login is the cluster admin's: only they can fix it.
        ("42501", Some(qdb)) => {
            let fix = if message.contains("role") {
                "grant it CREATEROLE (ALTER ROLE <login> CREATEROLE)"
            } else if message.contains("function") || message.contains("table") {
                "put the sluice schema owner's URL (the login that created the schema) in the \
                 QueueDatabase's Secret"
            } else if message.contains("database") {
                "make it the database's owner, or grant it CONNECT WITH GRANT OPTION"
            } else {
                "make it the schema owner's login, with CREATEROLE"
            };
            format!(
                "the owner login of QueueDatabase {qdb:?} lacks a privilege provisioning this namespace's \
                 tenant needs ({message}): an admin must fix that login: {fix}"
            )
        }
        // PostgreSQL says `permission denied to create role` / `to alter role` without CREATEROLE.
        ("42501", None) if message.contains("role") => format!(
            "the database login of spec.database.secretRef owns the schema but may not create roles \
             ({message}): grant it CREATEROLE (ALTER ROLE <login> CREATEROLE); or have an admin create \
             this namespace's tenant (SELECT sluice.ensure_tenant(...)) and put the tenant's URL in the \
             Secret; or set spec.database.rowLevelSecurity: Disabled to let workers use that login, \
             without isolation between namespaces"
        ),
        // `permission denied for function ensure_tenant` (EXECUTE is the owner's) or for a table (the
        // naming key is the owner's alone).
        ("42501", None) if message.contains("function") || message.contains("table") => format!(
            "the database login of spec.database.secretRef is not the owner of the sluice schema (the \
             login that created it) ({message}): put the owner's URL in the Secret, or have an admin \
             create this namespace's tenant (SELECT sluice.ensure_tenant(...)) and put the tenant's URL \
             in the Secret"
        ),
        // `permission denied for database`: GRANT CONNECT needs the database's owner (or the grant option).
        ("42501", None) if message.contains("database") => format!(
            "the database login of spec.database.secretRef may not grant CONNECT on the database to \
             the tenant ({message}): make it the database's owner, or grant it CONNECT WITH GRANT \
             OPTION"
        ),
        ("42501", None) => format!(
            "the database login of spec.database.secretRef lacks a privilege provisioning needs \
             ({message}): use the schema owner's login, with CREATEROLE"
        ),
        // A role of the name this database gives the namespace exists in the server but is no tenant
        // here: a tenant whose row was deleted, or made by a login that could read the naming key.
        ("SL409", _) if message.contains("is no Sluice tenant") => format!(
            "{message}: a role of the name this database gives the namespace's tenant exists but is not \
             registered here (a tenant whose row of sluice.tenants was deleted, or a role made by a \
             login that can read the database's naming key, sluice.tenant_naming): drop or rename the \
             role {role:?} if nothing uses it (the operator then makes it anew); if it was this \
             namespace's tenant, check with \\du {role} that it is a plain login (no attributes, member \
             of no role, no members) and owns nothing, then register it again as the schema's owner, \
             letting sluice.ensure_tenant refuse it if it is not (BEGIN; INSERT INTO sluice.tenants \
             (role_name, namespace) VALUES ({role_literal}, {ns_literal}); SELECT \
             sluice.ensure_tenant({role_literal}, {ns_literal}, '<password>'); COMMIT); \
             {by_hand}{or_disabled}"
        ),
        // The name is registered for another namespace of this database (by hand).
        ("SL409", _) if message.contains("tenant of another namespace") => {
            format!("{message}: {by_hand}{or_disabled}")
        }
        // A role registered for the namespace by hand that a tenant must not be (migration 0018): the
        // provisioning login itself, an owner of objects, a privileged role, or one with members.
        ("SL409", _)
            if [
                "is the login making tenants",
                "owns objects",
                "is a superuser or has",
                "has members (",
            ]
            .iter()
            .any(|m| message.contains(m)) =>
        {
            format!(
                "{message}; the role registered for this namespace in sluice.tenants cannot be its \
                 tenant: remove its row as the schema's owner (DELETE FROM sluice.tenants WHERE \
                 role_name = {role_literal}) and the operator makes a tenant role of its own, \
                 {by_hand}{or_disabled}"
            )
        }
        // The message names the memberships and the REVOKE that ends them.
        ("SL409", _) if message.contains("is a member of") => format!("{message}{or_disabled}"),
        // A tenant registered for the namespace by hand after the operator looked: the retry uses it.
        ("SL409", _) => format!("{message}: the operator retries with the namespace's registered tenant"),
        ("42883" | "42P01", _) => format!(
            "the database lacks part of the sluice schema ({message}): the schema is older than this \
             operator; it is migrated when the operator prepares it"
        ),
        _ => format!("provisioning the tenant failed ({code}: {message})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_short_identifiers_stable_and_distinct_per_database() {
        let key = "0b5c52ce-7d7d-4b0e-9f1e-2b8f3c6f1a11";
        let shop = role_name(key, "shop");
        let re = regex::Regex::new(r"^sluice_[0-9a-f]{10}_shop$").unwrap();
        assert!(re.is_match(&shop), "{shop}");
        assert_eq!(shop, role_name(key, "shop"));
        // Another database (another key) names the namespace's role otherwise.
        assert_ne!(shop, role_name("another-key", "shop"));
        let long = "a".repeat(63);
        let other = format!("{}b", "a".repeat(62));
        for ns in [
            long.as_str(),
            other.as_str(),
            &"x-".repeat(23)[..45],
            &"y".repeat(46),
        ] {
            let r = role_name(key, ns);
            assert!(r.len() <= MAX_IDENTIFIER, "{r}");
            assert_eq!(r, role_name(key, ns));
            assert!(!r.starts_with("sluice_ns_"), "{r}");
        }
        // Cut to the same 45 characters, told apart by the hash of the whole.
        assert_ne!(role_name(key, &long), role_name(key, &other));
        assert_eq!(role_name(key, &long).len(), 63);
        assert!(role_name(key, &"y".repeat(45)).ends_with(&"y".repeat(45)));
    }

    #[test]
    fn every_clash_of_role_names_says_how_to_get_past_it() {
        let clash = |message: &str| advice("SL409", message, "shop", Some("sluice_0123456789_shop"), None);
        let taken =
            clash(r#"role "sluice_0123456789_shop" exists and is no Sluice tenant; not taking it over"#);
        assert!(taken.contains("DROP") || taken.contains("drop"), "{taken}");
        assert!(
            taken.contains("VALUES ('sluice_0123456789_shop', 'shop')"),
            "{taken}"
        );
        assert!(taken.contains("sluice.ensure_tenant('<name>', 'shop'"), "{taken}");
        // Registered again through ensure_tenant, which checks the role, after a look with \du.
        assert!(
            taken.contains("sluice.ensure_tenant('sluice_0123456789_shop', 'shop'"),
            "{taken}"
        );
        assert!(taken.contains("\\du"), "{taken}");
        let elsewhere = clash(
            r#"role "sluice_0123456789_shop" is the tenant of another namespace; not moving it to "shop""#,
        );
        assert!(
            elsewhere.contains("sluice.ensure_tenant('<name>', 'shop'"),
            "{elsewhere}"
        );
        let member = clash(
            r#"role "x" is a member of reporting; a tenant could SET ROLE out of row-level security: revoke the membership first (REVOKE reporting FROM x)"#,
        );
        assert!(member.contains("REVOKE reporting FROM x"), "{member}");
        assert!(!member.contains("drop"), "{member}");
        for refused in [
            r#"role "app" is the login making tenants; a tenant must be a role of its own"#,
            r#"role "app" owns objects (see \dp, \dn and \df, or pg_shdepend); the owner of a table is not limited by row-level security: register a role of its own for the namespace"#,
            r#"role "app" is a superuser or has CREATEROLE, BYPASSRLS or REPLICATION; a tenant has none of them: register a role of its own for the namespace"#,
            r#"role "app" has members (x) that could act as the tenant: revoke the membership first (REVOKE app FROM x)"#,
        ] {
            let said = clash(refused);
            assert!(said.contains("DELETE FROM sluice.tenants"), "{said}");
            assert!(!said.contains("retries"), "{said}");
        }
        // The role goes into SQL text as a literal: a quote in it is doubled.
        let quoted = advice(
            "SL409",
            r#"role "o'brien" exists and is no Sluice tenant; not taking it over"#,
            "shop",
            Some("o'brien"),
            None,
        );
        assert!(quoted.contains("VALUES ('o''brien', 'shop')"), "{quoted}");
        assert!(
            quoted.contains("sluice.ensure_tenant('o''brien', 'shop'"),
            "{quoted}"
        );
        assert!(!quoted.contains("'o'brien'"), "{quoted}");
        let raced =
            clash(r#"namespace "shop" has a tenant role other than "sluice_0123456789_shop" already"#);
        assert!(raced.contains("retries"), "{raced}");
        // Without the naming key (a schema older than the operator's), or not its owner.
        assert!(
            advice(
                "42P01",
                r#"relation "sluice.tenant_naming" does not exist"#,
                "shop",
                None,
                None
            )
            .contains("older")
        );
        assert!(
            advice(
                "42501",
                "permission denied for table tenant_naming",
                "shop",
                None,
                None
            )
            .contains("not the owner of the sluice schema")
        );
    }

    #[test]
    fn advice_names_what_the_jobqueues_source_lets_each_side_fix() {
        let denials = [
            "permission denied to create role",
            "permission denied for function ensure_tenant",
            "permission denied for table tenant_naming",
            "permission denied for database app",
            "permission denied for schema sluice",
        ];
        let clashes = [
            r#"role "sluice_0123456789_shop" exists and is no Sluice tenant; not taking it over"#,
            r#"role "sluice_0123456789_shop" is the tenant of another namespace; not moving it to "shop""#,
            r#"role "app" owns objects (see \dp, \dn and \df, or pg_shdepend); register a role of its own for the namespace"#,
            r#"role "x" is a member of reporting; a tenant could SET ROLE out of row-level security: revoke the membership first (REVOKE reporting FROM x)"#,
        ];
        let role = Some("sluice_0123456789_shop");
        // A Secret of the namespace's own: its login is the namespace's to change, and it may opt out.
        let own = advice("42501", denials[0], "shop", role, None);
        assert!(own.contains("spec.database.secretRef"), "{own}");
        assert!(own.contains("CREATEROLE"), "{own}");
        assert!(own.contains("rowLevelSecurity: Disabled"), "{own}");
        assert!(own.contains("tenant's URL in the Secret"), "{own}");
        for clash in clashes {
            let said = advice("SL409", clash, "shop", role, None);
            assert!(said.contains("rowLevelSecurity: Disabled"), "{said}");
        }
        // A QueueDatabase: the owner login is an admin's; no opting out, no URL of the namespace's own.
        for denial in denials {
            let said = advice("42501", denial, "shop", role, Some("shared"));
            assert!(
                said.contains(r#"owner login of QueueDatabase "shared""#),
                "{said}"
            );
            assert!(said.contains("an admin must"), "{said}");
            assert!(said.contains(denial), "{said}");
            for refused in ["secretRef", "rowLevelSecurity", "tenant's URL"] {
                assert!(!said.contains(refused), "{said}");
            }
        }
        assert!(advice("42501", denials[0], "shop", role, Some("shared")).contains("CREATEROLE"));
        assert!(advice("42501", denials[2], "shop", role, Some("shared")).contains("schema owner's URL"));
        for clash in clashes {
            let said = advice("SL409", clash, "shop", role, Some("shared"));
            assert!(said.starts_with(clash), "{said}");
            for refused in ["secretRef", "rowLevelSecurity"] {
                assert!(!said.contains(refused), "{said}");
            }
        }
    }

    #[test]
    fn the_tenant_url_keeps_where_the_server_is_and_drops_the_owners_credentials_and_settings() {
        let url = tenant_url(
            "postgres://owner:s%40cret@db.example:6432/app?sslmode=verify-full&user=x&password=y&application_name=a",
            "sluice_ns_shop",
            "Pw0",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://sluice_ns_shop:Pw0@db.example:6432/app?sslmode=verify-full&application_name=a"
        );
        assert_eq!(
            tenant_url("postgres://owner@127.0.0.1:5432/postgres", "sluice_ns_a-b", "p").unwrap(),
            "postgres://sluice_ns_a-b:p@127.0.0.1:5432/postgres"
        );
        // The owner's client key and certificate, their passphrase, a password file, a service file's
        // entry and session options are the owner's: none reaches a tenant namespace.
        assert_eq!(
            tenant_url(
                "postgres://owner:pw@db.example/app?sslkey=%2Fk.pem&sslcert=%2Fc.pem&sslpassword=s3&\
                 passfile=%2Fp&service=s&options=-c%20role%3Dadmin&sslmode=require&sslrootcert=%2Fca.pem&\
                 connect_timeout=5&keepalives_idle=30&target_session_attrs=read-write&hostaddr=10.0.0.1",
                "r",
                "p"
            )
            .unwrap(),
            "postgres://r:p@db.example/app?sslmode=require&sslrootcert=%2Fca.pem&connect_timeout=5&\
             keepalives_idle=30&target_session_attrs=read-write&hostaddr=10.0.0.1"
        );
        assert_eq!(tenant_url("not a url", "r", "p"), None);
    }

    #[test]
    fn a_tenant_secret_names_the_role_its_url_logs_in_as() {
        let secret = |username: &str, url: &str| Secret {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([(DATABASE_LABEL.to_owned(), "db".to_owned())])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (URL_KEY.to_owned(), ByteString(url.as_bytes().to_vec())),
                (USERNAME_KEY.to_owned(), ByteString(username.as_bytes().to_vec())),
                (PASSWORD_KEY.to_owned(), ByteString(vec![b'a'; PASSWORD_LEN])),
            ])),
            ..Secret::default()
        };
        let pw = "a".repeat(PASSWORD_LEN);
        let url = tenant_url("postgres://owner@h/app", "sluice_0123456789_a-b", &pw).unwrap();
        assert_eq!(
            tenant_in(&secret("sluice_0123456789_a-b", &url), "db"),
            Some(("sluice_0123456789_a-b".into(), pw.clone()))
        );
        assert_eq!(tenant_in(&secret("sluice_0123456789_a-b", &url), "other"), None);
        // `username` edited to name another role than the URL's: not trusted.
        assert_eq!(tenant_in(&secret("postgres", &url), "db"), None);
        assert_eq!(tenant_in(&secret("", &url), "db"), None);
        let owner = format!("postgres://owner:{pw}@h/app");
        assert_eq!(tenant_in(&secret("sluice_x", &owner), "db"), None);
        // A `user` parameter wins over the user name; the name is percent-decoded.
        assert!(logs_in_as("postgres://a@h/app?user=b", "b"));
        assert!(!logs_in_as("postgres://a@h/app?user=b", "a"));
        assert!(logs_in_as("postgres://o%27brien@h/app", "o'brien"));
        assert!(logs_in_as("postgres://o'brien@h/app", "o'brien"));
        assert!(!logs_in_as("not a url", "a"));
    }

    #[test]
    fn databases_are_told_apart_by_host_port_and_name_only() {
        let a = database_id("postgres://u:p@h:5432/app").unwrap();
        assert_eq!(database_id("postgres://other@h/app?sslmode=require").unwrap(), a);
        assert_ne!(database_id("postgres://u:p@h:5433/app").unwrap(), a);
        assert_ne!(database_id("postgres://u:p@h:5432/other").unwrap(), a);
    }

    #[test]
    fn passwords_are_long_alphanumeric_and_fresh() {
        let a = generate_password().unwrap();
        assert_eq!(a.len(), PASSWORD_LEN);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(a, generate_password().unwrap());
    }

    #[test]
    fn only_long_alphanumeric_passwords_are_kept() {
        let ok = "a".repeat(PASSWORD_LEN);
        assert!(well_formed(&ok));
        assert!(well_formed(&generate_password().unwrap()));
        assert!(!well_formed(&"a".repeat(PASSWORD_LEN - 1)));
        for bad in [" ", "-", "é", "\u{ad}", "ﬀ"] {
            assert!(!well_formed(&format!("{ok}{bad}")), "{bad:?}");
        }
    }

    #[test]
    fn the_scram_verifier_has_postgres_shape_and_a_fresh_salt() {
        let v = scram_verifier("pencil").unwrap();
        let re = regex::Regex::new(
            r"^SCRAM-SHA-256\$4096:[A-Za-z0-9+/]{22}==\$[A-Za-z0-9+/]{43}=:[A-Za-z0-9+/]{43}=$",
        )
        .unwrap();
        assert!(re.is_match(&v), "{v}");
        assert!(!v.contains("pencil"));
        assert_ne!(v, scram_verifier("pencil").unwrap());
    }

    #[test]
    fn secret_names_follow_the_reference() {
        let r = |name: &str, key: &str| SecretKeyRef {
            name: name.into(),
            key: key.into(),
        };
        let name = |name: &str, key: &str| secret_name(DatabaseSource::SecretRef(&r(name, key)));
        let a = name("pg", "url");
        assert!(a.starts_with(SECRET_PREFIX) && a.len() == SECRET_PREFIX.len() + 12);
        assert_eq!(a, name("pg", "url"));
        assert_ne!(a, name("pg", "dsn"));
        assert_ne!(a, name("pg2", "url"));
        // Unchanged for JobQueues that named their Secret before QueueDatabases existed.
        assert_eq!(a, format!("{SECRET_PREFIX}{}", short_hash(b"pg\nurl", 6)));
    }

    #[test]
    fn a_queue_database_gets_a_secret_name_no_secret_reference_shares() {
        let q = secret_name(DatabaseSource::QueueDatabase("shared"));
        assert!(q.starts_with(SECRET_PREFIX) && q.len() == SECRET_PREFIX.len() + 12);
        assert_eq!(q, secret_name(DatabaseSource::QueueDatabase("shared")));
        assert_ne!(q, secret_name(DatabaseSource::QueueDatabase("other")));
        // A Secret named like the QueueDatabase, or like the text hashed for it, is another source.
        for (name, key) in [("shared", "url"), ("queuedatabase", "shared")] {
            let r = SecretKeyRef {
                name: name.into(),
                key: key.into(),
            };
            assert_ne!(q, secret_name(DatabaseSource::SecretRef(&r)));
        }
    }
}
