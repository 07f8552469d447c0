//! A stand-in for kube-apiserver, for the daemon's Kubernetes mode and the NetworkPolicy
//! enforcer: Nodes, Namespaces, Pods and NetworkPolicies (list with `limit`/`continue`, of all
//! namespaces or one, watch with resourceVersion and bookmarks, 410 Expired, create, get,
//! delete, merge / strategic-merge / JSON PATCH and PUT of an object and of the status of a
//! Node, Namespace or Pod), over HTTPS with bearer tokens, each token with its own
//! permissions, errors as the API server's `Status` objects. Four kinds, done as the real
//! server does them (a namespace labelled with its name, a pod's status its kubelet's, a
//! policy's defaults), not a general server; policies are stored unvalidated, so that tests can
//! give the enforcer what a real server would refuse.
//!
//! It listens inside a test's network namespace (a thread enters it before binding), keeps its
//! objects across `stop` and `start` (as an API server restarted over the same etcd), and
//! holds thousands of Nodes cheaply: objects are shared between the store, the event window
//! and list snapshots.
//!
//! What else a real API server does, on demand: a too-old resourceVersion answered with a 410
//! status rather than an ERROR event ([`KubeApi::set_expired_watch_as_status`]), watches ended
//! early ([`KubeApi::set_watch_limit`]), 429 or 5xx with or without `Retry-After`
//! ([`KubeApi::set_overloaded`]), a compaction between the pages of a list
//! ([`KubeApi::compact_after_next_first_page`]), HTTP/2 offered in ALPN
//! ([`KubeApi::offer_http2`]).

mod http;
pub mod patch;
mod store;

pub use store::{rfc3339, ApiError, Kind, NAMESPACE_NAME_LABEL};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The rules of kube-flannel's ClusterRole: what flanneld may do.
pub const FLANNEL_RULES: &[(&str, &str)] = &[
    ("get", "nodes"),
    ("list", "nodes"),
    ("watch", "nodes"),
    ("patch", "nodes/status"),
    ("get", "pods"),
];

/// The rules of the NetworkPolicy enforcer's ClusterRole (kube-network-policies' too).
pub const NETPOL_RULES: &[(&str, &str)] = &[
    ("list", "namespaces"),
    ("watch", "namespaces"),
    ("list", "pods"),
    ("watch", "pods"),
    ("list", "networkpolicies"),
    ("watch", "networkpolicies"),
];

/// Watch events kept for watches that resume (the API server's watch cache).
const EVENT_WINDOW: usize = 50_000;
/// How often a watch that asked for bookmarks gets one (the API server: about a minute).
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Principal {
    user: String,
    /// (verb, resource) pairs allowed; None allows everything.
    allowed: Option<BTreeSet<(String, String)>>,
}

impl Principal {
    fn allows(&self, verb: &str, resource: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|a| a.contains(&(verb.to_string(), resource.to_string())))
    }
}

/// An API server refusing every request as an overloaded one does: 429 from its priority and
/// fairness, 503 while it starts or from a proxy in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overload {
    pub code: u16,
    /// The `Retry-After` header's seconds, if any.
    pub retry_after: Option<u64>,
}

/// What the server does besides answering plainly, set by the test.
#[derive(Debug, Clone, Default)]
struct Faults {
    expired_watch_as_status: bool,
    watch_limit: Option<Duration>,
    overload: Option<Overload>,
    compact_after_first_page: bool,
}

/// One request as the server saw it, for tests that count lists or look for a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub user: String,
    /// RBAC's verb: list, watch, get, create, patch, update, delete ("" when unauthenticated).
    pub verb: String,
    pub method: String,
    pub path: String,
    pub query: String,
    pub code: u16,
    /// When it came.
    pub at: std::time::Instant,
}

impl Logged {
    /// A query parameter's value, as sent (not decoded).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    }
}

struct Shared {
    store: Mutex<Store>,
    /// Signalled on every write, for the watches.
    changed: Condvar,
    tokens: Mutex<BTreeMap<String, Principal>>,
    /// Without TLS every request is the cluster's administrator (the old insecure port).
    plain_admin: bool,
    requests: Mutex<Vec<Logged>>,
    bookmark_ms: AtomicU64,
    faults: Mutex<Faults>,
    /// The ALPN protocol of every TLS connection ("" when none was chosen).
    negotiated: Mutex<Vec<String>>,
}

