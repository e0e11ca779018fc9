//! The CRD YAML checked in under `crds/` must match what the Rust types generate.

use std::path::PathBuf;

#[test]
fn checked_in_crd_yaml_matches_the_rust_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds");
    for (name, yaml) in sluice_operator::crdgen::crds() {
        let path = dir.join(&name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == yaml,
            "{} is stale: run `cargo run -p sluice-operator -- crdgen` and commit the result",
            path.display()
        );
    }
}

/// Not a check: writes the YAML when `SLUICE_WRITE_CRDS=1` (the same as `sluice-operator crdgen`, for
/// when the binary cannot be built).
#[test]
fn write_crds_when_asked() {
    if std::env::var_os("SLUICE_WRITE_CRDS").is_some() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds");
        sluice_operator::crdgen::write_all(&dir).unwrap();
    }
}
