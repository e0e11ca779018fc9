//! What every write shares: the retry loop with optimistic concurrency, mutating admission, validation,
//! and the server-side rules applied to the object each verb ([`super::create`], [`super::update`],
//! [`super::patch`], [`super::apply`]) asks for.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use super::{apply, checks, create, defaults, patch, update};
use crate::error::ApiError;
use crate::fieldset::{self, Writer};
use crate::registry::{ResourceType, present};
use crate::request::Req;
use crate::response::{Body, json_response, object_response};
use crate::shape::Shape;
use crate::state::State;
use crate::store::{Store, ns_name};
use crate::target::Target;
use crate::validation::{self, FieldValidation};

/// A write request.
pub enum Mutation {
    /// POST.
    Create(Value),
    /// PUT.
    Replace(Value),
    /// `application/json-patch+json`.
    JsonPatch(Value),
    /// `application/merge-patch+json`.
    MergePatch(Value),
    /// `application/strategic-merge-patch+json`.
    StrategicPatch(Value),
    /// `application/apply-patch+yaml`.
    Apply(Value),
}

/// The outcome of computing a write, before admission and commit.
struct Planned {
    old: Option<Value>,
    new: Value,
    unchanged: bool,
    warnings: Vec<String>,
}

const MAX_ATTEMPTS: usize = 8;

/// Serves a create, update, patch or apply: plans it against the current object, runs mutating admission
/// and validation, and commits unless the object changed meanwhile (then plans again).
pub async fn write(
    state: &Arc<State>,
    t: &Target,
    req: &Req,
    mutation: Mutation,
) -> Result<Response<Body>, ApiError> {
    let dry_run = req.q("dryRun").is_some();
    for _ in 0..MAX_ATTEMPTS {
        let planned = {
            let store = state.store();
            plan(&store, t, req, &mutation)?
        };
        if planned.unchanged {
            let old = planned.old.expect("only updates are unchanged");
            return Ok(object_response(&t.rt, old, 200, &planned.warnings));
        }
        let operation = if planned.old.is_some() { "UPDATE" } else { "CREATE" };
        let new = if t.sub.is_none() {
            crate::admission::mutate(state, operation, t, planned.old.as_ref(), planned.new).await?
        } else {
            planned.new
        };
        // Validation follows mutating admission, as in kube-apiserver.
        if !t.rt.custom && t.sub.is_none() {
            let causes = validation::builtin::check(&t.rt, &new);
            if !causes.is_empty() {
                return Err(ApiError::invalid(&t.rt, &ns_name(&new).1, causes));
            }
        }
        let mut store = state.store();
        let current = store.get(&t.rt.key(), t.ns(), &ns_name(&new).1).cloned();
        let current_rv = current.as_ref().map(|c| c["metadata"]["resourceVersion"].clone());
        let planned_rv = planned
            .old
            .as_ref()
            .map(|c| c["metadata"]["resourceVersion"].clone());
        if current_rv != planned_rv {
            if matches!(mutation, Mutation::Create(_)) {
                return Err(ApiError::already_exists(&t.rt, &ns_name(&new).1));
            }
            continue;
        }
        if planned.old.is_none() {
            ensure_namespace_open(&store, &t.rt, t.ns())?;
        }
        if dry_run {
            return Ok(object_response(
                &t.rt,
                new,
                if planned.old.is_some() { 200 } else { 201 },
                &planned.warnings,
            ));
        }
        let stored = store.put_or_finish(&t.rt.key(), new);
        drop(store);
        let code = if planned.old.is_some() { 200 } else { 201 };
        if t.sub.as_deref() == Some("scale") {
            return Ok(json_response(code, &crate::scale::to_scale(&t.rt, &stored)));
        }
        return Ok(object_response(&t.rt, stored, code, &planned.warnings));
    }
    Err(ApiError::stale(&t.rt, t.name()))
}

fn ensure_namespace_open(store: &Store, rt: &ResourceType, namespace: &str) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    let ns_rt = store
        .registry
        .find("", "v1", "namespaces")
        .expect("namespaces are built in");
    match store.get(&ns_rt.key(), "", namespace) {
        None => Err(ApiError::not_found(&ns_rt, namespace)),
        Some(ns) if !ns["metadata"]["deletionTimestamp"].is_null() => Err(ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
            crate::error::qualified(rt),
            "",
        ))),
        Some(_) => Ok(()),
    }
}

