//! The chunked transfer coding (RFC 9112 §7.1), scanned rather than decoded: the fast path forwards a
//! chunked body byte for byte and only needs to know where it ends, how much data it carries (for
//! `limits.maxRequestBody`) and that it is well formed. Chunk sizes are hex digits only (at most 15, so
//! no overflow), optionally followed by whitespace and chunk extensions; lines end in CRLF; extensions
//! and trailer fields together may take at most [`MAX_OVERHEAD`] bytes.

/// Most bytes of chunk extensions and trailer fields one body may carry (hyper allows 16 KiB too).
pub const MAX_OVERHEAD: usize = 16 * 1024;

/// Why a chunked body is not well formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// A chunk-size line is not hex digits, optional whitespace and extensions, then CRLF.
    #[error("malformed chunk size line")]
    Size,
    /// A chunk's data is not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    DataEnd,
    /// The trailer section does not end in CRLF lines.
    #[error("malformed trailer section")]
    Trailer,
    /// Chunk extensions and trailers are longer than [`MAX_OVERHEAD`].
    #[error("chunk extensions and trailers over {MAX_OVERHEAD} bytes")]
    TooLong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk size; `digits` so far.
    Size { digits: u8 },
    /// Whitespace after the size.
    SizeSpace,
    /// A chunk extension, up to CR.
    Extension,
    /// LF after a chunk-size line; the chunk's size.
    SizeLf,
    /// Chunk data still to come.
    Data,
    /// CR after chunk data.
    DataCr,
    /// LF after chunk data.
    DataLf,
    /// Start of a trailer line (or the final CRLF).
    TrailerStart,
    /// Inside a trailer field line.
    TrailerLine,
    /// LF ending a trailer field line.
    TrailerLf,
    /// LF ending the body.
    EndLf,
    /// The body is complete.
    Done,
}

/// Where a chunked body is up to.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: State,
    /// The current chunk's size (while reading it) or data still to come (in [`State::Data`]).
    size: u64,
    /// Data bytes seen in all chunks.
    data: u64,
    /// Extension and trailer bytes seen.
    overhead: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size { digits: 0 },
            size: 0,
            data: 0,
            overhead: 0,
        }
    }
}

impl Chunked {
    /// Scans `input`, the next bytes of the body's stream, and returns how many of them belong to the
    /// body: all of them unless the body ends inside `input`.
    pub fn scan(&mut self, input: &[u8]) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < input.len() && self.state != State::Done {
            if self.state == State::Data {
                // Skip data in one step rather than byte by byte.
                let n = usize::try_from(self.size)
                    .unwrap_or(usize::MAX)
                    .min(input.len() - i);
                i += n;
                self.size -= n as u64;
                self.data += n as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            self.step(input[i])?;
            i += 1;
        }
        Ok(i)
    }

