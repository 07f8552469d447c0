//! A runtime kills a plugin mid-ADD (a timeout, a pod deleted while it starts) and runs DEL at
//! once. A delegate that outlived the kill would finish its ADD after that DEL and leak what
//! it made, so the delegates die with flannel.

mod common;

use common::{Node, STACK};
use serde_json::json;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

/// Whether `pid` is still a running process (a zombie has finished).
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn killing_flannel_mid_add_kills_the_delegate_it_runs() {
    let node = Node::new(STACK);
    node.write_subnet_env("subnet-ipv4.env");
    let pid_file = node.root().join("delegate.pid");
    let delegate = node.cni_path().join("slow");
    fs::write(
        &delegate,
        format!(
            "#!/bin/sh\necho $$ > {}.tmp\nmv {0}.tmp {0}\nexec sleep 60\n",
            pid_file.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&delegate, fs::Permissions::from_mode(0o755)).unwrap();
    let conf = node.flannel_config("1.0.0", json!({"delegate": {"type": "slow"}}));
    let mut flannel = node
        .flannel("ADD")
        .netns("/var/run/netns/never-entered")
        .spawn_in(None, conf.to_string().as_bytes());

    let give_up = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Some(pid) = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            break pid;
        }
        if let Ok(Some(_)) = flannel.try_wait() {
            let out = flannel.wait_with_output().unwrap();
            panic!(
                "flannel ended before its delegate started: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        assert!(
            Instant::now() < give_up,
            "the delegate did not start within 20 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    flannel.kill().unwrap();
    flannel.wait().unwrap();

    let give_up = Instant::now() + Duration::from_secs(5);
    while running(pid) && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(10));
    }
    let survived = running(pid);
    if survived {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    assert!(
        !survived,
        "the delegate (pid {pid}) still ran 5 s after flannel was killed"
    );
}
