//! A response head (the app's, for the proxy's fast path; the job handler's, for the worker's dispatch),
//! and how its body is delimited (RFC 9112 §6.3). The peer is trusted less than it might be: a response
//! whose framing has more than one reading is invalid (a 502 from the proxy), never guessed at.

use super::{
    body::{Framing, decimal},
    fields::{Field, MAX_FIELDS, Span},
    hop_by_hop::{has_token, tokens},
};

/// The longest response head read (hyper's limit: big `Set-Cookie` or CSP fields fit).
pub const MAX_HEAD: usize = 408 * 1024;

/// A parsed response head. Its spans point into the buffer it was parsed from.
#[derive(Debug)]
pub struct ResponseHead {
    /// Length of the head in bytes.
    pub len: usize,
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: Span,
    /// How the body is delimited (for the request it answers).
    pub framing: Framing,
    /// `Transfer-Encoding`, forwarded as sent when the body is passed through in its coding.
    pub transfer_encoding: Option<Span>,
    /// Whether the app keeps the connection open for another request.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// An interim (1xx) response: the final one follows.
    pub fn interim(&self) -> bool {
        (100..200).contains(&self.status)
    }
}

/// What the bytes read so far hold.
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole head yet: read more.
    Partial,
    /// A whole head; its fields are in the list passed to [`parse`].
    Head(ResponseHead),
    /// Not a response that can be read one way (the reason, for logs).
    Invalid(&'static str),
}

/// Parses the response head at the start of `buf` (answering a `HEAD` request when `head_request`),
/// recording its fields in `fields`.
pub fn parse(buf: &[u8], fields: &mut Vec<Field>, head_request: bool) -> Parsed {
    // Most responses have a few fields: parse with room for 24 first (httparse wants the slots zeroed),
    // and with room for all only when that is not enough.
    let mut few = [httparse::EMPTY_HEADER; 24];
    let mut resp = httparse::Response::new(&mut few);
    match resp.parse(buf) {
        Err(httparse::Error::TooManyHeaders) => {
            let mut all = [httparse::EMPTY_HEADER; MAX_FIELDS];
            let mut resp = httparse::Response::new(&mut all);
            let parsed = resp.parse(buf);
            read(buf, fields, head_request, &resp, parsed)
        }
        parsed => read(buf, fields, head_request, &resp, parsed),
    }
}

