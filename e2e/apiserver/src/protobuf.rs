//! Kubernetes' protobuf encoding of built-in kinds, read as JSON. Typed client-go clients send it:
//! `kubectl create configmap|secret|namespace|deployment|service|serviceaccount …` POSTs protobuf and does
//! not fall back to JSON when refused, so the server decodes it as kube-apiserver would.
//!
//! The schemas are upstream's `generated.proto` files (k8s.io/api and k8s.io/apimachinery, comments left
//! out; `e2e/apiserver/proto/update.sh` refreshes them). A body is the 4-byte magic `k8s\0` and a `runtime.Unknown`
//! whose `typeMeta` names the kind and whose `raw` is the object.
//!
//! What kube-apiserver then stores is the Go struct as JSON: fields at their zero value are left out
//! (`omitempty`), except the pointer fields in [`KEEP_ZERO`] where zero means something else than unset
//! (`replicas: 0`, `allowPrivilegeEscalation: false`); nested objects stay, even empty (`status: {}`).

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

/// The content type of Kubernetes' protobuf encoding.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// Optional pointer fields whose zero value (`0`, `false`, `""`) is kept: in Go they are pointers, and
/// zero there is a choice (`replicas: 0`, `runAsUser: 0`), not an absent field.
pub const KEEP_ZERO: &[&str] = &[
    "activeDeadlineSeconds",
    "allowPrivilegeEscalation",
    "automountServiceAccountToken",
    "defaultMode",
    "enableServiceLinks",
    "fsGroup",
    "hostUsers",
    "immutable",
    "minReplicas",
    "mode",
    "optional",
    "privileged",
    "progressDeadlineSeconds",
    "readOnlyRootFilesystem",
    "replicas",
    "revisionHistoryLimit",
    "runAsGroup",
    "runAsNonRoot",
    "runAsUser",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "terminationGracePeriodSeconds",
];

const FILES: &[&str] = &[
    include_str!("../proto/k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto"),
    include_str!("../proto/k8s.io/apimachinery/pkg/runtime/generated.proto"),
    include_str!("../proto/k8s.io/apimachinery/pkg/runtime/schema/generated.proto"),
    include_str!("../proto/k8s.io/apimachinery/pkg/util/intstr/generated.proto"),
    include_str!("../proto/k8s.io/apimachinery/pkg/api/resource/generated.proto"),
    include_str!("../proto/k8s.io/api/core/v1/generated.proto"),
    include_str!("../proto/k8s.io/api/apps/v1/generated.proto"),
    include_str!("../proto/k8s.io/api/autoscaling/v2/generated.proto"),
    include_str!("../proto/k8s.io/api/coordination/v1/generated.proto"),
    include_str!("../proto/k8s.io/api/events/v1/generated.proto"),
    include_str!("../proto/k8s.io/api/admissionregistration/v1/generated.proto"),
];

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scalar {
    String,
    Bytes,
    Bool,
    Int32,
    Int64,
}

impl Scalar {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "string" => Scalar::String,
            "bytes" => Scalar::Bytes,
            "bool" => Scalar::Bool,
            "int32" => Scalar::Int32,
            "int64" => Scalar::Int64,
            _ => return None,
        })
    }

    fn zero(self) -> Value {
        match self {
            Scalar::String | Scalar::Bytes => json!(""),
            Scalar::Bool => json!(false),
            Scalar::Int32 | Scalar::Int64 => json!(0),
        }
    }
}

#[derive(Clone, Debug)]
enum Type {
    Scalar(Scalar),
    /// A message, by full name (no leading dot).
    Message(String),
}

#[derive(Clone, Debug)]
enum Shape {
    Single(Type),
    Repeated(Type),
    /// `map<string, V>`: repeated entries `{1: key, 2: value}`.
    Map(Type),
}

#[derive(Clone, Debug)]
struct Field {
    name: String,
    shape: Shape,
}

/// Every message of the vendored schemas: full name → field number → field.
struct Schema {
    messages: HashMap<String, HashMap<u64, Field>>,
}

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema::parse(FILES).expect("the vendored protobuf schemas parse"))
}

