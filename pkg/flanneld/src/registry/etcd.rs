//! Leases in etcd v3, in flannel's schema: `<prefix>/config`, `<prefix>/subnets/<key>`, each lease
//! created in a transaction guarded by its key not existing and attached to an etcd lease.

use super::{Change, Entry, KeyValue, Listing, RegistryError, Result, WatchEnd};
use crate::lease::SubnetKey;
use conncause::{connection_cause, Peer};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// How long one request may take, its tries on other members included, before it counts as
/// failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one try of a request that may be repeated waits for its member at most: a member
/// cut off the network holds it until then, and the next try goes to another.
const TRY_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the first try of a request that may be repeated waits at least: it waits
/// [`TRY_SLACK`] times as long as the last answer to the same request took, up to TRY_TIMEOUT;
/// after a round of the members in which one ran out of time, twice as long. A member that
/// takes connections and answers nothing (a restarted one, until its quorum lets it publish
/// itself; the client counts it ready all the same) then costs a request a fraction of a
/// second, not TRY_TIMEOUT.
const FIRST_TRY: Duration = Duration::from_millis(250);
const TRY_SLACK: u32 = 4;

/// The pause after every member failed a try at once, doubling up to the second: a member
/// without a leader fails a request at once, so during a lost quorum this paces the tries, and
/// the first one after the quorum's return comes within it.
const TRY_PAUSES: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(250));

/// The largest answer taken from etcd, as Go's etcd client takes (2 GiB): the gRPC library's
/// default, 4 MiB, is the listing of about 20,000 leases, and a transaction's events come to a
/// watcher in one message.
const MAX_ANSWER: usize = i32::MAX as usize;

/// How often a dual-stack create is tried again when only leases that share none of its
/// subnets were created since its listing, before the node lists and chooses anew.
const GUARDED_TRIES: usize = 50;

/// A lease's key without the subnets prefix: its last element, `10.5.52.0-24`.
fn lease_name(prefix: &str, key: &[u8]) -> String {
    String::from_utf8_lossy(&key[prefix.len().min(key.len())..]).into_owned()
}

#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub keyfile: Option<PathBuf>,
    pub certfile: Option<PathBuf>,
    pub cafile: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// One member of --etcd-endpoints, with its own client: the registry chooses the member of each
/// try itself, so that a try that failed on one goes to another.
struct Member {
    endpoint: String,
    /// Connected at its first try.
    client: tokio::sync::OnceCell<Client>,
}

pub struct EtcdRegistry {
    members: Vec<Member>,
    /// The member a request tries first: the last that answered, or the one after the last that
    /// failed.
    preferred: AtomicUsize,
    /// How long the last answer to each request (by what it does) took.
    answered_in: Mutex<HashMap<String, Duration>>,
    connect: ConnectOptions,
    opts: EtcdOptions,
}