use store::Store;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    fn authenticate(&self, authorization: Option<&str>) -> Option<Principal> {
        let token = authorization.and_then(|a| a.strip_prefix("Bearer ").map(str::trim));
        match token {
            Some(t) => lock(&self.tokens).get(t).cloned(),
            None if self.plain_admin => Some(Principal {
                user: "system:admin".into(),
                allowed: None,
            }),
            None => None,
        }
    }

    fn log(&self, req: &http::Request, user: &str, verb: &str, code: u16) {
        lock(&self.requests).push(Logged {
            user: user.to_string(),
            verb: verb.to_string(),
            method: req.method.clone(),
            path: req.path.clone(),
            query: req.raw_query.clone(),
            code,
            at: std::time::Instant::now(),
        });
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }

    fn bookmark_interval(&self) -> Duration {
        Duration::from_millis(self.bookmark_ms.load(Ordering::Relaxed))
    }
}

/// A user of the API server: its bearer token and a kubeconfig that uses it.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub token: String,
    pub kubeconfig: PathBuf,
}

/// The listening side while the server runs.
struct Running {
    stopped: Arc<AtomicBool>,
    listener: TcpListener,
    conns: Arc<Mutex<BTreeMap<u64, TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

pub struct KubeApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    netns: Option<PathBuf>,
    tls: Option<Arc<rustls::ServerConfig>>,
    dir: PathBuf,
    admin: User,
    running: Option<Running>,
    users: u64,
}

/// The CA and the server's certificate, made with openssl for `ip`.
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn make_certs(dir: &Path, ip: std::net::IpAddr) -> Certs {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("running openssl: {e}"));
        assert!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=kubernetes-ca",
    ]);
    fs::write(
        dir.join("apiserver-ext.cnf"),
        format!(
            "subjectAltName=IP:{ip},DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .unwrap_or_else(|e| panic!("writing apiserver-ext.cnf in {}: {e}", dir.display()));
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "apiserver.crt",
        "-days",
        "2",
        "-extfile",
        "apiserver-ext.cnf",
    ]);
    Certs {
        ca: dir.join("ca.crt"),
        cert: dir.join("apiserver.crt"),
        key: dir.join("apiserver.key"),
    }
}