impl Schema {
    /// Reads the subset of proto2 that `generated.proto` files use: one package per file, top-level
    /// messages of `optional`/`repeated` fields and `map<string, V>` fields, one per line.
    fn parse(files: &[&str]) -> Result<Schema, String> {
        let mut messages = HashMap::new();
        for file in files {
            let mut package = String::new();
            let mut current: Option<(String, HashMap<u64, Field>)> = None;
            let mut in_header = false;
            for line in file.lines().map(str::trim) {
                if line.starts_with("/*") {
                    in_header = true;
                }
                if in_header {
                    in_header = !line.ends_with("*/");
                    continue;
                }
                if line.is_empty() || line.starts_with("//") {
                    continue;
                }
                if let Some(p) = line.strip_prefix("package ") {
                    package = p.trim_end_matches(';').to_string();
                } else if let Some(m) = line.strip_prefix("message ") {
                    let name = m.trim_end_matches('{').trim();
                    current = Some((format!("{package}.{name}"), HashMap::new()));
                } else if line == "}" {
                    let (name, fields) = current.take().ok_or("a `}` outside a message")?;
                    messages.insert(name, fields);
                } else if let Some((_, fields)) = current.as_mut() {
                    let (number, field) = parse_field(line, &package)?;
                    fields.insert(number, field);
                } else if !["syntax ", "import ", "option "]
                    .iter()
                    .any(|p| line.starts_with(p))
                {
                    return Err(format!("unexpected line {line:?}"));
                }
            }
        }
        Ok(Schema { messages })
    }
}

fn resolve(t: &str, package: &str) -> Type {
    match Scalar::parse(t) {
        Some(s) => Type::Scalar(s),
        None => match t.strip_prefix('.') {
            Some(full) => Type::Message(full.to_string()),
            None => Type::Message(format!("{package}.{t}")),
        },
    }
}

/// `optional T name = N;`, `repeated T name = N;` or `map<string, V> name = N;`.
fn parse_field(line: &str, package: &str) -> Result<(u64, Field), String> {
    let bad = || format!("unexpected field {line:?}");
    let (decl, number) = line.trim_end_matches(';').split_once('=').ok_or_else(bad)?;
    let number: u64 = number.trim().parse().map_err(|_| bad())?;
    let decl = decl.trim();
    let (shape, name) = if let Some(rest) = decl.strip_prefix("map<") {
        let (types, name) = rest.split_once('>').ok_or_else(bad)?;
        let (key, value) = types.split_once(',').ok_or_else(bad)?;
        if key.trim() != "string" {
            return Err(bad());
        }
        (Shape::Map(resolve(value.trim(), package)), name.trim())
    } else {
        let mut words = decl.split_whitespace();
        let (label, t, name) = (words.next(), words.next(), words.next());
        let (Some(label), Some(t), Some(name), None) = (label, t, name, words.next()) else {
            return Err(bad());
        };
        let t = resolve(t, package);
        match label {
            "optional" => (Shape::Single(t), name),
            "repeated" => (Shape::Repeated(t), name),
            _ => return Err(bad()),
        }
    };
    Ok((
        number,
        Field {
            name: name.to_string(),
            shape,
        },
    ))
}

/// Protobuf wire format, read forward.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err("truncated field".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn delimited(&mut self) -> Result<&'a [u8], String> {
        let n = usize::try_from(self.varint()?).map_err(|_| "length out of range")?;
        self.take(n)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.delimited().map(drop),
            5 => self.take(4).map(drop),
            w => Err(format!("unsupported wire type {w}")),
        }
    }
}

fn scalar(s: Scalar, wire: u64, r: &mut Reader<'_>) -> Result<Value, String> {
    Ok(match (s, wire) {
        (Scalar::String, 2) => {
            let b = r.delimited()?;
            json!(std::str::from_utf8(b).map_err(|_| "a string field is not UTF-8")?)
        }
        (Scalar::Bytes, 2) => json!(STANDARD.encode(r.delimited()?)),
        (Scalar::Bool, 0) => json!(r.varint()? != 0),
        // Negative int32s are sign-extended to 64 bits on the wire.
        (Scalar::Int32, 0) => json!(r.varint()? as i64 as i32),
        (Scalar::Int64, 0) => json!(r.varint()? as i64),
        (s, w) => return Err(format!("wire type {w} for a {s:?} field")),
    })
}

/// One value of `t` (`wire` as on the wire).
fn value(schema: &Schema, t: &Type, wire: u64, r: &mut Reader<'_>) -> Result<Value, String> {
    match t {
        Type::Scalar(s) => scalar(*s, wire, r),
        Type::Message(name) if wire == 2 => message(schema, name, r.delimited()?),
        Type::Message(name) => Err(format!("wire type {wire} for a {name} field")),
    }
}

/// Repeated values: packed (one length-delimited run) for numbers and bools, or one at a time.
fn values(schema: &Schema, t: &Type, wire: u64, r: &mut Reader<'_>) -> Result<Vec<Value>, String> {
    if let Type::Scalar(s @ (Scalar::Bool | Scalar::Int32 | Scalar::Int64)) = t
        && wire == 2
    {
        let mut packed = Reader { buf: r.delimited()? };
        let mut out = vec![];
        while !packed.buf.is_empty() {
            out.push(scalar(*s, 0, &mut packed)?);
        }
        return Ok(out);
    }
    Ok(vec![value(schema, t, wire, r)?])
}

