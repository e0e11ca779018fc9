//! How a message body is delimited (RFC 9112 §6.3) and how far the fast path has forwarded it.

use super::chunked::{Chunked, Malformed};

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

/// A body being forwarded: which of the bytes that arrive belong to it, and whether it is complete.
#[derive(Debug, Clone)]
pub enum Body {
    /// This many bytes still to come.
    Length(u64),
    /// A chunked body.
    Chunked(Chunked),
    /// Bytes until the sender closes.
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

    /// How many of `input`, the next bytes from the sender, belong to this body (all of them unless it
    /// ends inside `input`); they count as forwarded.
    pub fn take(&mut self, input: &[u8]) -> Result<usize, Malformed> {
        let n = match self {
            Body::Length(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(input.len());
                *left -= n as u64;
                if *left == 0 {
                    *self = Body::Done;
                }
                n
            }
            // A chunked body stays here when done, so its data length can still be read.
            Body::Chunked(c) => c.scan(input)?,
            Body::UntilClose => input.len(),
            Body::Done => 0,
        };
        Ok(n)
    }

    /// The sender closed its side: whether that completes the body (it does only for
    /// [`Framing::UntilClose`]; anything else was cut short).
    pub fn closed(&mut self) -> bool {
        match self {
            Body::UntilClose | Body::Done => {
                *self = Body::Done;
                true
            }
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
    fn a_length_body_takes_exactly_its_length() {
        let mut b = Body::new(Framing::Length(5));
        assert_eq!(b.take(b"abc"), Ok(3));
        assert!(!b.done());
        assert_eq!(b.take(b"deGET"), Ok(2));
        assert!(b.done());
        assert_eq!(b.take(b"more"), Ok(0));
    }

    #[test]
    fn a_finished_chunked_body_still_knows_its_data_length() {
        let mut b = Body::new(Framing::Chunked);
        assert_eq!(b.take(b"3\r\nabc\r\n0\r\n\r\nnext"), Ok(13));
        assert!(b.done());
        assert_eq!(b.chunked_data(), 3);
    }

    #[test]
    fn only_a_close_delimited_body_is_completed_by_a_close() {
        assert!(Body::new(Framing::UntilClose).closed());
        assert!(!Body::new(Framing::Length(1)).closed());
        assert!(!Body::new(Framing::Chunked).closed());
        assert!(Body::new(Framing::Empty).done());
        assert!(Body::new(Framing::Length(0)).done());
    }
}
