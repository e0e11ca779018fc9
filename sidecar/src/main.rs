//! `sluice-sidecar`: parse the command line, start tracing, install the signal handler, run the chosen
//! role until shutdown. Everything else is library code (see the crate docs of `sluice_sidecar`).

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Parser, Subcommand};
use sluice_crds::contract::env as var;
use sluice_sidecar::{
    config::env::ProcessEnv,
    proxy::{self, ProxyArgs, demo::DemoArgs},
    queue::role,
};
use tokio_util::sync::CancellationToken;

/// Sluice's sidecar: a rate-limiting reverse proxy (limits in Redis) and a PostgreSQL job-queue worker.
#[derive(Parser)]
#[command(name = "sluice-sidecar", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    proxy: ProxyArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Claim jobs from the queue and hand them to the handler over localhost HTTP.
    Worker(WorkerArgs),
    /// Apply the queue schema migrations to a database and exit.
    Migrate(MigrateArgs),
    /// Run a small app behind the sidecar with a demo rule and fire requests at it.
    Demo(DemoArgs),
}

/// Command-line arguments of the worker role.
#[derive(clap::Args, Debug)]
struct WorkerArgs {
    /// The config file (YAML, its `queue:` section). Without it the worker runs on env vars alone:
    /// SLUICE_DATABASE_URL, SLUICE_QUEUES (comma-separated), SLUICE_HANDLER_URL, SLUICE_WORKER_CONCURRENCY,
    /// SLUICE_API_LISTEN, SLUICE_METRICS_LISTEN.
    #[arg(long, env = var::CONFIG)]
    config: Option<PathBuf>,
}

/// Command-line arguments of `migrate`.
#[derive(clap::Args, Debug)]
struct MigrateArgs {
    /// The database to migrate.
    #[arg(long, env = var::DATABASE_URL)]
    database_url: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(path) = &cli.proxy.check_config {
        return match proxy::check_config(path, &ProcessEnv) {
            Ok(summary) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{}: invalid config", path.display());
                for e in errors.fields() {
                    eprintln!("  {e}");
                }
                ExitCode::FAILURE
            }
        };
    }
    init_tracing();
    let shutdown = shutdown_on_signals();
    let result = match cli.command {
        Some(Command::Worker(args)) => worker(args, shutdown).await,
        Some(Command::Migrate(args)) => role::migrate(&args.database_url)
            .await
            .map(|version| println!("queue schema is at version {version}")),
        Some(Command::Demo(args)) => proxy::demo::run(args, &ProcessEnv, shutdown).await,
        None => proxy::run(&cli.proxy, Arc::new(ProcessEnv), shutdown).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sluice-sidecar failed");
            eprintln!("sluice-sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn worker(args: WorkerArgs, shutdown: CancellationToken) -> sluice_sidecar::Result<()> {
    let text =
        match &args.config {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                sluice_sidecar::Error::Config(format!("reading config {}: {e}", path.display()))
            })?),
            None => None,
        };
    let cfg = role::load_worker_config(text.as_deref(), &ProcessEnv)?;
    role::run_worker(cfg, shutdown).await
}

/// Logs to stderr; `RUST_LOG` filters (default `info`), `SLUICE_LOG_FORMAT=json` switches to JSON lines.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var(var::LOG_FORMAT).is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A token cancelled on SIGTERM or SIGINT: every role drains when it fires.
fn shutdown_on_signals() -> CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            },
            _ => {
                tracing::warn!("cannot install signal handlers; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        cancel.cancel();
    });
    token
}
