//! The HTTP/1.1 fast path: one task per client connection reads requests with `httparse`, asks
//! [`admit`] for the verdict, and forwards each request and its response over the connection's own
//! kept-alive connection to the app, bodies streamed as they come (a `Content-Length` body as is, chunked
//! ones re-encoded in canonical framing, a body delimited by the app's close sent on chunked). No
//! per-request task, channel, pool or header map: this is where the proxy's CPU per request goes, and it
//! is what nginx does.
//!
//! It takes the common, unambiguous case only (see [`request`]); at any request boundary it can hand the
//! connection, with the bytes already read, to hyper ([`super::fallback`]): h2c, HTTP/1.0, upgrades,
//! `Expect`, odd framing, an h2c app. Between requests it watches the shutdown signal: an idle connection
//! closes at once, an exchange in flight finishes with `Connection: close`. While the app works on a
//! request it watches the client: a client that hangs up drops the app's connection, as hyper does.
//! A request body is sent to the app while listening to it: an app that answers early (and stops
//! reading) gets its answer forwarded, and the client connection is closed after it.
//!
//! Layout: [`request`] (the request heads the fast path takes), [`encode`] (the heads written out),
//! [`app`] (the connection to the app), [`upstream`] (the app's side of an exchange), [`prefixed`] (the
//! hand-off to hyper). Response heads, header fields, body framing and the chunked coding are the
//! sidecar's HTTP/1.1 codec, [`crate::http1`], which the worker's dispatch reads its answers with too.

pub mod app;
pub mod encode;
pub mod prefixed;
pub mod request;
pub mod upstream;

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::{Buf, BytesMut};
use http::{Response, StatusCode};
use sluice_crds::sidecar_config::{ClientTimeouts, UpstreamProtocol};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Sleep,
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use self::{
    app::App,
    encode::Peer,
    prefixed::Prefixed,
    request::{Parsed, RequestHead},
    upstream::{Answer, Client, Failure, pump_response, take},
};
use super::{
    admit::{Admission, Arrival, admit},
    capacity::{Admitted, HEAD_FREE, HeadShare},
    headers::write_quota_lines,
    metrics::Outcome,
    reject::plain,
    state::ProxyState,
    target,
};
use crate::http1::{
    body::{Body, Framing},
    chunked::Chunked,
    fields::{Field, Fields},
    head_scan::HeadScan,
};

/// Read buffer a client connection starts with.
const BUFFER_INITIAL: usize = 4 * 1024;
/// A read while a body streams makes room for at least this much.
const READ_CHUNK: usize = 16 * 1024;
/// A buffer that grew past this is replaced by a small one once it is empty.
const BUFFER_KEEP: usize = 64 * 1024;
/// How long a closing connection keeps reading (and dropping) what the client still sends — the rest of
/// a request that was not read, pipelined requests — so the client reads the last response rather than
/// a reset (nginx's lingering close).
const LINGER_TIME: Duration = Duration::from_secs(5);
/// The most bytes dropped that way.
const LINGER_BYTES: usize = 16 << 20;

/// Serves one client connection until it closes, handing it to hyper when it asks for something the fast
/// path leaves to hyper. Its buffers are allocated once the client sends something, so a connection
/// that only waits costs its task alone. `admitted` (its place under `limits.maxConnections`) goes with
/// the socket.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    stop: CancellationToken,
    admitted: Admitted,
) {
    let timeouts = state.snapshot().effective.config.limits.client_timeouts.clone();
    let mut conn = Connection {
        client: stream,
        buf: BytesMut::new(),
        head_share: state.capacity.head_share(),
        slow_clients: state.metrics.slow_clients.clone(),
        app: None,
        fields: Vec::new(),
        out: Vec::new(),
        scratch: Vec::new(),
        path: String::new(),
        rule_path: String::new(),
        peer: Peer::new(peer.ip()),
        quiet: Quiet::since(Instant::now(), timeouts.request_head.get()),
        timer: Box::pin(tokio::time::sleep(timeouts.request_head.get())),
        timeouts,
    };
    if conn.run(&state, &stop).await == End::HandOff {
        conn.head_share.release();
        let Connection { client, buf, .. } = conn;
        super::fallback::serve(Prefixed::new(buf, client), peer, state, stop, admitted).await;
    }
}

