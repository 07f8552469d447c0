//! The Kubernetes API as flanneld uses it, through kube-rs: where the API server is (flags,
//! in-cluster configuration, kubeconfig), this node's name, Nodes listed in pages and watched,
//! the status PATCH, and what an error answer means.
//!
//! kube-rs builds the requests and carries them (TLS, credentials); the answers are read here:
//! the status and `Retry-After` of a refusal, the watch's lines one at a time, and a failed
//! connection named by its cause. Every request waits its turn after failures, so that a node
//! asks an API server in trouble at most about once per 30 s, or when it says to come back.
//! HTTP/1.1 only, as kube-rs's connector offers it: the watch has its own connection, so a
//! stalled watch does not hold up a GET or PATCH, and a dead connection is found by the read
//! timeout rather than by HTTP/2 pings.

use super::node::{null_as_default, NodeObject};
use conncause::{connection_cause, Peer};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use kube::api::{ListParams, Patch, PatchParams, WatchParams};
use kube::client::Body;
use kube::config::Kubeconfig;
use kube::core::WatchEvent;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::info;

/// Where a pod finds its service account, as client-go reads it.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Nodes per page of a list.
const PAGE: u32 = 500;
/// A watch asks the server to end it after this, and is then resumed from where it was.
const WATCH_TIMEOUT_S: u32 = 290;
/// After a failure the next request waits from this, doubling at each failure in a row...
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// ...up to this (client-go's reflector backs off to 30 s too).
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Failures further apart than this start the backoff from the beginning again.
const BACKOFF_RESET: Duration = Duration::from_secs(120);
/// The longest `Retry-After` taken as it is; a longer one is waited this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// Frames of an answer buffered ahead of its parser.
const PARSE_AHEAD: usize = 8;
/// Times a list whose continue token expired between its pages starts again at once.
const LIST_RESTARTS: usize = 3;

/// What a request was, for error messages: RBAC's verb and resource, and the object.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    pub verb: &'static str,
    pub resource: &'static str,
    pub name: Option<&'a str>,
}

