//! The real `sluice-sidecar` binary under slow clients: thousands of connections holding partial request
//! heads (slowloris) and uploads trickling their bodies leave it within a 64 MiB memory limit, still
//! serving everyone else promptly, and past `limits.maxConnections` connections are closed at once. The
//! timeouts that end such clients are tested with short settings, awaited with a deadline.

mod proxy_support;

use std::{
    io::Write,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use proxy_support::{
    raw::{RawClient, Reply, raw_app},
    start_upstream,
};
use sluice_crds::sidecar_config::LimitsConfig;
use sluice_sidecar::proxy::capacity::{Environment, caps, raise_fd_limit};
use sluice_testsupport::{free_port, wait_for_async};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const MIB: u64 = 1024 * 1024;
/// The sidecar's memory limit in the chart and the injector.
const MEMORY_LIMIT: u64 = 64 * MIB;
/// Connections that send part of a head and then nothing.
const SLOWLORIS: usize = 2_000;
/// Of those, how many send a long partial head (60 KiB), drawing on the budget for heads.
const LONG_HEADS: usize = 50;
/// Uploads that send their head and a little of a large body, then nothing.
const SLOW_UPLOADS: usize = 200;
/// Requests of normal clients timed while the slow ones hold their connections.
const NORMAL_REQUESTS: usize = 400;

/// A sidecar process; killed when dropped.
struct Process {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    _config: tempfile::NamedTempFile,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// The sidecar's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{name} in /proc/pid/status"))
                * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// The value of an unlabelled metric on `/metrics`.
    async fn metric(&self, name: &str) -> f64 {
        let mut c = RawClient::connect(self.admin).await;
        c.send(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .await;
        let resp = c.response(false).await.expect("a /metrics response");
        let text = String::from_utf8_lossy(&resp.body).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} on /metrics"))
    }
}

/// A sidecar sized for the chart's 64 Mi memory limit (as its cgroup would say in a pod).
fn spawn_sidecar(yaml: &str, upstream: SocketAddr) -> Process {
    let mut config = tempfile::NamedTempFile::new().unwrap();
    config.write_all(yaml.as_bytes()).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .arg("--config")
        .arg(config.path())
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_REDIS_URL")
        .env("SLUICE_LISTEN", addr.to_string())
        .env("SLUICE_ADMIN_LISTEN", admin.to_string())
        .env("SLUICE_UPSTREAM", format!("http://{upstream}"))
        .env("SLUICE_MEMORY_LIMIT", MEMORY_LIMIT.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sluice-sidecar");
    Process {
        child,
        addr,
        admin,
        _config: config,
    }
}

async fn wait_serving(p: &Process) {
    wait_for_async("the sidecar to serve", Duration::from_secs(20), || async {
        let mut c = TcpStream::connect(p.addr).await.ok()?;
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut resp = Vec::new();
        c.read_to_end(&mut resp).await.ok()?;
        resp.starts_with(b"HTTP/1.1 200").then_some(())
    })
    .await;
}

/// One request on a fresh connection, answered in full; how long it took.
async fn timed_request(addr: SocketAddr, i: usize) -> Duration {
    let start = Instant::now();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /normal/{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).await.unwrap();
    assert!(
        resp.starts_with(b"HTTP/1.1 200"),
        "a normal request got {:?}",
        String::from_utf8_lossy(&resp[..resp.len().min(80)])
    );
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_leave_a_64_mib_sidecar_within_its_limit_and_serving_others() {
    // The test holds every client connection and the app's side of the uploads; the sidecar (which
    // inherits the limit, and raises its own) holds one or two per client.
    let fds = raise_fd_limit().unwrap_or(0);
    let needed = 2 * (SLOWLORIS + SLOW_UPLOADS) as u64 + 1_000;
    assert!(
        fds >= needed,
        "this test needs {needed} file descriptors (RLIMIT_NOFILE's hard limit is {fds}); raise it (ulimit -Hn)"
    );
    let max_connections = caps(
        &LimitsConfig::default(),
        Environment {
            memory_limit: Some(MEMORY_LIMIT),
            fd_limit: None,
        },
    )
    .max_connections;
    assert!(max_connections > SLOWLORIS + SLOW_UPLOADS + 10);
    let app = start_upstream().await;
    let sidecar = spawn_sidecar(
        "version: 1\nlimits:\n  rules:\n  - name: all\n    limit: {requests: 1000000, window: 1m}\n",
        app.addr,
    );
    wait_serving(&sidecar).await;
    for i in 0..50 {
        timed_request(sidecar.addr, i).await;
    }
    let (idle_rss, _) = sidecar.memory();

    let mut held = Vec::with_capacity(SLOWLORIS + SLOW_UPLOADS);
    for i in 0..SLOWLORIS {
        let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
        let filler = if i < LONG_HEADS {
            60 * 1024
        } else {
            1024 + i % 1024
        };
        let head = format!(
            "GET /slow/{i} HTTP/1.1\r\nHost: a\r\nX-Filler: {}",
            "f".repeat(filler)
        );
        c.write_all(head.as_bytes()).await.unwrap();
        held.push(c);
    }
    for i in 0..SLOW_UPLOADS {
        let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
        let head = format!("POST /upload/{i} HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000\r\n\r\n");
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&[b'u'; 4096]).await.unwrap();
        held.push(c);
    }
    let all = (SLOWLORIS + SLOW_UPLOADS) as f64;
    wait_for_async(
        "the sidecar to hold every slow client",
        Duration::from_secs(60),
        || async { (sidecar.metric("sluice_proxy_connections").await >= all).then_some(()) },
    )
    .await;
    wait_for_async(
        "the uploads to reach the app",
        Duration::from_secs(60),
        || async {
            (app.arrived.load(std::sync::atomic::Ordering::SeqCst) >= 50 + 1 + SLOW_UPLOADS).then_some(())
        },
    )
    .await;
    assert_eq!(
        sidecar.metric("sluice_proxy_slow_clients_total").await,
        0.0,
        "no slow client was refused: the long heads fit the budget"
    );

    let mut took = Vec::with_capacity(NORMAL_REQUESTS);
    for i in 0..NORMAL_REQUESTS {
        took.push(timed_request(sidecar.addr, i).await);
    }
    took.sort();
    let p99 = took[NORMAL_REQUESTS * 99 / 100 - 1];
    let (rss, peak) = sidecar.memory();
    eprintln!(
        "RSS {} KiB idle, {} KiB holding {} slow clients (peak {} KiB); normal requests p50 {:?} p99 {:?} max {:?}",
        idle_rss / 1024,
        rss / 1024,
        held.len(),
        peak / 1024,
        took[NORMAL_REQUESTS / 2],
        p99,
        took[NORMAL_REQUESTS - 1],
    );
    assert!(peak < MEMORY_LIMIT, "peak RSS {} KiB", peak / 1024);
    assert!(p99 < Duration::from_millis(50), "normal requests' p99 {p99:?}");

    // Past the cap, connections are closed as soon as they are accepted.
    let mut extra = Vec::new();
    let refused = loop {
        assert!(extra.len() <= max_connections, "no connection was refused");
        let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.unwrap();
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(20), c.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break c,
            Ok(Ok(_)) => panic!("a partial head was answered"),
            Err(_) => extra.push(c),
        }
    };
    drop(refused);
    assert!(
        held.len() + extra.len() + 1 >= max_connections,
        "refused with {} of {max_connections} open",
        held.len() + extra.len()
    );
    assert!(sidecar.metric("sluice_proxy_connections_refused_total").await >= 1.0);
    // Closing some makes room again.
    drop(extra);
    held.truncate(SLOWLORIS);
    wait_serving(&sidecar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_long_heads_gets_431_past_the_head_budget_and_memory_stays_bounded() {
    // About 63 MiB of partial heads, more than the whole memory limit: without a budget, an OOM kill.
    const FLOOD: usize = 1_000;
    let fds = raise_fd_limit().unwrap_or(0);
    assert!(
        fds >= 2 * FLOOD as u64 + 1_000,
        "this test needs more file descriptors (ulimit -Hn {fds})"
    );
    let app = start_upstream().await;
    let sidecar = spawn_sidecar("version: 1\n", app.addr);
    wait_serving(&sidecar).await;
    let head = format!(
        "GET /long HTTP/1.1\r\nHost: a\r\nX-Filler: {}",
        "f".repeat(63 * 1024)
    );
    let mut held = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
        c.write_all(head.as_bytes()).await.unwrap();
        held.push(c);
    }
    wait_for_async(
        "the sidecar to read every head",
        Duration::from_secs(60),
        || async {
            let refused = sidecar.metric("sluice_proxy_slow_clients_total").await;
            (refused >= (FLOOD / 2) as f64).then_some(())
        },
    )
    .await;
    // Refused ones got a 431 (the rest still wait for their heads to end).
    let mut answered = 0;
    for c in &mut held {
        let mut start = [0u8; 12];
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(5), c.read_exact(&mut start)).await {
            assert_eq!(&start, b"HTTP/1.1 431");
            answered += 1;
        }
    }
    assert!(answered >= FLOOD / 2, "{answered} long heads answered 431");
    for i in 0..50 {
        timed_request(sidecar.addr, i).await;
    }
    let (rss, peak) = sidecar.memory();
    eprintln!(
        "{FLOOD} long heads: {answered} answered 431; RSS {} KiB (peak {} KiB)",
        rss / 1024,
        peak / 1024
    );
    assert!(peak < MEMORY_LIMIT, "peak RSS {} KiB", peak / 1024);
}

/// A config whose client timeouts are short, so the tests see them fire.
const SHORT_TIMEOUTS: &str =
    "version: 1\nlimits:\n  clientTimeouts: {idle: 5s, requestHead: 300ms, body: 300ms, send: 300ms}\n";

/// Waits until the peer closes `c` (reading and dropping what it sends); returns what was read.
async fn closed_within(c: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, c.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "the connection was still open after {within:?}; got {:?}",
        String::from_utf8_lossy(&got)
    );
    got
}

