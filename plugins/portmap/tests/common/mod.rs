//! A throwaway node for portmap's kernel tests: a host namespace with forwarding on, a client
//! namespace on the host's underlay (a veth with addresses in both families), and pods set up
//! by the Go bridge and host-local plugins, whose result is portmap's prevResult as in a
//! conflist. Probes run in-process, inside the namespace they start from.
#![allow(dead_code)]

use cni_kernel::Netns;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use testkit::{unique_name, Invocation, PluginOutput, TestNs, GO_PLUGIN_DIR};

pub const NETWORK: &str = "pmnet";
pub const HOST_V4: &str = "192.168.77.1";
pub const CLIENT_V4: &str = "192.168.77.2";
pub const HOST_V6: &str = "fd77::1";
pub const CLIENT_V6: &str = "fd77::2";
pub const BRIDGE_V4: &str = "10.88.0.1";
pub const BRIDGE_V6: &str = "fd88::1";
pub const HTTP: u16 = 8080;
pub const DNS: u16 = 5353;
/// Long enough for a loaded machine, short enough that failing probes stay quick: a failing
/// TCP probe is refused at once and a failing UDP one meets an ICMP error.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

pub struct Node {
    pub host: TestNs,
    pub client: TestNs,
    pub bridge: String,
    ipam_dir: tempfile::TempDir,
}

