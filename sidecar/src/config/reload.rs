//! Hot reload from the config file. The file is polled and its resolved content hashed, so a ConfigMap
//! volume's atomic `..data` symlink swap is seen exactly like an edit in place; modification times and
//! inotify events on the old target are not relied on. A bad file keeps the running config and logs
//! every field at fault; the next change is read again.

use std::{path::PathBuf, sync::Arc, time::Duration};

use prometheus_client::encoding::EncodeLabelValue;
use tokio_util::sync::CancellationToken;

use super::{ConfigErrors, Effective, env::Env, load};

/// How often the file is read by default (a ConfigMap update reaches the volume within about a minute;
/// a cheap read every second keeps the sidecar's own share of that delay negligible).
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Where a config came from.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ReloadSource {
    /// The config file.
    File,
    /// The Redis config channel.
    Redis,
}

/// What became of a reload.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ReloadOutcome {
    /// Validated and running.
    Applied,
    /// Invalid; the running config stays.
    Rejected,
    /// Older than the running policy generation; ignored.
    Stale,
}

/// What applies configs (the proxy state).
pub trait ConfigSink: Send + Sync {
    /// Applies a validated config (or refuses it, keeping the running one).
    fn apply(&self, config: Effective, source: ReloadSource) -> Result<ReloadOutcome, ConfigErrors>;
    /// Counts a config that failed validation before reaching [`apply`](Self::apply).
    fn rejected(&self, source: ReloadSource);
    /// Policy generation of the running config.
    fn running_generation(&self) -> i64;
}

/// Validates and applies one candidate, logging the outcome. Shared by the file and Redis paths so both
/// behave the same.
pub fn offer(sink: &dyn ConfigSink, candidate: Result<Effective, ConfigErrors>, source: ReloadSource) {
    let outcome = candidate.and_then(|c| {
        let generation = c.generation();
        sink.apply(c, source).map(|o| (o, generation))
    });
    match outcome {
        Ok((ReloadOutcome::Applied, generation)) => {
            tracing::info!(?source, generation, "config reloaded")
        }
        Ok((outcome, generation)) => tracing::info!(?source, generation, ?outcome, "config not applied"),
        Err(errors) => {
            sink.rejected(source);
            for e in errors.fields() {
                tracing::error!(?source, field = %e.path, "config rejected, running config kept: {e}");
            }
        }
    }
}

/// Watches `path` until `shutdown`: every `interval` the file is read and, when its bytes changed since
/// the last look, parsed, validated and offered to `sink`. `initial_hash` is the hash of the content the
/// sidecar started with.
pub async fn watch_file(
    path: PathBuf,
    env: Arc<dyn Env>,
    interval: Duration,
    initial_hash: u64,
    sink: Arc<dyn ConfigSink>,
    shutdown: CancellationToken,
) {
    let mut last_hash = initial_hash;
    let mut last_read_error: Option<String> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let (text, hash) = match load::read(&path) {
            Ok(read) => {
                last_read_error = None;
                read
            }
            Err(e) => {
                // A file briefly missing mid-swap is not a config change; say so once, not every tick.
                let msg = e.to_string();
                if last_read_error.as_deref() != Some(&msg) {
                    tracing::warn!("config file unreadable, running config kept: {msg}");
                    last_read_error = Some(msg);
                }
                continue;
            }
        };
        if hash == last_hash {
            continue;
        }
        last_hash = hash;
        offer(&*sink, load::from_yaml(&text, &*env), ReloadSource::File);
    }
}
