//! `sluice-sidecar`: parse the command line, start tracing, run the chosen role until shutdown.
//! Everything else is library code (see the crate docs of `sluice_sidecar`).

use clap::{Parser, Subcommand};

/// Sluice's sidecar: a rate-limiting reverse proxy (limits in Redis) and a PostgreSQL job-queue worker.
#[derive(Parser)]
#[command(name = "sluice-sidecar", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    proxy: sluice_sidecar::proxy::ProxyArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Claim jobs from the queue and hand them to the handler over localhost HTTP.
    Worker(sluice_sidecar::queue::WorkerArgs),
    /// Apply the queue schema migrations to a database and exit.
    Migrate(sluice_sidecar::queue::MigrateArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Worker(args)) => sluice_sidecar::queue::worker_main(args).await,
        Some(Command::Migrate(args)) => sluice_sidecar::queue::migrate_main(args).await,
        None => sluice_sidecar::proxy::main(cli.proxy).await,
    }
}