impl fmt::Display for Op<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(n) = self.name {
            write!(f, " {n:?}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeError {
    /// The API server could not be reached, timed out or answered 429 or 5xx: try again later.
    Unavailable(String),
    /// 401: the API server does not accept the credentials (an expired token).
    Unauthenticated(String),
    /// 403: the account lacks the right to this verb on this resource.
    Denied {
        verb: &'static str,
        resource: &'static str,
        message: String,
    },
    NotFound(String),
    /// 410: what was asked for is older than the server keeps.
    Expired(String),
    /// Any other refusal, or an answer that is not what the API gives.
    Refused(String),
    /// No configuration to reach the API server with.
    Config(String),
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeError::Denied {
                verb,
                resource,
                message,
            } => write!(
                f,
                "the API server does not let this account {verb} {resource}: {message} (flanneld \
                 needs get, list and watch on nodes, patch on nodes/status and get on pods)"
            ),
            KubeError::Unavailable(m)
            | KubeError::Unauthenticated(m)
            | KubeError::NotFound(m)
            | KubeError::Expired(m)
            | KubeError::Refused(m)
            | KubeError::Config(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for KubeError {}

/// What an answer with HTTP status `code` means for `op`.
pub fn classify(op: Op<'_>, code: u16, message: &str) -> KubeError {
    match code {
        401 => KubeError::Unauthenticated(format!("{op}: {message} (401)")),
        403 => KubeError::Denied {
            verb: op.verb,
            resource: op.resource,
            message: message.to_string(),
        },
        404 => KubeError::NotFound(format!("{op}: {message}")),
        410 => KubeError::Expired(format!("{op}: {message}")),
        429 | 500..=599 => KubeError::Unavailable(format!("{op}: {message} ({code})")),
        _ => KubeError::Refused(format!("{op}: {message} ({code})")),
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

/// The message of an error answer: its Status's, else its text.
fn answer_message(body: &[u8], status: http::StatusCode) -> String {
    #[derive(Deserialize)]
    struct Status {
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Status>(body) {
        Ok(s) if !s.message.is_empty() => s.message,
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                status.canonical_reason().unwrap_or("").to_string()
            } else {
                text.chars().take(300).collect()
            }
        }
    }
}

/// The messages of an error's chain, each once.
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let t = e.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// How requests are spaced while they fail: each failure pushes the next request back,
/// from `FIRST_BACKOFF` doubling to `MAX_BACKOFF` with jitter, or as far as `Retry-After`
/// says when that is later.
#[derive(Debug, Default)]
struct Pace {
    not_before: Option<Instant>,
    backoff: Duration,
    last_failure: Option<Instant>,
}

impl Pace {
    fn failed(&mut self, retry_after: Option<Duration>) {
        let now = Instant::now();
        if self
            .last_failure
            .is_none_or(|t| now.duration_since(t) > BACKOFF_RESET)
        {
            self.backoff = Duration::ZERO;
        }
        self.backoff = if self.backoff.is_zero() {
            FIRST_BACKOFF
        } else {
            (self.backoff * 2).min(MAX_BACKOFF)
        };
        let half = self.backoff / 2;
        let jittered = half + half.mul_f64(fastrand::f64());
        let wait = jittered.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER));
        self.not_before = Some(now + wait);
        self.last_failure = Some(now);
    }

    fn passed(&mut self) {
        self.not_before = None;
    }
}

/// Why there is no in-cluster configuration.
#[derive(Debug, thiserror::Error)]
pub enum NotInCluster {
    #[error(
        "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not both set"
    )]
    NoService,
    #[error("the service account token {}: {source}", path.display())]
    Token {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the in-cluster configuration: {0}")]
    Kubeconfig(#[from] serde_json::Error),
}

/// client-go's in-cluster configuration as a kubeconfig: `https://$KUBERNETES_SERVICE_HOST:
/// $KUBERNETES_SERVICE_PORT`, the service account's token (read again as it rotates) and CA.
pub fn in_cluster_kubeconfig(
    host: Option<&str>,
    port: Option<&str>,
    dir: &Path,
) -> Result<kube::config::Kubeconfig, NotInCluster> {
    let (Some(host), Some(port)) = (
        host.filter(|h| !h.is_empty()),
        port.filter(|p| !p.is_empty()),
    ) else {
        return Err(NotInCluster::NoService);
    };
    let token = dir.join("token");
    if let Err(source) = std::fs::metadata(&token) {
        return Err(NotInCluster::Token {
            path: token,
            source,
        });
    }
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let mut cluster = json!({"server": format!("https://{host}:{port}")});
    let ca = dir.join("ca.crt");
    if ca.exists() {
        cluster["certificate-authority"] = ca.display().to_string().into();
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": cluster}],
        "users": [{"name": "service-account", "user": {"tokenFile": token.display().to_string()}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    }))?)
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

#[derive(Deserialize)]
struct NodeList {
    metadata: ListMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    items: Vec<NodeObject>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(rename = "continue", default)]
    continue_token: Option<String>,
}

/// The Kubernetes API as flanneld uses it: Nodes and one Pod.
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
    server: String,
    /// host:port of the server, for causes.
    addr: String,
    peer: Peer,
    /// Whose credentials the requests carry, and where they were given.
    credentials: String,
    pace: Arc<Mutex<Pace>>,
}

