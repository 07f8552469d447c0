//! What the API server stand-in keeps: Node objects (and Pods, read only) ordered by name as
//! etcd keeps them, one resourceVersion counter, a window of watch events, and list snapshots
//! for continue tokens; with the errors worded as kube-apiserver words them.

use super::patch;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// An error as the API server reports it: an HTTP status and a `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` of the Status: the object's name and the resource's plural.
    pub details: Option<(String, &'static str)>,
    /// `details.retryAfterSeconds`, as an overloaded server gives it with `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> ApiError {
        ApiError {
            code,
            reason,
            message,
            details: None,
            retry_after: None,
        }
    }

    fn about(mut self, name: &str, kind: &'static str) -> ApiError {
        self.details = Some((name.to_string(), kind));
        self
    }

    pub fn not_found(kind: &'static str, name: &str) -> ApiError {
        ApiError::new(404, "NotFound", format!("{kind} {name:?} not found")).about(name, kind)
    }

    pub fn bad_request(message: String) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// What an overloaded server answers: 429 from its priority and fairness, or a 5xx.
    pub fn overloaded(code: u16, retry_after: Option<u64>) -> ApiError {
        let (reason, message) = match code {
            429 => (
                "TooManyRequests",
                "Too many requests, please try again later.",
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted",
            ),
            _ => (
                "InternalError",
                "an error on the server has prevented the request from succeeding",
            ),
        };
        let mut e = ApiError::new(code, reason, message.into());
        e.retry_after = retry_after;
        e
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized".into())
    }

    /// What RBAC answers: `nodes "n1" is forbidden: User "u" cannot patch resource
    /// "nodes/status" in API group "" at the cluster scope`.
    pub fn forbidden(
        user: &str,
        verb: &str,
        resource: &str,
        name: Option<&str>,
        namespace: Option<&str>,
    ) -> ApiError {
        let plural = resource.split('/').next().unwrap_or(resource);
        let kind = Kind::from_plural(plural).unwrap_or(Kind::Node);
        let what = match name {
            Some(n) => format!("{} {n:?}", kind.plural()),
            None => kind.plural().to_string(),
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        let e = ApiError::new(
            403,
            "Forbidden",
            format!(
                "{what} is forbidden: User {user:?} cannot {verb} resource {resource:?} in API group {:?} {scope}",
                kind.group()
            ),
        );
        e.about(name.unwrap_or_default(), kind.plural())
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
        )
    }

    pub fn unsupported_media_type(got: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, \
                 application/apply-patch+yaml, application/strategic-merge-patch+json (got {got:?})"
            ),
        )
    }

    fn invalid(kind: Kind, name: &str, field_errors: &str) -> ApiError {
        ApiError::new(
            422,
            "Invalid",
            format!("{} {name:?} is invalid: {field_errors}", kind.name()),
        )
        .about(name, kind.plural())
    }

    /// A watch from a resourceVersion older than the event window.
    pub fn too_old(rv: u64, oldest: u64) -> ApiError {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }

    fn continue_expired() -> ApiError {
        ApiError::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You \
             can start a new list without the continue parameter, or use the continue token in \
             this response to retrieve the remainder of the results. Continuing with the provided \
             token results in an inconsistent list - objects that were created, modified, or \
             deleted between the time the first chunk was returned and now may show up in the \
             list."
                .into(),
        )
    }

    /// The `Status` object, with the fields in the API server's order.
    pub fn status_json(&self) -> String {
        let details = match &self.details {
            Some((name, kind)) if name.is_empty() => format!(r#","details":{{"kind":"{kind}"}}"#),
            Some((name, kind)) => format!(
                r#","details":{{"name":{},"kind":"{kind}"}}"#,
                Value::String(name.clone())
            ),
            None if self.code == 405 => r#","details":{}"#.to_string(),
            None => match self.retry_after {
                Some(s) => format!(r#","details":{{"retryAfterSeconds":{s}}}"#),
                None => String::new(),
            },
        };
        format!(
            r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":{},"reason":"{}"{details},"code":{}}}"#,
            Value::String(self.message.clone()),
            self.reason,
            self.code
        )
    }
}

pub type Result<T> = std::result::Result<T, ApiError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// The kinds of object the stand-in keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    Namespace,
    Pod,
    NetworkPolicy,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Node, Kind::Namespace, Kind::Pod, Kind::NetworkPolicy];

    /// The resource's name in URLs and RBAC rules.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "nodes",
            Kind::Namespace => "namespaces",
            Kind::Pod => "pods",
            Kind::NetworkPolicy => "networkpolicies",
        }
    }

    pub fn from_plural(plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == plural)
    }

    /// The `kind` field of one object (`Node`); a list's is this with `List` after it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::NetworkPolicy => "NetworkPolicy",
        }
    }

    /// The API group ("" for the core group).
    pub fn group(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networking.k8s.io",
            _ => "",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            _ => "v1",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(self, Kind::Pod | Kind::NetworkPolicy)
    }
}

