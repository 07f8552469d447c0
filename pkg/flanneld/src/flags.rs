//! flanneld's flags, with its names and defaults; each also read from `FLANNELD_<FLAG>`.

use clap::Parser;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// Go's strconv.ParseBool, which flanneld's boolean flags and variables go through.
fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (true or false)")),
    }
}

fn annotation_prefix(s: &str) -> Result<String, String> {
    crate::annotation_prefix::complete(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// `--iptables-mode`: legacy or nft; None: auto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IptablesModeFlag(pub Option<cni_kernel::firewall::IptablesMode>);

fn iptables_mode(s: &str) -> Result<IptablesModeFlag, String> {
    match s {
        "auto" => Ok(IptablesModeFlag(None)),
        _ => cni_kernel::firewall::IptablesMode::parse(s)
            .map(|m| IptablesModeFlag(Some(m)))
            .ok_or_else(|| format!("{s:?} is not an iptables mode (auto, legacy or nft)")),
    }
}

fn regex(s: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(s).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "flanneld",
    about = "The flannel fabric daemon: takes a subnet lease for this node, writes subnet.env for the \
             flannel CNI plugin and follows the other nodes' leases.",
    after_help = "`flanneld doctor [FLAGS] [--json] [--fix]` looks at this node as the daemon would \
                  find it, with the same flags and nothing written: `flanneld doctor --help` says \
                  what it checks.",
    disable_version_flag = true,
    // Go's flag package: a flag given twice takes the last value (-iface and -iface-regex add).
    args_override_self = true
)]
pub struct Flags {
    /// etcd v3 endpoints, comma separated. Without them and without --registry-dir, flanneld's
    /// default: http://127.0.0.1:4001,http://127.0.0.1:2379.
    #[arg(
        long,
        env = "FLANNELD_ETCD_ENDPOINTS",
        value_delimiter = ',',
        value_name = "URLS"
    )]
    pub etcd_endpoints: Vec<String>,

    /// etcd key prefix of the network config and the leases.
    #[arg(
        long,
        env = "FLANNELD_ETCD_PREFIX",
        default_value = "/coreos.com/network"
    )]
    pub etcd_prefix: String,

    /// TLS client key for etcd (PEM).
    #[arg(long, env = "FLANNELD_ETCD_KEYFILE", value_name = "PATH")]
    pub etcd_keyfile: Option<PathBuf>,

    /// TLS client certificate for etcd (PEM).
    #[arg(long, env = "FLANNELD_ETCD_CERTFILE", value_name = "PATH")]
    pub etcd_certfile: Option<PathBuf>,

    /// CA certificate that signed etcd's server certificate (PEM).
    #[arg(long, env = "FLANNELD_ETCD_CAFILE", value_name = "PATH")]
    pub etcd_cafile: Option<PathBuf>,

    /// etcd user name.
    #[arg(long, env = "FLANNELD_ETCD_USERNAME")]
    pub etcd_username: Option<String>,

    /// etcd password.
    #[arg(long, env = "FLANNELD_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,

    /// Interface (a name or an address, which is then its address) for traffic between nodes;
    /// repeat to try several in order. Default: the interface that holds --public-ip, else the
    /// one of the default route.
    #[arg(
        long,
        env = "FLANNELD_IFACE",
        value_delimiter = ',',
        value_name = "NAME|ADDR"
    )]
    pub iface: Vec<String>,

    /// Regular expression matched against interface addresses, then names; repeatable. Tried
    /// when no --iface fits.
    #[arg(long, env = "FLANNELD_IFACE_REGEX", value_parser = regex, value_name = "REGEX")]
    pub iface_regex: Vec<regex::Regex>,

    /// Use the interface of the route to this address. Tried when no --iface or --iface-regex
    /// fits.
    #[arg(long, env = "FLANNELD_IFACE_CAN_REACH", value_name = "ADDR")]
    pub iface_can_reach: Option<IpAddr>,

    /// IPv4 address other nodes reach this one at; without --iface, the interface that holds it
    /// is the external one. Default: the interface's address.
    #[arg(long, env = "FLANNELD_PUBLIC_IP", value_name = "ADDR")]
    pub public_ip: Option<Ipv4Addr>,

    /// IPv6 address other nodes reach this one at; without --iface (or --public-ip), the
    /// interface that holds it is the external one. Default: the interface's address.
    #[arg(long, env = "FLANNELD_PUBLIC_IPV6", value_name = "ADDR")]
    pub public_ipv6: Option<Ipv6Addr>,

    /// Where to write the node's subnet for the flannel CNI plugin.
    #[arg(
        long,
        env = "FLANNELD_SUBNET_FILE",
        default_value = "/run/flannel/subnet.env",
        value_name = "PATH"
    )]
    pub subnet_file: PathBuf,

    /// Renew the lease this many minutes before it expires (1 to 1439).
    #[arg(
        long,
        env = "FLANNELD_SUBNET_LEASE_RENEW_MARGIN",
        default_value_t = 60,
        value_parser = clap::value_parser!(u32).range(1..=1439),
        value_name = "MINUTES"
    )]
    pub subnet_lease_renew_margin: u32,

    /// Lease lifetime in seconds (flannel's fixed 24 hours; shorter only for tests). The
    /// renewal happens at the margin before expiry, or at a third of the lifetime when that is
    /// shorter.
    #[arg(
        long,
        env = "FLANNELD_SUBNET_LEASE_TTL",
        default_value_t = 86400,
        value_parser = clap::value_parser!(u64).range(2..=86400 * 365),
        value_name = "SECONDS"
    )]
    pub subnet_lease_ttl: u64,

    /// Masquerade traffic leaving the cluster network.
    #[arg(long, env = "FLANNELD_IP_MASQ", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub ip_masq: bool,

    /// Masquerade without --random-fully.
    #[arg(long, env = "FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE", value_parser = go_bool,
          num_args = 0..=1, default_value = "false", default_missing_value = "true",
          value_name = "BOOL")]
    pub ip_masq_fully_random_disable: bool,

    /// Add FORWARD accept rules for the cluster network.
    #[arg(long, env = "FLANNELD_IPTABLES_FORWARD_RULES", value_parser = go_bool,
          num_args = 0..=1, default_value = "true", default_missing_value = "true",
          value_name = "BOOL")]
    pub iptables_forward_rules: bool,

    /// Program the routes to other nodes through nexthop objects where the kernel has them
    /// (5.3 and later; linear cost at tens of thousands of nodes); false: plain routes, as
    /// Go's flanneld writes them. Not a flag of Go's flanneld.
    #[arg(long, env = "FLANNELD_NEXTHOPS", value_parser = go_bool, num_args = 0..=1,
          default_value = "true", default_missing_value = "true", value_name = "BOOL")]
    pub nexthops: bool,

    /// Add a blackhole route for this node's subnet, so that traffic to its unused addresses is
    /// dropped rather than sent on (for setups without a bridge holding the subnet).
    #[arg(long, env = "FLANNELD_IP_BLACKHOLE_ROUTE", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub ip_blackhole_route: bool,

    /// Which iptables the rules go through: legacy, nft, or auto (the one holding the host's
    /// rules, as kubernetes-sigs/iptables-wrappers decides: kubelet's chains, then which holds
    /// more rules, else nft). Not a flag of Go's flanneld, whose image's iptables-wrappers
    /// decides the same. No effect with EnableNFTables, which writes through nft itself.
    #[arg(long, env = "FLANNELD_IPTABLES_MODE", value_parser = iptables_mode,
          default_value = "auto", value_name = "auto|legacy|nft")]
    pub iptables_mode: IptablesModeFlag,

    /// Seconds between checks that the firewall rules are still in place.
    #[arg(
        long,
        env = "FLANNELD_IPTABLES_RESYNC",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..),
        value_name = "SECONDS"
    )]
    pub iptables_resync: u64,

    /// Address the health endpoints (/healthz, /readyz) listen on.
    #[arg(
        long,
        env = "FLANNELD_HEALTHZ_IP",
        default_value = "0.0.0.0",
        value_name = "ADDR"
    )]
    pub healthz_ip: IpAddr,

    /// Port of the health endpoints; 0 turns them off.
    #[arg(
        long,
        env = "FLANNELD_HEALTHZ_PORT",
        default_value_t = 0,
        value_name = "PORT"
    )]
    pub healthz_port: u16,

    /// Network config file, used by the embedded registry when its directory holds no
    /// `config`.
    #[arg(
        long,
        env = "FLANNELD_NET_CONFIG_PATH",
        default_value = "/etc/kube-flannel/net-conf.json",
        value_name = "PATH"
    )]
    pub net_config_path: PathBuf,

    /// Keep leases in the embedded registry: this directory, shared by the daemons of one
    /// machine as nodes share an etcd (for example /var/lib/flanneld/registry). Not with
    /// --etcd-endpoints.
    #[arg(
        long,
        env = "FLANNELD_REGISTRY_DIR",
        conflicts_with = "etcd_endpoints",
        value_name = "PATH"
    )]
    pub registry_dir: Option<PathBuf>,

    /// Leases from the Kubernetes API: this node's subnet is its Node's podCIDR, the other
    /// nodes' leases are their annotations (the node is NODE_NAME, else POD_NAME's node).
    #[arg(long, env = "FLANNELD_KUBE_SUBNET_MGR", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub kube_subnet_mgr: bool,

    /// With --kube-subnet-mgr: the Kubernetes API server's URL (replaces the kubeconfig's).
    /// Without it and --kubeconfig-file, the in-cluster configuration.
    #[arg(long, env = "FLANNELD_KUBE_API_URL", value_name = "URL")]
    pub kube_api_url: Option<String>,

    /// With --kube-subnet-mgr: the kubeconfig to reach the Kubernetes API with.
    #[arg(long, env = "FLANNELD_KUBECONFIG_FILE", value_name = "PATH")]
    pub kubeconfig_file: Option<PathBuf>,

    /// With --kube-subnet-mgr: the prefix of the node annotations that hold the leases.
    #[arg(long, env = "FLANNELD_KUBE_ANNOTATION_PREFIX",
          default_value = crate::annotation_prefix::DEFAULT,
          value_parser = annotation_prefix, value_name = "PREFIX")]
    pub kube_annotation_prefix: String,

    /// With --kube-subnet-mgr: set the node's NetworkUnavailable condition to False once the
    /// lease is written.
    #[arg(long, env = "FLANNELD_SET_NODE_NETWORK_UNAVAILABLE", value_parser = go_bool,
          num_args = 0..=1, default_value = "true", default_missing_value = "true",
          value_name = "BOOL")]
    pub set_node_network_unavailable: bool,

    /// Print the version and exit.
    #[arg(long)]
    pub version: bool,

    /// Log lines as plain text, or as one JSON object each for log collectors.
    #[arg(long, env = "FLANNELD_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    #[command(flatten)]
    pub klog: KlogFlags,
}