#[tokio::test]
async fn a_body_trickled_slower_than_clienttimeouts_body_is_answered_408_on_both_paths() {
    let app = start_upstream().await;
    let sidecar = spawn_sidecar(SHORT_TIMEOUTS, app.addr);
    wait_serving(&sidecar).await;
    // HTTP/1.1 takes the fast path; HTTP/1.0 is handed to hyper.
    for version in ["1.1", "1.0"] {
        let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
        let head = format!("POST /upload HTTP/{version}\r\nHost: a\r\nContent-Length: 100\r\n\r\n");
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(b"part of it").await.unwrap();
        let resp = closed_within(&mut c, Duration::from_secs(10)).await;
        assert!(
            resp.starts_with(format!("HTTP/{version} 408").as_bytes()) || resp.starts_with(b"HTTP/1.1 408"),
            "HTTP/{version}: {:?}",
            String::from_utf8_lossy(&resp)
        );
    }
    assert!(sidecar.metric("sluice_proxy_slow_clients_total").await >= 1.0);
}

#[tokio::test]
async fn a_client_that_stops_reading_its_response_is_closed_after_clienttimeouts_send() {
    // The app answers with 64 MiB: far more than the sockets between it and the client hold.
    let app = raw_app(|_| {
        let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n".to_vec();
        resp.resize(resp.len() + (64 << 20), b'r');
        Reply::Send(resp)
    })
    .await;
    let sidecar = spawn_sidecar(SHORT_TIMEOUTS, app.addr);
    wait_for_async("the sidecar to listen", Duration::from_secs(20), || async {
        TcpStream::connect(sidecar.addr).await.ok().map(drop)
    })
    .await;
    for version in ["1.1", "1.0"] {
        let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
        let head = format!("GET /big HTTP/{version}\r\nHost: a\r\n\r\n");
        c.write_all(head.as_bytes()).await.unwrap();
        // Read nothing until the sidecar must have given up, then see the stream end short.
        let before = sidecar.metric("sluice_proxy_slow_clients_total").await;
        wait_for_async(
            "the sidecar to give up on the reader",
            Duration::from_secs(20),
            || async { (sidecar.metric("sluice_proxy_slow_clients_total").await > before).then_some(()) },
        )
        .await;
        let got = closed_within(&mut c, Duration::from_secs(20)).await;
        assert!(got.len() < 64 << 20, "HTTP/{version}: the whole response arrived");
    }
}

