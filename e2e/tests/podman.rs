//! The Podman runner on its own: the sidecar binary built here runs in Sluice's runtime base image (a
//! bind mount in place of `COPY`) under the chart's securityContext, and is checked from the host: its
//! UID, capabilities and no_new_privs in /proc, a read-only root, its mounts and env, its ports on the
//! host network or published from a network of its own, SIGTERM and SIGKILL, and cleanup.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Capabilities, PodSecurityContext, SecurityContext};
use sluice_e2e::kubelet::sidecar_binary;
use sluice_e2e::podman::{ContainerSpec, Mount, Network, OWNER_LABEL, Podman, Security};
use sluice_testsupport::{free_port, wait_for_async};

const DEADLINE: Duration = Duration::from_secs(30);
const BINARY_IN_IMAGE: &str = "/usr/local/bin/sluice-sidecar";

/// The chart's Pod and container securityContext (charts/sluice/templates/deployment.yaml).
fn chart_security() -> Security {
    let pod = PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        fs_group: Some(65532),
        ..Default::default()
    };
    let container = SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    };
    Security::from_kubernetes(Some(&pod), Some(&container))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), free_port())
}

/// The sidecar binary in the runtime base, as the sidecar image has it, logging to `dir`.
async fn sidecar_spec(podman: &Podman, dir: &Path) -> ContainerSpec {
    let base = podman.ensure_runtime_base().await.expect("runtime base image");
    let name = unique("sluice-podman-test");
    let mut spec = ContainerSpec::new(&base, &name);
    spec.entrypoint = Some(vec![BINARY_IN_IMAGE.into()]);
    spec.mounts.push(Mount {
        host: sidecar_binary().expect("sluice-sidecar binary"),
        container: BINARY_IN_IMAGE.into(),
        read_only: true,
    });
    spec.security = chart_security();
    spec.log = Some(dir.join(format!("{name}.log")));
    spec
}

async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: t\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.ok()?;
    Some((out.split(' ').nth(1)?.parse().ok()?, out))
}

fn proc_status(pid: u32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("container process status")
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect()
}

fn field(status: &[(String, String)], name: &str) -> String {
    status
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

async fn exists(podman: &Podman, name: &str) -> bool {
    podman.output(&["container", "exists", name]).await.is_ok()
}

#[tokio::test]
async fn a_container_runs_confined_with_its_mounts_and_env_and_stops_on_sigterm() {
    let podman = Podman::new();
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("config.yaml"),
        "version: 1\nlimits:\n  failureMode: open\n  shutdownGrace: 1s\n",
    )
    .unwrap();
    let (listen, admin) = (free_port(), free_port());
    let mut spec = sidecar_spec(&podman, dir.path()).await;
    spec.args = vec!["--config".into(), "/etc/sluice/config.yaml".into()];
    spec.mounts.push(Mount {
        host: config_dir.clone(),
        container: "/etc/sluice".into(),
        read_only: true,
    });
    spec.env = vec![
        ("SLUICE_LISTEN".into(), format!("127.0.0.1:{listen}")),
        ("SLUICE_ADMIN_LISTEN".into(), format!("127.0.0.1:{admin}")),
        ("RUST_LOG".into(), "info".into()),
    ];
    spec.hostname = Some("web-1".into());

    let mut c = podman.run(&spec).await.expect("container runs");
    let ready = wait_for_async("/readyz through the host network", DEADLINE, || async {
        get(admin, "/readyz").await.filter(|(code, _)| *code == 200)
    })
    .await;
    assert!(ready.1.contains("\"ready\":true"), "{}", ready.1);

    let status = proc_status(c.pid());
    assert_eq!(field(&status, "Uid"), "65532 65532 65532 65532");
    assert_eq!(field(&status, "Gid"), "65532 65532 65532 65532");
    assert_eq!(field(&status, "Groups"), "65532");
    assert_eq!(field(&status, "CapEff"), "0000000000000000");
    assert_eq!(field(&status, "CapBnd"), "0000000000000000");
    assert_eq!(field(&status, "NoNewPrivs"), "1");
    let environ = std::fs::read(format!("/proc/{}/environ", c.pid())).unwrap();
    assert!(
        environ.split(|b| *b == 0).any(|v| v == b"HOSTNAME=web-1"),
        "HOSTNAME is the pod's name"
    );
    // The root filesystem and the config mount are read-only; the process sees them as such.
    let mounts = std::fs::read_to_string(format!("/proc/{}/mounts", c.pid())).unwrap();
    let opts = |target: &str| {
        mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(target))
            .map(|l| l.split(' ').nth(3).unwrap_or("").to_string())
    };
    assert!(opts("/").unwrap().starts_with("ro"), "{mounts}");
    assert!(opts("/etc/sluice").unwrap().starts_with("ro"), "{mounts}");

    let code = c.stop(Duration::from_secs(10)).await.unwrap();
    assert_eq!(code, 0, "SIGTERM drains and exits 0: {}", c.logs());
    assert!(
        c.logs().contains("sluice"),
        "the log file holds the container's output"
    );
    assert!(!exists(&podman, c.name()).await, "--rm removed the container");
}

