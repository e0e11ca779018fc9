//! Injection tests on real pod JSON of the common shapes.

use serde_json::{Value, json};

use super::*;

fn config() -> InjectConfig {
    InjectConfig {
        sidecar: SidecarSettings {
            image: "ghcr.io/sluice-dev/sluice-sidecar:0.1.0".into(),
            image_pull_policy: Some("IfNotPresent".into()),
            resources: Some(
                serde_json::from_value(
                    json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}),
                )
                .unwrap(),
            ),
            queue_api_auth: false,
        },
        native: true,
        config_verify_key: Some("ab".repeat(32)),
        queue_api_auth: false,
    }
}

fn policy(name: &str, selector: Option<Value>) -> Arc<RateLimitPolicy> {
    let mut spec = json!({
        "redis": {"secretRef": {"name": "redis-creds", "key": "url"}},
        "rules": [{"name": "all", "limit": {"requests": 100, "window": "1m"}}],
    });
    if let Some(s) = selector {
        spec["selector"] = s;
    }
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
            "metadata": {"name": name, "namespace": "shop"}, "spec": spec,
        }))
        .unwrap(),
    )
}

fn policies() -> Vec<Arc<RateLimitPolicy>> {
    vec![policy("api", None)]
}

/// A typical web pod: one container serving HTTP on a named port, probed through that name.
fn web_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-7d4f", "namespace": "shop", "labels": {"app": "web"},
                     "annotations": {"sluice.dev/inject": "true", "sluice.dev/policy": "api"}},
        "spec": {
            "containers": [{
                "name": "web", "image": "shop/web:1.2",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                "livenessProbe": {"tcpSocket": {"port": "http"}},
                "startupProbe": {"httpGet": {"path": "/started", "port": 8080}},
                "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http"}}}
            }]
        }
    })
}

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn admit_json(v: Value) -> Result<Option<Value>, InjectError> {
    admit(&pod(v), &policies(), &[], &config()).map(|p| p.map(|p| serde_json::to_value(p).unwrap()))
}

fn sidecar(pod: &Value) -> &Value {
    pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .chain(pod["spec"]["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == SIDECAR_CONTAINER_NAME)
        .expect("sidecar injected")
}

fn env<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap()
}

#[test]
fn single_container_pod_gets_a_native_sidecar_that_takes_over_the_named_port() {
    let out = admit_json(web_pod()).unwrap().unwrap();
    let app = &out["spec"]["containers"][0];
    assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 1);
    // The app keeps its number; its name moved to the sidecar.
    assert_eq!(app["ports"][0], json!({"containerPort": 8080, "protocol": "TCP"}));
    assert_eq!(app["ports"][1]["name"], "metrics", "other ports are untouched");
    // kubelet keeps probing the app directly.
    assert_eq!(app["readinessProbe"]["httpGet"]["port"], 8080);
    assert_eq!(app["livenessProbe"]["tcpSocket"]["port"], 8080);
    assert_eq!(app["startupProbe"]["httpGet"]["port"], 8080);
    assert_eq!(app["lifecycle"]["preStop"]["httpGet"]["port"], 8080);

    let s = sidecar(&out);
    assert_eq!(s["restartPolicy"], "Always");
    assert_eq!(s["image"], "ghcr.io/sluice-dev/sluice-sidecar:0.1.0");
    assert_eq!(s["args"], json!(["--config", "/etc/sluice/config.yaml"]));
    assert_eq!(
        s["ports"][0],
        json!({"name": "http", "containerPort": 15080, "protocol": "TCP"})
    );
    assert_eq!(env(s, "SLUICE_LISTEN")["value"], "0.0.0.0:15080");
    assert_eq!(env(s, "SLUICE_UPSTREAM")["value"], "http://127.0.0.1:8080");
    assert_eq!(
        env(s, "SLUICE_REDIS_URL")["valueFrom"]["secretKeyRef"],
        json!({"name": "redis-creds", "key": "url", "optional": false})
    );
    assert_eq!(
        env(s, "SLUICE_COUNTER_KEY")["valueFrom"]["secretKeyRef"],
        json!({"name": "sluice-counter-key", "key": "key", "optional": false})
    );
    assert_eq!(
        env(s, "SLUICE_POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let sc = &s["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}));
    assert_eq!(
        s["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": 15021})
    );
    assert_eq!(
        s["startupProbe"]["httpGet"],
        json!({"path": "/readyz", "port": 15021})
    );
    assert_eq!(s["resources"]["requests"]["cpu"], "50m");
    assert_eq!(
        s["volumeMounts"],
        json!([{"name": "sluice-config", "mountPath": "/etc/sluice", "readOnly": true}])
    );
    assert_eq!(
        out["spec"]["volumes"],
        json!([{"name": "sluice-config", "configMap": {"name": "sluice-policy-api"}}])
    );
    assert_eq!(out["metadata"]["labels"]["sluice.dev/policy"], "api");
    assert_eq!(out["metadata"]["labels"]["app"], "web");
}