/// The object a write would store, before admission.
fn plan(store: &Store, t: &Target, req: &Req, mutation: &Mutation) -> Result<Planned, ApiError> {
    let rt = &t.rt;
    let shape = Shape::of(rt);
    let fv = FieldValidation::parse(req.q("fieldValidation"));
    let manager = req.manager();
    let now = store.now();
    let sub = t.sub.clone().unwrap_or_default();
    let writer = Writer {
        manager: &manager,
        api_version: &rt.api_version(),
        subresource: &sub,
        time: &now,
    };
    let existing = t
        .name
        .as_ref()
        .and_then(|n| store.get(&rt.key(), t.ns(), n))
        .cloned()
        .map(|o| present(rt, o));
    let missing = || ApiError::not_found(rt, t.name());

    // 1. The object as the client wants it, before server-side rules.
    let (old, mut new) = match mutation {
        Mutation::Create(body) => (None, create::desired(store, t, body)?),
        Mutation::Replace(body) => {
            let old = existing.ok_or_else(missing)?;
            let new = update::desired(t, &old, body)?;
            (Some(old), new)
        }
        Mutation::JsonPatch(p) => {
            let old = existing.ok_or_else(missing)?;
            let new = patch::json(t, &old, p)?;
            (Some(old), new)
        }
        Mutation::MergePatch(p) => {
            let old = existing.ok_or_else(missing)?;
            let new = patch::merge(t, &old, p)?;
            (Some(old), new)
        }
        Mutation::StrategicPatch(p) => {
            let old = existing.ok_or_else(missing)?;
            let new = patch::strategic(t, &old, p, &shape)?;
            (Some(old), new)
        }
        Mutation::Apply(body) => {
            let new = apply::desired(t, existing.as_ref(), body, &writer, req.flag("force"), &shape)?;
            (existing, new)
        }
    };

    // 2. Server-side rules: identity, subresource split, generation, defaults, ownership, validation.
    defaults::builtin(rt, &mut new, true);
    match &old {
        None => on_create(rt, &mut new, &now)?,
        Some(old) => new = on_update(t, old, new)?,
    }
    if !matches!(mutation, Mutation::Apply(_)) {
        // Apply records its own ownership; every other write is an update by its manager.
        if let Some(m) = new["metadata"].as_object_mut()
            && old.is_none()
        {
            m.remove("managedFields");
        }
        if let Some(old) = &old {
            new["metadata"]["managedFields"] = old["metadata"]["managedFields"].clone();
        }
        fieldset::record_update(old.as_ref(), &mut new, &writer, &shape, rt.status);
    }
    let mut warnings = vec![];
    if rt.custom && t.sub.as_deref() != Some("status") {
        warnings = validation::custom_resource(rt, &mut new, old.as_ref(), fv)?;
    } else if rt.custom {
        validation::custom_resource(rt, &mut new, old.as_ref(), FieldValidation::Ignore)?;
    }
    by_kind(rt, &mut new, &now)?;
    let unchanged = old
        .as_ref()
        .is_some_and(|o| without_times(o) == without_times(&new));
    Ok(Planned {
        old,
        new,
        unchanged,
        warnings,
    })
}

/// A new object's identity: uid, creation time, first generation; no status for custom resources.
fn on_create(rt: &ResourceType, new: &mut Value, now: &str) -> Result<(), ApiError> {
    let m = &mut new["metadata"];
    m["uid"] = json!(crate::store::new_uid());
    m["creationTimestamp"] = json!(now);
    if let Some(obj) = m.as_object_mut() {
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            obj.remove(k);
        }
    }
    if rt.generation {
        new["metadata"]["generation"] = json!(1);
    } else if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("generation");
    }
    if rt.status
        && rt.custom
        && let Some(o) = new.as_object_mut()
    {
        o.remove("status");
    }
    checks::validate_name(rt, new)
}

/// An update keeps the stored identity, adds no finalizer once deletion began, writes only the status
/// through `/status` and never the status otherwise, and bumps the generation when the spec changed.
fn on_update(t: &Target, old: &Value, mut new: Value) -> Result<Value, ApiError> {
    let rt = &t.rt;
    if ns_name(&new).1 != ns_name(old).1 {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "generation",
        "name",
    ] {
        match old["metadata"].get(k) {
            Some(v) => new["metadata"][k] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(k);
                }
            }
        }
    }
    if !old["metadata"]["deletionTimestamp"].is_null() {
        // Finalizers may only be removed once deletion started.
        let before: Vec<Value> = old["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let after: Vec<Value> = new["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if after.iter().any(|f| !before.contains(f)) {
            return Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: no new finalizers can be added if the object is being deleted",
                crate::error::qualified(rt),
                t.name()
            )));
        }
    }
    match t.sub.as_deref() {
        Some("status") => {
            let mut keep = old.clone();
            keep["status"] = new.get("status").cloned().unwrap_or(Value::Null);
            if keep["status"].is_null()
                && let Some(o) = keep.as_object_mut()
            {
                o.remove("status");
            }
            keep["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
            new = keep;
        }
        Some("scale") => {}
        _ if rt.status => match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        },
        _ => {}
    }
    if rt.generation && spec_of(old) != spec_of(&new) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0);
        new["metadata"]["generation"] = json!(g + 1);
    }
    Ok(new)
}

/// What kube-apiserver does for particular kinds: a CRD is checked and accepted, a Namespace labelled
/// with its name, Active, with the `kubernetes` finalizer.
fn by_kind(rt: &ResourceType, new: &mut Value, now: &str) -> Result<(), ApiError> {
    if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
        crate::crd::validate(rt, new)?;
        new["status"] = crate::crd::accepted_status(new, now);
    }
    if rt.plural == "namespaces" && rt.group.is_empty() {
        let name = ns_name(new).1;
        new["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        if new["status"]["phase"].is_null() {
            new["status"]["phase"] = json!("Active");
        }
        if new["spec"]["finalizers"].is_null() {
            new["spec"]["finalizers"] = json!(["kubernetes"]);
        }
    }
    Ok(())
}

fn without_times(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(list) = v["metadata"]["managedFields"].as_array_mut() {
        for e in list {
            if let Some(o) = e.as_object_mut() {
                o.remove("time");
            }
        }
    }
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    v
}

fn spec_of(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
        o.remove("apiVersion");
        o.remove("kind");
    }
    v
}
