//! What the machine itself looks like to a test: its root network namespace, the named network
//! namespaces, `/etc/cni` and `/opt/cni`. Taken before a test and compared after it, read-only.

use crate::node::Node;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Netns names the runtimes give the namespaces they create (podman: netns-<uuid>, older: cni-*).
const RUNTIME_NETNS_PREFIXES: [&str; 2] = ["netns-", "cni-"];

#[derive(Debug, PartialEq, Eq)]
pub struct RootSnapshot {
    links: BTreeSet<String>,
    netns: BTreeSet<String>,
    cni_files: BTreeMap<String, String>,
    iptables: Vec<String>,
}

impl RootSnapshot {
    pub fn take() -> RootSnapshot {
        RootSnapshot {
            links: root_links(),
            netns: named_netns(),
            cni_files: ["/etc/cni", "/opt/cni"]
                .iter()
                .flat_map(|d| tree(Path::new(d)))
                .collect(),
            iptables: root_iptables(),
        }
    }

    /// Ends `node` and asserts that it left nothing: no process from its directory, no cgroup,
    /// its host namespace gone, and in the machine no new link, no runtime-made netns, no change
    /// in /etc/cni, /opt/cni or the root namespace's iptables.
    pub fn assert_clean_after(&self, node: Node) {
        let processes = node.processes();
        let cgroups = node.remove_cgroups();
        let ns_name = node.ns.name().to_string();
        drop(node);
        assert!(
            processes.is_empty(),
            "processes outlived the test: {processes:?}"
        );
        assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
        assert!(
            !Path::new("/run/netns").join(&ns_name).exists(),
            "the node's namespace {ns_name} is still there"
        );

        let now = RootSnapshot::take();
        let new_links: Vec<_> = now.links.difference(&self.links).collect();
        assert!(
            new_links.is_empty(),
            "new links in the root namespace: {new_links:?}"
        );
        let new_netns: Vec<_> = now
            .netns
            .difference(&self.netns)
            .filter(|n| RUNTIME_NETNS_PREFIXES.iter().any(|p| n.starts_with(p)))
            .collect();
        assert!(
            new_netns.is_empty(),
            "runtime network namespaces left: {new_netns:?}"
        );
        assert_eq!(
            now.cni_files, self.cni_files,
            "/etc/cni or /opt/cni changed"
        );
        assert_eq!(
            now.iptables, self.iptables,
            "the root namespace's iptables changed"
        );
    }
}

fn root_links() -> BTreeSet<String> {
    let out = Command::new("ip")
        .args(["-j", "link", "show"])
        .output()
        .expect("ip link");
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    links
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["ifname"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn named_netns() -> BTreeSet<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Every path under `dir` with its size and modification time.
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return out;
    };
    out.push((
        dir.display().to_string(),
        format!("{} {:?}", meta.len(), meta.modified().ok()),
    ));
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                out.extend(tree(&e.path()));
            }
        }
    }
    out
}

/// The root namespace's rules without the timestamps and packet counters that change by themselves.
fn root_iptables() -> Vec<String> {
    let Ok(out) = Command::new("iptables-save").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.split_once(" [") {
            Some((chain, _)) if l.starts_with(':') => chain.to_string(),
            _ => l.to_string(),
        })
        .collect()
}
