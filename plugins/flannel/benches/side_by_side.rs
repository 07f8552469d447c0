//! Pod setup and teardown cost, side by side in one run and one throwaway host namespace:
//! ours, flannel -> bridge -> host-local (three execs), against Debian's Go bridge ->
//! host-local (two execs) given the delegate config flannel builds. Each ADD and DEL is
//! timed from spawn to exit; the two stacks alternate so that both see the same noise.
//!
//! `cargo bench -p flannel` (as root). FLANNEL_BENCH_ITERATIONS sets the rounds (200).

use cni_flannel::{build_delegate, NetConf};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use subnetenv::SubnetEnv;
use testkit::{bin_dir, go_plugins_available, Invocation, TestNs, GO_PLUGIN_DIR};

struct Stack {
    label: &'static str,
    plugin: PathBuf,
    cni_path: String,
    config: Value,
    pod: TestNs,
    add: Vec<Duration>,
    del: Vec<Duration>,
}

impl Stack {
    fn round(&mut self, host: &TestNs, n: usize, record: bool) {
        let id = format!("bench-{}-{n}", self.label);
        let inv = |cmd: &str| {
            Invocation::at(self.plugin.clone(), cmd)
                .path(&self.cni_path)
                .container_id(&id)
                .netns(&self.pod.path_str())
        };
        let started = Instant::now();
        inv("ADD").run_in_ns(host, &self.config).ok();
        let added = started.elapsed();
        let started = Instant::now();
        inv("DEL").run_in_ns(host, &self.config).ok();
        let deleted = started.elapsed();
        if record {
            self.add.push(added);
            self.del.push(deleted);
        }
    }
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The release binaries the bench runs, built fresh: cargo builds only this package's.
fn build_release_plugins() {
    // Built where this bench runs from: target/release, or target/<triple>/release when
    // scripts/bench.sh passes --target (RUSTFLAGS come through the environment).
    let dir = bin_dir();
    let triple = dir
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .filter(|n| n.contains('-'))
        .map(str::to_string);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "flannel",
            "-p",
            "bridge",
            "-p",
            "host-local",
        ])
        .args(triple.iter().flat_map(|t| ["--target", t.as_str()]))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .status()
        .expect("running cargo build");
    assert!(status.success(), "building the release plugins failed");
}

fn write_subnet_env(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("subnet.env");
    SubnetEnv::parse(text).unwrap().write(&path).unwrap();
    path
}

fn main() {
    if !go_plugins_available() {
        eprintln!("the Go plugins are not in {GO_PLUGIN_DIR}: nothing to compare against");
        return;
    }
    build_release_plugins();
    let iterations: usize = std::env::var("FLANNEL_BENCH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let tmp = tempfile::tempdir().unwrap();
    let host = TestNs::new("flbh");

    let ours_dir = tmp.path().join("ours");
    let ours_subnet = write_subnet_env(
        &tmp.path().join("ours-run"),
        "FLANNEL_NETWORK=10.250.0.0/16\nFLANNEL_SUBNET=10.250.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
    );
    let ours_config = json!({
        "cniVersion": "1.0.0", "name": "benchours", "type": "flannel",
        "subnetFile": ours_subnet, "dataDir": ours_dir.join("flannel"),
        "ipam": {"dataDir": ours_dir.join("networks")},
        "delegate": {"bridge": "cnib0", "hairpinMode": true, "isDefaultGateway": true}
    });

    // Go gets exactly what our flannel hands our bridge, on its own bridge and subnet.
    let go_dir = tmp.path().join("go");
    let go_subnet = SubnetEnv::parse(
        "FLANNEL_NETWORK=10.251.0.0/16\nFLANNEL_SUBNET=10.251.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
    )
    .unwrap();
    let go_conf = NetConf::parse(&json!({
        "cniVersion": "1.0.0", "name": "benchgo", "type": "flannel",
        "ipam": {"dataDir": go_dir.join("networks")},
        "delegate": {"bridge": "cnib1", "hairpinMode": true, "isDefaultGateway": true}
    }))
    .unwrap();
    let go_config = build_delegate(&go_conf, &go_subnet).unwrap();

    // Our bridge alone, given the same kind of config: what flannel itself adds to ours.
    let direct_subnet = SubnetEnv::parse(
        "FLANNEL_NETWORK=10.252.0.0/16\nFLANNEL_SUBNET=10.252.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
    )
    .unwrap();
    let direct_conf = NetConf::parse(&json!({
        "cniVersion": "1.0.0", "name": "benchdirect", "type": "flannel",
        "ipam": {"dataDir": tmp.path().join("direct/networks")},
        "delegate": {"bridge": "cnib2", "hairpinMode": true, "isDefaultGateway": true}
    }))
    .unwrap();
    let direct_config = build_delegate(&direct_conf, &direct_subnet).unwrap();

    let mut stacks = [
        Stack {
            label: "ours",
            plugin: bin_dir().join("flannel"),
            cni_path: bin_dir().display().to_string(),
            config: ours_config,
            pod: TestNs::new("flbo"),
            add: Vec::new(),
            del: Vec::new(),
        },
        Stack {
            label: "go",
            plugin: Path::new(GO_PLUGIN_DIR).join("bridge"),
            cni_path: GO_PLUGIN_DIR.to_string(),
            config: go_config,
            pod: TestNs::new("flbg"),
            add: Vec::new(),
            del: Vec::new(),
        },
        Stack {
            label: "direct",
            plugin: bin_dir().join("bridge"),
            cni_path: bin_dir().display().to_string(),
            config: direct_config,
            pod: TestNs::new("flbd"),
            add: Vec::new(),
            del: Vec::new(),
        },
    ];

    for n in 0..10 {
        for s in stacks.iter_mut() {
            s.round(&host, n, false);
        }
    }
    for n in 0..iterations {
        // Rotate which goes first so none always follows another's teardown.
        for k in 0..stacks.len() {
            let i = (n + k) % stacks.len();
            stacks[i].round(&host, n + 10, true);
        }
    }

    println!(
        "flannel side by side, {iterations} rounds, one host namespace (times in ms, spawn to exit)"
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>8}",
        "stack", "ADD p50", "ADD p99", "DEL p50", "DEL p99"
    );
    let names = [
        "ours: flannel -> bridge -> host-local",
        "Go (Debian 1.1.1): bridge -> host-local",
        "ours without flannel: bridge -> host-local",
    ];
    for (s, name) in stacks.iter().zip(names) {
        println!(
            "{:<44} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            name,
            ms(percentile(&s.add, 0.5)),
            ms(percentile(&s.add, 0.99)),
            ms(percentile(&s.del, 0.5)),
            ms(percentile(&s.del, 0.99)),
        );
    }
    let ratio = |f: fn(&Stack) -> &Vec<Duration>, p: f64| {
        ms(percentile(f(&stacks[0]), p)) / ms(percentile(f(&stacks[1]), p))
    };
    println!(
        "{:<44} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
        "ratio ours / Go (below 1: ours faster)",
        ratio(|s| &s.add, 0.5),
        ratio(|s| &s.add, 0.99),
        ratio(|s| &s.del, 0.5),
        ratio(|s| &s.del, 0.99),
    );
}