#[test]
fn re_admitting_an_injected_pod_changes_nothing() {
    let once = admit_json(web_pod()).unwrap().unwrap();
    assert_eq!(admit_json(once).unwrap(), None);
}

#[test]
fn a_pod_that_already_has_the_container_is_left_alone() {
    let mut v = web_pod();
    v["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sluice-sidecar", "image": "custom/sidecar:dev"}));
    assert_eq!(admit_json(v).unwrap(), None);
}

#[test]
fn pods_that_do_not_ask_are_left_alone() {
    let mut v = web_pod();
    v["metadata"]["annotations"]["sluice.dev/inject"] = json!("false");
    assert_eq!(admit_json(v).unwrap(), None);
    let mut v = web_pod();
    v["metadata"]["annotations"] = json!({});
    assert_eq!(admit_json(v).unwrap(), None);
}

#[test]
fn multi_container_pod_fronts_the_container_the_annotation_names() {
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "shop", "namespace": "shop",
                     "annotations": {"sluice.dev/inject": "true", "sluice.dev/policy": "api",
                                     "sluice.dev/app-port": "web"}},
        "spec": {"containers": [
            {"name": "log-shipper", "image": "fluent-bit", "ports": [{"name": "fb-http", "containerPort": 2020}]},
            {"name": "shop", "image": "shop", "ports": [{"name": "web", "containerPort": 3000}],
             "readinessProbe": {"httpGet": {"path": "/", "port": "web"}}}
        ]}
    });
    let out = admit_json(v).unwrap().unwrap();
    assert_eq!(out["spec"]["containers"][0]["ports"][0]["name"], "fb-http");
    assert_eq!(
        out["spec"]["containers"][1]["ports"][0],
        json!({"containerPort": 3000})
    );
    assert_eq!(
        out["spec"]["containers"][1]["readinessProbe"]["httpGet"]["port"],
        3000
    );
    let s = sidecar(&out);
    assert_eq!(s["ports"][0]["name"], "web");
    assert_eq!(env(s, "SLUICE_UPSTREAM")["value"], "http://127.0.0.1:3000");
}

#[test]
fn numeric_unnamed_port_is_fronted_by_a_port_named_sluice() {
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "shop",
                     "annotations": {"sluice.dev/inject": "true", "sluice.dev/policy": "api",
                                     "sluice.dev/listen-port": "9000"}},
        "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 5000}],
                                 "livenessProbe": {"httpGet": {"path": "/", "port": 5000}}}]}
    });
    let out = admit_json(v).unwrap().unwrap();
    assert_eq!(
        out["spec"]["containers"][0]["ports"],
        json!([{"containerPort": 5000}])
    );
    let s = sidecar(&out);
    assert_eq!(
        s["ports"][0],
        json!({"name": "sluice", "containerPort": 9000, "protocol": "TCP"})
    );
    assert_eq!(env(s, "SLUICE_UPSTREAM")["value"], "http://127.0.0.1:5000");
}

