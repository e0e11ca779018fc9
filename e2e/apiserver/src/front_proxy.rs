//! The aggregator's identity towards APIService backends, as kube-aggregator has it: a front-proxy CA
//! and the client certificate it signs ([`FrontProxy`], common name `front-proxy-client`, as kubeadm sets
//! it up), published with the header names in `kube-system/extension-apiserver-authentication`
//! ([`authentication_config_map`]), where aggregated API servers read them.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, pem::PemObject};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;

use crate::error::{Error, Result};

/// Common name of the front-proxy client certificate (kubeadm's).
pub const FRONT_PROXY_CLIENT_NAME: &str = "front-proxy-client";
/// Namespace of the ConfigMap aggregated API servers read the front-proxy settings from.
pub const AUTHENTICATION_CONFIGMAP_NAMESPACE: &str = "kube-system";
/// Its name.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// The aggregator's identity towards backends: a front-proxy CA and the client certificate it signs.
#[derive(Clone, Debug)]
pub struct FrontProxy {
    /// The CA backends trust (`requestheader-client-ca-file`).
    pub ca_pem: String,
    /// The client certificate the proxy presents.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

impl FrontProxy {
    /// A fresh front-proxy CA and a client certificate with common name `common_name` signed by it.
    /// Tests make a second one to play a stranger with a certificate from another CA.
    pub fn generate(common_name: &str) -> Result<Self> {
        let ca_key = KeyPair::generate().map_err(tls_err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        ca.distinguished_name.push(DnType::CommonName, "front-proxy-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(tls_err)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        leaf.distinguished_name.push(DnType::CommonName, common_name);
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &issuer).map_err(tls_err)?;
        Ok(FrontProxy {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A rustls client config that presents the client certificate and trusts the PEM bundle `ca_pem`
    /// (or, with `None`, any server certificate: `insecureSkipTLSVerify`).
    pub fn client_config(&self, ca_pem: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(tls_err)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(tls_err)?;
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?;
        let builder = match ca_pem {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    roots.add(cert.map_err(tls_err)?).map_err(tls_err)?;
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
        };
        Ok(Arc::new(
            builder.with_client_auth_cert(certs, key).map_err(tls_err)?,
        ))
    }
}

/// `kube-system/extension-apiserver-authentication` as kube-apiserver publishes it: the front-proxy CA,
/// the allowed client names and header names (JSON lists in strings), and the cluster's client CA.
pub fn authentication_config_map(front_proxy: &FrontProxy, client_ca_pem: Option<&str>) -> Value {
    let mut data = serde_json::json!({
        "requestheader-client-ca-file": front_proxy.ca_pem,
        "requestheader-allowed-names": format!("[\"{FRONT_PROXY_CLIENT_NAME}\"]"),
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
    });
    if let Some(ca) = client_ca_pem {
        data["client-ca-file"] = Value::String(ca.to_string());
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": AUTHENTICATION_CONFIGMAP, "namespace": AUTHENTICATION_CONFIGMAP_NAMESPACE},
        "data": data,
    })
}

/// `insecureSkipTLSVerify: true`: any certificate is accepted, signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
