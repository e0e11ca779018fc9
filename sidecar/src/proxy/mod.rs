//! The rate-limiting reverse proxy and its admin endpoints.

/// Command-line arguments of the proxy role.
#[derive(clap::Args, Debug, Default)]
pub struct ProxyArgs {
    /// The config file (YAML). Without it the sidecar runs on env vars alone, with the seed tiers as rules.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

/// Runs the proxy role until SIGTERM.
pub async fn main(_args: ProxyArgs) -> anyhow::Result<()> {
    anyhow::bail!("the proxy role is being built")
}
