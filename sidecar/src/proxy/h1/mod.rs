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
//! Layout: [`request`] and [`response`] (heads and their framing), [`fields`] (header fields as spans of
//! the read buffer), [`body`] and [`chunked`] (where a body ends, what goes out for it), [`encode`] (the
//! heads written out), [`app`] (the connection to the app), [`prefixed`] (the hand-off to hyper).

pub mod app;
pub mod body;
pub mod chunked;
pub mod encode;
pub mod fields;
pub mod prefixed;
pub mod request;
pub mod response;

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::{Buf, BytesMut};
use http::{Response, StatusCode, uri::Authority};
use sluice_crds::sidecar_config::UpstreamProtocol;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use self::{
    app::App,
    body::{Body, Framing},
    chunked::Chunked,
    encode::Peer,
    fields::{Field, Fields},
    prefixed::Prefixed,
    request::{Parsed, RequestHead},
    response::ResponseHead,
};
use super::{
    admit::{Admission, Arrival, admit},
    app_connection::AppError,
    headers::write_quota_lines,
    metrics::Outcome,
    reject::plain,
    state::ProxyState,
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
const LINGER_TIME: Duration = Duration::from_secs(2);
/// The most bytes dropped that way.
const LINGER_BYTES: usize = 1 << 20;

/// Serves one client connection until it closes, handing it to hyper when it asks for something the fast
/// path leaves to hyper.
pub async fn serve(stream: TcpStream, peer: SocketAddr, state: Arc<ProxyState>, stop: CancellationToken) {
    let mut conn = Connection {
        client: stream,
        buf: BytesMut::with_capacity(BUFFER_INITIAL),
        app: None,
        fields: Vec::with_capacity(16),
        out: Vec::with_capacity(BUFFER_INITIAL),
        scratch: Vec::new(),
        peer: Peer::new(peer.ip()),
    };
    if conn.run(&state, &stop).await == End::HandOff {
        let Connection { client, buf, .. } = conn;
        super::fallback::serve(Prefixed::new(buf, client), peer, state, stop).await;
    }
}

/// One client connection on the fast path.
struct Connection {
    client: TcpStream,
    /// Bytes read from the client and not yet forwarded.
    buf: BytesMut,
    app: Option<App>,
    /// The fields of the head being handled (the request's, then the response's).
    fields: Vec<Field>,
    /// What is being written (a head and the body bytes that came with it, or a piece of a body).
    out: Vec<u8>,
    /// For quota header values.
    scratch: Vec<u8>,
    peer: Peer,
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

/// Why a request got no response from the app.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Connect(#[from] AppError),
    #[error("sending the request to the app: {0}")]
    Send(io::Error),
    /// The app said something (an early answer, or a close) before it had the whole request.
    #[error("the app answered before it had the whole request")]
    AnsweredEarly,
    #[error("the app closed the connection before answering")]
    NoResponse,
    #[error("reading the response from the app: {0}")]
    Receive(io::Error),
    #[error("the app's response is not valid: {0}")]
    Invalid(&'static str),
    /// The client closed its connection before the response.
    #[error("the client went away mid-request")]
    ClientGone,
    #[error("the request body is not valid chunked coding: {0}")]
    Malformed(chunked::Malformed),
    #[error("the request body is over limits.maxRequestBody")]
    TooLarge,
}

impl Connection {
    async fn run(&mut self, state: &ProxyState, stop: &CancellationToken) -> End {
        let cancelled = stop.cancelled();
        tokio::pin!(cancelled);
        loop {
            let head = match self.next_head(cancelled.as_mut()).await {
                Next::Head(head) => head,
                Next::HandOff => return End::HandOff,
                Next::Closed => return End::Closed,
            };
            match self.exchange(state, head, stop).await {
                Step::Next => self.trim_buffers(),
                Step::Close => {
                    self.linger().await;
                    return End::Closed;
                }
                Step::HandOff => return End::HandOff,
            }
        }
    }

    /// Reads until a whole request head is buffered (or the client closes, or shutdown begins).
    async fn next_head(&mut self, mut cancelled: Pin<&mut WaitForCancellationFuture<'_>>) -> Next {
        loop {
            if !self.buf.is_empty() {
                match request::parse(&self.buf, &mut self.fields) {
                    Parsed::Head(head) => return Next::Head(head),
                    Parsed::HandOff(why) => {
                        tracing::trace!(why, "handing the connection to hyper");
                        return Next::HandOff;
                    }
                    Parsed::Partial => {}
                }
            }
            make_room(&mut self.buf, BUFFER_INITIAL);
            let read = tokio::select! {
                biased;
                read = self.client.read_buf(&mut self.buf) => read,
                () = cancelled.as_mut() => return Next::Closed,
            };
            if !matches!(read, Ok(n) if n > 0) {
                return Next::Closed;
            }
        }
    }

    /// One request and its response.
    async fn exchange(&mut self, state: &ProxyState, head: RequestHead, stop: &CancellationToken) -> Step {
        let snap = state.snapshot();
        let limits = &snap.effective.config.limits;
        if limits.upstream_protocol == UpstreamProtocol::H2c {
            return Step::HandOff;
        }
        let admission = {
            let buf = &self.buf[..];
            let fields = Fields {
                buf,
                list: &self.fields,
            };
            let arrival = Arrival {
                method: &head.method,
                path: head.path(buf),
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
        let response = self
            .send(
                &snap.upstream_authority,
                &mut body,
                retryable,
                head.is_head(),
                limits.max_request_body,
            )
            .await;
        state
            .metrics
            .upstream_latency
            .observe(started.elapsed().as_secs_f64());
        let response = match response {
            Ok(response) => response,
            Err(failure) => return self.failed(state, failure, &head, &body).await,
        };
        let Some(app) = self.app.as_mut() else {
            return Step::Close;
        };

        // A request body the app did not take in full (it answered early) leaves both connections out
        // of step.
        let close = head.close || stop.is_cancelled() || !body.done();
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
        if self.client.write_all(&self.out).await.is_err() {
            self.app = None;
            return Step::Close;
        }
        if !response_body.done()
            && pump_response(app, &mut self.client, &mut response_body, &mut self.out)
                .await
                .is_err()
        {
            // Cut short (by either side): the client sees the connection close before the body ends.
            self.app = None;
            return Step::Close;
        }
        if response.keep_alive && body.done() && app.buf.is_empty() {
            app.reused = true;
        } else {
            self.app = None;
        }
        if close { Step::Close } else { Step::Next }
    }

    /// Sends the request (the head and the body bytes in `out`, the rest of the body still to come from
    /// the client) and reads the app's final response head, forwarding interim (1xx) ones, while
    /// watching for the client to hang up. A request that met a kept-alive connection the app had closed,
    /// with no byte of answer, is sent once more on a fresh one if `retryable`.
    async fn send(
        &mut self,
        authority: &Authority,
        body: &mut Body,
        retryable: bool,
        head_request: bool,
        max_body: u64,
    ) -> Result<ResponseHead, Failure> {
        let mut retried = false;
        loop {
            let app = app_for(&mut self.app, authority).await?;
            let retry = app.reused && retryable && !retried;
            match write_unless_answered(app, &self.out).await {
                Ok(()) => {}
                Err(Failure::Send(_)) if retry => {
                    self.app = None;
                    retried = true;
                    continue;
                }
                // It spoke first: read what it said.
                Err(Failure::AnsweredEarly) => {}
                Err(failure) => return Err(failure),
            }
            if !body.done() && app.buf.is_empty() {
                match pump_request(
                    &mut self.client,
                    &mut self.buf,
                    app,
                    body,
                    &mut self.out,
                    max_body,
                )
                .await
                {
                    Ok(()) | Err(Failure::AnsweredEarly) => {}
                    Err(failure) => return Err(failure),
                }
            }
            let (mut client_in, mut client_out) = self.client.split();
            let head = tokio::select! {
                biased;
                head = read_final_head(app, &mut client_out, &mut self.fields, &mut self.out, head_request) => head,
                () = hang_up(&mut client_in, &mut self.buf) => Err(Failure::ClientGone),
            };
            match head {
                Err(Failure::NoResponse) if retry => {
                    self.app = None;
                    retried = true;
                }
                head => return head,
            }
        }
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
        if self.client.write_all(&self.out).await.is_err() || close {
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
        if self.client.write_all(&self.out).await.is_err() || close {
            return Step::Close;
        }
        Step::Next
    }

    /// Closes the connection: the response is complete (FIN), then what the client still sends is read
    /// and dropped for a while, so it reads the response rather than a reset.
    async fn linger(&mut self) {
        let _ = self.client.shutdown().await;
        let mut dropped = 0;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            while dropped < LINGER_BYTES {
                self.buf.clear();
                make_room(&mut self.buf, READ_CHUNK);
                match self.client.read_buf(&mut self.buf).await {
                    Ok(n) if n > 0 => dropped += n,
                    _ => break,
                }
            }
        })
        .await;
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

/// What the client connection holds next.
enum Next {
    Head(RequestHead),
    HandOff,
    Closed,
}

/// Makes room in `buf` for a read of at least `at_least` bytes.
fn make_room(buf: &mut BytesMut, at_least: usize) {
    if buf.capacity() - buf.len() < at_least / 4 {
        buf.reserve(at_least);
    }
}

/// Reads `input` into the request `body` (what goes out onto `out`), checking a chunked body against
/// `max`; returns how many bytes of `input` it took.
fn take(body: &mut Body, input: &[u8], out: &mut Vec<u8>, max: u64) -> Result<usize, Failure> {
    let n = body.take(input, out).map_err(Failure::Malformed)?;
    if body.chunked_data() > max {
        return Err(Failure::TooLarge);
    }
    Ok(n)
}

/// The connection to the app at `authority`: the kept-alive one unless the app closed it meanwhile (or
/// a reload moved the app), else a new one.
async fn app_for<'a>(slot: &'a mut Option<App>, authority: &Authority) -> Result<&'a mut App, Failure> {
    if slot
        .as_mut()
        .is_some_and(|app| !app.is_for(authority) || app.closed_while_idle())
    {
        *slot = None;
    }
    if slot.is_none() {
        *slot = Some(App::connect(authority).await?);
    }
    Ok(slot.as_mut().expect("set above"))
}

/// Writes `bytes` to the app unless the app speaks first: bytes from it (an early answer, kept in
/// `app.buf`) or its close end the write with [`Failure::AnsweredEarly`], so an app that answers an
/// upload early and stops reading cannot leave the write waiting forever.
async fn write_unless_answered(app: &mut App, mut bytes: &[u8]) -> Result<(), Failure> {
    loop {
        // Nearly always the socket takes everything at once, without waiting on either readiness.
        match app.io.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Failure::Send(e)),
        }
        if bytes.is_empty() {
            return Ok(());
        }
        tokio::select! {
            biased;
            ready = app.io.readable() => {
                ready.map_err(Failure::Send)?;
                make_room(&mut app.buf, app::BUFFER_INITIAL);
                match app.io.try_read_buf(&mut app.buf) {
                    Ok(_) => return Err(Failure::AnsweredEarly),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(Failure::Send(e)),
                }
            }
            ready = app.io.writable() => ready.map_err(Failure::Send)?,
        }
    }
}

/// Streams the rest of a request body from the client to the app (`out` is scratch space).
async fn pump_request(
    client: &mut TcpStream,
    buf: &mut BytesMut,
    app: &mut App,
    body: &mut Body,
    out: &mut Vec<u8>,
    max: u64,
) -> Result<(), Failure> {
    while !body.done() {
        if buf.is_empty() {
            make_room(buf, READ_CHUNK);
            match client.read_buf(buf).await {
                Ok(n) if n > 0 => {}
                _ => return Err(Failure::ClientGone),
            }
        }
        out.clear();
        let n = take(body, buf, out, max)?;
        buf.advance(n);
        write_unless_answered(app, out).await?;
    }
    Ok(())
}

/// Resolves when the client closes its connection (or it fails). What the client sends meanwhile —
/// pipelined requests — is kept in `buf`; past [`request::MAX_HEAD`] of it, reading stops (and so does
/// watching).
async fn hang_up(client: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) {
    while buf.len() < request::MAX_HEAD {
        make_room(buf, BUFFER_INITIAL);
        if !matches!(client.read_buf(buf).await, Ok(n) if n > 0) {
            return;
        }
    }
    std::future::pending().await
}

/// Reads the app's final response head into `app.buf` (its fields into `fields`), forwarding interim
/// (1xx) responses to the client as they come.
async fn read_final_head(
    app: &mut App,
    client: &mut (impl AsyncWrite + Unpin),
    fields: &mut Vec<Field>,
    out: &mut Vec<u8>,
    head_request: bool,
) -> Result<ResponseHead, Failure> {
    let mut read_any = !app.buf.is_empty();
    loop {
        if !app.buf.is_empty() {
            match response::parse(&app.buf, fields, head_request) {
                response::Parsed::Head(head) if head.interim() => {
                    out.clear();
                    encode::response_head(out, &app.buf, &head, fields);
                    out.extend_from_slice(b"\r\n");
                    app.buf.advance(head.len);
                    client.write_all(out).await.map_err(|_| Failure::ClientGone)?;
                    continue;
                }
                response::Parsed::Head(head) => return Ok(head),
                response::Parsed::Invalid(why) => return Err(Failure::Invalid(why)),
                response::Parsed::Partial => {}
            }
        }
        make_room(&mut app.buf, app::BUFFER_INITIAL);
        match app.io.read_buf(&mut app.buf).await {
            Ok(0) if read_any => return Err(Failure::Invalid("closed mid-head")),
            Ok(0) => return Err(Failure::NoResponse),
            Ok(_) => read_any = true,
            Err(e) if !read_any && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Failure::NoResponse);
            }
            Err(e) => return Err(Failure::Receive(e)),
        }
    }
}

/// Streams the rest of a response body from the app to the client (`out` is scratch space).
async fn pump_response(
    app: &mut App,
    client: &mut TcpStream,
    body: &mut Body,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    while !body.done() {
        out.clear();
        if app.buf.is_empty() {
            make_room(&mut app.buf, READ_CHUNK);
            if app.io.read_buf(&mut app.buf).await? == 0 {
                if !body.closed(out) {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                client.write_all(out).await?;
                return Ok(());
            }
        }
        let n = body
            .take(&app.buf, out)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        app.buf.advance(n);
        client.write_all(out).await?;
    }
    Ok(())
}
