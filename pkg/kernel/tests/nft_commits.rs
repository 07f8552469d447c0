//! Commits to a table announced as they happen, with the process that made each; commits to
//! other tables not at all.

use cni_kernel::nft_commits::{Commit, TableCommits};
use testkit::TestNs;

#[test]
fn commits_touching_the_table_are_announced_with_their_process() {
    let ns = TestNs::new("nftc");
    let mut commits = ns
        .run_inside(|| TableCommits::subscribe("inet", "watched"))
        .unwrap();
    let nft = |script: &str| -> u32 {
        let child = ns.command("nft").arg(script).spawn().unwrap();
        let pid = child.id();
        assert!(
            child.wait_with_output().unwrap().status.success(),
            "nft {script}"
        );
        pid
    };
    nft("add table inet other; add chain inet other c");
    let first = nft("add table inet watched; add set inet watched s { type ipv4_addr; }");
    nft("add table ip watched");
    let second = nft("add element inet watched s { 10.0.0.1 }");
    // A commit that touches both: announced once.
    let third = nft("add chain inet other d; delete element inet watched s { 10.0.0.1 }");
    // Read on a thread of its own, as the daemon does; the answers came in order.
    let got: Vec<Commit> =
        std::thread::spawn(move || (0..3).map(|_| commits.wait().unwrap()).collect())
            .join()
            .unwrap();
    assert_eq!(
        got,
        [Commit::By(first), Commit::By(second), Commit::By(third)]
    );
}
