//! Connecting to Redis, for the limiter's pool and the config channel alike: the fred config a URL and
//! `limits.redis.caFile` make (TLS for `rediss` URLs, with rustls), and why a connection cannot be made,
//! named by cause ([`Cause`]) so `/readyz`, metrics and logs can say it plainly.
//!
//! TLS: a `rediss://` (or `rediss-sentinel://`, `rediss-cluster://`) URL connects with rustls (ring),
//! verifying the server's certificate and host name against the system's CA certificates plus those in
//! `caFile`. There is no option to skip verification.

use std::{
    fmt,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use fred::{
    prelude::Config,
    types::config::{TlsConfig, TlsConnector},
};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, pem::PemObject};
use sluice_crds::sidecar_config::{ConfigErrors, RedisConfig, validate::redis_url_uses_tls};

/// The fred config for `url`: TLS (verified against the system's roots and `ca_file`'s) when the URL's
/// scheme starts with `rediss`. Errors name the field at fault.
pub fn config(url: &str, ca_file: Option<&str>) -> Result<Config, ConfigErrors> {
    let tls = redis_url_uses_tls(url);
    // fred would build its own TLS settings for a `rediss` URL (system roots only, and failing outright
    // when any system certificate cannot be read); the URL is parsed without the `s` and Sluice's own
    // settings are put in instead.
    let plain_url;
    let parsed_url = if tls {
        plain_url = url.replacen("rediss", "redis", 1);
        plain_url.as_str()
    } else {
        url
    };
    let mut config = Config::from_url(parsed_url).map_err(|e| {
        one_error(
            "limits.redis.url",
            format!("is not a usable Redis URL: {}", e.details()),
        )
    })?;
    if tls {
        let roots = roots(ca_file)?;
        let client = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| one_error("limits.redis.url", format!("TLS set-up: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.tls = Some(TlsConfig::from(TlsConnector::from(client)));
    }
    Ok(config)
}

/// Checks what [`config`] will need of `redis` (the URL parses, the CA file reads), so a bad setting
/// stops the sidecar at start and `--check-config` names it.
pub fn check(redis: &RedisConfig) -> Result<(), ConfigErrors> {
    match &redis.url {
        Some(url) => config(url, redis.ca_file.as_deref()).map(drop),
        None => Ok(()),
    }
}

/// The system's CA certificates and those in `ca_file`.
fn roots(ca_file: Option<&str>) -> Result<RootCertStore, ConfigErrors> {
    let mut roots = RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    for e in &system.errors {
        tracing::debug!(error = %e, "a system CA certificate could not be read");
    }
    let (added, _ignored) = roots.add_parsable_certificates(system.certs);
    if let Some(path) = ca_file {
        let field = "limits.redis.caFile";
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| one_error(field, format!("cannot read {path}: {e}")))?
            .collect::<Result<_, _>>()
            .map_err(|e| one_error(field, format!("{path} is not a PEM file of certificates: {e}")))?;
        if certs.is_empty() {
            return Err(one_error(field, format!("{path} holds no PEM certificate")));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| {
                one_error(
                    field,
                    format!("{path} holds a certificate that cannot be a CA: {e}"),
                )
            })?;
        }
    } else if added == 0 {
        tracing::warn!("no system CA certificates found; a TLS Redis needs limits.redis.caFile");
    }
    Ok(roots)
}

fn one_error(path: &str, message: String) -> ConfigErrors {
    let mut errs = ConfigErrors::default();
    errs.push(path, message);
    errs
}

/// Why Redis cannot be reached, as a metric label and in `/readyz`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)] // variant names are the metric label values, snake_case as Prometheus has them
pub enum Cause {
    /// The TLS handshake failed: an untrusted or mismatched certificate, TLS spoken to a plaintext
    /// server or the other way round.
    tls,
    /// Redis refused the credentials (`WRONGPASS`, `NOAUTH`, an ACL refusal).
    auth,
    /// Nothing listens there (connection refused).
    refused,
    /// The host name does not resolve.
    dns,
    /// No answer in time (connect, handshake or command).
    timeout,
    /// The server closed or reset the connection, or spoke something that is not Redis.
    protocol,
    /// Anything else.
    error,
}

impl Cause {
    /// The cause of a fred error.
    pub fn of(e: &fred::error::Error) -> Self {
        use fred::error::ErrorKind;
        let text = e.details().to_ascii_lowercase();
        let mentions = |words: &[&str]| words.iter().any(|w| text.contains(w));
        match e.kind() {
            ErrorKind::Tls => Cause::tls,
            ErrorKind::Auth => Cause::auth,
            ErrorKind::Timeout => Cause::timeout,
            _ if mentions(&["certificate", "tls", "handshake", "corrupt message", "servername"]) => {
                Cause::tls
            }
            _ if mentions(&["wrongpass", "noauth", "noperm", "auth"]) => Cause::auth,
            _ if mentions(&["refused"]) => Cause::refused,
            _ if mentions(&["lookup", "resolve", "name or service", "dns"]) => Cause::dns,
            _ if mentions(&["timed out", "timeout"]) => Cause::timeout,
            ErrorKind::Protocol | ErrorKind::IO | ErrorKind::Canceled => Cause::protocol,
            _ => Cause::error,
        }
    }

