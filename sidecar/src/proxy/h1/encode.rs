//! Heads as the fast path writes them: the request the app receives, the response the client receives,
//! and the responses the proxy makes itself. Fields are copied as sent (names keep their case), minus the
//! hop-by-hop ones and those `Connection` names — except the fields that frame the message or name its
//! host, which a `Connection` token cannot remove (`Connection: content-length` would otherwise turn a
//! body into a second request). The proxy adds its own: forwarding fields, the transfer coding the body
//! goes out in, `Date` when the app sent none.

use std::{cell::RefCell, net::IpAddr, time::SystemTime};

use bytes::Bytes;
use http::Response;

use super::request::RequestHead;
use crate::{
    http1::{
        body::Framing,
        fields::{Field, Fields},
        response::ResponseHead,
    },
    proxy::{
        forwarded::{
            X_FORWARDED_FOR, X_FORWARDED_PROTO, is_forwarding_claim, keeps_forwarded_proto,
            write_forwarded_for,
        },
        headers::push_decimal,
    },
};

/// Who the request came from, for `X-Forwarded-For` and `-Proto`.
#[derive(Debug)]
pub struct Peer {
    /// The socket peer.
    pub ip: IpAddr,
    /// The two forwarding lines for an untrusted peer, written once per connection.
    lines: Vec<u8>,
}

impl Peer {
    /// A peer at `ip`.
    pub fn new(ip: IpAddr) -> Self {
        let mut lines = Vec::with_capacity(64);
        lines.extend_from_slice(X_FORWARDED_FOR.as_str().as_bytes());
        lines.extend_from_slice(b": ");
        write_forwarded_for(&mut lines, std::iter::empty(), ip, false);
        lines.extend_from_slice(b"\r\n");
        lines.extend_from_slice(X_FORWARDED_PROTO.as_str().as_bytes());
        lines.extend_from_slice(b": http\r\n");
        Self { ip, lines }
    }
}