/// klog's flags, as Go's flanneld registers them: it takes -v, -vmodule and -log_backtrace_at
/// (also as FLANNELD_V, FLANNELD_VMODULE, FLANNELD_LOG_BACKTRACE_AT), klog the rest. Each is
/// taken here, so that a unit or DaemonSet written for Go's flanneld starts this one: mapped onto
/// the log where it means something, otherwise named in a warning at start.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Go flanneld's logging flags (klog)")]
pub struct KlogFlags {
    /// Log verbosity: 0 info, 1 to 4 debug, 5 and above trace.
    #[arg(
        short = 'v',
        long = "v",
        env = "FLANNELD_V",
        default_value_t = 0,
        value_name = "LEVEL"
    )]
    pub verbosity: u8,

    /// pattern=N,...: verbosity N for the modules a pattern names (`*` and `?` match; a
    /// pattern matches any part of a module path such as flanneld::registry::kube, or with
    /// `/` the whole path), instead of -v. Go's patterns name Go source files; ours, modules.
    #[arg(long = "vmodule", env = "FLANNELD_VMODULE", value_parser = vmodule,
          value_name = "PATTERN=N,...")]
    pub vmodule: Option<VModule>,

    /// Only log lines at or above this severity: INFO, WARNING, ERROR, FATAL (or 0 to 3).
    /// Default INFO, as Go's flanneld sets it.
    #[arg(long = "stderrthreshold", value_parser = severity, value_name = "SEVERITY")]
    pub stderrthreshold: Option<u8>,

    /// true: -stderrthreshold is ignored while -logtostderr is true (klog's old behaviour).
    #[arg(long = "legacy_stderr_threshold_behavior", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub legacy_stderr_threshold_behavior: bool,

    /// Logs go to stderr (the only place flanneld logs to; false is warned about).
    #[arg(long = "logtostderr", value_parser = go_bool, num_args = 0..=1,
          default_value = "true", default_missing_value = "true", value_name = "BOOL")]
    pub logtostderr: bool,

    /// Logs go to stderr as well as to files: they all go to stderr already.
    #[arg(long = "alsologtostderr", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub alsologtostderr: bool,

    /// Ignored, with a warning: no stack traces of Go source lines here.
    #[arg(long = "log_backtrace_at", env = "FLANNELD_LOG_BACKTRACE_AT",
          value_parser = trace_location, value_name = "FILE.go:N")]
    pub log_backtrace_at: Option<String>,

    /// Ignored, with a warning: flanneld logs to stderr only.
    #[arg(long = "log_dir", value_name = "DIR")]
    pub log_dir: Option<String>,

    /// Ignored, with a warning: flanneld logs to stderr only.
    #[arg(long = "log_file", value_name = "PATH")]
    pub log_file: Option<String>,

    /// Ignored, with a warning: flanneld logs to stderr only.
    #[arg(long = "log_file_max_size", value_name = "MB")]
    pub log_file_max_size: Option<u64>,

    /// Ignored, with a warning when true: the line format is --log-format's.
    #[arg(long = "add_dir_header", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub add_dir_header: bool,

    /// Ignored, with a warning when true: the line format is --log-format's.
    #[arg(long = "skip_headers", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub skip_headers: bool,

    /// Ignored, with a warning when true: there are no log files.
    #[arg(long = "skip_log_headers", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub skip_log_headers: bool,

    /// Ignored, with a warning when true: there are no log files.
    #[arg(long = "one_output", value_parser = go_bool, num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub one_output: bool,
}

