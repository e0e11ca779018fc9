//! The chunked transfer coding (RFC 9112 §7.1), re-encoded on the way through: each chunk leaves with a
//! plain hex size line, its extensions dropped, and the body ends `0\r\n\r\n` with its trailer section
//! dropped (as hyper does). So whatever quirks a sender puts in its framing — leading zeros, whitespace,
//! extensions, trailer lines that look like fields or requests — never reach the receiver, whose chunked
//! parser sees only canonical framing. Data is copied as is.
//!
//! What is accepted: chunk sizes of hex digits only (at most 15 after leading zeros, so no overflow),
//! optionally followed by whitespace and chunk extensions; lines ending in CRLF; at most [`MAX_OVERHEAD`]
//! bytes of leading zeros, whitespace, extensions and trailer lines per body.

/// Most bytes of whitespace, chunk extensions and trailer lines one body may carry (hyper allows 16 KiB
/// of extensions too).
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
    /// Whitespace, chunk extensions and trailers are longer than [`MAX_OVERHEAD`].
    #[error("chunk extensions and trailers over {MAX_OVERHEAD} bytes")]
    TooLong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk size; `seen`: at least one digit.
    Size { seen: bool },
    /// Whitespace after the size.
    SizeSpace,
    /// A chunk extension, up to CR.
    Extension,
    /// LF after a chunk-size line.
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
    /// The current chunk's size (while reading it) or its data still to come (in [`State::Data`]).
    size: u64,
    /// Data bytes seen in all chunks.
    data: u64,
    /// Whitespace, extension and trailer bytes seen.
    overhead: usize,
    /// Whether the chunk framing goes out with the data (a proxy's re-encoding) or only the data (a
    /// reader of the body's content).
    reencode: bool,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size { seen: false },
            size: 0,
            data: 0,
            overhead: 0,
            reencode: true,
        }
    }
}

impl Chunked {
    /// A chunked body whose data alone goes out: [`Chunked::transcode`] appends what the chunks carry,
    /// without their framing.
    pub fn decoder() -> Self {
        Self {
            reencode: false,
            ..Self::default()
        }
    }

    /// Reads `input`, the next bytes of the body's stream, appending the body re-encoded (for a
    /// [`Chunked::decoder`], its data only) to `out`, and returns how many bytes of `input` belong to the
    /// body: all of them unless it ends inside `input`.
    pub fn transcode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < input.len() && self.state != State::Done {
            if self.state == State::Data {
                // Data in one step rather than byte by byte.
                let n = usize::try_from(self.size)
                    .unwrap_or(usize::MAX)
                    .min(input.len() - i);
                out.extend_from_slice(&input[i..i + n]);
                i += n;
                self.size -= n as u64;
                self.data += n as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            self.step(input[i], out)?;
            i += 1;
        }
        Ok(i)
    }