#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub kind: EventKind,
    pub resource: Kind,
    pub object: Arc<Stored>,
}

/// A stored object and its JSON text, made once when it is written: lists and watches send the
/// text, as the API server's watch cache serves objects it has already encoded, so that what a
/// client's list or watch costs is the client's, not this stand-in's encoding of every object
/// on every read.
#[derive(Debug)]
pub struct Stored {
    value: Value,
    text: String,
}

impl Stored {
    pub fn new(value: Value) -> Stored {
        let text = value.to_string();
        Stored { value, text }
    }

    /// The object as JSON (without kind and apiVersion, as list items are).
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl std::ops::Deref for Stored {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.value
    }
}

/// One kind's objects by (namespace, name) ("" for cluster-scoped objects), in the order etcd
/// keeps their keys.
type Objects = BTreeMap<(String, String), Arc<Stored>>;

/// One page of a list.
pub struct Page {
    pub rv: u64,
    pub items: Vec<Arc<Stored>>,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `<resource>/<name>`: metadata and spec; status stays.
    Main,
    /// `<resource>/<name>/status`: metadata and status; spec stays.
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
}

/// A resourceVersion stays far from 0, as etcd's revisions are in a cluster that has lived.
const FIRST_RV: u64 = 1000;
/// List snapshots kept for continue tokens.
const SNAPSHOTS: usize = 8;
/// The label the API server gives every namespace, its name as value.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

pub struct Store {
    rv: u64,
    objects: BTreeMap<Kind, Objects>,
    events: VecDeque<Event>,
    /// A watch may resume from this resourceVersion or later.
    oldest: u64,
    event_window: usize,
    snapshots: VecDeque<(Kind, u64, Arc<Objects>)>,
    uids: u64,
}

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_string(), name.to_string())
}

