//! The daemon's life: the network config, this node's lease (acquired, renewed), subnet.env, and
//! the other nodes' leases followed through watches and resyncs into the backend.

use crate::alloc::{self, Action, Node};
use crate::backend::Datapath;
use crate::config::{self, ConfigError, NetConfig};
use crate::iface::{self, LinkFacts, Route, Wanted};
use crate::lease::{LeaseAttrs, SubnetKey};
use crate::masq::{self, MasqSpec};
use crate::metrics::{self, METRICS};
use crate::registry::{Change, Listing, Registry, RegistryError, WatchEnd};
use crate::view::{LeaseView, Outcome};
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use subnetenv::SubnetEnv;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

/// How the daemon ended.
#[derive(Debug)]
pub enum Exit {
    /// Asked to stop: leases and the datapath stay for the next start.
    Stopped,
    /// A bad network config or external interface at start: exit status 2.
    BadStart(String),
    /// This node's lease was deleted by someone else: exit status 1.
    LeaseLost(String),
}

pub struct Settings {
    pub wanted: Wanted,
    pub links: Vec<LinkFacts>,
    pub routes: Vec<Route>,
    pub subnet_file: PathBuf,
    pub ip_masq: bool,
    /// Not `--ip-masq-fully-random-disable`.
    pub random_fully: bool,
    /// `--iptables-forward-rules`.
    pub forward_rules: bool,
    /// `--iptables-resync`.
    pub iptables_resync: Duration,
    pub ttl: Duration,
    pub renew_margin: Duration,
    pub ready: Arc<AtomicBool>,
}

/// When to renew a lease that expires at `expiry`: the margin before, or a third of the
/// lifetime before when the lifetime is shorter than three margins (tests).
pub fn renew_at(expiry: SystemTime, ttl: Duration, margin: Duration) -> SystemTime {
    let lead = margin.min(ttl / 3);
    expiry.checked_sub(lead).unwrap_or(expiry)
}

