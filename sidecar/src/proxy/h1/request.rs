//! A client's request head, parsed for the fast path. The fast path takes the common, unambiguous case
//! and nothing else: an HTTP/1.1 request in origin form with exactly one `Host`, framed by one valid
//! `Content-Length`, by `Transfer-Encoding: chunked` alone, or not at all, and asking for no upgrade (an
//! `Expect: 100-continue` is taken: the app's own `100` lets the body go). Anything else — HTTP/1.0,
//! HTTP/2's preface, `CONNECT`, absolute or asterisk targets, conflicting or odd framing, upgrades, a
//! malformed or oversized head — is handed to hyper with the bytes read so far, and hyper answers it as
//! it always has (including its 400s and 431s). So request smuggling through ambiguous framing cannot
//! start here: the app sees exactly the framing the client sent, and only when that framing has one
//! reading. What no server may accept is refused here ([`Parsed::Refused`]): a target with a fragment or a
//! byte outside ASCII; an HTTP/1.1 request without a `Host`, with two, or with a malformed one (RFC 9112
//! §3.2); the chunked coding applied more than once (RFC 9112 §6.1); a known method in another case; an
//! expectation other than `100-continue` (417).

use std::mem::MaybeUninit;

use http::Method;

use crate::{
    http1::{
        body::{Framing, decimal},
        fields::{Field, Fields, MAX_FIELDS, Span},
        hop_by_hop::has_token,
    },
    proxy::target,
};

/// The longest request head the fast path waits for; a longer one is handed to hyper, whose buffer holds
/// no more (see `fallback`), so it is answered 431.
pub const MAX_HEAD: usize = 64 * 1024;

/// A parsed request head. Its spans point into the buffer it was parsed from.
#[derive(Debug)]
pub struct RequestHead {
    /// Length of the head in bytes (the body, if any, starts here).
    pub len: usize,
    /// The method.
    pub method: Method,
    /// The request target (origin form: path and query).
    pub target: Span,
    /// Length of the path at the start of the target (before any `?`).
    pub path_len: usize,
    /// The `Host` field's value.
    pub host: Span,
    /// How the body is delimited.
    pub framing: Framing,
    /// The client asked to close the connection after this exchange (`Connection: close`).
    pub close: bool,
    /// The request carries an `Idempotency-Key` (the client says sending it twice is harmless).
    pub idempotency_key: bool,
    /// The client sent `Expect: 100-continue`: it waits for a `100` before sending the body.
    pub expect_continue: bool,
}

impl RequestHead {
    /// The path, without the query.
    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b str {
        // Checked to be UTF-8 when parsed; the path is a prefix ending before an ASCII `?`.
        std::str::from_utf8(&self.target.of(buf)[..self.path_len]).unwrap_or("/")
    }

    /// The `Host` value, if it is visible ASCII.
    pub fn host<'b>(&self, buf: &'b [u8]) -> Option<&'b str> {
        std::str::from_utf8(self.host.of(buf)).ok()
    }

    /// Whether the method is `HEAD` (its response has no body whatever it declares).
    pub fn is_head(&self) -> bool {
        self.method == Method::HEAD
    }

    /// Whether this request may be sent again on a fresh connection when a kept-alive one turned out to
    /// be closed with no answer: a safe method (RFC 9110 §9.2.1), or any request with an
    /// `Idempotency-Key`. The app may have received it before it closed, so `PUT` and `DELETE` are not
    /// retried on their own (as Go's HTTP client decides).
    pub fn retryable(&self) -> bool {
        self.idempotency_key
            || matches!(
                self.method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
            )
    }
}