fn map_entry(schema: &Schema, t: &Type, bytes: &[u8]) -> Result<(String, Value), String> {
    let mut r = Reader { buf: bytes };
    let (mut key, mut val) = (String::new(), None);
    while !r.buf.is_empty() {
        let tag = r.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => {
                key = scalar(Scalar::String, 2, &mut r)?
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            }
            (2, wire) => val = Some(value(schema, t, wire, &mut r)?),
            (_, wire) => r.skip(wire)?,
        }
    }
    let val = match (val, t) {
        (Some(v), _) => v,
        (None, Type::Scalar(s)) => s.zero(),
        (None, Type::Message(name)) => message(schema, name, &[])?,
    };
    Ok((key, val))
}

/// One message as JSON.
fn message(schema: &Schema, name: &str, bytes: &[u8]) -> Result<Value, String> {
    let fields = schema
        .messages
        .get(name)
        .ok_or_else(|| format!("no protobuf schema for {name}"))?;
    let mut out = Map::new();
    let mut r = Reader { buf: bytes };
    while !r.buf.is_empty() {
        let tag = r.varint()?;
        let (number, wire) = (tag >> 3, tag & 7);
        let Some(field) = fields.get(&number) else {
            r.skip(wire)?;
            continue;
        };
        match &field.shape {
            Shape::Single(t) => {
                let v = value(schema, t, wire, &mut r)?;
                out.insert(field.name.clone(), v);
            }
            Shape::Repeated(t) => {
                let vs = values(schema, t, wire, &mut r)?;
                let list = out.entry(field.name.clone()).or_insert_with(|| json!([]));
                if let Some(list) = list.as_array_mut() {
                    list.extend(vs);
                }
            }
            Shape::Map(t) => {
                if wire != 2 {
                    return Err(format!("wire type {wire} for the map {}", field.name));
                }
                let (k, v) = map_entry(schema, t, r.delimited()?)?;
                let map = out.entry(field.name.clone()).or_insert_with(|| json!({}));
                if let Some(map) = map.as_object_mut() {
                    map.insert(k, v);
                }
            }
        }
    }
    Ok(as_json(name, out))
}

/// The JSON form of a decoded message: the types with a JSON form of their own, or the object without its
/// zero-valued scalars.
fn as_json(name: &str, mut m: Map<String, Value>) -> Value {
    let int = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_i64).unwrap_or(0);
    let string =
        |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let raw_json = |m: &Map<String, Value>, k: &str| {
        STANDARD
            .decode(string(m, k))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null)
    };
    match name.rsplit_once('.') {
        Some((META, "Time" | "MicroTime")) => {
            // Go writes its zero time as an empty message, and reads one back as the zero time (JSON null).
            if m.is_empty() {
                return Value::Null;
            }
            let (secs, nanos) = (int(&m, "seconds"), int(&m, "nanos"));
            let Some(t) = chrono::DateTime::from_timestamp(secs, nanos as u32) else {
                return Value::Null;
            };
            let format = if name.ends_with(".Time") {
                "%Y-%m-%dT%H:%M:%SZ"
            } else {
                "%Y-%m-%dT%H:%M:%S%.6fZ"
            };
            json!(t.format(format).to_string())
        }
        Some((META, "Duration")) => json!(go_duration(int(&m, "duration"))),
        Some((META, "Verbs")) => m.remove("items").unwrap_or_else(|| json!([])),
        Some((META, "FieldsV1")) => raw_json(&m, "Raw"),
        Some(("k8s.io.apimachinery.pkg.runtime", "RawExtension")) => raw_json(&m, "raw"),
        Some(("k8s.io.apimachinery.pkg.api.resource", "Quantity" | "QuantityValue")) => {
            json!(string(&m, "string"))
        }
        Some(("k8s.io.apimachinery.pkg.util.intstr", "IntOrString")) => {
            if int(&m, "type") == 1 {
                json!(string(&m, "strVal"))
            } else {
                json!(int(&m, "intVal"))
            }
        }
        _ => {
            m.retain(|k, v| match v {
                Value::Null => false,
                Value::String(s) if s.is_empty() => KEEP_ZERO.contains(&k.as_str()),
                Value::Bool(false) => KEEP_ZERO.contains(&k.as_str()),
                Value::Number(n) if n.as_i64() == Some(0) => KEEP_ZERO.contains(&k.as_str()),
                _ => true,
            });
            Value::Object(m)
        }
    }
}

