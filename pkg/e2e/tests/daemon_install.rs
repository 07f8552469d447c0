//! scripts/install.sh --daemon on a fresh tree: flanneld, its tunnel (flannel-wireguard) and the
//! NetworkPolicy enforcer (flannel-netpol) go into their own bin directory (never the CNI one),
//! each daemon's systemd unit into the systemd directory
//! pointing at the binary and the environment file actually installed, every file renamed into
//! place; the environment file (it may hold FLANNELD_ETCD_PASSWORD) is root's with mode 0600, and
//! an operator's existing one keeps its content and is made so too; systemd-analyze accepts the
//! installed unit.

use e2e::install::{fresh_tree, run_install, succeeded, DAEMON, ENFORCER, TUNNEL, UDP_TUNNEL};
use e2e::plugins::{repo_root, PLUGINS};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use tempfile::TempDir;

/// The directories of one node: CNI bin, daemon bin, systemd, and the environment file.
struct Dirs {
    cni_bin: PathBuf,
    daemon_bin: PathBuf,
    systemd: PathBuf,
    env_file: PathBuf,
}

impl Dirs {
    fn under(root: &Path) -> Dirs {
        Dirs {
            cni_bin: root.join("opt/cni/bin"),
            daemon_bin: root.join("usr/local/bin"),
            systemd: root.join("etc/systemd/system"),
            env_file: root.join("etc/default/flanneld"),
        }
    }

    fn install_args(&self) -> [&str; 9] {
        [
            "--daemon",
            "--bin-dir",
            s(&self.cni_bin),
            "--daemon-bin-dir",
            s(&self.daemon_bin),
            "--systemd-dir",
            s(&self.systemd),
            "--env-file",
            s(&self.env_file),
        ]
    }

    fn install(&self, tree: &Path) -> String {
        succeeded(&run_install(tree, &self.install_args()))
    }

    fn unit(&self) -> PathBuf {
        self.systemd.join("flanneld.service")
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temporary path")
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// (uid, gid, permission bits) of `path`.
fn owner_and_mode(path: &Path) -> (u32, u32, u32) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.uid(), meta.gid(), meta.mode() & 0o7777)
}

/// The values of `key=` lines of a unit file, in order.
fn directive<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

fn node() -> (TempDir, TempDir, Dirs) {
    let tree = fresh_tree();
    let root = tempfile::Builder::new()
        .prefix("e2e-daemon-root-")
        .tempdir()
        .unwrap();
    let dirs = Dirs::under(root.path());
    (tree, root, dirs)
}

#[test]
fn daemon_install_puts_binary_unit_and_env_file_in_their_directories() {
    let (tree, _root, dirs) = node();

    let stdout = dirs.install(tree.path());

    let mut expected: Vec<String> = PLUGINS
        .iter()
        .map(|p| format!("installed {}/{p}", s(&dirs.cni_bin)))
        .collect();
    expected.push(format!("installed {}/{DAEMON}", s(&dirs.daemon_bin)));
    expected.push(format!("installed {}/{TUNNEL}", s(&dirs.daemon_bin)));
    expected.push(format!("installed {}/{UDP_TUNNEL}", s(&dirs.daemon_bin)));
    expected.push(format!("installed {}/{ENFORCER}", s(&dirs.daemon_bin)));
    expected.push(format!("installed {}", s(&dirs.unit())));
    expected.push(format!("installed {}", s(&dirs.env_file)));
    let netpol_env = dirs.env_file.with_file_name("flannel-netpol");
    expected.push(format!(
        "installed {}",
        s(&dirs.systemd.join("flannel-netpol.service"))
    ));
    expected.push(format!("installed {}", s(&netpol_env)));
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);

    let mut plugins: Vec<String> = PLUGINS.iter().map(|p| p.to_string()).collect();
    plugins.sort();
    assert_eq!(
        names_in(&dirs.cni_bin),
        plugins,
        "the CNI bin dir holds only the plugins"
    );
    assert_eq!(
        names_in(&dirs.daemon_bin),
        [ENFORCER, UDP_TUNNEL, TUNNEL, DAEMON],
        "flanneld, its tunnels and the enforcer beside it, no temporary file left"
    );
    assert_eq!(
        names_in(&dirs.systemd),
        ["flannel-netpol.service", "flanneld.service"],
        "no temporary file left"
    );
    assert_eq!(
        names_in(dirs.env_file.parent().unwrap()),
        ["flannel-netpol", "flanneld"],
        "no temporary file left"
    );

    let daemon = dirs.daemon_bin.join(DAEMON);
    assert_eq!(
        fs::read(&daemon).unwrap(),
        fs::read(tree.path().join("target/release").join(DAEMON)).unwrap(),
        "the installed flanneld is not the built one"
    );
    assert_eq!(mode(&daemon), 0o755, "flanneld's mode");
    let tunnel = dirs.daemon_bin.join(TUNNEL);
    assert_eq!(
        fs::read(&tunnel).unwrap(),
        fs::read(tree.path().join("target/release").join(TUNNEL)).unwrap(),
        "the installed flannel-wireguard is not the built one"
    );
    assert_eq!(mode(&tunnel), 0o755, "flannel-wireguard's mode");
    assert_eq!(mode(&dirs.unit()), 0o644, "the unit's mode");
    assert_eq!(
        owner_and_mode(&dirs.env_file),
        (0, 0, 0o600),
        "the environment file (it may hold FLANNELD_ETCD_PASSWORD) is root's alone"
    );
    assert_eq!(
        fs::read_to_string(&dirs.env_file).unwrap(),
        fs::read_to_string(repo_root().join("deploy/systemd/flanneld.env")).unwrap()
    );

    let unit = fs::read_to_string(dirs.unit()).unwrap();
    assert_eq!(
        directive(&unit, "ExecStart"),
        [s(&daemon)],
        "ExecStart names the installed binary"
    );
    assert_eq!(
        directive(&unit, "EnvironmentFile"),
        [s(&dirs.env_file)],
        "EnvironmentFile names the installed file"
    );
    let enforcer = dirs.daemon_bin.join(ENFORCER);
    assert_eq!(mode(&enforcer), 0o755, "flannel-netpol's mode");
    let unit = fs::read_to_string(dirs.systemd.join("flannel-netpol.service")).unwrap();
    assert_eq!(directive(&unit, "ExecStart"), [s(&enforcer)]);
    assert_eq!(directive(&unit, "EnvironmentFile"), [s(&netpol_env)]);
    assert_eq!(
        fs::read_to_string(&netpol_env).unwrap(),
        fs::read_to_string(repo_root().join("deploy/systemd/flannel-netpol.env")).unwrap()
    );
}

