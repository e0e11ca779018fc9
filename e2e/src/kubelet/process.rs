//! How the kubelet stand-in turns a Pod into local processes: which containers run, their command,
//! env, volumes and ports (see the module docs of [`crate::kubelet`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::Api;
use sluice_crds::contract;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{KubeletConfig, Process, Runner, RunningPod, SIDECAR_IMAGE_PATTERN, key};
use crate::error::{Error, Result};

/// The containers the stand-in runs: native sidecars first, then containers, those with a local command.
pub(super) fn runnable<'a>(config: &'a KubeletConfig, pod: &'a Pod) -> Vec<(&'a Container, &'a [String])> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    let native = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    native
        .chain(spec.containers.iter())
        .filter_map(|c| Some((c, config.command_for(c.image.as_deref()?)?)))
        .collect()
}

pub(super) async fn start_pod(
    client: &kube::Client,
    config: &KubeletConfig,
    pod: &Pod,
) -> Result<Option<RunningPod>> {
    let containers = runnable(config, pod);
    if containers.is_empty() {
        return Ok(None);
    }
    let (ns, name) = key(pod);
    let spec = pod.spec.as_ref().expect("runnable pods have a spec");
    let dir = tempfile::Builder::new()
        .prefix(&format!("pod-{name}-"))
        .tempdir()?;

    // Ports.
    let mut ports = HashMap::new();
    let mut names = HashMap::new();
    for (c, _) in &containers {
        let mut declared: Vec<u16> = c
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let n = u16::try_from(p.container_port).ok()?;
                if let Some(port_name) = &p.name {
                    names.insert(port_name.clone(), n);
                }
                Some(n)
            })
            .collect();
        if is_sidecar(c) {
            declared.push(contract::port::ADMIN);
        }
        for n in declared {
            if let std::collections::hash_map::Entry::Vacant(e) = ports.entry(n) {
                e.insert(free_port()?);
            }
        }
    }

    // Volumes, as stored: (volume name, files, whether it is a ConfigMap).
    let mut raw_volumes: Vec<(String, BTreeMap<String, Vec<u8>>, bool)> = vec![];
    for volume in spec.volumes.iter().flatten() {
        let files: BTreeMap<String, Vec<u8>> = if let Some(cm) = &volume.config_map {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let found = match api.get_opt(&cm.name).await? {
                Some(found) => found,
                None if cm.optional == Some(true) => ConfigMap::default(),
                None => return Err(Error::Config(format!("configmap {} not found", cm.name))),
            };
            let mut files: BTreeMap<String, Vec<u8>> = found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            files.extend(
                found
                    .binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            files
        } else if let Some(secret) = &volume.secret {
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            let secret_name = secret.secret_name.clone().unwrap_or_default();
            let Some(found) = api.get_opt(&secret_name).await? else {
                return Err(Error::Config(format!("secret {secret_name} not found")));
            };
            found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        } else if let Some(projected) = &volume.projected {
            projected_files(client, config, pod, projected).await?
        } else {
            continue;
        };
        raw_volumes.push((volume.name.clone(), files, volume.config_map.is_some()));
    }

    // Env, as written (secret values are never scanned for ports, only rewritten).
    let mut raw_env: Vec<BTreeMap<String, (String, bool)>> = vec![];
    for (c, _) in &containers {
        let mut env = BTreeMap::new();
        for var in c.env.iter().flatten() {
            if let Some(v) = resolve_env(client, pod, var).await? {
                env.insert(var.name.clone(), (v, var.value.is_some()));
            }
        }
        raw_env.push(env);
    }

    // Undeclared localhost ports named in args, plain env values and ConfigMap files (a worker's
    // handler URL, the queue API's listen address) are Pod ports too: two Pods must not share them.
    let mut scanned = vec![];
    for ((c, _), env) in containers.iter().zip(&raw_env) {
        for text in c
            .args
            .iter()
            .flatten()
            .chain(env.values().filter(|(_, plain)| *plain).map(|(v, _)| v))
        {
            scanned.extend(localhost_ports(text));
        }
    }
    for (_, files, scan) in &raw_volumes {
        for bytes in files.values().filter(|_| *scan) {
            scanned.extend(localhost_ports(&String::from_utf8_lossy(bytes)));
        }
    }
    for n in scanned {
        if let std::collections::hash_map::Entry::Vacant(e) = ports.entry(n) {
            e.insert(free_port()?);
        }
    }

    let mut volume_dirs: HashMap<String, PathBuf> = HashMap::new();
    for (volume, files, _) in raw_volumes {
        let vdir = dir.path().join("volumes").join(&volume);
        std::fs::create_dir_all(&vdir)?;
        for (file, bytes) in files {
            let text = String::from_utf8(bytes.clone())
                .map(|t| rewrite_ports(&t, &ports).into_bytes())
                .unwrap_or(bytes);
            let path = vdir.join(file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, text)?;
        }
        volume_dirs.insert(volume, vdir);
    }

    let grace = Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64)
        .min(config.max_grace);

    // On a real cluster: Service names in args and env reach forwarders (cluster DNS and kube-proxy's
    // part), and the Pod's ServiceAccount token replaces whatever KUBECONFIG the config names.
    let mut services: HashMap<String, std::net::SocketAddr> = HashMap::new();
    let mut own_env: Vec<(String, String)> = config.env.clone();
    if let Some(cluster) = &config.cluster {
        let texts = containers
            .iter()
            .flat_map(|(c, _)| c.args.iter().flatten())
            .chain(raw_env.iter().flat_map(|e| e.values().map(|(v, _)| v)));
        let mut wanted = vec![];
        for text in texts {
            wanted.extend(service_references(text));
        }
        for (host, port) in wanted {
            let Some((service, namespace)) = crate::pod_network::service_dns_name(&host) else {
                continue;
            };
            let local = cluster.network.service_address(namespace, service, port).await?;
            services.insert(format!("{host}:{port}"), local);
        }
        // What a kubelet gives every container: the API server's address (here, where it listens).
        if let Ok(url) = url::Url::parse(&cluster.api_url) {
            let host = url.host_str().unwrap_or("127.0.0.1").to_string();
            let port = url.port_or_known_default().unwrap_or(443).to_string();
            own_env.push(("KUBERNETES_SERVICE_HOST".into(), host));
            own_env.push(("KUBERNETES_SERVICE_PORT".into(), port));
        }
        if let Some(kubeconfig) = cluster
            .service_account_kubeconfig(client, pod, dir.path())
            .await?
        {
            own_env.retain(|(k, _)| k != "KUBECONFIG");
            own_env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        }
    }

    let mut running = RunningPod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        dir,
        ip: None,
        ports,
        names,
        processes: vec![],
        grace,
        restarts: spec.restart_policy.as_deref().is_none_or(|p| p == "Always"),
        reported_ready: None,
        finished: false,
    };
    for ((c, command), raw) in containers.into_iter().zip(raw_env) {
        let mounts: Vec<(String, PathBuf)> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| Some((m.mount_path.clone(), volume_dirs.get(&m.name)?.clone())))
            .collect();
        // Podman mounts the volumes at their mount paths: there, paths are left as written.
        let podman = command.is_empty();
        let rewrite = |s: &str| {
            let s = rewrite_services(&rewrite_ports(s, &running.ports), &services);
            if podman { s } else { rewrite_mounts(&s, &mounts) }
        };
        let mut env: BTreeMap<String, String> = raw.into_iter().map(|(k, (v, _))| (k, rewrite(&v))).collect();
        // A process cannot see a mount path: the sidecar is told where its ServiceAccount credentials are.
        if !podman
            && let Some((_, local)) = mounts
                .iter()
                .find(|(m, _)| m.trim_end_matches('/') == contract::SERVICE_ACCOUNT_DIR)
        {
            env.insert(
                contract::env::SERVICE_ACCOUNT_DIR.into(),
                local.display().to_string(),
            );
        }
        if is_sidecar(c) {
            let admin = running.ports[&contract::port::ADMIN];
            env.entry(contract::env::ADMIN_LISTEN.into())
                .or_insert_with(|| format!("127.0.0.1:{admin}"));
        }
        if let Some(first) = c.ports.iter().flatten().next()
            && let Some(local) = u16::try_from(first.container_port)
                .ok()
                .and_then(|n| running.ports.get(&n))
        {
            env.insert("SLUICE_DEMO_LISTEN".into(), format!("127.0.0.1:{local}"));
        }
        let port_map: Vec<String> = running.ports.iter().map(|(p, l)| format!("{p}={l}")).collect();
        env.insert("SLUICE_E2E_PORTS".into(), port_map.join(","));
        env.extend(own_env.iter().cloned());
        let log_path = running.dir.path().join(format!("{}.log", c.name));
        let args: Vec<String> = c.args.iter().flatten().map(|a| rewrite(a)).collect();
        let child = if podman {
            let (dir, log) = (running.dir.path().to_path_buf(), log_path);
            Runner::Podman(start_container(config, pod, c, args, env, &volume_dirs, &dir, log).await?)
        } else {
            let log = std::fs::File::create(log_path)?;
            let mut cmd = tokio::process::Command::new(&command[0]);
            cmd.args(&command[1..])
                .args(args)
                .envs(&env)
                .env("HOSTNAME", &name)
                .current_dir(running.dir.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true);
            Runner::Local(
                cmd.spawn()
                    .map_err(|e| Error::Config(format!("{}: cannot start {}: {e}", c.name, command[0])))?,
            )
        };
        let probe = c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|get| {
                let number = match &get.port {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => {
                        u16::try_from(*n).ok()?
                    }
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                        *running.names.get(s)?
                    }
                };
                let local = *running.ports.get(&number)?;
                Some((local, get.path.clone().unwrap_or_else(|| "/".into())))
            })
            .or_else(|| {
                // A sidecar without a probe is still ready only once its config is loaded.
                is_sidecar(c).then(|| (running.ports[&contract::port::ADMIN], "/readyz".to_string()))
            });
        running.processes.push(Process {
            container: c.name.clone(),
            child,
            probe,
        });
    }
    if let Some(cluster) = &config.cluster {
        running.ip = Some(cluster.network.attach(running.ports.clone()));
    }
    Ok(Some(running))
}

