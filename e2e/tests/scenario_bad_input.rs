//! The bad-input scenario ([`sluice_e2e::scenarios::bad_input`]) on the in-memory control plane: bad
//! input through kubectl is refused with its message and nothing is half-applied. The same scenario runs
//! on the real control plane in `tests/real_control_plane.rs`.

use sluice_e2e::system::{SluiceSystem, SystemOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_through_kubectl_is_refused_with_its_message_and_nothing_is_half_applied() {
    if sluice_e2e::system::skip_on_real_cluster("scenario_bad_input") {
        return;
    }
    let system = SluiceSystem::install(SystemOptions::new(env!("CARGO_BIN_EXE_sluice-demo-app").as_ref()))
        .await
        .unwrap();
    sluice_e2e::scenarios::bad_input::run(&system).await;
    system.shutdown().await;
}