/// What went wrong in a request to etcd, as the operator fixes it: a connection failure by
/// its cause, a refused user by the flags that name it, else etcd's own message.
pub fn etcd_cause(e: &etcd_client::Error, opts: &EtcdOptions) -> String {
    let endpoints = opts.endpoints.join(",");
    let tls = opts.cafile.is_some() || opts.certfile.is_some();
    let peer = Peer {
        what: "etcd",
        address_from: "--etcd-endpoints".into(),
        ca: match &opts.cafile {
            Some(ca) => format!("the CA in --etcd-cafile {}", ca.display()),
            None => "this machine's trusted CAs (no --etcd-cafile)".into(),
        },
        client_cert: opts
            .certfile
            .as_ref()
            .map(|c| format!("the client certificate in --etcd-certfile {}", c.display())),
        closed_hint: match (tls, &opts.certfile) {
            (true, None) => Some(
                "this node offers no client certificate (no --etcd-certfile), which an etcd \
                 with --client-cert-auth refuses"
                    .into(),
            ),
            (false, _) if endpoints.contains("http://") => {
                Some("does it want TLS? --etcd-endpoints says http".into())
            }
            _ => None,
        },
    };
    let inner: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => Some(s),
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::IoError(io) => Some(io),
        _ => None,
    };
    if let Some(cause) = inner.and_then(|i| connection_cause(i, &peer, &endpoints)) {
        return cause;
    }
    let etcd_client::Error::GRpcStatus(status) = e else {
        return e.to_string();
    };
    use tonic::Code;
    let message = status.message();
    let user = opts.username.as_deref().unwrap_or_default();
    match status.code() {
        Code::InvalidArgument if message.contains("authentication failed") => format!(
            "etcd at {endpoints} refuses the user {user:?} of --etcd-username with the password \
             of --etcd-password (or FLANNELD_ETCD_PASSWORD): {message}"
        ),
        Code::Unauthenticated | Code::InvalidArgument if message.contains("user name") => format!(
            "etcd at {endpoints} requires a user: {message} (give --etcd-username and \
             --etcd-password)"
        ),
        Code::PermissionDenied => format!(
            "etcd at {endpoints} does not let the user {user:?} of --etcd-username do this: \
             {message}"
        ),
        Code::Cancelled | Code::Unknown | Code::Unavailable
            if peer.closed_hint.is_some()
                && (message.contains("cancel") || message.contains("transport error")) =>
        {
            peer.closed(&endpoints)
        }
        _ => format!("etcd at {endpoints}: {message}"),
    }
}

/// Which failures of a request are tried again, on whichever member the client picks next.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Repeat {
    /// Reads, and writes that may take effect twice (a renewal's put, a grant, a delete): every
    /// failure of the member or of the connection to it.
    Any,
    /// A create, which a second try would find done and so fail: only failures that show the
    /// request never reached etcd's log (no connection, a member without a leader).
    IfNotApplied,
}

/// Whether a failed try is worth another: the member or the way to it failed, not the request.
/// The client keeps a connection's failure and hands it to the next request on it, even after
/// the member serves again; a second try reconnects or goes to another member.
fn worth_another_try(e: &etcd_client::Error, repeat: Repeat) -> bool {
    use tonic::Code;
    let not_applied = |m: &str| {
        let m = m.to_ascii_lowercase();
        m.contains("no leader") || m.contains("connect") || m.contains("refused")
    };
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
                repeat == Repeat::Any || not_applied(s.message())
            }
            _ => false,
        },
        etcd_client::Error::TransportError(t) => {
            repeat == Repeat::Any || not_applied(&format!("{t:?}"))
        }
        etcd_client::Error::IoError(_) => repeat == Repeat::Any,
        _ => false,
    }
}

/// A file a flag names; `what` says which (`reading --etcd-cafile`).
fn read(path: &PathBuf, what: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| RegistryError::File {
        what,
        path: path.clone(),
        source,
    })
}

