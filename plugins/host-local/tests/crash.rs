//! SIGKILL at random points of ADD and DEL leaves only complete reservations that DEL
//! and GC can release.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testkit::Invocation;

const RUNS: usize = 200;
/// Kills that must land mid-operation for the test to prove anything.
const KILLS: usize = RUNS / 5;
/// On a loaded machine runs are added until enough kills landed.
const MAX_RUNS: usize = 5 * RUNS;

/// xorshift64*: enough randomness for kill points, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Runs `inv` and SIGKILLs it after `delay` unless it finished first. True if it was killed.
fn run_and_kill(inv: &Invocation, conf: &Value, delay: Duration) -> bool {
    let mut child = inv.spawn_in(None, conf.to_string().as_bytes());
    std::thread::sleep(delay);
    let killed = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    child.wait().unwrap();
    killed
}

#[test]
fn sigkill_at_random_points_never_leaves_a_dangling_or_unreleasable_reservation() {
    let net = Net::new();
    let conf = net.conf(
        "1.1.0",
        json!({"ranges": [[{"subnet": "10.60.0.0/22"}], [{"subnet": "fd00:60::/64"}]]}),
    );
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);

    // How long a whole ADD takes here (the median of a few): kill points are spread over it.
    let mut used: Vec<String> = Vec::new();
    let mut times: Vec<u64> = (0..5)
        .map(|i| {
            let id = format!("calibrate-{i}");
            let started = Instant::now();
            ours("ADD").container_id(&id).run(&conf).ok();
            used.push(id);
            started.elapsed().as_micros() as u64
        })
        .collect();
    times.sort();
    // The kill window adapts to the machine's load: it shrinks when a run finishes before its
    // kill, and grows a little when the kill lands, so kills keep landing mid-operation.
    let mut span = times[2] * 3 / 2;

    let mut killed = 0;
    let mut runs = 0;
    for i in 0..MAX_RUNS {
        if i >= RUNS && killed >= KILLS {
            break;
        }
        runs += 1;
        let delete = !used.is_empty() && rng.below(3) == 0;
        let inv = if delete {
            let id = used[rng.below(used.len() as u64) as usize].clone();
            ours("DEL").container_id(&id)
        } else {
            let id = format!("crash-{i}");
            used.push(id.clone());
            ours("ADD").container_id(&id)
        };
        if run_and_kill(&inv, &conf, Duration::from_micros(rng.below(span))) {
            killed += 1;
            span += span / 50 + 1;
        } else {
            span = (span * 9 / 10).max(50);
        }
        // Now and then a whole ADD: it must repair what the kills left and stay distinct.
        if i % 20 == 19 {
            let id = format!("whole-{i}");
            used.push(id.clone());
            ours("ADD").container_id(&id).run(&conf).ok();
        }
    }
    eprintln!("{killed} of {runs} runs were killed mid-operation");
    assert!(
        killed >= KILLS,
        "too few kills landed ({killed} of {runs}): the test would prove little"
    );

    // Every reservation is complete and names a container that was used.
    let names: BTreeSet<String> = used.iter().map(|id| format!("{id}\r\neth0")).collect();
    for (ip, content) in net.reservations() {
        assert!(names.contains(&content), "{ip} holds {content:?}");
    }
    // No temporaries are left where the Go plugin would trip over them.
    for name in net.files() {
        assert!(
            name.parse::<std::net::IpAddr>().is_ok()
                || name == "lock"
                || name == INDEX
                || name.starts_with("last_reserved_ip."),
            "unexpected file {name}"
        );
    }
    // Each container holds at most one address per range set.
    let mut per_container: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (ip, content) in net.reservations() {
        per_container.entry(content).or_default().push(ip);
    }
    for (who, ips) in &per_container {
        let v4 = ips.iter().filter(|ip| ip.contains('.')).count();
        assert!(v4 <= 1 && ips.len() - v4 <= 1, "{who:?} holds {ips:?}");
    }

    // DEL releases half of them, GC the rest.
    for id in used.iter().step_by(2) {
        ours("DEL").container_id(id).run(&conf).ok();
    }
    let left: BTreeSet<String> = net.reservations().into_values().collect();
    for id in used.iter().step_by(2) {
        assert!(
            !left.contains(&format!("{id}\r\neth0")),
            "{id} was not released by DEL"
        );
    }
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    ours("GC").run(&gc).ok();
    net.assert_empty();
}
