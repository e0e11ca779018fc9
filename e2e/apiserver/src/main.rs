//! `sluice-test-apiserver`: runs the in-memory API server on its own and writes a kubeconfig for it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sluice_test_apiserver::{Options, TestApiServer};

/// An in-memory Kubernetes API server for Sluice's end-to-end tests and sandbox.
#[derive(Debug, Parser)]
#[command(version)]
struct Config {
    /// Where to write a kubeconfig that reaches this server.
    #[arg(long, env = "SLUICE_TEST_APISERVER_KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SLUICE_TEST_APISERVER_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    insecure_http: bool,
    /// The bearer token clients must present.
    #[arg(long, env = "SLUICE_TEST_APISERVER_TOKEN", default_value = sluice_test_apiserver::TOKEN_DEFAULT)]
    token: String,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let config = Config::parse();
    let options = Options {
        bind: config.listen,
        tls: !config.insecure_http,
        token: config.token,
        bookmark_interval: Duration::from_secs(config.bookmark_seconds.max(1)),
        ..Options::default()
    };
    let server = TestApiServer::start(options)
        .await
        .context("starting the server")?;
    server
        .write_kubeconfig(&config.kubeconfig)
        .with_context(|| format!("writing {}", config.kubeconfig.display()))?;
    println!(
        "serving {} (kubeconfig: {})",
        server.url(),
        config.kubeconfig.display()
    );
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    server.shutdown();
    Ok(())
}
