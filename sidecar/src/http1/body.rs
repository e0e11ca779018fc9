//! How a message body is delimited (RFC 9112 §6.3), and a body on its way through: which of the bytes
//! that arrive belong to it, and what goes out for them. A `Content-Length` body goes out as it came; a
//! chunked one is re-encoded ([`super::chunked`]); a body delimited by the app closing its connection goes
//! out chunked, so the client connection stays usable and a body cut short shows as one (no last chunk).

use super::chunked::{Chunked, LAST_CHUNK, Malformed, write_size_line};

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// The chunked transfer coding.
    Chunked,
    /// Everything until the sender closes the connection (responses only).
    UntilClose,
}

/// A `Content-Length` value: 1 to 19 decimal digits, nothing else.
pub fn decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// A body being forwarded.
#[derive(Debug, Clone)]
pub enum Body {
    /// This many bytes still to come.
    Length(u64),
    /// A chunked body (kept when done, so its data length can still be read).
    Chunked(Chunked),
    /// Bytes until the sender closes, sent on chunked.
    UntilClose,
    /// Complete.
    Done,
}

impl Body {
    /// A body delimited by `framing`, none of it forwarded yet.
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => Body::Done,
            Framing::Length(n) => Body::Length(n),
            Framing::Chunked => Body::Chunked(Chunked::default()),
            Framing::UntilClose => Body::UntilClose,
        }
    }

    /// Reads `input`, the next bytes from the sender: appends what goes out for the ones that belong to
    /// the body to `out`, and returns how many belong to it (all of them unless the body ends inside
    /// `input`).
    pub fn take(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Malformed> {
        let n = match self {
            Body::Length(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(input.len());
                out.extend_from_slice(&input[..n]);
                *left -= n as u64;
                if *left == 0 {
                    *self = Body::Done;
                }
                n
            }
            Body::Chunked(c) => c.transcode(input, out)?,
            Body::UntilClose => {
                if !input.is_empty() {
                    write_size_line(out, input.len() as u64);
                    out.extend_from_slice(input);
                    out.extend_from_slice(b"\r\n");
                }
                input.len()
            }
            Body::Done => 0,
        };
        Ok(n)
    }

    /// The sender closed its side: whether that completes the body (it does only for
    /// [`Framing::UntilClose`], whose last chunk then goes onto `out`; anything else was cut short).
    pub fn closed(&mut self, out: &mut Vec<u8>) -> bool {
        match self {
            Body::UntilClose => {
                out.extend_from_slice(LAST_CHUNK);
                *self = Body::Done;
                true
            }
            Body::Done => true,
            Body::Chunked(c) => c.done(),
            Body::Length(_) => false,
        }
    }

    /// Whether the whole body has been forwarded.
    pub fn done(&self) -> bool {
        match self {
            Body::Done => true,
            Body::Chunked(c) => c.done(),
            Body::Length(_) | Body::UntilClose => false,
        }
    }

    /// Data bytes of a chunked body seen so far (0 for other framings).
    pub fn chunked_data(&self) -> u64 {
        match self {
            Body::Chunked(c) => c.data_len(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_plain_decimal_digits() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"1234567890123456789"), Some(1_234_567_890_123_456_789));
        for bad in [&b""[..], b"12a", b"-1", b" 1", b"12345678901234567890"] {
            assert_eq!(decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_length_body_takes_exactly_its_length() {
        let mut b = Body::new(Framing::Length(5));
        let mut out = Vec::new();
        assert_eq!(b.take(b"abc", &mut out), Ok(3));
        assert!(!b.done());
        assert_eq!(b.take(b"deGET", &mut out), Ok(2));
        assert!(b.done());
        assert_eq!(b.take(b"more", &mut out), Ok(0));
        assert_eq!(out, b"abcde");
    }

    #[test]
    fn a_finished_chunked_body_still_knows_its_data_length() {
        let mut b = Body::new(Framing::Chunked);
        let mut out = Vec::new();
        assert_eq!(b.take(b"3\r\nabc\r\n0\r\n\r\nnext", &mut out), Ok(13));
        assert!(b.done());
        assert_eq!(b.chunked_data(), 3);
    }

    #[test]
    fn a_body_delimited_by_close_goes_out_chunked_and_ends_at_the_close() {
        let mut b = Body::new(Framing::UntilClose);
        let mut out = Vec::new();
        assert_eq!(b.take(b"hello", &mut out), Ok(5));
        assert_eq!(b.take(b"", &mut out), Ok(0));
        assert!(!b.done());
        assert!(b.closed(&mut out));
        assert!(b.done());
        assert_eq!(out, b"5\r\nhello\r\n0\r\n\r\n");
    }

    #[test]
    fn only_a_close_delimited_body_is_completed_by_a_close() {
        let mut out = Vec::new();
        assert!(!Body::new(Framing::Length(1)).closed(&mut out));
        assert!(!Body::new(Framing::Chunked).closed(&mut out));
        assert!(out.is_empty());
        assert!(Body::new(Framing::Empty).done());
        assert!(Body::new(Framing::Length(0)).done());
    }
}
