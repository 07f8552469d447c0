//! flanneld as an operator starts it: flags, environment, refusals, health and readiness.

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn run(args: &[&str]) -> std::process::Output {
    Command::new(FLANNELD)
        .args(args)
        .output()
        .expect("running flanneld")
}

#[test]
fn help_explains_every_flag() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--etcd-endpoints",
        "--etcd-prefix",
        "--etcd-keyfile",
        "--etcd-certfile",
        "--etcd-cafile",
        "--etcd-username",
        "--etcd-password",
        "--iface",
        "--iface-regex",
        "--iface-can-reach",
        "--public-ip",
        "--public-ipv6",
        "--subnet-file",
        "--subnet-lease-renew-margin",
        "--ip-masq",
        "--healthz-ip",
        "--healthz-port",
        "--iptables-resync",
        "--ip-masq-fully-random-disable",
        "--net-config-path",
        "--version",
        "-v",
        "--registry-dir",
        "--kube-subnet-mgr",
        "--kube-api-url",
        "--kubeconfig-file",
        "--kube-annotation-prefix",
        "--set-node-network-unavailable",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    for flag in [
        "--ip-blackhole-route",
        "--vmodule",
        "--log_backtrace_at",
        "--logtostderr",
        "--stderrthreshold",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn doctor_help_says_what_it_checks_its_own_flags_and_its_exit_statuses() {
    let out = run(&["doctor", "--help"]);
    assert!(out.status.success());
    // As one line: the help is wrapped to the terminal's width.
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(help.starts_with("One look at this node"), "{help}");
    for want in [
        "Usage: flanneld doctor",
        "--json",
        "--fix",
        "subnet.env",
        "Exit status: 0",
        "1 when anything is missing, wrong or extra",
        "2 for a bad flag",
        // The daemon's flags, which it takes too.
        "--registry-dir",
        "--kube-subnet-mgr",
    ] {
        assert!(help.contains(want), "doctor --help lacks {want:?}:\n{help}");
    }
    // The daemon takes neither of doctor's own flags.
    assert_eq!(run(&["--fix"]).status.code(), Some(2));
    let daemon = String::from_utf8_lossy(&run(&["--help"]).stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        daemon.contains("`flanneld doctor --help` says what it checks"),
        "{daemon}"
    );
}

/// The workspace's commit as git gives it, when the tests run in a git checkout of it.
fn checkout_commit() -> Option<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let top = git(&["rev-parse", "--show-toplevel"])?;
    (std::path::Path::new(&top).canonicalize().ok()? == root.canonicalize().ok()?)
        .then(|| git(&["rev-parse", "HEAD"]))
        .flatten()
}

#[test]
fn version_names_the_commit_and_whether_the_tree_was_dirty() {
    let out = run(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.trim_end();
    let version = format!("flanneld {}", env!("CARGO_PKG_VERSION"));
    let revision = line
        .strip_prefix(&format!("{version}-"))
        .unwrap_or_else(|| panic!("{line:?} is not {version}-<commit>"));
    let commit = revision.strip_suffix("-dirty").unwrap_or(revision);
    assert!(
        commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "{line:?}: the commit is 12 hex digits"
    );
    if let Some(head) = checkout_commit() {
        assert_eq!(commit, &head[..12], "{line:?}");
    }
}

#[test]
fn go_s_logging_flags_and_environment_start_the_daemon_and_what_they_ask_for_is_said() {
    let node = Node::new("fck");
    let etcd = Etcd::start(&node);
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.8.0.0/16","Backend":{"Type":"alloc"}}"#,
    );
    let endpoints = format!("--etcd-endpoints={}", etcd.client_url);
    // As a unit written for Go's flanneld carries them.
    let a = Daemon::start(
        &node,
        "a",
        &[
            "--vmodule=x=2",
            &endpoints,
            "-v=2",
            "-logtostderr",
            "-alsologtostderr",
            "-log_backtrace_at=main.go:120",
            "-log_dir=/var/log/flannel",
            "--iface",
            "eth0",
        ],
        &[
            ("EVENT_QUEUE_DEPTH", "20000"),
            ("CONT_WHEN_CACHE_NOT_READY", "true"),
        ],
    );
    let subnet = a.subnet(T);
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
    let log = a.log_text();
    for said in [
        "-log_backtrace_at=main.go:120 ignored",
        "-log_dir=/var/log/flannel ignored",
        "EVENT_QUEUE_DEPTH=20000 changes nothing",
        "CONT_WHEN_CACHE_NOT_READY=true changes nothing",
    ] {
        assert!(log.contains(said), "{said:?} not in:\n{log}");
    }
    // -stderrthreshold, honoured as Go's flanneld does: warnings and errors only.
    let b = Daemon::start(
        &node,
        "b",
        &[
            &endpoints,
            "-stderrthreshold=WARNING",
            "-log_file=/var/log/flanneld.log",
            "--iface",
            "eth0",
            "--public-ip",
            "192.168.100.12",
        ],
        &[("FLANNELD_VMODULE", "daemon=3")],
    );
    b.subnet(T);
    b.wait_log("-log_file=/var/log/flanneld.log ignored", T);
    let log = b.log_text();
    assert!(
        log.lines().all(|l| !l.contains(" INFO ")),
        "an INFO line with -stderrthreshold=WARNING:\n{log}"
    );
    // Go's kube mode ends its start for a queue depth that is not a number.
    let out = Command::new(FLANNELD)
        .args(["--kube-subnet-mgr", "--kube-api-url", "http://127.0.0.1:1"])
        .env("EVENT_QUEUE_DEPTH", "lots")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("EVENT_QUEUE_DEPTH=\"lots\""));
}

