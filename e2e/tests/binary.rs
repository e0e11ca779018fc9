//! The `sluice-test-apiserver` binary: starts on its own and writes a kubeconfig kubectl can use.

use std::process::{Command, Stdio};
use std::time::Duration;

use sluice_e2e::harness::kubectl_path;
use sluice_e2e::wait_for;

#[tokio::test]
async fn the_binary_writes_a_kubeconfig_that_kubectl_uses() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kc");
    let mut server = Command::new(env!("CARGO_BIN_EXE_sluice-test-apiserver"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let written = wait_for("the kubeconfig is written", Duration::from_secs(10), || {
        let kubeconfig = kubeconfig.clone();
        async move {
            std::fs::read_to_string(&kubeconfig)
                .ok()
                .filter(|s| s.contains("current-context"))
        }
    })
    .await;
    let out = written.map(|_| {
        Command::new(kubectl_path().unwrap())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "ns", "-o", "name"])
            .output()
            .unwrap()
    });
    server.kill().unwrap();
    server.wait().unwrap();
    let out = out.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "namespace/default\nnamespace/kube-node-lease\nnamespace/kube-public\nnamespace/kube-system\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
