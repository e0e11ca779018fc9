//! What the app is told about where a request came from. `X-Forwarded-For` and `X-Forwarded-Proto` are
//! set by the proxy; every other field that claims it ([`FORWARDING_CLAIMS`]: `Forwarded`, `X-Real-IP`,
//! `X-Forwarded-Host`, `True-Client-IP`, ..., and their spellings with `_`, which CGI-style apps read as
//! the same variable) is dropped. Only a trusted proxy's claims are kept (and its chain appended to), so a
//! client cannot hand the app a forged address, host, port or path.

use std::{io::Write as _, net::IpAddr};

use http::{HeaderMap, HeaderName, HeaderValue};

pub use crate::limiter::client_ip::X_FORWARDED_FOR;

/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Fields a client uses to claim where a request came from, or what it asked for before a proxy
/// rewrote it (lower case). From a peer that is not a trusted proxy they are dropped, in any case and
/// with `_` for `-`.
pub const FORWARDING_CLAIMS: [&str; 18] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-forwarded-scheme",
    "x-forwarded-ssl",
    "x-real-ip",
    "x-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-original-forwarded-for",
    "x-original-url",
    "x-rewrite-url",
];

/// Whether the field `name` is one of [`FORWARDING_CLAIMS`], in any case, `_` read as `-`.
pub fn is_forwarding_claim(name: &[u8]) -> bool {
    FORWARDING_CLAIMS.iter().any(|claim| {
        claim.len() == name.len()
            && claim.bytes().zip(name).all(|(c, &n)| {
                let n = n.to_ascii_lowercase();
                n == c || (c == b'-' && n == b'_')
            })
    })
}

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

/// Sets both fields on `headers` (see [`write_forwarded_for`] and [`keeps_forwarded_proto`]) and, for an
/// untrusted peer, drops the other [`FORWARDING_CLAIMS`].
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, peer_trusted: bool) {
    if !peer_trusted {
        let claims: Vec<HeaderName> = headers
            .keys()
            .filter(|k| {
                is_forwarding_claim(k.as_str().as_bytes()) && *k != X_FORWARDED_FOR && *k != X_FORWARDED_PROTO
            })
            .cloned()
            .collect();
        for name in claims {
            headers.remove(name);
        }
    }
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
    fn other_forwarding_claims_are_dropped_unless_the_peer_is_trusted() {
        let claims = [
            ("forwarded", "for=10.0.0.1;proto=https"),
            ("x-real-ip", "10.0.0.1"),
            ("x-forwarded-host", "admin.internal"),
            ("x-forwarded-port", "443"),
            ("true-client-ip", "10.0.0.1"),
            ("x_forwarded_for", "10.0.0.1"),
            ("x_real_ip", "10.0.0.1"),
            ("x-original-url", "/admin"),
        ];
        let headers = || {
            let mut h = HeaderMap::new();
            for (k, v) in claims {
                h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
            }
            h.insert("x-kept", HeaderValue::from_static("1"));
            h
        };
        let mut h = headers();
        set_forwarded(&mut h, "192.0.2.7".parse().unwrap(), false);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-forwarded-for", "x-forwarded-proto", "x-kept"]);
        let mut h = headers();
        set_forwarded(&mut h, "10.0.0.1".parse().unwrap(), true);
        assert_eq!(h.len(), claims.len() + 3, "a trusted proxy's claims are kept");
        assert!(is_forwarding_claim(b"X_Forwarded_Host") && !is_forwarding_claim(b"X-Forwarded"));
    }

    #[test]
    fn a_trusted_chain_keeps_every_line_in_order() {
        let mut out = Vec::new();
        let lines: [&[u8]; 2] = [b"1.2.3.4, 5.6.7.8", b"9.9.9.9"];
        write_forwarded_for(&mut out, lines.into_iter(), "2001:db8::1".parse().unwrap(), true);
        assert_eq!(out, b"1.2.3.4, 5.6.7.8, 9.9.9.9, 2001:db8::1");
    }
}