/// Starts a container of the Pod from its image with Podman (see the module docs).
#[allow(clippy::too_many_arguments)] // the pieces `start_pod` prepared for this container
async fn start_container(
    config: &KubeletConfig,
    pod: &Pod,
    c: &Container,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    volume_dirs: &HashMap<String, PathBuf>,
    pod_dir: &Path,
    log: PathBuf,
) -> Result<crate::podman::Container> {
    use crate::podman::{ContainerSpec, Mount, Podman, Security};
    let (ns, name) = key(pod);
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let image = c.image.as_deref().unwrap_or_default();
    let mut spec = ContainerSpec::new(image, &format!("k8s_{}_{name}_{ns}_{uid}", c.name));
    spec.entrypoint = c.command.clone();
    spec.args = args;
    spec.env = env.into_iter().collect();
    spec.hostname = Some(name);
    spec.log = Some(log);
    spec.security = Security::from_kubernetes(
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref()),
        c.security_context.as_ref(),
    );
    for m in c.volume_mounts.iter().flatten() {
        if let Some(dir) = volume_dirs.get(&m.name) {
            spec.mounts.push(Mount {
                host: dir.clone(),
                container: m.mount_path.clone(),
                read_only: m.read_only.unwrap_or(false),
            });
        }
    }
    let same_path = |path: &Path| Mount {
        host: path.to_path_buf(),
        container: path.display().to_string(),
        read_only: true,
    };
    spec.mounts.push(same_path(pod_dir));
    spec.mounts
        .extend(config.podman_mounts.iter().map(|p| same_path(p)));
    Podman::new().run(&spec).await
}

