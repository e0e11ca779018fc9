//! The chunked transfer coding as the fast path re-encodes it (request bodies on their way to the app).
//!
//! Properties, beyond "never panics":
//! - any bytes, fed in any pieces, give the same result as fed at once (the same bytes taken, the same
//!   output, the same error): where a read boundary falls never changes what the app receives;
//! - a body that completes comes out canonical: re-encoding the output gives the output, and it carries
//!   the same data;
//! - encode-then-decode is the identity: any data, framed with every liberty the coding allows (leading
//!   zeros, either case, whitespace, extensions, trailers) and split anywhere, comes out as exactly the
//!   canonical encoding of that data.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sluice_sidecar::http1::chunked::{Chunked, LAST_CHUNK, Malformed, write_size_line};

#[derive(Arbitrary, Debug)]
struct Input {
    /// Bytes as a client may send them.
    raw: Vec<u8>,
    /// Where reads end (sizes of the pieces, cycled).
    splits: Vec<u8>,
    /// A well-formed body.
    chunks: Vec<Chunk>,
    trailers: Vec<Trailer>,
}

#[derive(Arbitrary, Debug)]
struct Chunk {
    data: Vec<u8>,
    zeros: u8,
    upper: bool,
    space: u8,
    extension: Option<Token>,
}

#[derive(Arbitrary, Debug)]
struct Trailer {
    name: Token,
    value: Token,
}

/// Visible ASCII without CR or LF, at most 64 bytes.
#[derive(Arbitrary, Debug)]
struct Token(Vec<u8>);

impl Token {
    fn bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.0.iter().take(64).map(|b| b' ' + 1 + b % 94)
    }
}

/// The result of transcoding `input` in pieces of the sizes `splits` gives (cycled; 0 means 1).
fn in_pieces(input: &[u8], splits: &[u8]) -> (usize, Vec<u8>, Result<(), Malformed>, Chunked) {
    let mut c = Chunked::default();
    let (mut out, mut taken, mut at, mut i) = (Vec::new(), 0, 0, 0);
    while at < input.len() && !c.done() {
        let step = splits
            .get(i % splits.len().max(1))
            .map_or(input.len(), |&s| usize::from(s).max(1));
        i += 1;
        let end = (at + step).min(input.len());
        match c.transcode(&input[at..end], &mut out) {
            Ok(n) => {
                taken += n;
                if n < end - at {
                    break;
                }
                at = end;
            }
            Err(e) => return (taken, out, Err(e), c),
        }
    }
    (taken, out, Ok(()), c)
}

fuzz_target!(|input: Input| {
    // Any bytes: pieces never matter.
    let mut whole = Chunked::default();
    let mut whole_out = Vec::new();
    let whole_result = whole.transcode(&input.raw, &mut whole_out);
    let (taken, out, result, pieces) = in_pieces(&input.raw, &input.splits);
    match whole_result {
        Ok(n) => {
            assert_eq!(result, Ok(()));
            assert_eq!(taken, n);
            assert!(n <= input.raw.len());
            assert_eq!(pieces.done(), whole.done());
            assert_eq!(pieces.data_len(), whole.data_len());
        }
        Err(e) => assert_eq!(result, Err(e)),
    }
    assert_eq!(out, whole_out, "what reaches the app depends on where reads end");
    if whole.done() {
        canonical(&whole_out, whole.data_len());
    }

    // A well-formed body: encode, then decode, is the identity.
    let (mut wire, mut data) = (Vec::new(), Vec::<u8>::new());
    for chunk in input.chunks.iter().filter(|c| !c.data.is_empty()).take(64) {
        wire.extend(std::iter::repeat_n(b'0', usize::from(chunk.zeros % 4)));
        let size = if chunk.upper {
            format!("{:X}", chunk.data.len())
        } else {
            format!("{:x}", chunk.data.len())
        };
        wire.extend(size.bytes());
        wire.extend_from_slice([&b""[..], b" ", b"\t", b" \t "][usize::from(chunk.space % 4)]);
        if let Some(ext) = &chunk.extension {
            wire.push(b';');
            wire.extend(ext.bytes());
        }
        wire.extend(b"\r\n");
        wire.extend(&chunk.data);
        wire.extend(b"\r\n");
        data.extend(&chunk.data);
    }
    wire.extend(b"0\r\n");
    for t in input.trailers.iter().take(16) {
        wire.extend(t.name.bytes().filter(|&b| b != b':'));
        wire.extend(b"x: ");
        wire.extend(t.value.bytes());
        wire.extend(b"\r\n");
    }
    wire.extend(b"\r\n");
    let body_len = wire.len();
    wire.extend(b"GET /next HTTP/1.1\r\n");
    let (taken, out, result, c) = in_pieces(&wire, &input.splits);
    assert_eq!(result, Ok(()), "{:?}", String::from_utf8_lossy(&wire));
    assert!(c.done());
    assert_eq!(
        taken, body_len,
        "the body ends where it ends, not before or after"
    );
    assert_eq!(c.data_len(), data.len() as u64);
    assert_eq!(decode(&out), data, "decoding the output gives the data sent");
    canonical(&out, data.len() as u64);
});

/// `out` is a complete canonical body: transcoding it gives it back, whole.
fn canonical(out: &[u8], data_len: u64) {
    let mut c = Chunked::default();
    let mut again = Vec::new();
    assert_eq!(c.transcode(out, &mut again), Ok(out.len()));
    assert!(c.done());
    assert_eq!(c.data_len(), data_len);
    assert_eq!(again, out, "the output is not canonical");
    assert!(out.ends_with(LAST_CHUNK));
}

/// The data of a canonical chunked body (lower-case hex sizes, no extensions, no trailers).
fn decode(mut body: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").expect("a size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap(), 16).unwrap();
        let mut line = Vec::new();
        write_size_line(&mut line, size as u64);
        assert_eq!(&body[..line_end + 2], &line[..], "size lines are canonical");
        body = &body[line_end + 2..];
        if size == 0 {
            assert_eq!(body, b"\r\n");
            return data;
        }
        data.extend(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}
