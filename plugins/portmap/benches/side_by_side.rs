//! ADD and DEL of one container's two mappings, ours against Debian's Go portmap in the same
//! run, on a throwaway node namespace that already holds 20 other containers' mappings.
//! Runs are interleaved so that both see the same machine. Prints p50/p99 and the ratios.
//! `cargo bench -p portmap` (as root). BENCH_BASELINE=<dir> adds rows for the `portmap` in that
//! directory (an earlier build), interleaved with the others.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{portmap_config, web_and_dns, Node, Pod};
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use testkit::{Invocation, GO_PLUGIN_DIR};

const ROUNDS: usize = 40;
const NEIGHBOURS: usize = 20;

struct Contender {
    label: String,
    plugin: PathBuf,
    options: Value,
    add: Vec<Duration>,
    del: Vec<Duration>,
}

fn run(node: &Node, pod: &Pod, c: &Contender, cmd: &str, conf: &Value) -> Duration {
    let start = Instant::now();
    let out = Invocation::at(c.plugin.clone(), cmd)
        .netns(&pod.ns.path_str())
        .container_id(&pod.id)
        .run_in_ns(&node.host, conf);
    let took = start.elapsed();
    assert_eq!(
        out.code, 0,
        "{} {cmd}: {}{}",
        c.label, out.stdout, out.stderr
    );
    took
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root || !testkit::go_plugins_available() {
        eprintln!("side_by_side: needs root and the Go plugins in {GO_PLUGIN_DIR}; skipped");
        return;
    }
    let node = Node::new();
    let ours = PathBuf::from(env!("CARGO_BIN_EXE_portmap"));
    let go = PathBuf::from(GO_PLUGIN_DIR).join("portmap");

    let neighbours: Vec<Pod> = (0..NEIGHBOURS).map(|_| node.pod(false)).collect();
    for (i, n) in neighbours.iter().enumerate() {
        let maps = json!([{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}]);
        let conf = portmap_config("1.0.0", json!({}), maps, Some(&n.result));
        node.portmap("ADD", n, &conf).ok();
        let conf = portmap_config(
            "1.0.0",
            json!({"backend": "nftables"}),
            json!([{"hostPort": 20000 + i, "containerPort": 80, "protocol": "udp"}]),
            Some(&n.result),
        );
        node.portmap("ADD", n, &conf).ok();
    }
    let pod = node.pod(false);

    let contender = |label: &str, plugin: &PathBuf, options: Value| Contender {
        label: label.to_string(),
        plugin: plugin.clone(),
        options,
        add: vec![],
        del: vec![],
    };
    let mut contenders = vec![
        contender("Go portmap (iptables)", &go, json!({})),
        contender("ours (iptables)", &ours, json!({})),
        contender("ours (nftables)", &ours, json!({"backend": "nftables"})),
    ];
    if let Some(dir) = std::env::var_os("BENCH_BASELINE") {
        let baseline = PathBuf::from(dir).join("portmap");
        contenders.push(contender("baseline (iptables)", &baseline, json!({})));
        contenders.push(contender(
            "baseline (nftables)",
            &baseline,
            json!({"backend": "nftables"}),
        ));
    }
    for round in 0..ROUNDS + 3 {
        for c in contenders.iter_mut() {
            let add = portmap_config("1.0.0", c.options.clone(), web_and_dns(), Some(&pod.result));
            let del = portmap_config("1.0.0", c.options.clone(), web_and_dns(), None);
            let a = run(&node, &pod, c, "ADD", &add);
            let d = run(&node, &pod, c, "DEL", &del);
            // The first rounds warm caches and create the shared chains.
            if round >= 3 {
                c.add.push(a);
                c.del.push(d);
            }
        }
    }

    println!(
        "portmap side by side: {ROUNDS} rounds, 2 mappings, {NEIGHBOURS} other containers mapped"
    );
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10}",
        "", "ADD p50", "ADD p99", "DEL p50", "DEL p99"
    );
    for c in &contenders {
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>10}",
            c.label,
            ms(percentile(&c.add, 0.5)),
            ms(percentile(&c.add, 0.99)),
            ms(percentile(&c.del, 0.5)),
            ms(percentile(&c.del, 0.99)),
        );
    }
    let go = &contenders[0];
    for c in &contenders[1..] {
        let ratio = |a: &[Duration], b: &[Duration]| {
            percentile(a, 0.5).as_secs_f64() / percentile(b, 0.5).as_secs_f64()
        };
        println!(
            "Go / {}: ADD p50 {:.1}x, DEL p50 {:.1}x",
            c.label,
            ratio(&go.add, &c.add),
            ratio(&go.del, &c.del)
        );
    }
}
