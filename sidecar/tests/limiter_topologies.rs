//! The limiter against Redis Cluster (three masters: every script touches one slot thanks to the hash tag,
//! scripts are loaded node by node on `NOSCRIPT`) and against Redis Sentinel.

mod limiter_common;

/// Named `limiter` so `cargo nextest run -p sluice-sidecar limiter` selects these tests too.
mod limiter {
    use std::{
        io::{Read, Write},
        net::TcpStream,
        path::Path,
        process::{Child, Command, Stdio},
        time::Duration,
    };

    use http::Method;
    use sluice_crds::sidecar_config::{Algorithm, FailureMode, Rule, RuleMatch};
    use sluice_sidecar::{clock::ManualClock, limiter::RequestFacts};
    use sluice_testsupport::{RedisServer, free_port, wait_for};
    use tempfile::TempDir;

    use crate::limiter_common::*;

    /// A server process this test started; killed when dropped.
    struct Proc(Child);

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// One inline command to 127.0.0.1:`port`; the raw reply, or "" when nothing answers.
    fn command(port: u16, line: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(format!("{line}\r\n").as_bytes()).is_err() {
            return String::new();
        }
        let mut buf = vec![0u8; 16 * 1024];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn spawn(args: &[&str], dir: &Path, port: u16) -> Proc {
        let child = Command::new("redis-server")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let p = Proc(child);
        wait_for(
            &format!("redis on {port} to answer"),
            Duration::from_secs(10),
            || command(port, "PING").starts_with("+PONG").then_some(()),
        );
        p
    }

    /// One rule per algorithm, each on its own path.
    fn rules_per_algorithm() -> Vec<Rule> {
        [
            ("fw", Algorithm::FixedWindow, 3),
            ("sl", Algorithm::SlidingLog, 4),
            ("sc", Algorithm::SlidingCounter, 5),
            ("tb", Algorithm::TokenBucket, 6),
        ]
        .into_iter()
        .map(|(name, algorithm, requests)| {
            let mut r = rule(name, algorithm, requests, 60_000);
            r.limit.burst = Some(requests - 1);
            r.matches = RuleMatch {
                path_prefix: Some(format!("/{name}")),
                ..Default::default()
            };
            r
        })
        .collect()
    }

    /// Each of `clients` gets exactly each rule's limit.
    async fn assert_exact_limits(l: &sluice_sidecar::limiter::Limiter, clients: u32) {
        for c in 0..clients {
            let ip = format!("198.51.{}.{}", c / 250, c % 250);
            for (path, limit) in [("/fw", 3), ("/sl", 4), ("/sc", 5), ("/tb", 6)] {
                let mut allowed = 0;
                for _ in 0..limit + 2 {
                    let req = RequestFacts {
                        method: &Method::GET,
                        path,
                        host: None,
                        headers: no_headers(),
                        client_ip: ip.parse().unwrap(),
                    };
                    if l.check(&req).await.allowed() {
                        allowed += 1;
                    }
                }
                assert_eq!(allowed, limit, "client {ip} on {path}");
            }
        }
        assert!(l.redis_healthy(), "no call failed");
    }

    #[tokio::test]
    async fn every_algorithm_works_on_a_redis_cluster_with_keys_spread_over_the_masters() {
        let dir = TempDir::new().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let _nodes: Vec<Proc> = ports
            .iter()
            .map(|(port, bus)| {
                let (port_s, bus_s) = (port.to_string(), bus.to_string());
                let conf = format!("nodes-{port}.conf");
                let args = [
                    "--port",
                    port_s.as_str(),
                    "--cluster-port",
                    bus_s.as_str(),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    conf.as_str(),
                    "--bind",
                    "127.0.0.1",
                    "--protected-mode",
                    "no",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ];
                spawn(&args, dir.path(), *port)
            })
            .collect();
        let addrs: Vec<String> = ports.iter().map(|(p, _)| format!("127.0.0.1:{p}")).collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli on PATH");
        assert!(status.success(), "redis-cli --cluster create failed");
        wait_for(
            "the cluster to be ok on every node",
            Duration::from_secs(20),
            || {
                ports
                    .iter()
                    .all(|(p, _)| command(*p, "CLUSTER INFO").contains("cluster_state:ok"))
                    .then_some(())
            },
        );
        let url = format!("redis-cluster://{}?node={}&node={}", addrs[0], addrs[1], addrs[2]);
        let l = limiter(
            &config(rules_per_algorithm(), FailureMode::Closed),
            Some(&url),
            &ManualClock::at(T0),
        );
        healthy(&l).await;
        assert_exact_limits(&l, 30).await;
        let holding = ports
            .iter()
            .filter(|(p, _)| command(*p, "DBSIZE").trim() != ":0")
            .count();
        assert!(
            holding >= 2,
            "counters should spread over the masters, {holding} hold keys"
        );
    }

    #[tokio::test]
    async fn every_algorithm_works_through_redis_sentinel() {
        let master = RedisServer::start();
        let dir = TempDir::new().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\n\
                 sentinel monitor sluice 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds sluice 5000\n",
                master.port()
            ),
        )
        .unwrap();
        let _sentinel = spawn(&[conf.to_str().unwrap(), "--sentinel"], dir.path(), port);
        let url = format!("redis-sentinel://127.0.0.1:{port}/0?sentinelServiceName=sluice");
        let l = limiter(
            &config(rules_per_algorithm(), FailureMode::Closed),
            Some(&url),
            &ManualClock::at(T0),
        );
        healthy(&l).await;
        assert_exact_limits(&l, 3).await;
        assert!(
            master.command("DBSIZE").trim() != ":0",
            "counters live on the master"
        );
    }
}
