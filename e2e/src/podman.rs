//! Containers run with Podman from local images: what the kubelet stand-in uses to run Sluice's real
//! images (`make images`) instead of the binaries as bare processes, so the image's user, its read-only
//! root filesystem, the chart's securityContext, mounts and env are exercised as a cluster would.
//!
//! - [`Podman`] runs the `podman` CLI (`$SLUICE_PODMAN`, else `podman` on PATH) with `CONTAINERS_CONF`
//!   pointing at the repository's `images/containers.conf` unless the caller's environment names one
//!   (cgroupfs manager, runc, no default ulimits: what a root Podman needs on Sluice's CI machines).
//! - [`ContainerSpec`] is what to run: image, entrypoint and args, env, bind mounts, user and groups,
//!   read-only root, capabilities, no-new-privileges, host network or published ports.
//!   [`Security::from_kubernetes`] turns a Pod's and a container's `securityContext` into those
//!   settings, refusing a `runAsNonRoot` container whose user would be root, as the kubelet does.
//! - [`Container`] is a running container: its host PID, signals, exit, logs. `podman run` stays
//!   attached (its output goes to the log file) and `--rm` removes the container when it exits.
//!   Dropping a `Container` removes it at once; containers left by a test process that died are
//!   removed by [`Podman::remove_orphans`] (each carries its owner's PID and start time as a label).
//!
//! Images are never pulled (`--pull=never`): there is no registry to pull from.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PodSecurityContext, SecurityContext};

use crate::error::{Error, Result};

/// The label naming the test process that owns a container (`<pid>-<start time>`).
pub const OWNER_LABEL: &str = "dev.sluice.e2e.owner";
/// How long a container may take from `podman run` to running.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// The `podman` CLI, as Sluice's tests run it.
#[derive(Clone, Debug)]
pub struct Podman {
    program: PathBuf,
    containers_conf: Option<PathBuf>,
}

impl Default for Podman {
    fn default() -> Self {
        Self::new()
    }
}

