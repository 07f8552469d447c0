//! The HTTP/1.1 side of the stand-in: one thread per connection, keep-alive, JSON bodies with
//! Content-Length, watch streams as chunked JSON lines, and the routes of each kind's
//! collection (all of it, or one namespace's) and objects (and their status), and the
//! discovery documents kubectl asks for.

use super::store::{name_of, ApiError, Event, Kind, Part, PatchType, Store, Stored};
use super::Shared;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest request head or body taken.
const MAX_REQUEST: usize = 16 << 20;
/// A watch without timeoutSeconds ends after this, as the API server's minimum request timeout.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub struct Request {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub raw_query: String,
    headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("1" | "true" | "True"))
    }
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one request; None at a clean end of the connection.
pub fn read_request(r: &mut impl BufRead) -> std::io::Result<Option<Request>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = r.read_until(b'\n', &mut head)?;
        if n == 0 {
            if head.is_empty() {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        // Blank lines before a request are allowed.
        if before == 0 && (head == b"\r\n" || head == b"\n") {
            head.clear();
            continue;
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            break;
        }
        if head.len() > MAX_REQUEST {
            return Err(std::io::Error::other("request head too long"));
        }
    }
    let mut raw_headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut raw_headers);
    parsed
        .parse(&head)
        .map_err(|e| std::io::Error::other(format!("bad request: {e}")))?;
    let method = parsed.method.unwrap_or_default().to_string();
    let target = parsed.path.unwrap_or_default();
    let (path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let query = raw_query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let mut req = Request {
        method,
        path: percent_decode(path),
        query,
        raw_query: raw_query.to_string(),
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut line = String::new();
            r.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other("bad chunk size"))?;
            if size == 0 {
                // Trailers up to the blank line.
                loop {
                    line.clear();
                    if r.read_line(&mut line)? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            if req.body.len() + size > MAX_REQUEST {
                return Err(std::io::Error::other("request body too long"));
            }
            let start = req.body.len();
            req.body.resize(start + size, 0);
            r.read_exact(&mut req.body[start..])?;
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(len) = req.header("content-length") {
        let len: usize = len
            .trim()
            .parse()
            .map_err(|_| std::io::Error::other("bad content-length"))?;
        if len > MAX_REQUEST {
            return Err(std::io::Error::other("request body too long"));
        }
        req.body.resize(len, 0);
        r.read_exact(&mut req.body)?;
    }
    Ok(Some(req))
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

fn respond(
    w: &mut impl Write,
    code: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
) -> std::io::Result<()> {
    respond_with(w, code, content_type, body, close, "")
}

/// `respond` with more header lines (each ending in CRLF).
fn respond_with(
    w: &mut impl Write,
    code: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
    headers: &str,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-cache, private\r\n{headers}",
        reason_phrase(code),
        body.len()
    );
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// `{"kind":K,"apiVersion":V,...}`: a stored object with its type, as single objects and
/// watch events carry it (list items do not).
fn typed(obj: &Stored, kind: Kind) -> String {
    let rest = obj.text().strip_prefix('{').unwrap_or("}");
    let sep = if rest == "}" { "" } else { "," };
    format!(
        r#"{{"kind":"{}","apiVersion":"{}"{sep}{rest}"#,
        kind.name(),
        kind.api_version()
    )
}

/// What a request asks for, in RBAC's terms.
struct Access<'a> {
    verb: &'static str,
    resource: &'static str,
    name: Option<&'a str>,
    namespace: Option<&'a str>,
}

enum Route<'a> {
    Discovery(Value),
    /// A kind's collection: all of it, or one namespace's.
    Collection(Kind, Option<&'a str>),
    /// One object ("" as the namespace of a cluster-scoped one), or its status.
    Object(Kind, &'a str, &'a str, Part),
    NotFound,
}

/// A discovery entry of a resource and its status subresource.
fn resource_entry(kind: Kind, verbs: &[&str], short: &[&str]) -> Value {
    json!({
        "name": kind.plural(), "singularName": kind.name().to_lowercase(),
        "namespaced": kind.namespaced(), "kind": kind.name(), "verbs": verbs, "shortNames": short
    })
}

fn status_entry(kind: Kind) -> Value {
    json!({
        "name": format!("{}/status", kind.plural()), "singularName": "",
        "namespaced": kind.namespaced(), "kind": kind.name(), "verbs": ["get", "patch", "update"]
    })
}

const ALL_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

fn route(path: &str) -> Route<'_> {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let networking = json!({
        "name": "networking.k8s.io",
        "versions": [{"groupVersion": "networking.k8s.io/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "networking.k8s.io/v1", "version": "v1"}
    });
    let kind = Kind::from_plural;
    match parts.as_slice() {
        ["version"] => Route::Discovery(json!({
            "major": "1", "minor": "30", "gitVersion": "v1.30.0", "gitCommit": "",
            "gitTreeState": "clean", "buildDate": "2024-04-17T17:27:03Z", "goVersion": "go1.22.2",
            "compiler": "gc", "platform": "linux/amd64"
        })),
        ["api"] => Route::Discovery(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]
        })),
        ["apis"] => Route::Discovery(
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [networking]}),
        ),
        ["apis", "networking.k8s.io"] => {
            let mut group = networking;
            group["kind"] = "APIGroup".into();
            group["apiVersion"] = "v1".into();
            Route::Discovery(group)
        }
        ["api", "v1"] => Route::Discovery(json!({
            "kind": "APIResourceList", "groupVersion": "v1",
            "resources": [
                resource_entry(Kind::Node, ALL_VERBS, &["no"]),
                status_entry(Kind::Node),
                resource_entry(Kind::Namespace, ALL_VERBS, &["ns"]),
                status_entry(Kind::Namespace),
                resource_entry(Kind::Pod, ALL_VERBS, &["po"]),
                status_entry(Kind::Pod),
            ]
        })),
        ["apis", "networking.k8s.io", "v1"] => Route::Discovery(json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "networking.k8s.io/v1",
            "resources": [resource_entry(Kind::NetworkPolicy, ALL_VERBS, &["netpol"])]
        })),
        ["api", "v1", "namespaces", name, "status"] => {
            Route::Object(Kind::Namespace, "", name, Part::Status)
        }
        ["api", "v1", plural] => match kind(plural) {
            Some(k) if k.group().is_empty() => Route::Collection(k, None),
            _ => Route::NotFound,
        },
        ["api", "v1", plural, name] => match kind(plural) {
            Some(k) if k.group().is_empty() && !k.namespaced() => {
                Route::Object(k, "", name, Part::Main)
            }
            _ => Route::NotFound,
        },
        ["api", "v1", "nodes", name, "status"] => Route::Object(Kind::Node, "", name, Part::Status),
        ["api", "v1", "namespaces", ns, plural] => match kind(plural) {
            Some(k) if k.group().is_empty() && k.namespaced() => Route::Collection(k, Some(ns)),
            _ => Route::NotFound,
        },
        ["api", "v1", "namespaces", ns, plural, name] => match kind(plural) {
            Some(k) if k.group().is_empty() && k.namespaced() => {
                Route::Object(k, ns, name, Part::Main)
            }
            _ => Route::NotFound,
        },
        ["api", "v1", "namespaces", ns, "pods", name, "status"] => {
            Route::Object(Kind::Pod, ns, name, Part::Status)
        }
        ["apis", "networking.k8s.io", "v1", "networkpolicies"] => {
            Route::Collection(Kind::NetworkPolicy, None)
        }
        ["apis", "networking.k8s.io", "v1", "namespaces", ns, "networkpolicies"] => {
            Route::Collection(Kind::NetworkPolicy, Some(ns))
        }
        ["apis", "networking.k8s.io", "v1", "namespaces", ns, "networkpolicies", name] => {
            Route::Object(Kind::NetworkPolicy, ns, name, Part::Main)
        }
        _ => Route::NotFound,
    }
}

