//! `sluice-sidecar`: Sluice's data plane, in front of (or beside) an application container.
//!
//! Two roles share one binary:
//! - **proxy** (default): a reverse proxy that enforces cluster-wide rate limits kept in Redis before a
//!   request reaches the app on localhost; health, readiness and Prometheus metrics on an admin port; and,
//!   in pods that enqueue through the sidecar, the queue HTTP API.
//! - **worker**: claims jobs from the PostgreSQL queue (`FOR UPDATE SKIP LOCKED`, in batches) and hands
//!   each to the team's handler over localhost HTTP.
//!
//! It depends on `sluice-crds` (the config schema, its validation and the contracts it shares with the
//! operator) and `sluice-queue` (the store and all SQL); it knows nothing of the Kubernetes API.
//!
//! Layout (roughly bottom up): [`clock`] (re-exported from `sluice-crds`) and [`error`]; [`http1`] (the
//! HTTP/1.1 codec: response heads, header fields, hop-by-hop rules, body framing, the chunked coding);
//! [`redis`] (connecting, TLS, why a connection fails); [`config`] (loading, env overrides, hot reload);
//! [`limiter`] (rules, keys, algorithms, Redis store, circuit breaker, local fallback); [`queue`] (worker
//! engine, HTTP dispatch, queue HTTP API, client library, the roles' wiring); [`proxy`] (HTTP forwarding,
//! the admin endpoints, the proxy role). `main.rs` parses the command line and calls one role. Both
//! [`queue`] (its dispatch to the job handler) and [`proxy`] (its fast path) read HTTP/1.1 with
//! [`http1`]; the queue does not depend on the proxy (the proxy role serves the queue HTTP API through
//! `queue::role`), and [`http1`] depends on neither.

pub mod config;
pub mod error;
pub mod http1;
pub mod limiter;
pub mod proxy;
pub mod queue;
pub mod redis;

pub use error::{Error, Result};
pub use sluice_crds::clock;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Every `.rs` file under `src/{dir}`, with its text.
    fn sources(dir: &str) -> Vec<(PathBuf, String)> {
        let mut files = Vec::new();
        let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir)];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    files.push((path, text));
                }
            }
        }
        assert!(!files.is_empty(), "no sources under src/{dir}");
        files
    }

    /// The lines of `text`, line comments left out, that name a path through any of `modules`
    /// (`limiter::` in `crate::limiter::X`, `super::limiter::X` or a grouped `use crate::{limiter::X}`,
    /// but not in `rate_limiter::X`).
    fn naming<'a>(text: &'a str, modules: &[&str]) -> Vec<&'a str> {
        text.lines()
            .filter(|line| {
                let code = line.split("//").next().unwrap_or_default();
                modules.iter().any(|m| {
                    code.match_indices(&format!("{m}::")).any(|(at, _)| {
                        !code[..at]
                            .chars()
                            .next_back()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    })
                })
            })
            .collect()
    }

    /// The files under `src/{dir}` with the lines that name any of `modules`.
    fn files_naming(dir: &str, modules: &[&str]) -> Vec<String> {
        sources(dir)
            .iter()
            .flat_map(|(path, text)| {
                naming(text, modules)
                    .into_iter()
                    .map(|line| format!("{}: {}", path.display(), line.trim()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn a_module_is_found_however_its_path_is_written() {
        for text in [
            "use crate::limiter::X;",
            "use crate::{\n    error::E,\n    limiter::X,\n};",
            "use super::limiter::X;",
            "let x = crate::limiter::X::new();",
        ] {
            assert_eq!(naming(text, &["limiter"]).len(), 1, "{text:?}");
        }
        for text in [
            "use rate_limiter::X;",
            "// see crate::limiter::X",
            "use crate::limiterx::Y;",
        ] {
            assert!(naming(text, &["limiter"]).is_empty(), "{text:?}");
        }
    }

    #[test]
    fn the_http1_codec_names_neither_of_its_users_and_the_queue_not_the_proxy() {
        let codec = files_naming("http1", &["proxy", "queue", "limiter", "config", "redis"]);
        assert!(codec.is_empty(), "http1 is below its users: {codec:#?}");
        let queue = files_naming("queue", &["proxy"]);
        assert!(
            queue.is_empty(),
            "the queue does not depend on the proxy: {queue:#?}"
        );
    }
}
