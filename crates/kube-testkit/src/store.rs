//! Object storage: one map per resource, a global resourceVersion counter and the bounded event
//! history that watches replay from. Every write goes through here, so every write is an event.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use crate::resources::{self, RESOURCES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it. `prev` is the object before a modification, so a watch with a
/// selector can turn "stopped matching" into DELETED and "started matching" into ADDED.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub res: usize,
    pub kind: EventType,
    pub object: Value,
    pub prev: Option<Value>,
}

type Key = (String, String);

/// Replayable events after a version, and the receiver for the ones after them.
pub(crate) type Subscription = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);

pub(crate) struct Store {
    objects: Vec<BTreeMap<Key, Value>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// The highest resourceVersion whose event was dropped from the history.
    compacted: u64,
    tx: broadcast::Sender<Arc<Event>>,
}

pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        u16::from_be_bytes([b[4], b[5]]),
        u16::from_be_bytes([b[6], b[7]]) & 0x0fff,
        (u16::from_be_bytes([b[8], b[9]]) & 0x3fff) | 0x8000,
        u64::from_be_bytes([0, 0, b[10], b[11], b[12], b[13], b[14], b[15]]),
    )
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(crate) fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name")
}

pub(crate) fn uid_of(obj: &Value) -> &str {
    meta_str(obj, "uid")
}

pub(crate) fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(m) = obj else {
        unreachable!("made an object above")
    };
    let meta = m
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    let Value::Object(meta) = meta else {
        unreachable!("made an object above")
    };
    meta
}

impl Store {
    pub(crate) fn new(history_limit: usize) -> Self {
        let (tx, _) = broadcast::channel(16_384);
        Self {
            objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
            rv: 1,
            history: VecDeque::new(),
            history_limit: history_limit.max(16),
            compacted: 0,
            tx,
        }
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    pub(crate) fn get(&self, res: usize, ns: &str, name: &str) -> Option<&Value> {
        self.objects[res].get(&(ns.to_string(), name.to_string()))
    }

    /// Objects of `res`, in (namespace, name) order; `ns = None` means every namespace.
    pub(crate) fn list<'a>(
        &'a self,
        res: usize,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects[res]
            .iter()
            .filter(move |((n, _), _)| ns.is_none_or(|want| n == want))
            .map(|(_, v)| v)
    }

