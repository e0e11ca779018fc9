//! One request through the proxy: body limit, client address, the limiter's verdict, then forwarding to
//! the app with hop-by-hop headers removed (RFC 9110 §7.6.1) and `X-Forwarded-For`/`-Proto` set, the
//! response streamed back with the quota headers added.

use std::{
    borrow::Cow,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version, header,
    uri::PathAndQuery,
};
use http_body_util::{Either, Full, Limited};
use hyper::body::Incoming;
use sluice_crds::sidecar_config::UpstreamProtocol;

use super::{
    ProxyBody,
    app_connection::AppConnection,
    headers::insert_quota,
    metrics::Outcome,
    reject::{Rejection, too_many_requests},
    state::{ProxyState, Snapshot},
    upgrade,
};
use crate::limiter::{RequestFacts, Verdict, client_ip};

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Hop-by-hop fields (RFC 9110 §7.6.1 and the de-facto `Proxy-Connection`/`Keep-Alive`): they describe
/// one connection and are never forwarded, nor are the fields `Connection` names.
pub static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Handles one request from `peer`, whose plain HTTP/1.1 requests go over `app`. Never fails: every
/// problem becomes a response.
pub async fn handle(
    state: Arc<ProxyState>,
    peer: SocketAddr,
    app: Arc<AppConnection>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let snap = state.snapshot();
    let limits = &snap.effective.config.limits;

    if content_length(req.headers()).is_some_and(|n| n > limits.max_request_body) {
        state.metrics.request(Outcome::TooLarge);
        return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large"));
    }

    let ip = client_ip(peer.ip(), req.headers(), &limits.client_ip.trusted_proxies);
    let verdict = if snap.effective.limiting_enabled && !limits.allow_list.iter().any(|n| n.contains(&ip)) {
        let host = request_host(&req);
        let facts = RequestFacts {
            method: req.method(),
            path: req.uri().path(),
            host: host.as_deref(),
            headers: req.headers(),
            client_ip: ip,
        };
        let verdict = state.limiter.check(&facts).await;
        if !verdict.allowed() {
            reject(
                &state,
                &snap,
                &verdict,
                ip,
                host.as_deref().unwrap_or("-"),
                req.uri().path(),
            );
            return Ok(too_many_requests(&verdict, &limits.headers));
        }
        verdict
    } else {
        Verdict::default()
    };

    let upgrade = upgrade::requested(&req).then(|| hyper::upgrade::on(&mut req));
    let peer_trusted = limits
        .client_ip
        .trusted_proxies
        .iter()
        .any(|n| n.contains(&peer.ip()));
    let out = match rewrite_request(req, &snap, peer.ip(), peer_trusted, upgrade.is_some()) {
        Ok(out) => out,
        Err(resp) => return Ok(resp),
    };
    let started = Instant::now();
    let result = if over_app_connection(out.version(), upgrade.is_some()) {
        app.send(&snap.upstream_authority, out)
            .await
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
    } else {
        let client = if out.version() == Version::HTTP_2 {
            &state.clients.h2c
        } else {
            &state.clients.http1
        };
        client.request(out).await.map_err(Into::into)
    };
    state
        .metrics
        .upstream_latency
        .observe(started.elapsed().as_secs_f64());
    let mut resp = match result {
        Ok(resp) => resp,
        Err(e) => return Ok(upstream_failed(&state, &*e)),
    };

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_side) = upgrade
    {
        let upstream_side = hyper::upgrade::on(&mut resp);
        upgrade::tunnel(client_side, upstream_side);
        state.metrics.request(Outcome::Upgraded);
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(
            parts,
            Either::Right(Full::new(Bytes::new())),
        ));
    }
    strip_hop_by_hop(resp.headers_mut());
    if let Some(q) = &verdict.quota {
        insert_quota(resp.headers_mut(), q, &limits.headers);
    }
    state.metrics.request(Outcome::Forwarded);
    Ok(resp.map(Either::Left))
}

fn reject(state: &ProxyState, snap: &Snapshot, verdict: &Verdict, ip: IpAddr, host: &str, path: &str) {
    state.metrics.request(Outcome::Limited);
    let rejection = Rejection {
        client_ip: ip,
        host,
        path,
        rule: verdict.rejected_by.as_deref().unwrap_or("-"),
    };
    let now_secs = state.clock.now_millis() / 1000;
    let cfg = &snap.effective.config.limits.rejection_log;
    if !state.rejection_log.log(&rejection, cfg, now_secs) {
        state.metrics.rejections_unlogged.inc();
    }
}

