//! N other nodes' leases appearing at once (one etcd transaction) and leaving at once: the time
//! until the vxlan datapath holds every node's route, neighbour and FDB entry, and until they
//! are all gone, for N = 100, 1,000 and 5,000; the daemon's RSS at 5,000. The reference is the
//! same 3N entries written and removed by one `ip -batch` in a namespace of its own, in the
//! same run.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

fn mac(i: usize) -> String {
    format!(
        "02:00:00:{:02x}:{:02x}:{:02x}",
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

fn subnet(i: usize) -> (String, String) {
    // 10.100.0.0/16 upwards, one /24 per node.
    let n = 100 * 256 + i;
    (
        format!("10.{}.{}.0", n / 256, n % 256),
        format!("172.16.{}.{}", i / 256, i % 256),
    )
}

/// The same entries through one `ip -batch` (and `bridge -batch`) each way.
fn reference(n: usize) -> (Duration, Duration) {
    let node = Node::new("fbr");
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
    let (mut ip_add, mut fdb_add, mut ip_del, mut fdb_del) =
        (String::new(), String::new(), String::new(), String::new());
    for i in 0..n {
        let (sn, public) = subnet(i);
        let _ = writeln!(
            ip_add,
            "neigh replace {sn} lladdr {} dev flannel.1 nud permanent",
            mac(i)
        );
        let _ = writeln!(
            fdb_add,
            "fdb replace {} dev flannel.1 dst {public} self permanent",
            mac(i)
        );
        let _ = writeln!(
            ip_add,
            "route replace {sn}/24 via {sn} dev flannel.1 onlink"
        );
        let _ = writeln!(ip_del, "route del {sn}/24 via {sn} dev flannel.1");
        let _ = writeln!(ip_del, "neigh del {sn} dev flannel.1");
        let _ = writeln!(
            fdb_del,
            "fdb del {} dev flannel.1 dst {public} self",
            mac(i)
        );
    }
    let run = |tool: &str, text: &str| {
        let path = node.path(&format!("{tool}.batch"));
        std::fs::write(&path, text).expect("batch file");
        node.ns
            .run(tool, &["-batch", path.to_str().unwrap_or_default()]);
    };
    let start = Instant::now();
    run("ip", &ip_add);
    run("bridge", &fdb_add);
    let added = start.elapsed();
    assert_eq!(entries(&node), (n, n, n));
    let start = Instant::now();
    run("ip", &ip_del);
    run("bridge", &fdb_del);
    let removed = start.elapsed();
    (added, removed)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let node = Node::new("fbd");
    let etcd = Etcd::start_with(
        &node,
        None,
        &["--max-txn-ops", "6000", "--max-request-bytes", "16777216"],
    );
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.0.0.0/8","SubnetMin":"10.1.0.0","SubnetMax":"10.99.255.0"}"#,
    );
    let d = Daemon::start(
        &node,
        "bench",
        &["--etcd-endpoints", &etcd.client_url, "--iface", "eth0"],
        &[],
    );
    d.subnet(Duration::from_secs(30));
    let observer = Observer::new(&node);
    println!("vxlan datapath: N other nodes' leases in one etcd transaction, then deleted in one (ms from the commit)");
    println!("| N | flanneld in | flanneld out | ip -batch in | ip -batch out | flanneld RSS |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in [100, 1000, 5000] {
        let (mut put, mut del) = (String::from("\n"), String::from("\n"));
        for i in 0..n {
            let (sn, public) = subnet(i);
            let key = format!("{PREFIX}/subnets/{sn}-24");
            let value = format!(
                r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}}}}"#,
                mac(i)
            );
            let _ = writeln!(put, "put {key} {value:?}");
            let _ = writeln!(del, "del {key}");
        }
        put.push_str("\n\n");
        del.push_str("\n\n");
        etcd.txn(&node, &put);
        let t_in = observer.wait(&node, n, Instant::now());
        let rss = d.memory_kib("VmRSS:");
        etcd.txn(&node, &del);
        let t_out = observer.wait(&node, 0, Instant::now());
        let (r_in, r_out) = reference(n);
        println!(
            "| {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} MiB |",
            t_in.as_secs_f64() * 1e3,
            t_out.as_secs_f64() * 1e3,
            r_in.as_secs_f64() * 1e3,
            r_out.as_secs_f64() * 1e3,
            rss as f64 / 1024.0
        );
    }
    println!(
        "peak RSS: {:.1} MiB",
        d.memory_kib("VmHWM:") as f64 / 1024.0
    );
}
