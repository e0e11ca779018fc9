//! Conformance-style tests of the in-memory API server through a real kube client: each asserts what a
//! real kube-apiserver does.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use sluice_e2e::{Env, Options, TestApiServer, wait_for};

const DEADLINE: Duration = Duration::from_secs(5);

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other}"),
    }
}

fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => panic!("expected an API error, got {other}"),
    }
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.dev}
spec:
  group: example.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            x-kubernetes-validations:
            - {rule: "self.size <= self.max", message: "size must not exceed max"}
            properties:
              size: {type: integer, minimum: 1}
              max: {type: integer, default: 10}
              mode: {type: string, enum: [open, closed]}
          status:
            type: object
            properties:
              ready: {type: boolean}
"#;

fn widgets(client: kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.dev", "v1", "Widget"), "widgets");
    Api::namespaced_with(client, ns, &ar)
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

#[tokio::test]
async fn a_wrong_token_gets_401_unauthorized() {
    let server = TestApiServer::start(Options::default()).await.unwrap();
    let kubeconfig = server
        .kubeconfig("default")
        .replace(server.token(), "wrong-token");
    let kc: kube::config::Kubeconfig = serde_yaml::from_str(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let err = Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(code(&err), 401);
}

#[tokio::test]
async fn plain_http_serves_the_same_api() {
    let server = TestApiServer::start(Options {
        tls: false,
        ..Options::default()
    })
    .await
    .unwrap();
    assert!(server.url().starts_with("http://"));
    let names: Vec<String> = Api::<Namespace>::all(server.client("default").await.unwrap())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
}

#[tokio::test]
async fn create_of_an_existing_name_gets_409_and_get_of_a_missing_one_gets_404() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("crud").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let created = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some() && meta.resource_version.is_some());
    let err = api.create(&PostParams::default(), &cm("a")).await.unwrap_err();
    assert_eq!(
        (code(&err), message(&err).as_str()),
        (409, "configmaps \"a\" already exists")
    );
    let err = api.get("missing").await.unwrap_err();
    assert_eq!(
        (code(&err), message(&err).as_str()),
        (404, "configmaps \"missing\" not found")
    );
}

#[tokio::test]
async fn secret_string_data_is_stored_as_base64_data_and_never_read_back() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("secrets").await.unwrap();
    let api: Api<Secret> = ns.api();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "data": {"user": "b2xk", "host": "aG9zdA=="},
        "stringData": {"url": "postgres://app@db/app", "user": "app"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &secret).await.unwrap();
    let stored = api.get("db").await.unwrap();
    assert!(stored.string_data.is_none(), "stringData is write-only");
    let data = stored.data.unwrap();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    assert_eq!(text("url"), "postgres://app@db/app");
    assert_eq!(text("user"), "app", "stringData wins over data");
    assert_eq!(text("host"), "host");
}

#[tokio::test]
async fn an_update_with_a_stale_resource_version_gets_409_conflict() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("stale").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let first = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let mut newer = first.clone();
    newer.data = Some([("k".to_string(), "2".to_string())].into());
    let newer = api.replace("a", &PostParams::default(), &newer).await.unwrap();
    assert_ne!(newer.metadata.resource_version, first.metadata.resource_version);
    let err = api
        .replace("a", &PostParams::default(), &first)
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);
    assert!(
        message(&err).contains("the object has been modified"),
        "{}",
        message(&err)
    );
}

