//! The iptables mode chosen from what a namespace's two iptables hold, as iptables-wrappers
//! chooses it, and the rules written where it says. One test: the mode is the process's.

use cni_kernel::firewall::xtables::{self, IptablesMode};
use cni_kernel::firewall::{remove_in_unused_iptables, Family, Iptables, RuleTool, Rules};
use cni_kernel::Error;
use testkit::TestNs;

/// The chain `CNI-XTEST` in nat, removed where a listing shows it.
struct Xtest;

impl Rules for Xtest {
    type Error = Error;
    fn families(&self) -> Vec<Family> {
        vec![Family::V4]
    }
    fn iptables_reads(&self) -> &[&'static str] {
        &["nat"]
    }
    fn iptables(&self, _: Family, saved: &[String]) -> Result<Option<String>, Error> {
        Ok(saved[0]
            .contains(":CNI-XTEST")
            .then(|| "*nat\n-X CNI-XTEST\nCOMMIT\n".to_string()))
    }
    fn nft(&self, _: &[Option<String>]) -> Result<Option<String>, Error> {
        Ok(None)
    }
}

const CHAIN: &str = "*nat\n:CNI-XTEST - [0:0]\nCOMMIT\n";

fn in_ns<T: Send>(ns: &TestNs, f: impl FnOnce() -> T + Send) -> T {
    ns.run_inside(f)
}

#[test]
fn the_mode_holding_the_hosts_rules_is_the_one_written() {
    // Docker's leftovers in legacy: a FORWARD policy DROP and its chains.
    let docker = TestNs::new("kxd");
    docker.run("iptables-legacy", &["-P", "FORWARD", "DROP"]);
    docker.run("iptables-legacy", &["-N", "DOCKER-USER"]);
    docker.run("iptables-legacy", &["-A", "FORWARD", "-j", "DOCKER-USER"]);
    let chosen = in_ns(&docker, || xtables::choose(None, &[])).unwrap();
    assert_eq!(chosen.mode, IptablesMode::Legacy, "{chosen:?}");
    assert!(
        chosen.reason.contains("iptables-legacy holds more"),
        "{chosen:?}"
    );
    // PATH's plain iptables is this machine's nft: legacy is run by name.
    assert_eq!(chosen.program, "iptables-legacy-restore");
    assert_eq!(Iptables(Family::V4).program(), "iptables-legacy-restore");
    in_ns(&docker, || Iptables(Family::V4).apply(CHAIN)).unwrap();
    assert!(docker
        .run("iptables-legacy-save", &["-t", "nat"])
        .contains(":CNI-XTEST"));
    assert!(!docker
        .run("iptables-nft-save", &["-t", "nat"])
        .contains(":CNI-XTEST"));
    // What an earlier run wrote in nft is removed from there; legacy's stays.
    docker.run("iptables-nft", &["-t", "nat", "-N", "CNI-XTEST"]);
    let removed = in_ns(&docker, || remove_in_unused_iptables(&Xtest)).unwrap();
    assert!(removed.changed);
    assert!(!docker
        .run("iptables-nft-save", &["-t", "nat"])
        .contains(":CNI-XTEST"));
    assert!(docker
        .run("iptables-legacy-save", &["-t", "nat"])
        .contains(":CNI-XTEST"));

    // kubelet's hint in nft decides for nft, whatever legacy holds; PATH's plain programs run it.
    let kubelet = TestNs::new("kxk");
    kubelet.run("iptables-legacy", &["-P", "FORWARD", "DROP"]);
    kubelet.run(
        "iptables-nft",
        &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
    );
    let chosen = in_ns(&kubelet, || xtables::choose(None, &[])).unwrap();
    assert_eq!(chosen.mode, IptablesMode::Nft, "{chosen:?}");
    assert!(chosen.reason.contains("KUBE-IPTABLES-HINT"), "{chosen:?}");
    assert_eq!(chosen.program, "iptables-restore");

    // Nothing anywhere: nft. Asked for: that mode, whatever the namespace holds.
    let empty = TestNs::new("kxe");
    let chosen = in_ns(&empty, || xtables::choose(None, &[])).unwrap();
    assert_eq!(chosen.mode, IptablesMode::Nft, "{chosen:?}");
    let chosen = in_ns(&empty, || xtables::choose(Some(IptablesMode::Legacy), &[])).unwrap();
    assert_eq!(
        (chosen.mode, chosen.reason.as_str(), chosen.program),
        (IptablesMode::Legacy, "asked for", "iptables-legacy-restore")
    );
}
