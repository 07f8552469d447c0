//! The userspace tunnel against the real kernel, in namespaces of its own: two "nodes" on a
//! veth, pod addresses behind each tunnel; paired with itself, with Debian's wireguard-go and
//! with wireguard-go f67c862 (TUN offloads on its side: the wire must not change), over both
//! underlay families, each side starting the handshake in turn; configured through the UAPI
//! socket by our client and by `wg`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use testkit::{runs_here, unique_name, Need, TestNs};
use wireguard::uapi::{DeviceConfig, PeerConfig, UapiClient};
use wireguard::Key;

const WG_TOOLS: Need =
    Need::Installed("wireguard-go, wg and socat (Debian's wireguard-go, wireguard-tools, socat)");

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[derive(Clone, Debug)]
enum Impl {
    Ours,
    Go {
        program: PathBuf,
        which: &'static str,
    },
}

impl Impl {
    fn debian_go() -> Impl {
        Impl::Go {
            program: "/usr/bin/wireguard-go".into(),
            which: "Debian's wireguard-go",
        }
    }

    /// wireguard-go f67c862: `WIREGUARD_GO_F67C862`, else `../shared/reference/` beside the
    /// checkout.
    fn reference_go() -> Impl {
        let program = std::env::var_os("WIREGUARD_GO_F67C862")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../../shared/reference/wireguard-go-f67c862")
            });
        Impl::Go {
            program,
            which: "wireguard-go f67c862",
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Go { which, .. } => which,
        }
    }
}

/// A tunnel process, killed on drop (its TUN device goes with it).
struct Tunnel {
    child: Child,
    name: String,
    client: UapiClient,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.client.path());
    }
}

fn wait_for(what: &str, ceiling: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < ceiling,
            "gave up after {ceiling:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(kind: &Impl, ns: &TestNs, name: &str) -> Tunnel {
    let mut cmd = match kind {
        Impl::Ours => ns.command(env!("CARGO_BIN_EXE_flannel-wireguard")),
        Impl::Go { program, .. } => {
            let mut c = ns.command(program);
            c.arg("-f");
            c
        }
    };
    let child = cmd
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", kind.name()));
    let t = Tunnel {
        child,
        name: name.to_string(),
        client: UapiClient::new(name),
    };
    wait_for(
        &format!("{} to answer on {}", kind.name(), t.client.path().display()),
        Duration::from_secs(20),
        || t.client.is_alive(),
    );
    t
}

struct Node {
    ns: TestNs,
    underlay: String,
    pod_v4: String,
    pod_v6: String,
    key: Key,
}

/// Two namespaces on a veth with underlay addresses of one family; each holds a pod address
/// of each family (on `lo`: this kernel has no dummy devices), reached through the tunnel.
fn two_nodes(v6_underlay: bool) -> (Node, Node) {
    let a = TestNs::new("wga");
    let b = TestNs::new("wgb");
    let underlay = |n: u8| {
        if v6_underlay {
            format!("fd77::{n}")
        } else {
            format!("192.168.77.{n}")
        }
    };
    let plen = if v6_underlay { "64" } else { "24" };
    a.veth_to(
        &b,
        Some((
            &format!("{}/{plen}", underlay(1)),
            &format!("{}/{plen}", underlay(2)),
        )),
    );
    let nodes: Vec<Node> = [(a, 1u8), (b, 2u8)]
        .into_iter()
        .map(|(ns, n)| {
            let pod_v4 = format!("10.77.{n}.2");
            let pod_v6 = format!("fd00:77:{n}::2");
            ns.ip(&["addr", "add", &format!("{pod_v4}/32"), "dev", "lo"]);
            ns.ip(&["addr", "add", &format!("{pod_v6}/128"), "dev", "lo"]);
            Node {
                ns,
                underlay: underlay(n),
                pod_v4,
                pod_v6,
                key: Key::generate().unwrap(),
            }
        })
        .collect();
    let mut it = nodes.into_iter();
    (it.next().unwrap(), it.next().unwrap())
}

