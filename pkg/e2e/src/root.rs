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
    /// The machine as it is now; panics when `ip` or `iptables-save` cannot say, since two
    /// empty snapshots would compare equal whatever a test did.
    pub fn take() -> RootSnapshot {
        Self::take_with("ip", "iptables-save").unwrap_or_else(|e| panic!("{e}"))
    }

    /// The same, reading links with `ip` and rules with `iptables_save` (the programs given).
    pub fn take_with(ip: &str, iptables_save: &str) -> Result<RootSnapshot, String> {
        Ok(RootSnapshot {
            links: root_links(ip)?,
            netns: named_netns(),
            cni_files: ["/etc/cni", "/opt/cni"]
                .iter()
                .flat_map(|d| tree(Path::new(d)))
                .collect(),
            iptables: root_iptables(iptables_save)?,
        })
    }

    /// Ends `node` and asserts that it left nothing: no process from its directory, no cgroup,
    /// its host namespace gone, and the machine unchanged ([`RootSnapshot::assert_unchanged`]).
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

        self.assert_unchanged();
    }

    /// Asserts that the machine has no new link in its root namespace, no runtime-made netns,
    /// and the same /etc/cni, /opt/cni and root namespace's iptables as when this was taken.
    pub fn assert_unchanged(&self) {
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

/// The stdout of `program args`, which must exit with status 0.
fn output_of(program: &str, args: &[&str]) -> Result<String, String> {
    let shown = [program]
        .iter()
        .chain(args)
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("snapshot of the root namespace: running {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "snapshot of the root namespace: {shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn root_links(ip: &str) -> Result<BTreeSet<String>, String> {
    let out = output_of(ip, &["-j", "link", "show"])?;
    let links: serde_json::Value = serde_json::from_str(&out)
        .map_err(|e| format!("snapshot of the root namespace: {ip} -j link show: {e}: {out:?}"))?;
    let names: BTreeSet<String> = links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect();
    // Every namespace has lo: no name at all means the output was not a link list.
    if names.is_empty() {
        return Err(format!(
            "snapshot of the root namespace: {ip} -j link show listed no link: {out:?}"
        ));
    }
    Ok(names)
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
fn root_iptables(iptables_save: &str) -> Result<Vec<String>, String> {
    let out = output_of(iptables_save, &[])?;
    Ok(out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.split_once(" [") {
            Some((chain, _)) if l.starts_with(':') => chain.to_string(),
            _ => l.to_string(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::RootSnapshot;

    #[test]
    fn a_snapshot_fails_when_ip_fails() {
        let err = RootSnapshot::take_with("false", "true").unwrap_err();
        assert!(err.contains("false -j link show failed"), "{err}");
        let err = RootSnapshot::take_with("/nonexistent/ip", "true").unwrap_err();
        assert!(
            err.contains("running /nonexistent/ip -j link show"),
            "{err}"
        );
        // A program that succeeds but prints no link list is no snapshot either.
        let err = RootSnapshot::take_with("true", "true").unwrap_err();
        assert!(err.contains("true -j link show"), "{err}");
    }

    #[test]
    fn a_snapshot_fails_when_iptables_save_fails() {
        let err = RootSnapshot::take_with("ip", "false").unwrap_err();
        assert!(err.contains("false failed"), "{err}");
        let err = RootSnapshot::take_with("ip", "/nonexistent/iptables-save").unwrap_err();
        assert!(err.contains("running /nonexistent/iptables-save"), "{err}");
    }

    #[test]
    fn a_snapshot_of_this_machine_lists_its_loopback() {
        // `true` stands in for iptables-save, which needs root; ip link needs none.
        let snapshot = RootSnapshot::take_with("ip", "true").unwrap();
        assert!(snapshot.links.contains("lo"), "{snapshot:?}");
    }
}
