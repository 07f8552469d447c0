//! What this node's flanneld says that bears on the policies: its subnet.env's FLANNEL_IPMASQ.
//! Without --ip-masq (false) the flannel CNI plugin has the bridge plugin masquerade each pod's
//! traffic leaving the node's subnet, so the other nodes' policies see this node's flannel
//! address for its pods instead of theirs, and selectors no longer match them there.

use std::path::Path;

/// What the subnet file says of pods' masquerading, for a log line or a finding: Ok for
/// nothing to say (--ip-masq, or no file: another CNI, or flanneld not up yet), Err for a
/// warning.
pub fn check(subnet_file: &Path) -> Result<String, String> {
    let text = match std::fs::read_to_string(subnet_file) {
        Ok(t) => t,
        Err(e) => {
            return Ok(format!(
                "{}: {e}: nothing known of flanneld's masquerading",
                subnet_file.display()
            ))
        }
    };
    match subnetenv::parse_entries(&text).ok().and_then(|e| e.ipmasq) {
        Some(false) => Err(format!(
            "{}: FLANNEL_IPMASQ=false (flanneld without --ip-masq): the bridge plugin masquerades \
             this node's pods' traffic to other nodes, whose policies then see this node's flannel \
             address, not the pods'; run flanneld with --ip-masq",
            subnet_file.display()
        )),
        Some(true) => Ok(format!(
            "{}: FLANNEL_IPMASQ=true: pods' addresses survive between nodes",
            subnet_file.display()
        )),
        None => Ok(format!("{}: no FLANNEL_IPMASQ", subnet_file.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_flanneld_without_ip_masq_is_worth_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("subnet.env");
        assert!(check(&f).is_ok(), "no file: nothing to say");
        std::fs::write(&f, "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n").unwrap();
        assert!(check(&f)
            .unwrap_err()
            .contains("run flanneld with --ip-masq"));
        std::fs::write(&f, "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n").unwrap();
        assert!(check(&f).is_ok());
    }
}
