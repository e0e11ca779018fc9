//! The PostgreSQL job queue: schema, store, worker, HTTP API and client library.

/// Command-line arguments of the worker role.
#[derive(clap::Args, Debug, Default)]
pub struct WorkerArgs {
    /// The config file (YAML). Without it the worker runs on env vars alone.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

/// Command-line arguments of `migrate`.
#[derive(clap::Args, Debug, Default)]
pub struct MigrateArgs {
    /// The database to migrate.
    #[arg(long, env = "SLUICE_DATABASE_URL")]
    pub database_url: Option<String>,
}

/// Runs the worker role until SIGTERM.
pub async fn worker_main(_args: WorkerArgs) -> anyhow::Result<()> {
    anyhow::bail!("the worker role is being built")
}

/// Applies the migrations and exits.
pub async fn migrate_main(_args: MigrateArgs) -> anyhow::Result<()> {
    anyhow::bail!("migrate is being built")
}
