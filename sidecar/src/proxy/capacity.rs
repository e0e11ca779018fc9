//! What slow or idle clients may hold, so that no number of them takes the sidecar past its memory
//! limit (and the app, which only the sidecar's port reaches, with it): a cap on open client connections
//! (`limits.maxConnections`, by default derived from the container's memory limit) and a budget of bytes
//! for request heads longer than a connection's own small buffer.
//!
//! Over the cap a connection is closed as soon as it is accepted, before anything is read or written:
//! that costs the proxy nothing, and a load balancer reads a closed connection as "try another
//! endpoint", where a `503` would have cost a response and reached the client as an answer. A head that
//! would take more than the budget has left is answered `431` and its connection closed.
//!
//! Per connection the proxy keeps a few KiB while a client is quiet (see [`CONNECTION_MEMORY`]); heads
//! up to [`HEAD_FREE`] fit in that. The derivation keeps [`PROCESS_RESERVE`] for the process itself
//! (runtime, limiter state, config), gives a quarter of the rest to long heads and divides the remainder
//! by [`CONNECTION_MEMORY`]: a 64 MiB sidecar takes 2,304 connections and 12 MiB of long heads.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use prometheus_client::metrics::gauge::Gauge;
use sluice_crds::sidecar_config::{LimitsConfig, MAX_CONNECTIONS_UNLIMITED_MEMORY};

/// What one connection may cost on average: its task, buffers of a few KiB (allocated once the client
/// sends something), the connection to the app with its buffer, and the allocator's slack.
pub const CONNECTION_MEMORY: u64 = 16 * 1024;
/// Memory kept for the process itself, whatever the connections take.
pub const PROCESS_RESERVE: u64 = 16 * 1024 * 1024;
/// Bytes of a request head a connection holds without drawing on the head budget.
pub const HEAD_FREE: usize = 4 * 1024;
/// The head budget when the container has no memory limit.
pub const HEAD_BUDGET_UNLIMITED_MEMORY: usize = 64 * 1024 * 1024;
/// File descriptors kept for everything but client connections (listeners, Redis, config, logs).
const FD_RESERVE: u64 = 64;
/// A memory limit at least this large is no limit (cgroup v1 writes "unlimited" as about 2^63).
const NO_LIMIT_ABOVE: u64 = 1 << 50;

/// The caps in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Most client connections open at once.
    pub max_connections: usize,
    /// Bytes all request heads beyond [`HEAD_FREE`] each may hold together.
    pub head_budget: usize,
}

/// What the process runs within: its memory limit and its file-descriptor limit, when known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// The container's memory limit in bytes.
    pub memory_limit: Option<u64>,
    /// The soft `RLIMIT_NOFILE`.
    pub fd_limit: Option<u64>,
}

impl Environment {
    /// The memory limit (`SLUICE_MEMORY_LIMIT` when set, else the process's cgroup's: v2 `memory.max`,
    /// v1 `memory.limit_in_bytes`) and the file-descriptor limit.
    pub fn probe() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let memory_limit = std::env::var(sluice_crds::contract::env::MEMORY_LIMIT)
            .ok()
            .or_else(|| read("/sys/fs/cgroup/memory.max"))
            .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
            .and_then(|s| parse_memory_limit(&s));
        let fd_limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        Self {
            memory_limit,
            fd_limit,
        }
    }
}

/// A cgroup memory limit file's value: bytes, or `max`/a huge number for none.
pub fn parse_memory_limit(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0 && n < NO_LIMIT_ABOVE)
}

/// Raises the soft file-descriptor limit to the hard one (as Go programs and nginx's
/// `worker_rlimit_nofile` do), so the connection cap, not `EMFILE`, is what refuses connections. Returns
/// the soft limit in force afterwards.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "cannot raise the file-descriptor limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The caps for `limits` in `env`: `limits.maxConnections` when given, else derived from the memory
/// limit (see the module docs); never more connections than the descriptor limit leaves room for (each
/// client connection has one to the app beside it).
pub fn caps(limits: &LimitsConfig, env: Environment) -> Caps {
    let (derived, head_budget) = match env.memory_limit {
        Some(limit) => {
            let spare = limit.saturating_sub(PROCESS_RESERVE);
            let heads = spare / 4;
            let connections = (spare - heads) / CONNECTION_MEMORY;
            (connections.max(1), usize::try_from(heads).unwrap_or(usize::MAX))
        }
        None => (
            u64::from(MAX_CONNECTIONS_UNLIMITED_MEMORY),
            HEAD_BUDGET_UNLIMITED_MEMORY,
        ),
    };
    let wanted = limits.max_connections.map_or(derived, u64::from);
    let by_fds = env
        .fd_limit
        .map_or(u64::MAX, |fds| (fds.saturating_sub(FD_RESERVE) / 2).max(1));
    Caps {
        max_connections: usize::try_from(wanted.min(by_fds)).unwrap_or(usize::MAX),
        head_budget,
    }
}

/// Open client connections against the cap, and the head budget.
#[derive(Debug)]
pub struct Capacity {
    env: Environment,
    max_connections: AtomicUsize,
    open: Arc<AtomicUsize>,
    heads: Arc<HeadBudget>,
}

impl Capacity {
    /// Caps for `limits` in `env`.
    pub fn new(limits: &LimitsConfig, env: Environment) -> Self {
        let c = caps(limits, env);
        Self {
            env,
            max_connections: AtomicUsize::new(c.max_connections),
            open: Arc::default(),
            heads: Arc::new(HeadBudget::new(c.head_budget)),
        }
    }

