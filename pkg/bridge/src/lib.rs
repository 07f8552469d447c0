//! The bridge plugin's decisions, pure and unit-tested: the config with the Go plugin's
//! defaults and checks, the gateways, the masquerade and MAC spoof-check rule text with the
//! Go plugin's names, and CHECK's comparisons. `effects` applies them to the kernel (through
//! cni-kernel) for the plugin binary, whose main.rs tells the verbs' story over it.

pub mod check;
pub mod config;
pub mod effects;
pub mod gateway;
pub mod masq;
pub mod spoofchk;

pub use config::NetConf;
pub use masq::IpFamily;

use ipnetwork::IpNetwork;

/// The host end of a pod's veth: `veth` and 8 hex digits, as the Go plugin names it.
pub fn host_veth_name(entropy: [u8; 4]) -> String {
    let hex: String = entropy.iter().map(|b| format!("{b:02x}")).collect();
    format!("veth{hex}")
}

/// A locally administered unicast MAC from random bytes (for a bridge we create, so that its
/// address does not follow whichever port has the lowest one).
pub fn local_mac(entropy: [u8; 6]) -> [u8; 6] {
    let mut mac = entropy;
    mac[0] = (mac[0] & 0xfe) | 0x02;
    mac
}

/// The families whose masquerade rules DEL looks for: those of the pod's addresses when the
/// interface still shows them, both when nothing says.
pub fn families_to_clean(pod_addrs: Option<&[IpNetwork]>) -> Vec<IpFamily> {
    match pod_addrs {
        Some(addrs) if !addrs.is_empty() => {
            let mut f: Vec<IpFamily> = addrs.iter().map(IpFamily::of).collect();
            f.sort_by_key(|f| *f == IpFamily::V6);
            f.dedup();
            f
        }
        _ => vec![IpFamily::V4, IpFamily::V6],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_names_look_like_the_go_plugins() {
        assert_eq!(host_veth_name([0x91, 0x74, 0xbe, 0x84]), "veth9174be84");
        assert_eq!(host_veth_name([0; 4]).len(), 12);
    }

    #[test]
    fn local_macs_are_unicast_and_local() {
        let m = local_mac([0xff; 6]);
        assert_eq!(m[0], 0xfe);
        let m = local_mac([0; 6]);
        assert_eq!(m[0], 0x02);
    }

    #[test]
    fn del_cleans_the_pods_families_or_both() {
        let v4: Vec<IpNetwork> = vec!["10.0.0.2/24".parse().unwrap()];
        assert_eq!(families_to_clean(Some(&v4)), vec![IpFamily::V4]);
        let dual: Vec<IpNetwork> = vec![
            "fd00::2/64".parse().unwrap(),
            "10.0.0.2/24".parse().unwrap(),
            "10.1.0.2/24".parse().unwrap(),
        ];
        assert_eq!(
            families_to_clean(Some(&dual)),
            vec![IpFamily::V4, IpFamily::V6]
        );
        assert_eq!(families_to_clean(None), vec![IpFamily::V4, IpFamily::V6]);
        assert_eq!(
            families_to_clean(Some(&[])),
            vec![IpFamily::V4, IpFamily::V6]
        );
    }
}