/// -vmodule's patterns and their verbosities, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VModule(pub Vec<(String, u8)>);

/// klog's -vmodule: `pattern=N` separated by commas; an empty item is skipped.
fn vmodule(s: &str) -> Result<VModule, String> {
    let mut out = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        let Some((pattern, level)) = item.split_once('=') else {
            return Err(format!("{item:?} is not pattern=N"));
        };
        if pattern.is_empty() {
            return Err(format!("{item:?} has an empty pattern"));
        }
        let level: i32 = level
            .parse()
            .map_err(|_| format!("{item:?}: {level:?} is not a number"))?;
        if level < 0 {
            return Err(format!("{item:?}: the level is negative"));
        }
        out.push((pattern.to_string(), u8::try_from(level).unwrap_or(u8::MAX)));
    }
    Ok(VModule(out))
}

/// klog's -stderrthreshold: a severity's name in any case, or its number.
fn severity(s: &str) -> Result<u8, String> {
    const NAMES: [&str; 4] = ["INFO", "WARNING", "ERROR", "FATAL"];
    if let Some(i) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(s)) {
        return Ok(i as u8);
    }
    let n: i32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not INFO, WARNING, ERROR, FATAL or a number"))?;
    Ok(n.clamp(0, 3) as u8)
}

/// klog's -log_backtrace_at: empty, or `file.go:N`.
fn trace_location(s: &str) -> Result<String, String> {
    let ok = s.is_empty()
        || s.split_once(':').is_some_and(|(file, line)| {
            file.contains('.') && !line.contains(':') && line.parse::<i32>().is_ok()
        });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not file.go:N"))
    }
}

