//! One bash script run on a node, in one private mount namespace, for the whole life of a
//! container: a runtime's commands only see each other's state (podman's netns mounts,
//! containerd's socket) when they share that namespace.

use crate::node::{Home, Node};
use std::fmt;
use std::io::{BufRead, BufReader, Lines, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const PRELUDE: &str = include_str!("scripts/prelude.sh");
/// Upper bound for a whole session, so a stuck runtime fails the test instead of hanging it.
const SESSION_TIMEOUT_SECS: &str = "300";

pub struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    transcript: Transcript,
    stderr: std::path::PathBuf,
}

impl Session {
    /// Runs the prelude and `script` as root in `node`'s host network namespace and a new
    /// private mount namespace. `vars` are exported to the script, with WORK (the node's
    /// directory), NETWORK (the conflist's name), GATEWAY, GATEWAY6 on a dual-stack node, and
    /// CGROUP_PARENT.
    pub fn start(node: &Node, script: &str, vars: &[(&str, &str)]) -> Session {
        let gateway = node.gateway().to_string();
        let gateway6 = node.gateway6().map(|gw| gw.to_string());
        let mut vars = vars.to_vec();
        vars.push(("GATEWAY", &gateway));
        if let Some(gw) = &gateway6 {
            vars.push(("GATEWAY6", gw));
        }
        Session::start_in(node.ns.path(), node.home(), script, &vars)
    }

    /// The same in the network namespace at `netns`, for a runtime keeping `home`: WORK is the
    /// home's directory, NETWORK and CGROUP_PARENT its conflist's name and cgroup parent.
    pub fn start_in(netns: &Path, home: &Home, script: &str, vars: &[(&str, &str)]) -> Session {
        let path = home.path("session.sh");
        std::fs::write(&path, format!("{PRELUDE}\n{script}")).unwrap();
        let stderr_path = home.path("session.stderr");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = Command::new("timeout");
        cmd.args(["-k", "10", SESSION_TIMEOUT_SECS, "nsenter"])
            .arg(format!("--net={}", netns.display()))
            .args(["unshare", "--mount", "--propagation", "private", "bash"])
            .arg(&path)
            .env("WORK", home.dir())
            .env("NETWORK", home.network())
            .env("CGROUP_PARENT", home.cgroup_parent())
            .envs(vars.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn().expect("starting the session");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("session stdout");
        Session {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            transcript: Transcript::default(),
            stderr: stderr_path,
        }
    }

    /// Reads the script's steps until it pauses; panics with the transcript if it ends instead.
    pub fn until_pause(&mut self) -> &Transcript {
        while let Some(Ok(line)) = self.lines.next() {
            if self.transcript.push(&line) == Some("pause") {
                return &self.transcript;
            }
        }
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        panic!(
            "the session ended before its pause:\n{}\nstderr: {stderr}",
            self.transcript.text
        );
    }

    /// Lets the paused script go on.
    pub fn resume(&mut self) {
        let stdin = self.stdin.as_mut().expect("session stdin");
        stdin
            .write_all(b"go\n")
            .and_then(|_| stdin.flush())
            .expect("resuming the session");
    }

    /// Reads the script to its end and waits for it; the transcript records its exit status.
    pub fn finish(mut self) -> Transcript {
        self.stdin.take();
        for line in self.lines.by_ref().map_while(Result::ok) {
            self.transcript.push(&line);
        }
        let status = self.child.wait().expect("waiting for the session");
        self.transcript.exit = status.code();
        std::mem::take(&mut self.transcript)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // EOF at the pause makes the script exit through its cleanup trap.
        self.stdin.take();
        let _ = self.child.wait();
    }
}

/// What a session printed, split into its steps.
#[derive(Debug, Default)]
pub struct Transcript {
    pub text: String,
    pub steps: Vec<Step>,
    pub exit: Option<i32>,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub rc: i32,
    pub output: String,
}

impl Transcript {
    /// Adds one line; returns the name of the step it starts, if it starts one.
    fn push(&mut self, line: &str) -> Option<&str> {
        self.text.push_str(line);
        self.text.push('\n');
        let header = line.strip_prefix("@@@ ").and_then(|rest| {
            let (name, rc) = rest.rsplit_once(' ')?;
            Some((name.to_string(), rc.parse().ok()?))
        });
        match header {
            Some((name, rc)) => {
                self.steps.push(Step {
                    name,
                    rc,
                    output: String::new(),
                });
                self.steps.last().map(|s| s.name.as_str())
            }
            None => {
                if let Some(step) = self.steps.last_mut() {
                    step.output.push_str(line);
                    step.output.push('\n');
                }
                None
            }
        }
    }

    /// The last step called `name`; panics with the transcript when there is none.
    pub fn step(&self, name: &str) -> &Step {
        self.steps
            .iter()
            .rev()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no step {name:?} in the session:\n{self}"))
    }

    /// The output of step `name`, which must have succeeded.
    pub fn ok(&self, name: &str) -> &str {
        let step = self.step(name);
        assert_eq!(step.rc, 0, "step {name:?} failed:\n{self}");
        step.output.trim()
    }
}

impl fmt::Display for Transcript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)?;
        if let Some(code) = self.exit {
            write!(f, "(session exit {code})")?;
        }
        Ok(())
    }
}
