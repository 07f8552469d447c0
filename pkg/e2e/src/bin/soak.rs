//! `soak [cycles] [iptables|nftables] [seed]`: the crash-injection soak on a throwaway node
//! (see `e2e::soak`). Prints what it found and exits 1 when anything leaked or went wrong.

use e2e::soak::{run, Options};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cycles = match args.first().map(|a| a.parse::<usize>()) {
        None => 1000,
        Some(Ok(n)) => n,
        Some(Err(e)) => usage(&format!("cycles {:?}: {e}", args[0])),
    };
    let backend = args.get(1).map_or("iptables", String::as_str);
    if backend != "iptables" && backend != "nftables" {
        usage(&format!("backend {backend:?} is not iptables or nftables"));
    }
    let mut opts = Options::new(cycles, backend);
    if let Some(seed) = args.get(2) {
        opts.seed = seed
            .parse()
            .unwrap_or_else(|e| usage(&format!("seed {seed:?}: {e}")));
    }
    println!(
        "soak: {cycles} pods, portmap backend {backend}, {} at once, seed {}",
        opts.parallel, opts.seed
    );
    let report = run(&opts);
    println!("{}", report.summary());
    if !report.passed() {
        println!("soak FAILED ({backend}, seed {})", opts.seed);
        std::process::exit(1);
    }
    println!("soak passed ({backend}): nothing leaked, no address handed out twice");
}

fn usage(why: &str) -> ! {
    eprintln!("soak: {why}\nusage: soak [cycles] [iptables|nftables] [seed]");
    std::process::exit(2);
}
