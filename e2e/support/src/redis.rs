//! A throwaway `redis-server` on a free port.

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::process::{Signal, command_as, find_binary, free_port, kill_child, send_signal};

/// How long a fresh redis-server may take to answer PING.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// A `redis-server` process owned by one test. Dropping it kills the process and removes its dir.
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a fresh server on a free port (nothing persisted to disk).
    pub fn start() -> Self {
        let mut last_err = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("sluice-redis-")
                .tempdir()
                .expect("temp dir");
            let mut server = RedisServer {
                port: free_port(),
                dir,
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("redis-server did not start: {last_err}");
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on; stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the server with SIGSTOP: connections stay open and nothing answers.
    pub fn pause(&self) {
        send_signal(self.pid().expect("redis is running"), Signal::Stop);
    }

    /// Thaws a paused server.
    pub fn resume(&self) {
        send_signal(self.pid().expect("redis is running"), Signal::Cont);
    }

    /// Kills the server at once (SIGKILL); its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Starts the server again on the same port, empty, after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_DEADLINE;
        // The old socket may linger briefly; retry until the port is ours again.
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("redis-server did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Sends one command in inline form and returns the raw reply (for assertions on server state).
    pub fn command(&self, line: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to redis");
        s.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        s.write_all(format!("{line}\r\n").as_bytes()).expect("write");
        let mut buf = vec![0u8; 64 * 1024];
        let n = s.read(&mut buf).expect("read");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = find_binary("redis-server", &[], "redis-server");
        let mut child = command_as(None, &bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                return Err(format!("exited with {status}: {log}"));
            }
            if ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                kill_child(&mut child);
                return Err(format!("no PONG on port {} within {START_DEADLINE:?}", self.port));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(100))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 16];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .map(|n| buf[..n].starts_with(b"+PONG"))
            .unwrap_or(false)
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_starts_answers_and_comes_back_empty_after_restart() {
        let mut r = RedisServer::start();
        assert!(r.command("SET k v").starts_with("+OK"));
        assert!(r.command("GET k").contains('v'));
        let port = r.port();
        r.kill();
        assert!(!crate::process::accepts(port), "killed server still accepts");
        r.restart();
        assert_eq!(r.port(), port);
        assert!(
            r.command("GET k").starts_with("$-1"),
            "restarted server should be empty"
        );
    }

    #[test]
    fn paused_redis_accepts_but_does_not_answer_until_resumed() {
        let r = RedisServer::start();
        r.pause();
        assert!(!ping(r.port()));
        r.resume();
        assert!(ping(r.port()));
    }
}