/// How long to wait before retrying a failed renewal.
pub fn renew_retry(ttl: Duration) -> Duration {
    Duration::from_secs(60)
        .min(ttl / 4)
        .max(Duration::from_millis(200))
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// FLANNEL_SUBNET's form: the subnet's first address with its prefix.
fn first_address(n: IpNetwork) -> IpNetwork {
    let ip = match n.network() {
        std::net::IpAddr::V4(a) => std::net::IpAddr::V4((u32::from(a).wrapping_add(1)).into()),
        std::net::IpAddr::V6(a) => std::net::IpAddr::V6((u128::from(a).wrapping_add(1)).into()),
    };
    IpNetwork::new(ip, n.prefix()).unwrap_or(n)
}

/// The subnet.env this node's lease gives.
pub fn subnet_env(cfg: &NetConfig, key: &SubnetKey, mtu: u32, ip_masq: bool) -> SubnetEnv {
    SubnetEnv {
        networks: cfg
            .ipv4
            .map(|f| IpNetwork::V4(f.network))
            .into_iter()
            .collect(),
        subnet: key.ipv4.map(|n| first_address(IpNetwork::V4(n))),
        ipv6_networks: cfg
            .ipv6
            .map(|f| IpNetwork::V6(f.network))
            .into_iter()
            .collect(),
        ipv6_subnet: key.ipv6.map(|n| first_address(IpNetwork::V6(n))),
        mtu,
        ipmasq: ip_masq,
    }
}

/// The subnet(s) of an earlier subnet.env, if it is readable.
pub fn previous_key(path: &std::path::Path) -> Option<SubnetKey> {
    let text = std::fs::read_to_string(path).ok()?;
    let entries = subnetenv::parse_entries(&text).ok()?;
    let ipv4 = match entries.subnet {
        Some(IpNetwork::V4(n)) => Ipv4Network::new(n.network(), n.prefix()).ok(),
        _ => None,
    };
    let ipv6 = match entries.ipv6_subnet {
        Some(IpNetwork::V6(n)) => Ipv6Network::new(n.network(), n.prefix()).ok(),
        _ => None,
    };
    (ipv4.is_some() || ipv6.is_some()).then_some(SubnetKey { ipv4, ipv6 })
}

async fn wait_for_config<R: Registry>(reg: &R) -> Result<NetConfig, ConfigError> {
    // Each kind of trouble is logged when it starts and then every 30 s.
    let mut last: Option<(bool, Instant)> = None;
    let mut note = |missing: bool, what: String| {
        let due = last.is_none_or(|(m, t)| m != missing || t.elapsed() >= Duration::from_secs(30));
        if due {
            warn!("{what}; retrying every second");
            last = Some((missing, Instant::now()));
        }
    };
    loop {
        match reg.config().await {
            Ok(Some(bytes)) => {
                let text = String::from_utf8_lossy(&bytes);
                return config::parse(&text).map_err(|mut e| {
                    e.reason = format!("{} (in {})", e.reason, reg.config_location());
                    e
                });
            }
            Ok(None) => note(
                true,
                format!("no network config yet at {}", reg.config_location()),
            ),
            Err(e) => note(
                false,
                format!(
                    "reading the network config at {}: {e}",
                    reg.config_location()
                ),
            ),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Lists until the registry answers, logging each failure once per 30 s.
async fn list_until_ok<R: Registry>(reg: &R) -> Listing {
    let mut last_log: Option<Instant> = None;
    let mut delay = Duration::from_millis(200);
    loop {
        match reg.list().await {
            Ok(l) => {
                if last_log.is_some() {
                    info!("reached {} again", reg.describe());
                }
                return l;
            }
            Err(e) => {
                metrics::inc(&METRICS.registry_errors);
                if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                    warn!("listing leases in {}: {e}; retrying", reg.describe());
                    last_log = Some(Instant::now());
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

fn log_bad(outcome: &Outcome, where_: &str) {
    for b in &outcome.bad {
        warn!("skipping lease {} in {where_}: {}", b.key, b.reason);
    }
}

/// Takes a lease for this node, retrying until one is held.
async fn acquire<R: Registry>(
    reg: &R,
    cfg: &NetConfig,
    node: &Node,
    previous: Option<SubnetKey>,
    attrs: &LeaseAttrs,
    ttl: Duration,
) -> (SubnetKey, SystemTime) {
    let value = attrs.encode();
    loop {
        let listing = list_until_ok(reg).await;
        let mut leases = Vec::new();
        for e in &listing.entries {
            match crate::lease::Lease::decode(&e.key, &e.value) {
                Ok(l) => leases.push(l),
                Err(reason) => warn!("skipping lease {} in {}: {reason}", e.key, reg.describe()),
            }
        }
        for b in &listing.bad {
            warn!(
                "skipping lease {} in {}: {}",
                b.key,
                reg.describe(),
                b.reason
            );
        }
        let plan = match alloc::choose(cfg, &leases, node, previous, &mut |n| fastrand::usize(..n))
        {
            Ok(p) => p,
            Err(e) => {
                error!("{e}; retrying in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
                continue;
            }
        };
        for stale in &plan.stale {
            info!("deleting this node's lease {stale}: it does not fit the network config");
            if let Err(e) = reg.delete(stale).await {
                warn!("deleting lease {stale}: {e}");
            }
        }
        let (key, result) = match plan.action {
            Action::Reuse(k) => (k, reg.renew(&k, &value, ttl).await),
            Action::Create(k) => (k, reg.create(&k, &value, ttl).await),
        };
        match result {
            Ok(expiry) => return (key, expiry),
            Err(RegistryError::Exists(k)) => {
                info!("subnet {k} was leased by another node meanwhile; choosing again");
                tokio::time::sleep(Duration::from_millis(fastrand::u64(10..200))).await;
            }
            Err(e) => {
                metrics::inc(&METRICS.registry_errors);
                warn!("taking lease {key}: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Renews the lease before it expires, forever.
async fn renew_forever<R: Registry>(
    reg: Arc<R>,
    key: SubnetKey,
    value: String,
    mut expiry: SystemTime,
    ttl: Duration,
    margin: Duration,
) {
    loop {
        let wait = renew_at(expiry, ttl, margin)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        loop {
            match reg.renew(&key, &value, ttl).await {
                Ok(e) => {
                    expiry = e;
                    metrics::set(&METRICS.lease_expiry, unix_secs(e));
                    info!("renewed lease {key}");
                    break;
                }
                Err(e) => {
                    metrics::inc(&METRICS.registry_errors);
                    let retry = renew_retry(ttl);
                    warn!("renewing lease {key}: {e}; retrying in {retry:?}");
                    tokio::time::sleep(retry).await;
                }
            }
        }
    }
}

/// Follows every other node's lease into `events`; returns when this node's lease is gone.
async fn follow<R: Registry>(
    reg: Arc<R>,
    own: SubnetKey,
    events: mpsc::Sender<Vec<crate::view::Event>>,
) -> String {
    let mut view = LeaseView::new(own);
    let where_ = reg.describe();
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            metrics::inc(&METRICS.resyncs);
        }
        let listing = list_until_ok(reg.as_ref()).await;
        let revision = listing.revision;
        let outcome = view.resync(
            listing
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_slice())),
        );
        for b in &listing.bad {
            warn!("skipping lease {} in {where_}: {}", b.key, b.reason);
        }
        if let Some(lost) = deliver(outcome, &where_, own, &events).await {
            return lost;
        }
        metrics::set(&METRICS.leases_known, view.len() as u64);
        let (tx, mut rx) = mpsc::channel(1024);
        let watcher = {
            let reg = reg.clone();
            tokio::spawn(async move { reg.watch(revision, tx).await })
        };
        while let Some(change) = rx.recv().await {
            let mut outcome = apply_change(&mut view, change, &where_);
            // What has arrived meanwhile (a transaction's thousands of leases) goes to the
            // backend as one batch.
            while let Ok(change) = rx.try_recv() {
                let more = apply_change(&mut view, change, &where_);
                outcome.events.extend(more.events);
                outcome.bad.extend(more.bad);
                outcome.own_removed |= more.own_removed;
            }
            if let Some(lost) = deliver(outcome, &where_, own, &events).await {
                watcher.abort();
                return lost;
            }
            metrics::set(&METRICS.leases_known, view.len() as u64);
        }
        // However the watch ended, the next round lists everything again and diffs.
        match watcher.await {
            Ok(WatchEnd::Compacted(rev)) => {
                info!("the watch on {where_} fell behind a compaction (revision {rev}); listing again");
            }
            Ok(WatchEnd::Broken(why)) => {
                metrics::inc(&METRICS.registry_errors);
                warn!("{why}; listing again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(WatchEnd::Closed) | Err(_) => {}
        }
    }
}

fn apply_change(view: &mut LeaseView, change: Change, where_: &str) -> Outcome {
    match change {
        Change::Put(e) => view.put(&e.key, &e.value),
        Change::Delete(k) => view.delete(&k),
        Change::Snapshot(l) => {
            for b in &l.bad {
                warn!("skipping lease {} in {where_}: {}", b.key, b.reason);
            }
            view.resync(
                l.entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_slice())),
            )
        }
    }
}

async fn deliver(
    outcome: Outcome,
    where_: &str,
    own: SubnetKey,
    events: &mpsc::Sender<Vec<crate::view::Event>>,
) -> Option<String> {
    log_bad(&outcome, where_);
    for e in &outcome.events {
        match e {
            crate::view::Event::Added(l) => info!("lease added: {l}"),
            crate::view::Event::Removed(l) => info!("lease removed: {l}"),
        }
    }
    if !outcome.events.is_empty() {
        let _ = events.send(outcome.events).await;
    }
    outcome
        .own_removed
        .then(|| format!("this node's lease {own} was removed from {where_}"))
}

/// The lease that carries this node's public address, if the registry answers at once.
async fn own_earlier_lease<R: Registry>(
    reg: &R,
    cfg: &NetConfig,
    node: &Node,
) -> Option<LeaseAttrs> {
    let listing = tokio::time::timeout(Duration::from_secs(5), reg.list())
        .await
        .ok()?
        .ok()?;
    listing
        .entries
        .iter()
        .filter_map(|e| crate::lease::Lease::decode(&e.key, &e.value).ok())
        .find(|l| alloc::is_mine(cfg, node, l))
        .map(|l| l.attrs)
}

/// Runs until stopped or the lease is lost.
pub async fn run<R: Registry>(reg: Arc<R>, settings: Settings) -> Exit {
    let cfg = match wait_for_config(reg.as_ref()).await {
        Ok(c) => c,
        Err(e) => return Exit::BadStart(e.to_string()),
    };
    info!(
        "network config: {}{}backend {}",
        cfg.ipv4
            .map(|f| format!("{} /{} subnets, ", f.network, f.subnet_len))
            .unwrap_or_default(),
        cfg.ipv6
            .map(|f| format!("{} /{} subnets, ", f.network, f.subnet_len))
            .unwrap_or_default(),
        cfg.backend_type
    );
    let wanted = Wanted {
        ipv4: cfg.ipv4.is_some(),
        ipv6: cfg.ipv6.is_some(),
        ..settings.wanted.clone()
    };
    let external = match iface::choose(&settings.links, &settings.routes, &wanted) {
        Ok(e) => e,
        Err(e) => return Exit::BadStart(e),
    };
    info!(
        "external interface {} (mtu {}), public address {}",
        external.name,
        external.mtu,
        [
            external.public_ip.map(|a| a.to_string()),
            external.public_ipv6.map(|a| a.to_string())
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
    );
    let node = Node {
        public_ip: external.public_ip,
        public_ipv6: external.public_ipv6,
    };
    // This node's lease from before, for the VtepMAC it announced.
    let earlier = own_earlier_lease(reg.as_ref(), &cfg, &node).await;
    let mut backend = match Datapath::new(&cfg, &external, earlier.as_ref()).await {
        Ok(b) => b,
        Err(e) => return Exit::BadStart(e),
    };
    let attrs = LeaseAttrs {
        public_ip: node.public_ip,
        public_ipv6: node.public_ipv6,
        backend_type: cfg.backend_type.clone(),
        backend_data: backend.backend_data(),
        backend_v6_data: backend.backend_v6_data(),
    };
    let previous = previous_key(&settings.subnet_file);
    let (own, expiry) = acquire(reg.as_ref(), &cfg, &node, previous, &attrs, settings.ttl).await;
    info!("leased subnet {own} in {}", reg.describe());
    metrics::set(&METRICS.lease_expiry, unix_secs(expiry));
    if let Err(e) = backend.set_own(own).await {
        // The reconciler keeps trying; the plugin may already use the subnet.
        error!("setting up the datapath for {own}: {e}");
    }

    let masq = MasqSpec {
        ipv4: cfg.ipv4.zip(own.ipv4).map(|(f, s)| (f.network, s)),
        ipv6: cfg.ipv6.zip(own.ipv6).map(|(f, s)| (f.network, s)),
        nftables: cfg.enable_nftables,
        masq: settings.ip_masq,
        random_fully: settings.random_fully,
        forward_rules: settings.forward_rules,
    };
    let keeper = if masq.masq || masq.forward_rules {
        // The old subnet.env says which rules an earlier lease left behind.
        let old = std::fs::read_to_string(&settings.subnet_file)
            .map(|t| masq::previous(&t))
            .unwrap_or((None, None));
        let spec = masq.clone();
        let first = tokio::task::spawn_blocking(move || -> Result<(), String> {
            masq::remove_other_mode(&spec).map_err(|e| e.to_string())?;
            masq::remove_stale(old.0, old.1, &spec).map_err(|e| e.to_string())?;
            masq::ensure(&spec).map_err(|e| e.to_string())?;
            Ok(())
        })
        .await;
        match first {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(
                "setting up the masquerade and forward rules: {e}; retrying every {:?}",
                settings.iptables_resync
            ),
            Err(e) => error!("setting up the masquerade and forward rules: {e}"),
        }
        Some(tokio::spawn(masq::keep(masq, settings.iptables_resync)))
    } else {
        None
    };

    let env = subnet_env(&cfg, &own, backend.mtu(), settings.ip_masq);
    if let Err(e) = env.write(&settings.subnet_file) {
        // The plugin cannot work without it; keep serving and retry at the next renewal.
        error!("writing {}: {e}", settings.subnet_file.display());
    } else {
        info!("wrote {}", settings.subnet_file.display());
        settings.ready.store(true, Ordering::SeqCst);
        match crate::notify::notify("READY=1") {
            Ok(true) => info!("told systemd the daemon is ready"),
            Ok(false) => {}
            Err(e) => warn!("{e}"),
        }
    }

    let renewer = tokio::spawn(renew_forever(
        reg.clone(),
        own,
        attrs.encode(),
        expiry,
        settings.ttl,
        settings.renew_margin,
    ));
    let (tx, rx) = mpsc::channel::<Vec<crate::view::Event>>(64);
    let backend_task = tokio::spawn(backend.run(rx));
    let follower = tokio::spawn(follow(reg.clone(), own, tx));

    let exit = tokio::select! {
        s = stop_signal() => {
            info!("{s}: stopping; the lease and the datapath stay in place");
            Exit::Stopped
        }
        lost = follower => match lost {
            Ok(why) => Exit::LeaseLost(why),
            Err(e) => Exit::LeaseLost(format!("the lease watcher failed: {e}")),
        },
    };
    renewer.abort();
    backend_task.abort();
    if let Some(k) = keeper {
        k.abort();
    }
    exit
}

async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the daemon still runs; a kill ends it.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::registry::{Entry, RegistryError};
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// A registry whose first watch falls behind a compaction, as etcd's does when a watcher
    /// lags (flannel-io/flannel#2470): the daemon must list once more and go on, not loop.
    struct Compacting {
        lists: AtomicUsize,
        watches: AtomicUsize,
        entries: Mutex<Vec<Entry>>,
    }

    const OTHER: &str = r#"{"PublicIP":"192.168.0.2","PublicIPv6":null,"BackendType":"vxlan"}"#;
    const LATE: &str = r#"{"PublicIP":"192.168.0.3","PublicIPv6":null,"BackendType":"vxlan"}"#;

    impl Registry for Compacting {
        fn describe(&self) -> String {
            "a compacting registry".into()
        }
        fn config_location(&self) -> String {
            "nowhere".into()
        }
        async fn config(&self) -> crate::registry::Result<Option<Vec<u8>>> {
            Ok(None)
        }
        async fn list(&self) -> crate::registry::Result<Listing> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            Ok(Listing {
                entries: self.entries.lock().map(|e| e.clone()).unwrap_or_default(),
                bad: Vec::new(),
                revision: 7,
            })
        }
        async fn create(
            &self,
            k: &SubnetKey,
            _: &str,
            _: Duration,
        ) -> crate::registry::Result<SystemTime> {
            Err(RegistryError::Exists(*k))
        }
        async fn renew(
            &self,
            _: &SubnetKey,
            _: &str,
            _: Duration,
        ) -> crate::registry::Result<SystemTime> {
            Ok(SystemTime::now())
        }
        async fn delete(&self, _: &SubnetKey) -> crate::registry::Result<()> {
            Ok(())
        }
        async fn watch(&self, _: i64, tx: mpsc::Sender<Change>) -> WatchEnd {
            if self.watches.fetch_add(1, Ordering::SeqCst) == 0 {
                // Meanwhile another node joined; the compacted watch never says so.
                if let Ok(mut e) = self.entries.lock() {
                    e.push(Entry {
                        key: "10.5.3.0-24".into(),
                        value: LATE.as_bytes().to_vec(),
                    });
                }
                return WatchEnd::Compacted(9);
            }
            let _ = tx;
            std::future::pending().await
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_compacted_watch_costs_one_resync_and_loses_no_lease() {
        let own = SubnetKey::parse("10.5.1.0-24").unwrap();
        let reg = Arc::new(Compacting {
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            entries: Mutex::new(vec![
                Entry {
                    key: own.to_string(),
                    value: OTHER.replace("0.2", "0.1").into_bytes(),
                },
                Entry {
                    key: "10.5.2.0-24".into(),
                    value: OTHER.as_bytes().to_vec(),
                },
            ]),
        });
        let (tx, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(follow(reg.clone(), own, tx));
        let mut added = Vec::new();
        while added.len() < 2 {
            let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("events within 5 s")
                .expect("the follower is running");
            for e in batch {
                if let crate::view::Event::Added(l) = e {
                    added.push(l.key.to_string());
                }
            }
        }
        assert_eq!(added, ["10.5.2.0-24", "10.5.3.0-24"]);
        // Give a looping follower time to show itself.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            reg.lists.load(Ordering::SeqCst),
            2,
            "one listing, one resync"
        );
        assert_eq!(reg.watches.load(Ordering::SeqCst), 2);
        task.abort();
    }

    #[test]
    fn renewal_comes_at_the_margin_or_a_third_of_a_short_lifetime() {
        let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        let day = Duration::from_secs(86400);
        assert_eq!(
            renew_at(exp, day, Duration::from_secs(3600)),
            exp - Duration::from_secs(3600)
        );
        assert_eq!(
            renew_at(exp, Duration::from_secs(9), Duration::from_secs(3600)),
            exp - Duration::from_secs(3)
        );
        assert_eq!(renew_retry(day), Duration::from_secs(60));
        assert_eq!(renew_retry(Duration::from_secs(8)), Duration::from_secs(2));
    }

    #[test]
    fn subnet_env_is_flannels_byte_for_byte() {
        let cfg = config::parse(r#"{"Network":"10.5.0.0/16"}"#).unwrap();
        let key = SubnetKey::parse("10.5.52.0-24").unwrap();
        assert_eq!(
            subnet_env(&cfg, &key, 1450, true).render(),
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
        );
        let cfg = config::parse(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48"}"#,
        )
        .unwrap();
        let key = SubnetKey::parse("10.5.52.0-24&fc00:0:0:1::-64").unwrap();
        assert_eq!(
            subnet_env(&cfg, &key, 1500, false).render(),
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1500\nFLANNEL_IPMASQ=false\n"
        );
        let cfg =
            config::parse(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}"#)
                .unwrap();
        let key = SubnetKey::parse("0.0.0.0-0&fc00:0:0:7::-64").unwrap();
        assert_eq!(
            subnet_env(&cfg, &key, 1500, false).render(),
            "FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:7::1/64\nFLANNEL_MTU=1500\nFLANNEL_IPMASQ=false\n"
        );
    }

    #[test]
    fn the_previous_subnet_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subnet.env");
        assert_eq!(previous_key(&path), None);
        std::fs::write(&path, "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n").unwrap();
        assert_eq!(previous_key(&path), SubnetKey::parse("10.5.52.0-24").ok());
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(previous_key(&path), None);
    }
}
