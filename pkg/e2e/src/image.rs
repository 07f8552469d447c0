//! Container images without a registry: a root filesystem holding busybox-static, as a directory
//! (podman `--rootfs`) or as a `docker save` archive (`ctr image import`).

use serde_json::json;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

/// busybox-static, as Debian's package installs it.
pub const BUSYBOX: &str = "/bin/busybox";
/// What the container's httpd serves at `/`.
pub const PAGE: &str = "served from the container\n";
/// The applets the tests call inside a container.
const APPLETS: [&str; 8] = ["sh", "ip", "ping", "httpd", "cat", "ls", "sleep", "wget"];

/// Fills `dir` with /bin/busybox, its applets as symlinks, and /www/index.html holding [`PAGE`].
pub fn busybox_rootfs(dir: &Path) {
    busybox_rootfs_serving(dir, PAGE);
}

/// The same with `page` as /www/index.html.
pub fn busybox_rootfs_serving(dir: &Path, page: &str) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::copy(BUSYBOX, bin.join("busybox"))
        .unwrap_or_else(|e| panic!("copying {BUSYBOX} (package busybox-static): {e}"));
    for applet in APPLETS {
        symlink("busybox", bin.join(applet)).unwrap();
    }
    std::fs::write(dir.join("www/index.html"), page).unwrap();
}

/// Writes a single-layer image of `rootfs` in the `docker save` layout to `archive`, tagged
/// `reference`. Built in `work` (a scratch directory).
pub fn docker_archive(rootfs: &Path, reference: &str, work: &Path, archive: &Path) {
    docker_archive_running(rootfs, reference, work, archive, &["/bin/sh"]);
}

/// The same, with `cmd` as the image's default command (what a CRI pod sandbox runs).
pub fn docker_archive_running(
    rootfs: &Path,
    reference: &str,
    work: &Path,
    archive: &Path,
    cmd: &[&str],
) {
    std::fs::create_dir_all(work).unwrap();
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(rootfs)
        .arg("-cf")
        .arg(work.join("layer.tar"))
        .arg("."));
    let diff_id = sha256(&work.join("layer.tar"));
    let config = json!({
        "architecture": go_arch(),
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    });
    let manifest = json!([
        {"Config": "config.json", "RepoTags": [reference], "Layers": ["layer.tar"]}
    ]);
    std::fs::write(work.join("config.json"), config.to_string()).unwrap();
    std::fs::write(work.join("manifest.json"), manifest.to_string()).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(work)
        .arg("-cf")
        .arg(archive)
        .args(["manifest.json", "config.json", "layer.tar"]));
}

/// The architecture as image configs name it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn sha256(file: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(file));
    out.split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_string()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
