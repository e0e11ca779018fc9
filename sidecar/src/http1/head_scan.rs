//! When a head that arrives in pieces is worth parsing again, for every reader of heads.

/// How far a head that arrives in pieces has been looked at (a request from a client, a response from
/// the app or a job handler), so that it is parsed again only once a piece could settle it
/// (`worth_parsing`) instead of on every read.
#[derive(Default)]
pub(crate) struct HeadScan {
    /// Bytes of the buffer looked at so far.
    scanned: usize,
    /// Whether the head's first line had ended in them.
    line_ended: bool,
}

impl HeadScan {
    /// Whether `buf` holds something and is worth parsing now; `max_head` is the most a head may take.
    pub(crate) fn due(&self, buf: &[u8], max_head: usize) -> bool {
        !buf.is_empty() && worth_parsing(buf, self.scanned, self.line_ended, max_head)
    }

    /// `buf` has been looked at to its end without a whole head; it only grows until the next call (a
    /// buffer that lost its front starts a new `HeadScan`).
    pub(crate) fn seen(&mut self, buf: &[u8]) {
        self.line_ended |= buf[self.scanned..].contains(&b'\n');
        self.scanned = buf.len();
    }
}

/// Whether `buf`, of which the first `scanned` bytes were parsed before without a whole head (its first
/// line had ended in them when `line_ended`), is worth parsing again: the first line just ended (a
/// malformed request line is handed to hyper at once, to answer 400; a malformed status line is
/// refused), the blank line that ends a head arrived (a bare-LF one too, for the parser to refuse), or
/// `max_head`, the most a head may take. So a head that trickles in (a request from a client, a response
/// from the app or a job handler) is parsed a few times, not once per read, and each call looks at the
/// new bytes only: parsing it again on every read would cost time quadratic in its length.
fn worth_parsing(buf: &[u8], scanned: usize, line_ended: bool, max_head: usize) -> bool {
    // The blank line may straddle the old and the new bytes.
    let new = &buf[scanned.saturating_sub(2)..];
    scanned == 0
        || buf.len() >= max_head
        || (!line_ended && buf[scanned..].contains(&b'\n'))
        || new.windows(2).any(|w| w == b"\n\n")
        || new.windows(3).any(|w| w == b"\n\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head limit (the proxy's, for request heads).
    const MAX_HEAD: usize = 64 * 1024;

    #[test]
    fn a_head_arriving_in_pieces_is_parsed_again_only_once_it_could_be_settled() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut line_ended = false;
        let mut parses = Vec::new();
        for end in 1..=head.len() {
            if worth_parsing(&head[..end], end - 1, line_ended, MAX_HEAD) {
                parses.push(end);
            }
            line_ended |= head[end - 1] == b'\n';
        }
        assert_eq!(
            parses,
            [1, 16, head.len()],
            "the first byte, the request line, the blank line"
        );
        // A blank line split across reads still counts.
        let max = MAX_HEAD;
        assert!(worth_parsing(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 26, true, max));
        assert!(worth_parsing(b"GET / HTTP/1.1\nHost: a\n\n", 24, true, max));
        assert!(!worth_parsing(b"GET / HTTP/1.1\r\nHost: a\r\nX", 27, true, max));
        // At the most a head may take, it is parsed (and refused) whatever it holds.
        assert!(worth_parsing(b"GET / HTTP/1.1\r\nHost: a\r\nX", 25, true, 20));
    }
}
