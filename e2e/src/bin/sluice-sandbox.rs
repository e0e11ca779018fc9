//! `sluice-sandbox`: Sluice on this machine without a cluster (`make sandbox`). See
//! `sluice_e2e::sandbox` for what it starts and shows.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Run Sluice locally: the real operator and sidecars on an in-memory Kubernetes API server, with
/// throwaway Redis and PostgreSQL, and a live demo of rate limits and job-queue scaling.
#[derive(Debug, Parser)]
#[command(name = "sluice-sandbox", version)]
struct Args {
    /// Stop after this many seconds of demo (default: run until Ctrl-C).
    #[arg(long, env = "SLUICE_SANDBOX_DURATION")]
    duration: Option<u64>,
    /// The demo app binary (default: `sluice-demo-app` next to this binary).
    #[arg(long, env = "SLUICE_DEMO_APP_BIN")]
    demo_app: Option<PathBuf>,
    /// Folder of the manifests to apply.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/sandbox"))]
    examples: PathBuf,
    /// Run on a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager built from
    /// Go modules by e2e/kube/build.sh, the chart installed with helm) instead of the in-memory server.
    #[arg(long, env = "SLUICE_SANDBOX_REAL_CONTROL_PLANE")]
    real_control_plane: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("error,kube_client::client::builder=off")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let demo_app = match args.demo_app {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("sluice-demo-app"),
    };
    anyhow::ensure!(
        demo_app.is_file(),
        "{} not found: build it with `cargo build -p sluice-e2e --bins` (make sandbox does)",
        demo_app.display()
    );
    let options = sluice_e2e::sandbox::SandboxOptions {
        duration: args.duration.map(Duration::from_secs),
        demo_app,
        examples: args.examples.canonicalize().unwrap_or(args.examples),
        real_control_plane: args.real_control_plane,
    };
    let interrupt = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    sluice_e2e::sandbox::run(options, interrupt).await?;
    Ok(())
}
