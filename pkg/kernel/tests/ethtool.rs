//! A vxlan device's tx checksum offload read and turned off and on, as `ethtool -k` reads it.

use cni_kernel::ethtool;
use testkit::{runs_here, Need, TestNs};

#[test]
fn a_vxlan_devices_tx_checksum_offload_is_read_and_turned_off_and_on() {
    let has_ethtool = cni_kernel::firewall::has_tool("ethtool");
    if !runs_here(has_ethtool, Need::Installed("ethtool (scripts/deps.sh)")) {
        return;
    }
    let ns = TestNs::new("ket");
    ns.ip(&[
        "link", "add", "vx0", "type", "vxlan", "id", "5", "dstport", "8472",
    ]);
    let shown = |ns: &TestNs| ns.run("ethtool", &["-k", "vx0"]);
    let (on, off, gone) = ns.run_inside(|| {
        let on = ethtool::tx_checksum("vx0").unwrap();
        ethtool::set_tx_checksum("vx0", false).unwrap();
        let off = ethtool::tx_checksum("vx0").unwrap();
        let gone = ethtool::tx_checksum("vx9").unwrap_err().to_string();
        (on, off, gone)
    });
    assert!(on, "the kernel's default is on");
    assert!(!off);
    assert!(
        shown(&ns).contains("tx-checksum-ip-generic: off"),
        "{}",
        shown(&ns)
    );
    assert!(gone.contains("vx9"), "{gone}");
    ns.run_inside(|| ethtool::set_tx_checksum("vx0", true))
        .unwrap();
    assert!(
        shown(&ns).contains("tx-checksum-ip-generic: on"),
        "{}",
        shown(&ns)
    );
}
