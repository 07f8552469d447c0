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
    crate::registry::kube::Annotations::new(s).map(|_| s.to_string())
}

fn regex(s: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(s).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "flanneld",
    about = "The flannel fabric daemon: takes a subnet lease for this node, writes subnet.env for the \
             flannel CNI plugin and follows the other nodes' leases.",
    after_help = "`flanneld doctor [FLAGS] [--json] [--fix]` reads the registry and the kernel with \
                  the same flags, without a daemon, and reports every missing, extra or wrong \
                  entry; --fix then writes them once and looks again. Exit status 0 when all is \
                  (or, with --fix, has been made) right, 1 otherwise.",
    disable_version_flag = true
)]
pub struct Flags {
    /// etcd v3 endpoints, comma separated. Without them and without --registry-dir, flanneld's
    /// default: http://127.0.0.1:2379.
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
          default_value = crate::registry::kube::DEFAULT_PREFIX,
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

    /// With `flanneld doctor`: print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// With `flanneld doctor`: write what is missing or wrong once (the daemon's pass, without
    /// the daemon), then look again.
    #[arg(long)]
    pub fix: bool,

    /// Log lines as plain text, or as one JSON object each for log collectors.
    #[arg(long, env = "FLANNELD_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Log verbosity: 0 info, 1 to 4 debug, 5 and above trace.
    #[arg(
        short = 'v',
        long = "v",
        env = "FLANNELD_V",
        default_value_t = 0,
        value_name = "LEVEL"
    )]
    pub verbosity: u8,
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
        assert_eq!(f.verbosity, 3);
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
}
