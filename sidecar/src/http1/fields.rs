//! Header fields as the HTTP/1.1 readers keep them: byte ranges into the connection's read buffer, so a
//! parsed head borrows nothing and allocates nothing; [`Fields`] reads them back, and tells which of them
//! a proxy does not forward (hop-by-hop fields and those `Connection` names).

use std::ops::Range;

use super::hop_by_hop::{dropped, is_hop_by_hop};

/// Most header fields a head may have (as hyper: more is handed to hyper, which answers 431).
pub const MAX_FIELDS: usize = 100;

/// A byte range of the buffer a head was parsed from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// The span of `part`, a subslice of `buf`.
    pub fn within(buf: &[u8], part: &[u8]) -> Self {
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        debug_assert!(start + part.len() <= buf.len());
        Self {
            start: start as u32,
            end: (start + part.len()) as u32,
        }
    }

    /// The bytes of this span in `buf`.
    pub fn of<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.range()]
    }

    /// The span as a range.
    pub fn range(&self) -> Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// One header field: its name and value.
#[derive(Clone, Copy, Debug, Default)]
pub struct Field {
    /// The name, as sent.
    pub name: Span,
    /// The value, without surrounding whitespace.
    pub value: Span,
}

impl Field {
    /// Records the field `h`, parsed from `buf`.
    pub fn of(buf: &[u8], h: &httparse::Header<'_>) -> Self {
        Self {
            name: Span::within(buf, h.name.as_bytes()),
            value: Span::within(buf, h.value),
        }
    }

    /// Whether this field is named `name` (ASCII, any case).
    pub fn is(&self, buf: &[u8], name: &str) -> bool {
        self.name.of(buf).eq_ignore_ascii_case(name.as_bytes())
    }
}

/// The fields of one head, read against the buffer it was parsed from.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    /// The buffer.
    pub buf: &'a [u8],
    /// The fields, in order.
    pub list: &'a [Field],
    /// Where the head's `Connection` field is, found once so that asking whether a field is dropped does
    /// not walk every field again.
    connection: Connection,
}

/// The `Connection` fields of a head.
#[derive(Clone, Copy, Debug)]
enum Connection {
    None,
    One(Span),
    /// Several `Connection` fields (rare): asking walks the fields.
    Many,
}

impl<'a> Fields<'a> {
    /// The fields `list` of a head parsed from `buf`.
    pub fn new(buf: &'a [u8], list: &'a [Field]) -> Self {
        let mut connection = Connection::None;
        for f in list.iter().filter(|f| f.is(buf, "connection")) {
            connection = match connection {
                Connection::None => Connection::One(f.value),
                _ => Connection::Many,
            };
        }
        Self {
            buf,
            list,
            connection,
        }
    }

    /// Whether a field named `name` is dropped on the way to the app (hop-by-hop, or named by
    /// `Connection`).
    pub fn dropped(self, name: &[u8]) -> bool {
        match self.connection {
            Connection::None => is_hop_by_hop(name),
            Connection::One(value) => dropped(name, std::iter::once(value.of(self.buf))),
            Connection::Many => dropped(name, self.values("connection")),
        }
    }

    /// The values of the fields named `name`, in order.
    pub fn values<'n>(self, name: &'n str) -> impl DoubleEndedIterator<Item = &'a [u8]> + use<'a, 'n> {
        self.list
            .iter()
            .filter(move |f| f.is(self.buf, name))
            .map(move |f| f.value.of(self.buf))
    }
}