impl Node {
    pub fn new() -> Node {
        assert!(
            testkit::go_plugins_available(),
            "the Go reference plugins must be installed in {GO_PLUGIN_DIR}"
        );
        let host = TestNs::new("pmh");
        let client = TestNs::new("pmc");
        for ns in [&host, &client] {
            // No duplicate address detection: addresses are usable at once.
            ns.run(
                "sysctl",
                &[
                    "-qw",
                    "net.ipv6.conf.all.accept_dad=0",
                    "net.ipv6.conf.default.accept_dad=0",
                ],
            );
        }
        host.run(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
            ],
        );
        // With br_netfilter, conntrack on the bridge would undo hairpin DNAT by itself; without
        // it, hairpin traffic works only through portmap's masquerading, which is what we test.
        if std::path::Path::new("/proc/sys/net/bridge").exists() {
            host.run(
                "sysctl",
                &[
                    "-qw",
                    "net.bridge.bridge-nf-call-iptables=0",
                    "net.bridge.bridge-nf-call-ip6tables=0",
                ],
            );
        }
        let up = unique_name("pmu");
        host.ip(&[
            "link",
            "add",
            &up,
            "type",
            "veth",
            "peer",
            "name",
            "up1",
            "netns",
            client.name(),
        ]);
        for (ns, dev, v4, v6) in [
            (&host, up.as_str(), HOST_V4, HOST_V6),
            (&client, "up1", CLIENT_V4, CLIENT_V6),
        ] {
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", dev]);
            ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"]);
            ns.ip(&["link", "set", dev, "up"]);
        }
        Node {
            host,
            client,
            bridge: unique_name("pmbr"),
            ipam_dir: tempfile::tempdir().expect("a temporary IPAM directory"),
        }
    }

    /// The Go bridge plugin's config: a gateway bridge, addresses from host-local.
    fn bridge_config(&self, dual: bool) -> Value {
        let mut ranges = vec![json!([{"subnet": "10.88.0.0/24"}])];
        let mut routes = vec![json!({"dst": "0.0.0.0/0"})];
        if dual {
            ranges.push(json!([{"subnet": "fd88::/64"}]));
            routes.push(json!({"dst": "::/0"}));
        }
        json!({
            "cniVersion": "1.0.0", "name": NETWORK, "type": "bridge",
            "bridge": self.bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
            "ipam": {"type": "host-local", "dataDir": self.ipam_dir.path(),
                     "ranges": ranges, "routes": routes}
        })
    }

    /// A pod attached to the bridge (dual stack when `dual`), its result as a runtime gets it.
    pub fn pod(&self, dual: bool) -> Pod {
        self.pod_with_id(dual, &unique_name("ctr"))
    }

    /// The same, with the container ID given.
    pub fn pod_with_id(&self, dual: bool, id: &str) -> Pod {
        let ns = TestNs::new("pmp");
        ns.run(
            "sysctl",
            &[
                "-qw",
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ],
        );
        let id = id.to_string();
        let result = Invocation::at(PathBuf::from(GO_PLUGIN_DIR).join("bridge"), "ADD")
            .path(GO_PLUGIN_DIR)
            .netns(&ns.path_str())
            .container_id(&id)
            .run_in_ns(&self.host, &self.bridge_config(dual))
            .ok();
        Pod {
            servers: Vec::new(),
            ns,
            id,
            result,
        }
    }

    /// Runs our portmap (`cmd`) for `pod` inside the host namespace.
    pub fn portmap(&self, cmd: &str, pod: &Pod, conf: &Value) -> PluginOutput {
        self.plugin(Invocation::new("portmap", cmd), pod, conf)
    }

    /// Runs the Go portmap the same way.
    pub fn go_portmap(&self, cmd: &str, pod: &Pod, conf: &Value) -> PluginOutput {
        self.plugin(
            Invocation::at(PathBuf::from(GO_PLUGIN_DIR).join("portmap"), cmd),
            pod,
            conf,
        )
    }

    fn plugin(&self, inv: Invocation, pod: &Pod, conf: &Value) -> PluginOutput {
        inv.netns(&pod.ns.path_str())
            .container_id(&pod.id)
            .run_in_ns(&self.host, conf)
    }

    /// Everything the host's firewall holds: iptables and ip6tables (all tables) and nft.
    pub fn firewall(&self) -> String {
        let mut all = String::new();
        for (prog, args) in [
            ("iptables-save", &[][..]),
            ("ip6tables-save", &[][..]),
            ("nft", &["list", "ruleset"][..]),
        ] {
            all += &String::from_utf8_lossy(&self.host.try_run(prog, args).stdout);
        }
        all
    }

    pub fn nat(&self, v6: bool) -> String {
        let prog = if v6 {
            "ip6tables-save"
        } else {
            "iptables-save"
        };
        self.host.run(prog, &["-t", "nat"])
    }

    /// nft's view of the cni_hostport table of a family, or "" when there is none.
    pub fn hostport_table(&self, family: &str) -> String {
        let out = self
            .host
            .try_run("nft", &["list", "table", family, "cni_hostport"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

pub struct Pod {
    // Dropped first: the servers must be gone before their namespace is.
    servers: Vec<Child>,
    pub ns: TestNs,
    pub id: String,
    pub result: Value,
}

impl Pod {
    /// The pod's address of a family, from its result.
    pub fn ip(&self, v6: bool) -> String {
        self.result["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["address"].as_str().unwrap())
            .find(|a| a.contains(':') == v6)
            .and_then(|a| a.split('/').next())
            .unwrap()
            .to_string()
    }

    /// Echo servers on TCP 80 and UDP 53, both families, until the pod is dropped.
    pub fn serve(&mut self) {
        for listen in [
            "TCP6-LISTEN:80,ipv6only=0,fork,reuseaddr",
            "UDP6-RECVFROM:53,ipv6only=0,fork",
        ] {
            let child = self
                .ns
                .command("socat")
                .args([listen, "PIPE"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("starting socat in the pod");
            self.servers.push(child);
        }
        // Readiness: both sockets are bound (bounded polling, not a timing assertion).
        for _ in 0..200 {
            let tcp = self.ns.run("ss", &["-Hlnt", "sport = :80"]);
            let udp = self.ns.run("ss", &["-Hlnu", "sport = :53"]);
            if !tcp.trim().is_empty() && !udp.trim().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the pod's echo servers did not start");
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

static PROBES: AtomicU32 = AtomicU32::new(0);

/// Whether an echo over `proto` to `dst`:`port`, sent from inside `from`, comes back.
pub fn reaches(from: &TestNs, proto: Proto, dst: &str, port: u16) -> bool {
    let ip: IpAddr = dst.parse().unwrap();
    let to = SocketAddr::new(ip, port);
    let token = format!(
        "probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let ns = Netns::open(from.path()).unwrap();
    ns.run(|| match proto {
        Proto::Tcp => tcp_echo(to, &token),
        Proto::Udp => udp_echo(to, &token),
    })
    .unwrap()
}

fn tcp_echo(to: SocketAddr, token: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&to, PROBE_TIMEOUT) else {
        return false;
    };
    s.set_read_timeout(Some(PROBE_TIMEOUT)).unwrap();
    if s.write_all(token.as_bytes()).is_err() {
        return false;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.len() < token.len() {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got == token.as_bytes()
}

/// A UDP echo from a fixed source port, so that conntrack sees one flow across probes.
pub fn udp_reaches_from(from: &TestNs, src_port: u16, dst: &str, port: u16) -> bool {
    let to = SocketAddr::new(dst.parse().unwrap(), port);
    let token = format!("probe-{}", PROBES.fetch_add(1, Ordering::Relaxed));
    let ns = Netns::open(from.path()).unwrap();
    ns.run(|| udp_echo_bound(to, src_port, &token)).unwrap()
}

fn udp_echo(to: SocketAddr, token: &str) -> bool {
    udp_echo_bound(to, 0, token)
}

fn udp_echo_bound(to: SocketAddr, src_port: u16, token: &str) -> bool {
    let any: IpAddr = if to.is_ipv4() {
        "0.0.0.0".parse().unwrap()
    } else {
        "::".parse().unwrap()
    };
    let s = UdpSocket::bind(SocketAddr::new(any, src_port)).unwrap();
    s.connect(to).unwrap();
    s.set_read_timeout(Some(PROBE_TIMEOUT)).unwrap();
    if s.send(token.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 256];
    matches!(s.recv(&mut buf), Ok(n) if &buf[..n] == token.as_bytes())
}

/// A portmap config as a conflist hands it over: the list's name and version, the runtime's
/// mappings, the previous plugin's result.
pub fn portmap_config(version: &str, extra: Value, mappings: Value, prev: Option<&Value>) -> Value {
    let mut conf = json!({
        "cniVersion": version, "name": NETWORK, "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": mappings},
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    if let Some(p) = prev {
        conf["prevResult"] = p.clone();
    }
    conf
}

/// hostPort 8080 to TCP 80 and 5353 to UDP 53.
pub fn web_and_dns() -> Value {
    json!([
        {"hostPort": HTTP, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": DNS, "containerPort": 53, "protocol": "udp"},
    ])
}

/// A result as our plugins print it: an empty `dns` object is left out.
pub fn without_empty_dns(result: &Value) -> Value {
    let mut r = result.clone();
    if r["dns"] == json!({}) {
        r.as_object_mut().unwrap().remove("dns");
    }
    r
}
