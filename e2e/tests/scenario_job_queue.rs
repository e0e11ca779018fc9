//! The job-queue scenario ([`sluice_e2e::scenarios::job_queue`]) on the in-memory control plane: 0 → 1
//! → N → 0 workers for 5,000 jobs, each succeeding once, a SIGKILLed worker's jobs rescued. The same
//! scenario runs on the real control plane (the real HPA controller) in `tests/real_control_plane.rs`.

use sluice_e2e::system::{SluiceSystem, SystemOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_queue_scales_from_zero_drains_five_thousand_jobs_exactly_once_and_returns_to_zero() {
    if sluice_e2e::system::skip_on_real_cluster("scenario_job_queue") {
        return;
    }
    let system = SluiceSystem::install(SystemOptions::new(env!("CARGO_BIN_EXE_sluice-demo-app").as_ref()))
        .await
        .unwrap();
    sluice_e2e::scenarios::job_queue::run(&system).await;
    system.shutdown().await;
}
