//! A minimal HTTP/1.1 client for scenarios and the sandbox: one request per connection
//! (`Connection: close`), so every request is seen by the sidecar on its own and nothing is pooled.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, Result};

/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An answer: status, headers (names lower-cased), body.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased; a repeated header keeps its last value.
    pub headers: BTreeMap<String, String>,
    /// Body as text.
    pub body: String,
}

impl Response {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
}

/// `GET path` on `127.0.0.1:port`.
pub async fn get(port: u16, path: &str) -> Result<Response> {
    request(port, "GET", path, &[], "").await
}

/// `POST path` with a JSON body on `127.0.0.1:port`.
pub async fn post_json(port: u16, path: &str, body: &str) -> Result<Response> {
    request(port, "POST", path, &[("Content-Type", "application/json")], body).await
}

/// Sends one request to `127.0.0.1:port` and reads the whole answer.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Response> {
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(body.as_bytes()).await?;
        let mut raw = vec![];
        tcp.read_to_end(&mut raw).await?;
        parse(&raw)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| Error::Timeout(REQUEST_TIMEOUT, format!("{method} 127.0.0.1:{port}{path}")))?
}

fn parse(raw: &[u8]) -> Result<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Decode(format!("no HTTP head in {text:?}")))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::Decode(format!("no status line in {head:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<BTreeMap<_, _>>();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let (Some(chunk), Some(after)) = (rest.get(..n), rest.get(n..)) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(chunk);
        body = after.trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_parses_with_lower_cased_headers_and_a_chunked_body() {
        let raw = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let r = parse(raw).unwrap();
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), Some("3"));
        assert_eq!(r.body, "hello");
    }
}