/// The files of a projected volume, as a kubelet writes them: a `serviceAccountToken` source is a
/// TokenRequest token of the Pod's ServiceAccount for the source's audience (the API server's when
/// none) and `expirationSeconds`, bound to the Pod (on a real API server only: the in-memory one has
/// no TokenRequest, so the file is left out there); `configMap` and `secret` sources are their keys
/// (or `items`); `downwardAPI` sources the Pod's `metadata.name`/`namespace`/`uid`.
async fn projected_files(
    client: &kube::Client,
    config: &KubeletConfig,
    pod: &Pod,
    projected: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut files = BTreeMap::new();
    // `items` renames keys (and picks some); without them, every key is a file of its own name.
    let pick = |all: BTreeMap<String, Vec<u8>>,
                items: &Option<Vec<k8s_openapi::api::core::v1::KeyToPath>>,
                files: &mut BTreeMap<String, Vec<u8>>| match items {
        Some(items) => {
            for item in items {
                if let Some(bytes) = all.get(&item.key) {
                    files.insert(item.path.clone(), bytes.clone());
                }
            }
        }
        None => files.extend(all),
    };
    for source in projected.sources.iter().flatten() {
        if let Some(token) = &source.service_account_token
            && let Some(cluster) = &config.cluster
        {
            let seconds = token.expiration_seconds.unwrap_or(super::cluster::TOKEN_SECONDS);
            let token_text = cluster
                .token(client, pod, token.audience.as_deref(), seconds)
                .await?;
            files.insert(token.path.clone(), token_text.into_bytes());
        }
        if let Some(cm) = &source.config_map {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let all: BTreeMap<String, Vec<u8>> = match api.get_opt(&cm.name).await? {
                Some(found) => found
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .chain(
                        found
                            .binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    )
                    .collect(),
                None if cm.optional == Some(true) => BTreeMap::new(),
                None => return Err(Error::Config(format!("configmap {} not found", cm.name))),
            };
            pick(all, &cm.items, &mut files);
        }
        if let Some(secret) = &source.secret {
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            let all: BTreeMap<String, Vec<u8>> = match api.get_opt(&secret.name).await? {
                Some(found) => found
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect(),
                None if secret.optional == Some(true) => BTreeMap::new(),
                None => return Err(Error::Config(format!("secret {} not found", secret.name))),
            };
            pick(all, &secret.items, &mut files);
        }
        if let Some(downward) = &source.downward_api {
            for item in downward.items.iter().flatten() {
                let value = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                    Some("metadata.name") => pod.metadata.name.clone(),
                    Some("metadata.namespace") => Some(ns.clone()),
                    Some("metadata.uid") => pod.metadata.uid.clone(),
                    _ => None,
                };
                if let Some(value) = value {
                    files.insert(item.path.clone(), value.into_bytes());
                }
            }
        }
    }
    Ok(files)
}

