//! A throwaway certificate authority and the server certificate it signs (for `localhost`, `127.0.0.1`
//! and the in-cluster names), plus rustls configs for serving and for calling webhooks with a caBundle.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use crate::error::{Error, Result};

/// CA and server certificate, PEM encoded.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate clients trust (`certificate-authority-data`).
    pub ca_pem: String,
    /// The server's certificate.
    pub cert_pem: String,
    /// The server's private key.
    pub key_pem: String,
}

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

impl Pki {
    /// A fresh CA and a server certificate for `hosts` (DNS names or IP addresses).
    pub fn generate(hosts: &[&str]) -> Result<Self> {
        let ca_key = KeyPair::generate().map_err(tls_err)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sluice-test-apiserver-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(tls_err)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut params = CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
            .map_err(tls_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, hosts.first().copied().unwrap_or("localhost"));
        let cert = params.signed_by(&key, &issuer).map_err(tls_err)?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A rustls server config (ring provider) offering h2 and http/1.1.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(tls_err)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(tls_err)?;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(tls_err)?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(tls_err)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A rustls client config that trusts only the given PEM bundle.
pub fn client_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.map_err(tls_err)?).map_err(tls_err)?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(Arc::new(config))
}