    fn step(&mut self, b: u8, out: &mut Vec<u8>) -> Result<(), Malformed> {
        self.state = match self.state {
            State::Size { seen } => match hex(b) {
                Some(d) => {
                    // At most 15 significant digits (below 2^60), so the size never overflows.
                    if self.size >= 1 << 56 {
                        return Err(Malformed::Size);
                    }
                    // Leading zeros add nothing but length, which is bounded like whitespace.
                    if seen && self.size == 0 {
                        self.count_overhead()?;
                    }
                    self.size = self.size * 16 + u64::from(d);
                    State::Size { seen: true }
                }
                None if seen => return self.after_size(b),
                None => return Err(Malformed::Size),
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
                    if self.reencode {
                        write_size_line(out, self.size);
                    }
                    State::Data
                }
            }
            State::SizeLf => return Err(Malformed::Size),
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => {
                if self.reencode {
                    out.extend_from_slice(b"\r\n");
                }
                State::Size { seen: false }
            }
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
            State::EndLf if b == b'\n' => {
                if self.reencode {
                    out.extend_from_slice(LAST_CHUNK);
                }
                State::Done
            }
            State::TrailerLf | State::EndLf => return Err(Malformed::Trailer),
            State::Data | State::Done => unreachable!("handled in transcode"),
        };
        Ok(())
    }

    /// A byte after at least one size digit: whitespace, an extension or the end of the line.
    fn after_size(&mut self, b: u8) -> Result<(), Malformed> {
        self.state = match b {
            b' ' | b'\t' => {
                self.count_overhead()?;
                State::SizeSpace
            }
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

/// The last chunk and an empty trailer section: how every chunked body ends on its way out.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes a chunk-size line for `size` bytes of data.
pub fn write_size_line(out: &mut Vec<u8>, size: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = size;
    loop {
        i -= 1;
        digits[i] = HEX[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
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

    /// Transcodes `body` fed in pieces of `step` bytes: (bytes belonging to the body, done, data, out).
    fn in_steps(body: &[u8], step: usize) -> Result<(usize, bool, u64, String), Malformed> {
        let mut c = Chunked::default();
        let mut taken = 0;
        let mut out = Vec::new();
        for piece in body.chunks(step) {
            let n = c.transcode(piece, &mut out)?;
            taken += n;
            if n < piece.len() {
                break;
            }
        }
        Ok((taken, c.done(), c.data_len(), String::from_utf8(out).unwrap()))
    }

    #[test]
    fn a_body_leaves_in_canonical_framing_however_it_came_and_was_split() {
        let body = b"0005 \t;name=\"v\"\r\nhello\r\nA;x\r\n0123456789\r\n0\r\nx-checksum: 1\r\nX-Forwarded-For: 6.6.6.6\r\n\r\nGET / HTTP/1.1\r\n";
        let end = body.len() - b"GET / HTTP/1.1\r\n".len();
        for step in 1..body.len() {
            assert_eq!(
                in_steps(body, step),
                Ok((end, true, 15, "5\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n".into())),
                "step {step}"
            );
        }
    }

    #[test]
    fn an_empty_body_is_the_last_chunk_alone() {
        assert_eq!(in_steps(b"0\r\n\r\n", 64), Ok((5, true, 0, "0\r\n\r\n".into())));
        assert_eq!(
            in_steps(b"0 ; x\r\n\r\n", 1),
            Ok((9, true, 0, "0\r\n\r\n".into()))
        );
    }

    #[test]
    fn an_unfinished_body_is_not_done() {
        assert_eq!(in_steps(b"5\r\nhel", 64), Ok((6, false, 3, "5\r\nhel".into())));
        assert_eq!(in_steps(b"0\r\n", 64), Ok((3, false, 0, String::new())));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let bad: [(&[u8], Malformed); 9] = [
            (b"\r\n", Malformed::Size),
            (b"g\r\n", Malformed::Size),
            (b"-1\r\n", Malformed::Size),
            (b"5\nhello", Malformed::Size),
            (b"5 5\r\n", Malformed::Size),
            (b"1000000000000000\r\n", Malformed::Size),
            (b"5\r\nhelloX", Malformed::DataEnd),
            (b"0\r\nbad\n", Malformed::Trailer),
            (b"0\r\n\rX", Malformed::Trailer),
        ];
        for (body, want) in bad {
            assert_eq!(
                in_steps(body, 64).map(|r| r.0),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn leading_zeros_do_not_count_against_the_size_but_are_bounded() {
        assert_eq!(
            in_steps(b"0000000000000005\r\nhello\r\n0\r\n\r\n", 3),
            Ok((30, true, 5, "5\r\nhello\r\n0\r\n\r\n".into()))
        );
        let mut zeros = vec![b'0'; MAX_OVERHEAD + 2];
        zeros.extend(b"1\r\n");
        assert_eq!(in_steps(&zeros, 4096).map(|r| r.0), Err(Malformed::TooLong));
    }

    #[test]
    fn the_largest_chunk_size_does_not_overflow() {
        let mut c = Chunked::default();
        let mut out = Vec::new();
        assert_eq!(c.transcode(b"fffffffffffffff\r\n", &mut out), Ok(17));
        assert_eq!(out, b"fffffffffffffff\r\n");
        assert!(!c.done());
    }

    #[test]
    fn whitespace_extensions_and_trailers_are_bounded() {
        for filler in [&b" "[..], b";"] {
            let mut body = b"1".to_vec();
            body.extend(std::iter::repeat_n(filler[0], MAX_OVERHEAD + 1));
            assert_eq!(in_steps(&body, 4096).map(|r| r.0), Err(Malformed::TooLong));
        }
        let mut body = b"0\r\n".to_vec();
        body.extend(std::iter::repeat_n(b'x', MAX_OVERHEAD + 1));
        assert_eq!(in_steps(&body, 4096).map(|r| r.0), Err(Malformed::TooLong));
    }

    /// Random well-formed chunked bodies, decorated in every way the coding allows and fed in random
    /// pieces, always come out as the canonical encoding of the same data; random bytes never panic.
    #[test]
    fn random_bodies_come_out_canonical_and_random_bytes_never_panic() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(0x5eed);
        for _ in 0..500 {
            let (mut wire, mut canonical, mut data_len) = (Vec::new(), Vec::new(), 0u64);
            for _ in 0..rng.random_range(0..5) {
                let data: Vec<u8> = (0..rng.random_range(1..300)).map(|_| rng.random()).collect();
                let zeros = "0".repeat(rng.random_range(0..3));
                let size = if rng.random() {
                    format!("{zeros}{:x}", data.len())
                } else {
                    format!("{zeros}{:X}", data.len())
                };
                let space = [" ", "\t", " \t", ""][rng.random_range(0..4)];
                let ext = [";a=b", ";q=\"x y\"", ""][rng.random_range(0..3)];
                wire.extend(format!("{size}{space}{ext}\r\n").bytes());
                wire.extend(&data);
                wire.extend(b"\r\n");
                write_size_line(&mut canonical, data.len() as u64);
                canonical.extend(&data);
                canonical.extend(b"\r\n");
                data_len += data.len() as u64;
            }
            wire.extend(b"0\r\n");
            for _ in 0..rng.random_range(0..3) {
                wire.extend(b"x-trailer: some value\r\n");
            }
            wire.extend(b"\r\n");
            canonical.extend(LAST_CHUNK);
            let body_len = wire.len();
            wire.extend(b"NEXT");

            let mut c = Chunked::default();
            let (mut out, mut taken, mut at) = (Vec::new(), 0, 0);
            while at < wire.len() && !c.done() {
                let end = (at + rng.random_range(1..64)).min(wire.len());
                taken += c.transcode(&wire[at..end], &mut out).unwrap();
                at = end;
            }
            assert!(c.done());
            assert_eq!((taken, c.data_len()), (body_len, data_len));
            assert_eq!(out, canonical);
        }
        for _ in 0..2_000 {
            let alphabet = b"0123456789abcdefABCDEF \t;=\"\r\nxX:";
            let bytes: Vec<u8> = (0..rng.random_range(0..200))
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let mut c = Chunked::default();
            let mut out = Vec::new();
            if let Ok(n) = c.transcode(&bytes, &mut out) {
                assert!(n <= bytes.len());
            }
        }
    }

    #[test]
    fn size_lines_are_lower_case_hex() {
        for (n, want) in [
            (0, "0\r\n"),
            (10, "a\r\n"),
            (4096, "1000\r\n"),
            (u64::MAX, "ffffffffffffffff\r\n"),
        ] {
            let mut out = Vec::new();
            write_size_line(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }

    #[test]
    fn a_decoder_hands_out_the_data_without_the_framing() {
        let body = b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\nnext";
        for step in [1, 3, body.len()] {
            let mut c = Chunked::decoder();
            let mut out = Vec::new();
            let mut taken = 0;
            for piece in body.chunks(step) {
                taken += c.transcode(piece, &mut out).unwrap();
            }
            assert_eq!(out, b"hello world", "in pieces of {step}");
            assert_eq!(taken, body.len() - 4, "in pieces of {step}");
            assert!(c.done());
            assert_eq!(c.data_len(), 11);
        }
    }
}
