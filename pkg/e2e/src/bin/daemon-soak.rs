//! `daemon-soak [seconds]`: the daemon's soak (see `e2e::daemon_soak`), an hour by default.
//! Prints what it measured and found, and exits 1 when anything leaked or went wrong.

use e2e::daemon_soak::{run, Options};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds = match args.first().map(|a| a.parse::<u64>()) {
        None => 3600,
        Some(Ok(n)) if n >= 60 => n,
        Some(Ok(n)) => usage(&format!("{n} s is too short: at least 60")),
        Some(Err(e)) => usage(&format!("seconds {:?}: {e}", args[0])),
    };
    let opts = Options::new(Duration::from_secs(seconds));
    println!(
        "daemon soak: {seconds} s on 3 nodes; {} joins and leaves a second, {} pods added and \
         deleted a second; RSS and descriptors held to 5% after a warm-up of {} s",
        opts.joins_per_s,
        opts.pods_per_s,
        opts.warmup.as_secs()
    );
    let report = run(&opts);
    println!("{}", report.summary());
    println!("samples (s, node, RSS KiB, fds):");
    for s in &report.samples {
        println!("  {} {} {} {}", s.at.as_secs(), s.node, s.rss_kib, s.fds);
    }
    if !report.passed() {
        println!("daemon soak FAILED");
        std::process::exit(1);
    }
    println!(
        "daemon soak passed: flat RSS and descriptors, nothing leaked, no address handed out twice"
    );
}

fn usage(why: &str) -> ! {
    eprintln!("daemon-soak: {why}\nusage: daemon-soak [seconds]");
    std::process::exit(2);
}