/// A shell-style match of `*` (any run of characters but `stop`) and `?` (one character).
fn glob(pattern: &[u8], text: &[u8], stop: u8) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => {
            let mut i = 0;
            loop {
                if glob(rest, &text[i..], stop) {
                    return true;
                }
                if i == text.len() || text[i] == stop {
                    return false;
                }
                i += 1;
            }
        }
        Some((&p, rest)) => text.split_first().is_some_and(|(&t, tail)| {
            (p == t || (p == b'?' && t != stop)) && glob(rest, tail, stop)
        }),
    }
}

fn level_of(verbosity: u8) -> tracing::Level {
    match verbosity {
        0 => tracing::Level::INFO,
        1..=4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    }
}

/// What the logging flags ask for: which lines are written, and the flags that change nothing.
#[derive(Debug, Clone)]
pub struct LogPlan {
    /// -v's level.
    pub level: tracing::Level,
    /// -vmodule: the first pattern matching an event's module sets its level instead of -v.
    pub modules: Vec<(String, tracing::Level)>,
    /// -stderrthreshold: the least severe level written whatever the verbosity.
    pub floor: tracing::Level,
}

impl LogPlan {
    /// Whether a line of `level` from the module `target` (a Rust module path) is written.
    pub fn enabled(&self, target: &str, level: &tracing::Level) -> bool {
        let wanted = self
            .modules
            .iter()
            .find(|(pattern, _)| Self::names(pattern, target))
            .map_or(self.level, |(_, l)| *l);
        *level <= wanted && *level <= self.floor
    }

