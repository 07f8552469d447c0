//! The crash-injection soak's short form: 200 pods per firewall backend, a share of the plugin
//! processes SIGKILLed mid-run; nothing may be left on the node and no address handed out
//! twice. `scripts/soak.sh` runs the long form.

use e2e::soak::{leaks_of_an_undeleted_pod, run, Options};
use std::time::Duration;

const CYCLES: usize = 200;
/// A loaded 2-core machine does 200 pods in well under a minute; past this the run is cut
/// short and fails as incomplete.
const TIME_LIMIT: Duration = Duration::from_secs(240);

fn soak(backend: &str) {
    let mut opts = Options::new(CYCLES, backend);
    opts.time_limit = TIME_LIMIT;
    eprintln!("soak {backend}: seed {}", opts.seed);
    let report = run(&opts);
    eprintln!("{}", report.summary());
    assert!(
        report.passed(),
        "soak {backend} (seed {}) failed:\n{}",
        opts.seed,
        report.summary()
    );
    assert!(
        report.landed() >= CYCLES / 10,
        "only {} kills landed mid-run: the soak proved little\n{}",
        report.landed(),
        report.summary()
    );
}

#[test]
fn soak_iptables_leaves_nothing_after_kills() {
    soak("iptables");
}

#[test]
fn soak_nftables_leaves_nothing_after_kills() {
    soak("nftables");
}

#[test]
fn the_inspection_sees_every_kind_of_leftover() {
    for backend in ["iptables", "nftables"] {
        let leaks = leaks_of_an_undeleted_pod(backend);
        for kind in [
            "host-local file",
            "flannel's saved delegate",
            "veth",
            "conntrack entry",
        ] {
            assert!(
                leaks.iter().any(|l| l.starts_with(kind)),
                "{backend}: no {kind} among {leaks:#?}"
            );
        }
        let rules = if backend == "iptables" {
            "iptables-save: "
        } else {
            "nft rule "
        };
        assert!(
            leaks.iter().any(|l| l.starts_with(rules)),
            "{backend}: no {rules} among {leaks:#?}"
        );
    }
}
