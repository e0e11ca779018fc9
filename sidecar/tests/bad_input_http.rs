//! Malformed and oversized requests (the table in `bad_input/http.rs`) sent byte by byte to the real
//! `sluice-sidecar` binary, each on a connection of its own: each is answered with its status (a 4xx that
//! says what is wrong), none reaches the app, and the sidecar goes on serving good requests.

mod proxy_support;

#[path = "bad_input/http.rs"]
mod table;

use std::{
    collections::HashSet,
    io::Write,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::Duration,
};

use proxy_support::{
    client,
    raw::{RawClient, Reply, ok, raw_app},
};
use sluice_testsupport::{free_port, wait_for_async};
use table::{CASES, MAX_BODY};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A sidecar process; killed when dropped.
struct Process {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_sidecar(config: &std::path::Path, upstream: SocketAddr) -> Process {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .arg("--config")
        .arg(config)
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_REDIS_URL")
        .env("SLUICE_LISTEN", addr.to_string())
        .env("SLUICE_ADMIN_LISTEN", admin.to_string())
        .env("SLUICE_UPSTREAM", format!("http://{upstream}"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sluice-sidecar");
    Process { child, addr, admin }
}

async fn wait_ready(p: &Process) {
    let c = client();
    let admin = p.admin;
    wait_for_async("the sidecar to be ready", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let req = http::Request::get(format!("http://{admin}/readyz"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            (c.request(req).await.ok()?.status() == http::StatusCode::OK).then_some(())
        }
    })
    .await;
}

/// Sends `raw` on a fresh connection (writing while reading, since the sidecar may answer before it has
/// read everything) and returns the status of the answer.
async fn answer(addr: SocketAddr, raw: Vec<u8>) -> Result<u16, String> {
    let (mut reader, mut writer) = TcpStream::connect(addr).await.unwrap().into_split();
    let sending = tokio::spawn(async move {
        // The sidecar may close once it has answered; what it did not read is not the point.
        let _ = writer.write_all(&raw).await;
        writer
    });
    let read_head = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok(String::from_utf8_lossy(&buf[..end]).into_owned());
            }
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    return Err(format!(
                        "closed without an answer after {:?}",
                        String::from_utf8_lossy(&buf)
                    ));
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let head = tokio::time::timeout(Duration::from_secs(10), read_head)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())??;
    drop(sending);
    head.get(9..12)
        .and_then(|s| s.parse().ok())
        .filter(|_| head.starts_with("HTTP/1."))
        .ok_or_else(|| format!("not an HTTP/1.x status line: {head:?}"))
}

#[test]
fn every_bad_request_in_the_table_is_distinct() {
    let mut seen = HashSet::new();
    for case in CASES {
        assert!(seen.insert(case.raw.bytes()), "listed twice: {}", case.what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_request_is_answered_with_its_status_and_none_reaches_the_app() {
    let app = raw_app(|_| Reply::Send(ok("fine"))).await;
    let mut config = tempfile::NamedTempFile::new().unwrap();
    write!(
        config,
        "version: 1\nlimits:\n  maxRequestBody: {MAX_BODY}\n  rules:\n  - name: all\n    key: [{{type: clientIp}}]\n    limit: {{requests: 100000, window: 1m}}\n"
    )
    .unwrap();
    let sidecar = spawn_sidecar(config.path(), app.addr);
    wait_ready(&sidecar).await;

    let mut wrong = Vec::new();
    for case in CASES {
        match answer(sidecar.addr, case.raw.bytes()).await {
            Ok(status) if status == case.status => {}
            Ok(status) => wrong.push(format!("{}: {status}, not {}", case.what, case.status)),
            Err(e) => wrong.push(format!("{}: {e}", case.what)),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
    assert!(
        app.requests().is_empty(),
        "reached the app: {:?}",
        app.requests().iter().map(|r| &r.head).collect::<Vec<_>>()
    );

    // Still serving.
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.expect("an answer").status, 200);
}