    /// The most verbose level any line can have, so that the others cost nothing.
    pub fn max_level(&self) -> tracing::Level {
        let most = self
            .modules
            .iter()
            .map(|(_, l)| *l)
            .fold(self.level, std::cmp::max);
        std::cmp::min(most, self.floor)
    }

    fn names(pattern: &str, target: &str) -> bool {
        if pattern.contains('/') {
            glob(
                pattern.as_bytes(),
                target.replace("::", "/").as_bytes(),
                b'/',
            )
        } else {
            target
                .split("::")
                .any(|part| glob(pattern.as_bytes(), part.as_bytes(), b'/'))
        }
    }
}

impl KlogFlags {
    pub fn plan(&self) -> LogPlan {
        let threshold_applies = !(self.legacy_stderr_threshold_behavior && self.logtostderr);
        // klog's -v lines are of INFO severity: a threshold of INFO keeps them.
        let floor = match self.stderrthreshold.filter(|_| threshold_applies) {
            None | Some(0) => tracing::Level::TRACE,
            Some(1) => tracing::Level::WARN,
            // flanneld has no fatal lines; the reasons it exits for are errors.
            Some(_) => tracing::Level::ERROR,
        };
        LogPlan {
            level: level_of(self.verbosity),
            modules: self
                .vmodule
                .iter()
                .flat_map(|v| v.0.iter())
                .map(|(p, n)| (p.clone(), level_of(*n)))
                .collect(),
            floor,
        }
    }

    /// A warning for each flag that asks for what this flanneld does not do, naming it.
    pub fn ignored(&self) -> Vec<String> {
        let mut out = Vec::new();
        let stderr_only = "flanneld logs to stderr only";
        if !self.logtostderr {
            out.push(format!("-logtostderr=false ignored: {stderr_only}"));
        }
        for (flag, value) in [
            ("log_dir", self.log_dir.clone()),
            ("log_file", self.log_file.clone()),
            (
                "log_file_max_size",
                self.log_file_max_size.map(|n| n.to_string()),
            ),
        ] {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                out.push(format!("-{flag}={v} ignored: {stderr_only}"));
            }
        }
        if let Some(at) = self.log_backtrace_at.as_ref().filter(|a| !a.is_empty()) {
            out.push(format!(
                "-log_backtrace_at={at} ignored: it names a line of Go's flanneld"
            ));
        }
        for (flag, on, why) in [
            (
                "add_dir_header",
                self.add_dir_header,
                "the line format is --log-format's",
            ),
            (
                "skip_headers",
                self.skip_headers,
                "the line format is --log-format's",
            ),
            (
                "skip_log_headers",
                self.skip_log_headers,
                "there are no log files",
            ),
            ("one_output", self.one_output, "there are no log files"),
        ] {
            if on {
                out.push(format!("-{flag} ignored: {why}"));
            }
        }
        out
    }
}

/// What `flanneld doctor` checks, for its help.
const DOCTOR_ABOUT: &str =
    "One look at this node as the flanneld daemon would find it, with nothing \
written. It takes the daemon's own flags (the same registry, interface and subnet file, so a \
unit's or a DaemonSet's arguments work unchanged), reads the network config and this node's \
lease from the registry, chooses the external interface as the daemon does, and compares what \
the node should be with what it holds: the backend's devices (their attributes, the identity the \
lease announces, this node's address on them, up); what each other node's lease calls for in \
the kernel (routes, nexthop objects, neighbours, FDB entries, a WireGuard device's peers); \
subnet.env (both families' subnets and networks, FLANNEL_IPMASQ, and the MTU chain: external \
interface -> device -> FLANNEL_MTU); the masquerade and forward rules of --ip-masq and \
--iptables-forward-rules; the blackhole routes of --ip-blackhole-route. Each finding is one \
line: ok or FAIL, what it is, its state (ok, missing, wrong or extra) and the thing itself, \
devices by name.";

/// `flanneld doctor`'s exit statuses, for its help.
const DOCTOR_EXIT: &str = "Exit status: 0 when all is right (with --fix: when all has been made \
right); 1 when anything is missing, wrong or extra, the registry's answer included; 2 for a bad \
flag or a registry set up wrong (an unreadable TLS file, no kubeconfig, no node name).";

