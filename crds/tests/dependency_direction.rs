//! The workspace's dependencies point one way (ARCHITECTURE.md): the API types and contracts (this
//! crate) link no runtime, the queue crate knows neither binary, the operator does not link the
//! sidecar, and the in-memory test API server links no Sluice crate. `cargo tree` answers for each crate as it is built on its own, so features another crate
//! turns on do not hide a dependency. The README's layout is checked against `cargo metadata` too.

use std::{collections::BTreeSet, path::Path, process::Command};

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ is in the workspace")
}

/// The packages `package` links through `edges` (`normal,build`; with `dev`, its tests' dependencies
/// too), transitively, by name.
fn linked(package: &str, edges: &str) -> BTreeSet<String> {
    cargo(&[
        "tree",
        "--locked",
        "--offline",
        "-p",
        package,
        "-e",
        edges,
        "--prefix",
        "none",
        "--format",
        "{p}",
    ])
    .lines()
    .filter_map(|l| l.split_whitespace().next())
    .map(str::to_owned)
    .collect()
}

fn assert_links_none(package: &str, edges: &str, forbidden: &[&str]) {
    let linked = linked(package, edges);
    let found: Vec<_> = forbidden.iter().filter(|f| linked.contains(**f)).collect();
    assert!(found.is_empty(), "{package} must not depend on {found:?}");
}

#[test]
fn the_api_types_link_no_runtime_or_client() {
    assert_links_none(
        "sluice-crds",
        "normal,build",
        &[
            "tokio",
            "mio",
            "hyper",
            "axum",
            "tower",
            "reqwest",
            "rustls",
            "fred",
            "sqlx",
            "kube-client",
            "kube-runtime",
            "sluice-queue",
            "sluice-sidecar",
            "sluice-operator",
        ],
    );
}

#[test]
fn the_queue_crate_knows_neither_binary() {
    assert_links_none(
        "sluice-queue",
        "normal,build",
        &["sluice-sidecar", "sluice-operator", "fred", "hyper", "axum"],
    );
}

#[test]
fn the_operator_does_not_link_the_sidecar_not_even_in_its_tests() {
    assert_links_none("sluice-operator", "normal,build,dev", &["sluice-sidecar"]);
}

#[test]
fn the_test_api_server_links_no_sluice_crate() {
    assert_links_none(
        "sluice-test-apiserver",
        "normal,build,dev",
        &[
            "sluice-crds",
            "sluice-queue",
            "sluice-sidecar",
            "sluice-operator",
            "sluice-e2e",
            "sluice-testsupport",
        ],
    );
}

#[test]
fn the_readme_layout_names_every_workspace_crate() {
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--locked",
        "--offline",
        "--no-deps",
        "--format-version",
        "1",
    ]))
    .unwrap();
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let layout = readme
        .split("## Layout")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("README.md has a Layout section with a code block");
    for package in metadata["packages"].as_array().unwrap() {
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        let dir = manifest
            .parent()
            .unwrap()
            .strip_prefix(workspace())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let named = layout
            .split(|c: char| c.is_whitespace() || "(),;`".contains(c))
            .any(|token| token == format!("{dir}/") || (dir.contains('/') && token == dir));
        assert!(
            named,
            "README.md's Layout does not name {dir}/ (package {})",
            package["name"]
        );
    }
    for line in layout.lines() {
        let Some(dir) = line.split_whitespace().next().filter(|d| d.ends_with('/')) else {
            continue;
        };
        // A directory with a workspace of its own (fuzz/) is not a member, and need not be.
        let is_crate = std::fs::read_to_string(workspace().join(dir).join("Cargo.toml"))
            .is_ok_and(|manifest| !manifest.lines().any(|l| l.trim() == "[workspace]"));
        let is_member = metadata["packages"].as_array().unwrap().iter().any(|p| {
            Path::new(p["manifest_path"].as_str().unwrap()).parent()
                == Some(&workspace().join(dir.trim_end_matches('/')))
        });
        assert!(
            !is_crate || is_member,
            "README.md's Layout lists {dir} as a crate the workspace does not have"
        );
    }
}
