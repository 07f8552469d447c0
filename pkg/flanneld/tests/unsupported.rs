//! Backends Go's flanneld has that need what this node lacks: the start ends with status 2,
//! naming the backend and what is missing.

use std::path::Path;
use std::time::Duration;
use testkit::cluster::{Cluster, Registry};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

#[test]
fn ipip_and_ipsec_end_the_start_naming_what_is_missing() {
    for (ty, missing) in [("ipip", "ipip module"), ("ipsec", "rfc4106(gcm(aes))")] {
        let config = format!(r#"{{"Network":"10.156.0.0/16","Backend":{{"Type":"{ty}"}}}}"#);
        let mut c = Cluster::new("fxu", 156, 1, Registry::Embedded, &config);
        c.start_flanneld(1, Path::new(FLANNELD), &[]);
        assert_eq!(c.wait_flanneld_exit(1, T).code(), Some(2), "{ty}");
        let log = c.node(1).log();
        assert!(log.contains(&format!("Backend.Type {ty}: ")), "{log}");
        // This machine's kernel has neither; elsewhere the message names the daemon's lack.
        let kernel_lacks = match ty {
            "ipip" => !Path::new("/sys/module/ipip").exists(),
            _ => !std::fs::read_to_string("/proc/crypto")
                .unwrap_or_default()
                .contains(missing),
        };
        if kernel_lacks {
            assert!(log.contains(missing), "{ty}: {log}");
        }
    }
}
