//! Protocol upgrades (WebSocket by default, `limits.upgrades`): the request goes to the app with its
//! `Upgrade` pair; when the app answers 101, both connections are handed over and bytes are copied both
//! ways until either side closes. The upgrade request itself is admitted like any other; what the tunnel
//! carries afterwards is not seen, which is why `h2c` (HTTP/2 requests in the tunnel) is never allowed.
//! A request asking for a protocol not allowed is forwarded as a plain request, its `Upgrade` field
//! dropped (RFC 9110 §7.8 lets a server ignore it).

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Whether an HTTP/1.1 request asks to switch protocols (`Connection: upgrade` and an `Upgrade` field)
/// to protocols all in `allowed` (lower-case names; a version after `/` is not compared).
pub fn requested<B>(req: &http::Request<B>, allowed: &[String]) -> bool {
    let headers = req.headers();
    let mut protocols = headers
        .get_all(http::header::UPGRADE)
        .iter()
        .flat_map(|v| crate::http1::hop_by_hop::tokens(v.as_bytes()))
        .peekable();
    req.version() == http::Version::HTTP_11
        && protocols.peek().is_some()
        && protocols.all(|p| {
            let name = p.split(|&b| b == b'/').next().unwrap_or(p);
            allowed.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(name))
        })
        && headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| crate::http1::hop_by_hop::has_token(v.as_bytes(), "upgrade"))
}

/// Joins the client's and the app's upgraded connections in a background task.
pub fn tunnel(client: OnUpgrade, upstream: OnUpgrade) {
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %e, "upgraded connection closed with an error");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(upgrade: &str, connection: &str) -> bool {
        let req = http::Request::get("/")
            .header("upgrade", upgrade)
            .header("connection", connection)
            .body(())
            .unwrap();
        requested(&req, &["websocket".to_owned()])
    }

    #[test]
    fn only_allowed_protocols_are_switched_to() {
        assert!(asks("websocket", "Upgrade"));
        assert!(asks("WebSocket", "keep-alive, upgrade"));
        assert!(!asks("h2c", "Upgrade, HTTP2-Settings"));
        assert!(!asks("websocket, h2c", "upgrade"));
        assert!(!asks("websocket", "keep-alive"));
    }
}