/// Configures `t` on `me` as flanneld does a node: key, port, one peer per remote node,
/// the device's address and a scope-link route for the whole network.
fn configure(t: &Tunnel, me: &Node, other: &Node, n: u8, m: u8) {
    let mut peer = PeerConfig::new(other.key.public());
    peer.endpoint = Some(SocketAddr::new(other.underlay.parse().unwrap(), 51820));
    peer.replace_allowed_ips = true;
    peer.allowed_ips = vec![
        format!("10.77.{m}.0/24").parse::<IpNetwork>().unwrap(),
        format!("fd00:77:{m}::/64").parse().unwrap(),
    ];
    t.client
        .set(&DeviceConfig {
            private_key: Some(me.key),
            listen_port: Some(51820),
            peers: vec![peer],
            ..Default::default()
        })
        .unwrap();
    let ns = &me.ns;
    ns.ip(&["addr", "add", &format!("10.77.{n}.0/32"), "dev", &t.name]);
    ns.ip(&[
        "addr",
        "add",
        &format!("fd00:77:{n}::/128"),
        "dev",
        &t.name,
        "nodad",
    ]);
    ns.ip(&["link", "set", &t.name, "mtu", "1420", "up"]);
    ns.ip(&[
        "route",
        "add",
        "10.77.0.0/16",
        "dev",
        &t.name,
        "scope",
        "link",
    ]);
    ns.ip(&["-6", "route", "add", "fd00:77::/32", "dev", &t.name]);
}

fn ping(from: &Node, to: &str) -> bool {
    let src = if to.contains(':') {
        &from.pod_v6
    } else {
        &from.pod_v4
    };
    from.ns
        .try_run("ping", &["-c", "1", "-W", "1", "-I", src, to])
        .status
        .success()
}

/// Ours on one node, `other` on the other, over an IPv6 underlay or not; the first ping goes
/// from ours or from the other (the side that starts the handshake). Pings of both pod
/// families both ways, 8 MB of TCP each way compared at the far end, and both ends' view of
/// the peer as `wg show` gives it.
fn pods_talk(other: &Impl, v6: bool, ours_first: bool) {
    let case = format!(
        "ours <-> {} over IPv{}, {} starting",
        other.name(),
        if v6 { 6 } else { 4 },
        if ours_first { "ours" } else { "the other" }
    );
    let (a, b) = two_nodes(v6);
    let ta = start(&Impl::Ours, &a.ns, &unique_name("wgt"));
    let tb = start(other, &b.ns, &unique_name("wgt"));
    configure(&ta, &a, &b, 1, 2);
    configure(&tb, &b, &a, 2, 1);
    let mut pings = vec![
        (&a, &b, &b.pod_v4),
        (&a, &b, &b.pod_v6),
        (&b, &a, &a.pod_v4),
        (&b, &a, &a.pod_v6),
    ];
    if !ours_first {
        pings.rotate_left(2);
    }
    for (from, to, dest) in pings {
        wait_for(
            &format!(
                "{case}: ping from {} to {dest} ({})",
                from.underlay, to.underlay
            ),
            Duration::from_secs(20),
            || ping(from, dest),
        );
    }
    testkit::bulk::tcp_transfer(&a.ns, &b.ns, &b.pod_v4, 8 << 20);
    testkit::bulk::tcp_transfer(&b.ns, &a.ns, &a.pod_v6, 8 << 20);
    for (t, other) in [(&ta, &b), (&tb, &a)] {
        let state = t.client.get().unwrap();
        assert_eq!(state.listen_port, 51820, "{case}");
        let peer = &state.peers[0];
        assert_eq!(peer.public_key, other.key.public(), "{case}");
        assert!(peer.last_handshake.is_some(), "{case}: {peer:?}");
        assert!(
            peer.rx_bytes > 8_000_000 && peer.tx_bytes > 8_000_000,
            "{case}: {peer:?}"
        );
        let dump = Command::new("wg")
            .args(["show", &t.name, "dump"])
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&dump.stdout);
        assert!(
            dump.contains(&other.key.public().to_base64()),
            "{case}: {dump}"
        );
    }
}

fn interop(other: &Impl) {
    for v6 in [false, true] {
        for ours_first in [true, false] {
            pods_talk(other, v6, ours_first);
        }
    }
}

#[test]
fn pods_talk_across_our_tunnel_over_both_underlays() {
    if !runs_here(have("wg") && have("socat"), WG_TOOLS) {
        return;
    }
    pods_talk(&Impl::Ours, false, true);
    pods_talk(&Impl::Ours, true, true);
}

#[test]
fn ours_and_debian_s_wireguard_go_talk_both_ways_over_both_underlays() {
    if !runs_here(
        have("wireguard-go") && have("wg") && have("socat"),
        WG_TOOLS,
    ) {
        return;
    }
    interop(&Impl::debian_go());
}