impl Store {
    pub fn new(event_window: usize) -> Store {
        Store {
            rv: FIRST_RV,
            objects: Kind::ALL.into_iter().map(|k| (k, Objects::new())).collect(),
            events: VecDeque::new(),
            oldest: FIRST_RV,
            event_window: event_window.max(1),
            snapshots: VecDeque::new(),
            uids: 0,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn of(&self, kind: Kind) -> &Objects {
        static EMPTY: Objects = Objects::new();
        self.objects.get(&kind).unwrap_or(&EMPTY)
    }

    fn of_mut(&mut self, kind: Kind) -> &mut Objects {
        self.objects.entry(kind).or_default()
    }

    /// How many objects of `kind` there are.
    pub fn count(&self, kind: Kind) -> usize {
        self.of(kind).len()
    }

    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Result<Arc<Stored>> {
        self.of(kind)
            .get(&key(namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind.plural(), name))
    }

    /// Every event after `rv`, or 410 when they have left the window.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Event>> {
        if rv < self.oldest {
            return Err(ApiError::too_old(rv, self.oldest));
        }
        let start = self.events.partition_point(|e| e.rv <= rv);
        Ok(self.events.range(start..).cloned().collect())
    }

    /// Every current object of `kind` (in `namespace` when given), as the synthetic ADDED
    /// events of a watch without a resourceVersion.
    pub fn current(&self, kind: Kind, namespace: Option<&str>) -> Vec<Arc<Stored>> {
        self.of(kind)
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|want| ns == want))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Forgets every event so far: a watch from any earlier resourceVersion gets 410, and so
    /// does a continue token of an earlier list (as after an etcd compaction).
    pub fn compact(&mut self) {
        self.events.clear();
        self.oldest = self.rv;
        self.snapshots.clear();
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        let seed = u64::from(std::process::id()) << 32 | (self.uids & 0xffff_ffff);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (seed >> 16) as u32,
            seed as u16,
            self.uids & 0xfff,
            (seed >> 40) & 0xfff,
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) & 0xffff_ffff_ffff
        )
    }

    fn record(&mut self, kind: EventKind, resource: Kind, object: Arc<Stored>) {
        self.events.push_back(Event {
            rv: self.rv,
            kind,
            resource,
            object,
        });
        while self.events.len() > self.event_window {
            if let Some(e) = self.events.pop_front() {
                self.oldest = e.rv;
            }
        }
    }

    /// POST of an object of `kind`, in `namespace` for a namespaced kind (the namespace the
    /// object names is then ignored, as the URL's wins).
    pub fn create(&mut self, kind: Kind, namespace: &str, mut obj: Value) -> Result<Arc<Stored>> {
        let Some(o) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(format!(
                "the object provided is not a {}: not a JSON object",
                kind.name()
            )));
        };
        o.remove("kind");
        o.remove("apiVersion");
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            return Err(ApiError::invalid(
                kind,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        let namespace = if kind.namespaced() { namespace } else { "" };
        if kind.namespaced() && !self.of(Kind::Namespace).contains_key(&key("", namespace)) {
            return Err(ApiError::not_found("namespaces", namespace));
        }
        if self.of(kind).contains_key(&key(namespace, &name)) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", kind.plural()),
            )
            .about(&name, kind.plural()));
        }
        if kind == Kind::Pod {
            // The kubelet writes a pod's status; what a create carries is dropped.
            obj["status"] = json!({"phase": "Pending"});
        }
        normalise(kind, &mut obj, &name)?;
        let uid = self.next_uid();
        self.rv += 1;
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| ApiError::bad_request("metadata is not an object".into()))?;
        if kind.namespaced() {
            meta.insert("namespace".into(), namespace.into());
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), uid.into());
        meta.insert("resourceVersion".into(), self.rv.to_string().into());
        meta.insert(
            "creationTimestamp".into(),
            rfc3339(SystemTime::now()).into(),
        );
        let obj = Arc::new(Stored::new(obj));
        self.of_mut(kind).insert(key(namespace, &name), obj.clone());
        self.record(EventKind::Added, kind, obj.clone());
        Ok(obj)
    }

    /// DELETE of an object: the deleted object. A namespace takes what is in it along, each
    /// with its own event, as its finalizer does.
    pub fn delete(&mut self, kind: Kind, namespace: &str, name: &str) -> Result<Arc<Stored>> {
        let namespace = if kind.namespaced() { namespace } else { "" };
        if !self.of(kind).contains_key(&key(namespace, name)) {
            return Err(ApiError::not_found(kind.plural(), name));
        }
        if kind == Kind::Namespace {
            for inner in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
                let names: Vec<String> = self
                    .of(inner)
                    .keys()
                    .filter(|(ns, _)| ns == name)
                    .map(|(_, n)| n.clone())
                    .collect();
                for n in names {
                    self.delete(inner, name, &n)?;
                }
            }
        }
        let old = self
            .of_mut(kind)
            .remove(&key(namespace, name))
            .ok_or_else(|| ApiError::not_found(kind.plural(), name))?;
        self.rv += 1;
        let mut gone = old.value.clone();
        set_rv(&mut gone, self.rv);
        let gone = Arc::new(Stored::new(gone));
        self.record(EventKind::Deleted, kind, gone.clone());
        Ok(gone)
    }

    /// PATCH of an object or its status. A patch that changes nothing changes no
    /// resourceVersion and makes no event.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        kind: Kind,
        namespace: &str,
        name: &str,
        part: Part,
        patch_type: PatchType,
        body: &[u8],
    ) -> Result<Arc<Stored>> {
        let namespace = if kind.namespaced() { namespace } else { "" };
        let old = self.get(kind, namespace, name)?;
        let patch: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        let mut new = (*old).clone();
        let applied = match patch_type {
            PatchType::Merge => {
                if !patch.is_object() {
                    Err("a merge patch must be a JSON object".to_string())
                } else {
                    patch::merge(&mut new, &patch);
                    Ok(())
                }
            }
            PatchType::Strategic => patch::strategic(&mut new, &patch),
            PatchType::Json => patch::json_patch(&mut new, &patch),
        };
        applied.map_err(ApiError::bad_request)?;
        let wanted_rv = new
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        self.replace(kind, namespace, &old, new, part, wanted_rv.as_deref())
    }

    /// PUT of an object or its status.
    pub fn update(
        &mut self,
        kind: Kind,
        namespace: &str,
        name: &str,
        part: Part,
        body: &[u8],
    ) -> Result<Arc<Stored>> {
        let namespace = if kind.namespaced() { namespace } else { "" };
        let old = self.get(kind, namespace, name)?;
        let mut new: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the object provided is invalid: {e}")))?;
        if let Some(o) = new.as_object_mut() {
            o.remove("kind");
            o.remove("apiVersion");
        }
        let wanted_rv = new
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        self.replace(kind, namespace, &old, new, part, wanted_rv.as_deref())
    }

    fn replace(
        &mut self,
        kind: Kind,
        namespace: &str,
        old: &Arc<Stored>,
        mut new: Value,
        part: Part,
        wanted_rv: Option<&str>,
    ) -> Result<Arc<Stored>> {
        let name = name_of(old).to_string();
        let current_rv = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if wanted_rv.is_some_and(|rv| !rv.is_empty() && rv != current_rv) {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the object has been \
                     modified; please apply your changes to the latest version and try again",
                    kind.plural()
                ),
            )
            .about(&name, kind.plural()));
        }
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the object is not a JSON object".into(),
            ));
        }
        // What the subresource may not change comes from the stored object.
        let kept = match part {
            Part::Main => "status",
            Part::Status => "spec",
        };
        match old.get(kept) {
            Some(v) => new[kept] = v.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove(kept);
                }
            }
        }
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
        ] {
            let v = old.pointer(&format!("/metadata/{field}")).cloned();
            match (new.get_mut("metadata").and_then(Value::as_object_mut), v) {
                (Some(m), Some(v)) => {
                    m.insert(field.into(), v);
                }
                (Some(m), None) => {
                    m.remove(field);
                }
                (None, _) => return Err(ApiError::bad_request("metadata is missing".into())),
            }
        }
        normalise(kind, &mut new, &name)?;
        if kind == Kind::Node {
            let cidrs = |v: &Value| v.pointer("/spec/podCIDRs").cloned();
            let had = cidrs(old)
                .and_then(|c| c.as_array().cloned())
                .unwrap_or_default();
            if !had.is_empty() && cidrs(&new).and_then(|c| c.as_array().cloned()) != Some(had) {
                return Err(ApiError::invalid(
                    kind,
                    &name,
                    "spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid",
                ));
            }
        }
        if new == old.value {
            return Ok(old.clone());
        }
        self.rv += 1;
        set_rv(&mut new, self.rv);
        let new = Arc::new(Stored::new(new));
        self.of_mut(kind).insert(key(namespace, &name), new.clone());
        self.record(EventKind::Modified, kind, new.clone());
        Ok(new)
    }

    /// One page of the list of `kind` (in `namespace` when given): `limit` items (all when 0)
    /// after the continue token's position, from the snapshot of the list the token belongs to.
    pub fn list(
        &mut self,
        kind: Kind,
        namespace: Option<&str>,
        limit: usize,
        token: Option<&str>,
    ) -> Result<Page> {
        let (rv, snapshot, start) = match token {
            // The first page reads the live objects; a snapshot is taken only if more follow.
            None => (self.rv, None, None),
            Some(t) => {
                let (rv, start) = decode_continue(t)?;
                let snapshot = self
                    .snapshots
                    .iter()
                    .find(|(k, r, _)| *k == kind && *r == rv)
                    .map(|(_, _, s)| s.clone())
                    .ok_or_else(ApiError::continue_expired)?;
                (rv, Some(snapshot), Some(start))
            }
        };
        let source: &Objects = snapshot.as_deref().unwrap_or_else(|| self.of(kind));
        let after = match &start {
            Some(s) => std::ops::Bound::Excluded(s.clone()),
            None => std::ops::Bound::Unbounded,
        };
        let mut rest = source
            .range((after, std::ops::Bound::Unbounded))
            .filter(|((ns, _), _)| namespace.is_none_or(|want| ns == want));
        let items: Vec<(&(String, String), &Arc<Stored>)> = match limit {
            0 => rest.by_ref().collect(),
            n => rest.by_ref().take(n).collect(),
        };
        let remaining = rest.count();
        let last = items.last().map(|(k, _)| (*k).clone());
        let items: Vec<Arc<Stored>> = items.into_iter().map(|(_, v)| v.clone()).collect();
        let continue_token = match last {
            Some(last) if remaining > 0 => {
                if !self
                    .snapshots
                    .iter()
                    .any(|(k, r, _)| *k == kind && *r == rv)
                {
                    let taken = Arc::new(self.of(kind).clone());
                    self.snapshots.push_back((kind, rv, taken));
                    while self.snapshots.len() > SNAPSHOTS {
                        self.snapshots.pop_front();
                    }
                }
                Some(encode_continue(rv, &last))
            }
            _ => None,
        };
        Ok(Page {
            rv,
            items,
            continue_token,
            remaining: (remaining > 0).then_some(remaining),
        })
    }
}

