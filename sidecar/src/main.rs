//! `sluice-sidecar`: parse the command line, start tracing, run the chosen role until shutdown.
//! Everything else is library code (see the crate docs of `sluice_sidecar`).

use clap::{Parser, Subcommand};
use sluice_sidecar::config::env::ProcessEnv;

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
    /// Run a small app behind the sidecar with a demo rule and fire requests at it.
    Demo(sluice_sidecar::proxy::demo::DemoArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(path) = &cli.proxy.check_config {
        match sluice_sidecar::proxy::check_config(path, &ProcessEnv) {
            Ok(summary) => {
                println!("{summary}");
                return Ok(());
            }
            Err(errors) => {
                eprintln!("{}: invalid config", path.display());
                for e in errors.fields() {
                    eprintln!("  {e}");
                }
                std::process::exit(1);
            }
        }
    }
    init_tracing();
    match cli.command {
        Some(Command::Worker(args)) => sluice_sidecar::queue::worker_main(args).await,
        Some(Command::Migrate(args)) => sluice_sidecar::queue::migrate_main(args).await,
        Some(Command::Demo(args)) => sluice_sidecar::proxy::demo::run(args, &ProcessEnv).await,
        None => sluice_sidecar::proxy::main(cli.proxy).await,
    }
}

/// Logs to stderr; `RUST_LOG` filters (default `info`), `SLUICE_LOG_FORMAT=json` switches to JSON lines.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("SLUICE_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
