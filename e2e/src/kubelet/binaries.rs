//! Finding Sluice's own binaries for the kubelet stand-in to run: `sluice-sidecar` and `sluice-operator`
//! from the shared target dir, built when missing, refused when older than their sources.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What the sidecar binary is built from (workspace folders), for the staleness check: only sources a
/// change of which makes Cargo relink the binary (not `Cargo.lock`, manifests or `migrations/`, which
/// can change without a relink and would look stale for ever).
const SIDECAR_SOURCES: &[&str] = &["crds/src", "queue/src", "sidecar/src"];
/// What the operator binary is built from.
const OPERATOR_SOURCES: &[&str] = &["crds/src", "queue/src", "operator/src"];

/// Finds the `sluice-sidecar` binary; see [`workspace_binary`] (`$SLUICE_SIDECAR_BIN` wins).
pub fn sidecar_binary() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("sluice-sidecar", "SLUICE_SIDECAR_BIN", SIDECAR_SOURCES))
        .clone()
        .map_err(Error::Config)
}

/// Finds the `sluice-operator` binary; see [`workspace_binary`] (`$SLUICE_OPERATOR_BIN` wins).
pub fn operator_binary() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("sluice-operator", "SLUICE_OPERATOR_BIN", OPERATOR_SOURCES))
        .clone()
        .map_err(Error::Config)
}

/// Finds a workspace binary (package and binary named `name`) in the shared target dir. A missing binary
/// is built with `cargo build -p NAME --bin NAME`; one older than any file under `sources` (workspace files
/// and folders it is built from) is an error naming the command to run, rather than a stale binary tested
/// silently or a build of minutes hidden inside a test's deadline. `$override_env` names a binary to use
/// as is.
///
/// Why not a Cargo artifact dependency: those are unstable, and `CARGO_BIN_EXE_*` only names binaries of
/// the crate under test. `cargo nextest run --workspace` (the test command) builds every binary first, so
/// in CI they are found fresh.
pub fn workspace_binary(name: &str, override_env: &str, sources: &[&str]) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(override_env).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let target = target_dir();
    let bin = target.join("debug").join(name);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    let newest_source = sources
        .iter()
        .filter_map(|dir| newest_mtime(&workspace.join(dir)))
        .max();
    let fresh = match (built, newest_source) {
        (Some(built), Some(source)) => built >= source,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if fresh {
        return Ok(bin);
    }
    if built.is_some() {
        return Err(format!(
            "{} is older than its sources: run `cargo build -p {name}` (the test command builds every \
             binary first), or set {override_env} to use it anyway",
            bin.display()
        ));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Cargo's own lock on the target dir serialises concurrent builds from parallel tests.
    let status = std::process::Command::new(cargo)
        .args(["build", "-p", name, "--bin", name])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&workspace)
        .status()
        .map_err(|e| format!("cargo build -p {name}: {e}"))?;
    if !status.success() || !bin.is_file() {
        return Err(format!("cargo build -p {name} failed ({status})"));
    }
    Ok(bin)
}

/// The newest modification time of `path`, or of the files under it (`target` and hidden folders
/// skipped).
fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(dir).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                if !hidden && entry.file_name() != "target" {
                    stack.push(path);
                }
            } else if let Ok(m) = meta.modified() {
                newest = newest.max(Some(m));
            }
        }
    }
    newest
}

/// The target dir: `$CARGO_TARGET_DIR`, else the one the running test executable lives in
/// (`target/debug/deps/<test>`), else `target` of the workspace.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(debug) = exe
            .ancestors()
            .find(|a| a.file_name().is_some_and(|n| n == "debug"))
        && let Some(target) = debug.parent()
    {
        return target.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_newest_source_time_covers_files_in_subfolders_but_not_target() {
        let dir = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let new = old + Duration::from_secs(60);
        std::fs::create_dir_all(dir.path().join("src/queue")).unwrap();
        std::fs::create_dir_all(dir.path().join("target")).unwrap();
        let set = |path: &Path, at: std::time::SystemTime| {
            std::fs::write(path, "x").unwrap();
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(at)
                .unwrap();
        };
        set(&dir.path().join("src/lib.rs"), old);
        set(&dir.path().join("src/queue/claim.rs"), new);
        set(&dir.path().join("target/built"), new + Duration::from_secs(60));
        assert_eq!(newest_mtime(dir.path()), Some(new));
        assert_eq!(newest_mtime(&dir.path().join("src/lib.rs")), Some(old));
        assert_eq!(newest_mtime(&dir.path().join("missing")), None);
    }
}
