//! The requests: get, list in pages, watch, patch; each waits its turn after failures, and
//! each answer is read here (the status and `Retry-After` of a refusal, a list page as it
//! streams in, a watch's lines one at a time, a failed connection named by its cause).
//!
//! kube-rs builds the requests and carries them (TLS, credentials). HTTP/1.1 only, as kube-rs's
//! connector offers it: a watch has its own connection, so a stalled watch does not hold up a
//! GET or PATCH, and a dead connection is found by the read timeout rather than by HTTP/2 pings.

use crate::config::{configure, host_port, Source};
use crate::error::{answer_message, chain_text, classify, KubeError, Op};
use crate::pace::{Failure, Pace};
use crate::page::{ListMeta, PageReader};
use crate::resource::{null_as_default, Kind, Object, Selector, PODS};
use conncause::{connection_cause, Peer};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use kube::api::{ListParams, Patch, PatchParams, WatchParams};
use kube::client::Body;
use kube::core::WatchEvent;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::info;

/// Objects per page of a list.
const PAGE: u32 = 500;
/// A watch asks the server to end it after this, and is then resumed from where it was.
const WATCH_TIMEOUT_S: u32 = 290;
/// Times a list whose continue token expired between its pages starts again at once.
const LIST_RESTARTS: usize = 3;

/// A complete list: the objects, and the resourceVersion a watch resumes from.
#[derive(Debug, Clone)]
pub struct Listed<T> {
    pub items: Vec<T>,
    pub resource_version: String,
}

/// Where this node's name comes from: `NODE_NAME`, else the pod's `spec.nodeName`.
#[derive(Debug, Clone, Default)]
pub struct NodeEnv {
    pub node_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

impl NodeEnv {
    pub fn from_env() -> NodeEnv {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        NodeEnv {
            node_name: var("NODE_NAME"),
            pod_name: var("POD_NAME"),
            pod_namespace: var("POD_NAMESPACE"),
        }
    }
}

#[derive(Deserialize)]
struct PodObject {
    #[serde(default)]
    spec: PodSpec,
}

#[derive(Deserialize, Default)]
struct PodSpec {
    #[serde(rename = "nodeName", default, deserialize_with = "null_as_default")]
    node_name: String,
}

/// One API server, reached as the kubeconfig or the service account says; cheap to clone
/// (the clones share the connection pool and the pace).
#[derive(Clone)]
pub struct KubeClient {
    inner: Arc<Inner>,
    /// The rights the program needs, said beside a 403.
    needs: Option<&'static str>,
}

struct Inner {
    client: kube::Client,
    server: String,
    /// host:port of the server, for causes.
    addr: String,
    peer: Peer,
    /// Whose credentials the requests carry, and where they were given.
    credentials: String,
    pace: Mutex<Pace>,
}

impl KubeClient {
    /// A client for the API server `src` names: a kubeconfig (its server replaced by the URL
    /// when both are given), or the URL alone, or else the in-cluster configuration, or else
    /// `$KUBECONFIG` / `~/.kube/config`. Nothing is sent yet.
    pub async fn connect(src: &Source<'_>) -> Result<KubeClient, KubeError> {
        let (mut config, (ca, client_cert, credentials), mut address_from) = configure(src).await?;
        if let (Some(url), Some(_)) = (src.api_url, src.kubeconfig) {
            config.cluster_url = url
                .parse()
                .map_err(|e| KubeError::Config(format!("{} {url:?}: {e}", src.api_url_flag)))?;
            address_from = src.api_url_flag.into();
        }
        config.connect_timeout = Some(Duration::from_secs(5));
        let server = config.cluster_url.to_string();
        let addr = host_port(&config.cluster_url);
        let client = kube::Client::try_from(config)
            .map_err(|e| KubeError::Config(format!("a client for {server}: {e}")))?;
        let closed_hint = server
            .starts_with("http://")
            .then(|| format!("does it want TLS? {address_from} says http"));
        Ok(KubeClient {
            inner: Arc::new(Inner {
                client,
                server,
                addr,
                peer: Peer {
                    what: "the API server",
                    closed_hint,
                    address_from,
                    ca,
                    client_cert,
                },
                credentials,
                pace: Mutex::default(),
            }),
            needs: None,
        })
    }

    /// Says `rights` beside every 403 (`flanneld needs get, list and watch on nodes`).
    pub fn needing(mut self, rights: &'static str) -> KubeClient {
        self.needs = Some(rights);
        self
    }

    /// The API server's URL, for log lines.
    pub fn server(&self) -> &str {
        &self.inner.server
    }

    /// Whose credentials the requests carry, for log lines.
    pub fn credentials(&self) -> &str {
        &self.inner.credentials
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.inner.pace.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failed(&self, how: Failure) {
        self.pace().failed(Instant::now(), how, fastrand::f64());
    }

    /// A failed connection or a broken answer as the operator fixes it.
    fn transport_error(&self, op: Op<'_>, e: &(dyn std::error::Error + 'static)) -> KubeError {
        let cause = connection_cause(e, &self.inner.peer, &self.inner.addr).unwrap_or_else(|| {
            format!(
                "{} at {}: {}",
                self.inner.peer.what,
                self.inner.addr,
                chain_text(e)
            )
        });
        KubeError::Unavailable(format!("{op}: {cause}"))
    }

