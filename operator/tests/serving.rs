//! The operator's serving loop (`sluice_operator::serve`, behind the webhook, the external metrics API and
//! `/metrics`) against peers that do not play along: connections that never finish a TLS handshake or a
//! request head, more connections than it holds, `accept()` failing for want of file descriptors, and a
//! loop that stops while the pod would otherwise stay Ready.

use std::{
    io::Write,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, routing::get};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use sluice_operator::{
    certs::{self, Bundle, CertStore, Plan},
    probe,
    run::{AllMetrics, Health, metrics_router},
    serve::{Limits, Serving, serve},
};
use sluice_testsupport::wait_for_async;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
};
use tokio_util::sync::CancellationToken;

const SERVICE: &str = "sluice-webhook";
const NAMESPACE: &str = "sluice-system";
const DEADLINE: Duration = Duration::from_secs(10);

fn pong() -> Router {
    Router::new().route("/ping", get(|| async { "pong" }))
}

fn bundle() -> Bundle {
    let now = (sluice_operator::clock::system_clock())();
    certs::execute(
        Plan::Create,
        None,
        &certs::service_dns_names(SERVICE, NAMESPACE),
        now,
        certs::WEBHOOK_CA_NAME,
    )
    .unwrap()
    .unwrap()
}

struct Server {
    addr: SocketAddr,
    serving: Serving,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(tls: Option<&Bundle>, limits: Limits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = tls.map(|b| {
        let store = Arc::new(CertStore::default());
        store.load(&b.cert_pem, &b.key_pem).unwrap();
        store.server_config().unwrap()
    });
    let serving = Serving::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(
        "test",
        listener,
        tls,
        pong(),
        limits,
        serving.clone(),
        stop.clone().cancelled_owned(),
    ));
    Server {
        addr,
        serving,
        stop,
        task,
    }
}

/// A TCP connection to `addr` from the loopback address `from` (all of 127.0.0.0/8 is this host).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `GET /ping` over TLS from `from`, trusting `ca_pem`, as the API server calls.
async fn ping_tls(from: [u8; 4], addr: SocketAddr, ca_pem: &str) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = connect_from(from, addr).await;
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = hyper::Request::get("/ping")
        .header("host", format!("{SERVICE}.{NAMESPACE}.svc"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    use http_body_util::BodyExt;
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

/// Whether the server closed `stream`: a read that returns end of file (or a reset) without waiting.
fn closed(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

#[tokio::test]
async fn connections_over_the_caps_are_closed_at_once_and_other_peers_are_still_served() {
    let b = bundle();
    let limits = Limits {
        max_connections: 64,
        max_connections_per_peer: 16,
        ..Limits::default()
    };
    let server = start(Some(&b), limits).await;
    // One peer opens 200 connections and never starts TLS.
    let mut attacker = vec![];
    for _ in 0..200 {
        attacker.push(connect_from([127, 0, 0, 1], server.addr).await);
    }
    let open = wait_for_async(
        "all but the per-peer cap of the attacker's connections closed",
        DEADLINE,
        || {
            let n = attacker.iter().filter(|s| closed(s)).count();
            async move { (n == 200 - 16).then_some(200 - n) }
        },
    )
    .await;
    assert_eq!(open, 16, "the server holds exactly the per-peer cap");
    // Another peer (the API server) is served meanwhile, over TLS.
    assert_eq!(
        ping_tls([127, 0, 0, 2], server.addr, &b.ca_bundle_pem)
            .await
            .unwrap(),
        "pong"
    );
    assert!(
        attacker.iter().filter(|s| !closed(s)).count() == 16,
        "connections under the cap stay open until their handshake deadline"
    );
}

#[tokio::test]
async fn a_tls_handshake_that_never_comes_is_cut_off() {
    let b = bundle();
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = start(Some(&b), limits).await;
    let silent = connect_from([127, 0, 0, 1], server.addr).await;
    let mut half = connect_from([127, 0, 0, 1], server.addr).await;
    // The first bytes of a ClientHello, and nothing more.
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    wait_for_async("both handshakes cut off", DEADLINE, || {
        let done = closed(&silent) && closed(&half);
        async move { done.then_some(()) }
    })
    .await;
    assert_eq!(
        ping_tls([127, 0, 0, 1], server.addr, &b.ca_bundle_pem)
            .await
            .unwrap(),
        "pong"
    );
}

#[tokio::test]
async fn a_request_head_that_trickles_or_never_comes_is_cut_off_and_idle_keep_alive_too() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = start(None, limits).await;
    let mut trickle = TcpStream::connect(server.addr).await.unwrap();
    trickle.write_all(b"GET /ping HTTP/1.1\r\nHo").await.unwrap();
    // A whole request answered, then the connection kept alive with nothing more.
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 1024];
    let n = idle.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("pong"), "{answer}");
    wait_for_async("the trickling and the idle connection closed", DEADLINE, || {
        let done = closed(&trickle) && closed(&idle);
        async move { done.then_some(()) }
    })
    .await;
}

