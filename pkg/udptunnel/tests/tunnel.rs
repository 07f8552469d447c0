//! Two namespaces joined by a veth, each with a `flannel-udp` process configured over its
//! socket as flanneld configures it: TCP crosses intact both ways, the counters move, a route
//! removed stops the packets, and the process ends when its interface is deleted.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::{unique_name, TestNs};
use udptunnel::control::{socket_path, Change, Client};

const PROGRAM: &str = env!("CARGO_BIN_EXE_flannel-udp");

struct Node {
    ns: TestNs,
    dir: tempfile::TempDir,
    tunnel: Child,
    client: Client,
}

impl Node {
    fn start(ns: TestNs, dev: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let tunnel = ns
            .command(PROGRAM)
            .args([dev, "--socket-dir", dir.path().to_str().unwrap()])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let client = Client::at(&socket_path(dir.path(), dev));
        let start = Instant::now();
        while !client.is_alive() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the tunnel never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Node {
            ns,
            dir,
            tunnel,
            client,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.tunnel.kill();
        let _ = self.tunnel.wait();
    }
}

fn transfer(from: &TestNs, to: &TestNs, dest: &str, bytes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    from.run(
        "sh",
        &[
            "-c",
            &format!("head -c {bytes} /dev/urandom > {}", src.display()),
        ],
    );
    let mut server = to
        .command("socat")
        .args(["-u", "-T", "20", "TCP4-LISTEN:7000,reuseaddr"])
        .arg(format!("CREATE:{}", dst.display()))
        .spawn()
        .unwrap();
    let out = from
        .command("socat")
        .args(["-u", "-T", "20"])
        .arg(format!("OPEN:{}", src.display()))
        .arg(format!("TCP:{dest}:7000,retry=50,interval=0.1"))
        .output()
        .unwrap();
    let status = server.wait().unwrap();
    assert!(out.status.success() && status.success(), "TCP to {dest}");
    assert!(
        std::fs::read(&src).unwrap() == std::fs::read(&dst).unwrap(),
        "the bytes to {dest} arrived whole and unchanged"
    );
}

fn wait_exit(child: &mut Child) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn tcp_crosses_two_tunnels_and_a_route_removed_stops_the_packets() {
    if !testkit::runs_here(
        Command::new("socat").arg("-V").output().is_ok(),
        testkit::Need::Installed("socat"),
    ) {
        return;
    }
    let (a, b) = (TestNs::new("uta"), TestNs::new("utb"));
    a.veth_to(&b, Some(("192.168.92.1/24", "192.168.92.2/24")));
    let dev = unique_name("fu");
    let (a, b) = (Node::start(a, &dev), Node::start(b, &dev));
    for (n, node) in [(1, &a), (2, &b)] {
        let m = 3 - n;
        // As flanneld's udp backend sets up the device: its subnet's address, MTU, up, the
        // network through it; the tunnel listens on the node's address, routes the other.
        node.ns
            .ip(&["addr", "add", &format!("10.92.{n}.0/32"), "dev", &dev]);
        node.ns.ip(&["link", "set", &dev, "mtu", "1472", "up"]);
        node.ns.ip(&["route", "add", "10.92.0.0/16", "dev", &dev]);
        node.ns
            .ip(&["addr", "add", &format!("10.92.{n}.1/24"), "dev", "lo"]);
        node.client
            .set(&Change {
                listen: format!("192.168.92.{n}:8285").parse().ok(),
                put: vec![(
                    format!("10.92.{m}.0/24").parse().unwrap(),
                    format!("192.168.92.{m}:8285").parse().unwrap(),
                )],
                remove: vec![],
            })
            .unwrap();
    }
    let state = a.client.get().unwrap();
    assert_eq!(state.listen, "192.168.92.1:8285".parse().ok());
    assert_eq!(state.routes.len(), 1);
    a.ns.run(
        "ping",
        &["-c", "1", "-W", "5", "-I", "10.92.1.1", "10.92.2.1"],
    );
    transfer(&a.ns, &b.ns, "10.92.2.1", 16 << 20);
    transfer(&b.ns, &a.ns, "10.92.1.1", 16 << 20);
    let (sa, sb) = (a.client.get().unwrap(), b.client.get().unwrap());
    assert!(
        sa.count("sent") > 10_000 && sb.count("received") > 10_000,
        "{sa:?} {sb:?}"
    );
    // A wrong request changes nothing and says why.
    let e = std::os::unix::net::UnixStream::connect(a.client.path()).map(|mut s| {
        use std::io::{Read, Write};
        s.write_all(b"set\nroute 10.92.9.0/24 nowhere\n\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    });
    assert!(e.unwrap().starts_with("error "), "a bad set is refused");
    assert_eq!(a.client.get().unwrap().routes.len(), 1);
    // The route removed: nothing goes.
    a.client
        .set(&Change {
            remove: vec!["10.92.2.0/24".parse().unwrap()],
            ..Change::default()
        })
        .unwrap();
    let before = a.client.get().unwrap().count("unrouted");
    let ping = a.ns.try_run(
        "ping",
        &["-c", "1", "-W", "1", "-I", "10.92.1.1", "10.92.2.1"],
    );
    assert!(!ping.status.success());
    assert!(a.client.get().unwrap().count("unrouted") > before);
    // The interface deleted: the process ends and takes its socket with it.
    let sock = a.client.path().to_path_buf();
    let mut a = a;
    a.ns.ip(&["link", "del", &dev]);
    assert!(
        wait_exit(&mut a.tunnel),
        "the tunnel ended with its interface"
    );
    assert!(!Path::new(&sock).exists());
    let _ = &a.dir;
}
