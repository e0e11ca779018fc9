//! A throwaway PostgreSQL server on a free port.
//!
//! `initdb` runs once per machine into a template cluster (about a second); each server copies the
//! template into its own temp dir and starts `postgres` on it directly (no `pg_ctl`), so the child's
//! pid is the postmaster's and a test can SIGKILL or SIGSTOP it. As root, everything runs as the
//! `postgres` user, because PostgreSQL refuses to run as root.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::process::{Signal, command_as, find_binary, free_port, kill_child, running_as_root, send_signal};

/// How long a server may take to become ready (copy + start; recovery after a kill takes longer).
const START_DEADLINE: Duration = Duration::from_secs(30);
/// The OS user servers run as when the tests run as root.
const PG_USER: &str = "postgres";

/// Backends of a [`PgServer`] frozen by [`PgServer::freeze_backends`]: thawed ([`Signal::Cont`]) when
/// dropped. A frozen backend's socket stays open and nothing answers on it, as a failover or a dropped
/// NAT entry leaves a client's connection.
pub struct Frozen<'a> {
    pg: &'a PgServer,
    pids: Vec<u32>,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        for &pid in &self.pids {
            self.pg.signal_backend(pid, Signal::Cont);
        }
    }
}

/// A PostgreSQL server owned by one test. Dropping it shuts the postmaster down at once and removes
/// its data dir and its System V shared memory segment.
pub struct PgServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl PgServer {
    /// Starts a fresh, empty server on a free port. The database `postgres` and the superuser
    /// `postgres` exist; authentication is `trust` on 127.0.0.1 only.
    pub fn start() -> Self {
        let template = template_cluster();
        let mut last_err = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("sluice-pg-")
                .tempdir()
                .expect("temp dir");
            copy_cluster(&template, &dir.path().join("data"));
            let mut server = PgServer {
                port: free_port(),
                dir,
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("postgres did not start: {last_err}");
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// A URL for another database on this server.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// The port it listens on; stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the postmaster (SIGSTOP). Established backends keep serving; new connections hang.
    pub fn pause(&self) {
        send_signal(self.pid().expect("postgres is running"), Signal::Stop);
    }

    /// Thaws a paused postmaster.
    pub fn resume(&self) {
        send_signal(self.pid().expect("postgres is running"), Signal::Cont);
    }

    /// Sends `sig` to one of its backends, `pid` as `pg_stat_activity` names it. [`Signal::Stop`] freezes
    /// that one session: its socket stays open and nothing answers on it (a server gone silent under a
    /// client, as a failover or a dropped NAT entry leaves it), while the other sessions and new
    /// connections carry on. Thaw it ([`Signal::Cont`]) before the server is dropped: a frozen backend
    /// never notices its postmaster's end. Panics when `pid` is not a child of this server's postmaster.
    pub fn signal_backend(&self, pid: u32, sig: Signal) {
        let stat =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read the backend's /proc stat");
        // After the command's name in parentheses (which may hold spaces): state, then the parent's pid.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        assert_eq!(parent, self.pid(), "pid {pid} is not a backend of this server");
        send_signal(pid, sig);
    }

    /// Freezes backends `pids` ([`PgServer::signal_backend`] with [`Signal::Stop`]) until the guard is
    /// dropped, so that a failing test still thaws them before the server goes.
    pub fn freeze_backends(&self, pids: impl IntoIterator<Item = u32>) -> Frozen<'_> {
        let mut frozen = Frozen {
            pg: self,
            pids: Vec::new(),
        };
        for pid in pids {
            self.signal_backend(pid, Signal::Stop);
            frozen.pids.push(pid);
        }
        frozen
    }

    /// Crashes the server: SIGKILL to the postmaster; its backends exit when they notice. Data that was
    /// committed survives (crash recovery runs on the next start).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Stops the server cleanly (fast shutdown: clients are disconnected, committed data kept).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(child.id(), Signal::Int);
            let _ = child.wait();
        }
    }

    /// Starts the stopped or killed server again on the same port with the same data.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("postgres did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Runs SQL through `psql` (for setup and assertions that must not depend on the code under test).
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(pg_bin("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.url(),
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql failed on {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// From now on, only the superuser `postgres` logs in without a password over TCP; every other role
    /// must give its own (SCRAM), so a test can tell a right password from a wrong one.
    pub fn require_passwords(&self) {
        let hba = self.data_dir().join("pg_hba.conf");
        std::fs::write(
            &hba,
            "local all all trust\n\
             host all postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
        )
        .expect("write pg_hba.conf");
        chown_to_pg(&hba);
        self.psql("SELECT pg_reload_conf()");
        // The reload is asynchronous: wait until a login without a password is asked for one.
        let probe = format!("postgres://sluice_probe@127.0.0.1:{}/postgres", self.port);
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let out = Command::new(pg_bin("psql"))
                .args(["-X", "-w", "-d", &probe, "-c", "SELECT 1"])
                .output()
                .expect("run psql");
            if String::from_utf8_lossy(&out.stderr).contains("password") {
                return;
            }
            assert!(Instant::now() < deadline, "pg_hba.conf was not reloaded");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) -> Result<(), String> {
        let data = self.data_dir();
        let log = self.dir.path().join("postgres.log");
        let log_file = std::fs::File::create(&log).map_err(|e| format!("create log: {e}"))?;
        chown_to_pg(&log);
        let mut child = command_as(pg_user(), &pg_bin("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", data.display()))
            // Durability matters to the tests that kill PostgreSQL, so commits stay synchronous; fsync is
            // off because a killed process (unlike a lost machine) keeps what it wrote in the OS cache.
            .args([
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ])
            .args(["-c", "shared_buffers=32MB", "-c", "log_min_messages=warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("spawn postgres: {e}"))?;
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("postgres exited with {status}: {log}"));
            }
            if self.ready() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                kill_child(&mut child);
                return Err(format!(
                    "not ready on port {} within {START_DEADLINE:?}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ready once the postmaster says so in `postmaster.pid` (its last line becomes `ready`) and it
    /// accepts TCP connections.
    fn ready(&self) -> bool {
        let pid_file = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).unwrap_or_default();
        pid_file.lines().nth(7).is_some_and(|l| l.trim() == "ready") && crate::process::accepts(self.port)
    }
}

/// How long a dropped server may take to shut down before it is killed.
const QUIT_DEADLINE: Duration = Duration::from_secs(5);

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown rather than SIGKILL: the postmaster then removes its System V shared
            // memory segment; a killed one leaves it behind, and the kernel's 4,096 segments run out
            // after a few thousand test servers.
            send_signal(child.id(), Signal::Cont);
            send_signal(child.id(), Signal::Quit);
            let deadline = Instant::now() + QUIT_DEADLINE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            kill_child(&mut child);
        }
        self.remove_shared_memory();
    }
}

impl PgServer {
    /// Removes the shared memory segment of a postmaster that did not clean up after itself (one killed
    /// by [`PgServer::kill`] and never restarted): its `postmaster.pid` is still there, naming the
    /// segment on its 7th line (`<key> <id>`). A segment still attached by an exiting backend goes when
    /// the backend does.
    fn remove_shared_memory(&self) {
        let pid_file = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).unwrap_or_default();
        let Some(id) = pid_file
            .lines()
            .nth(6)
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|id| id.parse::<u64>().ok())
        else {
            return;
        };
        let _ = Command::new("ipcrm")
            .args(["-m", &id.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn pg_user() -> Option<&'static str> {
    running_as_root().then_some(PG_USER)
}

fn chown_to_pg(path: &Path) {
    if running_as_root() {
        let status = Command::new("chown")
            .args(["-R", &format!("{PG_USER}:")])
            .arg(path)
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "chown {} to {PG_USER}",
            path.display()
        );
    }
}

/// The directory holding `initdb`, `postgres` and `psql`: `SLUICE_PG_BINDIR`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps them off PATH), else PATH.
fn pg_bin(name: &str) -> PathBuf {
    let mut extra: Vec<PathBuf> = std::env::var_os("SLUICE_PG_BINDIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
            .collect();
        versions.sort();
        extra.extend(versions.into_iter().rev().map(|(_, p)| p));
    }
    // SLUICE_PG_BINDIR and Debian's dirs win over PATH, where a client-only `psql` may stand.
    extra
        .iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| find_binary(name, &[], "postgresql"))
}

