//! The `sluice-test-apiserver` binary: starts on its own and writes a kubeconfig kubectl can use.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(10);

/// `$KUBECTL`, else `kubectl` on PATH.
fn kubectl() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

#[test]
fn the_binary_writes_a_kubeconfig_that_kubectl_uses() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kc");
    let mut server = Command::new(env!("CARGO_BIN_EXE_sluice-test-apiserver"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // It prints one line once the kubeconfig is written.
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let serving = rx.recv_timeout(DEADLINE);
    let out = serving.as_ref().ok().map(|_| {
        Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "ns", "-o", "name"])
            .output()
            .unwrap()
    });
    server.kill().unwrap();
    server.wait().unwrap();
    let serving = serving.expect("the server says it is serving");
    assert!(serving.starts_with("serving https://127.0.0.1:"), "{serving}");
    let out = out.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "namespace/default\nnamespace/kube-node-lease\nnamespace/kube-public\nnamespace/kube-system\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
