//! Test support for kernel tests. Every test makes its own namespaces with unique
//! names, runs the built plugin binaries in them exactly as a runtime would, and
//! removes everything when its guards drop, also when the test panics.
//! Nothing here touches the root network namespace.

pub mod bulk;
pub mod cluster;
pub mod conflist;
pub mod kube_api;
pub mod pings;
pub mod probe;
pub mod toolpath;

use serde_json::Value;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other test, in this process or another, is using: `<prefix><pid36><n>`.
/// Kept short so that it also fits an interface name (15 bytes).
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}{}", radix36(std::process::id()), radix36(n))
}

fn radix36(mut n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// A named network namespace, deleted on drop with everything in it.
pub struct TestNs {
    name: String,
    path: PathBuf,
    file: Option<File>,
}

impl TestNs {
    /// Creates `/run/netns/<unique>` with `lo` up.
    pub fn new(prefix: &str) -> TestNs {
        let name = unique_name(prefix);
        let ns =
            netns_rs::NetNs::new(&name).unwrap_or_else(|e| panic!("creating netns {name}: {e}"));
        let path = ns.path().to_path_buf();
        let file = File::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let t = TestNs {
            name,
            path,
            file: Some(file),
        };
        t.ip(&["link", "set", "lo", "up"]);
        t
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn path_str(&self) -> String {
        self.path.display().to_string()
    }

    /// A command that will run inside this namespace (network only: /sys stays as it is).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let fd = self.file.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1);
        // SAFETY: setns is async-signal-safe; the fd stays open until the namespace drops.
        unsafe {
            cmd.pre_exec(move || {
                let f = std::os::fd::BorrowedFd::borrow_raw(fd);
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
        cmd
    }

    /// Runs `f` on a thread of its own that has entered this namespace first, for test code
    /// that opens sockets inside (a client of a server listening there). Threads `f` starts
    /// are inside too.
    pub fn run_inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = self.file.as_ref().expect("the namespace is open");
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("entering {}: {e}", self.name));
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Runs a command inside, panicking with its stderr when it fails.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {} in {} failed: {}",
            args.join(" "),
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command inside and reports whether it succeeded.
    pub fn try_run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"))
    }

    /// The HTTP status code `url` answers with inside, as a kubelet's probe or an operator's
    /// curl sees it; `000` when nothing answers within 10 s.
    pub fn http_status(&self, url: &str) -> String {
        let args = [
            "-s",
            "-o",
            "/dev/null",
            "-m",
            "10",
            "-w",
            "%{http_code}",
            url,
        ];
        String::from_utf8_lossy(&self.try_run("curl", &args).stdout).into_owned()
    }

    /// `ip <args>` inside.
    pub fn ip(&self, args: &[&str]) -> String {
        self.run("ip", args)
    }

    /// `ip -j <args>` inside, decoded.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let mut full = vec!["-j", "-d"];
        full.extend_from_slice(args);
        let out = self.ip(&full);
        if out.trim().is_empty() {
            return Value::Array(vec![]);
        }
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("ip -j {}: {e}: {out}", args.join(" ")))
    }

    /// The link called `name` as `ip -j -d link show` reports it, or None.
    pub fn link(&self, name: &str) -> Option<Value> {
        let out = self.try_run("ip", &["-j", "-d", "link", "show", "dev", name]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v.get(0).cloned())
    }

    /// The addresses on `dev` as `a.b.c.d/len`.
    pub fn addresses(&self, dev: &str) -> Vec<String> {
        let v = self.ip_json(&["addr", "show", "dev", dev]);
        v.get(0)
            .and_then(|l| l.get("addr_info"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|i| {
                        Some(format!(
                            "{}/{}",
                            i.get("local")?.as_str()?,
                            i.get("prefixlen")?
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A sysctl as seen inside.
    pub fn sysctl(&self, name: &str) -> String {
        self.run("sysctl", &["-n", name]).trim().to_string()
    }

    /// A veth pair from here to `other`, both ends up, `address` (with its prefix, IPv6
    /// without DAD) on each end if given; returns the ends' names, this side's first.
    pub fn veth_to(&self, other: &TestNs, addresses: Option<(&str, &str)>) -> (String, String) {
        let (here, there) = (unique_name("va"), unique_name("vb"));
        self.ip(&[
            "link",
            "add",
            &here,
            "type",
            "veth",
            "peer",
            "name",
            &there,
            "netns",
            other.name(),
        ]);
        for (ns, dev, addr) in [
            (self, &here, addresses.map(|a| a.0)),
            (other, &there, addresses.map(|a| a.1)),
        ] {
            if let Some(addr) = addr {
                ns.ip(&["addr", "add", addr, "dev", dev, "nodad"]);
            }
            ns.ip(&["link", "set", dev, "up"]);
        }
        (here, there)
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        self.file.take();
        if let Ok(ns) = netns_rs::NetNs::get(&self.name) {
            if let Err(e) = ns.remove() {
                eprintln!("removing netns {}: {e}", self.name);
            }
        }
    }
}

/// The user plus system CPU time process `pid` has used so far (zero when it is gone).
pub fn cpu_time(pid: u32) -> std::time::Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses: utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    std::time::Duration::from_millis(ticks * 1000 / hz.max(1))
}

/// Where the workspace's built binaries are: next to the test executable's `deps/`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CNI_TEST_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("current test executable");
    let mut dir = exe
        .parent()
        .expect("test executable directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The Go reference plugins, when the distribution package is installed.
pub const GO_PLUGIN_DIR: &str = "/usr/lib/cni";

/// What a plugin printed and how it exited.
#[derive(Debug)]
pub struct PluginOutput {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl PluginOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "plugin stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts success and returns the printed JSON (null when nothing was printed).
    pub fn ok(&self) -> Value {
        assert_eq!(
            self.code, 0,
            "plugin failed: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        if self.stdout.trim().is_empty() {
            Value::Null
        } else {
            self.json()
        }
    }

    /// Asserts a CNI error: exit status 1, stdout holding only the error object, the code given.
    pub fn err(&self, code: u64) -> Value {
        assert_eq!(
            self.code, 1,
            "expected failure, got: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        let v = self.json();
        let keys: Vec<&String> = v
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        for k in &keys {
            assert!(
                ["cniVersion", "code", "msg", "details"].contains(&k.as_str()),
                "unexpected key {k} in error {v}"
            );
        }
        assert_eq!(v["code"], code, "wrong code in {v}");
        assert!(
            v["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "no msg in {v}"
        );
        v
    }

    pub fn msg(&self) -> String {
        self.json()["msg"].as_str().unwrap_or_default().to_string()
    }
}

/// One plugin invocation, set up as a runtime sets it up.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub plugin: PathBuf,
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
    /// Variables to leave unset (to test their absence).
    pub unset: Vec<String>,
    pub extra_env: Vec<(String, String)>,
}

impl Invocation {
    /// `name` from the workspace's binaries, with CNI_PATH pointing at them.
    pub fn new(name: &str, command: &str) -> Invocation {
        Self::at(bin_dir().join(name), command)
    }

    pub fn at(plugin: PathBuf, command: &str) -> Invocation {
        let path = plugin
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Invocation {
            plugin,
            command: command.to_string(),
            container_id: unique_name("ctr"),
            netns: String::new(),
            ifname: "eth0".to_string(),
            args: String::new(),
            path,
            unset: Vec::new(),
            extra_env: Vec::new(),
        }
    }

    pub fn container_id(mut self, id: &str) -> Self {
        self.container_id = id.to_string();
        self
    }
    pub fn netns(mut self, ns: &str) -> Self {
        self.netns = ns.to_string();
        self
    }
    pub fn ifname(mut self, ifname: &str) -> Self {
        self.ifname = ifname.to_string();
        self
    }
    pub fn args(mut self, args: &str) -> Self {
        self.args = args.to_string();
        self
    }
    pub fn path(mut self, path: &str) -> Self {
        self.path = path.to_string();
        self
    }
    pub fn command(mut self, command: &str) -> Self {
        self.command = command.to_string();
        self
    }
    pub fn unset(mut self, var: &str) -> Self {
        self.unset.push(var.to_string());
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.extra_env.push((k.to_string(), v.to_string()));
        self
    }

    fn build(&self, host: Option<&TestNs>) -> Command {
        let mut cmd = match host {
            Some(ns) => ns.command(&self.plugin),
            None => Command::new(&self.plugin),
        };
        cmd.env_clear();
        cmd.env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        );
        for (k, v) in [
            ("CNI_COMMAND", &self.command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_ARGS", &self.args),
            ("CNI_PATH", &self.path),
        ] {
            if !self.unset.iter().any(|u| u == k) {
                cmd.env(k, v);
            }
        }
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs the plugin with `stdin`, inside `host` when given.
    /// Starts the plugin with `stdin` written and closed, without waiting: for tests that run
    /// many at once or kill one mid-operation.
    pub fn spawn_in(&self, host: Option<&TestNs>, stdin: &[u8]) -> std::process::Child {
        let mut child = self
            .build(host)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.plugin.display()));
        if let Some(mut pipe) = child.stdin.take() {
            let _ = pipe.write_all(stdin);
        }
        child
    }

    pub fn run_in(&self, host: Option<&TestNs>, stdin: &[u8]) -> PluginOutput {
        let child = self.spawn_in(host, stdin);
        let out = child.wait_with_output().expect("waiting for the plugin");
        PluginOutput {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: out.status.code().unwrap_or(-1),
        }
    }

    pub fn run(&self, config: &Value) -> PluginOutput {
        self.run_in(None, config.to_string().as_bytes())
    }

    pub fn run_in_ns(&self, host: &TestNs, config: &Value) -> PluginOutput {
        self.run_in(Some(host), config.to_string().as_bytes())
    }
}

/// Go's flanneld v0.20.2, the reference daemon: `FLANNELD_GO`, else
/// `../shared/reference/flanneld-v0.20.2` beside the checkout (or beside the checkout a
/// worktree of /work/wt/<name> belongs to).
pub fn go_flanneld() -> PathBuf {
    if let Some(p) = std::env::var_os("FLANNELD_GO") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        root.join("../shared/reference/flanneld-v0.20.2"),
        root.join("../../shared/reference/flanneld-v0.20.2"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| root.join("../shared/reference/flanneld-v0.20.2"))
}

/// Whether the calling test can run Go's flanneld ([`go_flanneld`]); a skip otherwise.
pub fn go_flanneld_here() -> bool {
    let go = go_flanneld();
    runs_here(
        go.is_file(),
        Need::Outside(&format!(
            "Go's flanneld v0.20.2 at {} (FLANNELD_GO names another place)",
            go.display()
        )),
    )
}

/// True when the Go reference plugins are installed.
pub fn go_plugins_available() -> bool {
    ["bridge", "host-local", "portmap", "loopback"]
        .iter()
        .all(|p| Path::new(GO_PLUGIN_DIR).join(p).exists())
}

/// What the compatibility tests need, for [`runs_here`].
pub const GO_PLUGINS: Need = Need::Installed(
    "the Go reference plugins in /usr/lib/cni (Debian's containernetworking-plugins)",
);

/// The environment variable naming the file where [`runs_here`] records the tests it let pass
/// without running (`scripts/test.sh` sets it and lists the file in its summary).
pub const SKIP_LOG: &str = "TESTKIT_SKIP_LOG";

/// Something a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need<'a> {
    /// What an install provides (a package `scripts/deps.sh tests` installs): in CI, where
    /// everything is installed, its absence is a broken set-up and fails the test.
    Installed(&'a str),
    /// What no install provides (a kernel built without an option): a skip everywhere, CI
    /// included, always listed in `scripts/test.sh`'s summary.
    Kernel(&'a str),
    /// What lives outside the repository and no install provides (Go's reference flanneld
    /// binary beside the checkout): a skip everywhere, CI included, listed as `Kernel` is.
    Outside(&'a str),
}

/// Whether the calling test can run on this machine, given whether the machine has what it
/// needs. When it has not, the test must not pass as if it had checked something: a missing
/// [`Need::Installed`] fails the test in CI (`CI` set, as `.ci/run` sets it); otherwise the
/// test is recorded as skipped (on stderr, and in the `TESTKIT_SKIP_LOG` file that
/// `scripts/test.sh` lists at the end) and the caller returns at once.
pub fn runs_here(present: bool, need: Need) -> bool {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let ci = std::env::var_os("CI").is_some();
    let log = std::env::var_os(SKIP_LOG).map(PathBuf::from);
    match decide_skip(present, need, &test, ci, log.as_deref()) {
        Ok(runs) => runs,
        Err(why) => panic!("{why}"),
    }
}

/// [`runs_here`]'s decision: Ok(true) runs the test; Ok(false) skips it, recorded in `log`;
/// Err fails it.
fn decide_skip(
    present: bool,
    need: Need,
    test: &str,
    ci: bool,
    log: Option<&Path>,
) -> Result<bool, String> {
    if present {
        return Ok(true);
    }
    let what = match need {
        Need::Installed(what) if ci => {
            return Err(format!(
                "{test} needs {what}, which this machine lacks: CI installs it, so the test \
                 fails instead of passing unchecked"
            ))
        }
        Need::Installed(what) | Need::Kernel(what) | Need::Outside(what) => what,
    };
    let line = format!("{test}: needs {what}");
    eprintln!("SKIPPED {line}");
    if let Some(log) = log {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
            .map_err(|e| format!("recording the skip of {test} in {}: {e}", log.display()))?;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::{decide_skip, Need};

    const PACKAGE: Need = Need::Installed("the Go plugins");
    const KERNEL: Need = Need::Kernel("bridge VLAN filtering");

    #[test]
    fn a_test_whose_need_is_met_runs_and_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skipped");
        for need in [PACKAGE, KERNEL] {
            for ci in [true, false] {
                assert_eq!(decide_skip(true, need, "t", ci, Some(&log)), Ok(true));
            }
        }
        assert!(!log.exists());
    }

    #[test]
    fn a_missing_package_fails_the_test_in_ci() {
        let err = decide_skip(false, PACKAGE, "compat_test", true, None).unwrap_err();
        assert!(
            err.contains("compat_test") && err.contains("the Go plugins"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_need_is_otherwise_recorded_as_a_skip() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skipped");
        assert_eq!(
            decide_skip(false, PACKAGE, "compat", false, Some(&log)),
            Ok(false)
        );
        assert_eq!(
            decide_skip(false, KERNEL, "vlan", true, Some(&log)),
            Ok(false)
        );
        assert_eq!(
            decide_skip(false, KERNEL, "trunk", false, Some(&log)),
            Ok(false)
        );
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "compat: needs the Go plugins\nvlan: needs bridge VLAN filtering\n\
             trunk: needs bridge VLAN filtering\n"
        );
        // Without a log (a plain cargo nextest run) it still says so on stderr and skips.
        assert_eq!(decide_skip(false, PACKAGE, "t", false, None), Ok(false));
    }

    #[test]
    fn what_lives_outside_the_repository_is_a_skip_in_ci_too() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skipped");
        let go = Need::Outside("Go's flanneld at ../shared/reference/flanneld-v0.20.2");
        assert_eq!(
            decide_skip(false, go, "runbook", true, Some(&log)),
            Ok(false)
        );
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "runbook: needs Go's flanneld at ../shared/reference/flanneld-v0.20.2\n"
        );
        assert_eq!(decide_skip(true, go, "runbook", true, Some(&log)), Ok(true));
    }
}
