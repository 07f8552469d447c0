//! ADD and DEL of our host-local and the Go one, side by side in the same run, with
//! 10, 1,000 and 10,000 addresses already allocated in a /16.
//!
//! `cargo bench -p host-local [-- throughput]`. Each implementation gets its own dataDir, pre-filled by
//! writing reservation files directly in the Go format; each timed ADD is followed by a
//! timed DEL of the same container, so the count stays put. Sizes and implementations
//! take turns in a shuffled order within each iteration so that every series sees the
//! same machine. Times are whole process runs, as a runtime sees them; the `floor` row
//! is `/bin/true` started the same way.
//!
//! Then throughput: ADDs into one network by 8 runtime threads at once (each starting its
//! next plugin as soon as the last one exits) against one thread, ours and Go taking turns
//! block by block.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GO: &str = "/usr/lib/cni/host-local";
const SIZES: [usize; 3] = [10, 1_000, 10_000];
const ITERATIONS: usize = 200;
const WARMUP: usize = 5;
/// Runtime threads starting plugins at once in the throughput rows.
const CONCURRENCY: usize = 8;
/// ADDs per timed block, and blocks per implementation and concurrency.
const BLOCK: usize = 200;
const BLOCKS: usize = 5;

struct Impl {
    bin: PathBuf,
    data_dir: PathBuf,
}

fn config(data_dir: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"bench","ipam":{{"type":"host-local","subnet":"10.128.0.0/16","dataDir":"{}"}}}}"#,
        data_dir.display()
    )
}

