//! Revoking the tenants of namespaces a `QueueDatabase` no longer admits, from the database's own
//! registry.
//!
//! What is revoked comes from the database (`sluice.tenants`, and `sluice.tenant_admissions`, which
//! records the QueueDatabases that admitted each namespace; migration 0028), read as the schema's
//! owner, and from the QueueDatabase's selector: never from objects the namespace controls (its
//! JobQueues, its Secrets and their labels), which it could delete, relabel or point elsewhere first.
//!
//! For each namespace the QueueDatabase admitted once and admits no more ([`plan`]):
//!
//! 1. NOLOGIN for its registered role and the admission marked revoked, committed together on their
//!    own under the namespace's provisioning lock ([`take_login`]): a provisioning in progress finishes
//!    first, and one that follows, through this QueueDatabase, finds the mark and refuses the namespace,
//!    whatever its reconcile read of the namespace's labels before;
//! 2. its sessions ended, in a separate call whose failure is reported and leaves the NOLOGIN;
//! 3. the namespace's tenant Secrets for the database deleted (found by label: a Secret the namespace
//!    relabelled stays, holding a password for a role that cannot log in);
//! 4. once all of it succeeded, the revocation recorded as complete; until then every pass tries again.
//!
//! Only this QueueDatabase's own pass that finds the namespace admitted again clears the mark (and the
//! namespace's JobQueues are then provisioned anew).
//!
//! A namespace another QueueDatabase on the same database still admits keeps its role (it is the
//! namespace's one role in that database): only this QueueDatabase's Secret goes, and the admission
//! is recorded for the others first. What the report says
//! was done is what these calls returned.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Preconditions},
};
use sluice_crds::{
    contract::label::{MANAGED_BY, MANAGED_BY_VALUE},
    job_queue::DatabaseSource,
};
use sluice_queue::sql;
use sqlx::PgPool;

use crate::tenant::{DATABASE_LABEL, secret_name};
use crate::{Error, Result};

/// A row of the database's registry, as a QueueDatabase sees it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Registered {
    /// The tenant role.
    pub role_name: String,
    /// Its namespace.
    pub namespace: String,
    /// Whether this QueueDatabase admitted the namespace (a row of `sluice.tenant_admissions`).
    pub admitted_by: bool,
    /// Whether it revoked the namespace completely since it last found it admitted.
    pub revoked: bool,
    /// Whether the role, unable to log in, still has sessions.
    pub sessions_left: bool,
}

/// What a QueueDatabase does about one registered namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// It admits the namespace: the admission is recorded.
    Admit {
        /// The namespace.
        namespace: String,
    },
    /// It admitted the namespace and admits it no more, and no other QueueDatabase on the database
    /// does: the role is revoked.
    Revoke {
        /// The namespace.
        namespace: String,
        /// Its registered role.
        role: String,
    },
    /// It revoked the namespace, whose role still has sessions (one that passed the login check as
    /// LOGIN was taken, not listed yet when its sessions were ended): they are ended.
    EndSessions {
        /// The namespace.
        namespace: String,
        /// Its registered role.
        role: String,
    },
    /// It admitted the namespace and admits it no more, but other QueueDatabases on the database
    /// do: the admission passes to them and only this QueueDatabase's tenant Secret goes.
    Release {
        /// The namespace.
        namespace: String,
        /// The other QueueDatabases that admit it.
        to: Vec<String>,
    },
}

/// The steps for `registered`: `admits` is this QueueDatabase's verdict on a namespace (a namespace
/// that no longer exists is admitted by none), `elsewhere` the other QueueDatabases on the same
/// database that admit it. Namespaces this QueueDatabase never admitted, or revoked completely, are
/// left alone; one it admitted
/// while it had a registered tenant is recorded ([`sweep`]), whether the operator provisioned it or the
/// namespace uses a Secret of its own or an admin registered its tenant by hand.
pub fn plan(
    registered: &[Registered],
    admits: impl Fn(&str) -> bool,
    elsewhere: impl Fn(&str) -> Vec<String>,
) -> Vec<Step> {
    registered
        .iter()
        .filter_map(|r| {
            let namespace = r.namespace.clone();
            if admits(&r.namespace) {
                Some(Step::Admit { namespace })
            } else if !r.admitted_by {
                None
            } else if r.revoked {
                r.sessions_left.then(|| Step::EndSessions {
                    namespace,
                    role: r.role_name.clone(),
                })
            } else {
                let to = elsewhere(&r.namespace);
                if to.is_empty() {
                    Some(Step::Revoke {
                        namespace,
                        role: r.role_name.clone(),
                    })
                } else {
                    Some(Step::Release { namespace, to })
                }
            }
        })
        .collect()
}