#[tokio::test]
async fn finalizers_block_deletion_until_the_last_one_is_removed() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("finalizers").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let mut held = cm("held");
    held.metadata.finalizers = Some(vec!["example.dev/a".into(), "example.dev/b".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let pending = api.delete("held", &DeleteParams::default()).await.unwrap();
    assert!(pending.is_left(), "deletion must wait for finalizers");
    let now = api.get("held").await.unwrap();
    assert!(now.metadata.deletion_timestamp.is_some());
    let pp = PatchParams::default();
    api.patch(
        "held",
        &pp,
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.dev/b"]}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("held").await.unwrap().is_some());
    let err = api
        .patch(
            "held",
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.dev/b", "example.dev/new"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 403);
    api.patch(
        "held",
        &pp,
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn deleting_an_owner_collects_its_dependents_and_orphan_keeps_them() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("gc").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let secrets: Api<Secret> = ns.api();
    for owner_name in ["owner", "orphaning-owner"] {
        let owner = cms.create(&PostParams::default(), &cm(owner_name)).await.unwrap();
        let owner_ref = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": owner.metadata.uid, "controller": true}]);
        let dep: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{owner_name}-dep"), "ownerReferences": owner_ref}}),
        )
        .unwrap();
        secrets.create(&PostParams::default(), &dep).await.unwrap();
        let mut dep_cm = cm(&format!("{owner_name}-dep-cm"));
        dep_cm.metadata.owner_references = Some(serde_json::from_value(owner_ref).unwrap());
        cms.create(&PostParams::default(), &dep_cm).await.unwrap();
    }
    cms.delete("owner", &DeleteParams::background()).await.unwrap();
    wait_for("dependents collected", DEADLINE, || async {
        let gone = secrets.get_opt("owner-dep").await.unwrap().is_none()
            && cms.get_opt("owner-dep-cm").await.unwrap().is_none();
        gone.then_some(())
    })
    .await
    .unwrap();
    cms.delete("orphaning-owner", &DeleteParams::orphan())
        .await
        .unwrap();
    let kept = secrets.get("orphaning-owner-dep").await.unwrap();
    assert!(kept.metadata.owner_references.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn a_dependent_written_after_its_owner_was_deleted_is_collected_and_one_with_an_owner_stays() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("gc-late").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let owned_by = |owner: &ConfigMap, name: &str| {
        let mut dep = cm(name);
        dep.metadata.owner_references = Some(
            serde_json::from_value(json!([{"apiVersion": "v1", "kind": "ConfigMap",
                "name": owner.metadata.name, "uid": owner.metadata.uid, "controller": true}]))
            .unwrap(),
        );
        dep
    };
    let live = cms.create(&PostParams::default(), &cm("live")).await.unwrap();
    let gone = cms.create(&PostParams::default(), &cm("gone")).await.unwrap();
    cms.delete("gone", &DeleteParams::background()).await.unwrap();
    cms.create(&PostParams::default(), &owned_by(&live, "of-live"))
        .await
        .unwrap();
    // A late write (a controller's reconcile finishing after its owner went): the garbage collector
    // deletes it once it finds that no owner exists.
    cms.create(&PostParams::default(), &owned_by(&gone, "of-gone"))
        .await
        .unwrap();
    wait_for(
        "the dependent of the deleted owner collected",
        DEADLINE,
        || async { cms.get_opt("of-gone").await.unwrap().is_none().then_some(()) },
    )
    .await
    .unwrap();
    assert!(cms.get_opt("of-live").await.unwrap().is_some());
}

#[tokio::test]
async fn an_apply_that_changes_nothing_keeps_the_resource_version_and_sends_no_watch_event() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("noop-apply").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let owner = cms.create(&PostParams::default(), &cm("owner")).await.unwrap();
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "owned", "labels": {"app": "web"}, "ownerReferences": [{"apiVersion": "v1",
            "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "controller": true}]},
        "data": {"k": "v"}});
    let pp = PatchParams::apply("a-controller").force();
    let first = cms.patch("owned", &pp, &Patch::Apply(&applied)).await.unwrap();
    let again = cms.patch("owned", &pp, &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(
        again.metadata.resource_version, first.metadata.resource_version,
        "kube-apiserver does not write an object that an apply leaves as it was"
    );
    // Nothing was written, so a watch from the first apply's version sees only what comes next.
    let rv = first.metadata.resource_version.clone().unwrap();
    let mut events = cms
        .watch(&kube::api::WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &cm("marker")).await.unwrap();
    let next = tokio::time::timeout(DEADLINE, events.next())
        .await
        .expect("an event before the deadline")
        .unwrap()
        .unwrap();
    match next {
        kube::api::WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("marker")),
        other => panic!("the unchanged apply sent an event: {other:?}"),
    }
}

#[tokio::test]
async fn foreground_deletion_waits_for_dependents() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("foreground").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let owner = cms.create(&PostParams::default(), &cm("owner")).await.unwrap();
    let mut dep = cm("dep");
    dep.metadata.owner_references = Some(
        serde_json::from_value(json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "blockOwnerDeletion": true}]))
            .unwrap(),
    );
    dep.metadata.finalizers = Some(vec!["example.dev/slow".into()]);
    cms.create(&PostParams::default(), &dep).await.unwrap();
    cms.delete("owner", &DeleteParams::foreground()).await.unwrap();
    let waiting = cms.get("owner").await.unwrap();
    assert_eq!(
        waiting.metadata.finalizers,
        Some(vec!["foregroundDeletion".to_string()])
    );
    cms.patch(
        "dep",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("dep").await.unwrap().is_none());
    assert!(cms.get_opt("owner").await.unwrap().is_none());
}