#[test]
fn undeclared_numeric_app_port_is_fronted_all_the_same() {
    let mut v = web_pod();
    v["metadata"]["annotations"]["sluice.dev/app-port"] = json!("7000");
    let out = admit_json(v).unwrap().unwrap();
    assert_eq!(
        env(sidecar(&out), "SLUICE_UPSTREAM")["value"],
        "http://127.0.0.1:7000"
    );
    assert_eq!(
        out["spec"]["containers"][0]["ports"][0]["name"], "http",
        "the http name stays with the app"
    );
}

#[test]
fn existing_init_containers_run_before_the_sidecar() {
    let mut v = web_pod();
    v["spec"]["initContainers"] = json!([{"name": "migrate", "image": "shop/migrate"}]);
    let out = admit_json(v).unwrap().unwrap();
    let inits = out["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(inits[0]["name"], "migrate");
    assert_eq!(inits[1]["name"], SIDECAR_CONTAINER_NAME);
}

#[test]
fn plain_container_is_injected_when_asked_or_configured() {
    let mut v = web_pod();
    v["metadata"]["annotations"]["sluice.dev/native-sidecar"] = json!("false");
    let out = admit_json(v).unwrap().unwrap();
    assert!(out["spec"]["initContainers"].is_null());
    let s = &out["spec"]["containers"][1];
    assert_eq!(s["name"], SIDECAR_CONTAINER_NAME);
    assert!(s["restartPolicy"].is_null() && s["startupProbe"].is_null());

    let cfg = InjectConfig {
        native: false,
        ..config()
    };
    let out = admit(&pod(web_pod()), &policies(), &[], &cfg).unwrap().unwrap();
    assert_eq!(out.spec.unwrap().containers.len(), 2);
}

#[test]
fn policy_is_found_by_selector_when_the_pod_names_none() {
    let mut v = web_pod();
    v["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("sluice.dev/policy");
    let ps = vec![
        policy("other", Some(json!({"matchLabels": {"app": "admin"}}))),
        policy("web-limits", Some(json!({"matchLabels": {"app": "web"}}))),
        policy("by-name-only", None),
    ];
    let out = admit(&pod(v.clone()), &ps, &[], &config()).unwrap().unwrap();
    assert_eq!(out.metadata.labels.unwrap()["sluice.dev/policy"], "web-limits");

    let err = admit(&pod(v.clone()), &ps[2..], &[], &config()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("annotation sluice.dev/policy: absent, and no RateLimitPolicy"),
        "{err}"
    );

    let two = vec![ps[1].clone(), policy("everything", Some(json!({})))];
    let err = admit(&pod(v), &two, &[], &config()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "annotation sluice.dev/policy: absent, and RateLimitPolicies \"web-limits\", \"everything\" all \
         select this pod: name one in the annotation"
    );
}

#[test]
fn a_missing_named_policy_rejects_the_pod_naming_the_annotation() {
    let err = admit(&pod(web_pod()), &[], &[], &config()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "annotation sluice.dev/policy: RateLimitPolicy \"api\" does not exist in namespace \"shop\"; create it \
         first (controllers retry creating the pod)"
    );
}

#[test]
fn bad_annotations_reject_the_pod_without_injecting_anything() {
    for (key, value, starts) in [
        (
            "sluice.dev/inject",
            "yes",
            "annotation sluice.dev/inject: \"yes\" is not a boolean",
        ),
        (
            "sluice.dev/app-port",
            "grpc",
            "annotation sluice.dev/app-port: no container of this pod has a port named \"grpc\"",
        ),
        (
            "sluice.dev/listen-port",
            "8080",
            "annotation sluice.dev/listen-port: port 8080 is already used",
        ),
        (
            "sluice.dev/listen-port",
            "9090",
            "annotation sluice.dev/listen-port: port 9090 is already used",
        ),
        (
            "sluice.dev/listen-port",
            "15021",
            "annotation sluice.dev/listen-port: port 15021 is reserved",
        ),
        (
            "sluice.dev/listen-port",
            "-1",
            "annotation sluice.dev/listen-port: \"-1\" is not a port number",
        ),
        (
            "sluice.dev/policy",
            "Bad_Name",
            "annotation sluice.dev/policy: \"Bad_Name\" is not a RateLimitPolicy name",
        ),
    ] {
        let mut v = web_pod();
        v["metadata"]["annotations"][key] = json!(value);
        let err = admit_json(v).unwrap_err().to_string();
        assert!(err.starts_with(starts), "{key}={value}: {err}");
    }
}

#[test]
fn a_pod_with_several_unnamed_ports_must_say_which_one() {
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "shop",
                     "annotations": {"sluice.dev/inject": "true", "sluice.dev/policy": "api"}},
        "spec": {"containers": [{"name": "app", "image": "app",
                                 "ports": [{"containerPort": 5000}, {"containerPort": 5001}]}]}
    });
    let err = admit_json(v).unwrap_err().to_string();
    assert!(
        err.starts_with("annotation sluice.dev/app-port: absent, and the pod declares several ports"),
        "{err}"
    );
}

