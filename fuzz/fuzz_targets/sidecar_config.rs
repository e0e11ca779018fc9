//! The sidecar's config file, parsed, resolved and applied as a hot reload is (the ConfigMap the
//! operator renders, or a file a user writes).
//!
//! Properties, beyond "never panics":
//! - a config is accepted or refused whole: a refused one names at least one field and leaves the
//!   running config exactly as it was; an accepted one runs exactly as resolved (never half-applied);
//! - what validation accepts, the running proxy accepts too (the limiter compiles it: `--check-config`
//!   never passes a config a reload would refuse);
//! - an accepted config written back out as YAML (as the operator renders one) reads back the same.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use prometheus_client::registry::Registry;
use sluice_sidecar::{
    clock::{SharedClock, SystemClock},
    config::{
        Effective, load,
        reload::{ReloadOutcome, ReloadSource},
        validate,
    },
    limiter::Limiter,
    proxy::{metrics::ProxyMetrics, state::ProxyState},
};

/// What runs before each reload: one rule, no policy.
const RUNNING: &str =
    "version: 1\nlimits:\n  rules:\n  - name: all\n    limit: {requests: 100, window: 1m}\n";

fn no_env() -> &'static [(&'static str, &'static str); 0] {
    &[]
}

fn running() -> &'static Effective {
    static RUNNING_CONFIG: OnceLock<Effective> = OnceLock::new();
    RUNNING_CONFIG.get_or_init(|| load::from_yaml(RUNNING, no_env()).expect("the running config is valid"))
}

fn state() -> ProxyState {
    let effective = running().clone();
    let limiter = Limiter::new(&effective.config.limits, effective.config.policy.as_ref()).unwrap();
    let mut registry = Registry::default();
    let metrics = ProxyMetrics::register(&mut registry);
    let clock: SharedClock = Arc::new(SystemClock);
    ProxyState::new(effective, Arc::new(limiter), metrics, registry, clock).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return; // the file reader refuses what is not UTF-8 before parsing
    };
    let candidate = load::from_yaml(text, no_env());
    let state = state();
    let before = state.snapshot();
    match candidate {
        Err(errors) => {
            assert!(errors.fields().next().is_some(), "a refusal names no field");
            assert!(errors.fields().all(|f| !f.message.is_empty()));
            // Offered as a reload: nothing changes.
            sluice_sidecar::config::reload::offer(&state, Err(errors), ReloadSource::File);
            assert!(
                Arc::ptr_eq(&before, &state.snapshot()),
                "a refused config changed the running one"
            );
        }
        Ok(effective) => {
            assert!(
                validate(&effective.config).is_ok(),
                "resolving twice validates differently"
            );
            assert!(!effective.config.limits.rules.is_empty());

            let rendered = serde_yaml::to_string(&effective.config).unwrap();
            let reread = load::parse(&rendered).unwrap_or_else(|e| {
                panic!("an accepted config written out does not read back: {e}\n{rendered}")
            });
            assert_eq!(reread, effective.config, "written out and read back:\n{rendered}");

            let stale = effective.config.policy.is_some() && effective.generation() < running().generation();
            match state.apply(effective.clone(), ReloadSource::File) {
                Ok(ReloadOutcome::Applied) => {
                    assert!(!stale);
                    assert_eq!(
                        state.snapshot().effective,
                        effective,
                        "applied, but not as resolved"
                    );
                }
                Ok(ReloadOutcome::Stale) => {
                    assert!(stale);
                    assert!(Arc::ptr_eq(&before, &state.snapshot()));
                }
                Ok(ReloadOutcome::Rejected) => unreachable!("refusals are errors"),
                Err(e) => panic!("validation accepted a config the running proxy refuses: {e}\n{text}"),
            }
        }
    }
});