/// One client connection on the fast path.
struct Connection {
    client: TcpStream,
    /// Bytes read from the client and not yet forwarded.
    buf: BytesMut,
    /// What a long request head in `buf` holds of the budget for heads.
    head_share: HeadShare,
    /// `sluice_proxy_slow_clients_total`.
    slow_clients: prometheus_client::metrics::counter::Counter,
    app: Option<App>,
    /// The fields of the head being handled (the request's, then the response's).
    fields: Vec<Field>,
    /// What is being written (a head and the body bytes that came with it, or a piece of a body).
    out: Vec<u8>,
    /// For quota header values.
    scratch: Vec<u8>,
    /// The request path as normalized, when it needed rewriting (see [`super::target`]).
    path: String,
    /// The path as rules read it, when it carried `;parameters`.
    rule_path: String,
    peer: Peer,
    /// How long the connection may stay quiet, counted from when.
    quiet: Quiet,
    /// Fires at the earliest when `quiet` runs out; reset only when it fires early, so a request costs
    /// no timer operation.
    timer: Pin<Box<Sleep>>,
    /// The client timeouts of the config the last exchange ran with.
    timeouts: ClientTimeouts,
}

/// A client connection waiting for a request head: since when, and for how long at most.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    since: Instant,
    allowed: Duration,
}

impl Quiet {
    fn since(since: Instant, allowed: Duration) -> Self {
        Self { since, allowed }
    }

    fn deadline(&self) -> Instant {
        self.since + self.allowed
    }
}

/// How a connection left the fast path.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Closed,
    HandOff,
}

/// What follows an exchange.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The next request.
    Next,
    /// Close the connection (lingering: see [`LINGER_TIME`]).
    Close,
    /// Hand the connection, from this request on, to hyper.
    HandOff,
}

/// What the client connection holds next.
enum Next {
    Head(RequestHead),
    HandOff,
    /// A head no server may accept: the status to answer and why.
    Refused(StatusCode, &'static str),
    Closed,
}

impl Connection {
    async fn run(&mut self, state: &ProxyState, stop: &CancellationToken) -> End {
        let cancelled = stop.cancelled();
        tokio::pin!(cancelled);
        loop {
            let timeouts = self.timeouts.clone();
            let head = match self.next_head(cancelled.as_mut(), &timeouts).await {
                Next::Head(head) => head,
                Next::HandOff => return End::HandOff,
                Next::Refused(status, why) => {
                    if status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
                        state.metrics.slow_clients.inc();
                    }
                    self.refuse_unread(state, status, why, false).await;
                    self.linger().await;
                    return End::Closed;
                }
                Next::Closed => return End::Closed,
            };
            let step = self.exchange(state, head).await;
            self.head_share.release();
            match step {
                Step::Next => {
                    self.trim_buffers();
                    // Bytes of the next request already here: its head is under way.
                    let allowed = if self.buf.is_empty() {
                        timeouts.idle
                    } else {
                        timeouts.request_head
                    };
                    self.quiet = Quiet::since(Instant::now(), allowed.get());
                }
                Step::Close => {
                    self.linger().await;
                    return End::Closed;
                }
                Step::HandOff => return End::HandOff,
            }
        }
    }

