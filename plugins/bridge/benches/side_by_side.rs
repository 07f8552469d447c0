//! Our bridge (with our host-local) against Debian's Go bridge (with its host-local), side by
//! side in one run, each on a throwaway host namespace of its own, ipMasq on:
//!
//! * 200 pods added one after another, then deleted one after another: ADD and DEL p50/p99;
//! * 200 ADDs at concurrency 8 on a fresh node: throughput;
//! * the peak RSS of the bridge process (wait4's rusage, which also covers the children it
//!   waited for: IPAM and the rule tools).
//!
//! Run as root: `cargo bench -p bridge` (it builds our host-local in release if missing).
//! BENCH_PODS and BENCH_CONCURRENCY change the sizes. BENCH_BASELINE=<dir> adds a third row
//! in the same run: the `bridge` and `host-local` in that directory (an earlier build of ours),
//! so that a change is compared with what came before it on the same machine at the same time.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::{TestNs, GO_PLUGIN_DIR};

struct Impl {
    label: String,
    /// CNI_PATH: `bridge` and `host-local`.
    dir: PathBuf,
    _keep: Option<TempDir>,
}

struct Run {
    elapsed: Duration,
    maxrss_kib: i64,
}

/// Runs `bridge` inside `host` as a runtime does, timing it and reading its peak RSS.
#[allow(clippy::zombie_processes)] // reaped by wait4, which also gives the rusage
fn invoke(imp: &Impl, host: &TestNs, command: &str, pod: &TestNs, id: &str, conf: &Value) -> Run {
    let stdin = conf.to_string();
    let start = Instant::now();
    let mut child = host
        .command(imp.dir.join("bridge"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", pod.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &imp.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the bridge plugin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our own child, not yet waited for.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let elapsed = start.elapsed();
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} {command} {id} failed: {out}\n{err}",
        imp.label
    );
    Run {
        elapsed,
        maxrss_kib: usage.ru_maxrss,
    }
}

fn conf(data: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "benchnet",
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "ipMasq": true,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.88.0.0/16"}]],
            "dataDir": data.display().to_string(),
        }
    })
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Figures {
    add_p50: Duration,
    add_p99: Duration,
    del_p50: Duration,
    del_p99: Duration,
    per_sec: f64,
    maxrss_kib: i64,
}

fn sequential(imp: &Impl, pods: &[TestNs]) -> (Vec<Duration>, Vec<Duration>, i64) {
    let host = TestNs::new("bbh");
    let data = TempDir::new().unwrap();
    let conf = conf(data.path());
    let mut rss = 0;
    let mut adds = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = invoke(imp, &host, "ADD", pod, &format!("seq-{i}"), &conf);
        rss = rss.max(r.maxrss_kib);
        adds.push(r.elapsed);
    }
    let mut dels = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = invoke(imp, &host, "DEL", pod, &format!("seq-{i}"), &conf);
        rss = rss.max(r.maxrss_kib);
        dels.push(r.elapsed);
    }
    adds.sort();
    dels.sort();
    (adds, dels, rss)
}

/// ADDs per second with `workers` at once on a fresh node (then everything deleted, untimed).
fn concurrent(imp: &Impl, pods: &[TestNs], workers: usize) -> f64 {
    let host = TestNs::new("bbc");
    let data = TempDir::new().unwrap();
    let conf = conf(data.path());
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(pod) = pods.get(i) else { break };
                invoke(imp, &host, "ADD", pod, &format!("conc-{i}"), &conf);
            });
        }
    });
    let per_sec = pods.len() as f64 / start.elapsed().as_secs_f64();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(pod) = pods.get(i) else { break };
                invoke(imp, &host, "DEL", pod, &format!("conc-{i}"), &conf);
            });
        }
    });
    per_sec
}

fn measure(imp: &Impl, pods: &[TestNs], workers: usize) -> Figures {
    let (adds, dels, rss) = sequential(imp, pods);
    let per_sec = concurrent(imp, pods, workers);
    Figures {
        add_p50: pct(&adds, 0.5),
        add_p99: pct(&adds, 0.99),
        del_p50: pct(&dels, 0.5),
        del_p99: pct(&dels, 0.99),
        per_sec,
        maxrss_kib: rss,
    }
}

