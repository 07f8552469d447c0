//! The daemon's settings: the flags read once into what the daemon and `doctor` use, so that no
//! flag is interpreted in two places.

use crate::flags::Flags;
use crate::iface::Wanted;
pub use crate::masq::MasqOptions;
use crate::registry::etcd::EtcdOptions;
use crate::registry::kube::KubeOptions;
pub use crate::registry::RegistryChoice;
use std::path::PathBuf;
use std::time::Duration;

/// flanneld's etcd endpoints when neither etcd endpoints nor another registry are named.
pub const DEFAULT_ETCD_ENDPOINTS: [&str; 2] = ["http://127.0.0.1:4001", "http://127.0.0.1:2379"];

#[derive(Debug, Clone)]
pub struct Settings {
    pub registry: RegistryChoice,
    /// How to find the external interface (the families come from the network config).
    pub wanted: Wanted,
    pub subnet_file: PathBuf,
    pub masq: MasqOptions,
    /// `--iptables-resync`: how often the firewall is looked at.
    pub iptables_resync: Duration,
    /// `--iptables-mode`: legacy or nft; None: the one the host's rules are in.
    pub iptables_mode: Option<cni_kernel::firewall::IptablesMode>,
    /// The lease's lifetime, and how long before its expiry it is renewed.
    pub ttl: Duration,
    pub renew_margin: Duration,
    /// `--nexthops`: routes through nexthop objects where the kernel has them.
    pub nexthops: bool,
    /// `--ip-blackhole-route`: a blackhole route for the node's own subnet.
    pub blackhole_route: bool,
}

impl Settings {
    pub fn from_flags(flags: &Flags) -> Settings {
        let etcd = |endpoints: Vec<String>| EtcdOptions {
            endpoints,
            prefix: flags.etcd_prefix.trim_end_matches('/').to_string(),
            keyfile: flags.etcd_keyfile.clone(),
            certfile: flags.etcd_certfile.clone(),
            cafile: flags.etcd_cafile.clone(),
            username: flags.etcd_username.clone(),
            password: flags.etcd_password.clone(),
        };
        let registry = match (&flags.registry_dir, flags.etcd_endpoints.is_empty()) {
            // As in flanneld, the kube mode wins over any etcd setting.
            _ if flags.kube_subnet_mgr => RegistryChoice::Kube(KubeOptions {
                api_url: flags.kube_api_url.clone(),
                kubeconfig: flags.kubeconfig_file.clone(),
                annotation_prefix: flags.kube_annotation_prefix.clone(),
                set_node_network_unavailable: flags.set_node_network_unavailable,
                net_config: flags.net_config_path.clone(),
            }),
            (Some(root), true) => RegistryChoice::Dir {
                root: root.clone(),
                net_config: flags.net_config_path.clone(),
            },
            (None, true) => RegistryChoice::Etcd {
                options: etcd(DEFAULT_ETCD_ENDPOINTS.map(String::from).to_vec()),
                defaulted: true,
            },
            // The flags refuse both at once; etcd endpoints name a cluster, so they win.
            (_, false) => RegistryChoice::Etcd {
                options: etcd(flags.etcd_endpoints.clone()),
                defaulted: false,
            },
        };
        Settings {
            registry,
            wanted: Wanted {
                iface: flags.iface.clone(),
                iface_regex: flags.iface_regex.clone(),
                iface_can_reach: flags.iface_can_reach,
                public_ip: flags.public_ip,
                public_ipv6: flags.public_ipv6,
                public_ip_annotation: None,
                public_ipv6_annotation: None,
                ipv4: true,
                ipv6: false,
            },
            subnet_file: flags.subnet_file.clone(),
            masq: MasqOptions {
                masq: flags.ip_masq,
                random_fully: !flags.ip_masq_fully_random_disable,
                forward_rules: flags.iptables_forward_rules,
            },
            iptables_resync: Duration::from_secs(flags.iptables_resync),
            iptables_mode: flags.iptables_mode.0,
            ttl: Duration::from_secs(flags.subnet_lease_ttl),
            renew_margin: Duration::from_secs(u64::from(flags.subnet_lease_renew_margin) * 60),
            nexthops: flags.nexthops,
            blackhole_route: flags.ip_blackhole_route,
        }
    }
}

/// A variable of Go's flanneld's environment with a value Go's flanneld ends its start for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not a number")]
pub struct NotANumber {
    pub name: &'static str,
    pub value: String,
}

