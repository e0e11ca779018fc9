//! The local sandbox (`make sandbox`) runs briefly with `--duration`: it prints the kubeconfig and a
//! live view in which requests are both allowed and limited and queued jobs get done, exits 0, and
//! leaves nothing behind — no process started from its temp dirs, no temp dir but PostgreSQL's shared
//! `initdb` template cache.

use std::path::Path;
use std::process::Command;

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
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-sandbox"))
        .args([
            "--duration",
            "10",
            "--demo-app",
            env!("CARGO_BIN_EXE_sluice-demo-app"),
        ])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
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