    /// Applies a reloaded `limits.maxConnections` (connections over a lowered cap stay open).
    pub fn reconfigure(&self, limits: &LimitsConfig) {
        let c = caps(limits, self.env);
        self.max_connections.store(c.max_connections, Ordering::Relaxed);
    }

    /// The caps in force.
    pub fn caps(&self) -> Caps {
        Caps {
            max_connections: self.max_connections.load(Ordering::Relaxed),
            head_budget: self.heads.total,
        }
    }

    /// Client connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Admits one more connection, held (and counted in `gauge`) until the returned guard drops; `None`
    /// at the cap.
    pub fn admit(&self, gauge: &Gauge) -> Option<Admitted> {
        let max = self.max_connections.load(Ordering::Relaxed);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        gauge.inc();
        Some(Admitted {
            open: Arc::clone(&self.open),
            gauge: gauge.clone(),
        })
    }

    /// A connection's share of the head budget (empty until it grows).
    pub fn head_share(&self) -> HeadShare {
        self.heads.share()
    }
}

/// One admitted connection; gives its place back when dropped. It goes with the socket, so a connection
/// that became a tunnel (a WebSocket) still counts.
#[derive(Debug)]
pub struct Admitted {
    open: Arc<AtomicUsize>,
    gauge: Gauge,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

/// Bytes of long request heads all connections may hold together.
#[derive(Debug)]
pub struct HeadBudget {
    total: usize,
    left: AtomicUsize,
}

impl HeadBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        Self {
            total,
            left: AtomicUsize::new(total),
        }
    }

    /// An empty share of the budget, for one connection.
    pub fn share(self: &Arc<Self>) -> HeadShare {
        HeadShare {
            budget: Arc::clone(self),
            held: 0,
        }
    }

    fn take(&self, n: usize) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |left| left.checked_sub(n))
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }
}

/// What one connection holds of the head budget; given back when released or dropped.
#[derive(Debug)]
pub struct HeadShare {
    budget: Arc<HeadBudget>,
    held: usize,
}

impl HeadShare {
    /// Makes the share cover a head buffer of `bytes` (the first [`HEAD_FREE`] are free); `false` when
    /// the budget has not that much left (the share is unchanged then).
    pub fn cover(&mut self, bytes: usize) -> bool {
        let wanted = bytes.saturating_sub(HEAD_FREE);
        if wanted <= self.held {
            return true;
        }
        if !self.budget.take(wanted - self.held) {
            return false;
        }
        self.held = wanted;
        true
    }

    /// Gives the share back (the head it covered was handled).
    pub fn release(&mut self) {
        if self.held > 0 {
            self.budget.give(self.held);
            self.held = 0;
        }
    }
}

impl Drop for HeadShare {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn env(memory: Option<u64>, fds: Option<u64>) -> Environment {
        Environment {
            memory_limit: memory,
            fd_limit: fds,
        }
    }

    #[test]
    fn a_64_mib_sidecar_takes_a_few_thousand_connections() {
        let c = caps(&LimitsConfig::default(), env(Some(64 * MIB), None));
        assert_eq!(c.max_connections, 2304);
        assert_eq!(c.head_budget, 12 * MIB as usize);
        let c = caps(&LimitsConfig::default(), env(Some(256 * MIB), None));
        assert_eq!(c.max_connections, 11_520);
    }

    #[test]
    fn the_setting_wins_over_the_memory_limit_and_the_descriptors_over_both() {
        let limits = LimitsConfig {
            max_connections: Some(50_000),
            ..Default::default()
        };
        assert_eq!(caps(&limits, env(Some(64 * MIB), None)).max_connections, 50_000);
        assert_eq!(caps(&limits, env(None, Some(1024))).max_connections, 480);
        let c = caps(&LimitsConfig::default(), env(None, None));
        assert_eq!(c.max_connections, MAX_CONNECTIONS_UNLIMITED_MEMORY as usize);
        // A limit smaller than the reserve still lets one connection in.
        assert_eq!(
            caps(&LimitsConfig::default(), env(Some(MIB), None)).max_connections,
            1
        );
    }

    #[test]
    fn cgroup_files_read_max_and_huge_values_as_no_limit() {
        assert_eq!(parse_memory_limit("67108864\n"), Some(64 * MIB));
        assert_eq!(parse_memory_limit("max\n"), None);
        assert_eq!(parse_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_memory_limit("0"), None);
    }

    #[test]
    fn connections_over_the_cap_are_refused_until_one_closes() {
        let limits = LimitsConfig {
            max_connections: Some(2),
            ..Default::default()
        };
        let cap = Capacity::new(&limits, Environment::default());
        let open = Gauge::default();
        let a = cap.admit(&open).unwrap();
        let _b = cap.admit(&open).unwrap();
        assert!(cap.admit(&open).is_none());
        drop(a);
        let _c = cap.admit(&open).expect("a place again");
        assert_eq!((cap.open(), open.get()), (2, 2));
    }

    #[test]
    fn long_heads_share_the_budget_and_give_it_back() {
        let budget = Arc::new(HeadBudget::new(10_000));
        let (mut a, mut b) = (budget.share(), budget.share());
        assert!(a.cover(HEAD_FREE), "a short head is free");
        assert!(a.cover(HEAD_FREE + 8_000));
        assert!(!b.cover(HEAD_FREE + 4_000), "only 2,000 bytes left");
        assert!(b.cover(HEAD_FREE + 2_000));
        a.release();
        assert!(b.cover(HEAD_FREE + 10_000));
        drop(b);
        assert_eq!(budget.left.load(Ordering::Relaxed), 10_000);
    }
}
