//! N other nodes' leases appearing at once and leaving at once: the time until the datapath
//! holds every node's entries (and until they are all gone), and the daemon's RSS, for vxlan (a
//! route, a neighbour and an FDB entry per node) and host-gw (a route per node), with routes
//! through nexthop objects and, where that takes seconds rather than minutes, with plain routes.
//!
//! The leases go into etcd in transactions of 5,000 (about 1 MiB of keys and values each; etcd
//! hands a transaction's events to a watcher in one message), one after another from this
//! process; the time runs from the commit of the last one (and, second figure, of the first)
//! to the kernel's last notification of the burst, counted by a netlink listener: nothing dumps
//! a table while a burst is timed.
//!
//! `DATAPATH_N=1000,5000` picks the sizes (default 1,000, 5,000, 20,000 and 50,000); plain
//! routes are timed up to 5,000.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "watch/mod.rs"]
mod watch;

use cni_kernel::Netns;
use common::*;
use etcd_client::{Client, Txn, TxnOp};
use std::time::{Duration, Instant};
use watch::{peer, Counts, Watch};

/// Leases per transaction.
const CHUNK: usize = 5000;
/// The largest burst timed with plain routes.
const PLAIN_UP_TO: usize = 5000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Vxlan,
    HostGw,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Vxlan => "vxlan",
            Backend::HostGw => "host-gw",
        }
    }
}

fn lease_key(i: usize) -> String {
    format!("{PREFIX}/subnets/{}-24", peer(i).0)
}

fn lease_value(backend: Backend, i: usize) -> String {
    let (_, public, mac) = peer(i);
    let data = match backend {
        Backend::Vxlan => format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#),
        Backend::HostGw => "null".to_string(),
    };
    format!(
        r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"{}","BackendData":{data}}}"#,
        backend.name()
    )
}

/// A node with etcd and flanneld, and a listener counting its datapath's notifications.
struct Setup {
    node: Node,
    etcd: Etcd,
    daemon: Daemon,
    watch: Watch,
    backend: Backend,
    nexthops: bool,
}

impl Setup {
    fn new(backend: Backend, nexthops: bool) -> Setup {
        let node = Node::new("fbd");
        node.ns.ip(&["addr", "add", "172.16.0.1/16", "dev", "eth0"]);
        let etcd = Etcd::start_with(
            &node,
            None,
            &["--max-txn-ops", "10000", "--max-request-bytes", "16777216"],
        );
        // The node's own lease comes from 10.0.0.0/16, the others' from 10.1.0.0 upwards.
        etcd.put(
            &node,
            &format!("{PREFIX}/config"),
            &format!(
                r#"{{"Network":"10.0.0.0/8","SubnetMin":"10.0.1.0","SubnetMax":"10.0.255.0","Backend":{{"Type":"{}"}}}}"#,
                backend.name()
            ),
        );
        let env: &[(&str, &str)] = if nexthops {
            &[]
        } else {
            &[("FLANNELD_NEXTHOPS", "false")]
        };
        let daemon = Daemon::start(
            &node,
            "bench",
            &["--etcd-endpoints", &etcd.client_url, "--iface", "eth0"],
            env,
        );
        daemon.subnet(Duration::from_secs(30));
        let style = if nexthops {
            "routes through nexthop objects"
        } else {
            "plain routes"
        };
        daemon.wait_log(style, Duration::from_secs(10));
        let watch = Watch::start(node.ns.path(), "10.0.0.0/8".parse().expect("a network"));
        Setup {
            node,
            etcd,
            daemon,
            watch,
            backend,
            nexthops,
        }
    }

    /// What the kernel announces for `n` nodes, each way.
    fn counts(&self, n: usize) -> Counts {
        let vxlan = usize::from(self.backend == Backend::Vxlan);
        Counts {
            routes: n,
            neighbours: n * vxlan,
            fdb: n * vxlan,
            nexthops: n * usize::from(self.nexthops),
        }
    }