#[test]
fn the_unit_is_what_the_daemon_needs() {
    let unit = fs::read_to_string(repo_root().join("deploy/systemd/flanneld.service")).unwrap();
    // flanneld sends READY=1 once subnet.env is written.
    assert_eq!(directive(&unit, "Type"), ["notify"]);
    assert_eq!(directive(&unit, "Restart"), ["on-failure"]);
    assert_eq!(directive(&unit, "ExecStart"), ["/usr/local/bin/flanneld"]);
    assert_eq!(
        directive(&unit, "EnvironmentFile"),
        ["/etc/default/flanneld"]
    );
    assert_eq!(directive(&unit, "After"), ["network-online.target"]);
    assert_eq!(directive(&unit, "Wants"), ["network-online.target"]);
    let pre = directive(&unit, "ExecStartPre");
    assert!(
        pre.len() == 1 && pre[0].starts_with("/bin/mkdir -p") && pre[0].ends_with(" /run/flannel"),
        "ExecStartPre should make /run/flannel: {pre:?}"
    );

    // Every variable the environment file sets is one flanneld reads.
    let env = fs::read_to_string(repo_root().join("deploy/systemd/flanneld.env")).unwrap();
    let help = Command::new(testkit::bin_dir().join(DAEMON))
        .arg("--help")
        .output()
        .expect("running flanneld --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for line in env.lines().map(|l| l.trim_start_matches('#')) {
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        if !name.starts_with("FLANNELD_") {
            continue;
        }
        assert!(
            help.contains(&format!("{name}=]")) || help.contains(&format!("{name}]")),
            "flanneld --help does not list {name}"
        );
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_installed_unit() {
    let (tree, _root, dirs) = node();
    dirs.install(tree.path());

    for unit in [dirs.unit(), dirs.systemd.join("flannel-netpol.service")] {
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit)
            .output()
            .expect("systemd-analyze (Debian's systemd, scripts/deps.sh installs it)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success()
                && !stderr.contains("flanneld")
                && !stderr.contains("flannel-netpol"),
            "systemd-analyze verify {}: {}\n{stderr}",
            unit.display(),
            out.status
        );
    }
}

#[test]
fn keeps_the_operators_environment_file_and_makes_it_roots_alone() {
    let (tree, _root, dirs) = node();
    fs::create_dir_all(dirs.env_file.parent().unwrap()).unwrap();
    // As an earlier install.sh left it (0644), edited by the operator and handed to another user.
    let mine = "FLANNELD_ETCD_ENDPOINTS=https://10.0.0.1:2379\nFLANNELD_ETCD_PASSWORD=s3cret\n";
    fs::write(&dirs.env_file, mine).unwrap();
    fs::set_permissions(&dirs.env_file, fs::Permissions::from_mode(0o664)).unwrap();
    std::os::unix::fs::chown(&dirs.env_file, Some(1000), Some(1000)).unwrap();

    let out = run_install(tree.path(), &dirs.install_args());
    let stdout = succeeded(&out);

    assert!(
        stdout
            .lines()
            .any(|l| l == format!("kept {}", s(&dirs.env_file))),
        "install.sh should say it kept the file: {stdout}"
    );
    assert_eq!(fs::read_to_string(&dirs.env_file).unwrap(), mine);
    assert_eq!(
        owner_and_mode(&dirs.env_file),
        (0, 0, 0o600),
        "an existing environment file is made root's alone"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "restricted {} to root, mode 0600 (it was mode 664, owner 1000:1000)",
            s(&dirs.env_file)
        )),
        "install.sh should say what it changed: {stderr}"
    );

    // A second install finds it right and says nothing about it.
    let out = run_install(tree.path(), &dirs.install_args());
    succeeded(&out);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(fs::read_to_string(&dirs.env_file).unwrap(), mine);
}