/// `flanneld doctor`'s command line: the daemon's flags, and its own.
#[derive(Debug, Clone)]
pub struct DoctorFlags {
    pub flags: Flags,
    /// `--json`: the findings as JSON.
    pub json: bool,
    /// `--fix`: the plans applied once, then a second look.
    pub fix: bool,
}

impl DoctorFlags {
    /// `flanneld doctor`'s command: the daemon's flags with a help of its own.
    pub fn command() -> clap::Command {
        use clap::{Arg, ArgAction, CommandFactory};
        Flags::command()
            .mut_args(|a| match a.get_help_heading() {
                Some(_) => a,
                None => a.help_heading("The daemon's flags, which doctor takes as the daemon does"),
            })
            .name("flanneld doctor")
            .bin_name("flanneld doctor")
            .about(DOCTOR_ABOUT)
            .after_help(DOCTOR_EXIT)
            .arg(
                Arg::new("json")
                    .long("json")
                    .action(ArgAction::SetTrue)
                    .help_heading(None::<&str>)
                    .display_order(0)
                    .help(
                        "Print the findings as JSON: {\"findings\": [{\"kind\", \"state\", \
                         \"detail\"}, ...]}, and with --fix the second look as \"after_fix\"",
                    ),
            )
            .arg(
                Arg::new("fix")
                    .long("fix")
                    .action(ArgAction::SetTrue)
                    .help_heading(None::<&str>)
                    .display_order(1)
                    .help(
                        "When anything is missing, wrong or extra: write what the look found to \
                         write, once (the daemon's pass, without the daemon), then look again \
                         and print both looks",
                    ),
            )
    }

    /// Parses `flanneld doctor`'s arguments (`args[0]` the program, `doctor` taken out).
    pub fn try_parse_from(
        args: impl IntoIterator<Item = String>,
    ) -> Result<DoctorFlags, clap::Error> {
        use clap::FromArgMatches;
        let matches = DoctorFlags::command().try_get_matches_from(normalise_args(args))?;
        Ok(DoctorFlags {
            flags: Flags::from_arg_matches(&matches)?,
            json: matches.get_flag("json"),
            fix: matches.get_flag("fix"),
        })
    }
}