#[tokio::test]
async fn an_invalid_custom_resource_is_rejected_with_the_schema_message() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("schema").await.unwrap();
    ns.apply_yaml(WIDGET_CRD).await.unwrap();
    let api = widgets(ns.client(), ns.name());
    let pp = PostParams::default();
    let err = api
        .create(&pp, &widget("small", json!({"size": 0})))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(
        message(&err),
        "Widget.example.dev \"small\" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
    );
    let err = api
        .create(&pp, &widget("big", json!({"size": 30})))
        .await
        .unwrap_err();
    assert_eq!(
        message(&err),
        "Widget.example.dev \"big\" is invalid: spec: Invalid value: \"object\": size must not exceed max"
    );
    let err = api
        .create(&pp, &widget("odd", json!({"size": 1, "mode": "half"})))
        .await
        .unwrap_err();
    assert!(
        message(&err).contains("spec.mode: Unsupported value: \"half\""),
        "{}",
        message(&err)
    );
    let err = api.create(&pp, &widget("bare", json!({}))).await.unwrap_err();
    assert!(
        message(&err).contains("spec.size: Required value"),
        "{}",
        message(&err)
    );
    let ok = api
        .create(&pp, &widget("fine", json!({"size": 3, "unknown": 1})))
        .await
        .unwrap();
    assert_eq!(
        ok.data["spec"],
        json!({"size": 3, "max": 10}),
        "defaults applied, unknown fields pruned"
    );
}

#[tokio::test]
async fn status_is_a_separate_subresource_and_generation_counts_spec_changes_only() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("status").await.unwrap();
    ns.apply_yaml(WIDGET_CRD).await.unwrap();
    let api = widgets(ns.client(), ns.name());
    let mut w = widget("w", json!({"size": 1}));
    w.data["status"] = json!({"ready": true});
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );
    let pp = PatchParams::default();
    let s = api
        .patch_status(
            "w",
            &pp,
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"size": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            s.data["status"]["ready"].clone(),
            s.data["spec"]["size"].clone(),
            s.metadata.generation
        ),
        (json!(true), json!(1), Some(1))
    );
    let m = api
        .patch(
            "w",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}, "status": {"ready": false}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (m.data["status"]["ready"].clone(), m.metadata.generation),
        (json!(true), Some(1))
    );
    let g = api
        .patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 2}})))
        .await
        .unwrap();
    assert_eq!(g.metadata.generation, Some(2));
}

