//! Protocol upgrades (WebSocket): the request goes to the app with its `Upgrade` pair; when the app
//! answers 101, both connections are handed over and bytes are copied both ways until either side closes.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Whether an HTTP/1.1 request asks to switch protocols (`Connection: upgrade` and an `Upgrade` field).
pub fn requested<B>(req: &http::Request<B>) -> bool {
    req.version() == http::Version::HTTP_11
        && req.headers().contains_key(http::header::UPGRADE)
        && req
            .headers()
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
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