#[test]
fn ours_and_wireguard_go_f67c862_talk_both_ways_over_both_underlays() {
    let reference = Impl::reference_go();
    let Impl::Go { program, .. } = &reference else {
        unreachable!()
    };
    let there = program.is_file();
    let need = format!(
        "wireguard-go f67c862 at {} (WIREGUARD_GO_F67C862 names another place)",
        program.display()
    );
    if !runs_here(have("wg") && have("socat"), WG_TOOLS) || !runs_here(there, Need::Outside(&need))
    {
        return;
    }
    interop(&reference);
}

#[test]
fn wg_sets_and_shows_our_device_and_bad_requests_are_refused() {
    if !runs_here(have("wg"), WG_TOOLS) {
        return;
    }
    let ns = TestNs::new("wgs");
    let t = start(&Impl::Ours, &ns, &unique_name("wgt"));
    let private = Key::generate().unwrap();
    let peer = Key::generate().unwrap().public();
    let psk = Key::generate().unwrap();
    let keyfile = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keyfile.path(), private.to_base64()).unwrap();
    let pskfile = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(pskfile.path(), psk.to_base64()).unwrap();
    let wg = |args: &[&str]| {
        let out = Command::new("wg").args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, msg) = wg(&[
        "set",
        &t.name,
        "private-key",
        &keyfile.path().display().to_string(),
        "listen-port",
        "51999",
        "peer",
        &peer.to_base64(),
        "preshared-key",
        &pskfile.path().display().to_string(),
        "endpoint",
        "192.0.2.9:51820",
        "persistent-keepalive",
        "25",
        "allowed-ips",
        "10.9.0.0/24,fd00:9::/64",
    ]);
    assert!(ok, "{msg}");
    let (_, conf) = wg(&["showconf", &t.name]);
    for line in [
        format!("PrivateKey = {}", private.to_base64()),
        "ListenPort = 51999".to_string(),
        format!("PublicKey = {}", peer.to_base64()),
        format!("PresharedKey = {}", psk.to_base64()),
        "AllowedIPs = 10.9.0.0/24, fd00:9::/64".to_string(),
        "Endpoint = 192.0.2.9:51820".to_string(),
        "PersistentKeepalive = 25".to_string(),
    ] {
        assert!(conf.contains(&line), "missing {line:?} in:\n{conf}");
    }
    // Our client reads the same.
    let state = t.client.get().unwrap();
    assert_eq!(state.private_key, Some(private));
    assert_eq!(state.peers[0].preshared_key, Some(psk));
    assert_eq!(state.peers[0].persistent_keepalive, 25);

    // An allowed IP moves to the peer that claims it last; a peer removed is gone.
    let other = Key::generate().unwrap().public();
    assert!(
        wg(&[
            "set",
            &t.name,
            "peer",
            &other.to_base64(),
            "allowed-ips",
            "10.9.0.0/24"
        ])
        .0
    );
    let state = t.client.get().unwrap();
    let first = state.peers.iter().find(|p| p.public_key == peer).unwrap();
    assert_eq!(
        first.allowed_ips,
        vec!["fd00:9::/64".parse::<IpNetwork>().unwrap()]
    );
    assert!(wg(&["set", &t.name, "peer", &peer.to_base64(), "remove"]).0);
    let state = t.client.get().unwrap();
    assert_eq!(
        state.peers.iter().map(|p| p.public_key).collect::<Vec<_>>(),
        vec![other]
    );

    // A port another socket holds is refused with the errno, and the device keeps its own.
    let _holder = ns.run_inside(|| std::net::UdpSocket::bind("0.0.0.0:51998").unwrap());
    let (ok, msg) = wg(&["set", &t.name, "listen-port", "51998"]);
    assert!(!ok, "{msg}");
    assert!(
        msg.contains("Address already in use") || msg.contains("in use"),
        "{msg}"
    );
    assert_eq!(t.client.get().unwrap().listen_port, 51999);
}

#[test]
fn the_tunnel_ends_and_removes_its_socket_when_its_interface_is_deleted() {
    let ns = TestNs::new("wgd");
    let mut t = start(&Impl::Ours, &ns, &unique_name("wgt"));
    // A second process for the same device is refused while the first serves it.
    let second = ns
        .command(env!("CARGO_BIN_EXE_flannel-wireguard"))
        .arg(&t.name)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("serves device"));
    ns.ip(&["link", "del", &t.name]);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = t.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the tunnel outlived its interface"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    assert!(!Path::new(t.client.path()).exists());
}