    /// Commits the transactions one after another; when the first and the last were committed.
    fn commit(&self, txns: Vec<Vec<TxnOp>>) -> (Instant, Instant) {
        let ns = Netns::open(self.node.ns.path()).expect("the node's namespace");
        let url = self.etcd.client_url.clone();
        // The client's socket is made in the node's namespace, where etcd listens.
        ns.run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the etcd client");
            rt.block_on(async move {
                let mut client = Client::connect([url], None).await.expect("etcd");
                let mut first = None;
                for ops in txns {
                    client
                        .txn(Txn::new().and_then(ops))
                        .await
                        .expect("a transaction");
                    first.get_or_insert_with(Instant::now);
                }
                let last = Instant::now();
                (first.unwrap_or(last), last)
            })
        })
        .expect("entering the node's namespace")
    }

    /// N leases in, then out: (in from the last commit, in from the first, out from the last
    /// commit, RSS with N known).
    fn burst(&self, n: usize) -> (Duration, Duration, Duration, u64) {
        let limit = Duration::from_secs(600);
        let puts: Vec<Vec<TxnOp>> = (0..n)
            .collect::<Vec<_>>()
            .chunks(CHUNK)
            .map(|c| {
                c.iter()
                    .map(|&i| TxnOp::put(lease_key(i), lease_value(self.backend, i), None))
                    .collect()
            })
            .collect();
        let dels: Vec<Vec<TxnOp>> = (0..n)
            .collect::<Vec<_>>()
            .chunks(CHUNK)
            .map(|c| {
                c.iter()
                    .map(|&i| TxnOp::delete(lease_key(i), None))
                    .collect()
            })
            .collect();
        let want = self.counts(n);
        self.watch.reset();
        let (first, last) = self.commit(puts);
        let done = self.watch.wait(want, Counts::default(), limit);
        let rss = self.daemon.memory_kib("VmRSS:");
        let routes = self
            .node
            .ns
            .ip(&["-4", "route", "show", "root", "10.0.0.0/8"])
            .lines()
            .count();
        assert_eq!(routes, n, "routes in the kernel after the burst");
        self.watch.reset();
        let (_, out_last) = self.commit(dels);
        let gone = self.watch.wait(Counts::default(), want, limit);
        (
            done.saturating_duration_since(last),
            done.saturating_duration_since(first),
            gone.saturating_duration_since(out_last),
            rss,
        )
    }
}

fn sizes() -> Vec<usize> {
    match std::env::var("DATAPATH_N") {
        Ok(s) => s.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) => vec![1_000, 5_000, 20_000, 50_000],
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "datapath: N other nodes' leases in, then out; ms from the last transaction's commit (in: also from the first) to the kernel's last notification; load average {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!("| backend | routes | N | in | in, from the first commit | out | flanneld RSS |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for backend in [Backend::Vxlan, Backend::HostGw] {
        for nexthops in [true, false] {
            let sizes: Vec<usize> = sizes()
                .into_iter()
                .filter(|n| nexthops || *n <= PLAIN_UP_TO)
                .collect();
            if sizes.is_empty() {
                continue;
            }
            let s = Setup::new(backend, nexthops);
            for n in sizes {
                let (t_in, t_in_first, t_out, rss) = s.burst(n);
                println!(
                    "| {} | {} | {n} | {} | {} | {} | {:.1} MiB |",
                    backend.name(),
                    if nexthops { "nexthop" } else { "plain" },
                    ms(t_in),
                    ms(t_in_first),
                    ms(t_out),
                    rss as f64 / 1024.0
                );
            }
            println!(
                "| {} | {} | peak | | | | {:.1} MiB |",
                backend.name(),
                if nexthops { "nexthop" } else { "plain" },
                s.daemon.memory_kib("VmHWM:") as f64 / 1024.0
            );
        }
    }
}
