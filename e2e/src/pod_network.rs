//! A stand-in for the pod network and kube-proxy, for a real API server and the processes the kubelet
//! stand-in runs. Every process listens on 127.0.0.1 (on local ports the kubelet stand-in maps), yet a
//! real API server only reaches pods through their Services' EndpointSlices, written by the real
//! EndpointSlice controller from each Pod's `status.podIP` and container ports — and EndpointSlices refuse
//! loopback addresses. So:
//!
//! - **Pod IPs**: [`PodNetwork::attach`] gives each Pod an address from [`POD_CIDR`] (which the kubelet
//!   stand-in writes as `status.podIP`) and remembers which local port serves each of its ports.
//! - **The API server's egress**: kube-apiserver runs with `--enable-aggregator-routing=true` (webhooks
//!   and APIServices are dialled at endpoint addresses, `podIP:targetPort`) and an egress selector that
//!   sends all "cluster" traffic as HTTP CONNECT through a unix socket; [`PodNetwork::serve_egress`]
//!   answers it, connecting `podIP:port` to the local port. The API server still verifies the serving
//!   certificate as `name.namespace.svc`, as on any cluster.
//! - **Service names for processes** (kube-proxy and cluster DNS): [`PodNetwork::service_address`] opens a
//!   local forwarder for `service.namespace.svc:port` that picks a ready endpoint of the Service's
//!   EndpointSlices on every connection (the chart's `helm test` Pod probes the operator this way).
//!
//! Not simulated: NetworkPolicies, ClusterIPs dialled directly, load balancing beyond "first ready
//! endpoint", and traffic between processes other than through Service names (they share 127.0.0.1).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::watch;

use crate::error::{Error, Result};

/// Where Pod IPs come from (flannel's default range; never dialled, only looked up here).
pub const POD_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);

#[derive(Default)]
struct Table {
    /// The last host number handed out in [`POD_CIDR`].
    last: u32,
    /// Pod IP → (Pod port → local port).
    pods: HashMap<Ipv4Addr, HashMap<u16, u16>>,
    /// `(namespace, service, port)` → the local forwarder serving it.
    forwarders: HashMap<(String, String, u16), SocketAddr>,
}

/// Pod IPs, their local ports, the API server's egress proxy and Service forwarders. Cheap to clone.
#[derive(Clone)]
pub struct PodNetwork {
    client: kube::Client,
    table: Arc<Mutex<Table>>,
    stop: watch::Sender<bool>,
}

impl PodNetwork {
    /// A network whose Service lookups read the API through `client`.
    pub fn new(client: kube::Client) -> Self {
        PodNetwork {
            client,
            table: Arc::default(),
            stop: watch::channel(false).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives a Pod the next free address, its `ports` (Pod port → local port) served there.
    pub fn attach(&self, ports: HashMap<u16, u16>) -> Ipv4Addr {
        let mut table = self.lock();
        let (base, prefix) = POD_CIDR;
        let hosts = (1u32 << (32 - prefix)) - 2;
        loop {
            // .0.1 is left out, as a node's bridge would hold it.
            table.last = table.last % hosts + 1;
            let ip = Ipv4Addr::from(u32::from(base) + table.last + 1);
            if let std::collections::hash_map::Entry::Vacant(free) = table.pods.entry(ip) {
                free.insert(ports);
                return ip;
            }
        }
    }

    /// Forgets a Pod's address.
    pub fn detach(&self, ip: Ipv4Addr) {
        self.lock().pods.remove(&ip);
    }

    /// The local address serving `ip:port`, when a Pod holds that IP and port.
    pub fn local(&self, ip: IpAddr, port: u16) -> Option<SocketAddr> {
        let IpAddr::V4(ip) = ip else { return None };
        let local = *self.lock().pods.get(&ip)?.get(&port)?;
        Some(SocketAddr::from(([127, 0, 0, 1], local)))
    }

    /// Binds the unix socket the API server's egress selector names.
    pub fn bind_egress(path: &Path) -> Result<UnixListener> {
        let _ = std::fs::remove_file(path);
        Ok(UnixListener::bind(path)?)
    }

    /// Answers the API server's HTTP CONNECT requests on `listener` until [`PodNetwork::stop`]: a Pod
    /// address is connected to its local port; anything else gets `503`, as an unreachable endpoint.
    pub async fn serve_egress(self, listener: UnixListener) {
        let mut stop = self.stop.subscribe();
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                accepted = listener.accept() => {
                    let Ok((conn, _)) = accepted else { continue };
                    let network = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = network.tunnel(conn).await {
                            tracing::debug!(error = %e, "pod network: egress tunnel failed");
                        }
                    });
                }
            }
        }
    }

    async fn tunnel(&self, conn: tokio::net::UnixStream) -> Result<()> {
        let mut conn = BufReader::new(conn);
        let mut request = String::new();
        conn.read_line(&mut request).await?;
        // The rest of the head (Host, User-Agent) carries nothing needed.
        loop {
            let mut line = String::new();
            if conn.read_line(&mut line).await? == 0 || line.trim().is_empty() {
                break;
            }
        }
        let target = request
            .strip_prefix("CONNECT ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|t| t.parse::<SocketAddr>().ok());
        let local = match target {
            Some(addr) => self.local(addr.ip(), addr.port()),
            None => None,
        };
        let Some(local) = local else {
            conn.get_mut()
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return Err(Error::Config(format!("no pod serves {}", request.trim())));
        };
        let mut upstream = TcpStream::connect(local).await?;
        conn.get_mut()
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        let mut conn = conn.into_inner();
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        Ok(())
    }

    /// A local address forwarding to port `port` of Service `service` in `namespace`, as cluster DNS
    /// and kube-proxy would make `service.namespace.svc:port` reach it. The endpoint is chosen on each
    /// connection (first ready one in the Service's EndpointSlices), so it may be asked for before any
    /// endpoint exists.
    pub async fn service_address(&self, namespace: &str, service: &str, port: u16) -> Result<SocketAddr> {
        let key = (namespace.to_string(), service.to_string(), port);
        if let Some(addr) = self.lock().forwarders.get(&key) {
            return Ok(*addr);
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        self.lock().forwarders.insert(key.clone(), addr);
        let network = self.clone();
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    accepted = listener.accept() => {
                        let Ok((mut conn, _)) = accepted else { continue };
                        let (network, key) = (network.clone(), key.clone());
                        tokio::spawn(async move {
                            let Some(endpoint) = network.endpoint(&key.0, &key.1, key.2).await else {
                                tracing::debug!(service = %key.1, "pod network: no ready endpoint");
                                return;
                            };
                            if let Ok(mut upstream) = TcpStream::connect(endpoint).await {
                                let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                            }
                        });
                    }
                }
            }
        });
        Ok(addr)
    }

    /// The local address of the first ready endpoint of `service`'s port `port`.
    async fn endpoint(&self, namespace: &str, service: &str, port: u16) -> Option<SocketAddr> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        let svc = services.get(service).await.ok()?;
        let svc_port = svc
            .spec?
            .ports?
            .into_iter()
            .find(|p| u16::try_from(p.port).ok() == Some(port))?;
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), namespace);
        let slices = slices
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
            .await
            .ok()?;
        for slice in slices {
            // The slice's port of the same name holds the resolved targetPort (a slice without ports is
            // the controller's placeholder for "no endpoints").
            let target = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name == svc_port.name)
                .and_then(|p| p.port)
                .or(match &svc_port.target_port {
                    Some(IntOrString::Int(n)) => Some(*n),
                    _ => None,
                });
            let Some(target) = target.and_then(|t| u16::try_from(t).ok()) else {
                continue;
            };
            for endpoint in &slice.endpoints {
                if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for address in &endpoint.addresses {
                    if let Ok(ip) = address.parse::<IpAddr>()
                        && let Some(local) = self.local(ip, target)
                    {
                        return Some(local);
                    }
                }
            }
        }
        None
    }

    /// Stops the egress proxy and every forwarder.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