pub fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn set_rv(node: &mut Value, rv: u64) {
    if let Some(m) = node.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), rv.to_string().into());
    }
}

/// What the API server does to every object it stores: `metadata`, `spec` and `status`
/// present (no status for a NetworkPolicy), and what each kind's defaults and validation add.
fn normalise(kind: Kind, obj: &mut Value, name: &str) -> Result<()> {
    let Some(o) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the object is not a JSON object".into(),
        ));
    };
    for part in ["metadata", "spec", "status"] {
        if kind == Kind::NetworkPolicy && part == "status" {
            continue;
        }
        if !o.get(part).is_some_and(Value::is_object) {
            o.insert(part.into(), Value::Object(Map::new()));
        }
    }
    match kind {
        Kind::Node => normalise_node(obj, name),
        Kind::Namespace => {
            normalise_namespace(obj, name);
            Ok(())
        }
        Kind::Pod => {
            normalise_pod(obj);
            Ok(())
        }
        Kind::NetworkPolicy => {
            default_policy(obj);
            Ok(())
        }
    }
}

/// Every namespace carries its name as a label, and starts Active.
fn normalise_namespace(ns: &mut Value, name: &str) {
    if !ns["metadata"]["labels"].is_object() {
        ns["metadata"]["labels"] = json!({});
    }
    ns["metadata"]["labels"][NAMESPACE_NAME_LABEL] = name.into();
    if ns["spec"].get("finalizers").is_none() {
        ns["spec"]["finalizers"] = json!(["kubernetes"]);
    }
    if ns["status"].get("phase").is_none() {
        ns["status"]["phase"] = "Active".into();
    }
}