/// Where the CA, the client certificate and the credentials of `kc`'s current context come
/// from, for the words of a failure; `source` names the kubeconfig.
fn describe_kubeconfig(kc: &Kubeconfig, source: &str) -> (String, Option<String>, String) {
    let context = kc
        .current_context
        .as_deref()
        .and_then(|c| kc.contexts.iter().find(|n| n.name == c))
        .and_then(|n| n.context.as_ref());
    let cluster = context
        .and_then(|c| kc.clusters.iter().find(|n| n.name == c.cluster))
        .and_then(|n| n.cluster.as_ref());
    let user_name = context.and_then(|c| c.user.clone()).unwrap_or_default();
    let user = kc
        .auth_infos
        .iter()
        .find(|n| n.name == user_name)
        .and_then(|n| n.auth_info.as_ref());
    let ca = match cluster {
        Some(c) if c.certificate_authority.is_some() => format!(
            "the CA in {} (certificate-authority of {source})",
            c.certificate_authority.as_deref().unwrap_or_default()
        ),
        Some(c) if c.certificate_authority_data.is_some() => {
            format!("the CA in the certificate-authority-data of {source}")
        }
        _ => format!("this machine's trusted CAs ({source} names no certificate-authority)"),
    };
    let who = format!("user {user_name:?} of {source}");
    let client_cert = user.and_then(|u| {
        u.client_certificate
            .as_deref()
            .map(|p| format!("the client certificate {p} of {who}"))
            .or_else(|| {
                u.client_certificate_data
                    .as_ref()
                    .map(|_| format!("the client-certificate-data of {who}"))
            })
    });
    let credentials = match user {
        Some(u) if u.token.is_some() => format!("the token of {who}"),
        Some(u) if u.token_file.is_some() => format!(
            "the token in {} ({who})",
            u.token_file.as_deref().unwrap_or_default()
        ),
        Some(u) if u.exec.is_some() => format!(
            "the token of the exec command {:?} ({who})",
            u.exec
                .as_ref()
                .and_then(|e| e.command.clone())
                .unwrap_or_default()
        ),
        Some(u) if u.username.is_some() => format!(
            "the basic-auth user {:?} ({who})",
            u.username.as_deref().unwrap_or_default()
        ),
        Some(_) if client_cert.is_some() => client_cert.clone().unwrap_or_default(),
        _ => format!("no credentials ({who} has none)"),
    };
    (ca, client_cert, credentials)
}

const NODES: &str = "/api/v1/nodes";

/// The `host:port` a URL connects to, its scheme's port where it names none.
fn host_port(url: &http::Uri) -> String {
    match url.authority() {
        Some(a) if a.port().is_some() => a.to_string(),
        Some(a) => {
            let port = if url.scheme_str() == Some("http") {
                80
            } else {
                443
            };
            format!("{}:{port}", a.host())
        }
        None => url.to_string(),
    }
}

