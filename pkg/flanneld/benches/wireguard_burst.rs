//! N other nodes' leases with the wireguard backend appearing at once and leaving at once: the
//! time from the last etcd commit until the tunnel holds every node's peer (and holds none
//! again), and the RSS of flanneld and of its userspace tunnel with N peers. datapath_burst's
//! vxlan RSS at the same N, from the same scripts/bench.sh run, is the figure to hold it to.
//!
//! `WIREGUARD_N=1000,5000` picks the sizes (default 1,000 and 5,000). The tunnel's socket is
//! /var/run/wireguard/flannel-wg.sock: run no other flanneld with a wireguard device alongside.

#[path = "../tests/common/mod.rs"]
mod common;

use cni_kernel::Netns;
use common::*;
use etcd_client::{Client, Txn, TxnOp};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use wireguard::uapi::UapiClient;
use wireguard::Key;

const CHUNK: usize = 5000;

/// Node i's subnet (10.1.0.0/24 upwards) and public address (172.16.0.2 upwards).
fn peer(i: usize) -> (Ipv4Addr, Ipv4Addr) {
    let i = i as u32;
    (
        Ipv4Addr::from(0x0a01_0000 + (i << 8)),
        Ipv4Addr::from(0xac10_0002 + i),
    )
}

fn lease_key(i: usize) -> String {
    format!("{PREFIX}/subnets/{}-24", peer(i).0)
}

/// A public key per node: any 32 bytes are one.
fn public_key(i: usize) -> Key {
    let mut k = [0x5au8; 32];
    k[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Key(k)
}

fn lease_value(i: usize) -> String {
    let (_, public) = peer(i);
    format!(
        r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"wireguard","BackendData":{}}}"#,
        flanneld::backend::wireguard::backend_data(&public_key(i), 51820)
    )
}

struct Setup {
    node: Node,
    etcd: Etcd,
    daemon: Daemon,
    tunnel: UapiClient,
    tunnel_pid_at_start: Option<u32>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        // The tunnel outlives flanneld by design; it goes with the bench, and its socket with it.
        let pids = self
            .tunnel_pid()
            .into_iter()
            .chain(self.tunnel_pid_at_start);
        for pid in pids {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        let start = Instant::now();
        while self.tunnel.path().exists() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Setup {
    fn new() -> Setup {
        let node = Node::new("fwb");
        node.ns.ip(&["addr", "add", "172.16.0.1/16", "dev", "eth0"]);
        let etcd = Etcd::start_with(
            &node,
            None,
            &["--max-txn-ops", "10000", "--max-request-bytes", "16777216"],
        );
        etcd.put(
            &node,
            &format!("{PREFIX}/config"),
            r#"{"Network":"10.0.0.0/8","SubnetMin":"10.0.1.0","SubnetMax":"10.0.255.0","Backend":{"Type":"wireguard"}}"#,
        );
        let key = node.path("wgkey").display().to_string();
        let daemon = Daemon::start(
            &node,
            "bench",
            &["--etcd-endpoints", &etcd.client_url, "--iface", "eth0"],
            &[("WIREGUARD_KEY_FILE", key.as_str())],
        );
        daemon.subnet(Duration::from_secs(30));
        daemon.wait_log("wireguard: device flannel-wg made", Duration::from_secs(30));
        let mut s = Setup {
            node,
            etcd,
            daemon,
            tunnel: UapiClient::new("flannel-wg"),
            tunnel_pid_at_start: None,
        };
        s.tunnel_pid_at_start = s.tunnel_pid();
        assert!(
            s.tunnel_pid_at_start.is_some(),
            "no tunnel process in the node"
        );
        s
    }

    fn tunnel_pid(&self) -> Option<u32> {
        let pids = std::process::Command::new("ip")
            .args(["netns", "pids", self.node.ns.name()])
            .output()
            .ok()?;
        String::from_utf8_lossy(&pids.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.starts_with("flannel-wiregua"))
            })
    }

    fn tunnel_rss_kib(&self) -> u64 {
        self.tunnel_pid().map_or(0, |pid| memory_kib(pid, "VmRSS:"))
    }

    fn commit(&self, txns: Vec<Vec<TxnOp>>) -> Instant {
        let ns = Netns::open(self.node.ns.path()).expect("the node's namespace");
        let url = self.etcd.client_url.clone();
        ns.run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the etcd client");
            rt.block_on(async move {
                let mut client = Client::connect([url], None).await.expect("etcd");
                for ops in txns {
                    client
                        .txn(Txn::new().and_then(ops))
                        .await
                        .expect("a transaction");
                }
                Instant::now()
            })
        })
        .expect("entering the node's namespace")
    }

    /// Polls the tunnel until it holds `n` peers; when it first did.
    fn wait_peers(&self, n: usize, limit: Duration) -> Instant {
        let start = Instant::now();
        loop {
            if self.tunnel.get().is_ok_and(|s| s.peers.len() == n) {
                return Instant::now();
            }
            assert!(
                start.elapsed() < limit,
                "the tunnel did not hold {n} peers within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// N leases in, then out: (in, out, flanneld RSS, tunnel RSS), KiB.
    fn burst(&self, n: usize) -> (Duration, Duration, u64, u64) {
        let limit = Duration::from_secs(600);
        let chunks: Vec<Vec<usize>> = (0..n)
            .collect::<Vec<_>>()
            .chunks(CHUNK)
            .map(<[usize]>::to_vec)
            .collect();
        let puts = chunks
            .iter()
            .map(|c| {
                c.iter()
                    .map(|&i| TxnOp::put(lease_key(i), lease_value(i), None))
                    .collect()
            })
            .collect();
        let dels = chunks
            .iter()
            .map(|c| {
                c.iter()
                    .map(|&i| TxnOp::delete(lease_key(i), None))
                    .collect()
            })
            .collect();
        let last = self.commit(puts);
        let done = self.wait_peers(n, limit);
        let (rss, tunnel) = (self.daemon.memory_kib("VmRSS:"), self.tunnel_rss_kib());
        let out_last = self.commit(dels);
        let gone = self.wait_peers(0, limit);
        (
            done.saturating_duration_since(last),
            gone.saturating_duration_since(out_last),
            rss,
            tunnel,
        )
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let sizes: Vec<usize> = match std::env::var("WIREGUARD_N") {
        Ok(s) => s.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) => vec![1_000, 5_000],
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "wireguard: N other nodes' leases in, then out; ms from the last commit until the tunnel holds every peer (none); load average {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!("| N | in | out | flanneld RSS | tunnel RSS | both |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let s = Setup::new();
    for n in sizes {
        let (t_in, t_out, rss, tunnel) = s.burst(n);
        println!(
            "| {n} | {:.0} | {:.0} | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            t_in.as_secs_f64() * 1e3,
            t_out.as_secs_f64() * 1e3,
            rss as f64 / 1024.0,
            tunnel as f64 / 1024.0,
            (rss + tunnel) as f64 / 1024.0
        );
    }
}
