//! [`State`]: what every request handler shares — the store, the options, the credentials known, the
//! routes to Services — and the [`Options`] a server starts with.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::front_proxy::FrontProxy;
use crate::store::{Clock, Store, system_clock};
use crate::user::User;

/// Default bearer token.
pub const TOKEN_DEFAULT: &str = "sluice-test-token";
/// Default number of changes kept for watches to replay.
pub const HISTORY_DEFAULT: usize = 10_000;
/// Default interval between watch bookmarks.
pub const BOOKMARK_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

/// How to start a server.
#[derive(Clone)]
pub struct Options {
    /// Where to listen; port 0 picks a free one.
    pub bind: SocketAddr,
    /// Serve HTTPS with a fresh CA (true) or plain HTTP.
    pub tls: bool,
    /// The bearer token clients must send.
    pub token: String,
    /// Changes kept for watches; older versions get 410.
    pub history: usize,
    /// How often open watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// The server's clock.
    pub clock: Clock,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: true,
            token: TOKEN_DEFAULT.into(),
            history: HISTORY_DEFAULT,
            bookmark_interval: BOOKMARK_INTERVAL_DEFAULT,
            clock: system_clock(),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("bind", &self.bind)
            .field("tls", &self.tls)
            .field("history", &self.history)
            .field("bookmark_interval", &self.bookmark_interval)
            .finish_non_exhaustive()
    }
}

/// Shared state of a running server.
pub struct State {
    store: Mutex<Store>,
    /// The options it started with.
    pub options: Options,
    /// `(namespace, service name, port)` → where a webhook Service reference really points.
    services: Mutex<HashMap<(String, String, u16), SocketAddr>>,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Closed on shutdown; open watches end.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The aggregator's client identity towards APIService backends.
    pub front_proxy: FrontProxy,
    /// Bearer tokens besides `options.token`, and whom they authenticate.
    tokens: Mutex<HashMap<String, User>>,
    /// Users and groups every SubjectAccessReview denies.
    deny_list: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// The state of a server listening on `addr`, with `store` as it starts.
    pub(crate) fn new(
        options: Options,
        store: Store,
        addr: SocketAddr,
        shutdown: watch::Receiver<bool>,
        front_proxy: FrontProxy,
    ) -> Self {
        State {
            store: Mutex::new(store),
            options,
            services: Mutex::new(HashMap::new()),
            addr,
            shutdown,
            front_proxy,
            tokens: Mutex::new(HashMap::new()),
            deny_list: Mutex::new(HashSet::new()),
        }
    }

    /// Locks the store.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Whom a bearer token authenticates: the default token is [`User::admin`].
    pub fn user_of(&self, token: &str) -> Option<User> {
        if token == self.options.token {
            return Some(User::admin());
        }
        lock(&self.tokens).get(token).cloned()
    }

    /// Makes `token` authenticate as `user`.
    pub fn add_token(&self, token: &str, user: User) {
        lock(&self.tokens).insert(token.into(), user);
    }

    /// The first of `user` and `groups` on the deny list.
    pub fn denied(&self, user: &str, groups: &[String]) -> Option<String> {
        let list = lock(&self.deny_list);
        if list.contains(user) {
            return Some(format!("user {user:?}"));
        }
        groups
            .iter()
            .find(|g| list.contains(*g))
            .map(|g| format!("group {g:?}"))
    }

    /// Puts a user (or group) on the deny list (`true`) or takes it off (`false`).
    pub fn set_denied(&self, user_or_group: &str, denied: bool) {
        let mut list = lock(&self.deny_list);
        if denied {
            list.insert(user_or_group.into());
        } else {
            list.remove(user_or_group);
        }
    }

    /// Makes Service references to `namespace/name:port` reach `addr`.
    pub fn route_service(&self, namespace: &str, name: &str, port: u16, addr: SocketAddr) {
        lock(&self.services).insert((namespace.into(), name.into(), port), addr);
    }

    /// Makes Service references to `namespace/name:port` reach nothing again.
    pub fn unroute_service(&self, namespace: &str, name: &str, port: u16) {
        lock(&self.services).remove(&(namespace.to_string(), name.to_string(), port));
    }

    /// Every routed Service as `(namespace, name, port)`.
    pub fn routed_services(&self) -> Vec<(String, String, u16)> {
        lock(&self.services).keys().cloned().collect()
    }

    /// Where a Service reference to `namespace/name:port` reaches, if routed.
    pub fn service_route(&self, namespace: &str, name: &str, port: u16) -> Option<SocketAddr> {
        lock(&self.services)
            .get(&(namespace.to_string(), name.to_string(), port))
            .copied()
    }
}
