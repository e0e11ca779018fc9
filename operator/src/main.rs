//! `sluice-operator`: parse the command line, start tracing, hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use sluice_operator::{
    config::{Cli, Command},
    crdgen, run, telemetry,
};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crdgen { dir } => match crdgen::write_all(&dir) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", dir.join(f).display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("crdgen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Probe { url } => match sluice_operator::probe::probe(&url).await {
            Ok(status) => {
                println!("{url}: {status}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("probe: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => {
            telemetry::init(args.log_format);
            let job_queues = start_job_queues();
            let outcome = run::run(*args).await;
            job_queues.cancel();
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "sluice-operator failed");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Starts the JobQueue controller (on the holder of its own Lease) and the external metrics API (every
/// replica) beside the rest of `run`, configured from the environment the chart sets. A bad setting
/// is logged and leaves the rest of the operator running.
fn start_job_queues() -> tokio_util::sync::CancellationToken {
    use sluice_operator::controller::job_queue;
    let stop = tokio_util::sync::CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        let args = match job_queue::JobQueueArgs::from_env() {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "JobQueue settings are invalid; JobQueues are not reconciled");
                return;
            }
        };
        let client = match kube::Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "no Kubernetes client for the JobQueue controller");
                return;
            }
        };
        if let Err(e) = job_queue::run_all(client, args, token).await {
            tracing::error!(error = %e, "the JobQueue controller stopped");
        }
    });
    stop
}
