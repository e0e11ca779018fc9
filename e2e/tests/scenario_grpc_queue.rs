//! The gRPC job-queue scenario ([`sluice_e2e::scenarios::grpc_queue`]) on the in-memory control plane:
//! a JobQueue with `handler.protocol: grpc` drained by the Python example worker in two worker pods,
//! every job enqueued through the queue HTTP API completed once. The same scenario runs on the real
//! control plane in `tests/real_control_plane.rs`.

use sluice_e2e::system::{SluiceSystem, SystemOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_job_queue_drained_by_the_python_example_worker_completes_every_job_once() {
    if sluice_e2e::system::skip_on_real_cluster("scenario_grpc_queue") {
        return;
    }
    let system = SluiceSystem::install(SystemOptions::new(env!("CARGO_BIN_EXE_sluice-demo-app").as_ref()))
        .await
        .unwrap();
    sluice_e2e::scenarios::grpc_queue::run(&system).await;
    system.shutdown().await;
}