    /// Reads until a whole request head is buffered; `None` when the client closes, shutdown begins or
    /// the connection stayed quiet too long (idle between requests, or a head arriving too slowly).
    async fn next_head(
        &mut self,
        mut cancelled: Pin<&mut WaitForCancellationFuture<'_>>,
        timeouts: &ClientTimeouts,
    ) -> Next {
        // A head that arrives in pieces is parsed again only once a piece could settle it.
        let mut scan = HeadScan::default();
        loop {
            if scan.due(&self.buf, request::MAX_HEAD) {
                match request::parse(&self.buf, &mut self.fields) {
                    Parsed::Head(head) => return Next::Head(head),
                    Parsed::HandOff(why) => {
                        tracing::trace!(why, "handing the connection to hyper");
                        return Next::HandOff;
                    }
                    Parsed::Refused(status, why) => return Next::Refused(status, why),
                    Parsed::Partial => {}
                }
            }
            scan.seen(&self.buf);
            let was_empty = self.buf.is_empty();
            let read = tokio::select! {
                biased;
                read = read_when_ready(&mut self.client, &mut self.buf, BUFFER_INITIAL) => read,
                () = cancelled.as_mut() => return Next::Closed,
                () = self.timer.as_mut() => {
                    let deadline = self.quiet.deadline();
                    if Instant::now() >= deadline {
                        tracing::debug!(waited = ?self.quiet.allowed, "closing a client connection that stayed quiet");
                        if !was_empty {
                            self.slow_clients.inc();
                        }
                        return Next::Closed;
                    }
                    // Never further out than a head may take, so a head that starts meanwhile is still
                    // held to its own deadline (checked here when the timer fires).
                    let latest = Instant::now() + timeouts.request_head.get();
                    self.timer.as_mut().reset(deadline.min(latest).into());
                    continue;
                }
            };
            if !matches!(read, Ok(n) if n > 0) {
                return Next::Closed;
            }
            if was_empty {
                // The first byte of a head: it must be whole within `requestHead` from now.
                self.quiet = Quiet::since(Instant::now(), timeouts.request_head.get());
            }
            // A head longer than a connection's own share draws on the budget for heads, by what its
            // buffer holds.
            let held = if self.buf.len() > HEAD_FREE {
                self.buf.capacity()
            } else {
                0
            };
            if !self.head_share.cover(held) {
                return Next::Refused(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "a long request head while the memory kept for heads is taken",
                );
            }
        }
    }

    /// One request and its response.
    async fn exchange(&mut self, state: &ProxyState, head: RequestHead) -> Step {
        let snap = state.snapshot();
        let limits = &snap.effective.config.limits;
        self.timeouts.clone_from(&limits.client_timeouts);
        if limits.upstream_protocol == UpstreamProtocol::H2c {
            return Step::HandOff;
        }
        let buf = &self.buf[..];
        let raw_path = head.path(buf);
        let rewritten = match target::normalize_path(raw_path, &limits.paths, &mut self.path) {
            Ok(rewritten) => rewritten,
            Err(why) => {
                return self
                    .refuse_unread(state, StatusCode::BAD_REQUEST, why, head.is_head())
                    .await;
            }
        };
        let path = if rewritten { self.path.as_str() } else { raw_path };
        let rule_path = match target::without_params(path, &limits.paths, &mut self.rule_path) {
            Ok(true) => self.rule_path.as_str(),
            Ok(false) => path,
            Err(why) => {
                return self
                    .refuse_unread(state, StatusCode::BAD_REQUEST, why, head.is_head())
                    .await;
            }
        };
        let admission = {
            let fields = Fields::new(buf, &self.fields);
            let arrival = Arrival {
                method: &head.method,
                path: rule_path,
                host: head.host(buf),
                headers: &fields,
                content_length: match head.framing {
                    Framing::Length(n) => Some(n),
                    _ => None,
                },
            };
            admit(state, &snap, self.peer.ip, &arrival).await
        };
        let verdict = match admission {
            Admission::Forward(verdict) => verdict,
            Admission::Refuse(resp) => return self.refuse(&head, &resp).await,
        };

        let peer_trusted = limits
            .client_ip
            .trusted_proxies
            .iter()
            .any(|n| n.contains(&self.peer.ip));
        self.out.clear();
        encode::request_head(
            &mut self.out,
            &self.buf,
            &head,
            rewritten.then_some(self.path.as_str()),
            &self.fields,
            &self.peer,
            peer_trusted,
        );
        self.buf.advance(head.len);
        // The body bytes already read go out with the head.
        let mut body = Body::new(head.framing);
        match take(&mut body, &self.buf, &mut self.out, limits.max_request_body) {
            Ok(n) => self.buf.advance(n),
            Err(failure) => return self.failed(state, failure, &head, &body).await,
        }

        let started = Instant::now();
        let retryable = body.done() && head.retryable();
        let client = Client {
            io: &mut self.client,
            buf: &mut self.buf,
            fields: &mut self.fields,
            out: &mut self.out,
            timeouts: &self.timeouts,
        };
        let answer = upstream::send(
            &mut self.app,
            &snap.upstream_authority,
            client,
            &mut body,
            upstream::Request {
                max_body: limits.max_request_body,
                retryable,
                head_request: head.is_head(),
                expect_continue: head.expect_continue,
            },
        )
        .await;
        state
            .metrics
            .upstream_latency
            .observe(started.elapsed().as_secs_f64());
        let Answer {
            head: response,
            sent_all,
        } = match answer {
            Ok(answer) => answer,
            Err(failure) => return self.failed(state, failure, &head, &body).await,
        };
        let Some(app) = self.app.as_mut() else {
            return Step::Close;
        };

        // A request body not read in full (the app answered early) leaves the client connection out of
        // step; one not sent in full, the app connection.
        let close = head.close || state.draining() || !body.done();
        self.out.clear();
        encode::response_head(&mut self.out, &app.buf, &response, &self.fields);
        if let Some(quota) = &verdict.quota {
            write_quota_lines(&mut self.out, &mut self.scratch, quota, &limits.headers);
        }
        if close {
            self.out.extend_from_slice(b"connection: close\r\n");
        }
        self.out.extend_from_slice(b"\r\n");
        app.buf.advance(response.len);
        let mut response_body = Body::new(response.framing);
        match response_body.take(&app.buf, &mut self.out) {
            Ok(n) => app.buf.advance(n),
            Err(_) => {
                // Nothing has reached the client yet.
                let invalid = Failure::Invalid("malformed chunked body");
                return self.failed(state, invalid, &head, &body).await;
            }
        }
        state.metrics.request(Outcome::Forwarded);
        let send = self.timeouts.send.get();
        if let Err(e) = write_all_within(&mut self.client, &self.out, send).await {
            self.count_if_slow(&e);
            self.app = None;
            return Step::Close;
        }
        if !response_body.done()
            && let Err(e) = pump_response(
                app,
                &mut self.client,
                &mut self.buf,
                &mut response_body,
                &mut self.out,
                send,
            )
            .await
        {
            self.count_if_slow(&e);
            // Cut short (by either side): the client sees the connection close before the body ends.
            self.app = None;
            return Step::Close;
        }
        if response.keep_alive && sent_all && app.buf.is_empty() {
            app.reused = true;
        } else {
            self.app = None;
        }
        if close { Step::Close } else { Step::Next }
    }

