//! Where the API server is and how it is reached: a kubeconfig, a URL alone, the in-cluster
//! service account as client-go reads it; and the words its CA and credentials are said in
//! when a connection fails.

use crate::KubeError;
use kube::config::Kubeconfig;
use serde_json::json;
use std::path::Path;

/// Where a pod finds its service account, as client-go reads it.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

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

/// The `host:port` a URL connects to, its scheme's port where it names none.
pub(crate) fn host_port(url: &http::Uri) -> String {
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

/// Where the CA, the client certificate and the credentials are said to come from.
pub(crate) type Described = (String, Option<String>, String);

/// Where the API server is, as the program was told: a URL, a kubeconfig, both (the URL
/// replaces the kubeconfig's server) or neither; and the names the program's operator gives
/// them by, for messages.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub api_url: Option<&'a str>,
    pub kubeconfig: Option<&'a Path>,
    /// How the URL is given: `--kube-api-url`.
    pub api_url_flag: &'static str,
    /// How the kubeconfig is given: `--kubeconfig-file`.
    pub kubeconfig_flag: &'static str,
}

/// Where the API server is and how it is reached: a kubeconfig, or the URL alone, or else the
/// in-cluster configuration, or else `$KUBECONFIG` / `~/.kube/config`; with the words its CA
/// and credentials are said in, and where its address comes from.
pub(crate) async fn configure(
    src: &Source<'_>,
) -> Result<(kube::Config, Described, String), KubeError> {
    let (url_flag, kc_flag) = (src.api_url_flag, src.kubeconfig_flag);
    let options = kube::config::KubeConfigOptions::default();
    let cfg_err = |what: String| {
        move |e: kube::config::KubeconfigError| KubeError::Config(format!("{what}: {e}"))
    };
    Ok(match (src.api_url, src.kubeconfig) {
        (_, Some(path)) => {
            let what = format!("{kc_flag} {}", path.display());
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
                    .map_err(|e| KubeError::Config(format!("{url_flag} {url:?}: {e}")))?,
            ),
            (
                format!("this machine's trusted CAs ({url_flag} without a kubeconfig)"),
                None,
                format!("no credentials ({url_flag} without a kubeconfig)"),
            ),
            url_flag.into(),
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
                            "no {kc_flag} or {url_flag}, {why}, and no usable $KUBECONFIG or \
                             ~/.kube/config: {e}"
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

#[cfg(test)]
mod tests {
    use super::*;

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
