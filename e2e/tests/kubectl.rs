//! Real kubectl (1.32) against the in-memory server: the commands users and e2e scripts run.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use sluice_e2e::{Env, TestNamespace};

const DEADLINE: Duration = Duration::from_secs(10);

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Runs kubectl in the namespace and returns its output.
fn kubectl(env: &Env, ns: &TestNamespace, args: &[&str]) -> Output {
    let mut cmd = env.kubectl().expect("kubectl is installed (make deps)");
    cmd.arg("--namespace").arg(ns.name()).args(args);
    cmd.output().expect("kubectl runs")
}

/// Runs kubectl and fails the test with its stderr unless it succeeds; returns stdout.
fn ok(env: &Env, ns: &TestNamespace, args: &[&str]) -> String {
    let out = kubectl(env, ns, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubectl {} failed: {stderr}",
        args.join(" ")
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn kubectl_get_lists_namespaces_and_discovers_resources() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("get").await.unwrap();
    let out = ok(&env, &ns, &["get", "namespaces"]);
    assert!(out.lines().next().unwrap().starts_with("NAME"), "{out}");
    assert!(out.contains(ns.name()) && out.contains("Active"), "{out}");
    let resources = ok(&env, &ns, &["api-resources"]);
    assert!(
        resources
            .lines()
            .any(|l| l.starts_with("deployments") && l.contains("deploy") && l.contains("apps/v1")),
        "{resources}"
    );
    ok(&env, &ns, &["version"]);
}

#[tokio::test]
async fn kubectl_apply_creates_configures_and_get_prints_printer_columns() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("apply").await.unwrap();
    let out = ok(&env, &ns, &["apply", "-f", path(&fixture("widget-crd.yaml"))]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/widgets.example.dev created"
    );
    let out = ok(
        &env,
        &ns,
        &[
            "wait",
            "--for=condition=established",
            "crd/widgets.example.dev",
            "--timeout=10s",
        ],
    );
    assert!(out.contains("condition met"), "{out}");
    let out = ok(&env, &ns, &["apply", "-f", path(&fixture("widget.yaml"))]);
    assert_eq!(out.trim(), "widget.example.dev/w1 created");
    let out = ok(&env, &ns, &["apply", "-f", path(&fixture("widget.yaml"))]);
    assert_eq!(out.trim(), "widget.example.dev/w1 unchanged");
    let table = ok(&env, &ns, &["get", "widgets"]);
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "SIZE", "AGE"]);
    assert_eq!(&lines[1][..2], ["w1", "3"]);
    let out = ok(
        &env,
        &ns,
        &[
            "patch",
            "wg",
            "w1",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":4}}"#,
        ],
    );
    assert_eq!(out.trim(), "widget.example.dev/w1 patched");
    let size = ok(
        &env,
        &ns,
        &[
            "get",
            "widget",
            "w1",
            "-o",
            "jsonpath={.spec.size} {.spec.max} {.metadata.generation}",
        ],
    );
    assert_eq!(size, "4 10 2");
    let out = ok(&env, &ns, &["apply", "-f", path(&fixture("widget.yaml"))]);
    assert_eq!(out.trim(), "widget.example.dev/w1 configured");
}

#[tokio::test]
async fn kubectl_apply_server_side_reports_conflicts_unless_forced() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("ssa").await.unwrap();
    let deployment = fixture("deployment.yaml");
    let out = ok(&env, &ns, &["apply", "--server-side", "-f", path(&deployment)]);
    assert_eq!(out.trim(), "deployment.apps/web serverside-applied");
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("d.yaml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&deployment)
            .unwrap()
            .replace("replicas: 2", "replicas: 7"),
    )
    .unwrap();
    let out = kubectl(
        &env,
        &ns,
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "other",
            "-f",
            path(&changed),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl\" using apps/v1: .spec.replicas"
        ),
        "{stderr}"
    );
    ok(
        &env,
        &ns,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "other",
            "-f",
            path(&changed),
        ],
    );
    let got = ok(
        &env,
        &ns,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[*].name}",
        ],
    );
    assert_eq!(got, "7 app side");
    let yaml = ok(
        &env,
        &ns,
        &["get", "deploy", "web", "-o", "yaml", "--show-managed-fields"],
    );
    assert!(
        yaml.contains("manager: other") && yaml.contains("manager: kubectl"),
        "{yaml}"
    );
}

#[tokio::test]
async fn kubectl_client_side_apply_patch_and_scale_edit_a_deployment() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("deploy").await.unwrap();
    let deployment = fixture("deployment.yaml");
    ok(&env, &ns, &["apply", "-f", path(&deployment)]);
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("d.yaml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&deployment)
            .unwrap()
            .replace("nginx:1", "nginx:2"),
    )
    .unwrap();
    assert_eq!(
        ok(&env, &ns, &["apply", "-f", path(&changed)]).trim(),
        "deployment.apps/web configured"
    );
    ok(
        &env,
        &ns,
        &[
            "patch",
            "deploy",
            "web",
            "-p",
            r#"{"spec":{"template":{"spec":{"containers":[{"name":"side","image":"side:2"}]}}}}"#,
        ],
    );
    let images = ok(
        &env,
        &ns,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[*].image}",
        ],
    );
    assert_eq!(images, "nginx:2 side:2");
    assert_eq!(
        ok(&env, &ns, &["scale", "deploy", "web", "--replicas=5"]).trim(),
        "deployment.apps/web scaled"
    );
    assert_eq!(
        ok(
            &env,
            &ns,
            &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]
        ),
        "5"
    );
}