#[tokio::test]
async fn hyper_connections_time_out_a_slow_head_but_keep_an_idle_one_for_clienttimeouts_idle() {
    let app = start_upstream().await;
    let sidecar = spawn_sidecar(SHORT_TIMEOUTS, app.addr);
    wait_serving(&sidecar).await;
    // An HTTP/1.0 keep-alive request moves the connection to hyper.
    let mut c = TcpStream::connect(sidecar.addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = c.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.0 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Idle longer than requestHead (300ms): still open.
    let quiet = tokio::time::timeout(Duration::from_millis(900), c.read(&mut buf)).await;
    assert!(
        quiet.is_err(),
        "an idle kept-alive connection was closed before clientTimeouts.idle"
    );
    // A head started now must be whole within requestHead (the idle timeout is 4 s away).
    c.write_all(b"GET / HTTP/1.0\r\nHost: a\r\n").await.unwrap();
    let started = Instant::now();
    closed_within(&mut c, Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_idle_h2c_connection_is_closed_after_clienttimeouts_idle() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let app = start_upstream().await;
    let sidecar = spawn_sidecar(
        "version: 1\nlimits:\n  clientTimeouts: {idle: 1s, requestHead: 300ms}\n",
        app.addr,
    );
    wait_serving(&sidecar).await;
    let stream = TcpStream::connect(sidecar.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get(format!("http://{}/h2", sidecar.addr))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    // Quiet from here: longer than requestHead is fine, idle is not.
    let quiet = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "the idle h2c connection was still open after 10 s");
    let after = quiet.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}, before clientTimeouts.idle"
    );
}

