//! The userspace tunnel against the real kernel, in namespaces of its own: two "nodes" on a
//! veth, pod addresses behind each tunnel; paired with itself and with Debian's wireguard-go
//! (the wire is WireGuard's), configured through the UAPI socket by our client and by `wg`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use testkit::{runs_here, unique_name, Need, TestNs};
use wireguard::uapi::{DeviceConfig, PeerConfig, UapiClient};
use wireguard::Key;

const WG_TOOLS: Need =
    Need::Installed("wireguard-go and wg (Debian's wireguard-go, wireguard-tools)");

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[derive(Clone, Copy, Debug)]
enum Impl {
    Ours,
    WireguardGo,
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

fn start(kind: Impl, ns: &TestNs, name: &str) -> Tunnel {
    let mut cmd = match kind {
        Impl::Ours => ns.command(env!("CARGO_BIN_EXE_flannel-wireguard")),
        Impl::WireguardGo => {
            let mut c = ns.command("wireguard-go");
            c.arg("-f");
            c
        }
    };
    let child = cmd
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {kind:?}: {e}"));
    let t = Tunnel {
        child,
        name: name.to_string(),
        client: UapiClient::new(name),
    };
    wait_for(
        &format!("{kind:?} to answer on {}", t.client.path().display()),
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

#[test]
fn pods_talk_across_our_tunnel_and_across_ours_to_wireguard_go() {
    if !runs_here(have("wireguard-go") && have("wg"), WG_TOOLS) {
        return;
    }
    // (left, right, underlay over IPv6)
    for (left, right, v6) in [
        (Impl::Ours, Impl::Ours, true),
        (Impl::Ours, Impl::WireguardGo, false),
    ] {
        let case = format!("{left:?} <-> {right:?} over IPv{}", if v6 { 6 } else { 4 });
        let (a, b) = two_nodes(v6);
        let ta = start(left, &a.ns, &unique_name("wgt"));
        let tb = start(right, &b.ns, &unique_name("wgt"));
        configure(&ta, &a, &b, 1, 2);
        configure(&tb, &b, &a, 2, 1);
        for (from, to, dest) in [
            (&a, &b, &b.pod_v4),
            (&a, &b, &b.pod_v6),
            (&b, &a, &a.pod_v4),
            (&b, &a, &a.pod_v6),
        ] {
            wait_for(
                &format!(
                    "{case}: ping from {} to {dest} ({})",
                    from.underlay, to.underlay
                ),
                Duration::from_secs(20),
                || ping(from, dest),
            );
        }
        // TCP both ways, a megabyte each: socat serves, the other side sends and reads back.
        for (server, client, dest) in [(&b, &a, &b.pod_v4), (&a, &b, &a.pod_v6)] {
            let listen = if dest.contains(':') {
                "TCP6-LISTEN:7777,reuseaddr"
            } else {
                "TCP4-LISTEN:7777,reuseaddr"
            };
            let mut srv = server
                .ns
                .command("socat")
                .args(["-u", listen, "OPEN:/dev/null"])
                .spawn()
                .unwrap();
            let target = if dest.contains(':') {
                format!("TCP:[{dest}]:7777,retry=50,interval=0.1")
            } else {
                format!("TCP:{dest}:7777,retry=50,interval=0.1")
            };
            let out = client
                .ns
                .command("sh")
                .args([
                    "-c",
                    &format!("head -c 1000000 /dev/zero | socat -u - {target}"),
                ])
                .output()
                .unwrap();
            let _ = srv.wait();
            assert!(
                out.status.success(),
                "{case}: TCP to {dest}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Both ends report the handshake and the traffic, as `wg show` gives them.
        for (t, other) in [(&ta, &b), (&tb, &a)] {
            let state = t.client.get().unwrap();
            assert_eq!(state.listen_port, 51820, "{case}");
            let peer = &state.peers[0];
            assert_eq!(peer.public_key, other.key.public(), "{case}");
            assert!(peer.last_handshake.is_some(), "{case}: {peer:?}");
            assert!(
                peer.rx_bytes > 1_000_000 || peer.tx_bytes > 1_000_000,
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
}

#[test]
fn wg_sets_and_shows_our_device_and_bad_requests_are_refused() {
    if !runs_here(have("wg"), WG_TOOLS) {
        return;
    }
    let ns = TestNs::new("wgs");
    let t = start(Impl::Ours, &ns, &unique_name("wgt"));
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
    let mut t = start(Impl::Ours, &ns, &unique_name("wgt"));
    // A second process for the same device is refused while the first serves it.
    let second = ns
        .command(env!("CARGO_BIN_EXE_flannel-wireguard"))
        .arg(&t.name)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another process serves"));
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