fn is_sidecar(c: &Container) -> bool {
    c.name == contract::SIDECAR_CONTAINER
        || c.image
            .as_deref()
            .is_some_and(|i| i.contains(SIDECAR_IMAGE_PATTERN))
}

async fn resolve_env(
    client: &kube::Client,
    pod: &Pod,
    var: &k8s_openapi::api::core::v1::EnvVar,
) -> Result<Option<String>> {
    if let Some(v) = &var.value {
        return Ok(Some(v.clone()));
    }
    let Some(from) = &var.value_from else {
        return Ok(Some(String::new()));
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(field) = &from.field_ref {
        return Ok(match field.field_path.as_str() {
            "metadata.name" => pod.metadata.name.clone(),
            "metadata.namespace" => Some(ns),
            "metadata.uid" => pod.metadata.uid.clone(),
            "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
            "spec.nodeName" => Some("sluice-e2e".into()),
            "spec.serviceAccountName" => pod.spec.as_ref().and_then(|s| s.service_account_name.clone()),
            _ => None,
        });
    }
    if let Some(sel) = &from.secret_key_ref {
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let value = api
            .get_opt(&sel.name)
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get(&sel.key).cloned())
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        return match value {
            Some(v) => Ok(Some(v)),
            None if sel.optional == Some(true) => Ok(None),
            None => Err(Error::Config(format!(
                "secret {} key {} not found",
                sel.name, sel.key
            ))),
        };
    }
    if let Some(sel) = &from.config_map_key_ref {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let value = api
            .get_opt(&sel.name)
            .await?
            .and_then(|c| c.data)
            .and_then(|d| d.get(&sel.key).cloned());
        return match value {
            Some(v) => Ok(Some(v)),
            None if sel.optional == Some(true) => Ok(None),
            None => Err(Error::Config(format!(
                "configmap {} key {} not found",
                sel.name, sel.key
            ))),
        };
    }
    Ok(None)
}

/// Rewrites `127.0.0.1:P`, `localhost:P`, `0.0.0.0:P`, `[::]:P` for every Pod port P in `ports` to
/// `127.0.0.1:<local>`.
pub fn rewrite_ports(text: &str, ports: &HashMap<u16, u16>) -> String {
    localhost_re()
        .replace_all(text, |caps: &regex::Captures<'_>| {
            match caps[2].parse::<u16>().ok().and_then(|p| ports.get(&p)) {
                Some(local) => format!("127.0.0.1:{local}"),
                None => caps[0].to_string(),
            }
        })
        .into_owned()
}

/// Ports of `127.0.0.1:P`, `localhost:P`, `0.0.0.0:P`, `[::]:P` in `text`.
pub fn localhost_ports(text: &str) -> Vec<u16> {
    localhost_re()
        .captures_iter(text)
        .filter_map(|caps| caps[2].parse::<u16>().ok())
        .filter(|p| *p != 0)
        .collect()
}