impl EtcdRegistry {
    /// The client options from the flags; a TLS file that cannot be read is an error.
    pub fn connect_options(opts: &EtcdOptions) -> Result<ConnectOptions> {
        // A member without a leader answers at once rather than holding the request (and
        // ends a watch it serves), as Go's client asks. Pings only while a request or watch is
        // open: etcd answers pings on an idle connection with GOAWAY after three; every 6 s (etcd
        // allows one per 5 s) so that a watch on a member cut off is given up within 9 s.
        let mut co = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3))
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if let (Some(u), Some(p)) = (&opts.username, &opts.password) {
            co = co.with_user(u.clone(), p.clone());
        }
        let tls_wanted = opts.cafile.is_some() || opts.certfile.is_some();
        if tls_wanted {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &opts.cafile {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca, "reading --etcd-cafile")?));
            }
            match (&opts.certfile, &opts.keyfile) {
                (Some(c), Some(k)) => {
                    tls = tls.identity(Identity::from_pem(
                        read(c, "reading --etcd-certfile")?,
                        read(k, "reading --etcd-keyfile")?,
                    ));
                }
                (None, None) => {}
                _ => return Err(RegistryError::CertWithoutKey),
            }
            co = co.with_tls(tls);
        }
        Ok(co)
    }

    /// The registry, its options checked; it connects to each member at the first try that
    /// goes there, and again at the next while it cannot.
    pub async fn connect(opts: EtcdOptions) -> Result<EtcdRegistry> {
        let members: Vec<Member> = opts
            .endpoints
            .iter()
            .map(|e| Member {
                endpoint: e.clone(),
                client: tokio::sync::OnceCell::new(),
            })
            .collect();
        // Nodes start on different members, as Go's client spreads its requests.
        let first = std::process::id() as usize % members.len().max(1);
        Ok(EtcdRegistry {
            members,
            preferred: AtomicUsize::new(first),
            answered_in: Mutex::new(HashMap::new()),
            connect: Self::connect_options(&opts)?,
            opts,
        })
    }

    /// Member `m`'s client, connected (no request is made unless a user must authenticate).
    async fn member(&self, m: usize) -> std::result::Result<Client, etcd_client::Error> {
        let Some(member) = self.members.get(m) else {
            return Err(etcd_client::Error::InvalidArgs(
                "no etcd endpoint (--etcd-endpoints)".into(),
            ));
        };
        let client = member
            .client
            .get_or_try_init(|| Client::connect([&member.endpoint], Some(self.connect.clone())))
            .await?;
        Ok(client.clone())
    }

    /// How long the first try of `what` may wait (see [`FIRST_TRY`]); `unknown` before any
    /// answer to it.
    fn first_try(&self, what: &str, unknown: Duration) -> Duration {
        let last = self
            .answered_in
            .lock()
            .ok()
            .and_then(|a| a.get(what).copied());
        last.map_or(unknown, |d| (d * TRY_SLACK).clamp(FIRST_TRY, TRY_TIMEOUT))
    }

    fn answered(&self, what: &str, took: Duration) {
        if let Ok(mut a) = self.answered_in.lock() {
            match a.get_mut(what) {
                Some(d) => *d = took,
                None => {
                    a.insert(what.to_string(), took);
                }
            }
        }
    }

    /// One request to etcd: `send` makes each try with a member's client. A try that fails for
    /// its member (see [`Repeat`]) is made again on the next member, and the next request
    /// starts there; after a try on every member failed, a short pause. Until REQUEST_TIMEOUT.
    async fn request<T, F, Fut>(&self, what: &str, repeat: Repeat, send: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let first = self.first_try(what, FIRST_TRY);
        self.request_from(what, repeat, first, send).await
    }

    /// A request whose first try waits `first`.
    async fn request_from<T, F, Fut>(
        &self,
        what: &str,
        repeat: Repeat,
        first: Duration,
        mut send: F,
    ) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let n = self.members.len().max(1);
        let start = self.preferred.load(Ordering::Relaxed);
        let mut try_limit = first;
        // Whether a try of this round of the members ran out of time.
        let mut timed_out = false;
        let mut pause = TRY_PAUSES.0;
        // The last failure a member gave, said rather than a timeout when time runs out.
        let mut last = None;
        let failed = |last: Option<etcd_client::Error>| match last {
            Some(source) => RegistryError::Etcd {
                what: what.to_string(),
                cause: etcd_cause(&source, &self.opts),
                source,
            },
            None => RegistryError::Timeout {
                what: what.to_string(),
                after: REQUEST_TIMEOUT,
            },
        };
        let mut tried = 0;
        loop {
            let m = (start + tried) % n;
            tried += 1;
            let began = tokio::time::Instant::now();
            let left = deadline.saturating_duration_since(began);
            let limit = match repeat {
                Repeat::Any => left.min(try_limit),
                Repeat::IfNotApplied => left,
            };
            let answer = tokio::time::timeout(limit, async {
                let client = self.member(m).await?;
                send(client).await
            })
            .await;
            match answer {
                Ok(Ok(v)) => {
                    self.preferred.store(m, Ordering::Relaxed);
                    self.answered(what, began.elapsed());
                    return Ok(v);
                }
                Ok(Err(e)) if worth_another_try(&e, repeat) => last = Some(e),
                Ok(Err(e)) => return Err(failed(Some(e))),
                Err(_) if repeat == Repeat::IfNotApplied => return Err(failed(None)),
                Err(_) => timed_out = true,
            }
            let _ = self.preferred.compare_exchange(
                m,
                (m + 1) % n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            let now = tokio::time::Instant::now();
            let mut wait = Duration::ZERO;
            if tried % n == 0 {
                // A round in which a member held its try that long: the next round's tries
                // wait longer (a member that fails at once says nothing of how long an answer
                // takes). A round that failed at once: a pause.
                if std::mem::take(&mut timed_out) {
                    try_limit = (try_limit * 2).min(TRY_TIMEOUT);
                } else {
                    wait = pause;
                    pause = (pause * 2).min(TRY_PAUSES.1);
                }
            }
            if now + wait >= deadline {
                return Err(failed(last));
            }
            tokio::time::sleep(wait).await;
        }
    }

    fn subnets_prefix(&self) -> String {
        format!("{}/subnets/", self.opts.prefix)
    }

    fn lease_key(&self, key: &SubnetKey) -> String {
        format!("{}{key}", self.subnets_prefix())
    }

    /// Puts the lease if its key is free and, for a dual-stack key, no lease created since
    /// `listed` shares either of its subnets: such a key names both families, so another
    /// node's new key may differ from ours and still hold one of our subnets. The create is
    /// guarded by no lease having been created since; when another was, the leases created
    /// meanwhile come back in the same answer, and without a shared subnet the put is tried
    /// again from that answer's revision, so nodes starting together do not take turns.
    async fn create_guarded(
        &self,
        key: &SubnetKey,
        path: &str,
        value: &str,
        lease: i64,
        listed: i64,
    ) -> Result<()> {
        let prefix = self.subnets_prefix();
        let dual = key.ipv4.is_some() && key.ipv6.is_some();
        let mut since = listed;
        for _ in 0..GUARDED_TRIES {
            let mut when = vec![Compare::version(path, CompareOp::Equal, 0)];
            let mut otherwise = Vec::new();
            if dual {
                when.push(
                    Compare::create_revision(prefix.as_str(), CompareOp::Less, since + 1)
                        .with_prefix(),
                );
                otherwise.push(TxnOp::get(path, Some(GetOptions::new().with_keys_only())));
                otherwise.push(TxnOp::get(
                    prefix.as_str(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_min_create_revision(since + 1),
                    ),
                ));
            }
            let txn = Txn::new()
                .when(when)
                .and_then([TxnOp::put(
                    path,
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else(otherwise);
            let what = format!("creating {path}");
            let r = self
                .request(&what, Repeat::IfNotApplied, |mut c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .await?;
            if r.succeeded() {
                return Ok(());
            }
            if !dual {
                return Err(RegistryError::Exists(*key));
            }
            let answers = r.op_responses();
            let keys = |i: usize| match answers.get(i) {
                Some(TxnOpResponse::Get(g)) => g
                    .kvs()
                    .iter()
                    .map(|kv| lease_name(&prefix, kv.key()))
                    .collect(),
                _ => Vec::new(),
            };
            let shares = keys(1)
                .iter()
                .any(|k| SubnetKey::parse(k).is_ok_and(|held| held.shares_a_subnet_with(key)));
            if !keys(0).is_empty() || shares {
                return Err(RegistryError::Exists(*key));
            }
            match r.header().map(|h| h.revision()) {
                Some(rev) if rev > since => since = rev,
                _ => return Err(RegistryError::Exists(*key)),
            }
        }
        Err(RegistryError::Exists(*key))
    }

    async fn grant(&self, ttl: Duration) -> Result<i64> {
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let what = "granting an etcd lease";
        let grant = self
            .request(what, Repeat::Any, |mut c| async move {
                c.lease_grant(ttl_secs, None).await
            })
            .await?;
        Ok(grant.id())
    }
}

impl EtcdRegistry {
    async fn read_config(&self) -> Result<Option<Vec<u8>>> {
        let key = format!("{}/config", self.opts.prefix);
        let what = format!("reading {key}");
        let key = key.as_str();
        let resp = self
            .request(
                &what,
                Repeat::Any,
                |mut c| async move { c.get(key, None).await },
            )
            .await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn list_leases(&self) -> Result<Listing> {
        let prefix = self.subnets_prefix();
        let what = format!("listing {prefix}");
        let from = prefix.as_str();
        // A listing's size is the cluster's: its first ever try waits as long as any.
        let first = self.first_try(&what, TRY_TIMEOUT);
        let resp = self
            .request_from(&what, Repeat::Any, first, |c| async move {
                let mut kv = c.kv_client().max_decoding_message_size(MAX_ANSWER);
                kv.get(from, Some(GetOptions::new().with_prefix())).await
            })
            .await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let entries = resp
            .kvs()
            .iter()
            .map(|kv| Entry {
                key: lease_name(&prefix, kv.key()),
                value: kv.value().to_vec(),
            })
            .collect();
        let reserved = resp
            .kvs()
            .iter()
            .filter(|kv| kv.lease() == 0)
            .map(|kv| lease_name(&prefix, kv.key()))
            .collect();
        Ok(Listing {
            entries,
            bad: Vec::new(),
            revision,
            reserved,
        })
    }

    async fn follow(&self, revision: i64, tx: mpsc::Sender<Change>) -> WatchEnd {
        let prefix = self.subnets_prefix();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let what = format!("watching {prefix}");
        let from = prefix.as_str();
        let watching = self.request(&what, Repeat::Any, |c| {
            let opts = opts.clone();
            async move {
                let mut w = c.watch_client().max_decoding_message_size(MAX_ANSWER);
                w.watch(from, Some(opts)).await
            }
        });
        let mut stream = match watching.await {
            Ok(s) => s,
            Err(e) => return WatchEnd::Broken(e),
        };
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    let why = format!("the watch on {prefix} ended");
                    return WatchEnd::Broken(RegistryError::WatchEnded(why));
                }
                Err(source) => {
                    return WatchEnd::Broken(RegistryError::Etcd {
                        what: format!("watching {prefix}"),
                        cause: etcd_cause(&source, &self.opts),
                        source,
                    })
                }
            };
            if resp.compact_revision() > 0 {
                return WatchEnd::Compacted(resp.compact_revision());
            }
            if resp.canceled() {
                let why = format!(
                    "etcd cancelled the watch on {prefix}: {}",
                    resp.cancel_reason()
                );
                return WatchEnd::Broken(RegistryError::WatchEnded(why));
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = lease_name(&prefix, kv.key());
                let change = match ev.event_type() {
                    EventType::Put => Change::Put(Entry {
                        key,
                        value: kv.value().to_vec(),
                    }),
                    EventType::Delete => Change::Delete(key),
                };
                if tx.send(change).await.is_err() {
                    return WatchEnd::Closed;
                }
            }
        }
    }
}

impl KeyValue for EtcdRegistry {
    fn describe(&self) -> String {
        format!(
            "etcd at {} (prefix {})",
            self.opts.endpoints.join(","),
            self.opts.prefix
        )
    }

    fn config_location(&self) -> String {
        format!(
            "{}/config in etcd at {}",
            self.opts.prefix,
            self.opts.endpoints.join(",")
        )
    }

    async fn config(&self) -> Result<Option<Vec<u8>>> {
        self.read_config().await
    }

    async fn list(&self) -> Result<Listing> {
        self.list_leases().await
    }

    async fn watch(&self, revision: i64, tx: mpsc::Sender<Change>) -> WatchEnd {
        self.follow(revision, tx).await
    }

    async fn create(
        &self,
        key: &SubnetKey,
        value: &str,
        ttl: Duration,
        listed: i64,
    ) -> Result<SystemTime> {
        let lease = self.grant(ttl).await?;
        let path = self.lease_key(key);
        let result = self.create_guarded(key, &path, value, lease, listed).await;
        match result {
            Ok(()) => Ok(SystemTime::now() + ttl),
            Err(e) => {
                // The grant would only expire by itself; give it back now.
                let what = "revoking an unused etcd lease";
                let _ = self
                    .request(what, Repeat::Any, |mut c| async move {
                        c.lease_revoke(lease).await
                    })
                    .await;
                Err(e)
            }
        }
    }

    /// A key that exists without an etcd lease is an operator's reservation
    /// (Documentation/reservations.md): its value is written and it stays without a lease;
    /// any other key is written attached to a new lease of `ttl`.
    async fn put(&self, key: &SubnetKey, value: &str, ttl: Duration) -> Result<SystemTime> {
        let lease = self.grant(ttl).await?;
        let path = self.lease_key(key);
        let txn = Txn::new()
            .when([
                Compare::version(path.as_str(), CompareOp::Greater, 0),
                Compare::lease(path.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(path.as_str(), value, None)])
            .or_else([TxnOp::put(
                path.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        // Either branch writes the same value again: the renewal may be tried twice.
        let what = format!("renewing {path}");
        let r = self
            .request(&what, Repeat::Any, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if r.succeeded() {
            // A reservation holds no lease: the one granted is not needed.
            let what = "revoking an unused etcd lease";
            let _ = self
                .request(what, Repeat::Any, |mut c| async move {
                    c.lease_revoke(lease).await
                })
                .await;
        }
        Ok(SystemTime::now() + ttl)
    }

    async fn delete(&self, key: &SubnetKey) -> Result<()> {
        let path = self.lease_key(key);
        let what = format!("deleting {path}");
        let at = path.as_str();
        self.request(&what, Repeat::Any, |mut c| async move {
            c.delete(at, None).await
        })
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn status(code: Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(Status::new(code, message))
    }

    #[tokio::test]
    async fn a_first_try_waits_a_few_times_the_last_answer_within_its_bounds() {
        let opts = EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            ..Default::default()
        };
        let reg = EtcdRegistry::connect(opts).await.expect("the registry");
        assert_eq!(reg.first_try("listing", FIRST_TRY), FIRST_TRY);
        for (took, first) in [
            (Duration::from_millis(10), FIRST_TRY),
            (Duration::from_millis(100), Duration::from_millis(400)),
            (Duration::from_secs(1), TRY_TIMEOUT),
        ] {
            reg.answered("listing", took);
            assert_eq!(
                reg.first_try("listing", FIRST_TRY),
                first,
                "after an answer in {took:?}"
            );
        }
        assert_eq!(reg.first_try("reading", TRY_TIMEOUT), TRY_TIMEOUT);
    }

    #[test]
    fn a_failed_member_is_tried_again_and_a_refused_request_is_not() {
        let no_leader = status(Code::Unavailable, "etcdserver: no leader");
        let refused = status(Code::Unavailable, "tcp connect error: Connection refused");
        let timed_out = status(Code::Unavailable, "etcdserver: request timed out");
        let reset = status(Code::Unknown, "transport error");
        for e in [&no_leader, &refused, &timed_out, &reset] {
            assert!(worth_another_try(e, Repeat::Any), "{e}");
        }
        // A create may have taken effect unless the member had no leader or was not reached.
        assert!(worth_another_try(&no_leader, Repeat::IfNotApplied));
        assert!(worth_another_try(&refused, Repeat::IfNotApplied));
        assert!(!worth_another_try(&timed_out, Repeat::IfNotApplied));
        assert!(!worth_another_try(&reset, Repeat::IfNotApplied));
        for e in [
            status(Code::PermissionDenied, "etcdserver: permission denied"),
            status(Code::InvalidArgument, "etcdserver: authentication failed"),
            status(
                Code::FailedPrecondition,
                "etcdserver: mvcc: required revision has been compacted",
            ),
        ] {
            assert!(!worth_another_try(&e, Repeat::Any), "{e}");
        }
    }
}
