//! The object store: every object as JSON, one monotonic resourceVersion across all of them, a bounded
//! history of changes for watches to replay, and the lifecycle rules that run on removal (finalizers,
//! ownerReference garbage collection, namespace termination, CRD removal).
//!
//! Invariants: every stored object carries `metadata.resourceVersion` equal to the `rv` of the last event
//! that touched it; events in `log` have strictly increasing `rv`; a watch from version `v` can be served
//! from the log iff `v >= floor`; `uids` maps the uid of every stored object, and only those, to where it
//! is stored (the garbage collector looks owners up by uid at every write of a dependent: a scan of every
//! object there made writes cost O(objects)).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::registry::{Registry, ResKey};

/// The server's clock, injectable so tests can drive time.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(Utc::now)
}

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// What happened.
    pub type_: EventType,
    /// Which bucket.
    pub res: ResKey,
    /// The object's namespace ("" for cluster-scoped).
    pub namespace: String,
    /// The object after the change (the last state for deletions).
    pub object: Value,
    /// The object before the change, for modifications (watches with selectors need it to tell when an
    /// object enters or leaves the selection).
    pub previous: Option<Value>,
}

/// What the store broadcasts to open watches.
#[derive(Debug, Clone)]
pub enum Message {
    /// A change.
    Event(Arc<Event>),
    /// History was compacted: every open watch ends, so clients re-watch and may get 410.
    Compacted,
}

/// `metadata.namespace`/`metadata.name` of an object.
pub fn ns_name(obj: &Value) -> (String, String) {
    let m = &obj["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str().unwrap_or_default().to_string(),
    )
}

/// A fresh object uid.
pub fn new_uid() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// `metadata.uid`.
pub fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

/// `metadata.finalizers` is non-empty.
pub fn has_finalizers(obj: &Value) -> bool {
    obj["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
}

/// How dependents are treated when their owner goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Owner goes now, dependents after it.
    #[default]
    Background,
    /// Dependents go first, the owner waits with the `foregroundDeletion` finalizer.
    Foreground,
    /// Dependents stay, their ownerReferences to the owner are dropped.
    Orphan,
}

const FOREGROUND: &str = "foregroundDeletion";

/// The store. Not thread safe by itself: the server keeps it behind one mutex.
pub struct Store {
    /// Types served.
    pub registry: Registry,
    objects: BTreeMap<ResKey, BTreeMap<(String, String), Value>>,
    /// Where the object of each uid is stored: its bucket, namespace and name.
    uids: HashMap<String, (ResKey, String, String)>,
    rv: u64,
    log: VecDeque<Arc<Event>>,
    floor: u64,
    capacity: usize,
    tx: broadcast::Sender<Message>,
    clock: Clock,
}

impl Store {
    /// An empty store with the built-in types and a history of `capacity` events.
    pub fn new(capacity: usize, clock: Clock) -> Self {
        let (tx, _) = broadcast::channel(capacity.clamp(16, 65536));
        Store {
            registry: Registry::new(crate::builtins::all()),
            objects: BTreeMap::new(),
            uids: HashMap::new(),
            rv: 1,
            log: VecDeque::new(),
            floor: 1,
            capacity: capacity.max(1),
            tx,
            clock,
        }
    }

    /// The current time, formatted as Kubernetes timestamps are.
    pub fn now(&self) -> String {
        (self.clock)().to_rfc3339_opts(SecondsFormat::Secs, true)
    }