/// Go's flag package takes `-flag` as well as `--flag`; units written for flanneld use both.
pub fn normalise_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest_literal = false;
    for (i, a) in args.into_iter().enumerate() {
        if i == 0 || rest_literal {
            out.push(a);
            continue;
        }
        if a == "--" {
            rest_literal = true;
            out.push(a);
            continue;
        }
        let single_dash_long = a.starts_with('-')
            && !a.starts_with("--")
            && a.split('=').next().is_some_and(|name| name.len() > 2);
        out.push(if single_dash_long { format!("-{a}") } else { a });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        let argv =
            std::iter::once("flanneld".to_string()).chain(args.iter().map(|s| s.to_string()));
        Flags::try_parse_from(normalise_args(argv))
    }

    #[test]
    fn defaults_are_flanneld_s() {
        let f = parse(&[]).unwrap();
        assert!(f.etcd_endpoints.is_empty());
        assert_eq!(f.etcd_prefix, "/coreos.com/network");
        assert_eq!(f.subnet_file, PathBuf::from("/run/flannel/subnet.env"));
        assert_eq!(f.subnet_lease_renew_margin, 60);
        assert_eq!(f.iptables_resync, 5);
        assert_eq!(f.healthz_port, 0);
        assert!(!f.ip_masq);
        assert!(f.iptables_forward_rules);
        assert!(!f.kube_subnet_mgr && f.set_node_network_unavailable);
        assert_eq!(f.kube_annotation_prefix, "flannel.alpha.coreos.com");
        assert_eq!((f.kube_api_url, f.kubeconfig_file), (None, None));
        assert_eq!(f.registry_dir, None);
        assert!(f.nexthops);
        assert!(!parse(&["-nexthops=false"]).unwrap().nexthops);
        assert_eq!(f.iptables_mode.0, None);
        let legacy = parse(&["--iptables-mode=legacy"]).unwrap().iptables_mode.0;
        assert_eq!(legacy, Some(cni_kernel::firewall::IptablesMode::Legacy));
        let e = parse(&["--iptables-mode=nf_tables"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("auto, legacy or nft"), "{e}");
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value_and_iface_adds_as_in_go() {
        let f = parse(&[
            "--net-config-path=/a",
            "--net-config-path",
            "/b",
            "-v=1",
            "-v=3",
            "--ip-masq",
            "--ip-masq=false",
            "--iface=eth0",
            "--iface",
            "eth1",
            "--iface-regex=^en",
            "--iface-regex=^wl",
        ])
        .unwrap();
        assert_eq!(f.net_config_path, PathBuf::from("/b"));
        assert_eq!(f.klog.verbosity, 3);
        assert!(!f.ip_masq);
        assert_eq!(f.iface, ["eth0", "eth1"]);
        assert_eq!(f.iface_regex.len(), 2);
    }

    #[test]
    fn two_registries_at_once_are_refused() {
        let e = parse(&[
            "--registry-dir",
            "/tmp/r",
            "--etcd-endpoints",
            "http://e:2379",
        ])
        .unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--registry-dir"), "{e}");
    }

    #[test]
    fn kube_flags_are_flanneld_s() {
        let f = parse(&[
            "--kube-subnet-mgr",
            "-kube-api-url=https://10.0.0.1:6443",
            "--kubeconfig-file",
            "/etc/kubernetes/flannel.conf",
            "--kube-annotation-prefix=example.com/net",
            "--set-node-network-unavailable=false",
        ])
        .unwrap();
        assert!(f.kube_subnet_mgr && !f.set_node_network_unavailable);
        assert_eq!(f.kube_api_url.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(
            f.kubeconfig_file,
            Some(PathBuf::from("/etc/kubernetes/flannel.conf"))
        );
        assert_eq!(f.kube_annotation_prefix, "example.com/net");
    }

    #[test]
    fn single_dash_and_go_booleans_are_taken() {
        let f = parse(&[
            "-etcd-endpoints=http://10.0.0.1:2379,http://10.0.0.2:2379",
            "-ip-masq",
            "--iface",
            "eth0",
            "--iface=10.0.0.7",
            "-v=3",
        ])
        .unwrap();
        assert_eq!(f.etcd_endpoints.len(), 2);
        assert!(f.ip_masq);
        assert_eq!(f.iface, ["eth0", "10.0.0.7"]);
        assert_eq!(f.klog.verbosity, 3);
        let f = parse(&["--ip-masq=false", "--iptables-forward-rules=0"]).unwrap();
        assert!(!f.ip_masq && !f.iptables_forward_rules);
    }

    #[test]
    fn bad_values_name_the_flag_and_the_value() {
        for (args, flag, value) in [
            (
                &["--subnet-lease-renew-margin", "0"][..],
                "--subnet-lease-renew-margin",
                "0",
            ),
            (
                &["--subnet-lease-renew-margin=1440"][..],
                "--subnet-lease-renew-margin",
                "1440",
            ),
            (
                &["--public-ip", "300.1.1.1"][..],
                "--public-ip",
                "300.1.1.1",
            ),
            (&["--healthz-port", "99999"][..], "--healthz-port", "99999"),
            (&["--ip-masq=maybe"][..], "--ip-masq", "maybe"),
            (&["--iface-regex", "("][..], "--iface-regex", "("),
            (
                &["--kube-annotation-prefix", "a/b/c"][..],
                "--kube-annotation-prefix",
                "a/b/c",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            let text = e.to_string();
            assert!(text.contains(flag) && text.contains(value), "{text}");
        }
        assert_eq!(parse(&["--no-such-flag"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn every_klog_flag_is_taken_as_go_spells_it() {
        let f = parse(&[
            "-v=2",
            "-vmodule=kube=4,etcd*=0,",
            "-log_backtrace_at=main.go:120",
            "-logtostderr",
            "-alsologtostderr=true",
            "-add_dir_header",
            "-log_dir=/var/log/flannel",
            "-log_file",
            "/var/log/flanneld.log",
            "-log_file_max_size=100",
            "-one_output=true",
            "-skip_headers",
            "-skip_log_headers=false",
            "-stderrthreshold=warning",
            "-legacy_stderr_threshold_behavior=false",
            "--etcd-endpoints=http://10.0.0.1:2379",
        ])
        .unwrap();
        let k = &f.klog;
        assert_eq!(k.verbosity, 2);
        assert_eq!(
            k.vmodule,
            Some(VModule(vec![("kube".into(), 4), ("etcd*".into(), 0)]))
        );
        assert_eq!(k.stderrthreshold, Some(1));
        assert_eq!(k.log_file_max_size, Some(100));
        assert_eq!(f.etcd_endpoints, ["http://10.0.0.1:2379"]);
        let ignored = k.ignored().join("\n");
        for named in [
            "-log_backtrace_at=main.go:120",
            "-log_dir=/var/log/flannel",
            "-log_file=/var/log/flanneld.log",
            "-log_file_max_size=100",
            "-add_dir_header",
            "-one_output",
            "-skip_headers",
        ] {
            assert!(ignored.contains(named), "{named} not in {ignored}");
        }
        // What is already so (stderr) or off is not warned about.
        for quiet in ["logtostderr", "alsologtostderr", "skip_log_headers"] {
            assert!(!ignored.contains(quiet), "{ignored}");
        }
        assert!(parse(&[]).unwrap().klog.ignored().is_empty());
        let off = parse(&["-logtostderr=false"]).unwrap().klog.ignored();
        assert_eq!(off.len(), 1);
        assert!(off[0].contains("-logtostderr=false"), "{off:?}");
    }

    #[test]
    fn klog_values_go_refuses_are_refused_naming_flag_and_value() {
        for (arg, value) in [
            ("-vmodule=kube", "kube"),
            ("-vmodule=kube=x", "x"),
            ("-vmodule=kube=-1", "kube=-1"),
            ("-vmodule==3", "=3"),
            ("-log_backtrace_at=main:12", "main:12"),
            ("-log_backtrace_at=main.go:x", "main.go:x"),
            ("-stderrthreshold=LOUD", "LOUD"),
            ("-logtostderr=maybe", "maybe"),
            ("-log_file_max_size=-1", "-1"),
        ] {
            let e = parse(&[arg]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{arg}");
            let text = e.to_string();
            let flag = arg.trim_start_matches('-').split('=').next().unwrap();
            assert!(text.contains(flag) && text.contains(value), "{arg}: {text}");
        }
    }

    #[test]
    fn vmodule_sets_a_module_s_verbosity_instead_of_v() {
        use tracing::Level;
        let plan = parse(&["-v=2", "-vmodule=kube=5,flanneld/backend/*=0,?tcd=0"])
            .unwrap()
            .klog
            .plan();
        let on = |target, level| plan.enabled(target, &level);
        // -v=2: debug everywhere else.
        assert!(on("flanneld::daemon", Level::DEBUG));
        assert!(!on("flanneld::daemon", Level::TRACE));
        // kube: its module and those under it, to trace.
        assert!(on("flanneld::registry::kube", Level::TRACE));
        assert!(on("flanneld::registry::kube::watch", Level::TRACE));
        // A pattern with / names the whole path: vxlan at 0, info only.
        assert!(!on("flanneld::backend::vxlan", Level::DEBUG));
        assert!(on("flanneld::backend::vxlan", Level::INFO));
        assert!(on("flanneld::backend::vxlan::device", Level::DEBUG));
        assert!(!on("flanneld::registry::etcd", Level::DEBUG));
        assert!(on("flanneld::registry::etcdx", Level::DEBUG));
        assert_eq!(plan.max_level(), Level::TRACE);
        assert_eq!(parse(&[]).unwrap().klog.plan().max_level(), Level::INFO);
    }

    #[test]
    fn stderrthreshold_drops_what_is_less_severe_as_go_s_flanneld_honours_it() {
        use tracing::Level;
        let plan = |args: &[&str]| parse(args).unwrap().klog.plan();
        let p = plan(&["-v=9", "-stderrthreshold=WARNING"]);
        assert!(!p.enabled("flanneld::daemon", &Level::INFO));
        assert!(!p.enabled("flanneld::daemon", &Level::TRACE));
        assert!(p.enabled("flanneld::daemon", &Level::WARN));
        assert_eq!(p.max_level(), Level::WARN);
        for t in ["ERROR", "2", "FATAL", "3"] {
            let p = plan(&["--stderrthreshold", t]);
            assert!(!p.enabled("flanneld::daemon", &Level::WARN), "{t}");
            assert!(p.enabled("flanneld::daemon", &Level::ERROR), "{t}");
        }
        // INFO keeps -v's lines, which klog writes at INFO severity.
        assert!(plan(&["-v=9", "-stderrthreshold=0"]).enabled("x", &Level::TRACE));
        // klog's old behaviour: the threshold means nothing while logging to stderr.
        let legacy = plan(&[
            "-stderrthreshold=ERROR",
            "-legacy_stderr_threshold_behavior=true",
        ]);
        assert!(legacy.enabled("flanneld::daemon", &Level::INFO));
    }
}
