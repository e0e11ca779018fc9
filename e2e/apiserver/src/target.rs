//! [`Target`]: the type, namespace, object and subresource a resource path names.

use std::sync::Arc;

use crate::error::ApiError;
use crate::registry::ResourceType;
use crate::store::Store;

/// What a resource path names.
pub struct Target {
    /// The type.
    pub rt: Arc<ResourceType>,
    /// Namespace from the path (None: cluster-scoped, or all namespaces).
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// Subresource.
    pub sub: Option<String>,
}

impl Target {
    /// The namespace, "" when there is none.
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    /// The object name, "" when there is none.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

/// The type, namespace, name and subresource a path under `/api/v1` or `/apis/{group}/{version}` names.
pub fn parse(
    store: &Store,
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Target, ApiError> {
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !matches!(*plural, "status" | "finalize") || !tail.is_empty() =>
        {
            (Some(ns.to_string()), [&[*plural][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return Err(ApiError::no_route(path)),
    };
    let rt = store
        .registry
        .find(group, version, plural)
        .ok_or_else(|| ApiError::no_route(path))?;
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::no_route(path));
    }
    if namespace.is_none() && rt.namespaced && name.is_some() {
        return Err(ApiError::no_route(path));
    }
    if let Some(s) = &sub {
        let ok = match s.as_str() {
            "status" => rt.status,
            "scale" => rt.scale.is_some(),
            "finalize" => rt.plural == "namespaces",
            _ => false,
        };
        if !ok {
            return Err(ApiError::no_route(path));
        }
    }
    Ok(Target {
        rt,
        namespace,
        name,
        sub,
    })
}
