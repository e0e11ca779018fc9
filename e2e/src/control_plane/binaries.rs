//! The pinned control-plane binaries (`e2e/kube/versions.env`): kube-apiserver, kube-controller-manager
//! and kubectl of one Kubernetes release, etcd and the Helm CLI, built from Go modules by
//! `e2e/kube/build.sh` into a cache outside the repository and found there.
//!
//! [`Binaries::find_or_build`] runs `build.sh`, which checks each tool's stamp and exits at once when
//! everything is built; otherwise it builds (10–20 minutes cold on 2 cores) and says so on stderr.
//! `make e2e-tools` (part of `make test`) runs it before the tests, so in CI the tests only find them.
//! Without Go or the module proxy `build.sh` exits with a message naming what is missing, and that
//! message is the error. `$SLUICE_KUBE_BIN_DIR` names a directory holding all five binaries instead.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The pins, as `e2e/kube/versions.env` writes them.
pub const VERSIONS_ENV: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/kube/versions.env"));
/// Environment variable naming a directory with all the binaries (skips `build.sh`).
pub const BIN_DIR_ENV: &str = "SLUICE_KUBE_BIN_DIR";

/// A pinned version from `versions.env` (`KUBERNETES_VERSION`, `ETCD_VERSION`, `HELM_VERSION`).
pub fn pinned(name: &str) -> Option<&'static str> {
    VERSIONS_ENV
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .map(str::trim)
}

/// Where each binary is.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kubectl` of the same release.
    pub kubectl: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `helm`.
    pub helm: PathBuf,
}

impl Binaries {
    /// All five in one directory.
    pub fn in_dir(dir: &Path) -> Self {
        Binaries {
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kubectl: dir.join("kubectl"),
            etcd: dir.join("etcd"),
            helm: dir.join("helm"),
        }
    }

    /// `$SLUICE_KUBE_BIN_DIR`, else what `e2e/kube/build.sh` built (building it first when needed).
    /// Runs the script once per process.
    pub fn find_or_build() -> Result<Self> {
        static FOUND: OnceLock<Result<Binaries, String>> = OnceLock::new();
        FOUND
            .get_or_init(|| {
                let found = match std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
                    Some(dir) => Binaries::in_dir(Path::new(&dir)),
                    None => run_build_script()?,
                };
                found.check()?;
                Ok(found)
            })
            .clone()
            .map_err(Error::Config)
    }

    fn check(&self) -> Result<(), String> {
        for bin in [
            &self.kube_apiserver,
            &self.kube_controller_manager,
            &self.kubectl,
            &self.etcd,
            &self.helm,
        ] {
            if !bin.is_file() {
                return Err(format!("{} is missing (run e2e/kube/build.sh)", bin.display()));
            }
        }
        Ok(())
    }
}

/// The build script's path.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kube/build.sh")
}

fn run_build_script() -> Result<Binaries, String> {
    let script = build_script();
    // stderr passes through: a cold build says what it builds and how long it took.
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): the real control plane is built from Go modules; see its message above",
            script.display(),
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = |tool: &str| -> Result<PathBuf, String> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(tool)?.strip_prefix('='))
            .map(PathBuf::from)
            .ok_or_else(|| format!("{} printed no {tool}= line: {stdout}", script.display()))
    };
    let kubernetes = dir("kubernetes")?;
    Ok(Binaries {
        kube_apiserver: kubernetes.join("kube-apiserver"),
        kube_controller_manager: kubernetes.join("kube-controller-manager"),
        kubectl: kubernetes.join("kubectl"),
        etcd: dir("etcd")?.join("etcd"),
        helm: dir("helm")?.join("helm"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_are_read_from_versions_env() {
        assert!(pinned("KUBERNETES_VERSION").is_some_and(|v| v.starts_with("v1.")));
        assert!(pinned("ETCD_VERSION").is_some_and(|v| v.starts_with("v3.")));
        assert!(pinned("HELM_VERSION").is_some_and(|v| v.starts_with('v')));
        assert_eq!(pinned("NOT_A_PIN"), None);
    }
}
