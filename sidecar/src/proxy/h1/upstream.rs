//! The app's side of an exchange: sending the request — its body streamed from the client while the
//! app is listened to, so interim responses are forwarded and an early final answer stops the upload —
//! then reading the final response head while watching for the client to hang up, then streaming the
//! response body (still watching). The client is held to `clientTimeouts`: `body` between two pieces of
//! a request body it sends, `send` for each write of the response it has to take. No timeout applies
//! while the app works or streams.

use std::{io, pin::Pin, time::Duration};

use bytes::{Buf, BytesMut};
use http::uri::Authority;
use sluice_crds::sidecar_config::ClientTimeouts;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
    time::{Instant, Sleep},
};

use super::{
    BUFFER_INITIAL, READ_CHUNK,
    app::{self, App},
    encode, make_room, request, write_all_within,
};
use crate::{
    http1::{
        body::Body,
        chunked,
        fields::Field,
        head_scan::HeadScan,
        response::{self, ResponseHead},
    },
    proxy::app_connection::AppError,
};

/// Why a request got no response from the app.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// No connection to the app.
    #[error(transparent)]
    Connect(#[from] AppError),
    /// The app closed the connection (or reset it) before answering.
    #[error("the app closed the connection before answering")]
    NoResponse,
    /// Reading the response failed.
    #[error("reading the response from the app: {0}")]
    Receive(io::Error),
    /// The app's response cannot be forwarded.
    #[error("the app's response is not valid: {0}")]
    Invalid(&'static str),
    /// The client closed its connection before the response.
    #[error("the client went away mid-request")]
    ClientGone,
    /// The request body breaks the chunked coding.
    #[error("the request body is not valid chunked coding: {0}")]
    Malformed(chunked::Malformed),
    /// The request body grew past `limits.maxRequestBody`.
    #[error("the request body is over limits.maxRequestBody")]
    TooLarge,
    /// The client sent no part of its request body for `clientTimeouts.body`, or took no part of an
    /// interim response for `clientTimeouts.send`.
    #[error("the client kept the proxy waiting longer than limits.clientTimeouts allow")]
    ClientSlow,
}

/// The app's final response head, and whether it came before the app had the whole request.
#[derive(Debug)]
pub struct Answer {
    /// The final response head (in `app.buf`, its fields in the field list).
    pub head: ResponseHead,
    /// Every byte of the request reached the app. Otherwise the app connection is out of step and must
    /// not carry another request.
    pub sent_all: bool,
}

/// What one client connection lends the app's side of an exchange.
pub struct Client<'a> {
    /// The client connection.
    pub io: &'a mut TcpStream,
    /// Bytes read from the client and not yet forwarded.
    pub buf: &'a mut BytesMut,
    /// The fields of the head being handled.
    pub fields: &'a mut Vec<Field>,
    /// Write space: holds the request head and body bytes sent with it on entry.
    pub out: &'a mut Vec<u8>,
    /// The client timeouts in force.
    pub timeouts: &'a ClientTimeouts,
}

/// How sending a request ended.
enum Sent {
    /// Every byte went out.
    All,
    /// The app's final answer arrived first; the rest was not sent.
    Answered(ResponseHead),
    /// Writing failed (the app closed or reset the connection): what it said, if anything, is still to
    /// be read.
    Cut,
}

/// What [`send`] needs to know about the request beyond its bytes.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// `limits.maxRequestBody`, checked against a chunked body as it comes.
    pub max_body: u64,
    /// The request may be sent once more on a fresh connection (see [`send`]).
    pub retryable: bool,
    /// It is a `HEAD` request (its response has no body).
    pub head_request: bool,
    /// The client sent `Expect: 100-continue` (forwarded to the app): see `upload`.
    pub expect_continue: bool,
}

/// How long a client that expects `100 Continue` waits for the app's own before the proxy sends one (for
/// apps that read the body without ever answering 100; curl waits as long before sending anyway).
pub const EXPECT_CONTINUE_WAIT: Duration = Duration::from_secs(1);

