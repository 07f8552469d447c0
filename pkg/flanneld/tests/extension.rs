//! The `extension` backend, run as Go's flanneld runs it: an operator's commands make a
//! host-gw-like datapath (routes via each node's public address) on three nodes in every
//! registry, their variables, stdin and output as Go's give them; a lease gone runs the remove
//! command; a failed add command is run again. And Go's flanneld v0.20.2 beside ours on the
//! same commands: each reads the other's lease and data, pods cross both ways.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Registry};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

/// Scripts that the commands call, written in `dir`: each records what it was given in
/// `<dir>/<what>-<this node's address>` (its arguments, and its stdin), so that the test
/// reads what each node ran; add and remove change the node's route to the subnet.
struct Scripts {
    dir: tempfile::TempDir,
}

const RECORD: &str = r#"me=$(ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)"#;

impl Scripts {
    fn new() -> Scripts {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{RECORD}\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        let d = dir.path().display();
        // Arguments: SUBNET PUBLIC_IP; stdin: the lease's BackendData string.
        write(
            "add.sh",
            &format!(
                "read data\nip route replace \"$1\" via \"$2\" || exit 1\necho \"$1 $2 $data\" >> {d}/added-$me"
            ),
        );
        write(
            "remove.sh",
            &format!("read data\nip route del \"$1\" via \"$2\"\necho \"$1 $2 $data\" >> {d}/removed-$me"),
        );
        // Arguments: NETWORK SUBNET PUBLIC_IP.
        write(
            "post.sh",
            &format!("echo \"$1 $2 $3\" >> {d}/post-$me\necho post-startup done"),
        );
        Scripts { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self, net: u8) -> String {
        let d = self.path().display();
        format!(
            r#"{{"Network":"10.{net}.0.0/16","Backend":{{"Type":"extension","PreStartupCommand":"ip -br link show dev eth0","PostStartupCommand":"{d}/post.sh $NETWORK $SUBNET $PUBLIC_IP","SubnetAddCommand":"{d}/add.sh $SUBNET $PUBLIC_IP","SubnetRemoveCommand":"{d}/remove.sh $SUBNET ${{PUBLIC_IP}}"}}}}"#
        )
    }

    /// The lines a script recorded on the node at `ip`.
    fn recorded(&self, what: &str, ip: &str) -> Vec<String> {
        std::fs::read_to_string(self.path().join(format!("{what}-{ip}")))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// What node `n`'s PreStartupCommand prints: its eth0's name, state and MAC, its own (the
/// sysfs flanneld sees is the host's, not the node's).
fn announced(c: &Cluster, n: u8) -> String {
    c.node(n)
        .ns
        .run("ip", &["-br", "link", "show", "dev", "eth0"])
        .trim()
        .to_string()
}

fn three_nodes(prefix: &str, net: u8, registry: Registry) {
    let s = Scripts::new();
    let mut c = Cluster::new(prefix, net, 3, registry, &s.config(net));
    let port = (9000 + u16::from(net)).to_string();
    c.start_flanneld(1, Path::new(FLANNELD), &["--healthz-port", &port]);
    for n in 2..=3 {
        c.start_flanneld(n, Path::new(FLANNELD), &[]);
    }
    for n in 1..=3 {
        c.node(n).wait_subnet_env(T);
    }
    for n in 1..=3 {
        c.add_pod(n);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    // /metrics: the two leases its add command ran for; doctor: what the daemon runs.
    let metrics = c.node(1).ns.run(
        "curl",
        &["-s", "-m", "5", &format!("http://127.0.0.1:{port}/metrics")],
    );
    assert!(metrics.contains("flanneld_backend_peers 2\n"), "{metrics}");
    let out = c
        .node(1)
        .ns
        .command(FLANNELD)
        .arg("doctor")
        .args(c.flanneld_args(1))
        .env("NODE_NAME", testkit::cluster::kube_node_name(1))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "doctor:\n{text}");
    assert!(
        text.contains("its SubnetAddCommand is run for it"),
        "{text}"
    );
    for n in 1..=3 {
        let node = c.node(n);
        let subnet = node.subnet(Family::V4, T).unwrap();
        // PostStartupCommand: its variables.
        assert_eq!(
            s.recorded("post", &node.ip),
            [format!("10.{net}.0.0/16 {subnet} {}", node.ip)]
        );
        assert!(
            node.log().contains("its output: post-startup done"),
            "{}",
            node.log()
        );
        // SubnetAddCommand on the others: SUBNET, PUBLIC_IP, and the PreStartupCommand's
        // output of that node on stdin.
        for m in (1..=3).filter(|m| *m != n) {
            let want = format!("{subnet} {} {}", node.ip, announced(&c, n));
            assert!(
                s.recorded("added", &c.node(m).ip).contains(&want),
                "node {m} ran the add for node {n}: {:?}",
                s.recorded("added", &c.node(m).ip)
            );
        }
    }
    // Node 3's lease deleted: the others run the remove command and its route goes.
    let key = c.node(3).lease_key(T);
    let subnet3 = c.node(3).subnet(Family::V4, T).unwrap();
    c.stop_flanneld(3);
    c.delete_lease(&key);
    for m in 1..=2 {
        let ip = c.node(m).ip.clone();
        wait_for(&format!("node {m} to run the remove command"), T, || {
            s.recorded("removed", &ip)
                .iter()
                .any(|l| l.starts_with(&subnet3))
                .then_some(())
        });
        assert!(
            !c.node(m).routes().contains(&subnet3),
            "{}",
            c.node(m).routes()
        );
    }
}

#[test]
fn extension_commands_carry_pods_with_etcd() {
    three_nodes("fxe", 150, Registry::Etcd);
}

#[test]
fn extension_commands_carry_pods_in_kube_mode() {
    three_nodes("fxk", 151, Registry::Kube);
}

#[test]
fn extension_commands_carry_pods_with_the_embedded_registry() {
    three_nodes("fxr", 152, Registry::Embedded);
}

#[test]
fn a_failing_add_command_is_run_again_and_said_once() {
    let s = Scripts::new();
    let mut c = Cluster::new("fxf", 153, 2, Registry::Embedded, &s.config(153));
    // The add fails until a file appears; each attempt is counted.
    let gate = s.path().join("open");
    let add = s.path().join("add.sh");
    let body = std::fs::read_to_string(&add).unwrap();
    let failing = format!(
        "read data\n[ -e {} ] || {{ echo x >> {}/attempts-$me; exit 7; }}\n",
        gate.display(),
        s.path().display()
    );
    std::fs::write(&add, body.replace("read data\n", &failing)).unwrap();
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    let ip = c.node(1).ip.clone();
    wait_for("three attempts of node 1's add command", T, || {
        (s.recorded("attempts", &ip).len() >= 3).then_some(())
    });
    let log = c.node(1).log();
    assert_eq!(
        log.matches("exit status: 7").count(),
        1,
        "said once:\n{log}"
    );
    std::fs::write(&gate, "").unwrap();
    wait_for("the add command run again and done", T, || {
        (!s.recorded("added", &ip).is_empty()).then_some(())
    });
}

#[test]
fn a_failing_pre_startup_command_ends_the_start_naming_it() {
    let config =
        r#"{"Network":"10.154.0.0/16","Backend":{"Type":"extension","PreStartupCommand":"false"}}"#;
    let mut c = Cluster::new("fxp", 154, 1, Registry::Embedded, config);
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    assert_eq!(c.wait_flanneld_exit(1, T).code(), Some(2));
    let log = c.node(1).log();
    assert!(log.contains("PreStartupCommand \"false\" failed"), "{log}");
}

#[test]
fn go_s_flanneld_on_extension_and_ours_read_each_others_leases() {
    if !testkit::go_flanneld_here() {
        return;
    }
    let s = Scripts::new();
    let mut c = Cluster::new("fxg", 155, 3, Registry::Etcd, &s.config(155));
    for n in 1..=2 {
        c.start_flanneld(n, Path::new(FLANNELD), &[]);
    }
    // Go's v0.20.2 misses a lease created in the first instants of its etcd watch.
    for n in 1..=2 {
        c.node(n).wait_subnet_env(T);
    }
    c.start_flanneld(3, &testkit::go_flanneld(), &[]);
    c.node(3).wait_subnet_env(T);
    for n in 1..=3 {
        c.add_pod(n);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    let go = c.node(3);
    let go_subnet = go.subnet(Family::V4, T).unwrap();
    for n in 1..=2 {
        let ours = c.node(n);
        let subnet = ours.subnet(Family::V4, T).unwrap();
        // Go's ran the add for ours, with our MAC on stdin; ours for Go's, with Go's.
        let want = format!("{subnet} {} {}", ours.ip, announced(&c, n));
        assert!(
            s.recorded("added", &go.ip).contains(&want),
            "{:?}",
            s.recorded("added", &go.ip)
        );
        let want = format!("{go_subnet} {} {}", go.ip, announced(&c, 3));
        assert!(
            s.recorded("added", &ours.ip).contains(&want),
            "{:?}",
            s.recorded("added", &ours.ip)
        );
    }
    let _: PathBuf = s.path().to_path_buf();
}