    /// Sends `req` when its turn comes; Ok for a 2xx answer, else what the answer means.
    async fn send(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<http::Response<Body>, KubeError> {
        let req = req.map_err(|e| KubeError::Refused(format!("{op}: {e}")))?;
        let wait = self.pace().wait(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let res = match self.inner.client.send(req.map(Body::from)).await {
            Ok(r) => r,
            Err(e) => {
                self.failed(Failure::Unanswered);
                return Err(self.transport_error(op, &e));
            }
        };
        let status = res.status();
        if status.is_success() {
            self.pace().passed();
            return Ok(res);
        }
        let wait = retry_after(res.headers());
        let body = match res.into_body().collect_bytes().await {
            Ok(b) => b,
            Err(e) => {
                self.failed(Failure::Unanswered);
                return Err(self.transport_error(op, &e));
            }
        };
        let message = answer_message(&body, status);
        let code = status.as_u16();
        let err = match code {
            401 => KubeError::Unauthenticated(format!(
                "{op}: the API server at {} does not accept {} ({code} {message}): an expired \
                 or revoked token, or a certificate it does not trust",
                self.inner.addr, self.inner.credentials
            )),
            429 | 500..=599 => KubeError::Unavailable(match wait {
                Some(w) => format!(
                    "{op}: {message} ({code}); the API server asks to come back in {} s",
                    w.as_secs()
                ),
                None => format!("{op}: {message} ({code})"),
            }),
            403 => KubeError::Denied {
                verb: op.verb,
                resource: op.resource.to_string(),
                message,
                needs: self.needs,
            },
            _ => classify(op, code, &message),
        };
        match (&err, wait) {
            (KubeError::Unavailable(_), Some(w)) => self.failed(Failure::ComeBackIn(w)),
            (
                KubeError::Unavailable(_)
                | KubeError::Unauthenticated(_)
                | KubeError::Denied { .. },
                _,
            ) => self.failed(Failure::Refused),
            _ => self.pace().passed(),
        }
        Err(err)
    }

    /// Notes a failure the caller found in an answer that was not an error (a watch that
    /// ended at once, an answer it could not use), so that the next request waits its turn.
    pub fn note_failure(&self) {
        self.failed(Failure::Refused);
    }

    /// The answer to `req`: one object, read whole.
    async fn request<T: DeserializeOwned>(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, KubeError> {
        let res = self.send(op, req).await?;
        let body = match res.into_body().collect_bytes().await {
            Ok(b) => b,
            Err(e) => {
                self.failed(Failure::Unanswered);
                return Err(self.transport_error(op, &e));
            }
        };
        serde_json::from_slice(&body).map_err(|e| {
            KubeError::Refused(format!("{op}: the answer is not what the API gives: {e}"))
        })
    }

    /// One page of a list, read as it arrives: each item parsed as soon as it is in, so that
    /// a page of 500 Nodes (megabytes of status) never sits whole in memory; what is kept is
    /// only what `T` takes of each.
    async fn page<T: Object>(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<(Vec<T>, ListMeta), KubeError> {
        let mut body = self.send(op, req).await?.into_body();
        let mut reader = PageReader::<T>::new(T::UNREAD);
        let refused = |e: String| {
            KubeError::Refused(format!("{op}: the answer is not what the API gives: {e}"))
        };
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(data) = f.into_data() {
                        reader.feed(&data).map_err(refused)?;
                    }
                }
                Err(e) => {
                    self.failed(Failure::Unanswered);
                    return Err(self.transport_error(op, &e));
                }
            }
        }
        reader.finish().map_err(refused)
    }

    /// This node's name: `NODE_NAME`, else the `spec.nodeName` of the pod `POD_NAME` in
    /// `POD_NAMESPACE`.
    pub async fn node_name(&self, env: &NodeEnv) -> Result<String, KubeError> {
        if let Some(n) = &env.node_name {
            return Ok(n.clone());
        }
        let (Some(pod), Some(ns)) = (&env.pod_name, &env.pod_namespace) else {
            return Err(KubeError::Config(
                "this node's name is unknown: set NODE_NAME, or POD_NAME and POD_NAMESPACE".into(),
            ));
        };
        let p: PodObject = self.get(PODS, Some(ns), pod).await?;
        if p.spec.node_name.is_empty() {
            return Err(KubeError::Refused(format!(
                "pod {ns}/{pod} has no spec.nodeName"
            )));
        }
        Ok(p.spec.node_name)
    }

    /// One object of `kind` by its name (and namespace, for a namespaced kind).
    pub async fn get<T: DeserializeOwned>(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<T, KubeError> {
        let op = Op {
            verb: "get",
            resource: kind.plural,
            name: Some(name),
        };
        let req =
            kube::core::Request::new(kind.collection(namespace)).get(name, &Default::default());
        self.request(op, req).await
    }

    /// Every object `selector` selects, in pages, and the resourceVersion of the list. A
    /// continue token that expires between pages (the server compacted meanwhile) starts the
    /// list again.
    pub async fn list<T: Object>(
        &self,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Listed<T>, KubeError> {
        let op = Op {
            verb: "list",
            resource: kind.plural,
            name: None,
        };
        let path = kind.collection(selector.namespace.as_deref());
        let mut restarts = 0;
        'list: loop {
            let mut items = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let lp = ListParams {
                    limit: Some(PAGE),
                    continue_token: token.clone(),
                    label_selector: selector.labels.clone(),
                    field_selector: selector.fields.clone(),
                    ..Default::default()
                };
                let (page, meta) = match self
                    .page::<T>(op, kube::core::Request::new(&path).list(&lp))
                    .await
                {
                    Ok(p) => p,
                    Err(KubeError::Expired(m)) if token.is_some() && restarts < LIST_RESTARTS => {
                        restarts += 1;
                        info!(
                            "the list of the {} expired between its pages ({m}); listing them \
                             from the start",
                            kind.plural
                        );
                        continue 'list;
                    }
                    Err(e) => return Err(e),
                };
                items.extend(page);
                match meta.continue_token.filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t),
                    None => {
                        return Ok(Listed {
                            items,
                            resource_version: meta.resource_version,
                        })
                    }
                }
            }
        }
    }

