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