/// A container port's protocol defaults to TCP.
fn normalise_pod(pod: &mut Value) {
    let Some(containers) = pod["spec"]["containers"].as_array_mut() else {
        return;
    };
    for c in containers {
        let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) else {
            continue;
        };
        for p in ports.iter_mut().filter(|p| p.get("protocol").is_none()) {
            p["protocol"] = "TCP".into();
        }
    }
}

/// The API server's defaults of a NetworkPolicy: `policyTypes` from the rules present, and
/// TCP for a port without a protocol. Nothing else is validated: the enforcer's tests hand it
/// what a real server would refuse.
fn default_policy(policy: &mut Value) {
    let spec = &mut policy["spec"];
    if spec["policyTypes"].as_array().is_none_or(|t| t.is_empty()) {
        let mut types = vec![Value::from("Ingress")];
        if spec["egress"].as_array().is_some_and(|e| !e.is_empty()) {
            types.push("Egress".into());
        }
        spec["policyTypes"] = types.into();
    }
    for direction in ["ingress", "egress"] {
        let Some(rules) = spec.get_mut(direction).and_then(Value::as_array_mut) else {
            continue;
        };
        for rule in rules {
            let Some(ports) = rule.get_mut("ports").and_then(Value::as_array_mut) else {
                continue;
            };
            for p in ports.iter_mut().filter(|p| p.get("protocol").is_none()) {
                p["protocol"] = "TCP".into();
            }
        }
    }
}

