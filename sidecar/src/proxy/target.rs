//! What a request names — its path, host and method — read one way, for the rules and for the app.
//!
//! A limiter that reads `/v1//auth/login` as something other than `/v1/auth/login` while the app routes
//! both to its login handler is the bug class this module exists for. So:
//!
//! - **Path** ([`normalize_path`]): percent-encoded unreserved characters are decoded, `.` and `..`
//!   segments resolved, repeated slashes merged (each per `limits.paths`), and the app receives the path
//!   so normalized, as Envoy forwards its normalized path. A path that cannot be read one way is refused
//!   (400): a malformed escape, an encoded NUL, a backslash (literal or `%5C`), a fragment, and unless
//!   `escapedSlashes: keep`, an encoded slash. Rules also read the path without `;parameters`
//!   ([`without_params`]), as servlet containers route: `/v1/auth;x/login` counts as `/v1/auth/login`,
//!   and a dot segment hidden behind parameters (`/x/..;/v1`) is refused.
//! - **Host** ([`check_host`], [`host_for_rules`]): one valid value (RFC 9112 §3.2: none, two, or a
//!   malformed one is a 400); rules compare it in lower case, without port or trailing dot.
//! - **Method** ([`check_method`]): methods are case-sensitive and rules match them exactly; a known
//!   method in another case (`post`) is refused, since some servers would read it as `POST`.
//!
//! The common request (a plain path, a valid host, an upper-case method) is checked by scanning its bytes
//! once; nothing is allocated or copied unless the path needs rewriting.

use std::borrow::Cow;

use http::Method;
use sluice_crds::sidecar_config::{EscapedSlashes, PathsConfig};

/// Why a request cannot be read one way (the reason behind a 400, for traces and tests).
pub type Refusal = &'static str;

/// Why a request whose transfer codings name `chunked` more than once is refused (RFC 9112 §6.1: a sender
/// applies it once; a second `chunked`, in one field or two, leaves the body with no single reading).
pub const CHUNKED_TWICE: Refusal = "the chunked coding applied more than once";