#[tokio::test]
async fn server_side_apply_conflicts_unless_forced_and_tracks_managers() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("ssa").await.unwrap();
    let api: Api<Deployment> = ns.api();
    let deploy = |replicas: i64, image: &str| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": image, "ports": [{"containerPort": 80}]}]}}}})
    };
    api.patch(
        "web",
        &PatchParams::apply("team"),
        &Patch::Apply(deploy(2, "app:1")),
    )
    .await
    .unwrap();
    let sidecar = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"template": {"spec": {
        "containers": [{"name": "sidecar", "image": "side:1"}]}}}});
    let both = api
        .patch("web", &PatchParams::apply("injector"), &Patch::Apply(sidecar))
        .await
        .unwrap();
    let names: Vec<String> = both
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["app", "sidecar"], "containers merge by name");
    let err = api.patch("web", &PatchParams::apply("hpa"), &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 5}}))).await.unwrap_err();
    assert_eq!(code(&err), 409);
    assert_eq!(
        message(&err),
        "Apply failed with 1 conflict: conflict with \"team\" using apps/v1: .spec.replicas"
    );
    let forced = api
        .patch("web", &PatchParams::apply("hpa").force(), &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 5}})))
        .await
        .unwrap();
    assert_eq!(forced.spec.as_ref().unwrap().replicas, Some(5));
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["team", "injector", "hpa"]);
    // The team stops applying its replicas: the hpa owns them now, so they stay.
    let mut without = deploy(2, "app:2");
    without["spec"].as_object_mut().unwrap().remove("replicas");
    let after = api
        .patch("web", &PatchParams::apply("team"), &Patch::Apply(without))
        .await
        .unwrap();
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(5));
    // Applying the same configuration again changes nothing, not even the resourceVersion.
    let again = api.patch("web", &PatchParams::apply("hpa").force(), &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 5}}))).await.unwrap();
    assert_eq!(again.metadata.resource_version, after.metadata.resource_version);
}

#[tokio::test]
async fn strategic_merge_and_json_patches_edit_deployments_like_kubectl() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("patch").await.unwrap();
    ns.apply_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - {name: app, image: app:1}\n      - {name: side, image: side:1}\n",
    )
    .await
    .unwrap();
    let api: Api<Deployment> = ns.api();
    let pp = PatchParams::default();
    let smp = json!({"spec": {"template": {"spec": {"containers": [{"name": "side", "image": "side:2"}]}}}});
    let d = api.patch("web", &pp, &Patch::Strategic(smp)).await.unwrap();
    let images: Vec<Option<String>> = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.image.clone())
        .collect();
    assert_eq!(images, [Some("app:1".into()), Some("side:2".into())]);
    assert_eq!(
        d.spec.as_ref().unwrap().replicas,
        Some(1),
        "replicas defaults to 1"
    );
    let jp: json_patch::Patch = serde_json::from_value(json!([{"op": "test", "path": "/spec/replicas", "value": 1}, {"op": "replace", "path": "/spec/replicas", "value": 3}])).unwrap();
    let d = api.patch("web", &pp, &Patch::Json::<()>(jp)).await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(3));
    assert_eq!(d.metadata.generation, Some(3));
    let scale = api.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(3));
    let scaled = api
        .patch_scale("web", &pp, &Patch::Merge(json!({"spec": {"replicas": 0}})))
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(0));
    assert_eq!(api.get("web").await.unwrap().spec.unwrap().replicas, Some(0));
}

#[tokio::test]
async fn lists_page_with_limit_and_continue_and_filter_by_selectors() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("list").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    for i in 0..5 {
        let mut c = cm(&format!("c{i}"));
        c.metadata.labels = Some(
            [(
                "parity".to_string(),
                if i % 2 == 0 { "even" } else { "odd" }.to_string(),
            )]
            .into(),
        );
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert!(
        first
            .metadata
            .resource_version
            .as_deref()
            .is_some_and(|rv| !rv.is_empty())
    );
    let token = first.metadata.continue_.clone().unwrap();
    let rest = api
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    let names: Vec<String> = first
        .items
        .iter()
        .chain(rest.items.iter())
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(names, ["c0", "c1", "c2", "c3", "c4"]);
    assert!(rest.metadata.continue_.is_none());
    let odd = api
        .list(&ListParams::default().labels("parity=odd"))
        .await
        .unwrap();
    assert_eq!(odd.items.len(), 2);
    let one = api
        .list(&ListParams::default().fields("metadata.name=c3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let all: Api<ConfigMap> = Api::all(ns.client());
    let across = all
        .list(&ListParams::default().fields(&format!("metadata.namespace={}", ns.name())))
        .await
        .unwrap();
    assert_eq!(across.items.len(), 5);
}

#[tokio::test]
async fn deleting_a_namespace_removes_everything_in_it() {
    let env = Env::start().await.unwrap();
    let client = env.client();
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    nss.delete("doomed", &DeleteParams::default()).await.unwrap();
    wait_for("namespace gone", DEADLINE, || async {
        nss.get_opt("doomed").await.unwrap().is_none().then_some(())
    })
    .await
    .unwrap();
    let err = cms.create(&PostParams::default(), &cm("b")).await.unwrap_err();
    assert_eq!(code(&err), 404);
}

#[tokio::test]
async fn a_crd_becomes_established_and_its_removal_removes_its_resources() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("crd").await.unwrap();
    ns.apply_yaml(WIDGET_CRD).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client());
    let crd = crds.get("widgets.example.dev").await.unwrap();
    let established = crd
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);
    let api = widgets(ns.client(), ns.name());
    api.create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await
        .unwrap();
    let discovered = kube::discovery::Discovery::new(ns.client())
        .filter(&["example.dev"])
        .run()
        .await
        .unwrap();
    assert!(discovered.groups().any(|g| g.name() == "example.dev"));
    crds.delete("widgets.example.dev", &DeleteParams::default())
        .await
        .unwrap();
    let err = api.get("w").await.unwrap_err();
    assert_eq!(code(&err), 404);
}