/// A Node's `podCIDR` and `podCIDRs` kept in step, and the CIDRs validated.
fn normalise_node(node: &mut Value, name: &str) -> Result<()> {
    let Some(obj) = node.as_object_mut() else {
        return Ok(());
    };
    let spec = obj
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::bad_request("spec is not an object".into()))?;
    let single = spec
        .get("podCIDR")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let list: Vec<String> = match spec.get("podCIDRs") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_request("spec.podCIDRs must be strings".into()))?,
        Some(_) => return Err(ApiError::bad_request("spec.podCIDRs must be a list".into())),
    };
    let list = if list.is_empty() && !single.is_empty() {
        vec![single.clone()]
    } else {
        list
    };
    for (i, c) in list.iter().enumerate() {
        if parse_cidr(c).is_none() {
            return Err(ApiError::invalid(
                Kind::Node,
                name,
                &format!("spec.podCIDRs[{i}]: Invalid value: {c:?}: must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"),
            ));
        }
    }
    let families: Vec<Option<bool>> = list.iter().map(|c| parse_cidr(c)).collect();
    if list.len() > 2 || (list.len() == 2 && families[0] == families[1]) {
        return Err(ApiError::invalid(
            Kind::Node,
            name,
            "spec.podCIDRs: Invalid value: \"[...]\": may specify no more than one CIDR for each IP family",
        ));
    }
    if !single.is_empty() && list.first() != Some(&single) {
        return Err(ApiError::invalid(
            Kind::Node,
            name,
            &format!("spec.podCIDRs[0]: Invalid value: {single:?}: must be equal to spec.podCIDR"),
        ));
    }
    if let Some(first) = list.first() {
        spec.insert("podCIDR".into(), first.clone().into());
        spec.insert("podCIDRs".into(), list.into());
    } else {
        spec.remove("podCIDR");
        spec.remove("podCIDRs");
    }
    Ok(())
}

/// Some(true) for an IPv6 CIDR, Some(false) for IPv4, None when it is not one.
fn parse_cidr(c: &str) -> Option<bool> {
    let (addr, len) = c.split_once('/')?;
    let len: u8 = len.parse().ok()?;
    match addr.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(_) => (len <= 32).then_some(false),
        std::net::IpAddr::V6(_) => (len <= 128).then_some(true),
    }
}

/// The API server's continue token: base64url of `{"v":"meta.k8s.io/v1","rv":N,"start":"k\u0000"}`.
fn encode_continue(rv: u64, last: &(String, String)) -> String {
    let start = match last {
        (ns, name) if ns.is_empty() => format!("{name}\u{0}"),
        (ns, name) => format!("{ns}/{name}\u{0}"),
    };
    let body = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, (String, String))> {
    let bad = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad("not JSON"))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad("server does not recognize this encoded key"));
    }
    let rv = v["rv"].as_u64().ok_or_else(|| bad("no resourceVersion"))?;
    let start = v["start"].as_str().ok_or_else(|| bad("no start"))?;
    let start = start.trim_end_matches('\u{0}');
    let key = match start.split_once('/') {
        Some((ns, name)) => key(ns, name),
        None => key("", start),
    };
    Ok((rv, key))
}

