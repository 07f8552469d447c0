//! Set and map elements written through nfnetlink, read back by `nft` as it would have written
//! them: ranges, single addresses, a range to the family's last address, verdict map jumps;
//! deleted the same way; a batch with one bad change changes nothing.

use cni_kernel::nft_commits::{Commit, TableCommits};
use cni_kernel::nft_elements::{Batch, Element};
use std::net::IpAddr;
use testkit::TestNs;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn nft(ns: &TestNs, args: &[&str]) -> String {
    let out = ns.command("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn elements(ns: &TestNs, kind: &str, name: &str) -> String {
    let listed = nft(ns, &["list", kind, "inet", "t", name]);
    listed
        .split_once("elements = {")
        .map(|(_, e)| e.split('}').next().unwrap_or_default())
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn elements_written_through_netlink_are_what_nft_lists_and_one_batch_is_one_commit() {
    let ns = TestNs::new("nfte");
    nft(
        &ns,
        &["add table inet t; \
           add set inet t s4 { type ipv4_addr; flags interval; }; \
           add set inet t s6 { type ipv6_addr; flags interval; }; \
           add chain inet t c; \
           add map inet t m4 { type ipv4_addr : verdict; }"],
    );
    let mut commits = ns
        .run_inside(|| TableCommits::subscribe("inet", "t"))
        .unwrap();

    let mut b = Batch::new("inet", "t").unwrap();
    b.add(
        "s4",
        &[
            Element::Range(ip("10.0.0.0"), ip("10.0.0.255")),
            Element::Range(ip("10.0.2.7"), ip("10.0.2.7")),
            Element::Range(ip("10.0.3.1"), ip("10.0.3.9")),
            Element::Range(ip("255.255.255.0"), ip("255.255.255.255")),
        ],
    );
    b.add("s6", &[Element::Range(ip("fd00::1"), ip("fd00::1"))]);
    b.add("m4", &[Element::Jump(ip("10.0.1.5"), "c".into())]);
    let tid = ns.run_inside(|| b.commit()).unwrap();
    assert_eq!(
        elements(&ns, "set", "s4"),
        "10.0.0.0/24, 10.0.2.7, 10.0.3.1-10.0.3.9, 255.255.255.0/24"
    );
    assert_eq!(elements(&ns, "set", "s6"), "fd00::1");
    assert_eq!(elements(&ns, "map", "m4"), "10.0.1.5 : jump c");
    let got = std::thread::spawn(move || {
        let c = commits.wait().unwrap();
        (c, commits)
    })
    .join()
    .unwrap();
    assert_eq!(
        got.0,
        Commit::By(tid),
        "one commit, announced as this thread's"
    );

    // Deleted the same way; a range grown in the same batch.
    let mut b = Batch::new("inet", "t").unwrap();
    b.delete(
        "s4",
        &[
            Element::Range(ip("10.0.0.0"), ip("10.0.0.255")),
            Element::Range(ip("255.255.255.0"), ip("255.255.255.255")),
            Element::Range(ip("10.0.3.1"), ip("10.0.3.9")),
        ],
    );
    b.add("s4", &[Element::Range(ip("10.0.3.1"), ip("10.0.3.20"))]);
    b.delete("m4", &[Element::Jump(ip("10.0.1.5"), String::new())]);
    ns.run_inside(|| b.commit()).unwrap();
    assert_eq!(elements(&ns, "set", "s4"), "10.0.2.7, 10.0.3.1-10.0.3.20");
    assert_eq!(elements(&ns, "map", "m4"), "");

    // A set made in the batch, filled in it: as `nft` would have made it.
    let mut b = Batch::new("inet", "t").unwrap();
    b.add_interval_set("n6", true);
    b.add("n6", &[Element::Range(ip("fd00::"), ip("fd00::ff"))]);
    ns.run_inside(|| b.commit()).unwrap();
    assert_eq!(elements(&ns, "set", "n6"), "fd00::/120");
    let made = nft(&ns, &["-j", "list", "set", "inet", "t", "n6"]);
    assert!(
        made.contains(r#""type": "ipv6_addr""#) && made.contains(r#""flags": ["interval"]"#),
        "{made}"
    );
    nft(&ns, &["add rule inet t c ip6 saddr @n6 accept"]);

    // A batch one of whose changes fails (no such set) changes nothing.
    let mut b = Batch::new("inet", "t").unwrap();
    b.add("s4", &[Element::Range(ip("10.9.0.0"), ip("10.9.0.1"))]);
    b.add("nothere", &[Element::Range(ip("10.9.0.0"), ip("10.9.0.1"))]);
    let err = ns.run_inside(|| b.commit()).unwrap_err();
    assert!(err.to_string().contains("nothere"), "{err}");
    assert_eq!(elements(&ns, "set", "s4"), "10.0.2.7, 10.0.3.1-10.0.3.20");
}
