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

use sluice_sidecar::proxy::h1::chunked::Chunked;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// A request as the app received it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The head, as text.
    pub head: String,
    /// The body's data (decoded when chunked).
    pub body: Vec<u8>,
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
}

/// A running scripted app.
pub struct RawApp {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    /// Connections the app has closed.
    pub closed: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl RawApp {
    /// Every request the app received so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
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
    let (c, s, done) = (connections.clone(), seen.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
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
        let Some((head, body)) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let req = Seen {
            head,
            body,
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
        }
    }
}

/// A response with a `Content-Length` body.
pub fn ok(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// Reads one request (head, then a Content-Length or chunked body) from `stream`.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let head_len = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        read_some(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
    buf.drain(..head_len);
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if lower.contains("transfer-encoding: chunked") {
        let mut c = Chunked::default();
        loop {
            let n = c.scan(buf).ok()?;
            body.extend(buf.drain(..n));
            if c.done() {
                break;
            }
            read_some(stream, buf).await?;
        }
        body = decode_chunked(&body);
    } else if let Some(len) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        while buf.len() < len {
            read_some(stream, buf).await?;
        }
        body = buf.drain(..len).collect();
    }
    Some((head, body))
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
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
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
        self.buf.drain(..head_len);
        let status: u16 = head[9..12].parse().unwrap();
        let mut resp = RawResponse {
            status,
            head,
            body: Vec::new(),
        };
        if head_request || status < 200 || status == 204 || status == 304 {
            return Some(resp);
        }
        if resp
            .field("transfer-encoding")
            .is_some_and(|v| v.ends_with("chunked"))
        {
            let mut c = Chunked::default();
            loop {
                let n = c.scan(&self.buf).unwrap();
                resp.body.extend(self.buf.drain(..n));
                if c.done() {
                    return Some(resp);
                }
                read_some(&mut self.stream, &mut self.buf).await?;
            }
        }
        match resp.field("content-length").map(|v| v.parse::<usize>().unwrap()) {
            Some(len) => {
                while self.buf.len() < len {
                    read_some(&mut self.stream, &mut self.buf).await?;
                }
                resp.body = self.buf.drain(..len).collect();
            }
            None => {
                while read_some(&mut self.stream, &mut self.buf).await.is_some() {}
                resp.body = std::mem::take(&mut self.buf);
            }
        }
        Some(resp)
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
