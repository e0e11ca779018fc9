//! Malformed and oversized HTTP requests, as bytes on a fresh connection, each with the status the
//! sidecar answers (`sidecar/tests/bad_input_http.rs` sends them to the real binary). Data only: the
//! count of bad inputs in docs/security.md reads this table too.

/// A request's bytes.
pub enum Raw {
    /// These bytes.
    Bytes(&'static [u8]),
    /// `head`, then `fill` repeated `times` times, then `tail`.
    Repeat {
        head: &'static [u8],
        fill: &'static [u8],
        times: usize,
        tail: &'static [u8],
    },
}

impl Raw {
    /// The bytes sent.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Raw::Bytes(b) => b.to_vec(),
            Raw::Repeat {
                head,
                fill,
                times,
                tail,
            } => {
                let mut v = head.to_vec();
                for _ in 0..*times {
                    v.extend_from_slice(fill);
                }
                v.extend_from_slice(tail);
                v
            }
        }
    }
}

/// One bad request.
pub struct Case {
    /// What is wrong with it.
    pub what: &'static str,
    pub raw: Raw,
    /// The status the sidecar answers it with.
    pub status: u16,
}

const fn case(what: &'static str, raw: &'static [u8], status: u16) -> Case {
    Case {
        what,
        raw: Raw::Bytes(raw),
        status,
    }
}

/// The largest request body the sidecar under test forwards (`limits.maxRequestBody`).
pub const MAX_BODY: u64 = 1024;

