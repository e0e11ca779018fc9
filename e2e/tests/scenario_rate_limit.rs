//! The rate-limit scenario ([`sluice_e2e::scenarios::rate_limit`]) on the in-memory control plane: a
//! RateLimitPolicy applied with kubectl limits injected pods, follows changes and survives Redis going
//! away. The same scenario runs on the real control plane in `tests/real_control_plane.rs`.

use sluice_e2e::system::{SluiceSystem, SystemOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_applied_with_kubectl_limits_injected_pods_follows_changes_and_survives_redis_going_away() {
    if sluice_e2e::system::skip_on_real_cluster("scenario_rate_limit") {
        return;
    }
    // `make test` names the images it built: the operator and sidecar then run from them with Podman.
    let options = SystemOptions::new(env!("CARGO_BIN_EXE_sluice-demo-app").as_ref())
        .images_from_env("scenario_rate_limit");
    let system = SluiceSystem::install(options).await.unwrap();
    sluice_e2e::scenarios::rate_limit::run(&system).await;
    system.shutdown().await;
}