/// A duration as Go's `time.Duration.String()` writes it (`1h2m3.5s`, `1.5ms`, `0s`).
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    let frac = |v: u64, unit: u64| {
        let whole = v / unit;
        let rest = v % unit;
        if rest == 0 {
            whole.to_string()
        } else {
            let digits = unit.to_string().len() - 1;
            let f = format!("{rest:0digits$}");
            format!("{whole}.{}", f.trim_end_matches('0'))
        }
    };
    if n < 1_000 {
        return format!("{sign}{n}ns");
    }
    if n < 1_000_000 {
        return format!("{sign}{}µs", frac(n, 1_000));
    }
    if n < 1_000_000_000 {
        return format!("{sign}{}ms", frac(n, 1_000_000));
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let s = frac(rest, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, m) => format!("{sign}{m}m{s}s"),
        (h, m) => format!("{sign}{h}h{m}m{s}s"),
    }
}

/// The protobuf message that encodes `kind` of `apiVersion`: in its group's package of k8s.io/api, or (for
/// options such as `DeleteOptions`) in meta/v1.
fn message_of(schema: &Schema, api_version: &str, kind: &str) -> Option<String> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let package = match group.split('.').next().unwrap_or_default() {
        "" => "core",
        g => g,
    };
    [
        format!("k8s.io.api.{package}.{version}.{kind}"),
        format!("{META}.{kind}"),
    ]
    .into_iter()
    .find(|m| schema.messages.contains_key(m))
}

/// A protobuf-encoded request body as the JSON object it stands for (`apiVersion` and `kind` included).
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let schema = schema();
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or("the body does not start with the Kubernetes protobuf magic number")?;
    let mut r = Reader { buf: envelope };
    let (mut type_meta, mut raw, mut encoding) = (Map::new(), &[][..], String::new());
    while !r.buf.is_empty() {
        let tag = r.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => {
                if let Value::Object(m) =
                    message(schema, "k8s.io.apimachinery.pkg.runtime.TypeMeta", r.delimited()?)?
                {
                    type_meta = m;
                }
            }
            (2, 2) => raw = r.delimited()?,
            (3, 2) => {
                encoding = scalar(Scalar::String, 2, &mut r)?
                    .as_str()
                    .unwrap_or_default()
                    .into()
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    if !encoding.is_empty() {
        return Err(format!("content encoding {encoding:?} is not supported"));
    }
    let api_version = type_meta
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = type_meta.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = message_of(schema, api_version, kind)
        .ok_or_else(|| format!("no protobuf schema for {kind} of {api_version}: send JSON"))?;
    let mut obj = message(schema, &name, raw)?;
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(api_version));
        o.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vendored_schemas_parse_and_name_what_they_use() {
        let schema = schema();
        for (name, fields) in &schema.messages {
            for f in fields.values() {
                let (Shape::Single(Type::Message(t))
                | Shape::Repeated(Type::Message(t))
                | Shape::Map(Type::Message(t))) = &f.shape
                else {
                    continue;
                };
                assert!(
                    schema.messages.contains_key(t),
                    "{name}.{}: {t} is not vendored",
                    f.name
                );
            }
        }
        assert!(schema.messages.contains_key("k8s.io.api.apps.v1.Deployment"));
    }

    #[test]
    fn a_service_from_kubectl_create_decodes_as_go_would_write_it_in_json() {
        // `kubectl create service clusterip svc --tcp=80:8080 -n default`, as kubectl 1.32 sends it.
        let body = b"k8s\x00\x0a\x0d\x0a\x02v1\x12\x07Service\x12p\x0a&\x0a\x03svc\x12\x00\x1a\x07default\x22\x00*\x002\x008\x00B\x00Z\x0a\x0a\x03app\x12\x03svc\x12B\x0a\x1b\x0a\x0780-8080\x12\x03TCP\x18P\x22\x07\x08\x00\x10\x90?\x1a\x00(\x00\x12\x0a\x0a\x03app\x12\x03svc\x1a\x00\x22\x09ClusterIP:\x00B\x00R\x00Z\x00`\x00h\x00\x1a\x02\x0a\x00\x1a\x00\x22\x00";
        assert_eq!(
            decode(body).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "svc", "namespace": "default", "labels": {"app": "svc"}},
                "spec": {
                    "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                    "selector": {"app": "svc"},
                    "type": "ClusterIP",
                },
                "status": {"loadBalancer": {}},
            })
        );
    }

    #[test]
    fn bodies_that_are_not_protobuf_or_of_an_unknown_kind_are_refused() {
        assert!(decode(b"{}").unwrap_err().contains("magic"));
        let unknown_kind = b"k8s\x00\x0a\x0e\x0a\x02v1\x12\x08NotAKind\x12\x00";
        assert!(
            decode(unknown_kind)
                .unwrap_err()
                .contains("no protobuf schema for NotAKind of v1")
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(1_500_000), "1.5ms");
        assert_eq!(go_duration(90_000_000_000), "1m30s");
        assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
        assert_eq!(go_duration(-2_500_000_000), "-2.5s");
    }
}
