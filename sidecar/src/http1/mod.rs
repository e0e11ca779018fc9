//! The HTTP/1.1 codec both HTTP/1.1 users of the sidecar share: the proxy's fast path (`proxy::h1`,
//! reading the app's responses) and the worker's dispatch to the job handler (`queue::dispatch`). It
//! holds the rules of the protocol and nothing of either user: no sockets, no config, no limiter.
//!
//! Layout: [`response`] (a response head and how its body is delimited), [`fields`] (header fields as
//! spans of the read buffer), [`hop_by_hop`] (the fields that describe one connection, and the tokens of
//! list fields), [`body`] and [`chunked`] (where a body ends, what goes out for it), [`head_scan`] (when
//! a head arriving in pieces is worth parsing again).

pub mod body;
pub mod chunked;
pub mod fields;
pub mod head_scan;
pub mod hop_by_hop;
pub mod response;
