//! Both rule tools behind the one trait, in a throwaway namespace: a batch written, listed,
//! and removed from what the listing shows; and the driver choosing one of them.

use cni_kernel::firewall::{Backend, Family, Iptables, Nftables, RuleTool, Rules, Writers};
use cni_kernel::{Error, Netns};
use testkit::TestNs;

/// A test chain `CNI-KTEST` (iptables) or table `inet cni_ktest` (nftables): written whole,
/// or removed when the listing shows it.
struct Ktest {
    remove: bool,
}

impl Rules for Ktest {
    type Error = Error;
    fn families(&self) -> Vec<Family> {
        vec![Family::V4]
    }
    fn iptables_reads(&self) -> &[&'static str] {
        if self.remove {
            &["nat"]
        } else {
            &[]
        }
    }
    fn iptables_head(&self, _: Family) -> String {
        "*nat\n:CNI-KTEST - [0:0]\n".to_string()
    }
    fn iptables(&self, f: Family, saved: &[String]) -> Result<Option<String>, Error> {
        Ok(match self.remove {
            false => Some(self.iptables_head(f) + "-A CNI-KTEST -j MASQUERADE\nCOMMIT\n"),
            true => saved[0]
                .contains("CNI-KTEST")
                .then(|| "*nat\n-F CNI-KTEST\n-X CNI-KTEST\nCOMMIT\n".to_string()),
        })
    }
    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        match self.remove {
            true => vec![&["table", "inet", "cni_ktest"]],
            false => vec![],
        }
    }
    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, Error> {
        Ok(match self.remove {
            false => Some("add table inet cni_ktest\nadd chain inet cni_ktest c\n".to_string()),
            true => listed[0]
                .as_deref()
                .is_some_and(|l| l.contains("cni_ktest"))
                .then(|| "delete table inet cni_ktest\n".to_string()),
        })
    }
}

#[test]
fn iptables_writes_one_batch_and_removes_what_it_lists() {
    let ns = TestNs::new("kfi");
    let handle = Netns::open(ns.path()).unwrap();
    handle
        .run(|| {
            let tool = Iptables(Family::V4);
            tool.apply("*nat\n:CNI-KTEST - [0:0]\n-A CNI-KTEST -j MASQUERADE\nCOMMIT\n")
                .unwrap();
            let listed = tool.list(&["nat"]).unwrap().unwrap();
            assert!(listed.contains("-A CNI-KTEST -j MASQUERADE"), "{listed}");
            let removed = Backend::Iptables.remove(&Ktest { remove: true }).unwrap();
            assert!(removed.changed && removed.unreadable.is_empty());
            assert!(!tool.list(&["nat"]).unwrap().unwrap().contains("CNI-KTEST"));
            let bad = tool
                .apply("*nat\n-A NO-SUCH-CHAIN -j ACCEPT\nCOMMIT\n")
                .unwrap_err();
            assert!(bad.to_string().contains("iptables-restore"), "{bad}");
            assert!(
                bad.input().contains("NO-SUCH-CHAIN"),
                "the batch goes with the error"
            );
        })
        .unwrap();
    assert!(!ns
        .run("iptables-save", &["-t", "nat"])
        .contains("CNI-KTEST"));
}

#[test]
fn nftables_writes_one_transaction_and_lists_a_missing_table_as_none() {
    let ns = TestNs::new("kfn");
    let handle = Netns::open(ns.path()).unwrap();
    handle
        .run(|| {
            let scope = ["table", "inet", "cni_ktest"];
            assert_eq!(Nftables.list(&scope).unwrap(), None);
            let primed = Nftables.prime().unwrap();
            Nftables
                .apply_with(
                    Some(primed),
                    "add table inet cni_ktest\nadd chain inet cni_ktest c\n",
                )
                .unwrap();
            let listed = Nftables.list(&scope).unwrap().unwrap();
            assert!(listed.contains("\"cni_ktest\""), "{listed}");
            assert!(
                Backend::Nftables
                    .remove(&Ktest { remove: true })
                    .unwrap()
                    .changed
            );
            assert_eq!(Nftables.list(&scope).unwrap(), None);
            assert!(
                !Backend::Nftables
                    .remove(&Ktest { remove: true })
                    .unwrap()
                    .changed
            );
        })
        .unwrap();
}

#[test]
fn the_driver_writes_through_tools_started_early_and_reads_back_what_it_wrote() {
    let ns = TestNs::new("kfd");
    let handle = Netns::open(ns.path()).unwrap();
    handle
        .run(|| {
            for backend in [Backend::Iptables, Backend::Nftables] {
                let add = Ktest { remove: false };
                let started = Writers::start(backend, &[Family::V4], &add);
                started.write(backend.plan(&add).unwrap()).unwrap();
                let planned = backend.plan(&Ktest { remove: true }).unwrap();
                assert!(!planned.is_empty(), "{backend}: the removal sees the rules");
                assert!(backend.remove(&Ktest { remove: true }).unwrap().changed);
                assert!(backend.plan(&Ktest { remove: true }).unwrap().is_empty());
                // Started and never given a batch, a tool commits nothing.
                drop(Writers::start(backend, &[Family::V4], &add));
                assert!(backend.plan(&Ktest { remove: true }).unwrap().is_empty());
                // write: read, plan, apply in one call.
                assert!(backend.write(&add).unwrap());
                assert!(backend.remove(&Ktest { remove: true }).unwrap().changed);
            }
        })
        .unwrap();
}
