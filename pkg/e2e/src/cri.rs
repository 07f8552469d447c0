//! A small blocking client of containerd's CRI service, as kubelet drives it: the pod sandbox
//! calls over the runtime's Unix socket, each bounded in time.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Generated from proto/cri.proto and kept in the tree, so that building the suite needs no
/// protoc; the test below regenerates it and fails when the two differ.
pub mod api {
    include!("cri_api.rs");
}

use api::runtime_service_client::RuntimeServiceClient;

/// How long one call may take: RunPodSandbox runs the whole CNI ADD chain.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The session that runs containerd with its CRI plugin for a test (see the script's header).
pub const SCRIPT: &str = include_str!("scripts/cri.sh");
/// How long containerd's CRI plugin may take to serve: it loads the CNI config and images first.
pub const SERVE_TIMEOUT: Duration = Duration::from_secs(30);
/// The port the pod sandboxes of the tests serve on.
pub const SANDBOX_PORT: u16 = 8080;
/// The sandbox image's own command, so that a pod serves without a container in it.
pub const SANDBOX_HTTPD: [&str; 7] = ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"];

/// A pod sandbox called `name` in the cgroup `cgroup_parent`, mapping `host_port` on the node to
/// its [`SANDBOX_PORT`] over TCP: what kubelet sends for a pod with one hostPort.
pub fn sandbox_config(name: &str, cgroup_parent: &str, host_port: u16) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        port_mappings: vec![api::PortMapping {
            protocol: api::Protocol::Tcp as i32,
            container_port: SANDBOX_PORT.into(),
            host_port: host_port.into(),
            host_ip: String::new(),
        }],
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
        }),
        ..Default::default()
    }
}

/// The last lines of the log of the containerd whose directory is `dir`, for a failure message.
pub fn containerd_log(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    format!(
        "containerd's log:\n{}",
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl Cri {
    /// Connects to the CRI socket (the endpoint's URI is required by tonic but never dialled).
    pub fn connect(socket: &Path) -> Result<Cri, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting a tokio runtime: {e}"))?;
        let path: PathBuf = socket.to_path_buf();
        let channel = rt
            .block_on(async {
                Endpoint::from_static("http://[::1]:0")
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(CALL_TIMEOUT)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                        }
                    }))
                    .await
            })
            .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
        Ok(Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
        })
    }

    pub fn version(&mut self) -> Result<api::VersionResponse, tonic::Status> {
        let req = api::VersionRequest {
            version: "v1".into(),
        };
        self.rt
            .block_on(self.client.version(req))
            .map(|r| r.into_inner())
    }

    /// The sandbox's ID.
    pub fn run_pod_sandbox(
        &mut self,
        config: api::PodSandboxConfig,
    ) -> Result<String, tonic::Status> {
        let req = api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        self.rt
            .block_on(self.client.run_pod_sandbox(req))
            .map(|r| r.into_inner().pod_sandbox_id)
    }

    pub fn pod_sandbox_status(&mut self, id: &str) -> Result<api::PodSandboxStatus, tonic::Status> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        self.rt
            .block_on(self.client.pod_sandbox_status(req))
            .and_then(|r| {
                r.into_inner()
                    .status
                    .ok_or_else(|| tonic::Status::not_found("no status in the answer"))
            })
    }

    /// The process ID of the sandbox's first process, from the runtime's verbose status
    /// (containerd's `info` JSON): its `/proc/<pid>/ns/net` is the pod's network namespace.
    pub fn pod_sandbox_pid(&mut self, id: &str) -> Result<u32, String> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        let answer = self
            .rt
            .block_on(self.client.pod_sandbox_status(req))
            .map_err(|e| format!("PodSandboxStatus (verbose) of {id}: {e}"))?
            .into_inner();
        let info = answer.info.get("info").ok_or_else(|| {
            format!(
                "no \"info\" in the verbose status of {id}: {:?}",
                answer.info
            )
        })?;
        serde_json::from_str::<serde_json::Value>(info)
            .ok()
            .and_then(|v| v["pid"].as_u64())
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid != 0)
            .ok_or_else(|| format!("no pid in the verbose status of {id}: {info}"))
    }

    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), tonic::Status> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.rt
            .block_on(self.client.stop_pod_sandbox(req))
            .map(|_| ())
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), tonic::Status> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.rt
            .block_on(self.client.remove_pod_sandbox(req))
            .map(|_| ())
    }
}

/// Waits up to `limit` for the CRI service on `socket` to answer Version.
pub fn wait_until_serving(socket: &Path, limit: Duration) -> Result<Cri, String> {
    let start = std::time::Instant::now();
    let mut last = String::from("the socket never appeared");
    while start.elapsed() < limit {
        if socket.exists() {
            match Cri::connect(socket) {
                Ok(mut cri) => match cri.version() {
                    Ok(_) => return Ok(cri),
                    Err(e) => last = format!("Version: {e}"),
                },
                Err(e) => last = e,
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!(
        "the CRI service on {} did not answer within {limit:?}: {last}",
        socket.display()
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_client_is_what_the_proto_generates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = tempfile::tempdir().unwrap();
        tonic_prost_build::configure()
            .build_server(false)
            .emit_rerun_if_changed(false)
            .out_dir(out.path())
            .compile_protos(&[dir.join("proto/cri.proto")], &[dir.join("proto")])
            .expect("protoc (Debian's protobuf-compiler) compiles proto/cri.proto");
        let fresh = std::fs::read_to_string(out.path().join("runtime.v1.rs")).unwrap();
        assert!(
            fresh == include_str!("cri_api.rs"),
            "src/cri_api.rs is stale: copy {} over it",
            out.keep().join("runtime.v1.rs").display()
        );
    }
}