    /// The current time.
    pub fn now_time(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    /// The latest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    /// The oldest version a watch may start from.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// One object.
    pub fn get(&self, res: &ResKey, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(res)?
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// Objects of a bucket, sorted by namespace then name; `namespace: None` lists all namespaces.
    pub fn list(&self, res: &ResKey, namespace: Option<&str>) -> Vec<&Value> {
        self.objects
            .get(res)
            .map(|m| {
                m.iter()
                    .filter(|((ns, _), _)| namespace.is_none_or(|want| ns == want))
                    .map(|(_, v)| v)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every object of every bucket in one namespace.
    pub fn in_namespace(&self, namespace: &str) -> Vec<(ResKey, Value)> {
        let mut out = vec![];
        for (res, m) in &self.objects {
            for ((ns, _), v) in m {
                if ns == namespace {
                    out.push((res.clone(), v.clone()));
                }
            }
        }
        out
    }

    /// Events after `rv`, and a receiver for the ones to come, taken atomically.
    /// `Err(floor)` when `rv` is older than the history kept.
    pub fn subscribe_from(&self, rv: u64) -> Result<(Vec<Arc<Event>>, broadcast::Receiver<Message>), u64> {
        if rv < self.floor {
            return Err(self.floor);
        }
        let replay = self.log.iter().filter(|e| e.rv > rv).cloned().collect();
        Ok((replay, self.tx.subscribe()))
    }

    /// A receiver for changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Message> {
        self.tx.subscribe()
    }

    /// Forgets all history and ends open watches: a watch from any earlier version now gets 410.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.floor = self.rv;
        self.log.clear();
        let _ = self.tx.send(Message::Compacted);
    }

    fn record(&mut self, type_: EventType, res: &ResKey, object: &Value, previous: Option<Value>) {
        let (namespace, _) = ns_name(object);
        let event = Arc::new(Event {
            rv: self.rv,
            type_,
            res: res.clone(),
            namespace,
            object: object.clone(),
            previous,
        });
        self.log.push_back(event.clone());
        while self.log.len() > self.capacity {
            if let Some(old) = self.log.pop_front() {
                self.floor = old.rv;
            }
        }
        let _ = self.tx.send(Message::Event(event));
    }

    /// Stores a new or changed object, stamping a fresh resourceVersion. Returns what was stored.
    pub fn put(&mut self, res: &ResKey, mut obj: Value) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let (ns, name) = ns_name(&obj);
        self.uids
            .insert(uid(&obj).to_string(), (res.clone(), ns.clone(), name.clone()));
        let bucket = self.objects.entry(res.clone()).or_default();
        let previous = bucket.insert((ns, name), obj.clone());
        let type_ = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(type_, res, &obj, previous);
        if res.group == "apiextensions.k8s.io" && res.plural == "customresourcedefinitions" {
            crate::crd::register(&mut self.registry, &obj);
        }
        // The garbage collector deletes objects whose owners are all gone, including objects written
        // with ownerReferences to owners that were deleted meanwhile (a late reconcile).
        let refs = obj["metadata"]["ownerReferences"]
            .as_array()
            .filter(|r| !r.is_empty());
        if let Some(refs) = refs
            && obj["metadata"]["deletionTimestamp"].is_null()
            && !refs
                .iter()
                .any(|r| r["uid"].as_str().is_some_and(|u| self.exists_uid(u)))
        {
            let (ns, name) = ns_name(&obj);
            if let Some((after, _)) = self.delete(res, &ns, &name, Propagation::Background) {
                return after;
            }
        }
        obj
    }

    /// Stores an update; if the object is being deleted and its last finalizer went, removes it instead.
    pub fn put_or_finish(&mut self, res: &ResKey, obj: Value) -> Value {
        if !obj["metadata"]["deletionTimestamp"].is_null() && !has_finalizers(&obj) {
            let (ns, name) = ns_name(&obj);
            if let Some(bucket) = self.objects.get_mut(res) {
                bucket.insert((ns.clone(), name.clone()), obj);
            }
            return self.remove(res, &ns, &name).unwrap_or(Value::Null);
        }
        self.put(res, obj)
    }

    /// Deletion as the API asks for it: with finalizers the object only gets a deletionTimestamp.
    /// Returns the object as it stands afterwards and whether it is gone.
    pub fn delete(
        &mut self,
        res: &ResKey,
        namespace: &str,
        name: &str,
        propagation: Propagation,
    ) -> Option<(Value, bool)> {
        let mut obj = self.get(res, namespace, name)?.clone();
        let is_namespace = res.group.is_empty() && res.plural == "namespaces";
        let owner_uid = uid(&obj).to_string();
        match propagation {
            Propagation::Orphan => self.orphan_dependents(&owner_uid),
            Propagation::Foreground if !self.dependents(&owner_uid).is_empty() => {
                let fins = obj["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !fins.iter().any(|f| f == FOREGROUND) {
                    let mut fins = fins;
                    fins.push(json!(FOREGROUND));
                    obj["metadata"]["finalizers"] = json!(fins);
                }
            }
            _ => {}
        }
        if is_namespace || has_finalizers(&obj) {
            if obj["metadata"]["deletionTimestamp"].is_null() {
                obj["metadata"]["deletionTimestamp"] = json!(self.now());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            if is_namespace {
                obj["status"]["phase"] = json!("Terminating");
            }
            let stored = self.put(res, obj);
            if propagation == Propagation::Foreground {
                for (dres, dep) in self.dependents(&owner_uid) {
                    let (dns, dname) = ns_name(&dep);
                    self.delete(&dres, &dns, &dname, Propagation::Background);
                }
            }
            if is_namespace {
                self.terminate_namespace(name);
                let gone = self.get(res, namespace, name).is_none();
                let now = self.get(res, namespace, name).cloned().unwrap_or(stored);
                return Some((now, gone));
            }
            return Some((stored, false));
        }
        let last = self.remove(res, namespace, name)?;
        Some((last, true))
    }

    /// Removes an object for good (DELETED event), then runs what follows a removal.
    pub fn remove(&mut self, res: &ResKey, namespace: &str, name: &str) -> Option<Value> {
        let mut obj = self
            .objects
            .get_mut(res)?
            .remove(&(namespace.to_string(), name.to_string()))?;
        self.uids.remove(uid(&obj));
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(EventType::Deleted, res, &obj, None);
        self.after_removal(res, &obj);
        Some(obj)
    }

    fn after_removal(&mut self, res: &ResKey, obj: &Value) {
        let removed_uid = uid(obj).to_string();
        if res.group == "apiextensions.k8s.io" && res.plural == "customresourcedefinitions" {
            let key = crate::crd::res_key(obj);
            let names: Vec<(String, String)> = self
                .objects
                .get(&key)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            for (ns, name) in names {
                self.remove(&key, &ns, &name);
            }
            self.objects.remove(&key);
            self.registry.remove(&key);
        }
        // Garbage collection: a dependent none of whose owners exist any more goes too.
        for (dres, dep) in self.dependents(&removed_uid) {
            let owners = dep["metadata"]["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let any_owner_left = owners.iter().any(|o| {
                o["uid"]
                    .as_str()
                    .is_some_and(|u| u != removed_uid && self.exists_uid(u))
            });
            if !any_owner_left {
                let (dns, dname) = ns_name(&dep);
                self.delete(&dres, &dns, &dname, Propagation::Background);
            }
        }
        // Foreground owners waiting on this dependent.
        for o in obj["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let Some(owner_uid) = o["uid"].as_str() else {
                continue;
            };
            let Some((ores, owner)) = self.find_uid(owner_uid) else {
                continue;
            };
            let waiting = owner["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == FOREGROUND));
            if waiting
                && !owner["metadata"]["deletionTimestamp"].is_null()
                && self.dependents(owner_uid).is_empty()
            {
                let mut owner = owner;
                if let Some(f) = owner["metadata"]["finalizers"].as_array_mut() {
                    f.retain(|x| x != FOREGROUND);
                }
                self.put_or_finish(&ores, owner);
            }
        }
        let (ns, _) = ns_name(obj);
        if !ns.is_empty() {
            self.finish_namespace_if_empty(&ns);
        }
    }

    fn terminate_namespace(&mut self, namespace: &str) {
        for (res, obj) in self.in_namespace(namespace) {
            let (ns, name) = ns_name(&obj);
            if obj["metadata"]["deletionTimestamp"].is_null() {
                self.delete(&res, &ns, &name, Propagation::Background);
            }
        }
        self.finish_namespace_if_empty(namespace);
    }

    fn finish_namespace_if_empty(&mut self, namespace: &str) {
        let key = ResKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        let terminating = self
            .get(&key, "", namespace)
            .is_some_and(|n| !n["metadata"]["deletionTimestamp"].is_null());
        if terminating && self.in_namespace(namespace).is_empty() {
            let ns = self.get(&key, "", namespace).cloned().unwrap_or(Value::Null);
            if !has_finalizers(&ns) {
                self.remove(&key, "", namespace);
            }
        }
    }

    fn orphan_dependents(&mut self, owner_uid: &str) {
        for (dres, mut dep) in self.dependents(owner_uid) {
            if let Some(refs) = dep["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"] != owner_uid);
            }
            self.put(&dres, dep);
        }
    }

    /// Objects with an ownerReference to `owner_uid`.
    pub fn dependents(&self, owner_uid: &str) -> Vec<(ResKey, Value)> {
        let mut out = vec![];
        for (res, m) in &self.objects {
            for v in m.values() {
                let refs = v["metadata"]["ownerReferences"].as_array();
                if refs.is_some_and(|r| r.iter().any(|o| o["uid"] == owner_uid)) {
                    out.push((res.clone(), v.clone()));
                }
            }
        }
        out
    }

    fn exists_uid(&self, wanted: &str) -> bool {
        self.uids.contains_key(wanted)
    }

    fn find_uid(&self, wanted: &str) -> Option<(ResKey, Value)> {
        let (res, ns, name) = self.uids.get(wanted)?;
        Some((res.clone(), self.get(res, ns, name)?.clone()))
    }
}