pub const CASES: &[Case] = &[
    // The request line.
    case("no Host in HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n", 400),
    case("no Host in HTTP/1.1, with a body", b"POST /v1/x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", 400),
    case("a known method in lower case", b"get / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a known method in mixed case", b"Post /v1/auth/login HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 400),
    case("DELETE in lower case", b"delete /v1/x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a lower-case method on the hyper path", b"post / HTTP/1.0\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 400),
    case("two spaces after the method", b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a fourth word in the request line", b"GET / HTTP/1.1 extra\r\nHost: a\r\n\r\n", 400),
    case("no version", b"GET /\r\nHost: a\r\n\r\n", 400),
    case("a lower-case version", b"GET / http/1.1\r\nHost: a\r\n\r\n", 400),
    case("HTTP/1.2", b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 400),
    case("HTTP/3.0 in an HTTP/1 request line", b"GET / HTTP/3.0\r\nHost: a\r\n\r\n", 400),
    case("an empty method", b" / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a method with a separator", b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a control character in the target", b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a raw NUL in the target", b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a raw DEL in the target", b"GET /a\x7fb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("invalid UTF-8 in the target", b"GET /\xff\xfe HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a fragment after the query", b"GET /v1/auth/login?x=1#frag HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a fragment in an HTTP/1.0 target", b"GET /a?b#c HTTP/1.0\r\nHost: a\r\n\r\n", 400),
    case("raw UTF-8 in the target", b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("raw UTF-8 in the query", b"GET /a?q=\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("raw UTF-8 in an absolute-form target", b"GET http://a/caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a TLS ClientHello on the plaintext port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    case("binary garbage", b"\x00\x01\x02\x03\r\n\r\n", 400),
    case("a request line of CRLF alone then garbage", b"\r\n\r\n\r\n:\r\n\r\n", 400),
    // Host (RFC 9112 §3.2).
    case("two Host fields", b"GET /x HTTP/1.1\r\nHost: a\r\nHost: api.example.com\r\n\r\n", 400),
    case("two Host fields in different case", b"GET /x HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", 400),
    case("two Host fields on the hyper path", b"GET /x HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    case("an empty Host", b"GET / HTTP/1.1\r\nHost: \r\n\r\n", 400),
    case("a Host with a space", b"GET / HTTP/1.1\r\nHost: a rule=x status=200\r\n\r\n", 400),
    case("a Host with a slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    case("a Host with a slash on the hyper path", b"GET / HTTP/1.0\r\nHost: a/b\r\n\r\n", 400),
    case("a Host with userinfo", b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400),
    case("a Host with a port that is not a number", b"GET / HTTP/1.1\r\nHost: a:http\r\n\r\n", 400),
    case("a Host with a six-digit port", b"GET / HTTP/1.1\r\nHost: a:123456\r\n\r\n", 400),
    case("a Host with two ports", b"GET / HTTP/1.1\r\nHost: a:80:81\r\n\r\n", 400),
    case("an unclosed IP literal in Host", b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400),
    case("an empty IP literal in Host", b"GET / HTTP/1.1\r\nHost: []\r\n\r\n", 400),
    case("an IP literal of letters in Host", b"GET / HTTP/1.1\r\nHost: [zz::1]\r\n\r\n", 400),
    case("junk after an IP literal in Host", b"GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", 400),
    case("a non-ASCII Host", b"GET / HTTP/1.1\r\nHost: b\xc3\xa4d.example\r\n\r\n", 400),
    case("a Host with a backslash", b"GET / HTTP/1.1\r\nHost: a\\b\r\n\r\n", 400),
    case("a Host with a question mark", b"GET / HTTP/1.1\r\nHost: a?b\r\n\r\n", 400),
    case("a Host with a hash", b"GET / HTTP/1.1\r\nHost: a#b\r\n\r\n", 400),
    // Header fields.
    case("an obs-folded field", b"GET / HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n b\r\n\r\n", 400),
    case("whitespace before the colon", b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
    case("a space in a field name", b"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", 400),
    case("a field line without a colon", b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400),
    case("an empty field name", b"GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", 400),
    case("a separator in a field name", b"GET / HTTP/1.1\r\nHost: a\r\nX(y): 1\r\n\r\n", 400),
    case("a NUL in a field value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n", 400),
    case("a bare CR in a field value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", 400),
    case("a DEL in a field value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x7fb\r\n\r\n", 400),
    case("a control character in a field value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x01b\r\n\r\n", 400),
    case("a field line that starts the head with whitespace", b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400),
    // Framing.
    case("two different Content-Lengths", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
    case("a Content-Length with a sign", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", 400),
    case("a negative Content-Length", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
    case("a hex Content-Length", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", 400),
    case("an empty Content-Length", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", 400),
    case("a Content-Length of two numbers", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\nhello", 400),
    case("a Content-Length over 2^64", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
    case("a Content-Length list of different values", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello!", 400),
    case("chunked not the last coding", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", 400),
    case("a transfer coding that is not chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    case("Transfer-Encoding: identity", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", 400),
    case("a misspelt chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
    case("two Transfer-Encoding: chunked fields", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    case("chunked twice in one field", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400),
    case("two Transfer-Encoding: chunked fields on the hyper path", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    case("chunked in HTTP/1.0", b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    // Chunked bodies (re-encoded on the fast path).
    case("a chunk size that is not hex", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\ng\r\nx\r\n0\r\n\r\n", 400),
    case("a negative chunk size", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n", 400),
    case("a chunk size with 0x", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", 400),
    case("a chunk size of 2^64", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n", 400),
    case("a chunk size of 2^60", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n", 400),
    case("chunk data not followed by CRLF", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloX\r\n0\r\n\r\n", 400),
    case("a bare LF after a chunk size", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", 400),
    case("two numbers as a chunk size", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5 5\r\nhello\r\n0\r\n\r\n", 400),
    case("an empty chunk-size line", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\r\n0\r\n\r\n", 400),
    case("a chunk extension without a size", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n;x=1\r\n0\r\n\r\n", 400),
    case("a trailer line ending in a bare LF", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\n\r\n", 400),
    case("a body end that is not CRLF", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\rX", 400),
    Case {
        what: "over 16 KiB of chunk extensions",
        raw: Raw::Repeat {
            head: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;",
            fill: b"x",
            times: 17 * 1024,
            tail: b"\r\nx\r\n0\r\n\r\n",
        },
        status: 400,
    },
    Case {
        what: "over 16 KiB of leading zeros in a chunk size",
        raw: Raw::Repeat {
            head: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            fill: b"0",
            times: 17 * 1024,
            tail: b"1\r\nx\r\n0\r\n\r\n",
        },
        status: 400,
    },
    Case {
        what: "over 16 KiB of trailer fields",
        raw: Raw::Repeat {
            head: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
            fill: b"X-Trailer: 0123456789abcdef\r\n",
            times: 700,
            tail: b"\r\n",
        },
        status: 400,
    },
    // Oversized.
    case("a Content-Length over maxRequestBody", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1025\r\n\r\n", 413),
    case("a Content-Length far over maxRequestBody", b"POST /v1/upload HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775807\r\n\r\n", 413),
    case("a Content-Length over maxRequestBody on the hyper path", b"POST / HTTP/1.0\r\nHost: a\r\nContent-Length: 4096\r\n\r\n", 413),
    Case {
        what: "a chunked body that grows past maxRequestBody",
        raw: Raw::Repeat {
            head: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            fill: b"100\r\n0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\r\n",
            times: 5,
            tail: b"0\r\n\r\n",
        },
        status: 413,
    },
    Case {
        what: "a head of 101 fields",
        raw: Raw::Repeat { head: b"GET / HTTP/1.1\r\nHost: a\r\n", fill: b"X-A: 1\r\n", times: 100, tail: b"\r\n" },
        status: 431,
    },
    Case {
        what: "a head of 1 MiB",
        raw: Raw::Repeat { head: b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ", fill: b"a", times: 1 << 20, tail: b"\r\n\r\n" },
        status: 431,
    },
    Case {
        what: "a request target of 1 MiB",
        raw: Raw::Repeat { head: b"GET /", fill: b"a", times: 1 << 20, tail: b" HTTP/1.1\r\nHost: a\r\n\r\n" },
        status: 431,
    },
    // Paths that cannot be read one way.
    case("an encoded slash", b"GET /v1%2fauth/login HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("an encoded slash in upper case", b"GET /v1%2Fauth/login HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("an encoded slash on the hyper path", b"GET /v1%2Fauth/login HTTP/1.0\r\nHost: a\r\n\r\n", 400),
    case("encoded dot segments with an encoded slash", b"GET /v1/%2e%2e%2fadmin HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a backslash", b"GET /v1/auth\\login HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a backslash on the hyper path", b"GET /v1/auth\\login HTTP/1.0\r\nHost: a\r\n\r\n", 400),
    case("an encoded backslash", b"GET /v1/auth%5Clogin HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("an encoded backslash in lower case", b"GET /v1/auth%5clogin HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("an encoded NUL", b"GET /a%00b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("an encoded NUL on the hyper path", b"GET /a%00b HTTP/1.0\r\nHost: a\r\n\r\n", 400),
    case("a malformed escape", b"GET /a%zz HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a truncated escape", b"GET /a%4 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a percent sign at the end", b"GET /a% HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a truncated escape before the query", b"GET /a%4?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    case("a fragment", b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    // Expectations.
    case("an expectation other than 100-continue", b"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: something-else\r\n\r\n", 417),
    case("two expectations", b"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: 100-continue\r\nExpect: 100-continue\r\n\r\n", 417),
    case("an empty expectation", b"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: \r\n\r\n", 417),
    case("a 100-continue with a parameter", b"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: 100-continue; x=1\r\n\r\n", 417),
];
