//! Child processes of a test: free ports, signals, and finding server binaries on this machine.

use std::{
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

/// A POSIX signal a test sends to a server it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Freeze the process: its sockets stay open, nothing answers (a hung server).
    Stop,
    /// Thaw a frozen process.
    Cont,
    /// Kill at once, no cleanup (a crash).
    Kill,
    /// Ask to stop; PostgreSQL takes it as "fast shutdown".
    Int,
    /// Ask to stop.
    Term,
    /// Quit at once; PostgreSQL takes it as "immediate shutdown" (no checkpoint, but it cleans up).
    Quit,
}

impl Signal {
    fn flag(self) -> &'static str {
        match self {
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
            Signal::Kill => "-KILL",
            Signal::Int => "-INT",
            Signal::Term => "-TERM",
            Signal::Quit => "-QUIT",
        }
    }
}

/// Sends `sig` to `pid` (through `kill(1)`, so this crate needs no unsafe FFI).
pub(crate) fn send_signal(pid: u32, sig: Signal) {
    let status = Command::new("kill")
        .arg(sig.flag())
        .arg(pid.to_string())
        .status()
        .expect("run kill(1)");
    assert!(status.success(), "kill {} {pid} failed", sig.flag());
}

/// A TCP port on 127.0.0.1 that was free a moment ago. The OS may hand it out again, so servers are
/// started on it at once and a start that loses the race is retried on a new port by the caller.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
        .port()
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub(crate) fn accepts(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(100)).is_ok()
}

/// Finds `name` on PATH or in one of `extra` dirs; panics with an install hint naming the package.
pub(crate) fn find_binary(name: &str, extra: &[PathBuf], package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found on PATH: the tests start their own servers and need the `{package}` \
                 package (run `make deps`, or `apt-get install {package}`)"
            )
        })
}

/// Whether this process runs as root (PostgreSQL refuses to, so it is started as the `postgres` user).
pub(crate) fn running_as_root() -> bool {
    // The uid is read from /proc to avoid an FFI call; tests run on Linux only.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).map(|uid| uid == "0"))
        .unwrap_or(false)
}

/// A `Command` that runs `program` as `user` when this process is root, and as itself otherwise.
/// `setpriv` execs in place, so the child's pid is the server's own pid and signals reach it.
pub(crate) fn command_as(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                &format!("--reuid={user}"),
                &format!("--regid={user}"),
                "--init-groups",
                "--",
            ])
            .arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Kills and reaps a child if it still runs.
pub(crate) fn kill_child(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        send_signal(child.id(), Signal::Cont);
        let _ = child.kill();
    }
    let _ = child.wait();
}
