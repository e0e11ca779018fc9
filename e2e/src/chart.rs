//! The real Helm chart (`charts/sluice`), rendered with the real Helm SDK: `helm-python-sdk` (the Helm
//! Go library behind a Python binding, the same one `charts/test_chart.py` checks the chart with), so e2e
//! tests and the sandbox install exactly what `helm install` would, and apply it with `kubectl`.
//!
//! `python3` with `helm-python-sdk` must be installed (`make deps` installs it; `$PYTHON` picks another
//! interpreter). Hooks (`templates/tests/`, run by `helm test`) and `NOTES.txt` are left out, as
//! `helm install` leaves them out of the release's manifests; the chart's `crds/` are applied first with
//! [`crds_dir`], as `helm install` does.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};

/// Environment variable naming the Python interpreter (default `python3`).
pub const PYTHON_ENV: &str = "PYTHON";

/// Renders the chart and prints its manifests as one multi-document YAML stream.
const RENDER_SCRIPT: &str = r##"
import json, sys
import helm_python
chart_dir, release, namespace = sys.argv[1], sys.argv[2], sys.argv[3]
values = json.load(sys.stdin)
out = helm_python.Chart.load(chart_dir).render(values, name=release, namespace=namespace, is_install=True)
docs = []
for path, text in sorted(out.items()):
    if path.endswith("NOTES.txt") or "/templates/tests/" in path or not text.strip():
        continue
    docs.append("# Source: " + path + "\n" + text.strip() + "\n")
sys.stdout.write("---\n".join(docs))
"##;

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/sluice"))
}

/// The chart's `crds/` (checked equal to the generated `crds/` by the chart test).
pub fn crds_dir() -> PathBuf {
    chart_dir().join("crds")
}

/// Renders the chart for release `release` in `namespace` with `values` over the chart's defaults (as
/// `helm template --values`), checked against `values.schema.json` by Helm itself.
pub async fn render(values: &Value, release: &str, namespace: &str) -> Result<String> {
    let python = std::env::var_os(PYTHON_ENV)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into());
    let mut child = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(RENDER_SCRIPT)
        .arg(chart_dir())
        .args([release, namespace])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Config(format!("{}: {e} (set {PYTHON_ENV})", python.to_string_lossy())))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(values.to_string().as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let hint = if stderr.contains("No module named 'helm_python'") {
            " (install it: pip install helm-python-sdk, or run `make deps`)"
        } else {
            ""
        };
        return Err(Error::Config(format!(
            "rendering {} failed{hint}: {}",
            chart_dir().display(),
            stderr.trim()
        )));
    }
    String::from_utf8(out.stdout).map_err(|e| Error::Decode(e.to_string()))
}
