//! `sluice-operator probe URL`: one HTTP GET that succeeds on a 2xx answer. The chart's `helm test` hook
//! runs it from the operator image (which has no shell or curl) against the operator's `/readyz`.

use std::time::Duration;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// How long the whole probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// GETs `url` and returns its status when it is 2xx.
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