/// Writes the head of the request the app receives onto `out`: with `path` (the normalized path, when it
/// differs from the one sent) before the query; `trusted`: the peer is a trusted proxy (its forwarding
/// fields are kept and appended to; from any other peer, the fields that claim where a request came
/// from are dropped, see [`is_forwarding_claim`]).
pub fn request_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    head: &RequestHead,
    path: Option<&str>,
    fields: &[Field],
    peer: &Peer,
    trusted: bool,
) {
    let fields = Fields::new(buf, fields);
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    let target = head.target.of(buf);
    match path {
        Some(path) => {
            out.extend_from_slice(path.as_bytes());
            out.extend_from_slice(&target[head.path_len..]);
        }
        None => out.extend_from_slice(target),
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let keep_proto = keeps_forwarded_proto(
        trusted,
        fields.values(X_FORWARDED_PROTO.as_str()).next().is_some()
            && !fields.dropped(X_FORWARDED_PROTO.as_str().as_bytes()),
    );
    for f in fields.list {
        let name = f.name.of(buf);
        let replaced = name.eq_ignore_ascii_case(X_FORWARDED_FOR.as_str().as_bytes())
            || (!keep_proto && name.eq_ignore_ascii_case(X_FORWARDED_PROTO.as_str().as_bytes()))
            || (!trusted && is_forwarding_claim(name));
        if !replaced && !fields.dropped(name) {
            line(out, name, f.value.of(buf));
        }
    }
    if trusted {
        out.extend_from_slice(X_FORWARDED_FOR.as_str().as_bytes());
        out.extend_from_slice(b": ");
        // A chain the peer's `Connection` names is dropped, as the limiter (which read none) saw it.
        let chain_kept = !fields.dropped(X_FORWARDED_FOR.as_str().as_bytes());
        let chain = fields.values(X_FORWARDED_FOR.as_str()).filter(|_| chain_kept);
        write_forwarded_for(out, chain, peer.ip, true);
        out.extend_from_slice(b"\r\n");
        if !keep_proto {
            out.extend_from_slice(X_FORWARDED_PROTO.as_str().as_bytes());
            out.extend_from_slice(b": http\r\n");
        }
    } else {
        out.extend_from_slice(&peer.lines);
    }
    if head.framing == Framing::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the head of the response the client receives onto `out`, up to (not including) the blank line
/// that ends it, so the caller can add fields: the app's status and fields, the transfer coding the body
/// goes out in, and `Date` if the app sent none.
pub fn response_head(out: &mut Vec<u8>, buf: &[u8], head: &ResponseHead, fields: &[Field]) {
    let fields = Fields::new(buf, fields);
    out.extend_from_slice(b"HTTP/1.1 ");
    push_status(out, head.status);
    out.push(b' ');
    out.extend_from_slice(head.reason.of(buf));
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for f in fields.list {
        let name = f.name.of(buf);
        // With Transfer-Encoding, Content-Length is wrong and must go (RFC 9112 §6.3).
        let stale_length = head.transfer_encoding.is_some() && name.eq_ignore_ascii_case(b"content-length");
        if !stale_length && !fields.dropped(name) {
            line(out, name, f.value.of(buf));
            dated |= name.eq_ignore_ascii_case(b"date");
        }
    }
    let coding = head.transfer_encoding.map(|te| te.of(buf));
    match (head.framing, coding) {
        // A body delimited by the app's close goes out chunked, on top of any coding it had.
        (Framing::UntilClose, Some(te)) => {
            out.extend_from_slice(b"transfer-encoding: ");
            out.extend_from_slice(te);
            out.extend_from_slice(b", chunked\r\n");
        }
        (Framing::UntilClose, None) => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        (_, Some(te)) => line(out, b"transfer-encoding", te),
        (_, None) => {}
    }
    // Interim responses need none (RFC 9110 §6.6.1).
    if !dated && !head.interim() {
        out.extend_from_slice(b"date: ");
        write_date(out);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes a response the proxy made itself (with `Content-Length` and `Date`), head and body (none for a
/// `HEAD` request), onto `out`; `close` adds `Connection: close`.
pub fn own_response(out: &mut Vec<u8>, resp: &Response<Bytes>, close: bool, head_request: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_status(out, resp.status().as_u16());
    out.push(b' ');
    out.extend_from_slice(resp.status().canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in resp.headers() {
        line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(b"content-length: ");
    push_decimal(out, resp.body().len() as u64);
    out.extend_from_slice(b"\r\ndate: ");
    write_date(out);
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_request {
        out.extend_from_slice(resp.body());
    }
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn push_status(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(&[
        b'0' + (status / 100 % 10) as u8,
        b'0' + (status / 10 % 10) as u8,
        b'0' + (status % 10) as u8,
    ]);
}

/// The current time as an HTTP date, formatted once a second per thread.
fn write_date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    CACHE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            *at = secs;
            *text = httpdate::fmt_http_date(now);
        }
        out.extend_from_slice(text.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::{http1::response, proxy::h1::request};

    fn request_out(raw: &str, peer: &(Peer, bool)) -> String {
        let mut fields = Vec::new();
        let request::Parsed::Head(head) = request::parse(raw.as_bytes(), &mut fields) else {
            panic!("{raw:?}")
        };
        let mut out = Vec::new();
        request_head(&mut out, raw.as_bytes(), &head, None, &fields, &peer.0, peer.1);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_app_gets_the_request_without_hop_by_hop_fields_and_with_forwarding_fields() {
        let raw = "POST /a?b=1 HTTP/1.1\r\nHost: app\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
                   Keep-Alive: timeout=5\r\nTE: trailers\r\nX-Forwarded-For: 6.6.6.6\r\n\
                   X-Forwarded-Proto: https\r\nTransfer-Encoding: chunked\r\nX-Kept: yes\r\n\r\n";
        let peer = (Peer::new("192.0.2.7".parse().unwrap()), false);
        assert_eq!(
            request_out(raw, &peer),
            "POST /a?b=1 HTTP/1.1\r\nHost: app\r\nX-Kept: yes\r\nx-forwarded-for: 192.0.2.7\r\n\
             x-forwarded-proto: http\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn a_trusted_proxy_keeps_its_chain_and_protocol() {
        let raw =
            "GET / HTTP/1.1\r\nHost: app\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-Proto: https\r\n\r\n";
        let peer = (Peer::new("10.0.0.1".parse().unwrap()), true);
        assert_eq!(
            request_out(raw, &peer),
            "GET / HTTP/1.1\r\nHost: app\r\nX-Forwarded-Proto: https\r\n\
             x-forwarded-for: 1.2.3.4, 10.0.0.1\r\n\r\n"
        );
    }

    #[test]
    fn the_client_gets_the_response_without_hop_by_hop_fields_and_with_its_coding() {
        let raw = "HTTP/1.0 200 Fine\r\nConnection: x-upstream-hop\r\nX-Upstream-Hop: s\r\n\
                   Transfer-Encoding: chunked\r\nKeep-Alive: 5\r\nX-E2e: kept\r\n\r\n";
        let mut fields = Vec::new();
        let response::Parsed::Head(head) = response::parse(raw.as_bytes(), &mut fields, false) else {
            panic!()
        };
        let mut out = Vec::new();
        response_head(&mut out, raw.as_bytes(), &head, &fields);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 200 Fine\r\nX-E2e: kept\r\ntransfer-encoding: chunked\r\ndate: "),
            "{text}"
        );
    }

    fn response_out(raw: &str) -> String {
        let mut fields = Vec::new();
        let response::Parsed::Head(head) = response::parse(raw.as_bytes(), &mut fields, false) else {
            panic!("{raw:?}")
        };
        let mut out = Vec::new();
        response_head(&mut out, raw.as_bytes(), &head, &fields);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn connection_cannot_remove_the_framing_or_the_host() {
        let raw = "POST /a HTTP/1.1\r\nHost: app\r\nConnection: content-length, host, x-forwarded-proto\r\n\
                   Content-Length: 3\r\nX-Forwarded-Proto: https\r\n\r\n";
        let out = request_out(raw, &(Peer::new("10.0.0.1".parse().unwrap()), true));
        assert_eq!(
            out,
            "POST /a HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\nx-forwarded-for: 10.0.0.1\r\n\
             x-forwarded-proto: http\r\n\r\n"
        );
        let resp = response_out(
            "HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 2\r\nDate: x\r\n\r\n",
        );
        assert_eq!(resp, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: x\r\n");
        // A Date the app's Connection drops is replaced by the proxy's own.
        let resp =
            response_out("HTTP/1.1 200 OK\r\nConnection: date\r\nContent-Length: 0\r\nDate: x\r\n\r\n");
        assert!(
            resp.starts_with("HTTP/1.1 200 OK\r\nContent-Length: 0\r\ndate: "),
            "{resp}"
        );
    }

    #[test]
    fn transfer_encoding_drops_content_length_and_a_close_delimited_body_goes_out_chunked() {
        let both = response_out(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nDate: x\r\n\r\n",
        );
        assert_eq!(
            both,
            "HTTP/1.1 200 OK\r\nDate: x\r\ntransfer-encoding: chunked\r\n"
        );
        let until_close = response_out("HTTP/1.1 200 OK\r\nDate: x\r\n\r\n");
        assert_eq!(
            until_close,
            "HTTP/1.1 200 OK\r\nDate: x\r\ntransfer-encoding: chunked\r\n"
        );
        let coded = response_out("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nDate: x\r\n\r\n");
        assert_eq!(
            coded,
            "HTTP/1.1 200 OK\r\nDate: x\r\ntransfer-encoding: gzip, chunked\r\n"
        );
    }

    #[test]
    fn own_responses_carry_their_length_date_and_body() {
        let resp = crate::proxy::reject::plain(StatusCode::BAD_GATEWAY, "Bad Gateway");
        let mut out = Vec::new();
        own_response(&mut out, &resp, true, false);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain; charset=utf-8\r\n\
                                  content-length: 11\r\ndate: "
            ),
            "{text}"
        );
        assert!(
            text.ends_with(" GMT\r\nconnection: close\r\n\r\nBad Gateway"),
            "{text}"
        );
        // A HEAD request gets the head alone.
        let mut out = Vec::new();
        own_response(&mut out, &resp, false, true);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("content-length: 11\r\n") && text.ends_with("\r\n\r\n"),
            "{text}"
        );
    }
}