/// Turns the client's request into the app's: the chosen HTTP version, the URI in the form its connection
/// needs (origin form over the app connection, absolute at the upstream for the pooled clients),
/// hop-by-hop fields removed (the upgrade pair re-added for a WebSocket), forwarding fields set, and the
/// body capped at `maxRequestBody` (a chunked body that grows past it fails the request with 413).
#[allow(clippy::result_large_err)]
fn rewrite_request(
    req: Request<Incoming>,
    snap: &Snapshot,
    peer: IpAddr,
    peer_trusted: bool,
    upgrading: bool,
) -> Result<Request<super::RequestBody>, Response<ProxyBody>> {
    let limits = &snap.effective.config.limits;
    let (mut parts, body) = req.into_parts();
    let client_version = parts.version;
    let upgrade_value = upgrading
        .then(|| parts.headers.get(header::UPGRADE).cloned())
        .flatten();

    // An HTTP/2 request carries its host in the URI authority; HTTP/1.1 apps need a Host field.
    if !parts.headers.contains_key(header::HOST)
        && let Some(authority) = parts.uri.authority()
        && let Ok(v) = HeaderValue::from_str(authority.as_str())
    {
        parts.headers.insert(header::HOST, v);
    }
    // `TE: trailers` is the one hop-by-hop value HTTP/2 keeps (gRPC servers require it).
    let te_trailers = parts
        .headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    strip_hop_by_hop(&mut parts.headers);
    if let Some(v) = upgrade_value {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, v);
    }
    set_forwarded(&mut parts.headers, peer, peer_trusted);

    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    parts.version = match limits.upstream_protocol {
        _ if upgrading => Version::HTTP_11,
        UpstreamProtocol::Http1 => Version::HTTP_11,
        UpstreamProtocol::H2c => Version::HTTP_2,
        UpstreamProtocol::MatchClient if client_version == Version::HTTP_2 => Version::HTTP_2,
        UpstreamProtocol::MatchClient => Version::HTTP_11,
    };
    if over_app_connection(parts.version, upgrading) {
        // The app connection sends the request line as is: origin form, and HTTP/1.1 needs a Host.
        parts.uri = Uri::from(path);
        if !parts.headers.contains_key(header::HOST)
            && let Ok(v) = HeaderValue::from_str(snap.upstream_authority.as_str())
        {
            parts.headers.insert(header::HOST, v);
        }
    } else {
        // The pooled clients pick their connection by the absolute URI.
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(snap.upstream_scheme.clone());
        uri.authority = Some(snap.upstream_authority.clone());
        uri.path_and_query = Some(path);
        parts.uri = Uri::from_parts(uri).map_err(|_| plain(StatusCode::BAD_REQUEST, "Bad Request"))?;
    }
    if parts.version == Version::HTTP_2 {
        // The authority travels as :authority; a Host field beside it is redundant.
        parts.headers.remove(header::HOST);
        if te_trailers {
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
    let max = usize::try_from(limits.max_request_body).unwrap_or(usize::MAX);
    Ok(Request::from_parts(parts, Limited::new(body, max)))
}

/// Removes hop-by-hop fields and every field the `Connection` field names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if let Some(conn) = headers.get(header::CONNECTION)
        && let Ok(v) = conn.to_str()
    {
        let named: Vec<HeaderName> = v
            .split(',')
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP.iter() {
        headers.remove(name);
    }
}

/// Appends the peer to `X-Forwarded-For` when the peer is a trusted proxy; otherwise replaces the field
/// with the peer alone, so a client cannot hand the app a forged chain. `X-Forwarded-Proto` is kept from
/// a trusted proxy and set to `http` otherwise.
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, peer_trusted: bool) {
    let existing = if peer_trusted {
        let all: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        (!all.is_empty()).then(|| all.join(", "))
    } else {
        None
    };
    let value = match existing {
        Some(chain) => format!("{chain}, {peer}"),
        None => peer.to_string(),
    };
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    if !(peer_trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Host without port, lower case: from `Host`, or the URI authority (HTTP/2). Borrowed when it is
/// lower case already (nearly always).
fn request_host<B>(req: &Request<B>) -> Option<Cow<'_, str>> {
    let raw = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))?;
    let host = match raw.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => raw.split(':').next().unwrap_or(raw),
    };
    Some(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    })
}

/// Whether a request goes over the client connection's app connection (plain HTTP/1.1) rather than a
/// pooled client (h2c, upgrades).
fn over_app_connection(version: Version, upgrading: bool) -> bool {
    version == Version::HTTP_11 && !upgrading
}

fn upstream_failed(state: &ProxyState, e: &(dyn std::error::Error + 'static)) -> Response<ProxyBody> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            state.metrics.request(Outcome::TooLarge);
            return plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large");
        }
        source = err.source();
    }
    state.metrics.upstream_errors.inc();
    state.metrics.request(Outcome::UpstreamError);
    tracing::debug!(error = %e, "upstream request failed");
    plain(StatusCode::BAD_GATEWAY, "Bad Gateway")
}

/// A short text response made by the proxy itself.
pub fn plain(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from_static(body.as_bytes()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_named_by_connection_are_stripped_with_the_standard_set() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-end-to-end", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-end-to-end"]);
    }

    #[test]
    fn forwarded_for_is_appended_only_behind_a_trusted_proxy() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        set_forwarded(&mut h, "10.0.0.1".parse().unwrap(), true);
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 10.0.0.1");

        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        set_forwarded(&mut h, "192.0.2.7".parse().unwrap(), false);
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "http");
    }

    #[test]
    fn the_host_is_read_without_port_in_lower_case() {
        let req = Request::builder()
            .header("host", "API.Example.com:8080")
            .body(())
            .unwrap();
        assert_eq!(request_host(&req).as_deref(), Some("api.example.com"));
        let req = Request::builder().header("host", "[::1]:80").body(()).unwrap();
        assert_eq!(request_host(&req).as_deref(), Some("::1"));
    }
}
