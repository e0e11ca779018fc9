//! `sluice-operator probe URL`: an HTTP GET that succeeds on a 2xx answer, tried again for a while when it
//! fails. The chart's `helm test` hook runs it from the operator image (which has no shell or curl)
//! against the operator's `/readyz` through its Service — right after `helm install --wait`, before the
//! Service's endpoints (or kube-proxy, or cluster DNS) may have caught up with the Pod turning Ready, so
//! one refused connection is not yet a failure.

use std::time::Duration;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// How long one attempt may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`probe_until`] keeps trying by default (the `probe` command's patience).
pub const PROBE_PATIENCE: Duration = Duration::from_secs(30);
/// The pause between attempts.
pub const PROBE_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL is not `http://host[:port][/path]`.
    #[error("{0:?} is not an http:// URL")]
    BadUrl(String),
    /// Connecting, sending or reading failed or took too long.
    #[error("{url}: {reason}")]
    Unreachable {
        /// The URL probed.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The server answered with a status other than 2xx.
    #[error("{url}: answered {status}")]
    Status {
        /// The URL probed.
        url: String,
        /// The status line's code.
        status: u16,
    },
}

/// [`probe`]s `url` until it answers 2xx or `patience` has passed, pausing [`PROBE_RETRY_PAUSE`]
/// between attempts; the error is the last attempt's. A malformed URL fails at once.
pub async fn probe_until(url: &str, patience: Duration) -> Result<u16, ProbeError> {
    let started = tokio::time::Instant::now();
    loop {
        match probe(url).await {
            Ok(status) => return Ok(status),
            Err(e @ ProbeError::BadUrl(_)) => return Err(e),
            Err(e) if started.elapsed() + PROBE_RETRY_PAUSE >= patience => return Err(e),
            Err(_) => tokio::time::sleep(PROBE_RETRY_PAUSE).await,
        }
    }
}

/// GETs `url` once and returns its status when it is 2xx.
pub async fn probe(url: &str) -> Result<u16, ProbeError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ProbeError::BadUrl(url.into()))?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    if authority.is_empty() {
        return Err(ProbeError::BadUrl(url.into()));
    }
    let addr = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let unreachable = |reason: String| ProbeError::Unreachable {
        url: url.into(),
        reason,
    };
    let exchange = async {
        let mut stream = TcpStream::connect(&addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut head = Vec::new();
        stream
            .read_to_end(&mut head)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let line = String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        line.split_whitespace()
            .nth(1)
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| unreachable(format!("not an HTTP answer: {line:?}")))
    };
    let status = tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| unreachable(format!("no answer within {PROBE_TIMEOUT:?}")))??;
    if (200..300).contains(&status) {
        Ok(status)
    } else {
        Err(ProbeError::Status {
            url: url.into(),
            status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn server(status: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await;
        });
        format!("http://{addr}/readyz")
    }

    #[tokio::test]
    async fn a_2xx_answer_passes() {
        assert_eq!(probe(&server("200 OK").await).await.unwrap(), 200);
    }

    /// Answers each connection with the next status of `statuses`.
    async fn server_answering(statuses: &'static [&'static str]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for status in statuses {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        format!("http://{addr}/readyz")
    }

    #[tokio::test]
    async fn probe_until_tries_again_until_the_answer_is_2xx() {
        let url = server_answering(&["503 Service Unavailable", "503 Service Unavailable", "200 OK"]).await;
        assert_eq!(probe_until(&url, PROBE_PATIENCE).await.unwrap(), 200);
    }

    #[tokio::test]
    async fn probe_until_gives_up_after_its_patience_with_the_last_error() {
        let url = server_answering(&["503 Service Unavailable"; 16]).await;
        let started = std::time::Instant::now();
        let err = probe_until(&url, Duration::from_secs(1)).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "gave up in time");
        assert!(err.to_string().ends_with("answered 503"), "{err}");
        assert!(matches!(
            probe_until("ftp://x/", PROBE_PATIENCE).await,
            Err(ProbeError::BadUrl(_))
        ));
    }

    #[tokio::test]
    async fn a_non_2xx_answer_fails_naming_the_status() {
        let err = probe(&server("503 Service Unavailable").await).await.unwrap_err();
        assert!(err.to_string().ends_with("answered 503"), "{err}");
    }

    #[tokio::test]
    async fn nothing_listening_and_bad_urls_fail_clearly() {
        let port = sluice_testsupport::free_port();
        assert!(matches!(
            probe(&format!("http://127.0.0.1:{port}/")).await,
            Err(ProbeError::Unreachable { .. })
        ));
        assert!(matches!(probe("https://x/").await, Err(ProbeError::BadUrl(_))));
        assert!(matches!(
            probe("http:///readyz").await,
            Err(ProbeError::BadUrl(_))
        ));
    }
}