#[test]
fn the_json_patch_turns_the_pod_into_the_injected_pod() {
    for v in [web_pod(), {
        let mut v = web_pod();
        v["spec"]["initContainers"] = json!([{"name": "migrate", "image": "m"}]);
        v["spec"]["volumes"] = json!([{"name": "tmp", "emptyDir": {}}]);
        v
    }] {
        let original = pod(v);
        let injected = admit(&original, &policies(), &[], &config()).unwrap().unwrap();
        let p = patch(&original, &injected);
        let mut doc = serde_json::to_value(&original).unwrap();
        json_patch::patch(&mut doc, &p).unwrap();
        assert_eq!(doc, serde_json::to_value(&injected).unwrap());
    }
}

fn job_queue(name: &str, secret: &str) -> Arc<JobQueue> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"database": {"secretRef": {"name": secret}},
                     "worker": {"template": {"spec": {"containers": [{"name": "h", "image": "h"}]}}}},
        }))
        .unwrap(),
    )
}

fn queues() -> Vec<Arc<JobQueue>> {
    vec![
        job_queue("emails", "pg"),
        job_queue("reports", "pg"),
        job_queue("billing", "billing-pg"),
    ]
}

/// A pod of the `shop` namespace with `annotations` and one container with an `http` port.
fn enqueuing_pod(annotations: Value, labels: Value) -> Pod {
    pod(json!({
        "metadata": {"name": "app", "namespace": "shop", "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
}

fn admit_queues(p: &Pod, ps: &[Arc<RateLimitPolicy>]) -> Result<Value, InjectError> {
    admit(p, ps, &queues(), &config()).map(|p| serde_json::to_value(p.expect("injected")).unwrap())
}

#[test]
fn job_queues_alone_get_a_sidecar_serving_only_the_queue_api_with_the_url_from_the_secret() {
    let out = admit_queues(
        &enqueuing_pod(
            json!({"sluice.dev/job-queues": "emails,reports"}),
            json!({"app": "other"}),
        ),
        &policies(),
    )
    .unwrap();
    let s = sidecar(&out);
    // The namespace's tenant Secret (rowLevelSecurity is Enabled by default), by reference.
    let tenant = crate::tenant::secret_name(queues()[0].spec.database.source().unwrap());
    assert_eq!(
        env(s, "SLUICE_DATABASE_URL")["valueFrom"]["secretKeyRef"],
        json!({"name": tenant, "key": "url", "optional": false}),
        "by reference, never as text"
    );
    assert!(env(s, "SLUICE_DATABASE_URL").get("value").is_none());
    assert_eq!(env(s, "SLUICE_QUEUES")["value"], "shop/emails,shop/reports");
    assert_eq!(env(s, "SLUICE_QUEUE_NAMESPACE")["value"], "shop");
    assert_eq!(env(s, "SLUICE_API_LISTEN")["value"], "127.0.0.1:7070");
    assert_eq!(env(s, "RATE_LIMIT__ENABLED")["value"], "false");
    assert_eq!(env(s, "SLUICE_LISTEN")["value"], "127.0.0.1:15080");
    assert!(s.get("args").is_none(), "no config file: {s}");
    assert!(s.get("volumeMounts").is_none());
    // The app keeps its port and learns where the API is; no policy label, no config volume.
    let app = &out["spec"]["containers"][0];
    assert_eq!(app["ports"][0]["name"], "http");
    assert_eq!(env(app, "SLUICE_QUEUE_API")["value"], "http://127.0.0.1:7070");
    assert!(out["metadata"]["labels"].get("sluice.dev/policy").is_none());
    assert!(out["spec"].get("volumes").is_none());
}

#[test]
fn job_queues_with_a_policy_get_rate_limiting_and_the_queue_api_in_one_sidecar() {
    let out = admit_queues(
        &enqueuing_pod(
            json!({"sluice.dev/job-queues": "emails", "sluice.dev/policy": "api"}),
            json!({"app": "other"}),
        ),
        &policies(),
    )
    .unwrap();
    let s = sidecar(&out);
    assert_eq!(env(s, "SLUICE_QUEUES")["value"], "shop/emails");
    assert!(env(s, "SLUICE_REDIS_URL")["valueFrom"]["secretKeyRef"].is_object());
    assert_eq!(
        s["ports"][0]["name"], "http",
        "the named port moved to the sidecar"
    );
    assert_eq!(out["metadata"]["labels"]["sluice.dev/policy"], "api");
}

#[test]
fn a_job_queue_missing_from_the_namespace_rejects_the_pod_naming_it() {
    let err = admit_queues(
        &enqueuing_pod(json!({"sluice.dev/job-queues": "emails,invoices"}), json!({})),
        &[],
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("sluice.dev/job-queues") && msg.contains("\"invoices\"") && msg.contains("\"shop\""),
        "{msg}"
    );
}

#[test]
fn job_queues_of_different_databases_are_refused() {
    let err = admit_queues(
        &enqueuing_pod(json!({"sluice.dev/job-queues": "emails,billing"}), json!({})),
        &[],
    )
    .unwrap_err();
    let msg = err.to_string();
    let tenant = crate::tenant::secret_name(queues()[2].spec.database.source().unwrap());
    assert!(msg.contains("\"billing\"") && msg.contains(&tenant), "{msg}");
}

#[test]
fn job_queues_with_and_without_row_level_security_are_refused_together() {
    let mut disabled = (*job_queue("reports", "pg")).clone();
    disabled.spec.database.row_level_security = sluice_crds::job_queue::RowLevelSecurity::Disabled;
    let queues = vec![job_queue("emails", "pg"), Arc::new(disabled)];
    let pod = enqueuing_pod(json!({"sluice.dev/job-queues": "emails,reports"}), json!({}));
    let msg = admit(&pod, &[], &queues, &config()).unwrap_err().to_string();
    assert!(msg.contains("rowLevelSecurity"), "{msg}");
    // Disabled alone: the JobQueue's own Secret.
    let pod = enqueuing_pod(json!({"sluice.dev/job-queues": "reports"}), json!({}));
    let out = serde_json::to_value(admit(&pod, &[], &queues, &config()).unwrap().unwrap()).unwrap();
    assert_eq!(
        env(sidecar(&out), "SLUICE_DATABASE_URL")["valueFrom"]["secretKeyRef"]["name"],
        "pg"
    );
}

#[test]
fn the_queue_api_port_taken_by_the_app_is_refused() {
    let p = pod(json!({
        "metadata": {"name": "app", "namespace": "shop", "annotations": {"sluice.dev/job-queues": "emails"}},
        "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 7070}]}]}
    }));
    let err = admit_queues(&p, &[]).unwrap_err();
    assert!(err.to_string().contains("port 7070"), "{err}");
}

fn admit_checked(p: &Pod, ps: &[Arc<RateLimitPolicy>], jqs: &[Arc<JobQueue>]) -> Result<Value, InjectError> {
    let cfg = InjectConfig {
        queue_api_auth: true,
        ..config()
    };
    admit(p, ps, jqs, &cfg).map(|p| serde_json::to_value(p.expect("injected")).unwrap())
}

#[test]
fn with_queue_api_auth_apps_get_a_sluice_token_and_the_sidecar_what_it_needs_to_review_callers() {
    for (annotations, with_policy) in [
        (json!({"sluice.dev/job-queues": "emails"}), false),
        (
            json!({"sluice.dev/job-queues": "emails", "sluice.dev/policy": "api"}),
            true,
        ),
    ] {
        let out = admit_checked(
            &enqueuing_pod(annotations, json!({"app": "other"})),
            &policies(),
            &queues(),
        )
        .unwrap();
        let s = sidecar(&out);
        assert_eq!(env(s, "SLUICE_API_AUTH")["value"], "kubernetes");
        assert_eq!(
            env(s, "SLUICE_POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        assert_eq!(
            env(s, "SLUICE_POD_SERVICE_ACCOUNT")["valueFrom"]["fieldRef"]["fieldPath"],
            "spec.serviceAccountName"
        );
        assert!(
            s["env"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| e["name"] != "SLUICE_API_AUTH_LOOPBACK"),
            "tokenless loopback callers are the pod's ServiceAccount"
        );
        let mounts = s["volumeMounts"].as_array().unwrap();
        assert!(mounts.contains(&json!({"name": "sluice-kube-api",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true})));
        let app = &out["spec"]["containers"][0];
        assert_eq!(
            env(app, "SLUICE_QUEUE_API_TOKEN_FILE")["value"],
            "/var/run/secrets/sluice.dev/token"
        );
        assert_eq!(
            app["volumeMounts"],
            json!([{"name": "sluice-queue-api-token", "mountPath": "/var/run/secrets/sluice.dev", "readOnly": true}])
        );
        let volumes = out["spec"]["volumes"].as_array().unwrap();
        let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap().clone();
        assert_eq!(
            volume("sluice-queue-api-token")["projected"]["sources"],
            json!([{"serviceAccountToken": {"audience": "sluice", "expirationSeconds": 600, "path": "token"}}])
        );
        let api = volume("sluice-kube-api")["projected"]["sources"].clone();
        assert_eq!(api[0]["serviceAccountToken"]["path"], "token");
        assert!(
            api[0]["serviceAccountToken"].get("audience").is_none(),
            "the API server's own"
        );
        assert_eq!(api[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(api[2]["downwardAPI"]["items"][0]["path"], "namespace");
        assert_eq!(volumes.len(), if with_policy { 3 } else { 2 });
    }
}

#[test]
fn a_host_network_pod_needs_tokens_even_on_loopback_and_a_renamed_queue_is_authorized_on_its_job_queue() {
    let mut p = enqueuing_pod(json!({"sluice.dev/job-queues": "emails"}), json!({}));
    p.spec.as_mut().unwrap().host_network = Some(true);
    let mut renamed = (*job_queue("emails", "pg")).clone();
    renamed.spec.queue_name = Some("email-jobs".into());
    let out = admit_checked(&p, &policies(), &[Arc::new(renamed)]).unwrap();
    let s = sidecar(&out);
    assert_eq!(env(s, "SLUICE_API_AUTH_LOOPBACK")["value"], "token");
    assert_eq!(env(s, "SLUICE_QUEUES")["value"], "shop/email-jobs");
    assert_eq!(env(s, "SLUICE_API_JOB_QUEUES")["value"], "email-jobs=emails");
}

#[test]
fn with_queue_api_auth_a_pod_holding_a_volume_of_the_same_name_is_refused_unchanged() {
    let mut p = enqueuing_pod(json!({"sluice.dev/job-queues": "emails"}), json!({}));
    p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "sluice-kube-api".into(),
        ..Volume::default()
    }]);
    let err = admit_checked(&p, &policies(), &queues()).unwrap_err();
    assert!(err.to_string().contains("\"sluice-kube-api\""), "{err}");
}