#[test]
fn replaces_the_daemon_binary_by_a_rename() {
    let (tree, _root, dirs) = node();
    dirs.install(tree.path());
    let installed = dirs.daemon_bin.join(DAEMON);
    let old_inode = fs::metadata(&installed).unwrap().ino();
    // A running flanneld keeps its executable open: it must go on seeing the old bytes.
    let mut running = fs::File::open(&installed).unwrap();
    let old = fs::read(&installed).unwrap();
    let new = b"#!/bin/sh\necho a newer flanneld\n";
    let built = tree.path().join("target/release").join(DAEMON);
    fs::write(&built, new).unwrap();
    fs::set_permissions(&built, fs::Permissions::from_mode(0o755)).unwrap();

    dirs.install(tree.path());

    assert_ne!(
        fs::metadata(&installed).unwrap().ino(),
        old_inode,
        "flanneld was overwritten in place, not renamed into place"
    );
    assert_eq!(fs::read(&installed).unwrap(), new);
    let mut seen = Vec::new();
    running.read_to_end(&mut seen).unwrap();
    assert!(seen == old, "the old binary changed under a running daemon");
}

#[test]
fn installs_nothing_when_the_daemon_is_missing() {
    let (tree, _root, dirs) = node();
    fs::remove_file(tree.path().join("target/release").join(DAEMON)).unwrap();

    let out = run_install(
        tree.path(),
        &[
            "--daemon",
            "--bin-dir",
            s(&dirs.cni_bin),
            "--daemon-bin-dir",
            s(&dirs.daemon_bin),
            "--systemd-dir",
            s(&dirs.systemd),
        ],
    );

    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(DAEMON),
        "the error should name flanneld"
    );
    for dir in [&dirs.cni_bin, &dirs.daemon_bin, &dirs.systemd] {
        assert!(!dir.exists(), "{} made before the check", dir.display());
    }
}

#[test]
fn help_says_where_each_file_goes() {
    let out = Command::new(repo_root().join("scripts/install.sh"))
        .arg("--help")
        .output()
        .expect("running install.sh --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "/opt/cni/bin",
        "/usr/local/bin",
        "/etc/systemd/system",
        "/etc/default/flanneld",
        "flanneld.service",
        "--daemon-bin-dir",
        "--systemd-dir",
    ] {
        assert!(help.contains(needle), "--help does not mention {needle}");
    }
}

#[test]
fn the_enforcer_s_unit_starts_it_with_the_settings_it_reads() {
    let unit =
        fs::read_to_string(repo_root().join("deploy/systemd/flannel-netpol.service")).unwrap();
    assert_eq!(
        directive(&unit, "ExecStart"),
        ["/usr/local/bin/flannel-netpol"]
    );
    assert_eq!(
        directive(&unit, "EnvironmentFile"),
        ["/etc/default/flannel-netpol"]
    );
    assert_eq!(directive(&unit, "Restart"), ["on-failure"]);
    let env = fs::read_to_string(repo_root().join("deploy/systemd/flannel-netpol.env")).unwrap();
    let help = Command::new(testkit::bin_dir().join(ENFORCER))
        .arg("--help")
        .output()
        .expect("running flannel-netpol --help");
    // The help is wrapped to the terminal: words apart by one space.
    let help = String::from_utf8_lossy(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut named = 0;
    for line in env.lines().map(|l| l.trim_start_matches('#')) {
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        named += 1;
        assert!(
            help.contains(&format!("[env: {name}=")),
            "flannel-netpol --help does not list {name}"
        );
    }
    assert!(named >= 3, "{env}");
}
