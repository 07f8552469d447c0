//! The command line: where the API server is, this node's name, where metrics are served,
//! how often the table is read back besides the kernel's announcements; or `doctor`. Every
//! flag may be given as FLANNEL_NETPOL_<FLAG> instead (the systemd unit's environment file).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "flannel-netpol",
    about = "NetworkPolicy for the pods of this node of a flannel cluster, enforced in nftables",
    disable_version_flag = true
)]
pub struct Flags {
    /// The kubeconfig to reach the API server with; without it, the pod's service account,
    /// else $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE", env = "FLANNEL_NETPOL_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's URL (with --kubeconfig, in place of its server).
    #[arg(long, value_name = "URL", env = "FLANNEL_NETPOL_KUBE_API_URL")]
    pub kube_api_url: Option<String>,
    /// This node's name as the API knows it; else NODE_NAME, else the hostname.
    #[arg(long, value_name = "NAME", env = "FLANNEL_NETPOL_HOSTNAME_OVERRIDE")]
    pub hostname_override: Option<String>,
    /// Where /metrics and /healthz are served; empty for nowhere.
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "127.0.0.1:9095",
        env = "FLANNEL_NETPOL_METRICS_BIND_ADDRESS"
    )]
    pub metrics_bind_address: String,
    /// Seconds between readings of the table besides the kernel's announcements of changes
    /// (0: none).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        env = "FLANNEL_NETPOL_RESYNC"
    )]
    pub resync: u64,
    /// flanneld's subnet file, read for whether it masquerades pods' traffic (--ip-masq).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/run/flannel/subnet.env",
        env = "FLANNEL_NETPOL_SUBNET_FILE"
    )]
    pub subnet_file: std::path::PathBuf,
    /// text or json.
    #[arg(
        long,
        value_name = "FORMAT",
        default_value = "text",
        env = "FLANNEL_NETPOL_LOG_FORMAT"
    )]
    pub log_format: String,
    /// Prints the version and exits.
    #[arg(long)]
    pub version: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Lists the cluster once and prints each pod of this node's verdicts and whether the
    /// table holds them, writing nothing (with --fix, writes what is missing and looks again).
    Doctor {
        #[arg(long)]
        fix: bool,
    },
}

impl Flags {
    /// This node's name: the flag, else NODE_NAME, else the hostname.
    pub fn node_name(&self) -> Result<String, String> {
        if let Some(n) = self.hostname_override.as_ref().filter(|n| !n.is_empty()) {
            return Ok(n.clone());
        }
        if let Some(n) = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) {
            return Ok(n);
        }
        // The UTS hostname, as gethostname(2) gives it.
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| "no --hostname-override, no NODE_NAME, and no hostname".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_as_kube_network_policies_names_them() {
        let f = Flags::try_parse_from([
            "flannel-netpol",
            "--kubeconfig",
            "/etc/kube.conf",
            "--hostname-override",
            "node1",
            "--metrics-bind-address",
            "0.0.0.0:9095",
        ])
        .unwrap();
        assert_eq!(f.node_name().unwrap(), "node1");
        assert_eq!(f.metrics_bind_address, "0.0.0.0:9095");
        assert_eq!(f.resync, 60);
        let d = Flags::try_parse_from(["flannel-netpol", "doctor", "--fix"]).unwrap();
        assert!(matches!(d.command, Some(Command::Doctor { fix: true })));
        assert!(Flags::try_parse_from(["flannel-netpol", "--bogus"]).is_err());
    }
}