/// Our binaries: the bridge cargo built for this bench and host-local from the same target
/// directory, built here when it is missing.
fn ours() -> Impl {
    let bridge = PathBuf::from(env!("CARGO_BIN_EXE_bridge"));
    let host_local = bridge.with_file_name("host-local");
    if !host_local.exists() {
        let target = bridge
            .parent()
            .and_then(Path::parent)
            .expect("the target directory");
        eprintln!("building host-local (release) into {}", target.display());
        let status =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["build", "--release", "-p", "host-local", "--target-dir"])
                .arg(target)
                .status()
                .expect("running cargo");
        assert!(status.success(), "building host-local failed");
    }
    let dir = TempDir::new().unwrap();
    symlink(&bridge, dir.path().join("bridge")).unwrap();
    symlink(&host_local, dir.path().join("host-local")).unwrap();
    Impl {
        label: "rust bridge + rust host-local".into(),
        dir: dir.path().to_path_buf(),
        _keep: Some(dir),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !nix_is_root() {
        eprintln!("side_by_side: needs root (network namespaces); skipped");
        return;
    }
    if !Path::new(GO_PLUGIN_DIR).join("bridge").exists() {
        eprintln!("side_by_side: the Go plugins are not in {GO_PLUGIN_DIR}; skipped");
        return;
    }
    let n: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let workers: usize = std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let rust = ours();
    let go = Impl {
        label: "go bridge + go host-local".into(),
        dir: PathBuf::from(GO_PLUGIN_DIR),
        _keep: None,
    };
    let baseline = std::env::var_os("BENCH_BASELINE").map(|dir| Impl {
        label: "baseline (BENCH_BASELINE)".into(),
        dir: PathBuf::from(dir),
        _keep: None,
    });
    eprintln!("creating {n} pod namespaces...");
    let pods: Vec<TestNs> = (0..n).map(|_| TestNs::new("bbp")).collect();
    // Warm both (page cache, first bridge creation) outside the figures.
    for imp in [Some(&rust), Some(&go), baseline.as_ref()]
        .into_iter()
        .flatten()
    {
        let host = TestNs::new("bbw");
        let data = TempDir::new().unwrap();
        let c = conf(data.path());
        invoke(imp, &host, "ADD", &pods[0], "warm", &c);
        invoke(imp, &host, "DEL", &pods[0], "warm", &c);
    }
    eprintln!("measuring {} ...", rust.label);
    let r = measure(&rust, &pods, workers);
    eprintln!("measuring {} ...", go.label);
    let g = measure(&go, &pods, workers);
    let b = baseline.as_ref().map(|imp| {
        eprintln!("measuring {} in {} ...", imp.label, imp.dir.display());
        measure(imp, &pods, workers)
    });

    println!(
        "bridge side by side: {n} pods one after another with ipMasq, then {n} ADDs at concurrency {workers}"
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "", "ADD p50", "ADD p99", "DEL p50", "DEL p99", "ADD/s (x8)", "peak RSS"
    );
    let rows = [
        Some((&rust, &r)),
        Some((&go, &g)),
        baseline.as_ref().zip(b.as_ref()),
    ];
    for (imp, f) in rows.into_iter().flatten() {
        let label = &imp.label;
        println!(
            "{:<34} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>12.1} {:>7.2}MiB",
            label,
            ms(f.add_p50),
            ms(f.add_p99),
            ms(f.del_p50),
            ms(f.del_p99),
            f.per_sec,
            f.maxrss_kib as f64 / 1024.0
        );
    }
    println!(
        "ratios rust/go: ADD p50 {:.2} (target <= 0.20), DEL p50 {:.2} (target <= 0.33), \
         throughput {:.1}x (target >= 5x), peak RSS {:.2} ({:.2} MiB, target <= 5 MiB)",
        ms(r.add_p50) / ms(g.add_p50),
        ms(r.del_p50) / ms(g.del_p50),
        r.per_sec / g.per_sec,
        r.maxrss_kib as f64 / g.maxrss_kib as f64,
        r.maxrss_kib as f64 / 1024.0
    );
    if let Some(b) = &b {
        println!(
            "ratios rust/baseline: ADD p50 {:.2}, DEL p50 {:.2}, throughput {:.2}x, peak RSS {:.2}",
            ms(r.add_p50) / ms(b.add_p50),
            ms(r.del_p50) / ms(b.del_p50),
            r.per_sec / b.per_sec,
            r.maxrss_kib as f64 / b.maxrss_kib as f64
        );
    }
    println!("(peak RSS is wait4's ru_maxrss: the bridge or the largest child it waited for)");
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