/// `2026-11-25T17:56:17Z`, as metav1.Time is written.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: Option<&str>) -> Value {
        let mut n = json!({"metadata": {"name": name}});
        if let Some(c) = cidr {
            n["spec"] = json!({"podCIDR": c});
        }
        n
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_629_377);
        assert_eq!(rfc3339(t), "2026-11-25T17:56:17Z");
    }

    #[test]
    fn pages_come_from_one_snapshot_and_expire_with_a_compaction() {
        let mut s = Store::new(100);
        for i in 0..5 {
            s.create(Kind::Node, "", node(&format!("n{i}"), None))
                .unwrap();
        }
        let p1 = s.list(Kind::Node, None, 2, None).unwrap();
        assert_eq!(p1.items.len(), 2);
        assert_eq!(p1.remaining, Some(3));
        // A change between pages is not seen by the pages of the same list.
        s.delete(Kind::Node, "", "n3").unwrap();
        let p2 = s
            .list(Kind::Node, None, 2, p1.continue_token.as_deref())
            .unwrap();
        let names: Vec<&str> = p2
            .items
            .iter()
            .map(|v| v["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["n2", "n3"]);
        assert_eq!(p2.rv, p1.rv);
        s.compact();
        let e = s
            .list(Kind::Node, None, 2, p2.continue_token.as_deref())
            .err()
            .unwrap();
        assert_eq!((e.code, e.reason), (410, "Expired"));
        assert!(s.list(Kind::Node, None, 0, Some("garbage")).is_err());
    }

    #[test]
    fn watches_resume_inside_the_window_and_get_410_before_it() {
        let mut s = Store::new(3);
        let start = s.resource_version();
        for i in 0..3 {
            s.create(Kind::Node, "", node(&format!("n{i}"), None))
                .unwrap();
        }
        assert_eq!(s.events_since(start).unwrap().len(), 3);
        s.create(Kind::Node, "", node("n3", None)).unwrap();
        let e = s.events_since(start).unwrap_err();
        assert_eq!(e.code, 410);
        assert_eq!(
            e.message,
            format!("too old resource version: {start} ({})", start + 1)
        );
        assert_eq!(s.events_since(start + 1).unwrap().len(), 3);
    }

    #[test]
    fn status_patches_keep_the_spec_and_noops_keep_the_version() {
        let mut s = Store::new(100);
        s.create(Kind::Node, "", node("a", Some("10.5.1.0/24")))
            .unwrap();
        let rv = s.resource_version();
        let p = br#"{"metadata":{"annotations":{"x":"1"}},"spec":{"unschedulable":true},"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#;
        let n = s
            .patch(Kind::Node, "", "a", Part::Status, PatchType::Strategic, p)
            .unwrap();
        assert_eq!(n["metadata"]["annotations"]["x"], "1");
        assert!(n["spec"].get("unschedulable").is_none());
        assert_eq!(n["spec"]["podCIDRs"], json!(["10.5.1.0/24"]));
        assert_eq!(n["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(s.resource_version(), rv + 1);
        s.patch(Kind::Node, "", "a", Part::Status, PatchType::Strategic, p)
            .unwrap();
        assert_eq!(s.resource_version(), rv + 1);
        assert_eq!(s.events_since(rv + 1).unwrap().len(), 0);
        // podCIDR may be set once, never changed.
        let e = s
            .patch(
                Kind::Node,
                "",
                "a",
                Part::Main,
                PatchType::Merge,
                br#"{"spec":{"podCIDR":"10.5.2.0/24","podCIDRs":null}}"#,
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        let e = s
            .patch(
                Kind::Node,
                "",
                "a",
                Part::Main,
                PatchType::Merge,
                br#"{"metadata":{"resourceVersion":"1"}}"#,
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
    }

    #[test]
    fn errors_are_worded_as_the_api_server_words_them() {
        assert_eq!(
            ApiError::not_found("nodes", "n1").status_json(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes \"n1\" not found","reason":"NotFound","details":{"name":"n1","kind":"nodes"},"code":404}"#
        );
        assert_eq!(
            ApiError::forbidden(
                "system:serviceaccount:kube-flannel:flannel",
                "patch",
                "nodes/status",
                Some("n1"),
                None
            )
            .message,
            r#"nodes "n1" is forbidden: User "system:serviceaccount:kube-flannel:flannel" cannot patch resource "nodes/status" in API group "" at the cluster scope"#
        );
        let mut s = Store::new(10);
        s.create(Kind::Node, "", node("a", None)).unwrap();
        assert_eq!(
            s.create(Kind::Node, "", node("a", None)).unwrap_err().code,
            409
        );
        assert_eq!(
            s.create(Kind::Node, "", json!({"metadata": {}}))
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            s.create(Kind::Node, "", node("b", Some("banana")))
                .unwrap_err()
                .reason,
            "Invalid"
        );
    }

    #[test]
    fn dual_stack_cidrs_are_kept_in_step() {
        let mut s = Store::new(10);
        let n = s
            .create(Kind::Node, "", json!({"metadata": {"name": "a"}, "spec": {"podCIDRs": ["fd00:1::/64", "10.5.1.0/24"]}}))
            .unwrap();
        assert_eq!(n["spec"]["podCIDR"], "fd00:1::/64");
        let e = s
            .create(Kind::Node, "", json!({"metadata": {"name": "b"}, "spec": {"podCIDRs": ["10.5.2.0/24", "10.5.3.0/24"]}}))
            .unwrap_err();
        assert_eq!(e.code, 422);
    }

    #[test]
    fn namespaced_kinds_live_in_their_namespace_and_go_with_it() {
        let mut s = Store::new(100);
        let pod = |name: &str| json!({"metadata": {"name": name}, "spec": {"nodeName": "n1"}});
        let e = s.create(Kind::Pod, "x", pod("a")).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "namespaces \"x\" not found")
        );
        let ns = s
            .create(Kind::Namespace, "", json!({"metadata": {"name": "x"}}))
            .unwrap();
        assert_eq!(ns["metadata"]["labels"][NAMESPACE_NAME_LABEL], "x");
        s.create(Kind::Namespace, "", json!({"metadata": {"name": "y"}}))
            .unwrap();
        // What a create says of a pod's status is the kubelet's to write, not the client's.
        let mut a = pod("a");
        a["status"] = json!({"podIP": "10.5.1.2"});
        let a = s.create(Kind::Pod, "x", a).unwrap();
        assert_eq!(a["status"], json!({"phase": "Pending"}));
        assert_eq!(a["metadata"]["namespace"], "x");
        s.create(Kind::Pod, "x", pod("b")).unwrap();
        s.create(Kind::Pod, "y", pod("a")).unwrap();
        let names = |p: &Page| -> Vec<String> {
            p.items
                .iter()
                .map(|v| {
                    format!(
                        "{}/{}",
                        v["metadata"]["namespace"].as_str().unwrap(),
                        name_of(v)
                    )
                })
                .collect()
        };
        let first = s.list(Kind::Pod, None, 2, None).unwrap();
        assert_eq!(names(&first), ["x/a", "x/b"]);
        let rest = s
            .list(Kind::Pod, None, 2, first.continue_token.as_deref())
            .unwrap();
        assert_eq!(names(&rest), ["y/a"]);
        assert_eq!(
            names(&s.list(Kind::Pod, Some("y"), 0, None).unwrap()),
            ["y/a"]
        );
        let st = s
            .patch(
                Kind::Pod,
                "x",
                "a",
                Part::Status,
                PatchType::Strategic,
                br#"{"status":{"podIPs":[{"ip":"10.5.1.2"}],"phase":"Running"}}"#,
            )
            .unwrap();
        assert_eq!(st["status"]["podIPs"], json!([{"ip": "10.5.1.2"}]));
        let rv = s.resource_version();
        s.delete(Kind::Namespace, "", "x").unwrap();
        let gone: Vec<(EventKind, Kind)> = s
            .events_since(rv)
            .unwrap()
            .iter()
            .map(|e| (e.kind, e.resource))
            .collect();
        assert_eq!(
            gone,
            [
                (EventKind::Deleted, Kind::Pod),
                (EventKind::Deleted, Kind::Pod),
                (EventKind::Deleted, Kind::Namespace)
            ]
        );
        assert_eq!(s.count(Kind::Pod), 1);
    }

    #[test]
    fn policies_get_the_api_servers_defaults() {
        let mut s = Store::new(10);
        s.create(Kind::Namespace, "", json!({"metadata": {"name": "x"}}))
            .unwrap();
        let p = s
            .create(
                Kind::NetworkPolicy,
                "x",
                json!({"metadata": {"name": "p"}, "spec": {"podSelector": {},
                    "ingress": [{"ports": [{"port": 80}]}], "egress": [{}]}}),
            )
            .unwrap();
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(p["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
        assert!(p.get("status").is_none());
        let q = s
            .create(
                Kind::NetworkPolicy,
                "x",
                json!({"metadata": {"name": "q"}, "spec": {"podSelector": {}, "egress": []}}),
            )
            .unwrap();
        assert_eq!(q["spec"]["policyTypes"], json!(["Ingress"]));
    }
}