#[test]
fn a_wrong_flag_value_is_refused_naming_the_flag_and_the_value() {
    for (args, needle) in [
        (&["--subnet-lease-renew-margin", "1440"][..], "1440"),
        (&["-public-ip=10.0.0.300"][..], "10.0.0.300"),
        (&["--no-such-flag"][..], "--no-such-flag"),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{err}");
    }
    // From the environment too.
    let out = Command::new(FLANNELD)
        .env("FLANNELD_SUBNET_LEASE_RENEW_MARGIN", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--subnet-lease-renew-margin"));
    let out = Command::new(FLANNELD)
        .env("FLANNELD_KUBE_ANNOTATION_PREFIX", "a/b/c")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kube-annotation-prefix") && err.contains("a/b/c"),
        "{err}"
    );
}

#[test]
fn kube_subnet_mgr_without_a_way_to_the_api_server_is_refused_saying_what_was_tried() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(FLANNELD)
        .args(["--kube-subnet-mgr", "--ip-masq"])
        .env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("running flanneld");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for said in [
        "--kubeconfig-file",
        "--kube-api-url",
        "KUBERNETES_SERVICE_HOST",
        "KUBECONFIG",
    ] {
        assert!(err.contains(said), "{said} not in: {err}");
    }
}

fn http_get(node: &Node, url_path: &str) -> String {
    node.ns
        .http_status(&format!("http://127.0.0.1:8471{url_path}"))
}