/// What the bytes read so far hold.
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole head yet: read more.
    Partial,
    /// A whole head the fast path takes; its fields are in the list passed to [`parse`].
    Head(RequestHead),
    /// Something the fast path leaves to hyper (the reason, for traces).
    HandOff(&'static str),
    /// A head no server may accept: answered with this status (400 or 417) and the connection closed.
    Refused(http::StatusCode, &'static str),
}

/// Parses the request head at the start of `buf`, recording its fields in `fields`.
pub fn parse(buf: &[u8], fields: &mut Vec<Field>) -> Parsed {
    fields.clear();
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Parsed::HandOff("head too long"),
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::HandOff("not a valid HTTP/1.x head"),
    };
    // A target no server may read one way, whatever else the head holds (RFC 9112 §3.2: a target has no
    // fragment; RFC 3986: its bytes are ASCII, anything else percent-encoded).
    if let Some(target) = req.path {
        if target.contains('#') {
            return Parsed::Refused(http::StatusCode::BAD_REQUEST, "a fragment in the request target");
        }
        if !target.is_ascii() {
            return Parsed::Refused(
                http::StatusCode::BAD_REQUEST,
                "a byte outside ASCII in the request target",
            );
        }
    }
    if req.version != Some(1) {
        return Parsed::HandOff("not HTTP/1.1");
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Parsed::HandOff("no request line");
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::HandOff("unusual method");
    };
    if method == Method::CONNECT {
        return Parsed::HandOff("CONNECT");
    }
    if !target.starts_with('/') {
        return Parsed::HandOff("not an origin-form target");
    }
    let path_len = target.find('?').unwrap_or(target.len());

    let mut host = None;
    let mut hosts = 0;
    let mut length: Option<u64> = None;
    let mut lengths = 0;
    let mut chunked = false;
    let mut encodings = 0;
    let mut chunked_codings = 0;
    let mut close = false;
    let mut idempotency_key = false;
    let mut expect_continue = false;
    let mut expectations = 0;
    for h in req.headers.iter() {
        fields.push(Field::of(buf, h));
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
            host = Some(Span::within(buf, h.value));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            lengths += 1;
            length = decimal(h.value);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            encodings += 1;
            chunked = h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            chunked_codings += target::chunked_codings(h.value);
        } else if name.eq_ignore_ascii_case(b"connection") {
            if has_token(h.value, "upgrade") {
                return Parsed::HandOff("upgrade");
            }
            close |= has_token(h.value, "close");
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            return Parsed::HandOff("upgrade");
        } else if name.eq_ignore_ascii_case(b"expect") {
            expectations += 1;
            expect_continue = h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"idempotency-key") {
            idempotency_key = true;
        }
    }
    // A key the app never sees (named by `Connection`) does not make the request safe to repeat.
    let idempotency_key = idempotency_key && !Fields::new(buf, fields).dropped(b"idempotency-key");
    let (Some(host), 1) = (host, hosts) else {
        return Parsed::Refused(http::StatusCode::BAD_REQUEST, "not exactly one Host");
    };
    if let Err(why) = target::check_host(host.of(buf)) {
        return Parsed::Refused(http::StatusCode::BAD_REQUEST, why);
    }
    if let Err(why) = target::check_method(&method) {
        return Parsed::Refused(http::StatusCode::BAD_REQUEST, why);
    }
    if chunked_codings > 1 {
        return Parsed::Refused(http::StatusCode::BAD_REQUEST, target::CHUNKED_TWICE);
    }
    if expectations > 1 || (expectations == 1 && !expect_continue) {
        return Parsed::Refused(
            http::StatusCode::EXPECTATION_FAILED,
            "an expectation other than 100-continue",
        );
    }
    let framing = match (lengths, encodings) {
        (0, 0) => Framing::Empty,
        (1, 0) => match length {
            Some(n) => Framing::Length(n),
            None => return Parsed::HandOff("invalid Content-Length"),
        },
        (0, 1) if chunked => Framing::Chunked,
        _ => return Parsed::HandOff("ambiguous or unusual framing"),
    };
    Parsed::Head(RequestHead {
        len,
        method,
        target: Span::within(buf, target.as_bytes()),
        path_len,
        host,
        framing,
        close,
        idempotency_key,
        expect_continue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> RequestHead {
        match parse(raw.as_bytes(), &mut Vec::new()) {
            Parsed::Head(h) => h,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn handed_off(raw: &str) -> &'static str {
        match parse(raw.as_bytes(), &mut Vec::new()) {
            Parsed::HandOff(why) => why,
            other => panic!("{raw:?} was not handed off: {other:?}"),
        }
    }

    #[test]
    fn a_plain_get_is_taken_with_its_path_host_and_no_body() {
        let raw = "GET /v1/items?page=2 HTTP/1.1\r\nHost: api.example.com\r\nAccept: */*\r\n\r\nnext";
        let mut fields = Vec::new();
        let Parsed::Head(h) = parse(raw.as_bytes(), &mut fields) else {
            panic!()
        };
        assert_eq!(h.len, raw.len() - 4);
        assert_eq!(h.method, Method::GET);
        assert_eq!(h.path(raw.as_bytes()), "/v1/items");
        assert_eq!(h.target.of(raw.as_bytes()), b"/v1/items?page=2");
        assert_eq!(h.host(raw.as_bytes()), Some("api.example.com"));
        assert_eq!(h.framing, Framing::Empty);
        assert!(!h.close);
        assert_eq!(fields.len(), 2);
    }

    #[test]
    fn bodies_are_framed_by_one_length_or_chunked_alone() {
        let post = |framing: &str| head(&format!("POST / HTTP/1.1\r\nHost: a\r\n{framing}\r\n\r\n")).framing;
        assert_eq!(post("Content-Length: 42"), Framing::Length(42));
        assert_eq!(post("Transfer-Encoding: Chunked"), Framing::Chunked);
        assert_eq!(post("X-Other: 1"), Framing::Empty);
    }

    fn refused(raw: &str) -> (http::StatusCode, &'static str) {
        match parse(raw.as_bytes(), &mut Vec::new()) {
            Parsed::Refused(status, why) => (status, why),
            other => panic!("{raw:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn heads_no_server_may_accept_are_refused() {
        for raw in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a rule=x status=200\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: \r\n\r\n",
            "post / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a?b#c HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a#b HTTP/1.0\r\nHost: a\r\n\r\n",
            "GET /caf\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET http://a/caf\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, Chunked\r\n\r\n",
        ] {
            assert_eq!(refused(raw).0, http::StatusCode::BAD_REQUEST, "{raw:?}");
        }
        for raw in [
            "PUT / HTTP/1.1\r\nHost: a\r\nExpect: something-else\r\n\r\n",
            "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nExpect: 100-continue\r\n\r\n",
        ] {
            assert_eq!(refused(raw).0, http::StatusCode::EXPECTATION_FAILED, "{raw:?}");
        }
    }

    #[test]
    fn expect_100_continue_is_taken_and_noted() {
        let h = head("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: 100-Continue\r\n\r\n");
        assert!(h.expect_continue);
        assert!(!head("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n").expect_continue);
    }

    #[test]
    fn connection_close_is_noted() {
        assert!(head("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n").close);
    }

    #[test]
    fn an_unfinished_head_asks_for_more() {
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\n", &mut Vec::new()),
            Parsed::Partial
        ));
        let long = format!("GET / HTTP/1.1\r\nX-Long: {}", "a".repeat(MAX_HEAD));
        assert_eq!(handed_off(&long), "head too long");
    }

    #[test]
    fn everything_unusual_or_ambiguous_is_handed_to_hyper() {
        let cases = [
            "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n",
        ];
        for raw in cases {
            handed_off(raw);
        }
        let many = format!(
            "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
            "X-A: 1\r\n".repeat(MAX_FIELDS)
        );
        handed_off(&many);
    }

    /// Random mutations of a valid head never panic, and a head the fast path takes always lies within
    /// the bytes it was parsed from.
    #[test]
    fn mutated_heads_never_panic_and_taken_heads_stay_in_bounds() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(7);
        let base =
            b"POST /a?b=c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nabc";
        let alphabet = b" :\r\n\t/?0123456789HTPchunkedTransfer-EncodingContent-LengthHost,;\x80\x00";
        let mut fields = Vec::new();
        for _ in 0..5_000 {
            let mut buf = base.to_vec();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..buf.len());
                let b = alphabet[rng.random_range(0..alphabet.len())];
                match rng.random_range(0..3) {
                    0 => buf[at] = b,
                    1 => buf.insert(at, b),
                    _ => {
                        buf.remove(at);
                    }
                }
            }
            if let Parsed::Head(h) = parse(&buf, &mut fields) {
                assert!(h.len <= buf.len());
                assert!(h.target.range().end <= h.len && h.host.range().end <= h.len);
                assert!(fields.iter().all(|f| f.value.range().end <= h.len));
                let _ = (h.path(&buf), h.host(&buf));
            }
        }
    }

    #[test]
    fn only_safe_methods_or_requests_with_an_idempotency_key_are_retried() {
        let m = |method: &str| head(&format!("{method} / HTTP/1.1\r\nHost: a\r\n\r\n")).retryable();
        assert!(m("GET") && m("HEAD") && m("OPTIONS"));
        assert!(!m("POST") && !m("PATCH") && !m("PUT") && !m("DELETE"));
        assert!(head("POST / HTTP/1.1\r\nHost: a\r\nIdempotency-Key: k1\r\n\r\n").retryable());
        let hidden =
            "POST / HTTP/1.1\r\nHost: a\r\nConnection: idempotency-key\r\nIdempotency-Key: k1\r\n\r\n";
        assert!(
            !head(hidden).retryable(),
            "the app never sees a key Connection names"
        );
    }
}
