//! The certificates and keys a control plane needs, written as files for its flags: the cluster CA and
//! the API server's serving certificate, client certificates (the harness as `system:masters`,
//! kube-controller-manager as `system:kube-controller-manager`), the front-proxy CA and the aggregator's
//! client certificate, and the service-account signing key. All ECDSA P-256, fresh per control plane.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// The API server's in-cluster names and addresses its serving certificate covers.
pub const SERVING_NAMES: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// A certificate and its key as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// Every file the control plane's flags name.
#[derive(Debug, Clone)]
pub struct ControlPlanePki {
    /// The cluster CA: signs the serving certificate and client certificates; clients trust it.
    pub ca: CertFiles,
    /// The CA's certificate as PEM, for kubeconfigs.
    pub ca_pem: String,
    /// kube-apiserver's serving certificate.
    pub serving: CertFiles,
    /// The harness's client certificate (group `system:masters`).
    pub admin: CertFiles,
    /// kube-controller-manager's client certificate.
    pub controller_manager: CertFiles,
    /// The CA aggregated API servers trust for front-proxy requests (`requestheader-client-ca-file`).
    pub front_proxy_ca: CertFiles,
    /// The aggregator's client certificate (CN `front-proxy-client`).
    pub front_proxy_client: CertFiles,
    /// The service-account token signing key (PKCS#8).
    pub service_account_key: PathBuf,
    /// Its public key, which verifies tokens (`--service-account-key-file` reads no PKCS#8 private key).
    pub service_account_public_key: PathBuf,
}

/// The aggregator's client certificate name, allowed by `--requestheader-allowed-names`.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";
/// The harness's user name.
pub const ADMIN_USER: &str = "sluice-e2e-admin";

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn authority(name: &str) -> Result<Authority> {
    let key = KeyPair::generate().map_err(tls_err)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).map_err(tls_err)?;
    Ok(Authority {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    })
}

/// A leaf certificate signed by `ca`: `names` as SANs (IPs detected), `cn`/`org` as subject.
fn leaf(
    ca: &Authority,
    names: &[&str],
    cn: &str,
    org: Option<&str>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(tls_err)?;
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).map_err(tls_err)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    if let Some(org) = org {
        params.distinguished_name.push(DnType::OrganizationName, org);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, &ca.issuer).map_err(tls_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write_pair(dir: &Path, name: &str, (cert, key): (String, String)) -> Result<CertFiles> {
    let files = CertFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&files.cert, cert)?;
    std::fs::write(&files.key, key)?;
    Ok(files)
}

impl ControlPlanePki {
    /// Generates everything into `dir`. `service_ip` (the first address of the service range, the
    /// `kubernetes` Service's ClusterIP) is added to the serving certificate.
    pub fn generate(dir: &Path, service_ip: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let ca = authority("sluice-e2e-cluster-ca")?;
        let front_proxy = authority("sluice-e2e-front-proxy-ca")?;
        let mut serving_names = SERVING_NAMES.to_vec();
        serving_names.push(service_ip);
        let serving = leaf(
            &ca,
            &serving_names,
            "kube-apiserver",
            None,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let admin = leaf(
            &ca,
            &[],
            ADMIN_USER,
            Some("system:masters"),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let kcm = leaf(
            &ca,
            &[],
            "system:kube-controller-manager",
            None,
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let proxy_client = leaf(
            &front_proxy,
            &[],
            FRONT_PROXY_CLIENT,
            None,
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let sa_key = KeyPair::generate().map_err(tls_err)?;
        let service_account_key = dir.join("service-account.key");
        std::fs::write(&service_account_key, sa_key.serialize_pem())?;
        let service_account_public_key = dir.join("service-account.pub");
        std::fs::write(&service_account_public_key, sa_key.public_key_pem())?;
        let ca_files = CertFiles {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        std::fs::write(&ca_files.cert, &ca.pem)?;
        std::fs::write(&ca_files.key, ca.issuer.key().serialize_pem())?;
        let front_proxy_ca = CertFiles {
            cert: dir.join("front-proxy-ca.crt"),
            key: dir.join("front-proxy-ca.key"),
        };
        std::fs::write(&front_proxy_ca.cert, &front_proxy.pem)?;
        std::fs::write(&front_proxy_ca.key, front_proxy.issuer.key().serialize_pem())?;
        Ok(ControlPlanePki {
            ca: ca_files,
            ca_pem: ca.pem.clone(),
            serving: write_pair(dir, "apiserver", serving)?,
            admin: write_pair(dir, "admin", admin)?,
            controller_manager: write_pair(dir, "kube-controller-manager", kcm)?,
            front_proxy_ca,
            front_proxy_client: write_pair(dir, "front-proxy-client", proxy_client)?,
            service_account_key,
            service_account_public_key,
        })
    }
}