/// A `tracing` writer that keeps what is logged.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

// One thread: the connections below are all made before the server runs again, so they wait in the
// listen backlog while the process has no file descriptor left to accept them with.
#[tokio::test(flavor = "current_thread")]
async fn the_server_keeps_accepting_after_accept_fails_for_want_of_file_descriptors() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let logs = Captured::default();
    let writer = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    );
    let server = start(None, Limits::default()).await;
    let original = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(open_files() + 32),
            maximum: original.maximum,
        },
    )
    .unwrap();
    // Connect until no descriptor is left; none of these is accepted yet (the server has not run).
    let mut clients = vec![];
    while let Ok(c) = std::net::TcpStream::connect(server.addr) {
        clients.push(c);
        assert!(clients.len() < 1000, "the descriptor limit did not bite");
    }
    wait_for_async("accept() failing and the server saying so", DEADLINE, || {
        let failed = logs.text().contains("accept failed");
        async move { failed.then_some(()) }
    })
    .await;
    drop(clients);
    setrlimit(Resource::Nofile, original).unwrap();
    assert!(server.serving.is_serving(), "the loop runs on");
    let url = format!("http://{}/ping", server.addr);
    assert_eq!(probe::probe_until(&url, DEADLINE).await.unwrap(), 200);
}

#[tokio::test]
async fn readiness_and_liveness_fail_when_a_server_stops() {
    let health = Arc::new(Health::default());
    health
        .cert_ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    health
        .policies_synced
        .store(true, std::sync::atomic::Ordering::Relaxed);
    health
        .job_queues_synced
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = metrics_router(
        AllMetrics {
            operator: Default::default(),
            job_queues: Default::default(),
        },
        health.clone(),
    );
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        "metrics",
        listener,
        None,
        router,
        Limits::default(),
        health.server("metrics"),
        stop.clone().cancelled_owned(),
    ));
    let webhook = start(None, Limits::default()).await;
    {
        let serving = webhook.serving.clone();
        health.servers.lock().unwrap().push(("webhook", serving));
    }
    let ready = format!("http://{addr}/readyz");
    let alive = format!("http://{addr}/healthz");
    assert_eq!(probe::probe_until(&ready, DEADLINE).await.unwrap(), 200);
    assert_eq!(probe::probe(&alive).await.unwrap(), 200);

    // The webhook's loop ends (a panic or a dropped task would end it the same way).
    webhook.task.abort();
    wait_for_async("the webhook's loop reported stopped", DEADLINE, || {
        let stopped = !webhook.serving.is_serving();
        async move { stopped.then_some(()) }
    })
    .await;
    let not_ready = probe::probe(&ready).await.unwrap_err().to_string();
    assert!(not_ready.ends_with("answered 503"), "{not_ready}");
    let dead = probe::probe(&alive).await.unwrap_err().to_string();
    assert!(dead.ends_with("answered 500"), "{dead}");
    stop.cancel();
}