/// What revoking one namespace did, each part as the database or the API server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    /// The namespace.
    pub namespace: String,
    /// Its role.
    pub role: String,
    /// NOLOGIN committed (`Ok(false)`: the role no longer exists), or why not.
    pub login: Result<bool, String>,
    /// Sessions ended, or why not.
    pub sessions: Result<i32, String>,
    /// Tenant Secrets deleted, or why not.
    pub secrets: Result<usize, String>,
}

impl Revocation {
    /// Whether every part succeeded.
    pub fn complete(&self) -> bool {
        self.login.is_ok() && self.sessions.is_ok() && self.secrets.is_ok()
    }
}

impl fmt::Display for Revocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (role {:?}: ", self.namespace, self.role)?;
        match &self.login {
            Ok(true) => write!(f, "may no longer log in")?,
            Ok(false) => write!(f, "no longer exists")?,
            Err(e) => write!(f, "LOGIN NOT taken: {e}")?,
        }
        match &self.sessions {
            Ok(n) => write!(f, "; {n} session(s) ended")?,
            Err(e) => write!(f, "; sessions NOT ended: {e}")?,
        }
        match &self.secrets {
            Ok(n) => write!(f, "; {n} tenant Secret(s) deleted)"),
            Err(e) => write!(f, "; tenant Secrets NOT deleted: {e})"),
        }
    }
}

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Namespaces the QueueDatabase admits that have a tenant.
    pub admitted: Vec<String>,
    /// Namespaces revoked, in part or whole.
    pub revoked: Vec<Revocation>,
    /// Namespaces left to another QueueDatabase on the same database: its Secret deleted, or why not.
    pub released: Vec<(String, Result<usize, String>)>,
    /// Namespaces revoked before whose role still had sessions: how many were ended, or why not.
    pub lingering: Vec<(String, Result<i32, String>)>,
    /// Why the sweep stopped before the end (the database refused to forget or record an admission):
    /// what it did before that is listed above all the same.
    pub stopped: Option<String>,
    /// Why a QueueDatabase being deleted could not be retired in the database ([`retire`]) before the
    /// sweep.
    pub unretired: Option<String>,
}

impl Report {
    /// Whether every revocation and release is complete.
    pub fn complete(&self) -> bool {
        self.stopped.is_none()
            && self.unretired.is_none()
            && self.revoked.iter().all(Revocation::complete)
            && self.released.iter().all(|(_, r)| r.is_ok())
            && self.lingering.iter().all(|(_, r)| r.is_ok())
    }
}

/// Runs [`plan`]'s steps for QueueDatabase `queue_database` on the database `pool` logs into as the
/// schema's owner, whose [`crate::tenant::database_id`] is `database`.
pub async fn sweep(
    client: &Client,
    pool: &PgPool,
    queue_database: &str,
    database: &str,
    admits: impl Fn(&str) -> bool,
    elsewhere: impl Fn(&str) -> Vec<String>,
) -> Result<Report> {
    let registered: Vec<Registered> = sqlx::query_as(sql::TENANT_REGISTRY)
        .bind(queue_database)
        .fetch_all(pool)
        .await
        .map_err(db)?;
    let mut report = Report::default();
    let steps = plan(&registered, admits, elsewhere);
    // Admissions first: a namespace admitted again is let in (its mark cleared) whatever becomes of the
    // revocations below.
    report.admitted = steps
        .iter()
        .filter_map(|s| match s {
            Step::Admit { namespace } => Some(namespace.clone()),
            _ => None,
        })
        .collect();
    // Revoking goes on when recording fails; the failure is reported.
    let mut unrecorded = None;
    if !report.admitted.is_empty()
        && let Err(e) = sqlx::query(sql::TENANT_ADMISSIONS_RECORD)
            .bind(&report.admitted)
            .bind(queue_database)
            .execute(pool)
            .await
    {
        unrecorded = Some(db(e).to_string());
    }
    for step in steps {
        match step {
            Step::Admit { .. } => {}
            Step::Revoke { namespace, role } => {
                let done = revoke(client, pool, queue_database, database, &namespace, &role).await;
                if done.complete()
                    && let Err(e) = sqlx::query(sql::TENANT_ADMISSION_REVOCATION_COMPLETE)
                        .bind(&namespace)
                        .bind(queue_database)
                        .execute(pool)
                        .await
                {
                    report.stopped = Some(db(e).to_string());
                }
                report.revoked.push(done);
            }
            Step::EndSessions { namespace, role } => {
                let ended = end_sessions(pool, &namespace, &role).await;
                tracing::info!(namespace, role, ?ended, "sessions of a revoked tenant ended");
                report.lingering.push((namespace, ended));
            }
            Step::Release { namespace, to } => {
                // The admission passes to the others before this one's is forgotten: the namespace is
                // always recorded as admitted by someone who will revoke it.
                if let Err(e) = record(pool, &namespace, &to).await {
                    report.stopped = Some(e.to_string());
                    break;
                }
                let name = secret_name(DatabaseSource::QueueDatabase(queue_database));
                let deleted = delete_secrets(client, &namespace, database, Some(&name)).await;
                if deleted.is_ok()
                    && let Err(e) = forget(pool, &namespace, queue_database).await
                {
                    report.stopped = Some(e.to_string());
                }
                report.released.push((namespace, deleted));
            }
        }
        // What was done so far is reported with the error, not lost in it.
        if report.stopped.is_some() {
            break;
        }
    }
    if let Some(e) = unrecorded {
        let unrecorded = format!("recording the namespaces it admits failed: {e}");
        report.stopped = Some(match report.stopped.take() {
            Some(stopped) => format!("{stopped}; {unrecorded}"),
            None => unrecorded,
        });
    }
    Ok(report)
}

