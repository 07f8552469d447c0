//! A throwaway node for the bridge's kernel tests: a host namespace, pods, a CNI_PATH with our
//! bridge and host-local, and a dataDir; with what a user would look at afterwards.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use testkit::{bin_dir, Invocation, PluginOutput, TestNs, GO_PLUGIN_DIR};

/// Our host-local, built with the workspace.
pub fn host_local() -> PathBuf {
    bin_dir().join("host-local")
}

/// An IPAM plugin that always fails with code 11.
const FAILING_IPAM: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"no addresses left (test IPAM)\"}'\nexit 1\n";

/// An IPAM plugin that answers with whatever is in the file next to it (`static-result.json`),
/// for results host-local would not give.
const STATIC_IPAM: &str = "#!/bin/sh\ncat >/dev/null\nif [ \"$CNI_COMMAND\" = ADD ]; then cat \"$(dirname \"$0\")/static-result.json\"; fi\necho \"$CNI_COMMAND $CNI_CONTAINERID\" >> \"$(dirname \"$0\")/static-calls\"\n";

pub struct Node {
    pub host: TestNs,
    /// CNI_PATH: our bridge, host-local, and the test IPAMs.
    pub bin: TempDir,
    pub data: TempDir,
}

impl Node {
    pub fn new() -> Node {
        let host = TestNs::new("bh");
        let bin = TempDir::new().unwrap();
        symlink(bin_dir().join("bridge"), bin.path().join("bridge")).unwrap();
        symlink(host_local(), bin.path().join("host-local")).unwrap();
        for (name, script) in [("failing-ipam", FAILING_IPAM), ("static-ipam", STATIC_IPAM)] {
            let p = bin.path().join(name);
            std::fs::write(&p, script).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Node {
            host,
            bin,
            data: TempDir::new().unwrap(),
        }
    }

    pub fn path(&self) -> String {
        self.bin.path().display().to_string()
    }

    /// A bridge config on 10.88.0.0/16 with host-local keeping its files in our dataDir.
    pub fn conf(&self, version: &str, extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": version,
            "name": "testnet",
            "type": "bridge",
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.88.0.0/16"}]],
                "dataDir": self.data.path().display().to_string(),
            }
        });
        merge(&mut c, extra);
        c
    }

    pub fn static_result(&self, result: Value) {
        std::fs::write(
            self.bin.path().join("static-result.json"),
            result.to_string(),
        )
        .unwrap();
    }

    pub fn static_calls(&self) -> String {
        std::fs::read_to_string(self.bin.path().join("static-calls")).unwrap_or_default()
    }

    pub fn invocation(&self, command: &str, pod: Option<&TestNs>, id: &str) -> Invocation {
        Invocation::at(self.bin.path().join("bridge"), command)
            .path(&self.path())
            .container_id(id)
            .netns(&pod.map(|p| p.path_str()).unwrap_or_default())
    }

    pub fn add(&self, pod: &TestNs, id: &str, conf: &Value) -> PluginOutput {
        self.invocation("ADD", Some(pod), id)
            .run_in_ns(&self.host, conf)
    }

    pub fn del(&self, pod: Option<&TestNs>, id: &str, conf: &Value) -> PluginOutput {
        self.invocation("DEL", pod, id).run_in_ns(&self.host, conf)
    }

    /// The Go reference bridge, with the Go host-local, on the same node.
    pub fn go(&self, command: &str, pod: Option<&TestNs>, id: &str) -> Invocation {
        Invocation::at(Path::new(GO_PLUGIN_DIR).join("bridge"), command)
            .path(GO_PLUGIN_DIR)
            .container_id(id)
            .netns(&pod.map(|p| p.path_str()).unwrap_or_default())
    }

    /// `iptables-save -t nat` of the host, without the comment lines that carry a date.
    pub fn nat(&self) -> String {
        self.save("iptables-save")
    }

    pub fn nat6(&self) -> String {
        self.save("ip6tables-save")
    }

    fn save(&self, tool: &str) -> String {
        self.host
            .run(tool, &["-t", "nat"])
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Our rules in the nat table: chains named `CNI-...` and what jumps to them.
    pub fn cni_nat_lines(&self) -> Vec<String> {
        self.nat()
            .lines()
            .filter(|l| l.contains("CNI-"))
            .map(str::to_string)
            .collect()
    }

    pub fn nft(&self, args: &[&str]) -> String {
        let mut full = vec!["list"];
        full.extend_from_slice(args);
        let out = self.host.try_run("nft", &full);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Links of the host namespace by kind (`veth`, `bridge`).
    pub fn links_of_kind(&self, kind: &str) -> Vec<Value> {
        self.host
            .ip_json(&["link", "show"])
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|l| l["linkinfo"]["info_kind"] == kind)
            .collect()
    }

    /// The addresses host-local holds for the test network.
    pub fn reserved(&self) -> Vec<String> {
        let dir = self.data.path().join("testnet");
        let mut ips: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default();
        ips.sort();
        ips
    }

    /// Asserts that nothing of any pod is left: no veth, no rule, no reserved address.
    /// A pair whose pod namespace was just removed goes when the kernel's asynchronous
    /// namespace cleanup gets to it, so veths are given a moment.
    pub fn assert_clean(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self.links_of_kind("veth").is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            self.links_of_kind("veth").is_empty(),
            "veths left: {:?}",
            self.links_of_kind("veth")
        );
        assert!(
            self.cni_nat_lines().is_empty(),
            "rules left:\n{}",
            self.nat()
        );
        assert!(
            !self.nat6().contains("CNI-"),
            "IPv6 rules left:\n{}",
            self.nat6()
        );
        assert!(
            self.reserved().is_empty(),
            "addresses still reserved: {:?}",
            self.reserved()
        );
    }
}

