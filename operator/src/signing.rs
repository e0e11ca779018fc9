//! Signing the configs the operator publishes through Redis.
//!
//! Whoever can write to a policy's Redis key could otherwise push any limits config to its running
//! sidecars (an allow-list of everything, `failureMode: open`) with a huge generation that later updates
//! never beat. So the operator signs what it publishes with an Ed25519 key only it holds, and the
//! webhook gives each injected sidecar the public key (`SLUICE_CONFIG_VERIFY_KEY`); a sidecar with it
//! applies a config from Redis only when the signature verifies, and only for its own policy.
//!
//! Public-key signatures need no secret outside the operator's namespace: the private key is in Secret
//! `sluice-config-signing` there (created by the first replica, read by the others), the public key is
//! not secret. A symmetric key (HMAC) would have to be copied into every namespace with governed pods.

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use ring::{
    rand::SystemRandom,
    signature::{Ed25519KeyPair, KeyPair},
};
use sluice_crds::contract::redis::signed;

use crate::digest::hex;
use crate::{Error, Result};

/// The Secret key holding the PKCS#8 (v2) document of the Ed25519 key.
pub const SECRET_KEY: &str = "ed25519.pkcs8";

/// Signs config text with the operator's Ed25519 key.
pub struct ConfigSigner {
    key: Ed25519KeyPair,
    public_hex: String,
}

impl std::fmt::Debug for ConfigSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSigner")
            .field("public_key", &self.public_hex)
            .finish_non_exhaustive()
    }
}

impl ConfigSigner {
    /// A signer from a PKCS#8 v2 document (as [`generate_pkcs8`] makes).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self> {
        let key = Ed25519KeyPair::from_pkcs8(pkcs8)
            .map_err(|e| Error::Tls(format!("config signing key unreadable: {e}")))?;
        let public_hex = hex(key.public_key().as_ref());
        Ok(Self { key, public_hex })
    }

    /// A signer with a fresh key (tests).
    pub fn generate() -> Self {
        Self::from_pkcs8(&generate_pkcs8()).expect("a generated key is readable")
    }

    /// The public key, 64 hex digits: `SLUICE_CONFIG_VERIFY_KEY` in injected sidecars.
    pub fn public_key_hex(&self) -> &str {
        &self.public_hex
    }

    /// `yaml` with its signature line in front, as the config key holds it.
    pub fn sign(&self, yaml: &str) -> String {
        signed(&hex(self.key.sign(yaml.as_bytes()).as_ref()), yaml)
    }
}

/// A new Ed25519 key as a PKCS#8 v2 document.
pub fn generate_pkcs8() -> Vec<u8> {
    Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
        .expect("the system's random source works")
        .as_ref()
        .to_vec()
}

/// The signer from Secret `name` in `namespace`, creating the Secret with a new key when it does not
/// exist. Replicas racing to create it all end up with the one that won.
pub async fn load_or_create(client: &Client, namespace: &str, name: &str) -> Result<ConfigSigner> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(secret) = api.get_opt(name).await? {
        return from_secret(&secret, namespace, name);
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                sluice_crds::contract::label::MANAGED_BY.into(),
                sluice_crds::contract::label::MANAGED_BY_VALUE.into(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.into(),
            ByteString(generate_pkcs8()),
        )])),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(created) => from_secret(&created, namespace, name),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let secret = api.get(name).await?;
            from_secret(&secret, namespace, name)
        }
        Err(e) => Err(e.into()),
    }
}

fn from_secret(secret: &Secret, namespace: &str, name: &str) -> Result<ConfigSigner> {
    let pkcs8 = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .ok_or_else(|| Error::Tls(format!("Secret {namespace}/{name} has no {SECRET_KEY}")))?;
    ConfigSigner::from_pkcs8(&pkcs8.0)
}

#[cfg(test)]
mod tests {
    use ring::signature::{ED25519, UnparsedPublicKey};
    use sluice_crds::contract::redis::split_signed;

    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_signed_config_verifies_with_the_public_key_and_nothing_else_does() {
        let signer = ConfigSigner::generate();
        assert_eq!(signer.public_key_hex().len(), 64);
        let text = signer.sign("policy:\n  generation: 3\n");
        let (signature, body) = split_signed(&text).unwrap();
        assert_eq!(body, "policy:\n  generation: 3\n");
        let public = UnparsedPublicKey::new(&ED25519, unhex(signer.public_key_hex()));
        assert!(public.verify(body.as_bytes(), &unhex(signature)).is_ok());
        assert!(
            public
                .verify(b"policy:\n  generation: 4\n", &unhex(signature))
                .is_err()
        );
        let other = ConfigSigner::generate();
        assert_ne!(other.public_key_hex(), signer.public_key_hex());
    }

    #[test]
    fn the_key_survives_a_round_trip_through_its_pkcs8_document() {
        let pkcs8 = generate_pkcs8();
        let a = ConfigSigner::from_pkcs8(&pkcs8).unwrap();
        let b = ConfigSigner::from_pkcs8(&pkcs8).unwrap();
        assert_eq!(a.public_key_hex(), b.public_key_hex());
        assert!(ConfigSigner::from_pkcs8(b"garbage").is_err());
    }
}