    fn step(&mut self, b: u8) -> Result<(), Malformed> {
        self.state = match self.state {
            State::Size { digits } => match hex(b) {
                Some(d) if digits < 15 => {
                    self.size = self.size * 16 + u64::from(d);
                    State::Size { digits: digits + 1 }
                }
                None if digits > 0 => return self.after_size(b),
                _ => return Err(Malformed::Size),
            },
            State::SizeSpace => return self.after_size(b),
            State::Extension => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(Malformed::Size),
                _ => {
                    self.count_overhead()?;
                    State::Extension
                }
            },
            State::SizeLf if b == b'\n' => {
                if self.size == 0 {
                    State::TrailerStart
                } else {
                    State::Data
                }
            }
            State::SizeLf => return Err(Malformed::Size),
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::Size { digits: 0 },
            State::DataCr | State::DataLf => return Err(Malformed::DataEnd),
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                b'\n' => return Err(Malformed::Trailer),
                _ => {
                    self.count_overhead()?;
                    State::TrailerLine
                }
            },
            State::TrailerLine => match b {
                b'\r' => State::TrailerLf,
                b'\n' => return Err(Malformed::Trailer),
                _ => {
                    self.count_overhead()?;
                    State::TrailerLine
                }
            },
            State::TrailerLf if b == b'\n' => State::TrailerStart,
            State::EndLf if b == b'\n' => State::Done,
            State::TrailerLf | State::EndLf => return Err(Malformed::Trailer),
            State::Data | State::Done => unreachable!("handled in scan"),
        };
        Ok(())
    }

    /// A byte after at least one size digit: whitespace, an extension or the end of the line.
    fn after_size(&mut self, b: u8) -> Result<(), Malformed> {
        self.state = match b {
            b' ' | b'\t' => State::SizeSpace,
            b';' => {
                self.count_overhead()?;
                State::Extension
            }
            b'\r' => State::SizeLf,
            _ => return Err(Malformed::Size),
        };
        Ok(())
    }

    fn count_overhead(&mut self) -> Result<(), Malformed> {
        self.overhead += 1;
        if self.overhead > MAX_OVERHEAD {
            return Err(Malformed::TooLong);
        }
        Ok(())
    }

    /// Whether the body is complete (the last chunk and the trailer section have been seen).
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Data bytes seen so far (the body's length once decoded).
    pub fn data_len(&self) -> u64 {
        self.data
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scans `body` fed in pieces of `step` bytes, returning (bytes belonging to the body, done, data).
    fn scan_in_steps(body: &[u8], step: usize) -> Result<(usize, bool, u64), Malformed> {
        let mut c = Chunked::default();
        let mut taken = 0;
        for piece in body.chunks(step) {
            let n = c.scan(piece)?;
            taken += n;
            if n < piece.len() {
                break;
            }
        }
        Ok((taken, c.done(), c.data_len()))
    }

    #[test]
    fn a_body_ends_after_the_last_chunk_and_trailers_however_it_is_split() {
        let body =
            b"5\r\nhello\r\nA;name=value\r\n0123456789\r\n0\r\nx-checksum: 1\r\n\r\nGET / HTTP/1.1\r\n";
        let end = body.len() - b"GET / HTTP/1.1\r\n".len();
        for step in 1..body.len() {
            assert_eq!(scan_in_steps(body, step), Ok((end, true, 15)), "step {step}");
        }
    }

    #[test]
    fn an_empty_body_is_the_last_chunk_alone() {
        assert_eq!(scan_in_steps(b"0\r\n\r\n", 64), Ok((5, true, 0)));
        assert_eq!(scan_in_steps(b"0 ; x\r\n\r\n", 1), Ok((9, true, 0)));
    }

    #[test]
    fn an_unfinished_body_is_not_done() {
        assert_eq!(scan_in_steps(b"5\r\nhel", 64), Ok((6, false, 3)));
        assert_eq!(scan_in_steps(b"0\r\n", 64), Ok((3, false, 0)));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let bad: [(&[u8], Malformed); 8] = [
            (b"\r\n", Malformed::Size),
            (b"g\r\n", Malformed::Size),
            (b"-1\r\n", Malformed::Size),
            (b"5\nhello", Malformed::Size),
            (b"1000000000000000\r\n", Malformed::Size),
            (b"5\r\nhelloX", Malformed::DataEnd),
            (b"0\r\nbad\n", Malformed::Trailer),
            (b"0\r\n\rX", Malformed::Trailer),
        ];
        for (body, want) in bad {
            assert_eq!(
                scan_in_steps(body, 64),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn the_largest_chunk_size_does_not_overflow() {
        let mut c = Chunked::default();
        assert_eq!(c.scan(b"fffffffffffffff\r\n"), Ok(17));
        assert!(!c.done());
    }

    #[test]
    fn extensions_and_trailers_are_bounded() {
        let mut body = b"1;".to_vec();
        body.extend(std::iter::repeat_n(b'x', MAX_OVERHEAD));
        assert_eq!(scan_in_steps(&body, 4096), Err(Malformed::TooLong));
    }
}