    /// Answers a request that cannot be read one way (`status` 400, or 417 for an unknown expectation)
    /// before any of its body is read; the connection closes after it (lingering: the client may be
    /// sending the body).
    async fn refuse_unread(
        &mut self,
        state: &ProxyState,
        status: StatusCode,
        why: &'static str,
        head_request: bool,
    ) -> Step {
        tracing::debug!(why, %status, "refusing a request");
        state.metrics.request(Outcome::BadRequest);
        let resp = plain(status, status.canonical_reason().unwrap_or("Bad Request"));
        self.out.clear();
        encode::own_response(&mut self.out, &resp, true, head_request);
        let _ = write_all_within(&mut self.client, &self.out, self.timeouts.send.get()).await;
        Step::Close
    }

    /// Answers a request admission refused; the connection stays open if the request's body was read
    /// with it (and so can be skipped).
    async fn refuse(&mut self, head: &RequestHead, resp: &Response<bytes::Bytes>) -> Step {
        let after_head = &self.buf[head.len..];
        let skip = match head.framing {
            Framing::Empty => Some(0),
            Framing::Length(n) => usize::try_from(n).ok().filter(|&n| n <= after_head.len()),
            Framing::Chunked => {
                let mut c = Chunked::default();
                let mut dropped = Vec::new();
                c.transcode(after_head, &mut dropped).ok().filter(|_| c.done())
            }
            Framing::UntilClose => None,
        };
        let close = skip.is_none() || head.close;
        self.out.clear();
        encode::own_response(&mut self.out, resp, close, head.is_head());
        if let Some(n) = skip {
            self.buf.advance(head.len + n);
        }
        let send = self.timeouts.send.get();
        if write_all_within(&mut self.client, &self.out, send).await.is_err() || close {
            return Step::Close;
        }
        Step::Next
    }

