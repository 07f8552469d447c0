//! A burst of 5,000 leases written to etcd in one transaction, then deleted in one: the time
//! until flanneld has delivered every event to its backend, and its memory afterwards.
//! etcd and the daemon run in a throwaway namespace (see tests/common).

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const LEASES: usize = 5000;
const ROUNDS: usize = 3;

/// etcdctl's txn input: no compares, the puts (or deletes), no failure ops.
fn txn_input(put: bool) -> String {
    let mut s = String::from("\n");
    for i in 0..LEASES {
        let (a, b) = (i / 256, i % 256);
        let key = format!("{PREFIX}/subnets/10.{}.{b}.0-24", 100 + a);
        if put {
            let value = format!(
                r#"{{"PublicIP":"172.16.{a}.{b}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:{a:02x}:{b:02x}"}}}}"#
            );
            let _ = writeln!(s, "put {key} {:?}", value);
        } else {
            let _ = writeln!(s, "del {key}");
        }
    }
    s.push_str("\n\n");
    s
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

fn burst(node: &Node, etcd: &Etcd, d: &Daemon, put: bool, before: usize) -> (Duration, Duration) {
    let needle = if put {
        "lease added: 10."
    } else {
        "lease removed: 10."
    };
    let input = txn_input(put);
    let start = Instant::now();
    etcd.txn(node, &input);
    let committed = start.elapsed();
    let want = before + LEASES;
    loop {
        let n = count(&d.log_text(), needle);
        if n >= want {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "only {n} of {want} events after 120 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    (committed, start.elapsed())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let node = Node::new("fbl");
    let etcd = Etcd::start_with(
        &node,
        None,
        &["--max-txn-ops", "6000", "--max-request-bytes", "16777216"],
    );
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.0.0.0/8","Backend":{"Type":"vxlan"}}"#,
    );
    let d = Daemon::start(
        &node,
        "bench",
        &["--etcd-endpoints", &etcd.client_url, "--iface", "eth0"],
        &[],
    );
    d.subnet(Duration::from_secs(30));
    println!("flanneld, {LEASES} leases in one etcd transaction, {ROUNDS} rounds (ms from the txn's start):");
    println!("| round | op | txn committed | all events delivered | RSS after |");
    println!("|---:|---|---:|---:|---:|");
    for r in 0..ROUNDS {
        for put in [true, false] {
            let (c, all) = burst(&node, &etcd, &d, put, r * LEASES);
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.1} MiB |",
                r + 1,
                if put { "put" } else { "delete" },
                c.as_secs_f64() * 1e3,
                all.as_secs_f64() * 1e3,
                d.memory_kib("VmRSS:") as f64 / 1024.0
            );
        }
    }
    println!(
        "peak RSS: {:.1} MiB",
        d.memory_kib("VmHWM:") as f64 / 1024.0
    );
}
