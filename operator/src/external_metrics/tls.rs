//! The metrics API's serving certificate: a self-signed CA and a leaf for the APIService's service,
//! kept in the Secret named by `SLUICE_EXTERNAL_METRICS_CERT_SECRET` (made on first start, reused by
//! every replica and restart), or provided by cert-manager.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// A CA and a serving certificate, PEM encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingCert {
    /// The CA (the APIService's `caBundle`).
    pub ca_pem: String,
    /// The server's certificate.
    pub cert_pem: String,
    /// The server's key.
    pub key_pem: String,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating or parsing a certificate failed.
    #[error("certificate: {0}")]
    Cert(String),
    /// Reading or writing the Secret failed.
    #[error("Secret: {0}")]
    Kube(#[from] kube::Error),
}

fn cert_err(e: impl std::fmt::Display) -> TlsError {
    TlsError::Cert(e.to_string())
}

impl ServingCert {
    /// A fresh CA and a certificate for `hosts`.
    pub fn generate(hosts: &[String]) -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate().map_err(cert_err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
        ca.distinguished_name
            .push(DnType::CommonName, "sluice-external-metrics-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).map_err(cert_err)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().map_err(cert_err)?;
        let mut leaf = CertificateParams::new(hosts.to_vec()).map_err(cert_err)?;
        leaf.distinguished_name.push(
            DnType::CommonName,
            hosts.first().cloned().unwrap_or_else(|| "localhost".into()),
        );
        let cert = leaf.signed_by(&key, &issuer).map_err(cert_err)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A rustls server config offering h2 and http/1.1.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(cert_err)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(cert_err)?;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(cert_err)?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(cert_err)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    fn from_secret(s: &Secret) -> Option<Self> {
        let data = s.data.as_ref()?;
        let text = |k: &str| data.get(k).and_then(|b| String::from_utf8(b.0.clone()).ok());
        Some(Self {
            cert_pem: text("tls.crt")?,
            key_pem: text("tls.key")?,
            ca_pem: text("ca.crt").unwrap_or_default(),
        })
    }
}

/// The certificate in Secret `namespace/name`, made (for `hosts`) and stored there when missing. When
/// two replicas race to make it, the loser reads the winner's.
pub async fn ensure(
    client: &Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
) -> Result<ServingCert, TlsError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(c) = api
        .get_opt(name)
        .await?
        .as_ref()
        .and_then(ServingCert::from_secret)
    {
        return Ok(c);
    }
    let cert = ServingCert::generate(hosts)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".into(),
                crate::FIELD_MANAGER.into(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".into(), ByteString(cert.cert_pem.clone().into_bytes())),
            ("tls.key".into(), ByteString(cert.key_pem.clone().into_bytes())),
            ("ca.crt".into(), ByteString(cert.ca_pem.clone().into_bytes())),
        ])),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(cert),
        Err(kube::Error::Api(e)) if e.code == 409 => api
            .get(name)
            .await
            .ok()
            .as_ref()
            .and_then(ServingCert::from_secret)
            .ok_or_else(|| TlsError::Cert(format!("Secret {namespace}/{name} has no tls.crt/tls.key"))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_makes_a_server_config() {
        let c = ServingCert::generate(&["sluice-metrics-api.sluice-system.svc".into()]).unwrap();
        assert!(c.ca_pem.contains("BEGIN CERTIFICATE"));
        assert_ne!(c.ca_pem, c.cert_pem);
        c.server_config().unwrap();
    }
}
