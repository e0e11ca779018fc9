//! One request through hyper, the path for what the HTTP/1.1 fast path ([`super::h1`]) hands over
//! (h2c, HTTP/1.0, upgrades, odd framing, an h2c app): the request read one way ([`super::target`]: its
//! host and method checked, its path normalized), admission ([`super::admit`]), then forwarding to the
//! app with hop-by-hop fields removed, forwarding claims dropped and `X-Forwarded-For`/`-Proto` set
//! ([`super::forwarded`]), the body guarded ([`super::client_body`]), the response streamed back with
//! the quota headers added.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version, header, uri::PathAndQuery};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use sluice_crds::sidecar_config::UpstreamProtocol;

use super::{
    ProxyBody,
    admit::{Admission, Arrival, admit},
    app_connection::AppConnection,
    client_body::{Answered, ClientBody, ClientBodyError},
    end_to_end::EndToEnd,
    forwarded::set_forwarded,
    headers::insert_quota,
    metrics::Outcome,
    reject::plain,
    state::{ProxyState, Snapshot},
    target, upgrade,
};
use crate::http1::hop_by_hop::strip_hop_by_hop;

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

    let rule_path = match read_one_way(&mut req, limits) {
        Ok(rule_path) => rule_path,
        Err(why) => {
            tracing::debug!(why, "refusing a request");
            state.metrics.request(Outcome::BadRequest);
            return Ok(own(plain(StatusCode::BAD_REQUEST, "Bad Request")));
        }
    };
    let path = rule_path.as_deref().unwrap_or(req.uri().path());
    let arrival = Arrival {
        method: req.method(),
        path,
        host: req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str())),
        headers: &EndToEnd(req.headers()),
        content_length: content_length(req.headers()),
    };
    let verdict = match admit(&state, &snap, peer.ip(), &arrival).await {
        Admission::Forward(verdict) => verdict,
        Admission::Refuse(resp) => return Ok(own(resp)),
    };

    let upgrade = upgrade::requested(&req, &limits.upgrades).then(|| hyper::upgrade::on(&mut req));
    let peer_trusted = limits
        .client_ip
        .trusted_proxies
        .iter()
        .any(|n| n.contains(&peer.ip()));
    let answered = Answered::default();
    let out = match rewrite_request(
        req,
        &snap,
        peer.ip(),
        peer_trusted,
        upgrade.is_some(),
        answered.clone(),
    ) {
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
    // Whatever of the body the app has not taken by now is not sent (see `client_body`).
    answered.set();
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

/// Checks what the request names (see [`target`]) and rewrites its path to the normalized one; returns
/// the path as rules read it when that differs ([`target::without_params`]). HTTP/1.1 needs exactly one
/// `Host`; HTTP/1.0 and HTTP/2 at most one, and an HTTP/2 `Host` must name the `:authority`.
fn read_one_way(
    req: &mut Request<Incoming>,
    limits: &sluice_crds::sidecar_config::LimitsConfig,
) -> Result<Option<String>, target::Refusal> {
    target::check_method(req.method())?;
    // The URI parser drops a fragment itself; a byte outside ASCII it keeps, and the app would read it in
    // an encoding of its own choosing.
    if !req.uri().path_and_query().is_none_or(|pq| pq.as_str().is_ascii()) {
        return Err("a byte outside ASCII in the request target");
    }
    let chunked: usize = req
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .map(|v| target::chunked_codings(v.as_bytes()))
        .sum();
    if chunked > 1 {
        return Err(target::CHUNKED_TWICE);
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host");
    }
    match (host, req.version()) {
        (None, Version::HTTP_11) => return Err("no Host"),
        (Some(host), version) => {
            target::check_host(host.as_bytes())?;
            if version == Version::HTTP_2
                && let Some(authority) = req.uri().authority()
                && !authority
                    .as_str()
                    .as_bytes()
                    .eq_ignore_ascii_case(host.as_bytes())
            {
                return Err("a Host that differs from :authority");
            }
        }
        (None, _) => {}
    }
    let mut normalized = String::new();
    if target::normalize_path(req.uri().path(), &limits.paths, &mut normalized)? {
        if let Some(query) = req.uri().query() {
            normalized.push('?');
            normalized.push_str(query);
        }
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query =
            Some(PathAndQuery::try_from(normalized).map_err(|_| "a path that cannot be rewritten")?);
        *req.uri_mut() = Uri::from_parts(parts).map_err(|_| "a path that cannot be rewritten")?;
    }
    let mut rule_path = String::new();
    Ok(target::without_params(req.uri().path(), &limits.paths, &mut rule_path)?.then_some(rule_path))
}

/// A response the proxy made itself, as this path's body type.
fn own(resp: Response<Bytes>) -> Response<ProxyBody> {
    resp.map(|b| Either::Right(Full::new(b)))
}

/// Turns the client's request into the app's: the chosen HTTP version, the URI in the form its connection
/// needs (origin form over the app connection, absolute at the upstream for the pooled clients),
/// hop-by-hop fields removed (the upgrade pair re-added for an allowed upgrade), `Expect` removed (hyper
/// answered it), forwarding fields set, and the body guarded (see [`ClientBody`]: a chunked body that
/// grows past `maxRequestBody` fails the request with 413).
#[allow(clippy::result_large_err)] // the error is the response to send; boxing it would allocate on every refusal
fn rewrite_request(
    req: Request<Incoming>,
    snap: &Snapshot,
    peer: IpAddr,
    peer_trusted: bool,
    upgrading: bool,
    answered: Answered,
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
    // hyper sent the client its `100 Continue` when the body was first read.
    parts.headers.remove(header::EXPECT);
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
        parts.uri = Uri::from_parts(uri).map_err(|_| own(plain(StatusCode::BAD_REQUEST, "Bad Request")))?;
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
    let body = ClientBody::new(
        body,
        limits.max_request_body,
        limits.client_timeouts.body.get(),
        answered,
    );
    Ok(Request::from_parts(parts, body))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Whether a request goes over the client connection's app connection (plain HTTP/1.1) rather than a
/// pooled client (h2c, upgrades).
fn over_app_connection(version: Version, upgrading: bool) -> bool {
    version == Version::HTTP_11 && !upgrading
}

/// The response for a failed exchange: the client's fault (its body too large, malformed or stalled) is
/// said so; anything else is a 502.
fn upstream_failed(state: &ProxyState, e: &(dyn std::error::Error + 'static)) -> Response<ProxyBody> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        match err.downcast_ref::<ClientBodyError>() {
            Some(ClientBodyError::TooLarge) => {
                state.metrics.request(Outcome::TooLarge);
                return own(plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large"));
            }
            Some(ClientBodyError::Malformed(_)) => {
                state.metrics.request(Outcome::BadRequest);
                return own(plain(StatusCode::BAD_REQUEST, "Bad Request"));
            }
            Some(ClientBodyError::TimedOut(_)) => {
                state.metrics.request(Outcome::BadRequest);
                return own(plain(StatusCode::REQUEST_TIMEOUT, "Request Timeout"));
            }
            Some(ClientBodyError::AppAnswered) | None => {}
        }
        source = err.source();
    }
    state.metrics.upstream_errors.inc();
    state.metrics.request(Outcome::UpstreamError);
    tracing::debug!(error = %e, "upstream request failed");
    own(plain(StatusCode::BAD_GATEWAY, "Bad Gateway"))
}
