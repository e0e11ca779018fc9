//! What the proxy benchmarks share: the upstream app, child processes, ports, nginx.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use sluice_testsupport::free_port;

/// `bin` on PATH, or in /usr/sbin or /sbin (where Debian puts nginx).
pub fn which(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// The upstream app: 200 with a short body, HTTP/1.1 keep-alive.
pub fn serve_upstream(addr: SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind upstream");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req: Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"hello from the app\n",
                    ))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Awaits a listener on `addr` (20 s at most).
pub fn wait_port(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `127.0.0.1:port`.
pub fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A plain HTTP/1.1 GET; the whole response, or nothing if nothing listens.
pub fn http_get_blocking(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// nginx `proxy_pass` to `upstream` on a free port, with a `limit_req` that never limits if `limit_req`.
pub fn start_nginx(dir: &Path, upstream: SocketAddr, limit_req: bool) -> (Proc, SocketAddr) {
    let addr = local(free_port());
    let prefix = dir.join(format!("nginx-{}", addr.port()));
    std::fs::create_dir_all(prefix.join("logs")).expect("nginx dir");
    let (zone, limit) = if limit_req {
        (
            "limit_req_zone $binary_remote_addr zone=bench:10m rate=1000000r/s;",
            "limit_req zone=bench burst=1000000 nodelay;",
        )
    } else {
        ("", "")
    };
    let conf = format!(
        r#"
worker_processes auto;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  {zone}
  upstream app {{ server {upstream}; keepalive 128; }}
  server {{
    listen {addr} reuseport;
    location / {{
      {limit}
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }}
  }}
}}
"#,
        prefix = prefix.display()
    );
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("nginx conf");
    let nginx = which("nginx").expect("nginx");
    let p = Proc(
        Command::new(nginx)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn nginx"),
    );
    wait_port(addr);
    (p, addr)
}
