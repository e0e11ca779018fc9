//! `X-Forwarded-For` and `X-Forwarded-Proto` as the app receives them. A client's own claims are
//! replaced unless its peer is a trusted proxy, so a client cannot hand the app a forged chain.

use std::{io::Write as _, net::IpAddr};

use http::{HeaderMap, HeaderName, HeaderValue};

pub use crate::limiter::client_ip::X_FORWARDED_FOR;

/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Writes the `X-Forwarded-For` value for a request from `peer` onto `out`: when the peer is a trusted
/// proxy, the chain it sent (its lines joined with `, `) with the peer appended; otherwise the peer
/// alone. Lines that are not visible ASCII are dropped.
pub fn write_forwarded_for<'a>(
    out: &mut Vec<u8>,
    existing: impl Iterator<Item = &'a [u8]>,
    peer: IpAddr,
    peer_trusted: bool,
) {
    if peer_trusted {
        for line in existing.filter(|l| l.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))) {
            out.extend_from_slice(line);
            out.extend_from_slice(b", ");
        }
    }
    let _ = write!(out, "{peer}");
}

/// Whether the request keeps the `X-Forwarded-Proto` it came with: only from a trusted proxy. Otherwise
/// the proxy sets `http`.
pub fn keeps_forwarded_proto(peer_trusted: bool, present: bool) -> bool {
    peer_trusted && present
}

/// Sets both fields on `headers` (see [`write_forwarded_for`] and [`keeps_forwarded_proto`]).
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, peer_trusted: bool) {
    let mut value = Vec::with_capacity(48);
    write_forwarded_for(
        &mut value,
        headers.get_all(&X_FORWARDED_FOR).iter().map(|v| v.as_bytes()),
        peer,
        peer_trusted,
    );
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    if !keeps_forwarded_proto(peer_trusted, headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_trusted_chain_keeps_every_line_in_order() {
        let mut out = Vec::new();
        let lines: [&[u8]; 2] = [b"1.2.3.4, 5.6.7.8", b"9.9.9.9"];
        write_forwarded_for(&mut out, lines.into_iter(), "2001:db8::1".parse().unwrap(), true);
        assert_eq!(out, b"1.2.3.4, 5.6.7.8, 9.9.9.9, 2001:db8::1");
    }
}