    /// What to do about it, for the message.
    fn hint(self) -> &'static str {
        match self {
            Cause::tls => {
                "check the URL's scheme (rediss:// for a TLS Redis, redis:// for a plaintext one) and \
                 that limits.redis.caFile (SLUICE_REDIS_CA_FILE) holds the CA that signed the server's \
                 certificate"
            }
            Cause::auth => "check the password (or ACL user) in the Redis URL",
            Cause::refused => "check the host and port in the Redis URL; is Redis running?",
            Cause::dns => "check the host name in the Redis URL",
            Cause::timeout => "Redis or the network to it is slow or dropping packets",
            Cause::protocol => {
                "the server closed the connection; a TLS-only Redis closes plaintext connections \
                 (use rediss://)"
            }
            Cause::error => "see the error",
        }
    }
}

/// The last reason a connection to Redis failed, while it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The cause.
    pub cause: Cause,
    /// The error as fred reported it (never the URL: it may hold a password).
    pub detail: String,
    /// Since when this cause holds.
    pub since: SystemTime,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {} ({})", self.cause, self.detail, self.cause.hint())
    }
}

/// Whether Redis can be reached and, if not, why. Fed by the clients' error and reconnect events.
#[derive(Debug, Default)]
pub struct Reachability {
    problem: Mutex<Option<Problem>>,
}

impl Reachability {
    /// Records a failed connection (or command); returns whether the cause changed (worth a log line).
    pub fn failed(&self, e: &fred::error::Error) -> bool {
        let cause = Cause::of(e);
        let mut problem = self.problem.lock().unwrap_or_else(|e| e.into_inner());
        let changed = problem.as_ref().is_none_or(|p| p.cause != cause);
        if changed {
            *problem = Some(Problem {
                cause,
                detail: e.details().to_owned(),
                since: SystemTime::now(),
            });
        }
        changed
    }

    /// Records a connection made; returns whether a problem was cleared.
    pub fn connected(&self) -> bool {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }

    /// The problem that holds, if any.
    pub fn problem(&self) -> Option<Problem> {
        self.problem.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use fred::error::{Error, ErrorKind};

    use super::*;

    #[test]
    fn causes_are_read_from_kind_and_message() {
        let cases = [
            (ErrorKind::IO, "Connection refused (os error 111)", Cause::refused),
            (
                ErrorKind::IO,
                "invalid peer certificate: UnknownIssuer",
                Cause::tls,
            ),
            (
                ErrorKind::Auth,
                "WRONGPASS invalid username-password pair",
                Cause::auth,
            ),
            (ErrorKind::Unknown, "NOAUTH Authentication required.", Cause::auth),
            (
                ErrorKind::IO,
                "failed to lookup address information: Name or service not known",
                Cause::dns,
            ),
            (
                ErrorKind::IO,
                "Connection reset by peer (os error 104)",
                Cause::protocol,
            ),
            (ErrorKind::Timeout, "Connection timed out.", Cause::timeout),
        ];
        for (kind, text, cause) in cases {
            assert_eq!(Cause::of(&Error::new(kind, text)), cause, "{text}");
        }
    }

    #[test]
    fn a_cause_is_reported_once_until_it_changes_or_clears() {
        let r = Reachability::default();
        let refused = Error::new(ErrorKind::IO, "Connection refused");
        assert!(r.failed(&refused));
        assert!(!r.failed(&refused), "the same cause again is not news");
        assert!(r.failed(&Error::new(ErrorKind::Auth, "WRONGPASS")));
        assert_eq!(r.problem().unwrap().cause, Cause::auth);
        assert!(r.connected());
        assert!(!r.connected());
        assert_eq!(r.problem(), None);
    }

    #[test]
    fn plaintext_urls_get_no_tls_and_a_missing_ca_file_is_named() {
        assert!(config("redis://127.0.0.1:6379", None).unwrap().tls.is_none());
        assert!(config("rediss://127.0.0.1:6379", None).unwrap().tls.is_some());
        let err = config("rediss://127.0.0.1:6379", Some("/nonexistent/ca.pem")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("limits.redis.caFile: cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let err = config("rediss://127.0.0.1:6379", junk.to_str()).unwrap_err();
        assert!(err.to_string().contains("holds no PEM certificate"), "{err}");
    }
}