#[test]
fn healthz_readyz_and_systemd_readiness() {
    let node = Node::new("fch");
    let reg = node.path("registry").display().to_string();
    let sock_path = node.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    // Flags from the environment, as a unit file's Environment= gives them.
    let a = Daemon::start(
        &node,
        "a",
        &[],
        &[
            ("FLANNELD_REGISTRY_DIR", &reg),
            ("FLANNELD_HEALTHZ_PORT", "8471"),
            ("FLANNELD_HEALTHZ_IP", "127.0.0.1"),
            // Not this host's address: announced as it is, from eth0 (without --iface the
            // interface would be the one holding it, and there is none).
            ("FLANNELD_IFACE", "eth0"),
            ("FLANNELD_PUBLIC_IP", "192.168.100.77"),
            ("FLANNELD_IP_MASQ", "true"),
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
        ],
    );
    a.wait_log("health endpoints", T);
    // No network config yet: alive, not ready.
    wait_for("/healthz to answer 200", T, || {
        (http_get(&node, "/healthz") == "200").then_some(())
    });
    assert_eq!(http_get(&node, "/readyz"), "503");
    std::fs::write(
        node.path("registry/config"),
        r#"{"Network":"10.8.0.0/16","Backend":{"Type":"vxlan"}}"#,
    )
    .unwrap();
    let env = a.wait_subnet_env(T);
    assert!(env.ends_with("FLANNEL_IPMASQ=true\n"), "{env}");
    wait_for("/readyz to answer 200", T, || {
        (http_get(&node, "/readyz") == "200").then_some(())
    });
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY=1 on the notify socket");
    assert_eq!(
        String::from_utf8_lossy(&buf[..n]),
        format!("READY=1\nSTATUS={} written", a.subnet_file.display())
    );
    let lease =
        std::fs::read_to_string(node.path(&format!("registry/subnets/{}", key_of(&a.subnet(T)))))
            .unwrap();
    assert!(lease.contains(r#""PublicIP":"192.168.100.77""#), "{lease}");
}

#[test]
fn no_default_route_and_no_iface_or_a_public_ip_of_no_interface_is_a_bad_start() {
    let node = Node::new("fci");
    node.ns.ip(&["route", "del", "default"]);
    let reg = node.path("registry").display().to_string();
    std::fs::create_dir_all(node.path("registry")).unwrap();
    std::fs::write(
        node.path("registry/config"),
        r#"{"Network":"10.8.0.0/16","Backend":{"Type":"vxlan"}}"#,
    )
    .unwrap();
    let mut a = Daemon::start(&node, "a", &["--registry-dir", &reg], &[]);
    assert_eq!(a.wait_exit(T).code(), Some(2));
    assert!(a.log_text().contains("--iface"), "{}", a.log_text());
    let mut b = Daemon::start(
        &node,
        "b",
        &["--registry-dir", &reg, "--iface", "nope0"],
        &[],
    );
    assert_eq!(b.wait_exit(T).code(), Some(2));
    assert!(b.log_text().contains("--iface nope0"), "{}", b.log_text());
    // Without --iface the interface is the one holding --public-ip, and none does.
    let mut c = Daemon::start(
        &node,
        "c",
        &["--registry-dir", &reg, "--public-ip", "203.0.113.7"],
        &[],
    );
    assert_eq!(c.wait_exit(T).code(), Some(2));
    assert!(
        c.log_text()
            .contains("--public-ip 203.0.113.7 is not an address of this host"),
        "{}",
        c.log_text()
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let node = Node::new("fcj");
    let reg = node.path("registry").display().to_string();
    std::fs::create_dir_all(node.path("registry")).unwrap();
    std::fs::write(
        node.path("registry/config"),
        r#"{"Network":"10.8.0.0/16","Backend":{"Type":"alloc"}}"#,
    )
    .unwrap();
    let a = Daemon::start(
        &node,
        "a",
        &["--registry-dir", &reg, "--log-format", "json"],
        &[],
    );
    a.wait_subnet_env(T);
    a.wait_log("leased subnet", T);
    for line in a.log_text().lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["message"].is_string() && v["level"].is_string(), "{line}");
    }
    assert_eq!(run(&["--log-format", "xml"]).status.code(), Some(2));
}

fn first_line(d: &Daemon) -> String {
    d.log_text().lines().next().unwrap_or_default().to_string()
}

#[test]
fn without_a_registry_named_leases_go_to_flanneld_s_default_etcd_endpoint_and_the_first_line_says_so(
) {
    let node = Node::new("fcr");
    let etcd = Etcd::start(&node);
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.8.0.0/16","Backend":{"Type":"alloc"}}"#,
    );
    // Neither --etcd-endpoints nor --registry-dir: flanneld's http://127.0.0.1:4001 (where
    // nothing listens) and http://127.0.0.1:2379.
    let a = Daemon::start(&node, "a", &["--iface", "eth0"], &[]);
    let subnet = a.subnet(T);
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
    let first = first_line(&a);
    assert!(
        first.contains("no --etcd-endpoints or --registry-dir given")
            && first.contains("default endpoints http://127.0.0.1:4001,http://127.0.0.1:2379"),
        "{first}"
    );
    // Named: the same etcd, said so.
    let b = Daemon::start(
        &node,
        "b",
        &[
            "--etcd-endpoints",
            &etcd.client_url,
            "--iface",
            "eth0",
            "--public-ip",
            "192.168.100.12",
        ],
        &[],
    );
    let subnet = b.subnet(T);
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
    let first = first_line(&b);
    assert!(
        first.contains("leases in etcd at http://127.0.0.1:2379 under /coreos.com/network"),
        "{first}"
    );
}

#[test]
fn the_registry_dir_from_the_environment_chooses_the_embedded_registry() {
    let node = Node::new("fcd");
    let reg = node.registry(r#"{"Network":"10.8.0.0/16","Backend":{"Type":"alloc"}}"#);
    let a = Daemon::start(
        &node,
        "a",
        &[],
        &[("FLANNELD_REGISTRY_DIR", reg.to_str().unwrap())],
    );
    let subnet = a.subnet(T);
    assert!(reg.join("subnets").join(key_of(&subnet)).exists());
    let first = first_line(&a);
    assert!(
        first.contains(&format!("using the embedded registry in {}", reg.display())),
        "{first}"
    );
}

#[test]
fn two_registries_at_once_are_refused() {
    let out = Command::new(FLANNELD)
        .args(["--etcd-endpoints", "http://127.0.0.1:2379"])
        .env("FLANNELD_REGISTRY_DIR", "/tmp/nowhere")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--registry-dir") && err.contains("--etcd-endpoints"),
        "{err}"
    );
}
