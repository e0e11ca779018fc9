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
        Command::Probe { url } => {
            match sluice_operator::probe::probe_until(&url, sluice_operator::probe::PROBE_PATIENCE).await {
                Ok(status) => {
                    println!("{url}: {status}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("probe: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            telemetry::init(args.log_format);
            match run::run(*args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "sluice-operator failed");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
