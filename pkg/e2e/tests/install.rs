//! scripts/install.sh on a fresh tree (the script, the conflists and a target/release holding
//! the workspace's binaries, nothing installed yet): it installs into the directory it is
//! given, says what it installed, and replaces a binary that is running by a rename, so a
//! runtime exec'ing the plugin during an install never fails.

use e2e::install::{fresh_tree, run_install, succeeded};
use e2e::plugins::{repo_root, PLUGINS};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const CONFLIST: &str = "10-flannel.conflist";
/// errno when a running executable is opened for writing.
const ETXTBSY: i32 = 26;

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn installs_every_plugin_into_the_given_directory_and_says_so() {
    let tree = fresh_tree();
    let bin = tree.path().join("node/opt/cni/bin");
    let conf = tree.path().join("node/etc/cni/net.d");
    let bin_arg = bin.to_str().unwrap();

    let stdout = succeeded(&run_install(
        tree.path(),
        &["--bin-dir", bin_arg, "--conf-dir", conf.to_str().unwrap()],
    ));

    let expected: Vec<String> = PLUGINS
        .iter()
        .map(|p| format!("installed {bin_arg}/{p}"))
        .collect();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);
    assert_eq!(
        names_in(&bin),
        sorted(&PLUGINS),
        "only the plugins, no temporary files"
    );
    for plugin in PLUGINS {
        let installed = bin.join(plugin);
        assert_eq!(
            fs::read(&installed).unwrap(),
            fs::read(tree.path().join("target/release").join(plugin)).unwrap(),
            "{plugin} is not the built binary"
        );
        let mode = fs::metadata(&installed).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "{plugin} mode");
    }
    assert!(!conf.exists(), "conflists installed without --with-conf");
}

#[test]
fn installs_the_conflists_only_when_asked() {
    let tree = fresh_tree();
    let bin = tree.path().join("bin");
    let conf = tree.path().join("net.d");
    let conf_arg = conf.to_str().unwrap();

    let stdout = succeeded(&run_install(
        tree.path(),
        &[
            "--bin-dir",
            bin.to_str().unwrap(),
            "--with-conf",
            "--conf-dir",
            conf_arg,
        ],
    ));

    assert!(
        stdout
            .lines()
            .any(|l| l == format!("installed {conf_arg}/{CONFLIST}")),
        "the conflist is not reported: {stdout}"
    );
    assert_eq!(
        fs::read(conf.join(CONFLIST)).unwrap(),
        fs::read(repo_root().join("testdata").join(CONFLIST)).unwrap()
    );
    let mode = fs::metadata(conf.join(CONFLIST))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644);
}

#[test]
fn replaces_a_running_binary_atomically() {
    let tree = fresh_tree();
    let bin = tree.path().join("bin");
    let bin_arg = bin.to_str().unwrap().to_string();
    succeeded(&run_install(tree.path(), &["--bin-dir", &bin_arg]));
    let loopback = bin.join("loopback");

    // A loopback that is running (DEL waits for its config on stdin): its file is busy, so an
    // install writing into it would fail where a rename does not.
    let mut running = Command::new(&loopback)
        .envs([
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "install-test"),
            ("CNI_NETNS", ""),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", bin_arg.as_str()),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let busy = fs::OpenOptions::new().write(true).open(&loopback);
    assert_eq!(
        busy.err().and_then(|e| e.raw_os_error()),
        Some(ETXTBSY),
        "the running loopback's file should be busy"
    );

    // Meanwhile a runtime keeps asking the installed loopback for its VERSION.
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = {
        let (stop, loopback) = (stop.clone(), loopback.clone());
        std::thread::spawn(move || exec_version_until(&loopback, &stop))
    };

    let mut inodes = vec![fs::metadata(&loopback).unwrap().ino()];
    for _ in 0..5 {
        succeeded(&run_install(tree.path(), &["--bin-dir", &bin_arg]));
        inodes.push(fs::metadata(&loopback).unwrap().ino());
    }
    stop.store(true, Ordering::Relaxed);
    let (runs, failures) = runtime.join().unwrap();

    assert!(runs > 0, "the exec loop never ran");
    assert!(
        failures.is_empty(),
        "{} of {runs} execs failed: {failures:?}",
        failures.len()
    );
    let mut distinct = inodes.clone();
    distinct.dedup();
    assert_eq!(
        distinct, inodes,
        "every install puts a new file in place: {inodes:?}"
    );
    assert_eq!(names_in(&bin), sorted(&PLUGINS), "temporary files left");

    // The process started from the replaced file still runs to its normal end.
    let config = br#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#;
    running.stdin.take().unwrap().write_all(config).unwrap();
    let out = running.wait_with_output().unwrap();
    assert!(out.status.success(), "the old loopback failed: {out:?}");
}

/// Execs `loopback` VERSION until `stop`; returns how many runs and the failures.
fn exec_version_until(loopback: &PathBuf, stop: &AtomicBool) -> (usize, Vec<String>) {
    let mut runs = 0;
    let mut failures = Vec::new();
    while !stop.load(Ordering::Relaxed) || runs == 0 {
        runs += 1;
        let out = Command::new(loopback)
            .env("CNI_COMMAND", "VERSION")
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() && o.stdout.starts_with(b"{\"cniVersion\"") => {}
            Ok(o) => failures.push(format!(
                "{}: {}",
                o.status,
                String::from_utf8_lossy(&o.stdout)
            )),
            Err(e) => failures.push(e.to_string()),
        }
    }
    (runs, failures)
}

#[test]
fn installs_nothing_when_a_binary_is_missing() {
    let tree = fresh_tree();
    fs::remove_file(tree.path().join("target/release/portmap")).unwrap();
    let bin = tree.path().join("bin");

    let out = run_install(tree.path(), &["--bin-dir", bin.to_str().unwrap()]);

    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("portmap") && stderr.contains("build first"),
        "{stderr}"
    );
    assert_eq!(names_in(&bin), Vec::<String>::new(), "a partial install");
}

#[test]
fn refuses_an_unknown_argument() {
    let tree = fresh_tree();
    let out = run_install(tree.path(), &["--bin", "/tmp"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown argument: --bin") && stderr.contains("usage:"),
        "{stderr}"
    );
}