/// Reads a parse of `buf` into a [`Parsed`].
fn read(
    buf: &[u8],
    fields: &mut Vec<Field>,
    head_request: bool,
    resp: &httparse::Response<'_, '_>,
    parsed: httparse::Result<usize>,
) -> Parsed {
    fields.clear();
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Parsed::Invalid("head too long"),
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Invalid("not a valid HTTP/1.x response head"),
    };
    let (Some(version), Some(status), Some(reason)) = (resp.version, resp.code, resp.reason) else {
        return Parsed::Invalid("no status line");
    };
    if status < 100 {
        return Parsed::Invalid("status below 100");
    }
    if status == 101 {
        // Neither reader asks for an upgrade, so the peer has nothing to switch to.
        return Parsed::Invalid("101 to a request that asked for no upgrade");
    }
    let mut keep_alive = version == 1;
    let mut length: Option<Option<u64>> = None;
    let mut transfer_encoding = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        fields.push(Field::of(buf, h));
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = decimal(h.value);
            if length.is_some_and(|earlier| earlier != n) || n.is_none() {
                return Parsed::Invalid("invalid or conflicting Content-Length");
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if transfer_encoding.is_some() {
                return Parsed::Invalid("Transfer-Encoding given twice");
            }
            transfer_encoding = Some(Span::within(buf, h.value));
            chunked = tokens(h.value)
                .last()
                .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            if has_token(h.value, "close") {
                keep_alive = false;
            } else if version == 0 && has_token(h.value, "keep-alive") {
                keep_alive = true;
            }
        }
    }
    let interim = (100..200).contains(&status);
    let framing = if interim || head_request || status == 204 || status == 304 {
        Framing::Empty
    } else if transfer_encoding.is_some() {
        if length.is_some() || version == 0 {
            // Transfer-Encoding wins (RFC 9112 §6.3), but a connection that carried both, or carried it in
            // HTTP/1.0, has faulty framing and is not reused (§6.1).
            keep_alive = false;
        }
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match length {
            Some(Some(n)) => Framing::Length(n),
            _ => Framing::UntilClose,
        }
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    Parsed::Head(ResponseHead {
        len,
        status,
        reason: Span::within(buf, reason.as_bytes()),
        framing,
        transfer_encoding,
        keep_alive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str, head_request: bool) -> ResponseHead {
        match parse(raw.as_bytes(), &mut Vec::new(), head_request) {
            Parsed::Head(h) => h,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn bodies_are_framed_as_rfc_9112_says() {
        let r = |extra: &str| head(&format!("HTTP/1.1 200 OK\r\n{extra}\r\n"), false);
        assert_eq!(r("Content-Length: 19\r\n").framing, Framing::Length(19));
        assert_eq!(r("Transfer-Encoding: chunked\r\n").framing, Framing::Chunked);
        assert_eq!(
            r("Transfer-Encoding: gzip, chunked\r\n").framing,
            Framing::Chunked
        );
        assert_eq!(r("Transfer-Encoding: gzip\r\n").framing, Framing::UntilClose);
        assert_eq!(r("").framing, Framing::UntilClose);
        assert!(!r("").keep_alive);
        assert!(r("Content-Length: 1\r\nContent-Length: 1\r\n").keep_alive);
        let both = r("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n");
        assert_eq!(both.framing, Framing::Chunked);
        assert!(!both.keep_alive);
    }

    #[test]
    fn head_no_content_not_modified_and_interim_responses_have_no_body() {
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).framing,
            Framing::Empty
        );
        assert_eq!(
            head("HTTP/1.1 204 No Content\r\n\r\n", false).framing,
            Framing::Empty
        );
        assert_eq!(
            head("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", false).framing,
            Framing::Empty
        );
        let early = head("HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n", false);
        assert!(early.interim());
        assert_eq!(early.framing, Framing::Empty);
    }

    #[test]
    fn transfer_encoding_in_http_1_0_is_processed_but_the_connection_not_reused() {
        let r = head(
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        );
        assert_eq!(r.framing, Framing::Chunked);
        assert!(!r.keep_alive);
    }

    #[test]
    fn a_response_with_many_fields_is_read_whole() {
        let many: String = (0..60).map(|i| format!("X-Field-{i}: {i}\r\n")).collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{many}Content-Length: 2\r\n\r\nok");
        let mut fields = Vec::new();
        let Parsed::Head(h) = parse(raw.as_bytes(), &mut fields, false) else {
            panic!()
        };
        assert_eq!((fields.len(), h.framing), (61, Framing::Length(2)));
        let too_many: String = (0..MAX_FIELDS + 1).map(|i| format!("X-{i}: 1\r\n")).collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{too_many}\r\n");
        assert!(matches!(
            parse(raw.as_bytes(), &mut fields, false),
            Parsed::Invalid(_)
        ));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        assert!(
            !head(
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                false
            )
            .keep_alive
        );
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false).keep_alive);
        assert!(
            head(
                "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                false
            )
            .keep_alive
        );
    }

    #[test]
    fn ambiguous_responses_are_invalid() {
        for raw in [
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            "HTTP/2 200\r\n\r\n",
            "HTTP/1.1 099 Odd\r\n\r\n",
            "nonsense\r\n\r\n",
        ] {
            assert!(
                matches!(parse(raw.as_bytes(), &mut Vec::new(), false), Parsed::Invalid(_)),
                "{raw:?}"
            );
        }
    }
}