impl KubeClient {
    /// Where the API server is and how it is reached, from the flags as flanneld takes them:
    /// a kubeconfig, or the URL alone, or else the in-cluster configuration, or else
    /// `$KUBECONFIG` / `~/.kube/config`; with the words its CA and credentials are said in,
    /// and where its address comes from.
    async fn configure(
        api_url: Option<&str>,
        kubeconfig: Option<&Path>,
    ) -> Result<(kube::Config, (String, Option<String>, String), String), KubeError> {
        let options = kube::config::KubeConfigOptions::default();
        let cfg_err = |what: String| {
            move |e: kube::config::KubeconfigError| KubeError::Config(format!("{what}: {e}"))
        };
        Ok(match (api_url, kubeconfig) {
            (_, Some(path)) => {
                let what = format!("--kubeconfig-file {}", path.display());
                let kc = Kubeconfig::read_from(path).map_err(cfg_err(what.clone()))?;
                let described = describe_kubeconfig(&kc, &path.display().to_string());
                let config = kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(cfg_err(what))?;
                (
                    config,
                    described,
                    format!("the server of {}", path.display()),
                )
            }
            (Some(url), None) => (
                kube::Config::new(
                    url.parse()
                        .map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?,
                ),
                (
                    "this machine's trusted CAs (--kube-api-url without a kubeconfig)".into(),
                    None,
                    "no credentials (--kube-api-url without a kubeconfig)".into(),
                ),
                "--kube-api-url".into(),
            ),
            (None, None) => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
                let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
                match in_cluster_kubeconfig(
                    host.as_deref(),
                    port.as_deref(),
                    Path::new(SERVICE_ACCOUNT_DIR),
                ) {
                    Ok(kc) => {
                        let described = describe_kubeconfig(&kc, "the in-cluster configuration");
                        let config = kube::Config::from_custom_kubeconfig(kc, &options)
                            .await
                            .map_err(cfg_err("the in-cluster configuration".into()))?;
                        (
                            config,
                            described,
                            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT".into(),
                        )
                    }
                    Err(why) => {
                        let fail = |e: kube::config::KubeconfigError| {
                            KubeError::Config(format!(
                                "no --kubeconfig-file or --kube-api-url, {why}, and no \
                                 usable $KUBECONFIG or ~/.kube/config: {e}"
                            ))
                        };
                        let kc = Kubeconfig::read().map_err(fail)?;
                        let described = describe_kubeconfig(&kc, "$KUBECONFIG or ~/.kube/config");
                        let config = kube::Config::from_custom_kubeconfig(kc, &options)
                            .await
                            .map_err(fail)?;
                        (
                            config,
                            described,
                            "the server of $KUBECONFIG or ~/.kube/config".into(),
                        )
                    }
                }
            }
        })
    }

    /// From the flags as flanneld takes them: a kubeconfig (its server replaced by
    /// `--kube-api-url` when both are given), or the URL alone, or else the in-cluster
    /// configuration, or else `$KUBECONFIG` / `~/.kube/config`.
    pub async fn connect(
        api_url: Option<&str>,
        kubeconfig: Option<&Path>,
    ) -> Result<KubeClient, KubeError> {
        let (mut config, (ca, client_cert, credentials), mut address_from) =
            Self::configure(api_url, kubeconfig).await?;
        if let (Some(url), Some(_)) = (api_url, kubeconfig) {
            config.cluster_url = url
                .parse()
                .map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?;
            address_from = "--kube-api-url".into();
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
            pace: Arc::default(),
        })
    }

    /// The API server's URL, for log lines.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Whose credentials the requests carry, for log lines.
    pub fn credentials(&self) -> &str {
        &self.credentials
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A failed connection or a broken answer as the operator fixes it.
    fn transport_error(&self, op: Op<'_>, e: &(dyn std::error::Error + 'static)) -> KubeError {
        let cause = connection_cause(e, &self.peer, &self.addr)
            .unwrap_or_else(|| format!("{} at {}: {}", self.peer.what, self.addr, chain_text(e)));
        KubeError::Unavailable(format!("{op}: {cause}"))
    }

    /// Sends `req` when its turn comes; Ok for a 2xx answer, else what the answer means.
    async fn send(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<http::Response<Body>, KubeError> {
        let req = req.map_err(|e| KubeError::Refused(format!("{op}: {e}")))?;
        let not_before = self.pace().not_before;
        if let Some(t) = not_before {
            tokio::time::sleep_until(t.into()).await;
        }
        let res = match self.client.send(req.map(Body::from)).await {
            Ok(r) => r,
            Err(e) => {
                self.pace().failed(None);
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
                self.pace().failed(None);
                return Err(self.transport_error(op, &e));
            }
        };
        let message = answer_message(&body, status);
        let code = status.as_u16();
        let err = match code {
            401 => KubeError::Unauthenticated(format!(
                "{op}: the API server at {} does not accept {} ({code} {message}): an expired \
                 or revoked token, or a certificate it does not trust",
                self.addr, self.credentials
            )),
            429 | 500..=599 => KubeError::Unavailable(match wait {
                Some(w) => format!(
                    "{op}: {message} ({code}); the API server asks to come back in {} s",
                    w.as_secs()
                ),
                None => format!("{op}: {message} ({code})"),
            }),
            _ => classify(op, code, &message),
        };
        match err {
            KubeError::Unavailable(_)
            | KubeError::Unauthenticated(_)
            | KubeError::Denied { .. } => self.pace().failed(wait),
            _ => self.pace().passed(),
        }
        Err(err)
    }

    /// Notes a failure found after the answer began (a watch that broke), for the pace.
    fn stream_failed(&self) {
        self.pace().failed(None);
    }

    /// Notes a failure the caller found in an answer that was not an error (a watch that
    /// ended at once), so that the next request waits its turn.
    pub fn note_failure(&self) {
        self.stream_failed();
    }

    /// The answer to `req`, read as it arrives: its body goes frame by frame to a parser on a
    /// blocking thread, so that a page of 500 Nodes (megabytes of status) never sits whole in
    /// memory; what is kept is only what `T` takes of it.
    async fn request<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, KubeError> {
        let res = self.send(op, req).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(PARSE_AHEAD);
        let parser = tokio::task::spawn_blocking(move || {
            let frames = FrameReader {
                rx,
                frame: Vec::new(),
                at: 0,
            };
            serde_json::from_reader::<_, T>(std::io::BufReader::with_capacity(1 << 16, frames))
        });
        let mut body = res.into_body();
        let mut broken = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    let Ok(data) = f.into_data() else { continue };
                    // A parser that stopped (bad JSON) says why below.
                    if tx.send(data.to_vec()).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    broken = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let parsed = parser.await;
        if let Some(e) = broken {
            self.stream_failed();
            return Err(self.transport_error(op, &e));
        }
        match parsed {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(KubeError::Refused(format!(
                "{op}: the answer is not what the API gives: {e}"
            ))),
            Err(e) => Err(KubeError::Refused(format!("{op}: reading the answer: {e}"))),
        }
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
        let op = Op {
            verb: "get",
            resource: "pods",
            name: Some(pod),
        };
        let req = kube::core::Request::new(format!("/api/v1/namespaces/{ns}/pods"))
            .get(pod, &Default::default());
        let p: PodObject = self.request(op, req).await?;
        if p.spec.node_name.is_empty() {
            return Err(KubeError::Refused(format!(
                "pod {ns}/{pod} has no spec.nodeName"
            )));
        }
        Ok(p.spec.node_name)
    }

    pub async fn node(&self, name: &str) -> Result<NodeObject, KubeError> {
        let op = Op {
            verb: "get",
            resource: "nodes",
            name: Some(name),
        };
        self.request(
            op,
            kube::core::Request::new(NODES).get(name, &Default::default()),
        )
        .await
    }

    /// Every node, in pages, and the resourceVersion of the list. A continue token that
    /// expires between pages (the server compacted meanwhile) starts the list again.
    pub async fn list_nodes(&self) -> Result<(Vec<NodeObject>, String), KubeError> {
        let op = Op {
            verb: "list",
            resource: "nodes",
            name: None,
        };
        let mut restarts = 0;
        'list: loop {
            let mut nodes = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let lp = ListParams {
                    limit: Some(PAGE),
                    continue_token: token.clone(),
                    ..Default::default()
                };
                let page: NodeList = match self
                    .request(op, kube::core::Request::new(NODES).list(&lp))
                    .await
                {
                    Ok(p) => p,
                    Err(KubeError::Expired(m)) if token.is_some() && restarts < LIST_RESTARTS => {
                        restarts += 1;
                        info!("the list of the nodes expired between its pages ({m}); listing them from the start");
                        continue 'list;
                    }
                    Err(e) => return Err(e),
                };
                nodes.extend(page.items);
                match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t),
                    None => return Ok((nodes, page.metadata.resource_version)),
                }
            }
        }
    }

    /// The node events after `resource_version`, with bookmarks, until the server ends the
    /// watch (after about five minutes) or the connection breaks.
    pub async fn watch_nodes(
        &self,
        resource_version: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent<NodeObject>, KubeError>> + use<>, KubeError>
    {
        let op = Op {
            verb: "watch",
            resource: "nodes",
            name: None,
        };
        let wp = WatchParams {
            timeout: Some(WATCH_TIMEOUT_S),
            bookmarks: true,
            ..Default::default()
        };
        let req = kube::core::Request::new(NODES).watch(&wp, resource_version);
        let body = self.send(op, req).await?.into_body();
        let this = self.clone();
        let lines = futures::stream::unfold(
            (body, Vec::<u8>::new(), false),
            move |(mut body, mut buf, done)| {
                let this = this.clone();
                async move {
                    loop {
                        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = buf.drain(..=i).collect();
                            if line.iter().all(u8::is_ascii_whitespace) {
                                continue;
                            }
                            return Some((event(op, &line), (body, buf, done)));
                        }
                        if done {
                            return None;
                        }
                        match body.frame().await {
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    buf.extend_from_slice(&data);
                                }
                            }
                            Some(Err(e)) => {
                                this.stream_failed();
                                return Some((
                                    Err(this.transport_error(op, &e)),
                                    (body, Vec::new(), true),
                                ));
                            }
                            None => {
                                // A last line without its newline.
                                if buf.iter().all(u8::is_ascii_whitespace) {
                                    return None;
                                }
                                buf.push(b'\n');
                                return Some((
                                    event(op, &std::mem::take(&mut buf)),
                                    (body, Vec::new(), true),
                                ));
                            }
                        }
                    }
                }
            },
        );
        Ok(lines.boxed())
    }

    /// A strategic-merge PATCH of `nodes/<name>/status`.
    pub async fn patch_node_status(&self, name: &str, body: &Value) -> Result<(), KubeError> {
        let op = Op {
            verb: "patch",
            resource: "nodes/status",
            name: Some(name),
        };
        let req = kube::core::Request::new(NODES).patch_subresource(
            "status",
            name,
            &PatchParams::default(),
            &Patch::Strategic(body),
        );
        let _: Value = self.request(op, req).await?;
        Ok(())
    }
}