/// Serves one connection until it closes, the client asks to close, or the server stops.
pub fn serve(stream: impl Read + Write, shared: &Shared, stopped: &AtomicBool) {
    let mut conn = BufReader::new(stream);
    while !stopped.load(Ordering::Relaxed) {
        let req = match read_request(&mut conn) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return,
        };
        let close = req
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        match handle(&req, shared, conn.get_mut(), stopped) {
            Ok(true) if !close => {}
            _ => return,
        }
    }
}

/// Answers one request; Ok(false) when the connection must end.
fn handle(
    req: &Request,
    shared: &Shared,
    w: &mut impl Write,
    stopped: &AtomicBool,
) -> std::io::Result<bool> {
    let route = route(&req.path);
    if matches!(route, Route::NotFound) {
        respond(
            w,
            404,
            "text/plain; charset=utf-8",
            b"404 page not found\n",
            false,
        )?;
        return Ok(true);
    }
    let principal = match shared.authenticate(req.header("authorization")) {
        Some(p) => p,
        None => {
            let e = ApiError::unauthorized();
            shared.log(req, "", "", e.code);
            respond(
                w,
                e.code,
                "application/json",
                e.status_json().as_bytes(),
                false,
            )?;
            return Ok(true);
        }
    };
    let overload = shared.faults().overload;
    if let Some(o) = overload {
        let e = ApiError::overloaded(o.code, o.retry_after);
        let header = o
            .retry_after
            .map(|s| format!("Retry-After: {s}\r\n"))
            .unwrap_or_default();
        shared.log(req, &principal.user, "", e.code);
        respond_with(
            w,
            e.code,
            "application/json",
            e.status_json().as_bytes(),
            false,
            &header,
        )?;
        return Ok(true);
    }
    let watch = req.flag("watch");
    let access = match (&route, req.method.as_str()) {
        (Route::Discovery(_), "GET") => None,
        (Route::Collection(kind, ns), "GET") => Some(Access {
            verb: if watch { "watch" } else { "list" },
            resource: kind.plural(),
            name: None,
            namespace: *ns,
        }),
        (Route::Collection(kind, ns), "POST") if ns.is_some() || !kind.namespaced() => {
            Some(Access {
                verb: "create",
                resource: kind.plural(),
                name: None,
                namespace: *ns,
            })
        }
        (Route::Object(kind, ns, name, part), m) => {
            let verb = match m {
                "GET" => "get",
                "PATCH" => "patch",
                "PUT" => "update",
                "DELETE" if *part == Part::Main => "delete",
                _ => "",
            };
            let resource: &'static str = match (part, kind) {
                (Part::Main, k) => k.plural(),
                (Part::Status, Kind::Node) => "nodes/status",
                (Part::Status, Kind::Namespace) => "namespaces/status",
                (Part::Status, _) => "pods/status",
            };
            (!verb.is_empty()).then_some(Access {
                verb,
                resource,
                name: Some(name),
                namespace: (!ns.is_empty()).then_some(*ns),
            })
        }
        _ => {
            let e = ApiError::method_not_allowed();
            shared.log(req, &principal.user, "", e.code);
            respond(
                w,
                e.code,
                "application/json",
                e.status_json().as_bytes(),
                false,
            )?;
            return Ok(true);
        }
    };
    let verb = access.as_ref().map(|a| a.verb).unwrap_or("get");
    if let Some(a) = &access {
        if !principal.allows(a.verb, a.resource) {
            let e = ApiError::forbidden(&principal.user, a.verb, a.resource, a.name, a.namespace);
            shared.log(req, &principal.user, verb, e.code);
            respond(
                w,
                e.code,
                "application/json",
                e.status_json().as_bytes(),
                false,
            )?;
            return Ok(true);
        }
    }
    if let (true, Route::Collection(kind, ns)) = (watch, &route) {
        // After a watch that ended as it should, the connection serves the next request, as
        // the API server's does.
        return stream_watch(req, shared, w, stopped, *kind, *ns, |code| {
            shared.log(req, &principal.user, verb, code)
        });
    }
    let answer = answer(req, &route, shared);
    let (code, body) = match answer {
        Ok((code, body)) => (code, body),
        Err(e) => (e.code, e.status_json()),
    };
    shared.log(req, &principal.user, verb, code);
    respond(w, code, "application/json", body.as_bytes(), false)?;
    Ok(true)
}