    /// Objects of `res` in `ns` after the `(namespace, name)` key `after`.
    pub(crate) fn list_after<'a>(
        &'a self,
        res: usize,
        ns: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        self.objects[res]
            .range((lower, Bound::Unbounded))
            .filter(move |((n, _), _)| ns.is_none_or(|want| n == want))
            .map(|(_, v)| v)
    }

    pub(crate) fn all_uids(&self) -> std::collections::HashSet<String> {
        self.objects
            .iter()
            .flat_map(|m| m.values().map(|v| uid_of(v).to_string()))
            .collect()
    }

    /// Every stored object with its resource id.
    pub(crate) fn iter_all(&self) -> impl Iterator<Item = (usize, &Value)> + '_ {
        self.objects
            .iter()
            .enumerate()
            .flat_map(|(i, m)| m.values().map(move |v| (i, v)))
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(&mut self, event: Event) {
        let event = Arc::new(event);
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(event);
    }

    /// Stores a new object: sets `uid`, `resourceVersion`, `creationTimestamp` and `generation`.
    /// The caller has checked that the name is free.
    pub(crate) fn insert(&mut self, res: usize, mut obj: Value) -> Value {
        let rv = self.bump();
        let def = resources::def(res);
        {
            let meta = metadata_mut(&mut obj);
            meta.insert("uid".into(), json!(new_uid()));
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
            meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
            meta.insert("generation".into(), json!(1));
            if !def.namespaced {
                meta.remove("namespace");
            }
        }
        let ns = meta_str(&obj, "namespace").to_string();
        let name = name_of(&obj).to_string();
        self.objects[res].insert((ns.clone(), name), obj.clone());
        self.emit(Event {
            rv,
            res,
            kind: EventType::Added,
            object: obj.clone(),
            prev: None,
        });
        obj
    }

    /// Replaces a stored object. Identity fields are kept from the stored copy; `generation`
    /// moves when anything outside `metadata` and `status` changed. A write that changes nothing
    /// is not an event and keeps the resourceVersion (as the API server does).
    pub(crate) fn update(&mut self, res: usize, mut obj: Value) -> Option<Value> {
        let ns = meta_str(&obj, "namespace").to_string();
        let name = name_of(&obj).to_string();
        let key = (ns.clone(), name);
        let old = self.objects[res].get(&key)?.clone();
        {
            let old_meta = old.get("metadata").cloned().unwrap_or_default();
            let meta = metadata_mut(&mut obj);
            for f in [
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                match old_meta.get(f) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
            meta.insert(
                "resourceVersion".into(),
                old_meta
                    .get("resourceVersion")
                    .cloned()
                    .unwrap_or(json!("")),
            );
        }
        if obj == old {
            return Some(old);
        }
        if spec_changed(&old, &obj) {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            metadata_mut(&mut obj).insert("generation".into(), json!(g + 1));
        }
        let rv = self.bump();
        metadata_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        self.objects[res].insert(key, obj.clone());
        self.emit(Event {
            rv,
            res,
            kind: EventType::Modified,
            object: obj.clone(),
            prev: Some(old),
        });
        Some(obj)
    }

    /// Sets `deletionTimestamp` (graceful deletion or finalizers pending).
    pub(crate) fn mark_deleting(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        grace: i64,
    ) -> Option<Value> {
        let mut obj = self.get(res, ns, name)?.clone();
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            return Some(obj);
        }
        let old = obj.clone();
        let rv = self.bump();
        let meta = metadata_mut(&mut obj);
        let at = chrono::Utc::now() + chrono::Duration::seconds(grace.max(0));
        meta.insert(
            "deletionTimestamp".into(),
            json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        );
        meta.insert("deletionGracePeriodSeconds".into(), json!(grace.max(0)));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        self.objects[res].insert((ns.to_string(), name.to_string()), obj.clone());
        self.emit(Event {
            rv,
            res,
            kind: EventType::Modified,
            object: obj.clone(),
            prev: Some(old),
        });
        Some(obj)
    }

    /// Removes an object for good; the DELETED event carries a fresh resourceVersion.
    pub(crate) fn remove(&mut self, res: usize, ns: &str, name: &str) -> Option<Value> {
        let mut obj = self.objects[res].remove(&(ns.to_string(), name.to_string()))?;
        let rv = self.bump();
        metadata_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        self.emit(Event {
            rv,
            res,
            kind: EventType::Deleted,
            object: obj.clone(),
            prev: None,
        });
        Some(obj)
    }

    /// Events after `since`, and a receiver for later ones (taken under the same lock, so nothing
    /// falls between them). `Err` with the oldest replayable version when `since` was compacted.
    pub(crate) fn subscribe(&self, since: u64) -> Result<Subscription, u64> {
        if since < self.compacted {
            return Err(self.compacted);
        }
        let backlog = self
            .history
            .iter()
            .filter(|e| e.rv > since)
            .cloned()
            .collect();
        Ok((backlog, self.tx.subscribe()))
    }
}

fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Value::Object(m) = &mut v {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::id;

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}})
    }

    #[test]
    fn versions_and_events() {
        let mut s = Store::new(100);
        let a = s.insert(id::CONFIGMAPS, cm("a"));
        assert_eq!(meta_str(&a, "resourceVersion"), "2");
        assert_eq!(a["metadata"]["generation"], 1);
        let mut changed = a.clone();
        changed["data"]["a"] = json!("2");
        let b = s.update(id::CONFIGMAPS, changed).unwrap();
        assert_eq!(meta_str(&b, "resourceVersion"), "3");
        assert_eq!(b["metadata"]["generation"], 2);
        assert_eq!(meta_str(&b, "uid"), meta_str(&a, "uid"));
        // No-op write: same version, no event.
        let c = s.update(id::CONFIGMAPS, b.clone()).unwrap();
        assert_eq!(meta_str(&c, "resourceVersion"), "3");
        s.remove(id::CONFIGMAPS, "default", "a").unwrap();
        let (events, _) = s.subscribe(2).unwrap();
        let kinds: Vec<_> = events.iter().map(|e| (e.rv, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![(3, EventType::Modified), (4, EventType::Deleted)]
        );
    }

    #[test]
    fn compaction_is_gone() {
        let mut s = Store::new(16);
        for i in 0..40 {
            s.insert(id::CONFIGMAPS, cm(&format!("c{i}")));
        }
        assert!(s.subscribe(2).is_err());
        assert!(s.subscribe(s.resource_version()).is_ok());
    }

    #[test]
    fn uid_shape() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'4');
    }
}