/// One whole plugin run; panics on failure so that a broken run is never timed as fast.
fn run(bin: &Path, command: &str, id: &str, conf: &str) -> Duration {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", "/var/run/netns/bench")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{} {command} failed: {}{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// `n` reservations as the Go plugin writes them, and its last_reserved_ip.
fn prefill(data_dir: &Path, n: usize) {
    let dir = data_dir.join("bench");
    let _ = std::fs::remove_dir_all(data_dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut last = String::new();
    for i in 0..n {
        let host = i + 2; // .0.1 is the gateway
        last = format!("10.128.{}.{}", host / 256, host % 256);
        std::fs::write(dir.join(&last), format!("prefill-{i}\r\neth0")).unwrap();
    }
    std::fs::write(dir.join("last_reserved_ip.0"), &last).unwrap();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

struct Row {
    size: usize,
    op: &'static str,
    ours: (Duration, Duration),
    go: Option<(Duration, Duration)>,
}

fn main() {
    let ours = PathBuf::from(env!("CARGO_BIN_EXE_host-local"));
    let scratch = tempfile::tempdir().unwrap();
    let mut impls = vec![Impl {
        bin: ours,
        data_dir: scratch.path().join("ours"),
    }];
    if Path::new(GO).exists() {
        impls.push(Impl {
            bin: PathBuf::from(GO),
            data_dir: scratch.path().join("go"),
        });
    } else {
        eprintln!("{GO} is not installed: measuring ours alone");
    }

    // `cargo bench -p host-local -- throughput` measures throughput alone.
    if std::env::args().any(|a| a == "throughput") {
        return throughput(&impls, scratch.path());
    }
    // times[size][impl][op]: every series sees the same stretch of machine time, since
    // sizes and implementations take turns within each iteration.
    let mut times: Vec<Vec<[Vec<Duration>; 2]>> = SIZES
        .iter()
        .map(|_| impls.iter().map(|_| [vec![], vec![]]).collect())
        .collect();
    let data_dir = |im: &Impl, size: usize| im.data_dir.join(size.to_string());
    for &size in &SIZES {
        for im in &impls {
            prefill(&data_dir(im, size), size);
        }
    }
    let mut order: Vec<(usize, usize)> = (0..SIZES.len())
        .flat_map(|s| (0..impls.len()).map(move |k| (s, k)))
        .collect();
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..WARMUP + ITERATIONS {
        let id = format!("bench-{i}");
        // A fresh order each time, so that no series always follows the heaviest one.
        for j in (1..order.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            order.swap(j, (rng % (j as u64 + 1)) as usize);
        }
        for &(s, k) in &order {
            let im = &impls[k];
            let conf = config(&data_dir(im, SIZES[s]));
            let add = run(&im.bin, "ADD", &id, &conf);
            let del = run(&im.bin, "DEL", &id, &conf);
            if i >= WARMUP {
                times[s][k][0].push(add);
                times[s][k][1].push(del);
            }
        }
        if (i + 1) % 50 == 0 {
            eprintln!("{} of {} iterations", i + 1, WARMUP + ITERATIONS);
        }
    }
    // The cost of starting any process here, which no plugin can go below.
    let mut floor: Vec<Duration> = (0..ITERATIONS)
        .map(|_| {
            let started = Instant::now();
            let st = Command::new("/bin/true")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .status()
                .unwrap();
            assert!(st.success());
            started.elapsed()
        })
        .collect();
    floor.sort();

    let mut rows = Vec::new();
    for (s, &size) in SIZES.iter().enumerate() {
        for (o, op) in ["ADD", "DEL"].into_iter().enumerate() {
            let mut stats = times[s].iter_mut().map(|t| {
                t[o].sort();
                (percentile(&t[o], 0.5), percentile(&t[o], 0.99))
            });
            rows.push(Row {
                size,
                op,
                ours: stats.next().unwrap(),
                go: stats.next(),
            });
        }
    }

    println!();
    println!(
        "host-local: whole process runs in ms, {ITERATIONS} ADD+DEL pairs per row, addresses in a /16"
    );
    println!(
        "{:>9} {:>4} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9}",
        "allocated", "op", "ours p50", "ours p99", "go p50", "go p99", "go/ours50", "go/ours99"
    );
    for r in &rows {
        let (gp50, gp99, x50, x99) = match r.go {
            Some((g50, g99)) => (
                ms(g50),
                ms(g99),
                format!("{:.1}x", g50.as_secs_f64() / r.ours.0.as_secs_f64()),
                format!("{:.1}x", g99.as_secs_f64() / r.ours.1.as_secs_f64()),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:>9} {:>4} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9}",
            r.size,
            r.op,
            ms(r.ours.0),
            ms(r.ours.1),
            gp50,
            gp99,
            x50,
            x99
        );
    }
    println!(
        "{:>9} {:>4} | {:>9} {:>9} |  (starting /bin/true the same way)",
        "floor",
        "-",
        ms(percentile(&floor, 0.5)),
        ms(percentile(&floor, 0.99))
    );
    println!();
    for op in ["ADD", "DEL"] {
        let at = |size: usize| rows.iter().find(|r| r.size == size && r.op == op).unwrap();
        let (small, large) = (at(10), at(10_000));
        println!(
            "ours {op}: 10,000 vs 10 allocated: p50 {:.2}x, p99 {:.2}x",
            large.ours.0.as_secs_f64() / small.ours.0.as_secs_f64(),
            large.ours.1.as_secs_f64() / small.ours.1.as_secs_f64()
        );
    }
    throughput(&impls, scratch.path());
}

/// `BLOCK` ADDs into a fresh network by `threads` threads at once, then their DELs (untimed);
/// the ADDs' wall time.
fn add_block(bin: &Path, data_dir: &Path, threads: usize, tag: &str) -> Duration {
    let _ = std::fs::remove_dir_all(data_dir);
    let conf = config(data_dir);
    let per_thread = BLOCK / threads;
    let all = |command: &'static str| {
        std::thread::scope(|s| {
            for t in 0..threads {
                let conf = &conf;
                s.spawn(move || {
                    for i in 0..per_thread {
                        run(bin, command, &format!("{tag}-{t}-{i}"), conf);
                    }
                });
            }
        })
    };
    let started = Instant::now();
    all("ADD");
    let took = started.elapsed();
    all("DEL");
    took
}

fn throughput(impls: &[Impl], scratch: &Path) {
    // totals[impl][sequential, concurrent]
    let mut totals = vec![[Duration::ZERO; 2]; impls.len()];
    for block in 0..BLOCKS {
        for (c, threads) in [1, CONCURRENCY].into_iter().enumerate() {
            for (k, im) in impls.iter().enumerate() {
                let dir = scratch.join(format!("throughput-{k}"));
                totals[k][c] += add_block(&im.bin, &dir, threads, &format!("t{block}{c}"));
            }
        }
    }
    let rate = |d: Duration| (BLOCK * BLOCKS) as f64 / d.as_secs_f64();
    println!();
    println!(
        "host-local throughput: {} ADDs into an empty /16 per row, in {BLOCKS} blocks taking turns",
        BLOCK * BLOCKS
    );
    println!(
        "{:>6} | {:>16} | {:>22} | {:>8}",
        "",
        "ADDs/s, 1 thread",
        format!("ADDs/s, {CONCURRENCY} at once"),
        "speed-up"
    );
    for (k, name) in ["ours", "go"].iter().enumerate().take(impls.len()) {
        let (seq, conc) = (rate(totals[k][0]), rate(totals[k][1]));
        println!(
            "{name:>6} | {seq:>16.0} | {conc:>22.0} | {:>7.2}x",
            conc / seq
        );
    }
    if impls.len() == 2 {
        println!(
            "ours / go at {CONCURRENCY} at once: {:.1}x",
            rate(totals[0][1]) / rate(totals[1][1])
        );
    }
}