    /// One watch: the events after `resource_version` of the objects `selector` selects, with
    /// bookmarks, until the server ends it (after about five minutes) or the connection
    /// breaks. [`KubeClient::follow`] resumes it across those ends.
    pub async fn watch<T: Object>(
        &self,
        kind: Kind,
        selector: &Selector,
        resource_version: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent<T>, KubeError>> + Send + use<T>, KubeError>
    {
        let op = Op {
            verb: "watch",
            resource: kind.plural,
            name: None,
        };
        let wp = WatchParams {
            timeout: Some(WATCH_TIMEOUT_S),
            bookmarks: true,
            label_selector: selector.labels.clone(),
            field_selector: selector.fields.clone(),
            ..Default::default()
        };
        let req = kube::core::Request::new(kind.collection(selector.namespace.as_deref()))
            .watch(&wp, resource_version);
        let body = self.send(op, req).await?.into_body();
        let lines = WatchLines {
            client: self.clone(),
            plural: kind.plural,
            body,
            buf: Vec::new(),
            at: 0,
            done: false,
        };
        let lines = futures::stream::unfold(lines, |mut l| async move {
            let item = l.next_event().await?;
            Some((item, l))
        });
        Ok(lines.boxed())
    }

    /// A PATCH of the object `name` (of its `subresource`, such as `status`, when given); the
    /// object as the server returns it.
    pub async fn patch(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        patch: &Patch<Value>,
    ) -> Result<Value, KubeError> {
        let resource = match subresource {
            Some(s) => format!("{}/{s}", kind.plural),
            None => kind.plural.to_string(),
        };
        let op = Op {
            verb: "patch",
            resource: &resource,
            name: Some(name),
        };
        let request = kube::core::Request::new(kind.collection(namespace));
        let params = PatchParams::default();
        let req = match subresource {
            Some(s) => request.patch_subresource(s, name, &params, patch),
            None => request.patch(name, &params, patch),
        };
        self.request(op, req).await
    }
}

/// The seconds of a `Retry-After` header (the API server gives seconds, not a date).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

/// A watch's answer, one line at a time.
struct WatchLines {
    client: KubeClient,
    plural: &'static str,
    body: Body,
    /// What has come and is not read yet, from `at` on.
    buf: Vec<u8>,
    at: usize,
    /// The body ended or broke: what is left in `buf` is the last of it.
    done: bool,
}

impl WatchLines {
    async fn next_event<T: DeserializeOwned>(
        &mut self,
    ) -> Option<Result<WatchEvent<T>, KubeError>> {
        let op = Op {
            verb: "watch",
            resource: self.plural,
            name: None,
        };
        loop {
            let rest = &self.buf[self.at..];
            if let Some(k) = memchr::memchr(b'\n', rest) {
                let line = &rest[..k];
                self.at += k + 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(event(op, line));
            }
            if self.done {
                // A last line without its newline.
                let line = std::mem::take(&mut self.buf);
                let line = &line[self.at..];
                self.at = 0;
                return (!line.iter().all(u8::is_ascii_whitespace)).then(|| event(op, line));
            }
            // Only the start of a line is left: it goes to the front, once per frame.
            self.buf.drain(..self.at);
            self.at = 0;
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    self.client.failed(Failure::Unanswered);
                    self.done = true;
                    self.buf.clear();
                    return Some(Err(self.client.transport_error(op, &e)));
                }
                None => self.done = true,
            }
        }
    }
}

/// One line of a watch.
fn event<T: DeserializeOwned>(op: Op<'_>, line: &[u8]) -> Result<WatchEvent<T>, KubeError> {
    serde_json::from_slice(line).map_err(|e| {
        KubeError::Refused(format!(
            "{op}: an event that is not what the API gives: {e}"
        ))
    })
}