fn patch_type(content_type: Option<&str>) -> Result<PatchType, ApiError> {
    let ct = content_type.unwrap_or_default();
    match ct.split(';').next().unwrap_or_default().trim() {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/json-patch+json" => Ok(PatchType::Json),
        _ => Err(ApiError::unsupported_media_type(ct)),
    }
}

/// Only `metadata.name=<name>` is understood; other selectors are refused, not ignored.
fn name_selector(req: &Request) -> Result<Option<String>, ApiError> {
    if req.param("labelSelector").is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(
            "label selectors are not supported by this stand-in".into(),
        ));
    }
    match req.param("fieldSelector") {
        None | Some("") => Ok(None),
        Some(s) => match s.strip_prefix("metadata.name=") {
            Some(name) if !name.contains(',') => Ok(Some(name.to_string())),
            _ => Err(ApiError::bad_request(format!(
                "field label not supported: {s}"
            ))),
        },
    }
}

fn answer(req: &Request, route: &Route, shared: &Shared) -> Result<(u16, String), ApiError> {
    let mut store = shared.store();
    let body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("the object provided is not valid JSON: {e}"))
        })
    };
    match (route, req.method.as_str()) {
        (Route::Discovery(doc), _) => Ok((200, doc.to_string())),
        (Route::Collection(kind, ns), "GET") => {
            let (code, body, more) = list(req, &mut store, *kind, *ns)?;
            if more && req.param("continue").is_none_or(str::is_empty) {
                let mut faults = shared.faults();
                if std::mem::take(&mut faults.compact_after_first_page) {
                    store.compact();
                }
            }
            Ok((code, body))
        }
        (Route::Collection(kind, ns), "POST") => {
            let made = store.create(*kind, ns.unwrap_or_default(), body()?)?;
            shared.changed.notify_all();
            Ok((201, typed(&made, *kind)))
        }
        (Route::Object(kind, ns, name, _), "GET") => {
            Ok((200, typed(&*store.get(*kind, ns, name)?, *kind)))
        }
        (Route::Object(kind, ns, name, part), "PATCH") => {
            let patch_type = patch_type(req.header("content-type"))?;
            let n = store.patch(*kind, ns, name, *part, patch_type, &req.body)?;
            shared.changed.notify_all();
            Ok((200, typed(&n, *kind)))
        }
        (Route::Object(kind, ns, name, part), "PUT") => {
            let n = store.update(*kind, ns, name, *part, &req.body)?;
            shared.changed.notify_all();
            Ok((200, typed(&n, *kind)))
        }
        (Route::Object(Kind::Node, _, name, _), "DELETE") => {
            let gone = store.delete(Kind::Node, "", name)?;
            shared.changed.notify_all();
            let uid = gone
                .pointer("/metadata/uid")
                .cloned()
                .unwrap_or(Value::Null);
            Ok((
                200,
                format!(
                    r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Success","details":{{"name":{},"kind":"nodes","uid":{uid}}}}}"#,
                    Value::String(name.to_string())
                ),
            ))
        }
        (Route::Object(kind, ns, name, _), "DELETE") => {
            let gone = store.delete(*kind, ns, name)?;
            shared.changed.notify_all();
            Ok((200, typed(&gone, *kind)))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// A page of the list, and whether more follow.
fn list(
    req: &Request,
    store: &mut Store,
    kind: Kind,
    namespace: Option<&str>,
) -> Result<(u16, String, bool), ApiError> {
    let limit: usize = match req.param("limit") {
        None | Some("") => 0,
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?
            .max(0) as usize,
    };
    let only = name_selector(req)?;
    let token = req.param("continue").filter(|t| !t.is_empty());
    if let (Some(rv), Some("Exact")) = (
        req.param("resourceVersion"),
        req.param("resourceVersionMatch"),
    ) {
        let rv: u64 = rv.parse().map_err(|_| {
            ApiError::bad_request(format!("resourceVersion: Invalid value: {rv:?}"))
        })?;
        if rv != store.resource_version() {
            return Err(ApiError::too_old(rv, store.resource_version()));
        }
    }
    let page = match &only {
        // A name selector needs no paging: at most one item.
        Some(name) => {
            let rv = store.resource_version();
            let items = store
                .current(kind, namespace)
                .into_iter()
                .filter(|o| name_of(o) == name)
                .collect();
            super::store::Page {
                rv,
                items,
                continue_token: None,
                remaining: None,
            }
        }
        None => store.list(kind, namespace, limit, token)?,
    };
    let mut out = String::with_capacity(page.items.len() * 1024 + 128);
    out.push_str(&format!(
        r#"{{"kind":"{}List","apiVersion":"{}","metadata":{{"resourceVersion":""#,
        kind.name(),
        kind.api_version()
    ));
    out.push_str(&page.rv.to_string());
    out.push('"');
    if let Some(c) = &page.continue_token {
        out.push_str(r#","continue":""#);
        out.push_str(c);
        out.push('"');
    }
    if let Some(r) = page.remaining {
        out.push_str(&format!(r#","remainingItemCount":{r}"#));
    }
    out.push_str(r#"},"items":["#);
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item.text());
    }
    out.push_str("]}");
    Ok((200, out, page.continue_token.is_some()))
}

fn chunk(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    write!(w, "{:x}\r\n", data.len())?;
    w.write_all(data)?;
    w.write_all(b"\r\n")?;
    w.flush()
}

fn event_line(kind: &str, object: &str) -> String {
    format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n")
}

/// A watch: 200 with chunked JSON lines, from the requested resourceVersion on (or the
/// current objects as ADDED first when there is none), bookmarks when asked for, an ERROR
/// event with the 410 Status when the resourceVersion has left the window.
fn stream_watch(
    req: &Request,
    shared: &Shared,
    w: &mut impl Write,
    stopped: &AtomicBool,
    kind: Kind,
    namespace: Option<&str>,
    log: impl FnOnce(u16),
) -> std::io::Result<bool> {
    let bookmarks = req.flag("allowWatchBookmarks");
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let only = match name_selector(req) {
        Ok(o) => o,
        Err(e) => {
            log(e.code);
            respond(
                w,
                e.code,
                "application/json",
                e.status_json().as_bytes(),
                true,
            )?;
            return Ok(false);
        }
    };
    let requested = req.param("resourceVersion").unwrap_or_default();
    let from: Option<u64> = match requested {
        "" | "0" => None,
        rv => match rv.parse() {
            Ok(v) => Some(v),
            Err(_) => {
                let e = ApiError::bad_request(format!(
                    "resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
                ));
                log(e.code);
                respond(
                    w,
                    e.code,
                    "application/json",
                    e.status_json().as_bytes(),
                    true,
                )?;
                return Ok(false);
            }
        },
    };
    if let Some(rv) = from {
        let expired = shared.store().events_since(rv).err();
        if let Some(e) = expired.filter(|_| shared.faults().expired_watch_as_status) {
            log(e.code);
            respond(
                w,
                e.code,
                "application/json",
                e.status_json().as_bytes(),
                true,
            )?;
            return Ok(false);
        }
    }
    log(200);
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    let in_namespace = |v: &Value| {
        namespace
            .is_none_or(|ns| v.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns))
    };
    let wanted = |v: &Value| only.as_deref().is_none_or(|n| name_of(v) == n) && in_namespace(v);
    let mut cursor = {
        let store = shared.store();
        match from {
            None => {
                let mut batch = String::new();
                for n in store.current(kind, namespace).iter().filter(|n| wanted(n)) {
                    batch.push_str(&event_line("ADDED", &typed(n, kind)));
                }
                let rv = store.resource_version();
                drop(store);
                if !batch.is_empty() {
                    chunk(w, batch.as_bytes())?;
                }
                rv
            }
            Some(rv) => rv,
        }
    };
    let start = Instant::now();
    let every = shared.bookmark_interval();
    let mut last_bookmark = Instant::now();
    loop {
        if stopped.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let (events, now_rv): (Result<Vec<Event>, ApiError>, u64) = {
            let store = shared.store();
            let events = store.events_since(cursor);
            let rv = store.resource_version();
            if matches!(&events, Ok(e) if e.is_empty()) {
                let wait = Duration::from_millis(200).min(every);
                let (store, _) = shared
                    .changed
                    .wait_timeout(store, wait)
                    .unwrap_or_else(|e| e.into_inner());
                (store.events_since(cursor), store.resource_version())
            } else {
                (events, rv)
            }
        };
        match events {
            Err(e) => {
                chunk(w, event_line("ERROR", &e.status_json()).as_bytes())?;
                break;
            }
            Ok(events) => {
                let mut batch = String::new();
                for e in events
                    .iter()
                    .filter(|e| e.resource == kind && wanted(&e.object))
                {
                    batch.push_str(&event_line(e.kind.as_str(), &typed(&e.object, kind)));
                }
                if !batch.is_empty() {
                    chunk(w, batch.as_bytes())?;
                }
                // Everything up to now_rv was read under one lock: the watch is current to it.
                cursor = cursor.max(now_rv);
            }
        }
        if bookmarks && last_bookmark.elapsed() >= every {
            let line = event_line(
                "BOOKMARK",
                &format!(
                    r#"{{"kind":"{}","apiVersion":"{}","metadata":{{"resourceVersion":"{cursor}","creationTimestamp":null}},"spec":{{}},"status":{{}}}}"#,
                    kind.name(),
                    kind.api_version()
                ),
            );
            chunk(w, line.as_bytes())?;
            last_bookmark = Instant::now();
        }
        let limit = shared.faults().watch_limit.unwrap_or(timeout).min(timeout);
        if start.elapsed() >= limit {
            break;
        }
    }
    w.write_all(b"0\r\n\r\n")?;
    w.flush()?;
    Ok(true)
}
