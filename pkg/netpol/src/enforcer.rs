//! The enforcer's state and its pass, level-triggered: the objects as last listed or watched,
//! what the kernel's table holds (read back, or as last written), and a pass that compiles the
//! policies, diffs what the table should hold against what it holds and writes the difference
//! (its elements in one nfnetlink batch; new chains, changed rules and removals around it
//! through `nft`). A pass is the same at start, after an event, after someone else changed the
//! table, and at a resync: an event is only a reason to look again.
//!
//! Nothing is written before every kind has been listed once: a restart keeps the table as it
//! was until the enforcer knows the whole cluster again. While the API server is unreachable
//! the objects stay as they were, and so does the table.

use crate::compile::{Compiled, Compiler, Direction, Problem};
use crate::model::{Namespace, NetworkPolicy, Pod};
use crate::nft::{plan, Desired, Plan, Table};
use crate::objects::{key, Change, Key, Objects};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// One kind's change, as a watch delivers it.
#[derive(Debug, Clone)]
pub enum Update {
    Namespaces(Change<Namespace>),
    Pods(Change<Pod>),
    Policies(Change<NetworkPolicy>),
}

/// The kernel as a pass uses it.
pub trait Kernel {
    /// The table as the kernel holds it; None when there is none.
    fn read(&mut self) -> Result<Option<Table>, String>;
    /// Writes the difference; the ids the kernel announces its commits with.
    fn write(&mut self, plan: &Plan) -> Result<Vec<u32>, String>;
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Lines of the transaction written (0: the table was right).
    pub wrote: usize,
    /// Whether the table was read back first.
    pub read: bool,
    /// Problems first seen in this pass.
    pub new_problems: Vec<Problem>,
    /// How long the compilation, the reading and the writing took.
    pub compiled_in: Duration,
    pub read_in: Duration,
    pub written_in: Duration,
}

/// Pods changed in a new listing that the compiler is told of one by one; more, and it
/// compiles everything again.
const RELISTED_PODS_TOLD: usize = 64;
/// Commits of its own, remembered to tell them from others'.
const OWN_COMMITS: usize = 32;
/// Announcements lost this soon after a write of its own were its own: a transaction of many
/// elements announces each, more than a socket's buffer holds. A change by someone else in that
/// moment is found at the next resync.
const LOST_GRACE: Duration = Duration::from_secs(2);

pub struct Enforcer {
    node: String,
    objects: Objects,
    /// Which kinds have been listed once: namespaces, pods, policies.
    listed: [bool; 3],
    /// What the table holds, as last read or written; None: read it at the next pass.
    held: Option<Option<Table>>,
    own_commits: VecDeque<u32>,
    /// When its last write ended.
    last_write: Option<Instant>,
    problems: BTreeSet<Problem>,
    /// The first change not yet in the kernel.
    pending_since: Option<Instant>,
    /// The highest resourceVersion of the objects heard of (0 while none was a number).
    seen_version: u64,
    compiled: Compiled,
    /// What the next pass's compilation reuses of the last, and its table.
    compiler: Compiler,
    tables: Desired,
    /// Elements in the allow sets the last pass wanted.
    set_elements: usize,
}