impl Podman {
    /// `$SLUICE_PODMAN` or `podman`; `$CONTAINERS_CONF`, else the repository's `images/containers.conf`.
    pub fn new() -> Podman {
        let program = std::env::var_os("SLUICE_PODMAN")
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from("podman"), PathBuf::from);
        let containers_conf = match std::env::var_os("CONTAINERS_CONF").filter(|p| !p.is_empty()) {
            Some(_) => None, // inherited
            None => Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/containers.conf")),
        };
        Podman {
            program,
            containers_conf,
        }
    }

    /// A `podman` command with this configuration.
    pub fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        if let Some(conf) = &self.containers_conf {
            cmd.env("CONTAINERS_CONF", conf);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    fn blocking_command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.program);
        if let Some(conf) = &self.containers_conf {
            cmd.env("CONTAINERS_CONF", conf);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Runs `podman ARGS` to completion; its stdout, or an error with its stderr.
    pub async fn output(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command()
            .args(args)
            .output()
            .await
            .map_err(|e| self.not_runnable(e))?;
        if !out.status.success() {
            return Err(Error::Container(format!(
                "podman {} exited {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn not_runnable(&self, e: std::io::Error) -> Error {
        Error::Container(format!(
            "cannot run {}: {e} (make deps installs podman and runc)",
            self.program.display()
        ))
    }

    /// Whether a local image of that name exists.
    pub async fn image_exists(&self, image: &str) -> Result<bool> {
        let status = self
            .command()
            .args(["image", "exists", image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .map_err(|e| self.not_runnable(e))?;
        Ok(status.success())
    }

    /// The image's configured user (`Config.User`, e.g. `65532:65532`; empty: root).
    pub async fn image_user(&self, image: &str) -> Result<String> {
        Ok(self
            .output(&["image", "inspect", "--format", "{{.Config.User}}", image])
            .await?
            .trim()
            .to_string())
    }

    /// Starts a container and waits until it runs. Its output goes to `spec.log` (or is dropped).
    pub async fn run(&self, spec: &ContainerSpec) -> Result<Container> {
        let user = match &spec.security.user {
            Some(u) => u.clone(),
            None => self.image_user(&spec.image).await?,
        };
        if spec.security.run_as_non_root && !is_non_root(&user) {
            return Err(Error::Container(format!(
                "{}: runAsNonRoot is set but the container would run as user {:?} (set runAsUser or a \
                 numeric non-zero USER in the image)",
                spec.name,
                if user.is_empty() { "root" } else { &user }
            )));
        }
        let (stdout, stderr) = match &spec.log {
            Some(path) => {
                let log = std::fs::File::create(path)?;
                (Stdio::from(log.try_clone()?), Stdio::from(log))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let child = self
            .command()
            .args(spec.run_args(&owner_label()))
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| self.not_runnable(e))?;
        let mut container = Container {
            podman: self.clone(),
            name: spec.name.clone(),
            log: spec.log.clone(),
            child,
            pid: 0,
            exited: None,
        };
        container.pid = container.wait_running().await?;
        Ok(container)
    }

    /// The runtime base Sluice's images are built on, assembled from Debian packages by
    /// `images/assemble-base.sh` when it is missing (a few seconds). Its name,
    /// `localhost/sluice-runtime-base:<ID><VERSION_ID>` after `/etc/os-release` (`debian12`), is the
    /// one `make images` uses. Tests run host-built binaries in it with a bind mount.
    pub async fn ensure_runtime_base(&self) -> Result<String> {
        let image = runtime_base_image();
        if self.image_exists(&image).await? {
            return Ok(image);
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = workspace.join("target/images");
        std::fs::create_dir_all(&out)?;
        // Test processes run in parallel: one assembles, the others wait and find it up to date.
        let mut cmd = tokio::process::Command::new("flock");
        cmd.arg(out.join(".assemble.lock"))
            .arg(workspace.join("images/assemble-base.sh"))
            .arg(&out)
            .arg(&image);
        if let Some(conf) = &self.containers_conf {
            cmd.env("CONTAINERS_CONF", conf);
        }
        let done = cmd.stdin(Stdio::null()).output().await?;
        if !done.status.success() {
            return Err(Error::Container(format!(
                "images/assemble-base.sh {} failed: {}",
                image,
                String::from_utf8_lossy(&done.stderr).trim()
            )));
        }
        Ok(image)
    }

    /// Removes containers whose owning test process is gone (it was killed before it could clean up).
    pub async fn remove_orphans(&self) -> Result<Vec<String>> {
        let listing = self
            .output(&[
                "ps",
                "--all",
                "--filter",
                &format!("label={OWNER_LABEL}"),
                "--format",
                &format!("{{{{.Names}}}} {{{{index .Labels \"{OWNER_LABEL}\"}}}}"),
            ])
            .await?;
        let mut removed = vec![];
        for line in listing.lines() {
            let Some((name, owner)) = line.split_once(' ') else {
                continue;
            };
            if !owner_alive(owner) {
                self.output(&["rm", "--force", "--time", "0", name]).await?;
                removed.push(name.to_string());
            }
        }
        Ok(removed)
    }
}

/// `localhost/sluice-runtime-base:<ID><VERSION_ID>` after `/etc/os-release`, as `images/build.sh` names it.
pub fn runtime_base_image() -> String {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |name: &str| {
        os.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default()
    };
    format!(
        "localhost/sluice-runtime-base:{}{}",
        field("ID"),
        field("VERSION_ID")
    )
}

/// `uid[:gid]` of a user that is not root. Names (other than numeric IDs) cannot be checked without
/// the image's passwd file, so they count as root, as the kubelet treats them.
fn is_non_root(user: &str) -> bool {
    let uid = user.split(':').next().unwrap_or("");
    uid.parse::<u32>().is_ok_and(|u| u != 0)
}

/// This process's owner label value: PID and start time (so a reused PID is not taken for it).
fn owner_label() -> String {
    let pid = std::process::id();
    format!("{pid}-{}", start_time(pid).unwrap_or_default())
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19).map(str::to_string)
}

fn owner_alive(owner: &str) -> bool {
    let Some((pid, started)) = owner.split_once('-') else {
        return false;
    };
    pid.parse::<u32>()
        .ok()
        .and_then(start_time)
        .is_some_and(|s| s == started)
}

/// How a container's process is confined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Security {
    /// `uid[:gid]`; `None`: the image's user.
    pub user: Option<String>,
    /// Supplementary groups (a Pod's `fsGroup` and `supplementalGroups`).
    pub groups: Vec<u32>,
    /// Refuse to start when the user would be root (or is a name that cannot be checked).
    pub run_as_non_root: bool,
    /// Mount the image's root filesystem read-only, with nothing writable added (no tmpfs on /tmp).
    pub read_only_root: bool,
    /// Capabilities dropped (`ALL` for every one) and added back, Kubernetes spelling (`NET_ADMIN`).
    pub cap_drop: Vec<String>,
    /// Capabilities added.
    pub cap_add: Vec<String>,
    /// `allowPrivilegeEscalation: false`: the `no_new_privs` bit.
    pub no_new_privileges: bool,
    /// `seccompProfile: Unconfined`; otherwise the runtime's default profile applies.
    pub seccomp_unconfined: bool,
}

impl Security {
    /// What the kubelet applies for a container with these securityContexts: the container's fields
    /// win over the Pod's (`runAsUser`, `runAsGroup`, `runAsNonRoot`, `seccompProfile`).
    pub fn from_kubernetes(
        pod: Option<&PodSecurityContext>,
        container: Option<&SecurityContext>,
    ) -> Security {
        let run_as_user = container
            .and_then(|c| c.run_as_user)
            .or_else(|| pod.and_then(|p| p.run_as_user));
        let run_as_group = container
            .and_then(|c| c.run_as_group)
            .or_else(|| pod.and_then(|p| p.run_as_group));
        let user = match (run_as_user, run_as_group) {
            (Some(u), Some(g)) => Some(format!("{u}:{g}")),
            (Some(u), None) => Some(u.to_string()),
            // A group alone keeps the image's user; Podman needs a user to name a group, so the
            // group is added as a supplementary one instead.
            (None, _) => None,
        };
        let mut groups: Vec<u32> = pod
            .into_iter()
            .flat_map(|p| {
                p.fs_group
                    .into_iter()
                    .chain(p.supplemental_groups.iter().flatten().copied())
            })
            .chain(run_as_group.filter(|_| run_as_user.is_none()))
            .filter_map(|g| u32::try_from(g).ok())
            .collect();
        groups.sort_unstable();
        groups.dedup();
        let caps = container.and_then(|c| c.capabilities.as_ref());
        let seccomp = container
            .and_then(|c| c.seccomp_profile.as_ref())
            .or_else(|| pod.and_then(|p| p.seccomp_profile.as_ref()));
        Security {
            user,
            groups,
            run_as_non_root: container
                .and_then(|c| c.run_as_non_root)
                .or_else(|| pod.and_then(|p| p.run_as_non_root))
                .unwrap_or(false),
            read_only_root: container
                .and_then(|c| c.read_only_root_filesystem)
                .unwrap_or(false),
            cap_drop: caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
            cap_add: caps.and_then(|c| c.add.clone()).unwrap_or_default(),
            no_new_privileges: container.and_then(|c| c.allow_privilege_escalation) == Some(false),
            seccomp_unconfined: seccomp.is_some_and(|s| s.type_ == "Unconfined"),
        }
    }
}

/// How the container is networked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Network {
    /// The host's network namespace: the container listens on and connects to the host's loopback,
    /// as the containers of one Pod share `localhost`.
    #[default]
    Host,
    /// A network namespace of its own; `(host port, container port)` pairs published on 127.0.0.1.
    Private(Vec<(u16, u16)>),
}

/// A bind mount of a host path into the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Path on the host.
    pub host: PathBuf,
    /// Path in the container.
    pub container: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSpec {
    /// A local image (never pulled).
    pub image: String,
    /// The container's name (unique among running containers).
    pub name: String,
    /// Replaces the image's entrypoint (a Kubernetes container's `command`); the image's CMD is then
    /// dropped too, as in Kubernetes.
    pub entrypoint: Option<Vec<String>>,
    /// Replaces the image's CMD (a Kubernetes container's `args`).
    pub args: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// User, groups, read-only root, capabilities.
    pub security: Security,
    /// Host network or published ports.
    pub network: Network,
    /// The container's hostname (a Pod's name); with the host network, only `HOSTNAME` in its env.
    pub hostname: Option<String>,
    /// Where the container's stdout and stderr go.
    pub log: Option<PathBuf>,
}

impl ContainerSpec {
    /// `image` as `name`, its own entrypoint and user, host network, nothing else set.
    pub fn new(image: &str, name: &str) -> ContainerSpec {
        ContainerSpec {
            image: image.into(),
            name: name.into(),
            entrypoint: None,
            args: vec![],
            env: vec![],
            mounts: vec![],
            security: Security::default(),
            network: Network::Host,
            hostname: None,
            log: None,
        }
    }

    /// The arguments of `podman run` for this spec; `owner` is the [`OWNER_LABEL`] value.
    pub fn run_args(&self, owner: &str) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--pull=never".into(),
            "--name".into(),
            self.name.clone(),
            "--label".into(),
            format!("{OWNER_LABEL}={owner}"),
            // SIGTERM and SIGKILL are sent by name with `podman kill`; stdin stays closed.
            "--sig-proxy=false".into(),
        ];
        match &self.network {
            Network::Host => a.push("--network=host".into()),
            Network::Private(ports) => {
                for (host, container) in ports {
                    a.push("--publish".into());
                    a.push(format!("127.0.0.1:{host}:{container}"));
                }
            }
        }
        match (&self.hostname, &self.network) {
            (Some(h), Network::Private(_)) => a.extend(["--hostname".into(), h.clone()]),
            (Some(h), Network::Host) => a.extend(["--env".into(), format!("HOSTNAME={h}")]),
            (None, _) => {}
        }
        let s = &self.security;
        if let Some(user) = &s.user {
            a.extend(["--user".into(), user.clone()]);
        }
        for g in &s.groups {
            a.extend(["--group-add".into(), g.to_string()]);
        }
        if s.read_only_root {
            a.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
        }
        for cap in &s.cap_drop {
            a.push(format!("--cap-drop={}", cap.to_lowercase()));
        }
        for cap in &s.cap_add {
            a.push(format!("--cap-add={}", cap.to_lowercase()));
        }
        if s.no_new_privileges {
            a.push("--security-opt=no-new-privileges".into());
        }
        if s.seccomp_unconfined {
            a.push("--security-opt=seccomp=unconfined".into());
        }
        for m in &self.mounts {
            let mode = if m.read_only { "ro" } else { "rw" };
            a.push("--volume".into());
            a.push(format!("{}:{}:{mode}", m.host.display(), m.container));
        }
        for (k, v) in &self.env {
            a.push("--env".into());
            a.push(format!("{k}={v}"));
        }
        if let Some(entrypoint) = &self.entrypoint {
            // A JSON array keeps arguments with spaces intact.
            a.push(format!(
                "--entrypoint={}",
                serde_json::to_string(entrypoint).expect("strings serialise")
            ));
        }
        a.push(self.image.clone());
        a.extend(self.args.iter().cloned());
        a
    }
}

/// A running container. Dropping it removes the container (SIGKILL) if it still runs.
pub struct Container {
    podman: Podman,
    name: String,
    log: Option<PathBuf>,
    /// The attached `podman run`: it exits with the container's exit code.
    child: tokio::process::Child,
    pid: u32,
    exited: Option<i32>,
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .finish()
    }
}

impl Container {
    /// The container's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host PID of the container's main process (its entrypoint), as it was started.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What the container wrote so far (stdout and stderr), when it has a log file.
    pub fn logs(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    async fn wait_running(&mut self) -> Result<u32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::Container(format!(
                    "{}: podman run exited {status} before the container ran: {}",
                    self.name,
                    self.logs().trim()
                )));
            }
            let state = self
                .podman
                .command()
                .args([
                    "container",
                    "inspect",
                    "--format",
                    "{{.State.Status}} {{.State.Pid}}",
                    &self.name,
                ])
                .stderr(Stdio::null())
                .output()
                .await?;
            let text = String::from_utf8_lossy(&state.stdout);
            if let Some(("running", pid)) = text.trim().split_once(' ')
                && let Ok(pid) = pid.parse::<u32>()
                && pid != 0
            {
                return Ok(pid);
            }
            if start.elapsed() > START_DEADLINE {
                return Err(Error::Timeout(
                    START_DEADLINE,
                    format!("container {} to run", self.name),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The exit code once the container has exited (`podman run` passes it on), without waiting.
    pub fn try_exit_code(&mut self) -> Result<Option<i32>> {
        if self.exited.is_none()
            && let Some(status) = self.child.try_wait()?
        {
            self.exited = Some(status.code().unwrap_or(-1));
        }
        Ok(self.exited)
    }

    /// Waits for the container to exit; its exit code.
    pub async fn wait(&mut self) -> Result<i32> {
        if let Some(code) = self.exited {
            return Ok(code);
        }
        let status = self.child.wait().await?;
        let code = status.code().unwrap_or(-1);
        self.exited = Some(code);
        Ok(code)
    }

    /// Sends a signal (`TERM`, `KILL`, `STOP`, …) to the container's main process.
    pub async fn signal(&self, signal: &str) -> Result<()> {
        self.podman
            .output(&["kill", "--signal", signal, &self.name])
            .await
            .map(drop)
    }

    /// SIGKILL now, without waiting (a crash). False when the container could not be signalled.
    pub fn start_kill(&self) -> bool {
        self.podman
            .blocking_command()
            .args(["kill", "--signal", "KILL", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stops the container as the kubelet does: SIGTERM, then SIGKILL after `grace`. Its exit code.
    pub async fn stop(&mut self, grace: Duration) -> Result<i32> {
        if self.try_exit_code()?.is_none() {
            // It may exit between the check and the signal: a failed signal is not an error.
            let _ = self.signal("TERM").await;
            if tokio::time::timeout(grace, self.wait()).await.is_err() {
                let _ = self.signal("KILL").await;
            }
        }
        self.wait().await
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.exited.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            // Killing the attached `podman run` would leave the container running: remove it.
            let _ = self
                .podman
                .blocking_command()
                .args(["rm", "--force", "--time", "0", &self.name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile};

    fn chart_operator() -> (PodSecurityContext, SecurityContext) {
        (
            PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                fs_group: Some(65532),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    add: None,
                }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn the_charts_security_context_becomes_user_read_only_root_and_no_capabilities() {
        let (pod, container) = chart_operator();
        let s = Security::from_kubernetes(Some(&pod), Some(&container));
        assert_eq!(
            s,
            Security {
                user: Some("65532:65532".into()),
                groups: vec![65532],
                run_as_non_root: true,
                read_only_root: true,
                cap_drop: vec!["ALL".into()],
                cap_add: vec![],
                no_new_privileges: true,
                seccomp_unconfined: false,
            }
        );
        let mut spec = ContainerSpec::new("localhost/sluice-operator:0.1.0", "op");
        spec.security = s;
        let args = spec.run_args("1-2").join(" ");
        for want in [
            "--user 65532:65532",
            "--group-add 65532",
            "--read-only --read-only-tmpfs=false",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "--network=host",
            "--pull=never",
            "--label dev.sluice.e2e.owner=1-2",
        ] {
            assert!(args.contains(want), "{want:?} missing from {args}");
        }
        assert!(args.ends_with("localhost/sluice-operator:0.1.0"), "{args}");
    }

    #[test]
    fn the_containers_fields_win_over_the_pods() {
        let (mut pod, _) = chart_operator();
        pod.seccomp_profile = None;
        let container = SecurityContext {
            run_as_user: Some(1000),
            run_as_non_root: Some(false),
            seccomp_profile: Some(SeccompProfile {
                type_: "Unconfined".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = Security::from_kubernetes(Some(&pod), Some(&container));
        assert_eq!(s.user.as_deref(), Some("1000:65532"));
        assert!(!s.run_as_non_root);
        assert!(s.seccomp_unconfined);
        assert!(!s.read_only_root);
        assert_eq!(Security::from_kubernetes(None, None), Security::default());
    }

    #[test]
    fn a_group_without_a_user_is_a_supplementary_group() {
        let pod = PodSecurityContext {
            run_as_group: Some(3000),
            supplemental_groups: Some(vec![4000, 3000]),
            ..Default::default()
        };
        let s = Security::from_kubernetes(Some(&pod), None);
        assert_eq!(s.user, None);
        assert_eq!(s.groups, vec![3000, 4000]);
    }

    #[test]
    fn only_numeric_non_zero_users_count_as_non_root() {
        assert!(is_non_root("65532:65532"));
        assert!(is_non_root("1000"));
        assert!(!is_non_root(""));
        assert!(!is_non_root("0:0"));
        assert!(!is_non_root("nonroot"));
    }

    #[test]
    fn entrypoint_args_mounts_env_and_published_ports_are_passed_through() {
        let mut spec = ContainerSpec::new("img", "c1");
        spec.entrypoint = Some(vec!["/bin/app".into(), "--flag with space".into()]);
        spec.args = vec!["serve".into()];
        spec.env = vec![("A".into(), "b=c".into())];
        spec.mounts = vec![Mount {
            host: "/tmp/cfg".into(),
            container: "/etc/app".into(),
            read_only: true,
        }];
        spec.network = Network::Private(vec![(40001, 8080)]);
        spec.hostname = Some("web-1".into());
        let args = spec.run_args("1-2");
        let joined = args.join(" ");
        assert!(joined.contains("--publish 127.0.0.1:40001:8080"), "{joined}");
        assert!(joined.contains("--hostname web-1"), "{joined}");
        assert!(joined.contains("--volume /tmp/cfg:/etc/app:ro"), "{joined}");
        assert!(joined.contains("--env A=b=c"), "{joined}");
        assert!(!joined.contains("--network=host"), "{joined}");
        assert!(args.contains(&r#"--entrypoint=["/bin/app","--flag with space"]"#.to_string()));
        assert_eq!(&args[args.len() - 2..], ["img", "serve"]);
    }

    #[test]
    fn this_process_is_alive_as_an_owner_and_a_dead_or_reused_pid_is_not() {
        assert!(owner_alive(&owner_label()));
        let pid = std::process::id();
        assert!(!owner_alive(&format!("{pid}-1")));
        assert!(!owner_alive("4194304-1"));
        assert!(!owner_alive("garbage"));
    }
}