fn server_config(certs: &Certs) -> Result<rustls::ServerConfig, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&certs.cert)
        .and_then(|i| i.collect())
        .map_err(|e| format!("reading {}: {e}", certs.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&certs.key)
        .map_err(|e| format!("reading {}: {e}", certs.key.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| e.to_string())?;
    // HTTP/2 is not spoken: clients that offer it fall back to HTTP/1.1.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

fn random_token() -> String {
    let mut buf = [0u8; 16];
    let got = fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf));
    if got.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        buf = t.to_le_bytes();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl KubeApi {
    /// An API server on `addr` (port 0: any free port), over HTTPS with certificates made in
    /// `dir`, listening inside the network namespace at `netns` (None: this process's own).
    /// `dir` also receives `admin.kubeconfig` and the kubeconfig of every user added.
    pub fn start(netns: Option<&Path>, addr: SocketAddr, dir: &Path) -> KubeApi {
        let certs = make_certs(dir, addr.ip());
        let cfg = server_config(&certs).unwrap_or_else(|e| panic!("the API server's TLS: {e}"));
        Self::launch(netns, addr, dir, Some(Arc::new(cfg)))
    }

    /// The same over plain HTTP, where every request is the administrator's (for
    /// `--kube-api-url http://...` without a kubeconfig).
    pub fn start_plain(netns: Option<&Path>, addr: SocketAddr, dir: &Path) -> KubeApi {
        Self::launch(netns, addr, dir, None)
    }

    fn launch(
        netns: Option<&Path>,
        addr: SocketAddr,
        dir: &Path,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> KubeApi {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(EVENT_WINDOW)),
            changed: Condvar::new(),
            tokens: Mutex::new(BTreeMap::new()),
            plain_admin: tls.is_none(),
            requests: Mutex::new(Vec::new()),
            bookmark_ms: AtomicU64::new(BOOKMARK_INTERVAL.as_millis() as u64),
            faults: Mutex::default(),
            negotiated: Mutex::default(),
        });
        let mut api = KubeApi {
            shared,
            addr,
            netns: netns.map(Path::to_path_buf),
            tls,
            dir: dir.to_path_buf(),
            admin: User {
                name: String::new(),
                token: String::new(),
                kubeconfig: PathBuf::new(),
            },
            running: None,
            users: 0,
        };
        api.resume();
        api.admin = api.add_user("kubernetes-admin", None);
        api
    }

    /// `https://<addr>` (or `http://`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that signed the server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The administrator: may do everything.
    pub fn admin(&self) -> &User {
        &self.admin
    }

    /// A user allowed only `rules` ((verb, resource) pairs; None: everything), with a token
    /// and a kubeconfig `<dir>/<name>.kubeconfig`.
    pub fn add_user(&mut self, name: &str, rules: Option<&[(&str, &str)]>) -> User {
        self.users += 1;
        let token = random_token();
        lock(&self.shared.tokens).insert(
            token.clone(),
            Principal {
                user: name.to_string(),
                allowed: rules.map(|r| {
                    r.iter()
                        .map(|(v, res)| (v.to_string(), res.to_string()))
                        .collect()
                }),
            },
        );
        let file_name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let kubeconfig = self.dir.join(format!("{file_name}.kubeconfig"));
        let ca = if self.tls.is_some() {
            format!("    certificate-authority: {}\n", self.ca_file().display())
        } else {
            String::new()
        };
        fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\n{ca}\
                 contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: {name}\n\
                 current-context: standin\nusers:\n- name: {name}\n  user:\n    token: {token}\n",
                self.url()
            ),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", kubeconfig.display()));
        User {
            name: name.to_string(),
            token,
            kubeconfig,
        }
    }

    /// Takes `verb` on `resource` away from the user whose token is `token`.
    pub fn forbid(&self, token: &str, verb: &str, resource: &str) {
        let mut tokens = lock(&self.shared.tokens);
        let p = tokens
            .get_mut(token)
            .unwrap_or_else(|| panic!("no user has the token {token}"));
        let allowed = p.allowed.get_or_insert_with(|| {
            FLANNEL_RULES
                .iter()
                .chain(&[
                    ("create", "nodes"),
                    ("delete", "nodes"),
                    ("patch", "nodes"),
                    ("update", "nodes"),
                    ("get", "nodes/status"),
                    ("update", "nodes/status"),
                ])
                .map(|(v, r)| (v.to_string(), r.to_string()))
                .collect()
        });
        allowed.remove(&(verb.to_string(), resource.to_string()));
    }

    /// Gives `verb` on `resource` back to the user whose token is `token`.
    pub fn allow(&self, token: &str, verb: &str, resource: &str) {
        let mut tokens = lock(&self.shared.tokens);
        if let Some(a) = tokens.get_mut(token).and_then(|p| p.allowed.as_mut()) {
            a.insert((verb.to_string(), resource.to_string()));
        }
    }

    /// How often watches that asked for bookmarks get one.
    pub fn set_bookmark_interval(&self, every: Duration) {
        self.shared
            .bookmark_ms
            .store(every.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// A watch whose resourceVersion has left the window is answered with a 410 status before
    /// its stream begins (as some servers and proxies do) rather than with an ERROR event in a
    /// 200 stream.
    pub fn set_expired_watch_as_status(&self, on: bool) {
        self.shared.faults().expired_watch_as_status = on;
    }

    /// Every watch ends, as the server's own timeout ends it, after at most `limit` (None: its
    /// timeoutSeconds). A watch running now ends at its next event or bookmark check.
    pub fn set_watch_limit(&self, limit: Option<Duration>) {
        self.shared.faults().watch_limit = limit;
        self.shared.changed.notify_all();
    }

    /// Every request is refused so (None: served again).
    pub fn set_overloaded(&self, overload: Option<Overload>) {
        self.shared.faults().overload = overload;
    }

    /// Compacts right after serving the first page of the next list that has more pages, so
    /// that its continue token expires as it does when etcd compacts between two pages.
    pub fn compact_after_next_first_page(&self) {
        self.shared.faults().compact_after_first_page = true;
    }

    /// Offers HTTP/2 in ALPN besides HTTP/1.1, as a real API server does, from the next
    /// connection on. This server speaks HTTP/1.1 only: a client that picks h2 is recorded
    /// ([`KubeApi::negotiated_protocols`]) and its connection closed.
    pub fn offer_http2(&mut self) {
        if let Some(cfg) = &self.tls {
            let mut c = (**cfg).clone();
            c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            self.tls = Some(Arc::new(c));
        }
        if self.running.is_some() {
            self.stop();
            self.resume();
        }
    }

    /// The protocol each TLS connection so far chose in ALPN ("" for none).
    pub fn negotiated_protocols(&self) -> Vec<String> {
        lock(&self.shared.negotiated).clone()
    }

    /// Stops listening and ends every connection, watches included; the objects stay.
    pub fn stop(&mut self) {
        let Some(mut r) = self.running.take() else {
            return;
        };
        r.stopped.store(true, Ordering::Relaxed);
        // Wakes the accept() of the listening thread.
        let _ =
            nix::sys::socket::shutdown(r.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        for c in lock(&r.conns).values() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        self.shared.changed.notify_all();
        if let Some(t) = r.accept.take() {
            let _ = t.join();
        }
    }

    /// Listens again on the same address after `stop`.
    pub fn resume(&mut self) {
        if self.running.is_some() {
            return;
        }
        let stopped = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<BTreeMap<u64, TcpStream>>> = Arc::default();
        let (tx, rx) = mpsc::channel();
        let netns = self.netns.clone();
        let addr = self.addr;
        let shared = self.shared.clone();
        let tls = self.tls.clone();
        let (stop2, conns2) = (stopped.clone(), conns.clone());
        let accept = std::thread::spawn(move || {
            let bound = (|| -> Result<TcpListener, String> {
                if let Some(p) = &netns {
                    let f =
                        fs::File::open(p).map_err(|e| format!("opening {}: {e}", p.display()))?;
                    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("entering {}: {e}", p.display()))?;
                }
                TcpListener::bind(addr).map_err(|e| format!("binding {addr}: {e}"))
            })();
            let listener = match bound.and_then(|l| {
                l.try_clone()
                    .map(|c| (l, c))
                    .map_err(|e| format!("cloning the listener: {e}"))
            }) {
                Ok((l, c)) => {
                    let _ = tx.send(Ok(c));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let mut next_id = 0u64;
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                next_id += 1;
                let id = next_id;
                if let Ok(c) = conn.try_clone() {
                    lock(&conns2).insert(id, c);
                }
                let (shared, tls, stopped, conns) =
                    (shared.clone(), tls.clone(), stop2.clone(), conns2.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_nodelay(true);
                    match tls {
                        Some(cfg) => {
                            if let Ok(mut server) = rustls::ServerConnection::new(cfg) {
                                let mut conn = conn;
                                while server.is_handshaking() {
                                    if server.complete_io(&mut conn).is_err() {
                                        break;
                                    }
                                }
                                let alpn = server
                                    .alpn_protocol()
                                    .map(|p| String::from_utf8_lossy(p).into_owned())
                                    .unwrap_or_default();
                                let h2 = alpn == "h2";
                                if !server.is_handshaking() {
                                    lock(&shared.negotiated).push(alpn);
                                }
                                if !h2 && !server.is_handshaking() {
                                    let s = rustls::StreamOwned::new(server, conn);
                                    http::serve(s, &shared, &stopped);
                                }
                            }
                        }
                        None => http::serve(conn, &shared, &stopped),
                    }
                    lock(&conns).remove(&id);
                });
            }
        });
        let listener = rx
            .recv()
            .unwrap_or_else(|_| Err("the listening thread died".into()))
            .unwrap_or_else(|e| panic!("starting the API server stand-in: {e}"));
        if let Ok(a) = listener.local_addr() {
            self.addr = a;
        }
        self.running = Some(Running {
            stopped,
            listener,
            conns,
            accept: Some(accept),
        });
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Creates a Node as `kubectl create` would; panics with the API's error.
    pub fn create_node(&self, node: Value) -> Value {
        self.create(Kind::Node, "", node)
            .unwrap_or_else(|e| panic!("creating a node: {}", e.message))
    }

    /// Creates many Nodes under one lock, as a burst.
    pub fn create_nodes(&self, nodes: impl IntoIterator<Item = Value>) {
        self.create_many(Kind::Node, "", nodes);
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.get(Kind::Node, "", name)
    }

    pub fn node_count(&self) -> usize {
        self.count(Kind::Node)
    }

    /// A merge patch of `nodes/<name>` (`status`: of `nodes/<name>/status`).
    pub fn patch_node(&self, name: &str, status: bool, patch: &Value) -> Result<Value, ApiError> {
        self.patch(Kind::Node, "", name, status, patch)
    }

    pub fn delete_node(&self, name: &str) -> Result<(), ApiError> {
        self.delete(Kind::Node, "", name).map(|_| ())
    }

    /// A Pod the daemon can find its node through (POD_NAME, POD_NAMESPACE): on the host's
    /// network, as kube-flannel's pods are; its namespace is made when missing.
    pub fn add_pod(&self, namespace: &str, name: &str, node: &str) {
        let mut store = self.shared.store();
        if store.get(Kind::Namespace, "", namespace).is_err() {
            let ns = serde_json::json!({"metadata": {"name": namespace}});
            if let Err(e) = store.create(Kind::Namespace, "", ns) {
                panic!("creating namespace {namespace}: {}", e.message);
            }
        }
        let pod = serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "hostNetwork": true,
                "containers": [{"name": "kube-flannel", "image": "flanneld"}],
            },
        });
        if let Err(e) = store.create(Kind::Pod, namespace, pod) {
            panic!("creating pod {namespace}/{name}: {}", e.message);
        }
        drop(store);
        self.shared.changed.notify_all();
    }

    /// Creates an object of `kind` (in `namespace` when the kind is namespaced) as a POST
    /// would; the stored object.
    pub fn create(&self, kind: Kind, namespace: &str, obj: Value) -> Result<Value, ApiError> {
        let made = self.shared.store().create(kind, namespace, obj)?;
        self.shared.changed.notify_all();
        Ok((*made).clone())
    }

    /// Creates many objects under one lock, as a burst; panics with the API's error.
    pub fn create_many(&self, kind: Kind, namespace: &str, objs: impl IntoIterator<Item = Value>) {
        let mut store = self.shared.store();
        for o in objs {
            if let Err(e) = store.create(kind, namespace, o) {
                panic!("creating {} in {namespace:?}: {}", kind.plural(), e.message);
            }
        }
        drop(store);
        self.shared.changed.notify_all();
    }

    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store()
            .get(kind, namespace, name)
            .ok()
            .map(|n| (*n).clone())
    }

    /// Every object of `kind` (in `namespace` when given).
    pub fn list(&self, kind: Kind, namespace: Option<&str>) -> Vec<Value> {
        self.shared
            .store()
            .current(kind, namespace)
            .iter()
            .map(|o| (**o).clone())
            .collect()
    }

    /// How many objects of `kind` there are.
    pub fn count(&self, kind: Kind) -> usize {
        self.shared.store().count(kind)
    }

    /// A merge patch of an object (`status`: of its status, as its kubelet or controller
    /// writes it).
    pub fn patch(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        status: bool,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let part = if status {
            store::Part::Status
        } else {
            store::Part::Main
        };
        let n = self.shared.store().patch(
            kind,
            namespace,
            name,
            part,
            store::PatchType::Merge,
            patch.to_string().as_bytes(),
        )?;
        self.shared.changed.notify_all();
        Ok((*n).clone())
    }

    /// Replaces an object's metadata and spec, as a PUT does.
    pub fn replace(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        obj: &Value,
    ) -> Result<Value, ApiError> {
        let n = self.shared.store().update(
            kind,
            namespace,
            name,
            store::Part::Main,
            obj.to_string().as_bytes(),
        )?;
        self.shared.changed.notify_all();
        Ok((*n).clone())
    }

    /// Deletes an object (a namespace with everything in it); the deleted object.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let gone = self.shared.store().delete(kind, namespace, name)?;
        self.shared.changed.notify_all();
        Ok((*gone).clone())
    }

    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version()
    }

    /// Drops the event window and list snapshots: every watch or continue token from before
    /// now gets 410 Expired.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Logged> {
        lock(&self.shared.requests).clone()
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_allow_only_their_rules() {
        let p = Principal {
            user: "u".into(),
            allowed: Some(
                FLANNEL_RULES
                    .iter()
                    .map(|(v, r)| (v.to_string(), r.to_string()))
                    .collect(),
            ),
        };
        assert!(p.allows("patch", "nodes/status"));
        assert!(!p.allows("patch", "nodes"));
        assert!(!p.allows("delete", "nodes"));
    }
}
