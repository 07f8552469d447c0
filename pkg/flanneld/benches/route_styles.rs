//! What the kernel's own batch tools take to program N remote nodes and remove them again, with
//! plain routes and with routes through nexthop objects, for the vxlan backend (a route, a
//! permanent neighbour and an FDB entry per node) and host-gw (a route per node): one
//! `ip -batch` (and for vxlan one `bridge -batch`) each way, in a fresh namespace, timed from
//! the start of the batch to the kernel's last notification of it, counted by a listener.
//!
//! `ROUTE_STYLES_N=1000,5000` picks the sizes (default 1,000, 5,000, 20,000 and 50,000).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "watch/mod.rs"]
mod watch;

use common::Node;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use watch::{peer, Counts, Watch};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Vxlan,
    HostGw,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Nexthop,
}

/// The `ip` and `bridge` batches that add the N nodes' entries, and those that remove them.
/// A nexthop comes before the route through it, and is removed after it: a nexthop deleted
/// with IPv4 routes through it makes the kernel walk the whole table.
struct Batches {
    ip_in: String,
    bridge_in: String,
    ip_out: String,
    bridge_out: String,
}

fn batches(backend: Backend, style: Style, n: usize) -> Batches {
    let mut b = Batches {
        ip_in: String::new(),
        bridge_in: String::new(),
        ip_out: String::new(),
        bridge_out: String::new(),
    };
    let mut nexthops_out = String::new();
    let mut neighbours_out = String::new();
    for i in 0..n {
        let (sn, public, mac) = peer(i);
        let id = 100_000 + i;
        let (via, dev, onlink) = match backend {
            Backend::Vxlan => (sn, "flannel.1", " onlink"),
            Backend::HostGw => (public, "eth0", ""),
        };
        if backend == Backend::Vxlan {
            let _ = writeln!(
                b.ip_in,
                "neigh replace {sn} lladdr {mac} dev flannel.1 nud permanent"
            );
            let _ = writeln!(
                b.bridge_in,
                "fdb replace {mac} dev flannel.1 dst {public} self permanent"
            );
            let _ = writeln!(neighbours_out, "neigh del {sn} dev flannel.1");
            let _ = writeln!(
                b.bridge_out,
                "fdb del {mac} dev flannel.1 dst {public} self"
            );
        }
        match style {
            Style::Plain => {
                let _ = writeln!(b.ip_in, "route replace {sn}/24 via {via} dev {dev}{onlink}");
            }
            Style::Nexthop => {
                let _ = writeln!(
                    b.ip_in,
                    "nexthop replace id {id} via {via} dev {dev}{onlink}"
                );
                let _ = writeln!(b.ip_in, "route replace {sn}/24 nhid {id}");
                let _ = writeln!(nexthops_out, "nexthop del id {id}");
            }
        }
        let _ = writeln!(b.ip_out, "route del {sn}/24");
    }
    b.ip_out.push_str(&nexthops_out);
    b.ip_out.push_str(&neighbours_out);
    b
}

/// A node namespace ready for `backend`: eth0 also holds 172.16.0.1/16 (the peers' public
/// addresses), and for vxlan flannel.1 is up.
fn node(backend: Backend) -> Node {
    let node = Node::new("fbs");
    node.ns.ip(&["addr", "add", "172.16.0.1/16", "dev", "eth0"]);
    if backend == Backend::Vxlan {
        node.ns.ip(&[
            "link",
            "add",
            "flannel.1",
            "type",
            "vxlan",
            "id",
            "1",
            "local",
            "192.168.100.1",
            "dev",
            "eth0",
            "dstport",
            "8472",
            "nolearning",
        ]);
        node.ns.ip(&["link", "set", "flannel.1", "up"]);
    }
    node
}

fn count(node: &Node, args: &[&str]) -> usize {
    node.ns
        .run(args[0], &args[1..])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// The time in and the time out for N nodes.
fn measure(backend: Backend, style: Style, n: usize) -> (Duration, Duration) {
    let node = node(backend);
    let b = batches(backend, style, n);
    let run = |tool: &str, name: &str, text: &str| {
        if text.is_empty() {
            return;
        }
        let path = node.path(name);
        std::fs::write(&path, text).expect("a batch file");
        node.ns
            .run(tool, &["-batch", path.to_str().unwrap_or_default()]);
    };
    let watch = Watch::start(node.ns.path(), "10.0.0.0/8".parse().expect("a network"));
    let vxlan = usize::from(backend == Backend::Vxlan);
    let want = Counts {
        routes: n,
        neighbours: n * vxlan,
        fdb: n * vxlan,
        nexthops: if style == Style::Nexthop { n } else { 0 },
    };
    let limit = Duration::from_secs(600);

    let start = Instant::now();
    run("ip", "in.ip", &b.ip_in);
    run("bridge", "in.bridge", &b.bridge_in);
    let t_in = watch.wait(want, Counts::default(), limit) - start;
    let routes = count(&node, &["ip", "-4", "route", "show", "root", "10.0.0.0/8"]);
    assert_eq!(routes, n, "routes in the kernel");

    watch.reset();
    let start = Instant::now();
    run("ip", "out.ip", &b.ip_out);
    run("bridge", "out.bridge", &b.bridge_out);
    let t_out = watch.wait(Counts::default(), want, limit) - start;
    let routes = count(&node, &["ip", "-4", "route", "show", "root", "10.0.0.0/8"]);
    assert_eq!(routes, 0, "routes left in the kernel");
    (t_in, t_out)
}

fn sizes() -> Vec<usize> {
    let default = vec![1_000, 5_000, 20_000, 50_000];
    match std::env::var("ROUTE_STYLES_N") {
        Ok(s) => s.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) => default,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    for (backend, name, entries) in [
        (
            Backend::Vxlan,
            "vxlan",
            "route + permanent neighbour + FDB entry",
        ),
        (Backend::HostGw, "host-gw", "route"),
    ] {
        println!(
            "{name}: N nodes ({entries} each) by ip -batch / bridge -batch, ms from the start to the last notification"
        );
        println!("| N | plain in | plain out | nexthop in | nexthop out | in, plain/nexthop |");
        println!("|---:|---:|---:|---:|---:|---:|");
        for n in sizes() {
            let (p_in, p_out) = measure(backend, Style::Plain, n);
            let (h_in, h_out) = measure(backend, Style::Nexthop, n);
            println!(
                "| {n} | {} | {} | {} | {} | {:.1}x |",
                ms(p_in),
                ms(p_out),
                ms(h_in),
                ms(h_out),
                p_in.as_secs_f64() / h_in.as_secs_f64()
            );
        }
    }
}