/// Frames of an answer handed on by the async side (None: the body ended), as a reader.
struct FrameReader {
    rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    frame: Vec<u8>,
    at: usize,
}

impl std::io::Read for FrameReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at >= self.frame.len() {
            match self.rx.blocking_recv() {
                Some(f) => {
                    self.frame = f;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.frame.len() - self.at);
        buf[..n].copy_from_slice(&self.frame[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// One line of a watch.
fn event(op: Op<'_>, line: &[u8]) -> Result<WatchEvent<NodeObject>, KubeError> {
    serde_json::from_slice(line).map_err(|e| {
        KubeError::Refused(format!(
            "{op}: an event that is not what the API gives: {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_verb_and_the_resource() {
        let op = Op {
            verb: "patch",
            resource: "nodes/status",
            name: Some("n1"),
        };
        let msg = r#"nodes "n1" is forbidden: User "system:serviceaccount:kube-flannel:flannel" cannot patch resource "nodes/status" in API group "" at the cluster scope"#;
        let e = classify(op, 403, msg);
        assert!(matches!(
            e,
            KubeError::Denied {
                verb: "patch",
                resource: "nodes/status",
                ..
            }
        ));
        let text = e.to_string();
        assert!(
            text.contains("patch nodes/status") && text.contains(msg),
            "{text}"
        );
        assert!(matches!(
            classify(op, 503, "down"),
            KubeError::Unavailable(_)
        ));
        assert!(matches!(classify(op, 410, "old"), KubeError::Expired(_)));
        assert!(matches!(classify(op, 422, "bad"), KubeError::Refused(_)));
    }

    #[test]
    fn the_in_cluster_configuration_is_client_go_s() {
        let dir = tempfile::tempdir().unwrap();
        assert!(in_cluster_kubeconfig(None, Some("443"), dir.path()).is_err());
        assert!(
            in_cluster_kubeconfig(Some("10.96.0.1"), Some("443"), dir.path())
                .unwrap_err()
                .to_string()
                .contains("token")
        );
        std::fs::write(dir.path().join("token"), "t0ken").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "").unwrap();
        let kc = in_cluster_kubeconfig(Some("10.96.0.1"), Some("443"), dir.path()).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some(dir.path().join("ca.crt").to_str().unwrap())
        );
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(
            user.token_file.as_deref(),
            Some(dir.path().join("token").to_str().unwrap())
        );
        let kc = in_cluster_kubeconfig(Some("fd00::1"), Some("6443"), dir.path()).unwrap();
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://[fd00::1]:6443")
        );
    }
}
