//! The counter key of a namespace: the Secret [`COUNTER_KEY_SECRET`] whose key the namespace's sidecars
//! hash counter names in Redis with (HMAC-SHA-256; the webhook sets [`env::COUNTER_KEY`] from it), so
//! that whoever reads Redis's key names cannot test guesses of a key value (a credential, a client IP)
//! against them.
//!
//! [`ensure`] writes it when a RateLimitPolicy of the namespace is reconciled and it does not exist: a
//! random key of [`tenant::PASSWORD_LEN`] characters, immutable. The operator never rotates or deletes
//! it, since a new key starts every counter of the namespace afresh; an administrator who wants another
//! key deletes the Secret (or writes their own before the first policy) and restarts the sidecars. An
//! existing Secret is used as it is when its key is usable ([`CounterKey::new`]). A Secret with an
//! unusable key, or one the operator may not create, makes the policy `Ready=False`, reason
//! `CounterKeyUnusable`, saying what to do.

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{Api, Client, api::PostParams};
use sluice_crds::{
    contract::{
        env,
        label::{MANAGED_BY, MANAGED_BY_VALUE},
        redis::{COUNTER_KEY_SECRET, COUNTER_KEY_SECRET_KEY},
    },
    sidecar_config::CounterKey,
};

use crate::{Error, Result, tenant};

/// Makes sure `namespace` has a usable counter key Secret: writes a random one if there is none; refuses
/// one whose key is missing or unusable, and says so when the operator may not read or create it
/// ([`Error::CounterKeyUnusable`]).
pub async fn ensure(client: &Client, namespace: &str) -> Result<()> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    if let Some(existing) = secrets
        .get_opt(COUNTER_KEY_SECRET)
        .await
        .map_err(|e| forbidden(e, namespace))?
    {
        return check(&existing, namespace);
    }
    match secrets
        .create(&PostParams::default(), &new_secret(namespace)?)
        .await
    {
        Ok(_) => Ok(()),
        // Written meanwhile by another policy's reconcile (or a person): use that one.
        Err(kube::Error::Api(e)) if e.code == 409 => match secrets.get_opt(COUNTER_KEY_SECRET).await? {
            Some(existing) => check(&existing, namespace),
            None => Err(kube::Error::Api(e).into()),
        },
        Err(e) => Err(forbidden(e, namespace)),
    }
}

/// A 403 as what the administrator must do; any other error as it is.
fn forbidden(e: kube::Error, namespace: &str) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 403 => unusable(
            namespace,
            format!(
                "cannot be read or created by the operator (forbidden): add the namespace to the chart's \
                 rbac.secretNamespaces, or create the Secret with a key {COUNTER_KEY_SECRET_KEY:?} of at \
                 least {} random characters; until then injected pods wait for it",
                sluice_crds::contract::redis::COUNTER_KEY_MIN_LEN
            ),
        ),
        e => e.into(),
    }
}

fn unusable(namespace: &str, why: String) -> Error {
    Error::CounterKeyUnusable {
        namespace: namespace.into(),
        name: COUNTER_KEY_SECRET.into(),
        why,
    }
}

/// A new counter key Secret for `namespace`, its key random.
fn new_secret(namespace: &str) -> Result<Secret> {
    let key = tenant::generate_password()?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(COUNTER_KEY_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.to_owned(),
                MANAGED_BY_VALUE.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            COUNTER_KEY_SECRET_KEY.to_owned(),
            ByteString(key.into_bytes()),
        )])),
        ..Secret::default()
    })
}

/// Whether `secret`'s key is one sidecars can start with, read from `data` as the kubelet reads it; the
/// error says what is wrong, never the value.
fn check(secret: &Secret, namespace: &str) -> Result<()> {
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(COUNTER_KEY_SECRET_KEY))
        .map(|v| std::str::from_utf8(&v.0));
    let why = match value {
        None => "is missing".to_owned(),
        Some(Err(_)) => "is not UTF-8".to_owned(),
        Some(Ok("")) => "is empty".to_owned(),
        Some(Ok(text)) => match CounterKey::new(text) {
            Ok(_) => return Ok(()),
            Err(why) => why,
        },
    };
    Err(unusable(
        namespace,
        format!(
            "has no usable key {COUNTER_KEY_SECRET_KEY:?}: it {why}, and sidecars refuse to start with it \
             ({}); fix it, or delete the Secret and the operator writes a new random key (every counter \
             of the namespace's policies then starts afresh)",
            env::COUNTER_KEY
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &[u8]) -> Secret {
        Secret {
            data: Some(BTreeMap::from([(
                COUNTER_KEY_SECRET_KEY.to_owned(),
                ByteString(value.to_vec()),
            )])),
            ..Secret::default()
        }
    }

    #[test]
    fn a_new_key_is_random_usable_and_immutable() {
        let (a, b) = (new_secret("shop").unwrap(), new_secret("shop").unwrap());
        assert!(check(&a, "shop").is_ok());
        assert_eq!(a.immutable, Some(true));
        assert_ne!(a.data, b.data, "two keys alike");
    }

    #[test]
    fn an_unusable_key_is_named_without_its_value() {
        for (secret, says) in [
            (Secret::default(), "is missing"),
            (with(b"short"), "at least"),
            (with(b""), "is empty"),
            (
                with(b"\xff\xfe not utf-8 but long enough to pass the length"),
                "not UTF-8",
            ),
            (with(format!("{}\n", "k".repeat(40)).as_bytes()), "whitespace"),
        ] {
            let err = check(&secret, "shop").unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(says) && text.contains("shop/sluice-counter-key"),
                "{text}"
            );
            assert!(
                !text.contains("short") && !text.contains("kkk"),
                "the value shows: {text}"
            );
            assert_eq!(
                err.condition_reason(),
                sluice_crds::conditions::reason::COUNTER_KEY_UNUSABLE
            );
        }
    }
}
