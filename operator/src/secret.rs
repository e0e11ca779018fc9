//! Reading a connection URL from the one Secret an object names (`spec.redis.secretRef`,
//! `spec.database.secretRef`), in the object's own namespace, or, for a JobQueue naming a
//! `QueueDatabase`, from the QueueDatabase's Secret in the operator's own namespace ([`database_url`]).
//! These are the only Secrets the operator reads for users (besides the counter key it writes itself,
//! [`crate::counter_key`]); the URL goes to Redis or PostgreSQL clients and nowhere else (never a log,
//! status or another namespace).

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{Api, Client};
use sluice_crds::{
    job_queue::{DatabaseSource, JobQueue},
    queue_database::QueueDatabase,
    secret_ref::SecretKeyRef,
};

use crate::{Error, Result};

/// `RateLimitPolicy`'s reference to the Secret holding the Redis URL.
pub const REDIS_SECRET_FIELD: &str = "spec.redis.secretRef";
/// `JobQueue`'s reference to the Secret holding the PostgreSQL URL.
pub const DATABASE_SECRET_FIELD: &str = "spec.database.secretRef";

/// The value of `reference` in namespace `namespace`: `data` (UTF-8) or else `stringData`, trimmed.
/// `field` names the reference in errors (`spec.redis.secretRef`). A missing Secret is
/// [`Error::SecretNotFound`]; a missing, empty or non-UTF-8 key is [`Error::SecretKeyMissing`].
pub async fn read_url(
    client: &Client,
    namespace: &str,
    reference: &SecretKeyRef,
    field: &str,
) -> Result<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&reference.name)
        .await?
        .ok_or_else(|| Error::SecretNotFound {
            namespace: namespace.into(),
            name: reference.name.clone(),
            field: field.to_owned(),
        })?;
    url_in(&secret, &reference.key).ok_or_else(|| Error::SecretKeyMissing {
        namespace: namespace.into(),
        name: reference.name.clone(),
        key: reference.key.clone(),
        field: field.to_owned(),
    })
}

/// The URL the operator connects to `jq`'s database with: `spec.database.secretRef`'s in the JobQueue's
/// namespace, or for `spec.database.queueDatabaseRef` the QueueDatabase's (its Secret in
/// `operator_namespace`), once the QueueDatabase is found and admits the JobQueue's namespace
/// and taken over by the operator and not being deleted ([`Error::QueueDatabaseNotFound`],
/// [`Error::QueueDatabasePending`], [`Error::QueueDatabaseDeleted`], [`Error::NamespaceNotAllowed`],
/// [`Error::QueueDatabaseSelectorInvalid`]). A spec naming no single source
/// is the render's to refuse; here it reads as a missing Secret.
pub async fn database_url(client: &Client, operator_namespace: &str, jq: &JobQueue) -> Result<String> {
    Ok(database_source(client, operator_namespace, jq).await?.0)
}

/// The QueueDatabase a JobQueue's URL came from, as [`database_source`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitting {
    /// Its name.
    pub name: String,
    /// Its `metadata.uid`: a QueueDatabase deleted and made again under its name is another one.
    pub uid: String,
}

/// [`database_url`], and for `spec.database.queueDatabaseRef` the QueueDatabase that admitted the
/// namespace.
pub async fn database_source(
    client: &Client,
    operator_namespace: &str,
    jq: &JobQueue,
) -> Result<(String, Option<Admitting>)> {
    let ns = jq.namespace_or_default();
    match jq.spec.database.source() {
        Some(DatabaseSource::SecretRef(r)) => {
            Ok((read_url(client, ns, r, DATABASE_SECRET_FIELD).await?, None))
        }
        Some(DatabaseSource::QueueDatabase(name)) => {
            let qdb = Api::<QueueDatabase>::all(client.clone())
                .get_opt(name)
                .await?
                .ok_or_else(|| Error::QueueDatabaseNotFound { name: name.into() })?;
            // One being deleted serves nobody: its finalizer is revoking its namespaces. Nor does one
            // the operator has not taken over yet: deleting it would revoke nothing.
            if qdb.metadata.deletion_timestamp.is_some() {
                return Err(Error::QueueDatabaseDeleted { name: name.into() });
            }
            if !qdb.serves() {
                return Err(Error::QueueDatabasePending { name: name.into() });
            }
            let admitting = Admitting {
                name: name.into(),
                uid: qdb.metadata.uid.clone().unwrap_or_default(),
            };
            let labels = Api::<Namespace>::all(client.clone())
                .get_opt(ns)
                .await?
                .and_then(|n| n.metadata.labels)
                .unwrap_or_default();
            match qdb.spec.admits(&labels) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Error::NamespaceNotAllowed {
                        name: name.into(),
                        namespace: ns.into(),
                    });
                }
                Err(why) => {
                    return Err(Error::QueueDatabaseSelectorInvalid {
                        name: name.into(),
                        why,
                    });
                }
            }
            let field = format!("QueueDatabase {name:?} spec.secretRef (an administrator must fix it)");
            let url = read_url(client, operator_namespace, &qdb.spec.secret_ref, &field).await?;
            Ok((url, Some(admitting)))
        }
        None => Err(Error::SecretNotFound {
            namespace: ns.into(),
            name: String::new(),
            field: "spec.database (it names neither secretRef nor queueDatabaseRef)".into(),
        }),
    }
}

fn url_in(secret: &Secret, key: &str) -> Option<String> {
    let from_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok());
    let from_string = || secret.string_data.as_ref().and_then(|d| d.get(key)).cloned();
    from_data
        .or_else(from_string)
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(data: &[(&str, &[u8])], string_data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            string_data: Some(
                string_data
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn the_url_is_read_from_data_then_string_data_and_trimmed() {
        assert_eq!(
            url_in(&secret(&[("url", b"redis://r:6379\n")], &[]), "url").as_deref(),
            Some("redis://r:6379")
        );
        assert_eq!(
            url_in(&secret(&[], &[("url", "postgres://db/app")]), "url").as_deref(),
            Some("postgres://db/app")
        );
        assert_eq!(
            url_in(&secret(&[("url", &[0xff])], &[("url", "redis://s")]), "url").as_deref(),
            Some("redis://s"),
            "bytes that are not UTF-8 fall back to stringData"
        );
    }

    #[test]
    fn a_missing_or_empty_key_reads_as_missing() {
        assert_eq!(url_in(&secret(&[("uri", b"redis://r")], &[]), "url"), None);
        assert_eq!(url_in(&secret(&[("url", b"  ")], &[]), "url"), None);
    }
}