/// The template cluster, made by `initdb` once per machine (and per PostgreSQL version) and shared
/// read-only by all tests. Concurrent test processes race benignly: each builds into its own dir and
/// the first rename wins.
fn template_cluster() -> PathBuf {
    let version = Command::new(pg_bin("postgres"))
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .last()
                .unwrap_or("x")
                .to_owned()
        })
        .unwrap_or_else(|_| "x".into());
    let root = std::env::temp_dir().join(format!("sluice-pg-template-{version}"));
    if root.join("PG_VERSION").is_file() {
        return root;
    }
    let staging = tempfile::Builder::new()
        .prefix("sluice-pg-initdb-")
        .tempdir()
        .expect("temp dir");
    let data = staging.path().join("data");
    chown_to_pg(staging.path());
    let out = command_as(pg_user(), &pg_bin("initdb"))
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            PG_USER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .output()
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first process to finish wins; a loser's rename fails and its copy is dropped with `staging`.
    let _ = std::fs::rename(&data, &root);
    assert!(
        root.join("PG_VERSION").is_file(),
        "template cluster missing at {}",
        root.display()
    );
    root
}

/// Copies the template cluster to `dest`, owned by the server's user, mode 0700 as PostgreSQL demands.
fn copy_cluster(template: &Path, dest: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(template)
        .arg(dest)
        .status()
        .expect("run cp");
    assert!(status.success(), "copy template cluster to {}", dest.display());
    let parent = dest.parent().expect("dest has a parent");
    chown_to_pg(parent);
    let status = Command::new("chmod")
        .arg("0700")
        .arg(dest)
        .status()
        .expect("run chmod");
    assert!(status.success());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_keeps_committed_rows_across_a_kill_and_restart() {
        let mut pg = PgServer::start();
        pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (42)");
        let port = pg.port();
        pg.kill();
        pg.restart();
        assert_eq!(pg.port(), port);
        assert_eq!(pg.psql("SELECT v FROM t"), "42");
    }

    /// The id of `pg`'s shared memory segment, from its `postmaster.pid`.
    fn segment_of(pg: &PgServer) -> String {
        let pid_file = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).expect("postmaster.pid");
        let line = pid_file.lines().nth(6).expect("7th line of postmaster.pid");
        line.split_whitespace().nth(1).expect("shmid").to_owned()
    }

    /// Whether a System V shared memory segment with `id` exists.
    fn segment_exists(id: &str) -> bool {
        std::fs::read_to_string("/proc/sysvipc/shm")
            .expect("/proc/sysvipc/shm")
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(id))
    }

    #[test]
    fn a_dropped_server_leaves_no_shared_memory_running_frozen_or_killed() {
        let running = PgServer::start();
        let frozen = PgServer::start();
        let mut killed = PgServer::start();
        let ids = [segment_of(&running), segment_of(&frozen), segment_of(&killed)];
        assert!(
            ids.iter().all(|id| segment_exists(id)),
            "each server has its segment: {ids:?}"
        );
        frozen.pause();
        killed.kill();
        drop((running, frozen, killed));
        // A killed postmaster's backends notice its death and detach within moments; the segment, marked
        // for removal, goes with the last of them.
        let deadline = Instant::now() + Duration::from_secs(10);
        while ids.iter().any(|id| segment_exists(id)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for id in &ids {
            assert!(!segment_exists(id), "segment {id} is left behind");
        }
    }

    #[test]
    fn two_servers_run_side_by_side() {
        let a = PgServer::start();
        let b = PgServer::start();
        assert_ne!(a.port(), b.port());
        a.psql("CREATE TABLE only_in_a (v int)");
        assert_eq!(
            b.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"),
            "0"
        );
    }
}
