//! Byte-level HTTP/1.1 peers for the proxy's tests: an app that answers each request with bytes a test
//! scripts (or closes), and a client that sends raw bytes and reads responses back, so tests can see
//! exactly what crosses each connection.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use sluice_sidecar::http1::chunked::Chunked;
use sluice_testsupport::wait_for_async;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp::OwnedReadHalf},
    sync::Notify,
    task::JoinHandle,
};

/// A request as the app received it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The head, as text.
    pub head: String,
    /// The body's data (decoded when chunked).
    pub body: Vec<u8>,
    /// The body as it came over the wire (still chunked if it was).
    pub wire: Vec<u8>,
    /// Which connection it came on (0 for the first the app accepted).
    pub connection: usize,
    /// Its place on that connection (0 for the first).
    pub nth: usize,
}

/// What the app does with a request.
pub enum Reply {
    /// Writes these bytes and reads the next request.
    Send(Vec<u8>),
    /// Writes these bytes and closes the connection.
    SendAndClose(Vec<u8>),
    /// Closes the connection without a word.
    Close,
    /// Writes these bytes once the test releases it, then reads the next request.
    WhenReleased(Arc<Notify>, Vec<u8>),
    /// Never answers; the connection stays open until the proxy closes it.
    Never,
}

/// A running scripted app.
pub struct RawApp {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    /// Where each connection came from, in order of arrival.
    pub peers: Arc<Mutex<Vec<SocketAddr>>>,
    /// Connections the app has closed.
    pub closed: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl RawApp {
    /// Every request the app received so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (at most 5 s) until the app has received `n` requests.
    pub async fn wait_requests(&self, n: usize) {
        let what = format!("{n} requests to reach the app");
        wait_for_async(&what, Duration::from_secs(5), || async {
            (self.requests().len() >= n).then_some(())
        })
        .await;
    }

    /// Waits (at most 5 s) until `n` of the app's connections have been closed.
    pub async fn wait_closed(&self, n: usize) {
        let what = format!("{n} app connections to close");
        wait_for_async(&what, Duration::from_secs(5), || async {
            (self.closed.load(Ordering::SeqCst) >= n).then_some(())
        })
        .await;
    }
}

/// Starts an app that answers each request with `script(request)`.
pub async fn raw_app(script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> RawApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(script);
    let peers = Arc::new(Mutex::new(Vec::new()));
    let (c, s, done, p) = (connections.clone(), seen.clone(), closed.clone(), peers.clone());
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            p.lock().unwrap().push(peer);
            let connection = c.fetch_add(1, Ordering::SeqCst);
            let (s, script, done) = (s.clone(), script.clone(), done.clone());
            tokio::spawn(async move {
                serve(stream, connection, &s, &*script).await;
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    RawApp {
        addr,
        connections,
        peers,
        closed,
        seen,
    }
}

/// Answers requests on one connection until the script or the client closes it; the stream is closed
/// when this returns.
async fn serve(
    mut stream: TcpStream,
    connection: usize,
    s: &Mutex<Vec<Seen>>,
    script: &(dyn Fn(&Seen) -> Reply + Send + Sync),
) {
    let mut buf = Vec::new();
    for nth in 0.. {
        let Some((head, wire)) = read_message(&mut stream, &mut buf, false).await else {
            return;
        };
        let body = if framing(&head) == Framing::Chunked {
            decode_chunked(&wire)
        } else {
            wire.clone()
        };
        let req = Seen {
            head,
            body,
            wire,
            connection,
            nth,
        };
        s.lock().unwrap().push(req.clone());
        match script(&req) {
            Reply::Send(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::SendAndClose(bytes) => {
                let _ = stream.write_all(&bytes).await;
                return;
            }
            Reply::Close => return,
            Reply::WhenReleased(release, bytes) => {
                release.notified().await;
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::Never => {
                while read_some(&mut stream, &mut buf).await.is_some() {}
                return;
            }
        }
    }
}

/// A response with a `Content-Length` body.
pub fn ok(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// How a message read by these peers is delimited.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    /// No framing field: no body for a request, everything until close for a response.
    None,
}

/// The value of each field named `name` (any case) in `head`.
pub fn field_values<'h>(head: &'h str, name: &str) -> Vec<&'h str> {
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .collect()
}

/// The framing `head` declares. A message declaring both framings, or several lengths, fails the test:
/// no peer of the proxy should ever see one.
fn framing(head: &str) -> Framing {
    let te = field_values(head, "transfer-encoding");
    let cl = field_values(head, "content-length");
    assert!(
        te.is_empty() || cl.is_empty(),
        "a message with both Transfer-Encoding and Content-Length crossed the proxy: {head:?}"
    );
    assert!(
        cl.len() <= 1,
        "several Content-Length fields crossed the proxy: {head:?}"
    );
    if te
        .last()
        .is_some_and(|v| v.to_ascii_lowercase().ends_with("chunked"))
    {
        Framing::Chunked
    } else if let Some(n) = cl.first() {
        Framing::Length(
            n.parse()
                .unwrap_or_else(|_| panic!("Content-Length {n:?} in {head:?}")),
        )
    } else {
        Framing::None
    }
}

/// Reads one message (head, then its body as it came over the wire) from `stream`; a response whose
/// body is delimited by the close when `until_close`, otherwise none.
async fn read_message(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    until_close: bool,
) -> Option<(String, Vec<u8>)> {
    let head_len = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        read_some(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
    buf.drain(..head_len);
    let wire = match framing(&head) {
        Framing::Chunked => {
            let mut c = Chunked::default();
            let mut wire = Vec::new();
            loop {
                let n = c
                    .transcode(buf, &mut Vec::new())
                    .expect("well-formed chunked body");
                wire.extend(buf.drain(..n));
                if c.done() {
                    break wire;
                }
                read_some(stream, buf).await?;
            }
        }
        Framing::Length(len) => {
            while buf.len() < len {
                read_some(stream, buf).await?;
            }
            buf.drain(..len).collect()
        }
        Framing::None if until_close => {
            while read_some(stream, buf).await.is_some() {}
            std::mem::take(buf)
        }
        Framing::None => Vec::new(),
    };
    Some((head, wire))
}

async fn read_some(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(n) if n > 0 => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
        _ => None,
    }
}

/// The data of a well-formed chunked body (extensions and trailers dropped).
pub fn decode_chunked(mut wire: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    loop {
        let line_end = wire.windows(2).position(|w| w == b"\r\n").unwrap();
        let size_text = String::from_utf8_lossy(&wire[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        wire = &wire[line_end + 2..];
        if size == 0 {
            return data;
        }
        data.extend_from_slice(&wire[..size]);
        wire = &wire[size + 2..];
    }
}

/// A response as the client received it.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The head, as text.
    pub head: String,
    /// The body as it came over the wire (still chunked if it was).
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The value of the field `name` (any case), if present.
    pub fn field(&self, name: &str) -> Option<String> {
        field_values(&self.head, name).first().map(|v| (*v).to_owned())
    }
}

/// A client connection that speaks raw bytes.
pub struct RawClient {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads the next response (for a `HEAD` request when `head_request`); `None` if the connection
    /// closed first. Fails the test after 10 s.
    pub async fn response(&mut self, head_request: bool) -> Option<RawResponse> {
        tokio::time::timeout(Duration::from_secs(10), self.read_response(head_request))
            .await
            .expect("a response within 10 s")
    }

    async fn read_response(&mut self, head_request: bool) -> Option<RawResponse> {
        let head_len = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            read_some(&mut self.stream, &mut self.buf).await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_len]).into_owned();
        let status: u16 = head
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| head.strip_prefix("HTTP/1.0 "))
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP/1.x status line: {head:?}"));
        if head_request || status < 200 || status == 204 || status == 304 {
            self.buf.drain(..head_len);
            return Some(RawResponse {
                status,
                head,
                body: Vec::new(),
            });
        }
        let (head, body) = read_message(&mut self.stream, &mut self.buf, true).await?;
        Some(RawResponse { status, head, body })
    }

    /// Whether the proxy closes this connection within 5 s (reading and dropping anything else).
    pub async fn closed(&mut self) -> bool {
        let closing = async {
            let mut chunk = [0u8; 4096];
            loop {
                match self.stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), closing)
            .await
            .is_ok()
    }
}

/// Whether the kernel has delivered the close of the TCP connection from `local` to `remote` to the
/// `local` side (it is in CLOSE_WAIT there): whatever reads that socket next sees the end. IPv4 only.
pub fn close_seen_at(local: SocketAddr, remote: SocketAddr) -> bool {
    fn hex(addr: SocketAddr) -> String {
        let SocketAddr::V4(v4) = addr else {
            panic!("IPv4 only: {addr}")
        };
        format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port())
    }
    let (local, remote) = (hex(local), hex(remote));
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .any(|f| f.len() > 3 && f[1] == local && f[2] == remote && f[3] == "08")
}

/// An app that takes one connection, reads one request head from it (byte by byte, so nothing after the
/// head is read), then hands the connection to `then`.
pub async fn after_head<F, Fut>(then: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        then(s).await;
    });
    addr
}

/// Starts a `PUT /big` with a body of `mib` MiB to `addr`, written by a task of its own (it may block
/// when nobody reads); returns the connection's reading half and the writing task.
pub async fn start_upload(addr: SocketAddr, mib: usize) -> (OwnedReadHalf, JoinHandle<std::io::Result<()>>) {
    let (read, mut write) = TcpStream::connect(addr).await.unwrap().into_split();
    let upload = tokio::spawn(async move {
        let head = format!(
            "PUT /big HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            mib << 20
        );
        write.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..mib {
            write.write_all(&chunk).await?;
        }
        Ok(())
    });
    (read, upload)
}
