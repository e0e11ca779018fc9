//! Invalid sidecar configs (the table in `bad_input/config.rs`): `sluice-sidecar --check-config` refuses
//! each, exiting 1 with a line that names the field at fault; and each, written over the config file of
//! a running proxy, is refused by the hot reload with nothing of it applied.

#[path = "bad_input/config.rs"]
mod table;

use std::{collections::HashSet, process::Command, sync::Arc, time::Duration};

use sluice_sidecar::{
    clock::{SharedClock, SystemClock},
    config::{
        env::Env,
        load,
        reload::{ReloadOutcome, ReloadSource, watch_file},
    },
    proxy::{self, metrics::ReloadLabels},
};
use sluice_testsupport::wait_for_async;
use table::CASES;
use tokio_util::sync::CancellationToken;

#[test]
fn every_bad_config_in_the_table_is_distinct() {
    let mut seen = HashSet::new();
    for case in CASES {
        assert!(seen.insert(case.yaml), "listed twice:\n{}", case.yaml);
    }
}

#[test]
fn check_config_refuses_each_naming_the_field_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let path = dir.path().join(format!("{i}.yaml"));
        std::fs::write(&path, case.yaml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
            .arg("--check-config")
            .arg(&path)
            .env_remove("SLUICE_UPSTREAM")
            .env_remove("SLUICE_LISTEN")
            .env_remove("SLUICE_ADMIN_LISTEN")
            .env_remove("SLUICE_REDIS_URL")
            .env_remove("SLUICE_REDIS_CA_FILE")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let named = stderr.lines().any(|l| {
            let l = l.trim_start();
            let about_field = case.field == "-" || l.starts_with(&format!("{}:", case.field));
            about_field && l.contains(case.says)
        });
        if out.status.code() != Some(1) || !named {
            wrong.push(format!(
                "{:?} (exit {:?}): expected {}: …{}…, got:\n{stderr}",
                case.yaml,
                out.status.code(),
                case.field,
                case.says
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}

const RUNNING: &str = "version: 1\nlimits:\n  upstream: http://127.0.0.1:9\n  rules:\n  - name: all\n    limit: {requests: 100, window: 1m}\n";

#[tokio::test]
async fn a_hot_reload_refuses_each_and_keeps_the_running_config_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.yaml");
    std::fs::write(&path, RUNNING).unwrap();
    let env: Arc<dyn Env> = Arc::new([("SLUICE_POD_NAME", "test-pod")]);
    let (text, hash) = load::read(&path).unwrap();
    let clock: SharedClock = Arc::new(SystemClock);
    let state = proxy::build_state(load::from_yaml(&text, &*env).unwrap(), clock)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(watch_file(
        path.clone(),
        env,
        Duration::from_millis(10),
        hash,
        state.clone(),
        stop,
    ));
    let rejected = state.metrics.reloads.get_or_create(&ReloadLabels {
        source: ReloadSource::File,
        outcome: ReloadOutcome::Rejected,
    });
    let running = state.snapshot();
    for (i, case) in CASES.iter().enumerate() {
        let before = rejected.get();
        // Replaced in one step, as a ConfigMap volume's symlink swap does.
        let next = dir.path().join(format!("next-{i}.yaml"));
        std::fs::write(&next, case.yaml).unwrap();
        std::fs::rename(&next, &path).unwrap();
        wait_for_async(
            &format!("the reload to refuse {:?}", case.yaml),
            Duration::from_secs(10),
            || {
                let n = rejected.get();
                async move { (n > before).then_some(()) }
            },
        )
        .await;
        assert!(
            Arc::ptr_eq(&running, &state.snapshot()),
            "refusing {:?} changed the running config",
            case.yaml
        );
    }
    assert_eq!(rejected.get(), CASES.len() as u64);
}