#[tokio::test]
async fn a_namespace_dump_lists_every_object_in_it() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("dump").await.unwrap();
    ns.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: one}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: two}\n")
        .await
        .unwrap();
    let dump = ns.dump();
    assert!(
        dump.contains("kind: ConfigMap") && dump.contains("name: one"),
        "{dump}"
    );
    assert!(
        dump.contains("kind: Secret") && dump.contains("name: two"),
        "{dump}"
    );
}

#[tokio::test]
async fn timestamps_come_from_the_injected_clock() {
    let fixed = chrono::DateTime::parse_from_rfc3339("2030-05-06T07:08:09Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let env = Env::in_memory(Options {
        clock: std::sync::Arc::new(move || fixed),
        ..Options::default()
    })
    .await
    .unwrap();
    let ns = env.namespace("clock").await.unwrap();
    let created = ns
        .api::<ConfigMap>()
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.creation_timestamp.unwrap().0.to_string(),
        "2030-05-06T07:08:09Z"
    );
}

#[tokio::test]
async fn status_is_written_with_server_side_apply_as_controllers_do() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("status-ssa").await.unwrap();
    ns.apply_yaml(WIDGET_CRD).await.unwrap();
    let api = widgets(ns.client(), ns.name());
    api.create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await
        .unwrap();
    let status = json!({"apiVersion": "example.dev/v1", "kind": "Widget", "status": {"ready": true}, "spec": {"size": 9}});
    let pp = PatchParams::apply("widget-controller").force();
    let after = api.patch_status("w", &pp, &Patch::Apply(&status)).await.unwrap();
    assert_eq!(
        (
            after.data["status"]["ready"].clone(),
            after.data["spec"]["size"].clone()
        ),
        (json!(true), json!(1))
    );
    let entry = after
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("widget-controller"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    let again = api.patch_status("w", &pp, &Patch::Apply(&status)).await.unwrap();
    assert_eq!(
        again.metadata.resource_version, after.metadata.resource_version,
        "an unchanged status is not rewritten"
    );
    let err = api
        .patch_status("missing", &pp, &Patch::Apply(&status))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 404);
}

#[tokio::test]
async fn new_pods_are_pending_and_services_get_a_cluster_ip() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("defaults").await.unwrap();
    ns.apply_yaml(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: app, image: app:1, ports: [{containerPort: 80}]}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n",
    )
    .await
    .unwrap();
    let pod = ns
        .api::<k8s_openapi::api::core::v1::Pod>()
        .get("p")
        .await
        .unwrap();
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));
    let port = &pod.spec.unwrap().containers[0].ports.clone().unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
    let svc = ns
        .api::<k8s_openapi::api::core::v1::Service>()
        .get("s")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(svc.type_.as_deref(), Some("ClusterIP"));
    assert!(svc.cluster_ip.unwrap().starts_with("10.96."));
}
