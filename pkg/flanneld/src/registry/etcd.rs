//! Leases in etcd v3, in flannel's schema: `<prefix>/config`, `<prefix>/subnets/<key>`, each lease
//! created in a transaction guarded by its key not existing and attached to an etcd lease.

use super::{Change, Entry, KeyValue, Listing, RegistryError, Result, WatchEnd};
use crate::lease::SubnetKey;
use conncause::{connection_cause, Peer};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

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

pub struct EtcdRegistry {
    /// Connected at the first request.
    client: tokio::sync::OnceCell<Client>,
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

async fn timed<T>(
    opts: &EtcdOptions,
    what: &str,
    f: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(RegistryError::Etcd {
            what: what.to_string(),
            cause: etcd_cause(&source, opts),
            source,
        }),
        Err(_) => Err(RegistryError::Timeout {
            what: what.to_string(),
            after: REQUEST_TIMEOUT,
        }),
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
        let mut co = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
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

    /// The registry, its options checked; it connects at its first request, and again at
    /// the next one while it cannot.
    pub async fn connect(opts: EtcdOptions) -> Result<EtcdRegistry> {
        Ok(EtcdRegistry {
            client: tokio::sync::OnceCell::new(),
            connect: Self::connect_options(&opts)?,
            opts,
        })
    }

    /// The client, connected (no request is made unless a user must authenticate).
    async fn client(&self) -> Result<Client> {
        let opts = &self.opts;
        let client = self
            .client
            .get_or_try_init(|| async {
                let what = format!("connecting to etcd at {}", opts.endpoints.join(","));
                let connect = Client::connect(&opts.endpoints, Some(self.connect.clone()));
                timed(opts, &what, connect).await
            })
            .await?;
        Ok(client.clone())
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
        c: &mut Client,
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
            let r = timed(&self.opts, &format!("creating {path}"), c.txn(txn)).await?;
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
        let mut c = self.client().await?;
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let grant = timed(
            &self.opts,
            "granting an etcd lease",
            c.lease_grant(ttl_secs, None),
        )
        .await?;
        Ok(grant.id())
    }
}

impl EtcdRegistry {
    async fn read_config(&self) -> Result<Option<Vec<u8>>> {
        let mut c = self.client().await?;
        let key = format!("{}/config", self.opts.prefix);
        let resp = timed(
            &self.opts,
            &format!("reading {key}"),
            c.get(key.as_str(), None),
        )
        .await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn list_leases(&self) -> Result<Listing> {
        let mut c = self
            .client()
            .await?
            .kv_client()
            .max_decoding_message_size(MAX_ANSWER);
        let prefix = self.subnets_prefix();
        let resp = timed(
            &self.opts,
            &format!("listing {prefix}"),
            c.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
        )
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
        let mut c = match self.client().await {
            Ok(c) => c.watch_client().max_decoding_message_size(MAX_ANSWER),
            Err(e) => return WatchEnd::Broken(e),
        };
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut stream = match timed(
            &self.opts,
            &format!("watching {prefix}"),
            c.watch(prefix.as_str(), Some(opts)),
        )
        .await
        {
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
        let mut c = self.client().await?;
        let result = self
            .create_guarded(&mut c, key, &path, value, lease, listed)
            .await;
        match result {
            Ok(()) => Ok(SystemTime::now() + ttl),
            Err(e) => {
                // The grant would only expire by itself; give it back now.
                let _ = timed(
                    &self.opts,
                    "revoking an unused etcd lease",
                    c.lease_revoke(lease),
                )
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
        let mut c = self.client().await?;
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
        let r = timed(&self.opts, &format!("renewing {path}"), c.txn(txn)).await?;
        if r.succeeded() {
            // A reservation holds no lease: the one granted is not needed.
            let _ = timed(
                &self.opts,
                "revoking an unused etcd lease",
                c.lease_revoke(lease),
            )
            .await;
        }
        Ok(SystemTime::now() + ttl)
    }

    async fn delete(&self, key: &SubnetKey) -> Result<()> {
        let path = self.lease_key(key);
        let mut c = self.client().await?;
        timed(
            &self.opts,
            &format!("deleting {path}"),
            c.delete(path.as_str(), None),
        )
        .await?;
        Ok(())
    }
}