/// Sends the request in `client.out` (the head and body bytes already read), the rest of `body` as the
/// client sends it, to the app at `authority` over the kept-alive connection in `slot` (or a new one),
/// and reads the app's final answer, forwarding interim (1xx) ones. A request that met a kept-alive
/// connection the app had closed, and got no byte back, is sent once more on a fresh one if
/// `req.retryable` (its body wholly in `out`).
pub async fn send(
    slot: &mut Option<App>,
    authority: &Authority,
    mut client: Client<'_>,
    body: &mut Body,
    req: Request,
) -> Result<Answer, Failure> {
    let head_request = req.head_request;
    let mut retried = false;
    loop {
        let app = app_for(slot, authority).await?;
        let retry = app.reused && req.retryable && !retried;
        let sent = upload(app, &mut client, body, &req).await?;
        let sent_all = match sent {
            Sent::Answered(head) => {
                return Ok(Answer {
                    head,
                    sent_all: false,
                });
            }
            Sent::All => true,
            Sent::Cut => false,
        };
        let Client {
            io,
            buf,
            fields,
            timeouts,
            ..
        } = &mut client;
        let send = timeouts.send.get();
        let (mut client_in, mut client_out) = io.split();
        let head = tokio::select! {
            biased;
            head = read_final_head(app, &mut client_out, fields, head_request, send) => head,
            () = hang_up(&mut client_in, buf) => Err(Failure::ClientGone),
        };
        match head {
            Err(Failure::NoResponse) if retry => {
                *slot = None;
                retried = true;
            }
            head => return head.map(|head| Answer { head, sent_all }),
        }
    }
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

/// Writes `out` to the app, then the rest of `body` as the client sends it (through `out` again), while
/// listening to the app: interim responses are forwarded to the client as they come, a final one ends
/// the upload ([`Sent::Answered`]). Nearly always `out` is the whole request and the socket takes it at
/// once, without waiting on anything.
///
/// With `Expect: 100-continue` the client sends the body only after a `100`: the app's own is forwarded
/// (so an app that answers at once — 401, 413 — gets its answer to the client before a byte of the body
/// moves, and the connections close after it); if neither the app's answer nor the body has come within
/// [`EXPECT_CONTINUE_WAIT`], the proxy sends the `100` itself.
async fn upload(
    app: &mut App,
    client: &mut Client<'_>,
    body: &mut Body,
    req: &Request,
) -> Result<Sent, Failure> {
    let Client {
        io: client,
        buf,
        fields,
        out,
        timeouts,
    } = client;
    let (max_body, head_request) = (req.max_body, req.head_request);
    let (between_reads, send) = (timeouts.body.get(), timeouts.send.get());
    // Armed only for a client waiting for 100 (rare), so other requests set no timer.
    let mut continue_timer = (req.expect_continue && !body.done() && buf.is_empty())
        .then(|| Box::pin(tokio::time::sleep(EXPECT_CONTINUE_WAIT)));
    // Armed once the proxy waits for the client's body (a body that came with its head sets none), and
    // pushed back by every piece that arrives.
    let mut body_timer: Option<Pin<Box<Sleep>>> = None;
    let mut client_clock = false;
    let mut written = 0;
    loop {
        while written < out.len() {
            match app.io.try_write(&out[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return Ok(Sent::Cut),
            }
        }
        if written == out.len() {
            if body.done() {
                return Ok(Sent::All);
            }
            if !buf.is_empty() {
                out.clear();
                written = 0;
                let n = take(body, buf, out, max_body)?;
                buf.advance(n);
                continue;
            }
        }
        let waiting_for_client = written == out.len();
        // The client's clock runs only while the proxy waits for the client (not for the app).
        match (&mut body_timer, waiting_for_client) {
            (None, true) => body_timer = Some(Box::pin(tokio::time::sleep(between_reads))),
            (Some(t), true) if !client_clock => t.as_mut().reset(Instant::now() + between_reads),
            _ => {}
        }
        client_clock = waiting_for_client;
        let (mut client_in, mut client_out) = client.split();
        tokio::select! {
            biased;
            ready = app.io.readable() => {
                if ready.is_err() {
                    return Ok(Sent::Cut);
                }
                make_room(&mut app.buf, app::BUFFER_INITIAL);
                match app.io.try_read_buf(&mut app.buf) {
                    Ok(0) => return Ok(Sent::Cut),
                    Ok(_) => {
                        continue_timer = None;
                        if let Some(head) =
                            forward_interim(app, &mut client_out, fields, head_request, send).await?
                        {
                            return Ok(Sent::Answered(head));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return Ok(Sent::Cut),
                }
            }
            ready = app.io.writable(), if written < out.len() => {
                if ready.is_err() {
                    return Ok(Sent::Cut);
                }
            }
            read = client_in.read_buf(buf), if waiting_for_client => {
                if !matches!(read, Ok(n) if n > 0) {
                    return Err(Failure::ClientGone);
                }
                continue_timer = None;
                if let Some(t) = body_timer.as_mut() {
                    t.as_mut().reset(Instant::now() + between_reads);
                }
            }
            () = fires(&mut body_timer), if waiting_for_client => {
                tracing::debug!(waited = ?between_reads, "closing a client connection whose request body stalled");
                return Err(Failure::ClientSlow);
            }
            () = fires(&mut continue_timer) => {
                continue_timer = None;
                write_within(&mut client_out, b"HTTP/1.1 100 Continue\r\n\r\n", send).await?;
            }
        }
        if written == out.len() && buf.capacity() - buf.len() < READ_CHUNK / 4 {
            make_room(buf, READ_CHUNK);
        }
    }
}

/// Writes `bytes` to the client within `limit` (`clientTimeouts.send`).
async fn write_within(
    client: &mut (impl AsyncWrite + Unpin),
    bytes: &[u8],
    limit: Duration,
) -> Result<(), Failure> {
    match tokio::time::timeout(limit, client.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Failure::ClientGone),
        Err(_) => Err(Failure::ClientSlow),
    }
}

/// Resolves when `timer` fires; never when there is none.
async fn fires(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(t) => t.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Reads `input` into the request `body` (what goes out onto `out`), checking a chunked body against
/// `max`; returns how many bytes of `input` it took.
pub fn take(body: &mut Body, input: &[u8], out: &mut Vec<u8>, max: u64) -> Result<usize, Failure> {
    let n = body.take(input, out).map_err(Failure::Malformed)?;
    if body.chunked_data() > max {
        return Err(Failure::TooLarge);
    }
    Ok(n)
}

/// Parses what `app.buf` holds: interim (1xx) heads are forwarded to the client and dropped; returns
/// the final head once it is whole (its fields in `fields`), or `None` while it is not.
async fn forward_interim(
    app: &mut App,
    client: &mut (impl AsyncWrite + Unpin),
    fields: &mut Vec<Field>,
    head_request: bool,
    send: Duration,
) -> Result<Option<ResponseHead>, Failure> {
    loop {
        match response::parse(&app.buf, fields, head_request) {
            response::Parsed::Head(head) if head.interim() => {
                let mut interim = Vec::with_capacity(head.len + 64);
                encode::response_head(&mut interim, &app.buf, &head, fields);
                interim.extend_from_slice(b"\r\n");
                app.buf.advance(head.len);
                write_within(client, &interim, send).await?;
            }
            response::Parsed::Head(head) => return Ok(Some(head)),
            response::Parsed::Invalid(why) => return Err(Failure::Invalid(why)),
            response::Parsed::Partial => return Ok(None),
        }
    }
}

/// Reads the app's final response head into `app.buf` (its fields into `fields`), forwarding interim
/// responses to the client as they come.
async fn read_final_head(
    app: &mut App,
    client: &mut (impl AsyncWrite + Unpin),
    fields: &mut Vec<Field>,
    head_request: bool,
    send: Duration,
) -> Result<ResponseHead, Failure> {
    let mut read_any = !app.buf.is_empty();
    let mut scan = HeadScan::default();
    loop {
        if scan.due(&app.buf, response::MAX_HEAD) {
            if let Some(head) = forward_interim(app, client, fields, head_request, send).await? {
                return Ok(head);
            }
            // Interim heads before it may have been forwarded and dropped: the buffer starts anew.
            scan = HeadScan::default();
        }
        scan.seen(&app.buf);
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

/// Streams the rest of a response body from the app to the client (`out` is write space), watching for
/// the client to hang up while the app is quiet (a stream of events, a long download); a client that
/// takes nothing for `send` fails it with `TimedOut`.
pub async fn pump_response(
    app: &mut App,
    client: &mut TcpStream,
    buf: &mut BytesMut,
    body: &mut Body,
    out: &mut Vec<u8>,
    send: Duration,
) -> io::Result<()> {
    while !body.done() {
        out.clear();
        if app.buf.is_empty() {
            make_room(&mut app.buf, READ_CHUNK);
            let (mut client_in, _) = client.split();
            let read = tokio::select! {
                biased;
                read = app.io.read_buf(&mut app.buf) => read?,
                () = hang_up(&mut client_in, buf) => return Err(io::ErrorKind::ConnectionAborted.into()),
            };
            if read == 0 {
                if !body.closed(out) {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                return write_all_within(client, out, send).await;
            }
        }
        let n = body
            .take(&app.buf, out)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        app.buf.advance(n);
        write_all_within(client, out, send).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;
    use crate::http1::body::Framing;

    #[tokio::test]
    async fn an_answer_before_the_whole_request_is_written_marks_the_app_connection_out_of_step() {
        // The app answers once it has the head, keeps the connection open and reads nothing more.
        let app = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority: Authority = app.local_addr().unwrap().to_string().parse().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = app.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            s.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
                .await
                .unwrap();
            std::future::pending::<()>().await;
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(front.local_addr().unwrap()).await.unwrap();
        let (mut from_client, _) = front.accept().await.unwrap();

        // The whole request is already in `out`: far more than the sockets between here and the app hold.
        let size = 64 << 20;
        let mut out = format!("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").into_bytes();
        out.resize(out.len() + size, b'x');
        let mut body = Body::new(Framing::Empty);
        let (mut buf, mut fields, mut slot) = (BytesMut::new(), Vec::new(), None);
        let timeouts = ClientTimeouts::default();
        let client = Client {
            io: &mut from_client,
            buf: &mut buf,
            fields: &mut fields,
            out: &mut out,
            timeouts: &timeouts,
        };
        let req = Request {
            max_body: u64::MAX,
            retryable: false,
            head_request: false,
            expect_continue: false,
        };
        let answer = send(&mut slot, &authority, client, &mut body, req).await.unwrap();
        assert_eq!(answer.head.status, 401);
        assert!(!answer.sent_all, "the app never took the body");
    }
}
