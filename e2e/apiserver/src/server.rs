//! [`TestApiServer`]: binds, serves HTTPS (or plain HTTP) with bearer-token auth, and gives tests
//! in-process access to the store.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

use crate::error::{Error, Result};
use crate::front_proxy::{FRONT_PROXY_CLIENT_NAME, FrontProxy};
use crate::kubeconfig::{self, Endpoint};
use crate::registry::ResourceType;
use crate::state::{Options, State};
use crate::store::{Message, Store};
use crate::tls::Pki;
use crate::user::User;

/// A running in-memory API server. Dropping it stops it.
pub struct TestApiServer {
    state: Arc<State>,
    pki: Option<Pki>,
    shutdown: watch::Sender<bool>,
}

impl TestApiServer {
    /// Binds and starts serving on a thread of its own, with its own Tokio runtime: the server keeps
    /// answering while the test's runtime is blocked (a `std::process::Command`, a blocking read).
    pub async fn start(options: Options) -> Result<Self> {
        let listener = std::net::TcpListener::bind(options.bind)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let pki = if options.tls {
            let ip = addr.ip().to_string();
            Some(Pki::generate(&[
                "localhost",
                &ip,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ])?)
        } else {
            None
        };
        let acceptor = match &pki {
            Some(p) => Some(tokio_rustls::TlsAcceptor::from(p.server_config()?)),
            None => None,
        };
        let (tx, rx) = watch::channel(false);
        let mut store = Store::new(options.history, options.clock.clone());
        bootstrap(&mut store);
        let front_proxy = FrontProxy::generate(FRONT_PROXY_CLIENT_NAME)?;
        publish_authentication_config(&mut store, &front_proxy, pki.as_ref().map(|p| p.ca_pem.as_str()));
        let state = Arc::new(State::new(options, store, addr, rx.clone(), front_proxy));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let serving = state.clone();
        std::thread::Builder::new()
            .name(format!("test-apiserver-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => accept_loop(listener, acceptor, serving, rx).await,
                        Err(e) => tracing::error!(error = %e, "cannot serve"),
                    }
                });
                // Dropping the runtime here ends every open connection and watch.
            })?;
        tracing::info!(%addr, tls = pki.is_some(), "test API server listening");
        Ok(TestApiServer {
            state,
            pki,
            shutdown: tx,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// `https://127.0.0.1:port` (or `http://`).
    pub fn url(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.state.addr)
    }

    /// The CA certificate (PEM) clients must trust, when serving HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.pki.as_ref().map(|p| p.ca_pem.as_str())
    }

    /// The bearer token.
    pub fn token(&self) -> &str {
        &self.state.options.token
    }

    /// A kubeconfig for this server whose context defaults to `namespace`.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        kubeconfig::render(
            &Endpoint {
                url: self.url(),
                ca_pem: self.ca_pem().map(String::from),
                token: self.token().to_string(),
            },
            namespace,
        )
    }

    /// Writes [`Self::kubeconfig`] (namespace `default`) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.kubeconfig("default"))?;
        Ok(())
    }

    /// A kube client for this server, defaulting to `namespace`.
    pub async fn client(&self, namespace: &str) -> Result<kube::Client> {
        let kc: kube::config::Kubeconfig =
            serde_yaml::from_str(&self.kubeconfig(namespace)).map_err(|e| Error::Decode(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Shared state, for in-process access.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Every change from now on, as the store records it.
    pub fn subscribe(&self) -> broadcast::Receiver<Message> {
        self.state.store().subscribe()
    }

    /// One object, read in-process (`apiVersion`, `kind` as in YAML; namespace "" for cluster-scoped).
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.state.store();
        let rt = store.registry.find_kind(api_version, kind)?;
        store.get(&rt.key(), namespace, name).cloned()
    }

    /// Every object in a namespace, read in-process (for failure dumps).
    pub fn objects_in(&self, namespace: &str) -> Vec<Value> {
        self.state
            .store()
            .in_namespace(namespace)
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// The types served now (built-ins and established CRDs).
    pub fn types(&self) -> Vec<ResourceType> {
        self.state
            .store()
            .registry
            .all()
            .iter()
            .map(|t| (**t).clone())
            .collect()
    }

    /// Forgets the change history and ends open watches, as an etcd compaction would: clients resuming from
    /// an earlier resourceVersion get 410 Gone and must relist.
    pub fn compact(&self) {
        self.state.store().compact();
    }

    /// Makes webhook `clientConfig.service` references to `namespace/name:port` reach `addr`. The TLS name
    /// checked is `name.namespace.svc`, as in a cluster.
    pub fn route_service(&self, namespace: &str, name: &str, port: u16, addr: SocketAddr) {
        self.state.route_service(namespace, name, port, addr);
    }

    /// Makes `token` authenticate as `user` with `groups` (for requests and for TokenReview).
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.state.add_token(
            token,
            User {
                username: user.into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            },
        );
    }

    /// Makes every SubjectAccessReview for this user (or group) answer "denied" from now on. The server
    /// simulates no RBAC: everything not on this list is allowed.
    pub fn deny(&self, user_or_group: &str) {
        self.state.set_denied(user_or_group, true);
    }

    /// Takes a user (or group) off the deny list.
    pub fn allow(&self, user_or_group: &str) {
        self.state.set_denied(user_or_group, false);
    }

    /// The aggregator's front-proxy identity (its CA is in `extension-apiserver-authentication`).
    pub fn front_proxy(&self) -> &FrontProxy {
        &self.state.front_proxy
    }

    /// A kube client for this server that authenticates with `token` (see [`Self::add_token`]).
    pub async fn client_with_token(&self, namespace: &str, token: &str) -> Result<kube::Client> {
        let kc = kubeconfig::render(
            &Endpoint {
                url: self.url(),
                ca_pem: self.ca_pem().map(String::from),
                token: token.to_string(),
            },
            namespace,
        );
        let kc: kube::config::Kubeconfig =
            serde_yaml::from_str(&kc).map_err(|e| Error::Decode(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Stops serving; open connections and watches end.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Namespaces every cluster starts with.
fn bootstrap(store: &mut Store) {
    let key = ResourceType::builtin("", "v1", "Namespace", "namespaces", false).key();
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let now = store.now();
        let ns = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": crate::store::new_uid(), "creationTimestamp": now, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        store.put(&key, ns);
    }
}

/// Stores `kube-system/extension-apiserver-authentication`, as kube-apiserver does at start.
fn publish_authentication_config(store: &mut Store, front_proxy: &FrontProxy, client_ca_pem: Option<&str>) {
    let key = ResourceType::builtin("", "v1", "ConfigMap", "configmaps", true).key();
    let mut cm = crate::front_proxy::authentication_config_map(front_proxy, client_ca_pem);
    cm["metadata"]["uid"] = Value::String(crate::store::new_uid());
    cm["metadata"]["creationTimestamp"] = Value::String(store.now());
    store.put(&key, cm);
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = tcp.set_nodelay(true);
        let state = state.clone();
        let acceptor = acceptor.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(crate::api::handle(state, req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            match acceptor {
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(tls), svc);
                    tokio::select! { _ = conn => {}, _ = stop.changed() => {} }
                }
                None => {
                    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                    tokio::select! { _ = conn => {}, _ = stop.changed() => {} }
                }
            }
        });
    }
}