#[tokio::test]
async fn a_private_network_publishes_ports_on_the_hosts_loopback() {
    let podman = Podman::new();
    let dir = tempfile::tempdir().unwrap();
    let host_port = free_port();
    let mut spec = sidecar_spec(&podman, dir.path()).await;
    spec.env = vec![
        ("SLUICE_LISTEN".into(), "0.0.0.0:8080".into()),
        ("SLUICE_ADMIN_LISTEN".into(), "0.0.0.0:15021".into()),
    ];
    spec.network = Network::Private(vec![(host_port, 15021)]);
    let c = podman.run(&spec).await.expect("container runs");
    let (code, _) = wait_for_async("/healthz on the published port", DEADLINE, || async {
        get(host_port, "/healthz").await
    })
    .await;
    assert_eq!(code, 200);
    let name = c.name().to_string();
    drop(c);
    assert!(
        !exists(&podman, &name).await,
        "dropping the handle removes the container"
    );
}

#[tokio::test]
async fn sigkill_is_a_crash_with_exit_code_137() {
    let podman = Podman::new();
    let dir = tempfile::tempdir().unwrap();
    let admin = free_port();
    let mut spec = sidecar_spec(&podman, dir.path()).await;
    spec.env = vec![
        ("SLUICE_LISTEN".into(), format!("127.0.0.1:{}", free_port())),
        ("SLUICE_ADMIN_LISTEN".into(), format!("127.0.0.1:{admin}")),
    ];
    let mut c = podman.run(&spec).await.unwrap();
    wait_for_async("the sidecar to serve", DEADLINE, || async {
        get(admin, "/healthz").await
    })
    .await;
    assert_eq!(c.try_exit_code().unwrap(), None);
    assert!(c.start_kill());
    let code = tokio::time::timeout(DEADLINE, c.wait()).await.unwrap().unwrap();
    assert_eq!(code, 137);
    assert_eq!(c.try_exit_code().unwrap(), Some(137));
}

#[tokio::test]
async fn run_as_non_root_refuses_a_root_user_and_a_missing_entrypoint_is_an_error() {
    let podman = Podman::new();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = sidecar_spec(&podman, dir.path()).await;
    spec.security.user = Some("0:0".into());
    let err = podman.run(&spec).await.unwrap_err().to_string();
    assert!(err.contains("runAsNonRoot"), "{err}");
    assert!(!exists(&podman, &spec.name).await, "nothing was started");

    let mut spec = sidecar_spec(&podman, dir.path()).await;
    spec.entrypoint = Some(vec!["/bin/sh".into(), "-c".into(), "true".into()]);
    let err = podman.run(&spec).await.unwrap_err().to_string();
    assert!(err.contains("/bin/sh"), "the image has no shell: {err}");
}

#[tokio::test]
async fn containers_of_a_dead_test_process_are_removed_as_orphans() {
    let podman = Podman::new();
    let base = podman.ensure_runtime_base().await.unwrap();
    let name = unique("sluice-podman-orphan");
    let sidecar: PathBuf = sidecar_binary().unwrap();
    // As a test process killed mid-test would leave it: running, labelled with an owner that is gone.
    podman
        .output(&[
            "run",
            "-d",
            "--pull=never",
            "--network=host",
            "--name",
            &name,
            "--label",
            &format!("{OWNER_LABEL}=4194304-1"),
            "-e",
            &format!("SLUICE_LISTEN=127.0.0.1:{}", free_port()),
            "-e",
            &format!("SLUICE_ADMIN_LISTEN=127.0.0.1:{}", free_port()),
            "-v",
            &format!("{}:{BINARY_IN_IMAGE}:ro", sidecar.display()),
            "--entrypoint",
            BINARY_IN_IMAGE,
            &base,
        ])
        .await
        .unwrap();
    assert!(exists(&podman, &name).await);
    let removed = podman.remove_orphans().await.unwrap();
    assert!(removed.contains(&name), "{removed:?}");
    assert!(!exists(&podman, &name).await);
}