impl Enforcer {
    pub fn new(node: &str) -> Enforcer {
        Enforcer {
            node: node.to_string(),
            objects: Objects::default(),
            listed: [false; 3],
            held: None,
            own_commits: VecDeque::new(),
            last_write: None,
            problems: BTreeSet::new(),
            pending_since: None,
            seen_version: 0,
            compiled: Compiled::default(),
            compiler: Compiler::default(),
            tables: Desired::default(),
            set_elements: 0,
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Takes a change in; whether it changed what is known.
    pub fn update(&mut self, mut u: Update, at: Instant) -> bool {
        self.seen_version = self.seen_version.max(highest_version(&u));
        // A change of nothing the policies read (a pod's status heartbeat) is no change.
        strip_versions(&mut u);
        // What a change may touch is told to the compiler before the objects take it in (it
        // reads the old pods).
        self.tell_compiler(&u);
        let (i, changed) = match u {
            Update::Namespaces(c) => (0, self.objects.namespaces_changed(c)),
            Update::Pods(c) => (1, self.objects.pods_changed(c)),
            Update::Policies(c) => (2, self.objects.policies_changed(c)),
        };
        if changed && i == 0 {
            self.compiler.forget();
        }
        let first_list = !self.listed[i];
        self.listed[i] = true;
        if changed || first_list {
            self.pending_since.get_or_insert(at);
        }
        changed || first_list
    }

    /// Tells the compiler which pods and policies `u` changes (a namespace's change it is told
    /// once the objects took it in).
    fn tell_compiler(&mut self, u: &Update) {
        match u {
            Update::Namespaces(_) => {}
            Update::Pods(Change::Applied(p)) => self.pod_changed(key(&p.metadata), Some(p)),
            Update::Pods(Change::Deleted(p)) => self.pod_changed(key(&p.metadata), None),
            Update::Pods(Change::Listed(items)) => {
                let now: BTreeMap<_, _> = items.iter().map(|p| (key(&p.metadata), p)).collect();
                let mut changed: Vec<_> = now
                    .iter()
                    .filter(|(k, p)| self.objects.pods.get(*k) != Some(**p))
                    .map(|(k, p)| (k.clone(), Some(*p)))
                    .collect();
                changed.extend(
                    self.objects
                        .pods
                        .keys()
                        .filter(|k| !now.contains_key(*k))
                        .map(|k| (k.clone(), None)),
                );
                // Each pod's change is looked for in every resolved rule: past a few, anew.
                if changed.len() > RELISTED_PODS_TOLD {
                    self.compiler.forget();
                    return;
                }
                for (k, p) in changed {
                    self.pod_changed(k, p);
                }
            }
            Update::Policies(Change::Applied(p) | Change::Deleted(p)) => {
                self.compiler.policy_changed(&key(&p.metadata))
            }
            Update::Policies(Change::Listed(items)) => {
                let now: BTreeMap<_, _> = items.iter().map(|p| (key(&p.metadata), p)).collect();
                let old = &self.objects.policies;
                let changed: BTreeSet<_> = now
                    .iter()
                    .filter(|(k, p)| old.get(*k) != Some(**p))
                    .map(|(k, _)| k.clone())
                    .chain(old.keys().filter(|k| !now.contains_key(*k)).cloned())
                    .collect();
                for k in changed {
                    self.compiler.policy_changed(&k);
                }
            }
        }
    }

    /// Tells the compiler of the pod `key`'s change to `new` (None: gone).
    fn pod_changed(&mut self, k: Key, new: Option<&Pod>) {
        let old = self.objects.pods.get(&k);
        if old != new {
            self.compiler
                .pod_changed(&self.objects, &self.node, old, new);
        }
    }

    /// Whether every kind has been listed, so that a pass may write.
    pub fn knows_the_cluster(&self) -> bool {
        self.listed.iter().all(|l| *l)
    }

    /// Someone committed a change to the table (`pid`; None: changes may have been missed).
    /// Whether it was someone else, so that the table must be read again.
    pub fn committed(&mut self, pid: Option<u32>, at: Instant) -> bool {
        let foreign = match pid {
            Some(p) => !self.own_commits.contains(&p),
            None => self
                .last_write
                .is_none_or(|w| at.saturating_duration_since(w) > LOST_GRACE),
        };
        if foreign {
            self.held = None;
        }
        foreign
    }

    /// The table must be read back at the next pass (a resync).
    pub fn forget_table(&mut self) {
        self.held = None;
    }

    /// The highest resourceVersion heard of: once a pass that started after it succeeds, the
    /// kernel holds what every change up to it says. (resourceVersions are opaque to clients;
    /// the API server's are etcd's revisions, numbers, and this is for tests and operators.)
    pub fn seen_version(&self) -> u64 {
        self.seen_version
    }

    /// The last compilation.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// When the oldest change the kernel does not hold yet came; taken by the caller when a
    /// pass succeeds.
    pub fn take_pending_since(&mut self) -> Option<Instant> {
        self.pending_since.take()
    }

    /// One pass: compile, diff against the table, write the difference. An error leaves the
    /// table to be read again at the next pass.
    pub fn pass(&mut self, kernel: &mut impl Kernel) -> Result<Pass, String> {
        let mut out = Pass::default();
        let start = Instant::now();
        self.compiled = self.compiler.compile(&self.objects, &self.node);
        let seen: BTreeSet<Problem> = self.compiled.problems.iter().cloned().collect();
        out.new_problems = seen.difference(&self.problems).cloned().collect();
        self.problems = seen;
        let want = self.tables.table(&self.compiled);
        self.set_elements = want.sets.values().map(|s| s.elems.len()).sum();
        out.compiled_in = start.elapsed();
        let start = Instant::now();
        let held = match self.held.take() {
            Some(h) => h,
            None => {
                out.read = true;
                kernel.read()?
            }
        };
        out.read_in = start.elapsed();
        if let Some(plan) = plan(&want, held.as_ref()) {
            out.wrote = plan.lines();
            let start = Instant::now();
            let written = kernel.write(&plan);
            out.written_in = start.elapsed();
            self.last_write = Some(Instant::now());
            for p in written? {
                self.own_commits.push_back(p);
                if self.own_commits.len() > OWN_COMMITS {
                    self.own_commits.pop_front();
                }
            }
        }
        self.held = Some(Some(want));
        Ok(out)
    }

    /// Pods isolated per direction, and elements in all allow sets.
    pub fn sizes(&self) -> Sizes {
        let mut s = Sizes {
            local_pods: self.compiled.pods.len(),
            policies: self.compiled.policies,
            problems: self.problems.len(),
            elements: self.set_elements,
            ..Sizes::default()
        };
        for p in &self.compiled.pods {
            for d in Direction::BOTH {
                if p.isolation(d).is_some() {
                    match d {
                        Direction::Ingress => s.isolated_ingress += 1,
                        Direction::Egress => s.isolated_egress += 1,
                    }
                }
            }
        }
        s
    }
}

fn version(meta: &crate::model::Meta) -> u64 {
    meta.resource_version.parse().unwrap_or(0)
}

fn highest<T>(c: &Change<T>, meta: impl Fn(&T) -> &crate::model::Meta) -> u64 {
    match c {
        Change::Listed(items) => items.iter().map(|o| version(meta(o))).max().unwrap_or(0),
        Change::Applied(o) | Change::Deleted(o) => version(meta(o)),
    }
}

fn strip<T>(c: &mut Change<T>, meta: impl Fn(&mut T) -> &mut crate::model::Meta) {
    match c {
        Change::Listed(items) => items
            .iter_mut()
            .for_each(|o| meta(o).resource_version.clear()),
        Change::Applied(o) | Change::Deleted(o) => meta(o).resource_version.clear(),
    }
}

fn strip_versions(u: &mut Update) {
    match u {
        Update::Namespaces(c) => strip(c, |o| &mut o.metadata),
        Update::Pods(c) => strip(c, |o| &mut o.metadata),
        Update::Policies(c) => strip(c, |o| &mut o.metadata),
    }
}

fn highest_version(u: &Update) -> u64 {
    match u {
        Update::Namespaces(c) => highest(c, |o| &o.metadata),
        Update::Pods(c) => highest(c, |o| &o.metadata),
        Update::Policies(c) => highest(c, |o| &o.metadata),
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub policies: usize,
    pub local_pods: usize,
    pub isolated_ingress: usize,
    pub isolated_egress: usize,
    pub elements: usize,
    pub problems: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::desired;
    use serde_json::json;

    /// A kernel that keeps the table as the transactions leave it, by the model.
    #[derive(Default)]
    struct Fake {
        table: Option<Table>,
        reads: usize,
        writes: Vec<String>,
        fail: bool,
    }

    impl Kernel for Fake {
        fn read(&mut self) -> Result<Option<Table>, String> {
            self.reads += 1;
            Ok(self.table.clone())
        }
        fn write(&mut self, plan: &Plan) -> Result<Vec<u32>, String> {
            if self.fail {
                return Err("nft said no".into());
            }
            self.writes.push(plan.text());
            Ok(vec![4242])
        }
    }

    fn pod(ns: &str, name: &str, ip: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("u-{name}"), "labels": {"pod": name}},
            "spec": {"nodeName": "n1"}, "status": {"podIP": ip}
        }))
        .unwrap()
    }

    fn deny(ns: &str) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"name": "deny", "namespace": ns},
            "spec": {"podSelector": {}}}))
        .unwrap()
    }

    fn listed(e: &mut Enforcer) {
        let now = Instant::now();
        e.update(Update::Namespaces(Change::Listed(vec![])), now);
        e.update(
            Update::Pods(Change::Listed(vec![pod("x", "a", "10.0.0.2")])),
            now,
        );
        e.update(Update::Policies(Change::Listed(vec![])), now);
    }

    #[test]
    fn nothing_is_written_before_every_kind_is_listed() {
        let mut e = Enforcer::new("n1");
        let now = Instant::now();
        e.update(Update::Pods(Change::Listed(vec![])), now);
        e.update(Update::Policies(Change::Listed(vec![])), now);
        assert!(!e.knows_the_cluster());
        e.update(Update::Namespaces(Change::Listed(vec![])), now);
        assert!(e.knows_the_cluster());
    }

    #[test]
    fn a_pass_reads_once_writes_the_difference_and_its_own_commits_are_its_own() {
        let mut e = Enforcer::new("n1");
        let mut k = Fake::default();
        listed(&mut e);
        let p = e.pass(&mut k).unwrap();
        assert!(p.read && p.wrote > 0);
        k.table = Some(desired(e.compiled()));
        // Nothing changed: no read, no write.
        let p = e.pass(&mut k).unwrap();
        assert_eq!((p.read, p.wrote), (false, 0));
        assert!(!e.committed(Some(4242), Instant::now()), "its own commit");
        assert!(
            !e.committed(None, Instant::now()),
            "lost just after a write of its own"
        );
        assert!(
            e.committed(None, Instant::now() + LOST_GRACE * 2),
            "lost later"
        );
        assert!(e.committed(Some(7), Instant::now()), "another's");
        let p = e.pass(&mut k).unwrap();
        assert_eq!((p.read, p.wrote), (true, 0));
        // A policy: the transaction of the difference, and x/a isolated.
        e.update(Update::Policies(Change::Applied(deny("x"))), Instant::now());
        let p = e.pass(&mut k).unwrap();
        assert!(p.wrote > 0 && !p.read);
        assert!(k
            .writes
            .last()
            .unwrap()
            .contains("add chain inet flannel-netpol ingress-u-a"));
        assert_eq!(e.sizes().isolated_ingress, 1);
        assert!(e.take_pending_since().is_some());
        assert!(e.take_pending_since().is_none());
    }

    #[test]
    fn a_new_version_of_what_the_policies_read_alone_is_no_change() {
        let mut e = Enforcer::new("n1");
        listed(&mut e);
        let mut a = pod("x", "a", "10.0.0.2");
        a.metadata.resource_version = "1007".into();
        assert!(!e.update(Update::Pods(Change::Applied(a.clone())), Instant::now()));
        assert_eq!(e.seen_version(), 1007);
        a.metadata.labels.insert("role".into(), "db".into());
        assert!(e.update(Update::Pods(Change::Applied(a)), Instant::now()));
    }

    #[test]
    fn a_failed_write_reads_the_table_again_next_time() {
        let mut e = Enforcer::new("n1");
        let mut k = Fake {
            fail: true,
            ..Fake::default()
        };
        listed(&mut e);
        assert_eq!(e.pass(&mut k).unwrap_err(), "nft said no");
        k.fail = false;
        assert!(e.pass(&mut k).unwrap().read);
        assert_eq!(k.reads, 2);
    }

    #[test]
    fn problems_are_told_once() {
        let mut e = Enforcer::new("n1");
        let mut k = Fake::default();
        listed(&mut e);
        let bad: NetworkPolicy =
            serde_json::from_value(json!({"metadata": {"name": "bad", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "nope"}}]}]}}))
            .unwrap();
        e.update(Update::Policies(Change::Applied(bad)), Instant::now());
        assert_eq!(e.pass(&mut k).unwrap().new_problems.len(), 1);
        assert!(e.pass(&mut k).unwrap().new_problems.is_empty());
    }

    #[test]
    fn a_new_listing_is_told_to_the_compiler_change_by_change() {
        let mut e = Enforcer::new("n1");
        let mut k = Fake::default();
        listed(&mut e);
        let from_b: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "from-b", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}}))
        .unwrap();
        e.update(Update::Policies(Change::Applied(from_b)), Instant::now());
        e.pass(&mut k).unwrap();
        let before = e.compiled().clone();
        // Listed again: x/b came (of another node), x/a is as it was.
        let mut b = pod("x", "b", "10.0.0.3");
        b.spec.node_name = "n2".into();
        let relisted = vec![pod("x", "a", "10.0.0.2"), b];
        assert!(e.update(Update::Pods(Change::Listed(relisted)), Instant::now()));
        e.pass(&mut k).unwrap();
        assert_ne!(e.compiled(), &before);
        assert_eq!(e.compiled(), &crate::compile::compile(e.objects(), "n1"));
        // And gone again.
        let relisted = vec![pod("x", "a", "10.0.0.2")];
        assert!(e.update(Update::Pods(Change::Listed(relisted)), Instant::now()));
        e.pass(&mut k).unwrap();
        assert_eq!(e.compiled(), &before);
    }
}
