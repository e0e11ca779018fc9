//! The local sandbox (`make sandbox`) runs briefly with `--duration`: it prints the kubeconfig and a
//! live view in which requests are both allowed and limited and queued jobs get done, exits 0, and
//! leaves nothing behind — no process started from its temp dirs, no temp dir but PostgreSQL's shared
//! `initdb` template cache.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Setup (Redis, PostgreSQL, the in-memory API server, the chart, the examples Ready) plus the 10 s demo
/// and the shutdown: about 20 s on an idle 2-core machine. Well under the test runner's own limit, so a
/// sandbox that does not finish fails here with what it printed, not as a bare timeout.
const RUN_DEADLINE: Duration = Duration::from_secs(150);
/// How long the sandbox may take to stop everything after SIGTERM before it is killed.
const STOP_DEADLINE: Duration = Duration::from_secs(20);

/// Reads a child's pipe to the end on a thread of its own (so a full pipe never blocks the child).
fn drain(pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = vec![];
        let mut pipe = pipe;
        let _ = pipe.read_to_end(&mut out);
        out
    })
}

/// Polls the child until it exits or `deadline` passes; `None` if it is still running.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().expect("wait for the sandbox") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the sandbox to its end within [`RUN_DEADLINE`]; past it, stops it as Ctrl-C would (SIGTERM, then
/// SIGKILL) and fails with everything it printed, which says how far it got.
fn run_sandbox(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice-sandbox");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let finished = wait_until(&mut child, Instant::now() + RUN_DEADLINE);
    if finished.is_none() {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        if wait_until(&mut child, Instant::now() + STOP_DEADLINE).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    let Some(status) = finished else {
        panic!(
            "the sandbox did not finish within {RUN_DEADLINE:?}; it printed:\n{}\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    };
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Processes whose working directory or command line lies under `dir`.
fn processes_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let cwd = std::fs::read_link(entry.path().join("cwd"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if cwd.starts_with(&dir) || cmdline.contains(&dir) {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

#[test]
fn the_sandbox_shows_progress_and_leaves_nothing_behind() {
    let tmp = tempfile::Builder::new()
        .prefix("sluice-sandbox-test-")
        .tempdir()
        .unwrap();
    // PostgreSQL runs as the `postgres` user when the tests run as root: it must reach its data dir.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut sandbox = Command::new(env!("CARGO_BIN_EXE_sluice-sandbox"));
    sandbox
        .args([
            "--duration",
            "10",
            "--demo-app",
            env!("CARGO_BIN_EXE_sluice-demo-app"),
        ])
        .env("TMPDIR", tmp.path());
    let out = run_sandbox(sandbox);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("export KUBECONFIG="), "{stdout}");
    assert!(
        stdout.contains("kubectl get ratelimitpolicies,jobqueues,deployments,hpa"),
        "{stdout}"
    );

    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("/s ")).collect();
    assert!(lines.len() >= 8, "a line a second:\n{stdout}");
    let column = |line: &str, n: usize| -> u64 {
        line.split('│')
            .nth(1)
            .and_then(|c| c.split_whitespace().nth(n))
            .and_then(|v| v.trim_end_matches("/s").parse().ok())
            .unwrap_or(0)
    };
    assert!(
        lines.iter().any(|l| column(l, 0) > 0),
        "some requests allowed:\n{stdout}"
    );
    assert!(
        lines.iter().any(|l| column(l, 1) > 0),
        "some requests limited:\n{stdout}"
    );
    assert!(stdout.contains("enqueued 2000 jobs"), "{stdout}");
    assert!(stdout.contains("Stopped. Nothing left running"), "{stdout}");

    let left = processes_under(tmp.path());
    assert!(left.is_empty(), "processes left behind: {left:#?}");
    let entries: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("sluice-pg-template-"))
        .collect();
    assert!(entries.is_empty(), "temp files left behind: {entries:?}");
}