/// Splits `name.namespace.svc[.cluster.local]` into `(name, namespace)`.
pub fn service_dns_name(host: &str) -> Option<(&str, &str)> {
    let rest = host
        .strip_suffix(".svc.cluster.local")
        .or_else(|| host.strip_suffix(".svc"))?;
    let (name, namespace) = rest.split_once('.')?;
    (!name.is_empty() && !namespace.is_empty() && !namespace.contains('.')).then_some((name, namespace))
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A network whose Service lookups go nowhere (the tests here need none).
    fn network() -> PodNetwork {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        PodNetwork::new(kube::Client::try_from(config).unwrap())
    }

    #[tokio::test]
    async fn pods_get_distinct_addresses_whose_ports_lead_to_their_local_ports() {
        let net = network();
        let a = net.attach(HashMap::from([(9443, 40001)]));
        let b = net.attach(HashMap::from([(9443, 40002)]));
        assert_ne!(a, b);
        for ip in [a, b] {
            assert_eq!(&ip.octets()[..2], &[10, 244]);
            assert_ne!(
                ip,
                Ipv4Addr::new(10, 244, 0, 1),
                "the node's address is never a pod's"
            );
        }
        assert_eq!(
            net.local(a.into(), 9443),
            Some(SocketAddr::from(([127, 0, 0, 1], 40001)))
        );
        assert_eq!(
            net.local(b.into(), 9443),
            Some(SocketAddr::from(([127, 0, 0, 1], 40002)))
        );
        assert_eq!(net.local(a.into(), 8080), None, "a port the pod does not serve");
        net.detach(a);
        assert_eq!(net.local(a.into(), 9443), None);
    }

    #[tokio::test]
    async fn the_egress_proxy_tunnels_to_a_pod_and_refuses_what_no_pod_serves() {
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut conn, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf).await.unwrap();
            conn.write_all(&buf).await.unwrap();
        });
        let net = network();
        let ip = net.attach(HashMap::from([(9443, echo_port)]));
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("egress.sock");
        tokio::spawn(
            net.clone()
                .serve_egress(PodNetwork::bind_egress(&socket).unwrap()),
        );

        let mut conn = tokio::net::UnixStream::connect(&socket).await.unwrap();
        conn.write_all(format!("CONNECT {ip}:9443 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut reply = [0u8; 39];
        conn.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"HTTP/1.1 200 Connection established\r\n\r\n");
        conn.write_all(b"hello").await.unwrap();
        let mut echoed = [0u8; 5];
        conn.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"hello");

        let mut conn = tokio::net::UnixStream::connect(&socket).await.unwrap();
        conn.write_all(b"CONNECT 10.244.9.9:9443 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        conn.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        net.stop();
    }

    #[test]
    fn service_dns_names_are_split_into_name_and_namespace() {
        assert_eq!(
            service_dns_name("sluice-metrics.sluice-system.svc"),
            Some(("sluice-metrics", "sluice-system"))
        );
        assert_eq!(
            service_dns_name("web.shop.svc.cluster.local"),
            Some(("web", "shop"))
        );
        assert_eq!(service_dns_name("web.svc"), None);
        assert_eq!(service_dns_name("example.com"), None);
        assert_eq!(service_dns_name("a.b.c.svc"), None);
    }
}