/// Revokes `role`, `namespace`'s tenant: NOLOGIN committed first, then its sessions, then its Secrets.
async fn revoke(
    client: &Client,
    pool: &PgPool,
    queue_database: &str,
    database: &str,
    namespace: &str,
    role: &str,
) -> Revocation {
    let login = take_login(pool, queue_database, namespace, role).await;
    // Sessions are ended even when the NOLOGIN failed: a tenant's sessions never outlive a revocation
    // attempt. Twice when the first call ended some: a backend that passed the login check before the
    // NOLOGIN committed may not have been listed yet.
    let sessions = match end_sessions(pool, namespace, role).await {
        Ok(n) if n > 0 => end_sessions(pool, namespace, role).await.map(|m| n + m),
        other => other,
    };
    let secrets = delete_secrets(client, namespace, database, None).await;
    let done = Revocation {
        namespace: namespace.into(),
        role: role.into(),
        login,
        sessions,
        secrets,
    };
    tracing::info!(namespace, role, outcome = %done, "tenant revoked");
    done
}

/// NOLOGIN for `role`, `namespace`'s tenant, and `queue_database`'s admission of the namespace marked
/// revoked, in a transaction of their own under the namespace's provisioning lock; whether the role
/// exists. From its commit on, provisioning through `queue_database` refuses the namespace.
pub async fn take_login(
    pool: &PgPool,
    queue_database: &str,
    namespace: &str,
    role: &str,
) -> Result<bool, String> {
    let mut tx = crate::tenant::begin_bounded(pool).await.map_err(why)?;
    sqlx::query(crate::tenant::LOCK_NAMESPACE)
        .bind(namespace)
        .execute(&mut *tx)
        .await
        .map_err(why)?;
    let exists: bool = sqlx::query_scalar(sql::TENANT_REVOKE_LOGIN)
        .bind(role)
        .bind(namespace)
        .fetch_one(&mut *tx)
        .await
        .map_err(why)?;
    sqlx::query(sql::TENANT_ADMISSION_MARK_REVOKED)
        .bind(namespace)
        .bind(queue_database)
        .execute(&mut *tx)
        .await
        .map_err(why)?;
    tx.commit().await.map_err(why)?;
    Ok(exists)
}

/// Ends `role`'s sessions; how many. Its lock waits (the membership it grants itself) are bounded.
async fn end_sessions(pool: &PgPool, namespace: &str, role: &str) -> Result<i32, String> {
    let mut tx = crate::tenant::begin_bounded(pool).await.map_err(why)?;
    let ended = sqlx::query_scalar(sql::TENANT_END_SESSIONS)
        .bind(role)
        .bind(namespace)
        .fetch_one(&mut *tx)
        .await
        .map_err(why)?;
    tx.commit().await.map_err(why)?;
    Ok(ended)
}

/// Deletes the tenant Secrets of `namespace` for `database` (labels `managed-by=sluice` and
/// `sluice.dev/tenant-database=<database>`), or only the one named `only`; each with its uid as a
/// precondition. A namespace or Secret already gone counts as done.
async fn delete_secrets(
    client: &Client,
    namespace: &str,
    database: &str,
    only: Option<&str>,
) -> Result<usize, String> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let labels = format!("{MANAGED_BY}={MANAGED_BY_VALUE},{DATABASE_LABEL}={database}");
    let found = match secrets.list(&ListParams::default().labels(&labels)).await {
        Ok(found) => found,
        // Where the operator may not list Secrets it may not have written one either (its RBAC,
        // `rbac.secretNamespaces`): a tenant registered by hand for such a namespace.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::info!(
                namespace,
                "the operator may not list Secrets here; it wrote no tenant Secret"
            );
            return Ok(0);
        }
        Err(e) => return Err(e.to_string()),
    };
    let mut deleted = 0;
    for s in found
        .items
        .iter()
        .filter(|s| only.is_none_or(|name| s.name_any() == name))
    {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: s.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match secrets.delete(&s.name_any(), &params).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("Secret {}: {e}", s.name_any())),
        }
    }
    Ok(deleted)
}