#[tokio::test]
async fn kubectl_get_watch_prints_changes_as_they_happen() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("watch").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let cm = |name: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &cm("first")).await.unwrap();
    let mut cmd = env.kubectl().unwrap();
    let mut child = cmd
        .args([
            "--namespace",
            ns.name(),
            "get",
            "configmaps",
            "--watch",
            "-o",
            "name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), "configmap/first");
    api.create(&PostParams::default(), &cm("second")).await.unwrap();
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), "configmap/second");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn kubectl_delete_waits_for_removal_and_finalizers_hold_it() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("delete").await.unwrap();
    ns.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain}\n")
        .await
        .unwrap();
    assert_eq!(
        ok(&env, &ns, &["delete", "configmap", "plain"]).trim(),
        "configmap \"plain\" deleted"
    );
    let out = kubectl(&env, &ns, &["get", "configmap", "plain"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("configmaps \"plain\" not found"));
    ns.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held}\n")
        .await
        .unwrap();
    ok(
        &env,
        &ns,
        &[
            "patch",
            "configmap",
            "held",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["example.dev/hold"]}}"#,
        ],
    );
    ok(&env, &ns, &["delete", "configmap", "held", "--wait=false"]);
    let ts = ok(
        &env,
        &ns,
        &[
            "get",
            "configmap",
            "held",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ],
    );
    assert!(!ts.is_empty());
    ok(
        &env,
        &ns,
        &[
            "patch",
            "configmap",
            "held",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    );
    let out = ok(&env, &ns, &["get", "configmaps", "-o", "name"]);
    assert_eq!(out.trim(), "");
}

#[tokio::test]
async fn kubectl_explain_describes_a_custom_resource_and_invalid_ones_are_rejected() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("explain").await.unwrap();
    ns.apply_file(&fixture("widget-crd.yaml")).await.unwrap();
    let out = ok(&env, &ns, &["explain", "widget.spec"]);
    assert!(
        out.contains("KIND:       Widget")
            && out.contains("size\t<integer> -required-")
            && out.contains("How big."),
        "{out}"
    );
    let out = kubectl(&env, &ns, &["apply", "-f", path(&fixture("widget-invalid.yaml"))]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "The Widget \"too-big\" is invalid: spec: Invalid value: \"object\": size must not exceed max"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn kubectl_create_of_built_in_kinds_sends_protobuf_and_is_stored_as_json() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("create").await.unwrap();
    let server = env.server().expect("the in-memory server");
    let get = |api_version: &str, kind: &str, namespace: &str, name: &str| {
        server
            .get(api_version, kind, namespace, name)
            .unwrap_or_else(|| panic!("{kind} {name} was created"))
    };

    let out = ok(
        &env,
        &ns,
        &[
            "create",
            "configmap",
            "settings",
            "--from-literal=mode=fast",
            "--from-literal=empty=",
        ],
    );
    assert_eq!(out.trim(), "configmap/settings created");
    let cm = get("v1", "ConfigMap", ns.name(), "settings");
    assert_eq!(cm["data"], json!({"mode": "fast", "empty": ""}));
    assert_eq!(cm["metadata"]["managedFields"][0]["manager"], "kubectl-create");

    ok(
        &env,
        &ns,
        &[
            "create",
            "secret",
            "generic",
            "login",
            "--from-literal=password=hunter2",
        ],
    );
    let secret = get("v1", "Secret", ns.name(), "login");
    assert_eq!(secret["type"], "Opaque");
    assert_eq!(secret["data"], json!({"password": "aHVudGVyMg=="}));

    ok(&env, &ns, &["create", "serviceaccount", "robot"]);
    get("v1", "ServiceAccount", ns.name(), "robot");

    ok(
        &env,
        &ns,
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx:1",
            "--replicas=0",
            "--port=8080",
        ],
    );
    let deploy = get("apps/v1", "Deployment", ns.name(), "web");
    assert_eq!(
        deploy["spec"]["replicas"], 0,
        "a pointer field's zero is kept: {deploy}"
    );
    assert_eq!(deploy["spec"]["selector"], json!({"matchLabels": {"app": "web"}}));
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        *container,
        json!({"name": "nginx", "image": "nginx:1", "ports": [{"containerPort": 8080, "protocol": "TCP"}], "resources": {}}),
        "zero-valued fields are left out, as Go's JSON would: {deploy}"
    );
    assert!(
        deploy["metadata"]
            .get("creationTimestamp")
            .is_some_and(|t| t.is_string())
    );
    assert!(
        deploy["spec"]["template"]["metadata"]
            .get("creationTimestamp")
            .is_none()
    );

    ok(
        &env,
        &ns,
        &["create", "service", "clusterip", "web", "--tcp=80:8080"],
    );
    let svc = get("v1", "Service", ns.name(), "web");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080}])
    );
    assert_eq!(svc["spec"]["type"], "ClusterIP");

    let other = format!("{}-other", ns.name());
    assert_eq!(
        ok(&env, &ns, &["create", "namespace", &other]).trim(),
        format!("namespace/{other} created")
    );
    let created = get("v1", "Namespace", "", &other);
    assert_eq!(created["status"]["phase"], "Active");
    ok(&env, &ns, &["delete", "namespace", &other, "--wait=false"]);
}