/// `(host, port)` of every `name.namespace.svc[.cluster.local]:port` in `text`.
pub fn service_references(text: &str) -> Vec<(String, u16)> {
    service_re()
        .captures_iter(text)
        .filter_map(|caps| Some((caps[1].to_string(), caps[2].parse().ok()?)))
        .collect()
}

/// Replaces each `host:port` key of `services` in `text` by its local address.
fn rewrite_services(text: &str, services: &HashMap<String, std::net::SocketAddr>) -> String {
    if services.is_empty() {
        return text.to_string();
    }
    service_re()
        .replace_all(text, |caps: &regex::Captures<'_>| match services.get(&caps[0]) {
            Some(local) => local.to_string(),
            None => caps[0].to_string(),
        })
        .into_owned()
}

fn service_re() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(r"\b([a-z0-9][-a-z0-9]*\.[a-z0-9][-a-z0-9]*\.svc(?:\.cluster\.local)?):(\d{1,5})\b")
            .expect("valid regex")
    })
}

fn localhost_re() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(r"(127\.0\.0\.1|localhost|0\.0\.0\.0|\[::\]|\[::1\]):(\d{1,5})\b")
            .expect("valid regex")
    })
}

/// Replaces a leading mount path (longest first) by the local directory holding the volume's files.
pub fn rewrite_mounts(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut sorted: Vec<&(String, PathBuf)> = mounts.iter().collect();
    sorted.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
    for (mount, local) in sorted {
        let mount = mount.trim_end_matches('/');
        if text == mount {
            return local.display().to_string();
        }
        if let Some(rest) = text.strip_prefix(mount)
            && rest.starts_with('/')
        {
            return format!("{}{rest}", local.display());
        }
    }
    text.to_string()
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether `GET path` on the local port answers 2xx within a second.
pub(super) async fn http_ok(port: u16, path: &str) -> bool {
    let attempt = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = [0u8; 16];
        let mut read = 0;
        while read < 12 {
            let n = tcp.read(&mut buf[read..]).await.ok()?;
            if n == 0 {
                break;
            }
            read += n;
        }
        let line = std::str::from_utf8(&buf[..read]).ok()?;
        Some(line.split(' ').nth(1).is_some_and(|code| code.starts_with('2')))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_ports_of_the_pod_are_rewritten_and_others_kept() {
        let ports = HashMap::from([(8080, 40001), (15080, 40002)]);
        assert_eq!(
            rewrite_ports("http://127.0.0.1:8080", &ports),
            "http://127.0.0.1:40001"
        );
        assert_eq!(rewrite_ports("0.0.0.0:15080", &ports), "127.0.0.1:40002");
        assert_eq!(
            rewrite_ports("url: http://localhost:8080/jobs\nother: 10.0.0.1:8080", &ports),
            "url: http://127.0.0.1:40001/jobs\nother: 10.0.0.1:8080"
        );
        assert_eq!(rewrite_ports("127.0.0.1:9999", &ports), "127.0.0.1:9999");
    }

    #[test]
    fn service_names_with_ports_are_found_and_rewritten() {
        let text = "http://sluice-metrics.sluice-system.svc:8080/readyz web.shop.svc.cluster.local:80 example.com:80";
        assert_eq!(
            service_references(text),
            vec![
                ("sluice-metrics.sluice-system.svc".to_string(), 8080),
                ("web.shop.svc.cluster.local".to_string(), 80)
            ]
        );
        let services = HashMap::from([(
            "sluice-metrics.sluice-system.svc:8080".to_string(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 40001)),
        )]);
        assert_eq!(
            rewrite_services(text, &services),
            "http://127.0.0.1:40001/readyz web.shop.svc.cluster.local:80 example.com:80"
        );
    }

    #[test]
    fn undeclared_localhost_ports_are_found_in_text() {
        let text =
            "handler:\n  url: http://127.0.0.1:3000/jobs\nlisten: 0.0.0.0:9090\nredis: redis://10.0.0.1:6379";
        assert_eq!(localhost_ports(text), vec![3000, 9090]);
    }

    #[test]
    fn mount_paths_are_replaced_by_the_local_volume_dir() {
        let mounts = vec![("/etc/sluice".to_string(), PathBuf::from("/tmp/p/volumes/cfg"))];
        assert_eq!(
            rewrite_mounts("/etc/sluice/config.yaml", &mounts),
            "/tmp/p/volumes/cfg/config.yaml"
        );
        assert_eq!(rewrite_mounts("/etc/sluicex", &mounts), "/etc/sluicex");
        assert_eq!(rewrite_mounts("--config", &mounts), "--config");
    }
}