    /// Answers a request that got no response from the app, or whose body was refused on the way: 502,
    /// or 413/400 for a chunked body over the limit or malformed. The connection stays open only if the
    /// whole request was read.
    async fn failed(
        &mut self,
        state: &ProxyState,
        failure: Failure,
        head: &RequestHead,
        body: &Body,
    ) -> Step {
        self.app = None;
        let resp = match &failure {
            Failure::ClientGone => return Step::Close,
            Failure::TooLarge => {
                state.metrics.request(Outcome::TooLarge);
                plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large")
            }
            Failure::Malformed(_) => {
                state.metrics.request(Outcome::BadRequest);
                plain(StatusCode::BAD_REQUEST, "Bad Request")
            }
            Failure::ClientSlow => {
                self.slow_clients.inc();
                state.metrics.request(Outcome::BadRequest);
                plain(StatusCode::REQUEST_TIMEOUT, "Request Timeout")
            }
            _ => {
                state.metrics.upstream_errors.inc();
                state.metrics.request(Outcome::UpstreamError);
                tracing::debug!(error = %failure, "upstream request failed");
                plain(StatusCode::BAD_GATEWAY, "Bad Gateway")
            }
        };
        let close = !body.done() || head.close;
        self.out.clear();
        encode::own_response(&mut self.out, &resp, close, head.is_head());
        let send = self.timeouts.send.get();
        if write_all_within(&mut self.client, &self.out, send).await.is_err() || close {
            return Step::Close;
        }
        Step::Next
    }

    /// Closes the connection: the app connection at once; the client connection once the response is
    /// complete (FIN) and what the client still sends has been read and dropped for a while, so it reads
    /// the response rather than a reset.
    /// Whatever the buffers grew to is given back first: what is dropped needs little room, and many
    /// connections may be closing at once (a flood of long heads refused).
    async fn linger(&mut self) {
        self.app = None;
        self.head_share.release();
        self.buf = BytesMut::with_capacity(BUFFER_INITIAL);
        self.out = Vec::new();
        let _ = self.client.shutdown().await;
        let mut dropped = 0;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            while dropped < LINGER_BYTES {
                self.buf.clear();
                match self.client.read_buf(&mut self.buf).await {
                    Ok(n) if n > 0 => dropped += n,
                    _ => break,
                }
            }
        })
        .await;
    }

    /// Counts a client connection closed for not taking its response within `clientTimeouts.send`.
    fn count_if_slow(&self, e: &io::Error) {
        if e.kind() == io::ErrorKind::TimedOut {
            self.slow_clients.inc();
        }
    }

    /// Gives back memory a large body made the buffers grow to.
    fn trim_buffers(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > BUFFER_KEEP {
            self.buf = BytesMut::with_capacity(BUFFER_INITIAL);
        }
        if self.out.capacity() > BUFFER_KEEP {
            self.out = Vec::with_capacity(BUFFER_INITIAL);
        }
        if let Some(app) = &mut self.app
            && app.buf.is_empty()
            && app.buf.capacity() > BUFFER_KEEP
        {
            app.buf = BytesMut::with_capacity(app::BUFFER_INITIAL);
        }
    }
}

/// Reads what the client sent into `buf` once there is something to read, making room for at least
/// `at_least` bytes only then: a connection that waits holds no buffer.
///
/// The read itself goes through `AsyncRead` rather than `try_read_buf`: a read that fills less than the
/// room it had tells tokio the socket is drained (epoll is edge-triggered), so the next wait for the
/// client — while the app works, or for the next request — costs no `recv` that only finds nothing.
async fn read_when_ready(client: &mut TcpStream, buf: &mut BytesMut, at_least: usize) -> io::Result<usize> {
    client.readable().await?;
    make_room(buf, at_least);
    client.read_buf(buf).await
}

/// Writes all of `bytes` to the client, failing with `TimedOut` when it takes none of them for `limit`
/// (`clientTimeouts.send`; nginx's `send_timeout`). What the socket takes at once — nearly always all of
/// it — costs no timer.
pub(crate) async fn write_all_within(
    client: &mut TcpStream,
    mut bytes: &[u8],
    limit: Duration,
) -> io::Result<()> {
    while !bytes.is_empty() {
        match client.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    while !bytes.is_empty() {
        let n = tokio::time::timeout(limit, client.write(bytes))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

/// Makes room in `buf` for a read of at least `at_least` bytes.
pub(crate) fn make_room(buf: &mut BytesMut, at_least: usize) {
    if buf.capacity() - buf.len() < at_least / 4 {
        buf.reserve(at_least);
    }
}
