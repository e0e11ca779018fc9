//! kube-runtime against the in-memory server: the watcher (list+watch and streaming lists), recovery
//! from an expired watch (410 Gone, relist), bookmarks, watch timeouts, and a Controller that owns
//! children.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sluice_e2e::{Env, Options, wait_for};

const DEADLINE: Duration = Duration::from_secs(5);

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": value}})).unwrap()
}

/// Next item of a stream, failing the test after the deadline.
async fn next<S: futures::Stream + Unpin>(s: &mut S) -> S::Item {
    tokio::time::timeout(DEADLINE, s.next())
        .await
        .expect("stream item before the deadline")
        .expect("stream ended")
}

#[tokio::test]
async fn the_watcher_lists_then_sees_creates_updates_and_deletes() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("watcher").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    api.create(&PostParams::default(), &cm("before", "1"))
        .await
        .unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Init));
    assert!(
        matches!(next(&mut events).await.unwrap(), watcher::Event::InitApply(c) if c.name_any() == "before")
    );
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitDone
    ));
    api.create(&PostParams::default(), &cm("after", "1"))
        .await
        .unwrap();
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Apply(c) if c.name_any() == "after"));
    api.patch(
        "after",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    match next(&mut events).await.unwrap() {
        watcher::Event::Apply(c) => assert_eq!(c.data.unwrap()["k"], "2"),
        other => panic!("expected the update, got {other:?}"),
    }
    api.delete("after", &DeleteParams::default()).await.unwrap();
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Delete(c) if c.name_any() == "after"));
}

#[tokio::test]
async fn the_watcher_with_streaming_lists_completes_its_initial_list() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("streaming").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &cm(name, "1")).await.unwrap();
    }
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Init));
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::InitApply(c) if c.name_any() == "a"));
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::InitApply(c) if c.name_any() == "b"));
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitDone
    ));
    api.create(&PostParams::default(), &cm("c", "1")).await.unwrap();
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Apply(c) if c.name_any() == "c"));
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_gets_410_gone() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("gone").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let old = api
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    env.server().unwrap().compact();
    let mut stream = api.watch(&WatchParams::default(), &old).await.unwrap().boxed();
    match next(&mut stream).await.unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn an_expired_watch_makes_the_watcher_relist() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("relist").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    api.create(&PostParams::default(), &cm("a", "1")).await.unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    for _ in 0..3 {
        next(&mut events).await.unwrap(); // Init, InitApply(a), InitDone
    }
    // The watch ends and history is gone: resuming from the last version seen gets 410.
    env.server().unwrap().compact();
    match next(&mut events).await {
        Err(watcher::Error::WatchError(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 watch error, got {other:?}"),
    }
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Init));
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::InitApply(c) if c.name_any() == "a"));
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitDone
    ));
    api.create(&PostParams::default(), &cm("b", "1")).await.unwrap();
    assert!(matches!(next(&mut events).await.unwrap(), watcher::Event::Apply(c) if c.name_any() == "b"));
}

#[tokio::test]
async fn watches_get_bookmarks_when_allowed_and_end_at_their_timeout() {
    let options = Options {
        bookmark_interval: Duration::from_millis(50),
        ..Options::default()
    };
    let env = Env::in_memory(options).await.unwrap();
    let ns = env.namespace("bookmarks").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let rv = api
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await.unwrap() {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    let rest: Vec<_> = tokio::time::timeout(DEADLINE, stream.try_collect::<Vec<_>>())
        .await
        .expect("the watch ends at its timeout")
        .unwrap();
    assert!(rest.iter().all(|e| matches!(e, WatchEvent::Bookmark(_))));
}

/// A test custom resource whose controller keeps one ConfigMap per object.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(group = "example.dev", version = "v1", kind = "Gadget", namespaced)]
pub struct GadgetSpec {
    /// Copied into the child ConfigMap.
    pub size: i64,
}

async fn reconcile(g: Arc<Gadget>, client: Arc<kube::Client>) -> Result<Action, kube::Error> {
    let ns = g.namespace().unwrap();
    let child = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{}-child", g.name_any()), "ownerReferences": [g.controller_owner_ref(&()).unwrap()]},
        "data": {"size": g.spec.size.to_string()},
    });
    let api: Api<ConfigMap> = Api::namespaced((*client).clone(), &ns);
    api.patch(
        &format!("{}-child", g.name_any()),
        &PatchParams::apply("gadget-controller").force(),
        &Patch::Apply(child),
    )
    .await?;
    Ok(Action::await_change())
}

#[tokio::test]
async fn a_controller_that_owns_config_maps_reconciles_its_children() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("controller").await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    crds.create(&PostParams::default(), &Gadget::crd()).await.unwrap();
    let gadgets: Api<Gadget> = ns.api();
    let cms: Api<ConfigMap> = ns.api();
    let client = Arc::new(env.client());
    let controller = Controller::new(gadgets.clone(), watcher::Config::default())
        .owns(cms.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            client,
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);

    gadgets
        .create(&PostParams::default(), &Gadget::new("g", GadgetSpec { size: 1 }))
        .await
        .unwrap();
    let size = |want: &'static str| {
        let cms = cms.clone();
        move || {
            let cms = cms.clone();
            async move {
                cms.get_opt("g-child")
                    .await
                    .ok()
                    .flatten()
                    .filter(|c| c.data.as_ref().is_some_and(|d| d["size"] == want))
            }
        }
    };
    wait_for("child created", DEADLINE, size("1")).await.unwrap();
    cms.delete("g-child", &DeleteParams::default()).await.unwrap();
    wait_for("deleted child recreated", DEADLINE, size("1"))
        .await
        .unwrap();
    gadgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    wait_for("child updated", DEADLINE, size("2")).await.unwrap();
    gadgets.delete("g", &DeleteParams::default()).await.unwrap();
    wait_for("child collected with its owner", DEADLINE, || async {
        cms.get_opt("g-child").await.unwrap().is_none().then_some(())
    })
    .await
    .unwrap();
    controller.abort();
}

#[tokio::test]
async fn a_labelled_watch_sees_objects_enter_and_leave_its_selection() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("selection").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let rv = api
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let mut stream = api
        .watch(
            &WatchParams::default().labels("team=blue").disable_bookmarks(),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let label = |v: Option<&str>| Patch::Merge(json!({"metadata": {"labels": {"team": v}}}));
    api.patch("a", &PatchParams::default(), &label(Some("blue")))
        .await
        .unwrap();
    assert!(matches!(next(&mut stream).await.unwrap(), WatchEvent::Added(c) if c.name_any() == "a"));
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        WatchEvent::Modified(_)
    ));
    api.patch("a", &PatchParams::default(), &label(None))
        .await
        .unwrap();
    assert!(matches!(next(&mut stream).await.unwrap(), WatchEvent::Deleted(c) if c.name_any() == "a"));
}

#[tokio::test]
async fn the_event_recorder_publishes_and_updates_event_series() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let env = Env::start().await.unwrap();
    let ns = env.namespace("events").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let target = api
        .create(&PostParams::default(), &cm("target", "1"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        env.client(),
        Reporter {
            controller: "sluice-operator".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Rendered".into(),
        note: Some("config rendered".into()),
        action: "Render".into(),
        secondary: None,
    };
    let reference = target.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<K8sEvent> = ns.api();
    let list = events.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "the second publish updates the series");
    let e = &list.items[0];
    assert_eq!(
        (
            e.reason.as_deref(),
            e.regarding.as_ref().and_then(|r| r.name.as_deref())
        ),
        (Some("Rendered"), Some("target"))
    );
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
}
