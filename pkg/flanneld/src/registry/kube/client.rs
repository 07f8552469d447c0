//! The Kubernetes API as flanneld uses it, through kube-rs: where the API server is (flags,
//! in-cluster configuration, kubeconfig), this node's name, Nodes listed in pages and watched,
//! the status PATCH, and what an error answer means.

use super::node::{null_as_default, NodeObject};
use futures::{Stream, StreamExt};
use kube::api::{ListParams, Patch, PatchParams, WatchParams};
use kube::core::WatchEvent;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// Where a pod finds its service account, as client-go reads it.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Nodes per page of a list.
const PAGE: u32 = 500;
/// A watch asks the server to end it after this, and is then resumed from where it was.
const WATCH_TIMEOUT_S: u32 = 290;

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
    /// The API server could not be reached, timed out or answered 5xx: try again later.
    Unavailable(String),
    /// 401 or 403: the account lacks the right to this verb on this resource.
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
        401 | 403 => KubeError::Denied {
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

fn from_kube(op: Op<'_>, e: kube::Error) -> KubeError {
    match e {
        kube::Error::Api(r) => classify(op, r.code, &r.message),
        kube::Error::SerdeError(e) => {
            KubeError::Refused(format!("{op}: the answer is not what the API gives: {e}"))
        }
        other => KubeError::Unavailable(format!("{op}: {other}")),
    }
}

/// client-go's in-cluster configuration as a kubeconfig: `https://$KUBERNETES_SERVICE_HOST:
/// $KUBERNETES_SERVICE_PORT`, the service account's token (read again as it rotates) and CA.
pub fn in_cluster_kubeconfig(
    host: Option<&str>,
    port: Option<&str>,
    dir: &Path,
) -> Result<kube::config::Kubeconfig, String> {
    let (Some(host), Some(port)) = (
        host.filter(|h| !h.is_empty()),
        port.filter(|p| !p.is_empty()),
    ) else {
        return Err(
            "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT \
                    are not both set"
                .into(),
        );
    };
    let token = dir.join("token");
    if let Err(e) = std::fs::metadata(&token) {
        return Err(format!(
            "the service account token {}: {e}",
            token.display()
        ));
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
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": cluster}],
        "users": [{"name": "service-account", "user": {"tokenFile": token.display().to_string()}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    }))
    .map_err(|e| format!("the in-cluster configuration: {e}"))
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
}

const NODES: &str = "/api/v1/nodes";

impl KubeClient {
    /// From the flags as flanneld takes them: a kubeconfig (its server replaced by
    /// `--kube-api-url` when both are given), or the URL alone, or else the in-cluster
    /// configuration, or else `$KUBECONFIG` / `~/.kube/config`.
    pub async fn connect(
        api_url: Option<&str>,
        kubeconfig: Option<&Path>,
    ) -> Result<KubeClient, KubeError> {
        let options = kube::config::KubeConfigOptions::default();
        let cfg_err = |what: String| {
            move |e: kube::config::KubeconfigError| KubeError::Config(format!("{what}: {e}"))
        };
        let mut config = match (api_url, kubeconfig) {
            (_, Some(path)) => {
                let what = format!("--kubeconfig-file {}", path.display());
                let kc =
                    kube::config::Kubeconfig::read_from(path).map_err(cfg_err(what.clone()))?;
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(cfg_err(what))?
            }
            (Some(url), None) => kube::Config::new(
                url.parse()
                    .map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?,
            ),
            (None, None) => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
                let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
                match in_cluster_kubeconfig(
                    host.as_deref(),
                    port.as_deref(),
                    Path::new(SERVICE_ACCOUNT_DIR),
                ) {
                    Ok(kc) => kube::Config::from_custom_kubeconfig(kc, &options)
                        .await
                        .map_err(cfg_err("the in-cluster configuration".into()))?,
                    Err(why) => kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                        KubeError::Config(format!(
                            "no --kubeconfig-file or --kube-api-url, {why}, and no usable \
                             $KUBECONFIG or ~/.kube/config: {e}"
                        ))
                    })?,
                }
            }
        };
        if let (Some(url), Some(_)) = (api_url, kubeconfig) {
            config.cluster_url = url
                .parse()
                .map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?;
        }
        config.connect_timeout = Some(Duration::from_secs(5));
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)
            .map_err(|e| KubeError::Config(format!("a client for {server}: {e}")))?;
        Ok(KubeClient { client, server })
    }

    /// The API server's URL, for log lines.
    pub fn server(&self) -> &str {
        &self.server
    }

    async fn request<T: serde::de::DeserializeOwned>(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, KubeError> {
        let req = req.map_err(|e| KubeError::Refused(format!("{op}: {e}")))?;
        self.client.request(req).await.map_err(|e| from_kube(op, e))
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

    /// Every node, in pages, and the resourceVersion of the list.
    pub async fn list_nodes(&self) -> Result<(Vec<NodeObject>, String), KubeError> {
        let op = Op {
            verb: "list",
            resource: "nodes",
            name: None,
        };
        let mut nodes = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let lp = ListParams {
                limit: Some(PAGE),
                continue_token: token.take(),
                ..Default::default()
            };
            let page: NodeList = self
                .request(op, kube::core::Request::new(NODES).list(&lp))
                .await?;
            nodes.extend(page.items);
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => return Ok((nodes, page.metadata.resource_version)),
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
        let req = kube::core::Request::new(NODES)
            .watch(&wp, resource_version)
            .map_err(|e| KubeError::Refused(format!("{op}: {e}")))?;
        let stream = self
            .client
            .request_events::<NodeObject>(req)
            .await
            .map_err(|e| from_kube(op, e))?;
        Ok(StreamExt::map(stream, move |r| r.map_err(|e| from_kube(op, e))).boxed())
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
