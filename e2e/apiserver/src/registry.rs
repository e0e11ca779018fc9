//! The resource types the server knows: built-ins registered at start, custom resources added when their
//! CRD is created. Discovery, routing, tables and OpenAPI all read from here.

use std::sync::Arc;

use serde_json::{Value, json};

/// Where a storage bucket lives: objects are stored once per (group, plural), whatever version asked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResKey {
    /// API group, empty for core.
    pub group: String,
    /// Plural resource name.
    pub plural: String,
}

/// The `/scale` subresource paths of a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    /// `.spec.replicas`.
    pub spec_replicas: String,
    /// `.status.replicas`.
    pub status_replicas: String,
    /// `.status.selector`, if any.
    pub label_selector: Option<String>,
}

/// A column `kubectl get` prints (CRD `additionalPrinterColumns`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Header.
    pub name: String,
    /// `string`, `integer`, `date`, ...
    pub type_: String,
    /// JSONPath-like `.spec.x`.
    pub json_path: String,
    /// Column description.
    pub description: String,
    /// Priority (0 shown by default).
    pub priority: i64,
}

/// One served (group, version, resource).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group, empty for core.
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// Singular resource name.
    pub singular: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// `kubectl` short names.
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether `/status` is a separate subresource.
    pub status: bool,
    /// The `/scale` subresource, if any.
    pub scale: Option<ScalePaths>,
    /// `openAPIV3Schema` of a custom resource.
    pub schema: Option<Value>,
    /// Extra `kubectl get` columns.
    pub printer_columns: Vec<PrinterColumn>,
    /// Whether `metadata.generation` is kept.
    pub generation: bool,
    /// Whether this came from a CRD (merge patches only, schema validation).
    pub custom: bool,
    /// Whether this is the storage version of its resource.
    pub storage: bool,
}

impl ResourceType {
    /// `apps/v1`, `v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage bucket.
    pub fn key(&self) -> ResKey {
        ResKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// `/api/v1` or `/apis/{group}/{version}`.
    pub fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// A built-in type with the common defaults.
    pub fn builtin(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            namespaced,
            short_names: vec![],
            categories: vec![],
            status: false,
            scale: None,
            schema: None,
            printer_columns: vec![],
            generation: false,
            custom: false,
            storage: true,
        }
    }
}

/// All types the server serves.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
}

impl Registry {
    /// A registry holding `types` (at start, the built-in kinds).
    pub fn new(types: Vec<ResourceType>) -> Self {
        Registry {
            types: types.into_iter().map(Arc::new).collect(),
        }
    }

    /// Adds or replaces a type (by group, version, plural).
    pub fn upsert(&mut self, rt: ResourceType) {
        self.types
            .retain(|t| !(t.group == rt.group && t.version == rt.version && t.plural == rt.plural));
        self.types.push(Arc::new(rt));
    }

    /// Removes every version of a resource.
    pub fn remove(&mut self, key: &ResKey) {
        self.types
            .retain(|t| !(t.group == key.group && t.plural == key.plural));
    }

    /// Every type, in registration order.
    pub fn all(&self) -> &[Arc<ResourceType>] {
        &self.types
    }

    /// Looks up by group, version and plural.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// Looks up by `apiVersion` and `kind`.
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        let (group, version) = split_api_version(api_version);
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
            .cloned()
    }

    /// The storage version of a resource.
    pub fn storage(&self, key: &ResKey) -> Option<Arc<ResourceType>> {
        let mut versions = self
            .types
            .iter()
            .filter(|t| t.group == key.group && t.plural == key.plural);
        let first = versions.clone().next().cloned();
        versions.find(|t| t.storage).cloned().or(first)
    }

    /// Groups in registration order, core ("") excluded, each with its versions in order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = vec![];
        for t in self.types.iter().filter(|t| !t.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, vs)) => {
                    if !vs.contains(&t.version) {
                        vs.push(t.version.clone())
                    }
                }
                None => out.push((t.group.clone(), vec![t.version.clone()])),
            }
        }
        for (_, vs) in &mut out {
            vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        out
    }
}

/// Sets `apiVersion`/`kind` to the version that was asked for.
pub fn present(rt: &ResourceType, mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(rt.api_version()));
        m.insert("kind".into(), json!(rt.kind));
    }
    obj
}

/// `apps/v1` -> (`apps`, `v1`); `v1` -> (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Kubernetes version ordering: GA > beta > alpha, then by number.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (level, minor) = if let Some(b) = tail.strip_prefix("beta") {
        (1, b.parse().unwrap_or(0))
    } else if let Some(a) = tail.strip_prefix("alpha") {
        (0, a.parse().unwrap_or(0))
    } else if tail.is_empty() {
        (2, 0)
    } else {
        (0, 0)
    };
    (level, major, minor)
}
