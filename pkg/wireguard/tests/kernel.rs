//! The kernel's generic netlink family against the real kernel: where the kernel has WireGuard,
//! a device made over rtnetlink and configured over generic netlink reads back as set; where it
//! has none (this project's machines), the round trip is listed as skipped. Whether flanneld
//! takes the kernel path is its backend's test (pkg/flanneld/tests/wireguard.rs).

use cni_kernel::netlink::{LinkKind, LinkSpec};
use cni_kernel::{Netlink, Netns};
use testkit::{runs_here, unique_name, Need, TestNs};
use wireguard::genl::KernelWireguard;
use wireguard::uapi::{DeviceConfig, PeerConfig};
use wireguard::Key;

#[test]
fn a_kernel_device_reads_back_as_set() {
    let ns = TestNs::new("wgk");
    let handle = Netns::open(ns.path()).unwrap();
    let nl = Netlink::open_in(&handle).unwrap();
    let has_family = ns.run_inside(|| matches!(KernelWireguard::open(), Ok(Some(_))));
    if !runs_here(
        has_family,
        Need::Kernel("WireGuard in the kernel (CONFIG_WIREGUARD)"),
    ) {
        return;
    }
    let name = unique_name("wgk");
    let spec = LinkSpec {
        name: name.clone(),
        kind: LinkKind::Named("wireguard"),
        mtu: Some(1420),
        mac: None,
    };
    assert!(nl.create_link(&spec).unwrap());
    let private = Key::generate().unwrap();
    let mut peer = PeerConfig::new(Key::generate().unwrap().public());
    peer.endpoint = Some("192.0.2.7:51820".parse().unwrap());
    peer.persistent_keepalive = Some(25);
    peer.preshared_key = Some(Key::generate().unwrap());
    peer.replace_allowed_ips = true;
    peer.allowed_ips = vec![
        "10.5.7.0/24".parse().unwrap(),
        "fd00:5:7::/64".parse().unwrap(),
    ];
    let config = DeviceConfig {
        private_key: Some(private),
        listen_port: Some(51820),
        replace_peers: true,
        peers: vec![peer.clone()],
        ..Default::default()
    };
    let state = ns.run_inside(|| {
        let mut wg = KernelWireguard::open()
            .unwrap()
            .expect("the family answers");
        wg.set(&name, &config).unwrap();
        wg.get(&name).unwrap()
    });
    assert_eq!(state.private_key, Some(private));
    assert_eq!(state.listen_port, 51820);
    assert_eq!(state.peers.len(), 1);
    let p = &state.peers[0];
    assert_eq!(p.public_key, peer.public_key);
    assert_eq!(p.endpoint, peer.endpoint);
    assert_eq!(p.preshared_key, peer.preshared_key);
    assert_eq!(p.persistent_keepalive, 25);
    assert_eq!(p.allowed_ips, peer.allowed_ips);
}