#[test]
fn a_tunnel_is_started_once_and_again_after_it_ended() {
    let ns = TestNs::new("wgu");
    let name = unique_name("wgt");
    let dir = std::path::PathBuf::from(wireguard::uapi::SOCKET_DIR);
    let log = tempfile::NamedTempFile::new().unwrap();
    let program = Path::new(env!("CARGO_BIN_EXE_flannel-wireguard"));
    let launcher = wireguard::supervise::Launcher {
        program,
        args: &[],
        log: Some(log.path()),
    };
    let ensure = || {
        ns.run_inside(|| {
            wireguard::supervise::ensure_running(&name, &dir, &launcher, Duration::from_secs(20))
                .unwrap()
        })
    };
    let pid_of = || {
        let out = Command::new("pgrep")
            .args(["-f", &format!("flannel-wireguard {name}$")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (client, started) = ensure();
    assert!(started);
    let first = pid_of();
    assert!(!first.is_empty(), "no tunnel process for {name}");
    // Its own session: not in the test's process group.
    let sid = std::fs::read_to_string(format!("/proc/{first}/stat")).unwrap();
    let fields: Vec<&str> = sid.rsplit_once(')').unwrap().1.split_whitespace().collect();
    assert_eq!(
        fields[3], first,
        "session id of the tunnel (fields: {fields:?})"
    );
    assert!(
        ns.link(&name).is_some(),
        "its TUN device is in the namespace"
    );
    let (_, started) = ensure();
    assert!(!started, "a live tunnel is not started twice");
    assert_eq!(pid_of(), first);
    // Ended (SIGTERM), it removes its socket, and the next call starts a new one.
    Command::new("kill").arg(&first).status().unwrap();
    wait_for("the tunnel to end", Duration::from_secs(20), || {
        !client.path().exists()
    });
    let (_, started) = ensure();
    assert!(started);
    let second = pid_of();
    assert!(!second.is_empty() && second != first);
    Command::new("kill").arg(&second).status().unwrap();
    wait_for("the second tunnel to end", Duration::from_secs(20), || {
        !client.path().exists()
    });
    assert!(std::fs::read_to_string(log.path())
        .unwrap()
        .contains("stopped: signal 15"));
}

/// The socket directory is shared by every network namespace: a tunnel of the same name left
/// in another one (a deleted node, a container not cleaned up) is not taken for this
/// namespace's. Ours is started, takes the socket over, and the other runs on.
#[test]
fn a_tunnel_of_another_namespace_is_not_taken_for_this_one_s() {
    let (there, here) = (TestNs::new("wgo"), TestNs::new("wgh"));
    let name = unique_name("wgt");
    let foreign = start(&Impl::Ours, &there, &name);
    let dir = std::path::PathBuf::from(wireguard::uapi::SOCKET_DIR);
    let log = tempfile::NamedTempFile::new().unwrap();
    let launcher = wireguard::supervise::Launcher {
        program: Path::new(env!("CARGO_BIN_EXE_flannel-wireguard")),
        args: &[],
        log: Some(log.path()),
    };
    let seen = here.run_inside(|| foreign.client.server());
    assert!(
        matches!(seen, wireguard::uapi::Server::Elsewhere(Some(_))),
        "{seen:?}"
    );
    let (client, started) = here.run_inside(|| {
        wireguard::supervise::ensure_running(&name, &dir, &launcher, Duration::from_secs(20))
            .unwrap()
    });
    let ours = match here.run_inside(|| client.server()) {
        wireguard::uapi::Server::Here(pid) => pid,
        other => panic!("the socket is not served from this namespace: {other:?}"),
    };
    let stop = || {
        let _ = Command::new("kill").arg(ours.to_string()).status();
    };
    if !started || here.link(&name).is_none() {
        stop();
        panic!("no tunnel of its own was started here");
    }
    assert!(
        there.link(&name).is_some(),
        "the other namespace's tunnel runs on"
    );
    let said = std::fs::read_to_string(log.path()).unwrap();
    stop();
    assert!(said.contains("taking it over"), "{said}");
    wait_for(
        "this namespace's tunnel to end",
        Duration::from_secs(20),
        || here.link(&name).is_none(),
    );
}
