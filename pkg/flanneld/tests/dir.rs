//! flanneld with the embedded registry: several daemons on one machine sharing a directory
//! behave like nodes sharing an etcd.

mod common;

use common::*;
use std::collections::HashSet;
use std::fs;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

struct Shared {
    node: Node,
}

impl Shared {
    fn new(prefix: &str) -> Shared {
        let node = Node::new(prefix);
        fs::create_dir_all(node.path("registry")).unwrap();
        fs::write(
            node.path("registry/config"),
            r#"{"Network":"10.6.0.0/16","Backend":{"Type":"alloc"}}"#,
        )
        .unwrap();
        Shared { node }
    }

    fn daemon(&self, name: &str, ip: &str, extra: &[&str]) -> Daemon {
        let reg = self.node.path("registry").display().to_string();
        let mut args = vec![
            "--iptables-forward-rules=false",
            "--registry-dir",
            &reg,
            "--iface",
            "eth0",
            "--public-ip",
            ip,
        ];
        args.extend_from_slice(extra);
        Daemon::start(&self.node, name, &args, &[])
    }

    fn lease_files(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.node.path("registry/subnets"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        v.sort();
        v
    }
}

#[test]
fn ten_daemons_sharing_a_directory_get_distinct_subnets_and_see_each_other() {
    let s = Shared::new("fre");
    let mut daemons: Vec<Daemon> = (0..10)
        .map(|i| s.daemon(&format!("d{i}"), &format!("192.168.100.{}", 20 + i), &[]))
        .collect();
    let subnets: HashSet<String> = daemons.iter().map(|d| d.subnet(T)).collect();
    assert_eq!(subnets.len(), 10, "{subnets:?}");
    let files: HashSet<String> = s.lease_files().into_iter().collect();
    assert_eq!(files, subnets.iter().map(|x| key_of(x)).collect());
    for d in &daemons {
        let own = d.subnet(T);
        for x in subnets.iter().filter(|x| **x != own) {
            d.wait_log(&format!("lease added: {}", key_of(x)), T);
        }
    }
    for d in &mut daemons {
        assert!(d.running(), "a daemon exited:\n{}", d.log_text());
    }
}

#[test]
fn a_dead_nodes_lease_expires_and_the_others_hear_of_it() {
    let s = Shared::new("frx");
    let mut a = s.daemon("a", "192.168.100.11", &["--subnet-lease-ttl", "4"]);
    let key = key_of(&a.subnet(T));
    let b = s.daemon("b", "192.168.100.12", &[]);
    b.wait_log(&format!("lease added: {key} public-ip 192.168.100.11"), T);
    a.wait_log(&format!("renewed lease {key}"), T);
    a.kill();
    b.wait_log(&format!("lease removed: {key}"), T);
    assert!(!s.lease_files().contains(&key));
}

#[test]
fn a_truncated_lease_file_is_skipped_and_the_rest_still_served() {
    let s = Shared::new("frt");
    let mut a = s.daemon("a", "192.168.100.11", &[]);
    a.subnet(T);
    fs::write(
        s.node.path("registry/subnets/10.6.200.0-24"),
        r#"{"Expiration":99999999999,"Lea"#,
    )
    .unwrap();
    a.wait_log("skipping lease", T);
    a.wait_log("10.6.200.0-24", T);
    let b = s.daemon("b", "192.168.100.12", &[]);
    let key = key_of(&b.subnet(T));
    assert_ne!(key, "10.6.200.0-24");
    a.wait_log(&format!("lease added: {key}"), T);
    assert!(a.running());
}

#[test]
fn a_restart_keeps_the_subnet_and_a_deleted_lease_ends_the_daemon() {
    let s = Shared::new("frr");
    let mut a = s.daemon("a", "192.168.100.11", &[]);
    let subnet = a.subnet(T);
    assert_eq!(a.stop().code(), Some(0));
    fs::remove_file(&a.subnet_file).unwrap();
    let mut a = s.daemon("a", "192.168.100.11", &[]);
    assert_eq!(a.subnet(T), subnet);
    assert_eq!(s.lease_files(), vec![key_of(&subnet)]);
    fs::remove_file(
        s.node
            .path(&format!("registry/subnets/{}", key_of(&subnet))),
    )
    .unwrap();
    assert_eq!(a.wait_exit(T).code(), Some(1));
    assert!(
        a.log_text().contains("this node's lease"),
        "{}",
        a.log_text()
    );
}

#[test]
fn the_net_config_path_is_used_when_the_directory_holds_no_config() {
    let node = Node::new("frc");
    let conf = node.path("net-conf.json");
    fs::write(
        &conf,
        r#"{"Network":"10.7.0.0/16","SubnetLen":26,"Backend":{"Type":"vxlan"}}"#,
    )
    .unwrap();
    let reg = node.path("registry").display().to_string();
    let a = Daemon::start(
        &node,
        "a",
        &[
            "--registry-dir",
            &reg,
            "--net-config-path",
            conf.to_str().unwrap(),
        ],
        &[],
    );
    let env = a.wait_subnet_env(T);
    assert!(
        env.starts_with("FLANNEL_NETWORK=10.7.0.0/16\nFLANNEL_SUBNET=10.7."),
        "{env}"
    );
    assert!(a.subnet(T).ends_with("/26"));
    // The first line says where leases live.
    let first = a.log_text().lines().next().unwrap_or_default().to_string();
    assert!(first.contains("using the embedded registry in"), "{first}");
}
