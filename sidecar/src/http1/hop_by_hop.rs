//! Hop-by-hop fields (RFC 9110 §7.6.1, plus the de-facto `Proxy-Connection` and `Keep-Alive`): they
//! describe one connection, so a proxy never forwards them, nor the fields that `Connection` names —
//! except the [`PROTECTED`] ones, which frame the message or name its host (`Connection:
//! content-length` would otherwise turn a body into a second request). Also the tokens of list fields
//! (`Connection`, `Transfer-Encoding`), which framing and keep-alive are read from.

use http::{HeaderMap, HeaderName, header};

/// The fields that are hop-by-hop whatever `Connection` says.
pub static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Fields a `Connection` token cannot remove.
pub const PROTECTED: [&str; 2] = ["content-length", "host"];

/// Removes hop-by-hop fields and every field the `Connection` field names (but the [`PROTECTED`] ones).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| tokens(v.as_bytes()))
        .filter(|t| !is_protected(t))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP.iter() {
        headers.remove(name);
    }
}

/// Whether the field `name` (any case) is one of [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(name))
}

/// Whether the field `name` (any case) is one of [`PROTECTED`].
pub fn is_protected(name: &[u8]) -> bool {
    PROTECTED.iter().any(|p| p.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether the field `name` is not forwarded, given the values of the message's `Connection` fields: one
/// of [`HOP_BY_HOP`], or named by a `Connection` token (unless [`PROTECTED`]).
pub fn dropped<'a>(name: &[u8], mut connection: impl Iterator<Item = &'a [u8]>) -> bool {
    is_hop_by_hop(name)
        || (!is_protected(name) && connection.any(|v| tokens(v).any(|t| t.eq_ignore_ascii_case(name))))
}

/// The comma-separated tokens of a list field such as `Connection`, trimmed, empty ones skipped.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Whether the list field `value` holds `token` (any case).
pub fn has_token(value: &[u8], token: &str) -> bool {
    tokens(value).any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

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
    fn connection_cannot_name_the_framing_or_the_host_away() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("host, content-length, x-a"),
        );
        h.insert(header::HOST, HeaderValue::from_static("tenant-a.example"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.insert("x-a", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "host"]);
    }

    #[test]
    fn list_tokens_are_trimmed_and_compared_in_any_case() {
        let t: Vec<_> = tokens(b" Keep-Alive ,, Upgrade").collect();
        assert_eq!(t, [&b"Keep-Alive"[..], &b"Upgrade"[..]]);
        assert!(has_token(b"keep-alive, UPGRADE", "upgrade"));
        assert!(!has_token(b"upgrades", "upgrade"));
        assert!(is_hop_by_hop(b"Transfer-Encoding"));
        assert!(!is_hop_by_hop(b"Content-Length"));
    }
}