#[tokio::test]
async fn a_websocket_tunnel_keeps_its_place_under_maxconnections() {
    let app = start_upstream().await;
    let sidecar = spawn_sidecar("version: 1\nlimits:\n  maxConnections: 1\n", app.addr);
    wait_serving(&sidecar).await;
    let closed = || async { (sidecar.metric("sluice_proxy_connections").await == 0.0).then_some(()) };
    wait_for_async("the first connection to close", Duration::from_secs(10), closed).await;
    let mut ws = TcpStream::connect(sidecar.addr).await.unwrap();
    ws.write_all(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = ws.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 101"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    ws.write_all(b"ping").await.unwrap();
    ws.read_exact(&mut buf[..4]).await.unwrap();
    assert_eq!(&buf[..4], b"ping", "the tunnel echoes");
    assert_eq!(sidecar.metric("sluice_proxy_connections").await, 1.0);
    // The tunnel holds the one place: another connection is closed at once.
    let mut other = TcpStream::connect(sidecar.addr).await.unwrap();
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut resp = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), other.read_to_end(&mut resp)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "answered past the cap: {:?}",
        String::from_utf8_lossy(&resp)
    );
    drop(ws);
    wait_for_async("the tunnel to close", Duration::from_secs(10), closed).await;
    wait_serving(&sidecar).await;
}