/// Records that each of `queue_databases` admits `namespace`, leaving a mark of theirs as it is: this
/// pass's view of their selectors may be older than their own passes'.
async fn record(pool: &PgPool, namespace: &str, queue_databases: &[String]) -> Result<()> {
    for qdb in queue_databases {
        sqlx::query(sql::TENANT_ADMISSION_PROVISIONED)
            .bind(namespace)
            .bind(qdb)
            .execute(pool)
            .await
            .map_err(db)?;
    }
    Ok(())
}

/// Retires the QueueDatabase with uid `uid`, named `name` (it is being deleted), in
/// `sluice.queue_databases` (migration 0028), unless it is already: waits, within the lock timeout, for
/// the provisionings through it under way to commit; after it, none records an admission of it, so the
/// revocation that follows sees every one.
pub async fn retire(pool: &PgPool, uid: &str, name: &str) -> Result<()> {
    let retired: bool = sqlx::query_scalar(sql::QUEUE_DATABASE_RETIRED)
        .bind(uid)
        .fetch_one(pool)
        .await
        .map_err(db)?;
    if retired {
        return Ok(());
    }
    let mut tx = crate::tenant::begin_bounded(pool).await.map_err(db)?;
    // Each lock wait is bounded by the lock timeout; provisionings that come while it waits share the
    // row and may go first, so the statement is bounded as a whole too.
    sqlx::query("SET LOCAL statement_timeout = '10s'")
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    sqlx::query(sql::QUEUE_DATABASE_RETIRE)
        .bind(uid)
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)
}

async fn forget(pool: &PgPool, namespace: &str, queue_database: &str) -> Result<()> {
    sqlx::query(sql::TENANT_ADMISSION_FORGET)
        .bind(namespace)
        .bind(queue_database)
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(())
}

/// A database error for a report: its code and message (no statement, which carries nothing secret
/// here, but keeps reports short), or the transport error.
fn why(e: sqlx::Error) -> String {
    match e.as_database_error() {
        Some(d) => format!("{}: {}", d.code().unwrap_or_default(), d.message()),
        None => e.to_string(),
    }
}

fn db(e: sqlx::Error) -> Error {
    Error::Database(sluice_queue::store::map_db_error(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(namespace: &str, admitted_by: bool) -> Registered {
        Registered {
            role_name: format!("sluice_0123456789_{namespace}"),
            namespace: namespace.into(),
            admitted_by,
            revoked: false,
            sessions_left: false,
        }
    }

    #[test]
    fn only_namespaces_this_queue_database_admitted_and_admits_no_more_are_revoked_once() {
        let rows = [
            registered("shop", true),
            registered("blog", true),
            registered("own-secret", false),
            registered("shared", true),
            registered("new", false),
            Registered {
                revoked: true,
                ..registered("gone", true)
            },
            Registered {
                revoked: true,
                ..registered("back", true)
            },
            Registered {
                revoked: true,
                sessions_left: true,
                ..registered("lingering", true)
            },
        ];
        let steps = plan(
            &rows,
            |ns| ns == "shop" || ns == "new" || ns == "back",
            |ns| {
                if ns == "shared" {
                    vec!["other".to_owned()]
                } else {
                    vec![]
                }
            },
        );
        assert_eq!(
            steps,
            [
                Step::Admit {
                    namespace: "shop".into()
                },
                Step::Revoke {
                    namespace: "blog".into(),
                    role: "sluice_0123456789_blog".into()
                },
                Step::Release {
                    namespace: "shared".into(),
                    to: vec!["other".into()]
                },
                Step::Admit {
                    namespace: "new".into()
                },
                Step::Admit {
                    namespace: "back".into()
                },
                Step::EndSessions {
                    namespace: "lingering".into(),
                    role: "sluice_0123456789_lingering".into()
                },
            ]
        );
    }

    #[test]
    fn a_report_is_complete_only_when_every_part_succeeded() {
        let full = Revocation {
            namespace: "blog".into(),
            role: "r".into(),
            login: Ok(true),
            sessions: Ok(2),
            secrets: Ok(1),
        };
        assert!(full.complete());
        assert_eq!(
            full.to_string(),
            "blog (role \"r\": may no longer log in; 2 session(s) ended; 1 tenant Secret(s) deleted)"
        );
        let sessions_failed = Revocation {
            sessions: Err("42501: must be a member".into()),
            ..full.clone()
        };
        assert!(!sessions_failed.complete());
        assert!(
            sessions_failed
                .to_string()
                .contains("may no longer log in; sessions NOT ended")
        );
        let report = Report {
            revoked: vec![full, sessions_failed],
            ..Report::default()
        };
        assert!(!report.complete());
    }
}