/// What Go's flanneld reads from its environment besides the flags, as this one takes it
/// (`lookup` is the environment): a note for each variable that is set, a warning (true) when
/// its value is not the one kube-flannel.yml sets; Err for a value Go's flanneld ends its start
/// for.
pub fn go_environment(
    kube: bool,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(bool, String)>, NotANumber> {
    let mut notes = Vec::new();
    if let Some(depth) = lookup("EVENT_QUEUE_DEPTH") {
        // Go's kube mode refuses a value that is not a number; it reads it nowhere else.
        if kube && depth.trim().parse::<i64>().is_err() {
            return Err(NotANumber {
                name: "EVENT_QUEUE_DEPTH",
                value: depth,
            });
        }
        notes.push((
            depth.trim() != "5000",
            format!(
                "EVENT_QUEUE_DEPTH={depth} changes nothing here: it sizes Go's flanneld's queue \
                 of node events; this one's is fixed, and its Node watch waits while it is full"
            ),
        ));
    }
    if let Some(cont) = lookup("CONT_WHEN_CACHE_NOT_READY") {
        notes.push((
            cont.trim() != "false",
            format!(
                "CONT_WHEN_CACHE_NOT_READY={cont} changes nothing here: Go's flanneld exits when \
                 its node list is not read within 10 minutes unless it is true; this one never \
                 exits for that, it keeps retrying and goes on once the list is read"
            ),
        ));
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn settings(args: &[&str]) -> Settings {
        let argv = std::iter::once("flanneld").chain(args.iter().copied());
        Settings::from_flags(&Flags::try_parse_from(argv).unwrap())
    }

    #[test]
    fn the_registry_is_chosen_explicitly_or_is_flanneld_s_default_endpoint() {
        let s = settings(&["--registry-dir", "/tmp/reg"]);
        let RegistryChoice::Dir { root, net_config } = &s.registry else {
            panic!("{:?}", s.registry)
        };
        assert_eq!(root.to_str(), Some("/tmp/reg"));
        assert_eq!(net_config.to_str(), Some("/etc/kube-flannel/net-conf.json"));
        let s = settings(&[
            "--etcd-endpoints",
            "http://10.0.0.1:2379",
            "--etcd-prefix",
            "/x/",
        ]);
        let RegistryChoice::Etcd { options, defaulted } = &s.registry else {
            panic!("{:?}", s.registry)
        };
        assert_eq!(
            (
                options.endpoints.as_slice(),
                options.prefix.as_str(),
                *defaulted
            ),
            (&["http://10.0.0.1:2379".to_string()][..], "/x", false)
        );
        let s = settings(&[]);
        let RegistryChoice::Etcd { options, defaulted } = &s.registry else {
            panic!("{:?}", s.registry)
        };
        assert_eq!(
            options.endpoints,
            ["http://127.0.0.1:4001", "http://127.0.0.1:2379"]
        );
        assert!(*defaulted);
        assert!(s
            .registry
            .describe()
            .contains("default endpoints http://127.0.0.1:4001,http://127.0.0.1:2379"));
    }

    #[test]
    fn the_masquerade_flags_become_one_set_of_options() {
        let s = settings(&[
            "--ip-masq",
            "--ip-masq-fully-random-disable",
            "--iptables-forward-rules=false",
        ]);
        assert_eq!(
            s.masq,
            MasqOptions {
                masq: true,
                random_fully: false,
                forward_rules: false
            }
        );
        let s = settings(&[]);
        assert_eq!(
            s.masq,
            MasqOptions {
                masq: false,
                random_fully: true,
                forward_rules: true
            }
        );
        assert_eq!(s.iptables_resync, Duration::from_secs(5));
        assert_eq!(s.renew_margin, Duration::from_secs(3600));
    }

    #[test]
    fn go_s_environment_variables_are_warned_about_or_refused_as_go_refuses_them() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(go_environment(true, env(&[])).unwrap().is_empty());
        let notes = go_environment(
            true,
            env(&[
                ("EVENT_QUEUE_DEPTH", "20000"),
                ("CONT_WHEN_CACHE_NOT_READY", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(notes.len(), 2);
        assert!(
            notes[0].0
                && notes[0]
                    .1
                    .starts_with("EVENT_QUEUE_DEPTH=20000 changes nothing")
        );
        assert!(
            notes[1].0
                && notes[1]
                    .1
                    .starts_with("CONT_WHEN_CACHE_NOT_READY=true changes nothing")
        );
        // kube-flannel.yml's own values are noted, not warned about.
        let notes = go_environment(
            true,
            env(&[
                ("EVENT_QUEUE_DEPTH", "5000"),
                ("CONT_WHEN_CACHE_NOT_READY", "false"),
            ]),
        )
        .unwrap();
        assert_eq!(
            notes.iter().map(|n| n.0).collect::<Vec<_>>(),
            [false, false]
        );
        // Go's kube mode ends its start for a depth that is not a number; etcd mode never reads it.
        let e = go_environment(true, env(&[("EVENT_QUEUE_DEPTH", "lots")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("EVENT_QUEUE_DEPTH") && e.contains("lots"), "{e}");
        assert_eq!(
            go_environment(false, env(&[("EVENT_QUEUE_DEPTH", "lots")]))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn ip_blackhole_route_is_a_setting() {
        assert!(!settings(&[]).blackhole_route);
        assert!(settings(&["--ip-blackhole-route"]).blackhole_route);
    }
}