/// How many times a `Transfer-Encoding` value names `chunked` (case-insensitive, list members trimmed).
pub fn chunked_codings(value: &[u8]) -> usize {
    value
        .split(|&b| b == b',')
        .filter(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        .count()
}

/// Methods whose case variants are refused.
const KNOWN_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Normalizes the request path `path` (the target before any `?`) per `rules`, writing the result into
/// `out` when it differs; returns whether it did. Refuses a path that cannot be read one way.
pub fn normalize_path(path: &str, rules: &PathsConfig, out: &mut String) -> Result<bool, Refusal> {
    let bytes = path.as_bytes();
    if !needs_work(bytes, rules) {
        return Ok(false);
    }
    // First the escapes (so `%2e%2e` is a dot segment like `..`), then the segments.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    bytes.get(i + 1).and_then(|&b| hex(b)),
                    bytes.get(i + 2).and_then(|&b| hex(b)),
                ) else {
                    return Err("malformed percent-encoding in the path");
                };
                let byte = hi << 4 | lo;
                match byte {
                    0 => return Err("an encoded NUL in the path"),
                    b'/' | b'\\' if rules.escaped_slashes == EscapedSlashes::Reject => {
                        return Err("an encoded slash or backslash in the path");
                    }
                    b'\\' => return Err("an encoded backslash in the path"),
                    _ if rules.normalize && unreserved(byte) => decoded.push(byte),
                    _ if rules.normalize => {
                        decoded.extend_from_slice(&[
                            b'%',
                            HEX_UPPER[usize::from(hi)],
                            HEX_UPPER[usize::from(lo)],
                        ]);
                    }
                    _ => decoded.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'\\' => return Err("a backslash in the path"),
            b'#' => return Err("a fragment in the request target"),
            b => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    out.clear();
    resolve_segments(&decoded, rules, out);
    Ok(out.as_str() != path)
}

/// Whether `path` holds anything [`normalize_path`] acts on: an escape, a backslash, a fragment, a dot
/// segment or (when merged) an empty one. One pass, no allocation.
fn needs_work(path: &[u8], rules: &PathsConfig) -> bool {
    let mut prev = 0u8;
    for (i, &b) in path.iter().enumerate() {
        match b {
            b'%' | b'\\' | b'#' => return true,
            b'/' if prev == b'/' && rules.merge_slashes => return true,
            b'.' if prev == b'/' && rules.normalize => {
                // `/.` or `/..` followed by a separator or the end.
                let rest = &path[i + 1..];
                let rest = rest.strip_prefix(b".").unwrap_or(rest);
                if rest.is_empty() || rest[0] == b'/' {
                    return true;
                }
            }
            _ => {}
        }
        prev = b;
    }
    false
}

/// Writes `path` (escapes already decoded) into `out` segment by segment: empty segments dropped when
/// merging slashes, `.` and `..` resolved when normalizing (RFC 3986 §5.2.4: `..` above the root stays
/// at the root; a path ending in a dot segment ends with `/`).
fn resolve_segments(path: &[u8], rules: &PathsConfig, out: &mut String) {
    // Every byte here is one the original path had, or an unreserved ASCII character: valid UTF-8 again.
    let path = String::from_utf8_lossy(path);
    let rest = path.strip_prefix('/').unwrap_or(&path);
    let count = rest.split('/').count();
    for (i, seg) in rest.split('/').enumerate() {
        let last = i + 1 == count;
        match seg {
            "" if rules.merge_slashes && !last => {}
            "." if rules.normalize => {
                if last && !out.ends_with('/') {
                    out.push('/');
                }
            }
            ".." if rules.normalize => {
                let cut = out.rfind('/').unwrap_or(0);
                out.truncate(cut);
                if last {
                    out.push('/');
                }
            }
            seg => {
                out.push('/');
                out.push_str(seg);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
}

/// The path as rules read it: `;parameters` removed from each segment (`/a;x=1/b;y` → `/a/b`), written
/// into `out` when there are any; returns whether there were.
///
/// A servlet container strips the parameters first and then resolves dot segments and merges slashes,
/// so a segment that is only parameters apart from a dot segment or nothing hides a path from rules
/// that read it afterwards: `/x/..;/v1/auth/login` and `/v1/;/auth/login` are served as
/// `/v1/auth/login`. The first kind (`.;…`, `..;…`) is refused, as no client means it; the second is
/// merged like any empty segment when `rules.merge_slashes` (a last segment such as Tomcat's
/// `/app/;jsessionid=…` stays: `/app/`).
pub fn without_params(path: &str, rules: &PathsConfig, out: &mut String) -> Result<bool, Refusal> {
    if !path.contains(';') {
        return Ok(false);
    }
    out.clear();
    let count = path.split('/').count();
    for (i, seg) in path.split('/').enumerate() {
        let name = match seg.split_once(';') {
            Some(("." | "..", _)) => return Err("a dot segment with parameters in the path"),
            Some(("", _)) if i > 0 && i + 1 < count && rules.merge_slashes => continue,
            Some((name, _)) => name,
            None => seg,
        };
        if i > 0 {
            out.push('/');
        }
        out.push_str(name);
    }
    Ok(true)
}

/// Checks a `Host` value: a host name or IP literal and an optional port (RFC 9112 §3.2, RFC 3986 §3.2.2),
/// nothing else — no space, no `/`, no `@`.
pub fn check_host(value: &[u8]) -> Result<(), Refusal> {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(v6) => {
            let end = v6
                .iter()
                .position(|&b| b == b']')
                .ok_or("an unclosed IP literal in Host")?;
            let literal = &v6[..end];
            if literal.is_empty()
                || !literal
                    .iter()
                    .all(|&b| b.is_ascii_hexdigit() || b":.".contains(&b))
            {
                return Err("an invalid IP literal in Host");
            }
            (&b""[..], &v6[end + 1..])
        }
        None => match value.iter().position(|&b| b == b':') {
            Some(colon) => (&value[..colon], &value[colon..]),
            None => (value, &b""[..]),
        },
    };
    let reg_name = |b: &u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(b);
    if !host.iter().all(reg_name) {
        return Err("an invalid host name in Host");
    }
    if !port.is_empty() {
        let digits = port.strip_prefix(b":").ok_or("an invalid Host")?;
        if digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
            return Err("an invalid port in Host");
        }
    }
    if value.is_empty() {
        return Err("an empty Host");
    }
    Ok(())
}

/// A host as rules match it: without port or trailing dot, lower case. Borrowed when nothing changes
/// (nearly always).
pub fn host_for_rules(raw: &str) -> Cow<'_, str> {
    let host = match raw.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => raw.split(':').next().unwrap_or(raw),
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// Refuses a known method written in another case (`post`, `Get`): HTTP methods are case-sensitive and
/// rules match them exactly, but some servers would read `post` as `POST`.
pub fn check_method(method: &Method) -> Result<(), Refusal> {
    let m = method.as_str();
    // The standard methods are upper case already; only extension methods can be a case variant.
    if m.bytes().any(|b| b.is_ascii_lowercase()) && KNOWN_METHODS.iter().any(|k| k.eq_ignore_ascii_case(m)) {
        return Err("a known method not in upper case");
    }
    Ok(())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3: ALPHA / DIGIT / `-` / `.` / `_` / `~`.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, Refusal> {
        norm_with(path, &PathsConfig::default())
    }

    fn norm_with(path: &str, rules: &PathsConfig) -> Result<String, Refusal> {
        let mut out = String::new();
        Ok(if normalize_path(path, rules, &mut out)? {
            out
        } else {
            path.to_owned()
        })
    }

    #[test]
    fn the_bypasses_of_a_prefix_rule_all_read_as_the_path_they_mean() {
        for trick in [
            "/v1//auth/login",
            "/v1/%61uth/login",
            "/v1/x/../auth/login",
            "/v1/./auth/login",
            "/v1/%2e/auth/login",
            "/v1/x/%2E%2E/auth/login",
            "//v1/auth/login",
            "/../v1/auth/login",
            "/v1/auth/./login",
        ] {
            assert_eq!(norm(trick).unwrap(), "/v1/auth/login", "{trick}");
        }
        assert_eq!(norm("/npm/../v1/packages").unwrap(), "/v1/packages");
    }

    #[test]
    fn plain_paths_are_left_alone_without_allocating() {
        let mut out = String::new();
        for plain in [
            "/",
            "/v1/items",
            "/a.b/c..d/.e/f.",
            "/files/report.pdf",
            "/a-b_c~d",
        ] {
            assert!(
                !normalize_path(plain, &PathsConfig::default(), &mut out).unwrap(),
                "{plain}"
            );
        }
        assert_eq!(out.capacity(), 0, "nothing was written");
    }

    #[test]
    fn paths_that_cannot_be_read_one_way_are_refused() {
        for bad in [
            "/v1%2fauth/login",
            "/v1%2Fauth/login",
            "/v1/auth\\login",
            "/v1/auth%5clogin",
            "/a%00b",
            "/a%zz",
            "/a%2",
            "/a%",
            "/a#frag",
        ] {
            assert!(norm(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kept_escapes_stay_encoded_in_upper_case_and_never_separate_segments() {
        let keep = PathsConfig {
            escaped_slashes: EscapedSlashes::Keep,
            ..PathsConfig::default()
        };
        assert_eq!(
            norm_with("/npm/@scope%2fname", &keep).unwrap(),
            "/npm/@scope%2Fname"
        );
        assert_eq!(norm_with("/a%2F..%2Fb", &keep).unwrap(), "/a%2F..%2Fb");
        assert!(norm_with("/a%5Cb", &keep).is_err(), "a backslash is never kept");
        assert_eq!(norm("/caf%c3%a9").unwrap(), "/caf%C3%A9");
    }

    #[test]
    fn dot_segments_resolve_as_rfc_3986_says_and_trailing_slashes_stay() {
        assert_eq!(norm("/a/b/..").unwrap(), "/a/");
        assert_eq!(norm("/a/b/.").unwrap(), "/a/b/");
        assert_eq!(norm("/a/b/").unwrap(), "/a/b/");
        assert_eq!(norm("/..").unwrap(), "/");
        assert_eq!(norm("/a//").unwrap(), "/a/");
        assert_eq!(norm("/a/...").unwrap(), "/a/...");
    }

    #[test]
    fn each_step_can_be_turned_off() {
        let raw = PathsConfig {
            normalize: false,
            merge_slashes: false,
            escaped_slashes: EscapedSlashes::Keep,
        };
        for path in ["/a//b", "/a/../b", "/%61"] {
            assert_eq!(norm_with(path, &raw).unwrap(), path);
        }
        assert!(
            norm_with("/a\\b", &raw).is_err(),
            "a backslash is refused whatever the settings"
        );
        let merge_only = PathsConfig {
            normalize: false,
            ..raw
        };
        let merge_only = PathsConfig {
            merge_slashes: true,
            ..merge_only
        };
        assert_eq!(norm_with("/a//./b", &merge_only).unwrap(), "/a/./b");
    }

    #[test]
    fn rules_read_paths_without_segment_parameters() {
        let rules = PathsConfig::default();
        let mut out = String::new();
        let mut rule_path =
            |path: &str| without_params(path, &rules, &mut out).map(|changed| changed.then(|| out.clone()));
        assert_eq!(
            rule_path("/v1/auth;x=1/login;jsessionid=2"),
            Ok(Some("/v1/auth/login".into()))
        );
        assert_eq!(rule_path("/v1/auth/login"), Ok(None));
        // What a servlet container serves as `/v1/auth/login`: merged, or refused.
        assert_eq!(rule_path("/v1/;/auth/login"), Ok(Some("/v1/auth/login".into())));
        assert_eq!(
            rule_path("/v1/;a=b/;/auth/login"),
            Ok(Some("/v1/auth/login".into()))
        );
        for hidden in ["/x/..;/v1/auth/login", "/x/.;/v1", "/x/..;a=b/v1", "/..;"] {
            assert!(rule_path(hidden).is_err(), "{hidden}");
        }
        // A last segment of parameters only (Tomcat's URL rewriting of a directory) stays a slash.
        assert_eq!(rule_path("/app/;jsessionid=1"), Ok(Some("/app/".into())));
        // `...` is a name, not a dot segment.
        assert_eq!(rule_path("/a/...;x/b"), Ok(Some("/a/.../b".into())));
    }

    #[test]
    fn segments_emptied_by_parameters_are_kept_when_slashes_are_not_merged() {
        let rules = PathsConfig {
            merge_slashes: false,
            ..PathsConfig::default()
        };
        let mut out = String::new();
        assert_eq!(without_params("/v1/;/auth", &rules, &mut out), Ok(true));
        assert_eq!(out, "/v1//auth");
        assert!(without_params("/x/..;/v1", &rules, &mut out).is_err());
    }

    #[test]
    fn hosts_are_one_valid_name_or_literal_with_an_optional_port() {
        for good in [
            "a",
            "api.example.com",
            "api.example.com.",
            "Api:8080",
            "[::1]",
            "[::1]:80",
            "10.0.0.1:1",
        ] {
            assert_eq!(check_host(good.as_bytes()), Ok(()), "{good}");
        }
        for bad in [
            "",
            "a b",
            "a rule=x status=200",
            "a/b",
            "a@b",
            "a:80:80",
            "a:x",
            "[::1",
            "[zz]",
            "a:123456",
        ] {
            assert!(check_host(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn rules_see_the_host_in_lower_case_without_port_or_trailing_dot() {
        assert_eq!(host_for_rules("API.Example.com.:8080"), "api.example.com");
        assert_eq!(host_for_rules("[::1]:80"), "::1");
        assert!(matches!(
            host_for_rules("example.com"),
            Cow::Borrowed("example.com")
        ));
    }

    #[test]
    fn known_methods_in_another_case_are_refused_and_others_pass() {
        for bad in ["post", "Get", "pAtCh"] {
            assert!(
                check_method(&Method::from_bytes(bad.as_bytes()).unwrap()).is_err(),
                "{bad}"
            );
        }
        for good in ["GET", "POST", "PROPFIND", "purge", "M-SEARCH"] {
            assert!(
                check_method(&Method::from_bytes(good.as_bytes()).unwrap()).is_ok(),
                "{good}"
            );
        }
    }
}
