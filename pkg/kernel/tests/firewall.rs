//! Both rule tools behind the one trait, in a throwaway namespace: a batch written, listed,
//! and removed from what the listing shows.

use cni_kernel::firewall::{self, Family, Iptables, Nftables, RuleTool};
use cni_kernel::Netns;
use testkit::TestNs;

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
            firewall::iptables_remove(&[Family::V4], "nat", |_, saved| {
                saved
                    .contains("CNI-KTEST")
                    .then(|| "*nat\n-F CNI-KTEST\n-X CNI-KTEST\nCOMMIT\n".to_string())
            })
            .unwrap();
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
            firewall::nft_remove(&[&scope], |l| {
                Ok::<_, cni_kernel::Error>(
                    l[0].contains("cni_ktest")
                        .then(|| "delete table inet cni_ktest\n".to_string()),
                )
            })
            .unwrap();
            assert_eq!(Nftables.list(&scope).unwrap(), None);
        })
        .unwrap();
}