/// Merges `extra`'s keys into `base` (objects recursively; null removes a key).
pub fn merge(base: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        for (k, v) in e {
            match (b.get_mut(&k), v) {
                (_, Value::Null) => {
                    b.remove(&k);
                }
                (Some(existing), v @ Value::Object(_)) if existing.is_object() => {
                    merge(existing, v)
                }
                (_, v) => {
                    b.insert(k, v);
                }
            }
        }
    }
}

/// The addresses of `dev` in `ns` without the link-local IPv6 one the kernel adds.
pub fn addrs(ns: &TestNs, dev: &str) -> Vec<String> {
    ns.addresses(dev)
        .into_iter()
        .filter(|a| !a.starts_with("fe80:"))
        .collect()
}

/// Whether the kernel has bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING): a bridge is
/// made, then its `vlan_filtering` attribute set and read back. Only the kernel's refusal of
/// that attribute means it lacks the feature; any other failure of the probe fails the test.
pub fn vlan_filtering_supported() -> bool {
    let ns = TestNs::new("bv");
    ns.ip(&["link", "add", "br0", "type", "bridge"]);
    let set = ns.try_run(
        "ip",
        &[
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "vlan_filtering",
            "1",
        ],
    );
    if !set.status.success() {
        let err = String::from_utf8_lossy(&set.stderr);
        assert!(
            err.contains("Operation not supported"),
            "probing bridge VLAN filtering: `ip link set br0 type bridge vlan_filtering 1` \
             failed otherwise than the kernel refusing the attribute: {err}"
        );
        return false;
    }
    let br = link(&ns, "br0");
    assert_eq!(
        br["linkinfo"]["info_data"]["vlan_filtering"], 1,
        "probing bridge VLAN filtering: set, but the bridge reads back {br}"
    );
    true
}

/// What the VLAN tests need, for `testkit::runs_here`.
pub const VLAN_FILTERING: testkit::Need =
    testkit::Need::Kernel("bridge VLAN filtering in the kernel (CONFIG_BRIDGE_VLAN_FILTERING)");

/// A link's JSON as `ip -j -d link` shows it in `ns`.
pub fn link(ns: &TestNs, name: &str) -> Value {
    ns.link(name)
        .unwrap_or_else(|| panic!("no link {name} in {}", ns.name()))
}

/// The routes of `ns` as `dst via gw` (or `dst dev`), main table.
pub fn routes(ns: &TestNs, family: &str) -> Vec<String> {
    ns.ip_json(&[family, "route", "show"])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| match r["gateway"].as_str() {
            Some(gw) => format!("{} via {gw}", r["dst"].as_str().unwrap_or_default()),
            None => format!(
                "{} dev {}",
                r["dst"].as_str().unwrap_or_default(),
                r["dev"].as_str().unwrap_or_default()
            ),
        })
        .collect()
}

/// Every spec version the plugin answers.
pub const VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
