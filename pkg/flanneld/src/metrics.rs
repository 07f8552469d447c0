//! The daemon's counters and gauges, served on `/metrics` in Prometheus' text format. One
//! process is one node, so they live in one static that every part updates.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct Metrics {
    pub leases_known: AtomicU64,
    /// Unix seconds; 0 before a lease is held.
    pub lease_expiry: AtomicU64,
    pub routes: AtomicU64,
    pub neighbours: AtomicU64,
    pub fdb: AtomicU64,
    pub nexthops: AtomicU64,
    /// The route style: 0 none (nothing programmed), 1 plain, 2 through nexthop objects.
    pub route_style: AtomicU64,
    /// The wireguard backend's tunnel: 0 none, 1 the kernel's, 2 the userspace one.
    pub wireguard_tunnel: AtomicU64,
    /// What writes the firewall rules: 0 nothing, 1 iptables-legacy, 2 iptables-nft, 3 nft.
    pub firewall_mode: AtomicU64,
    /// Other nodes held in the backend's own state: the udp tunnel's routes, WireGuard's
    /// peers, the leases the extension's add command ran for.
    pub backend_peers: AtomicU64,
    pub reconcile_runs: AtomicU64,
    pub reconcile_micros: AtomicU64,
    pub repaired_routes: AtomicU64,
    pub repaired_neighbours: AtomicU64,
    pub repaired_fdb: AtomicU64,
    pub repaired_nexthops: AtomicU64,
    pub registry_errors: AtomicU64,
    pub resyncs: AtomicU64,
    pub masq_restores: AtomicU64,
}

pub static METRICS: Metrics = Metrics {
    leases_known: AtomicU64::new(0),
    lease_expiry: AtomicU64::new(0),
    routes: AtomicU64::new(0),
    neighbours: AtomicU64::new(0),
    fdb: AtomicU64::new(0),
    nexthops: AtomicU64::new(0),
    route_style: AtomicU64::new(0),
    wireguard_tunnel: AtomicU64::new(0),
    firewall_mode: AtomicU64::new(0),
    backend_peers: AtomicU64::new(0),
    reconcile_runs: AtomicU64::new(0),
    reconcile_micros: AtomicU64::new(0),
    repaired_routes: AtomicU64::new(0),
    repaired_neighbours: AtomicU64::new(0),
    repaired_fdb: AtomicU64::new(0),
    repaired_nexthops: AtomicU64::new(0),
    registry_errors: AtomicU64::new(0),
    resyncs: AtomicU64::new(0),
    masq_restores: AtomicU64::new(0),
};

fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

impl Metrics {
    /// The text a scrape gets.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let mut out = String::new();
        family(
            &mut out,
            "flanneld_leases_known",
            "gauge",
            "Other nodes' leases known.",
            &[("", g(&self.leases_known))],
        );
        family(
            &mut out,
            "flanneld_lease_expiry_timestamp_seconds",
            "gauge",
            "When this node's lease expires unless renewed.",
            &[("", g(&self.lease_expiry))],
        );
        family(
            &mut out,
            "flanneld_kernel_entries",
            "gauge",
            "Entries the datapath holds for other nodes, by kind.",
            &[
                ("{kind=\"route\"}", g(&self.routes)),
                ("{kind=\"neighbour\"}", g(&self.neighbours)),
                ("{kind=\"fdb\"}", g(&self.fdb)),
                ("{kind=\"nexthop\"}", g(&self.nexthops)),
            ],
        );
        let style = g(&self.route_style);
        family(
            &mut out,
            "flanneld_route_style",
            "gauge",
            "How routes to the other nodes are programmed: 1 for the style in use (plain routes, or routes through nexthop objects).",
            &[
                ("{style=\"plain\"}", u64::from(style == 1)),
                ("{style=\"nexthop\"}", u64::from(style == 2)),
            ],
        );
        let tunnel = g(&self.wireguard_tunnel);
        family(
            &mut out,
            "flanneld_wireguard_tunnel",
            "gauge",
            "Which WireGuard carries the wireguard backend's tunnel: 1 for the one in use (none with another backend).",
            &[
                ("{tunnel=\"kernel\"}", u64::from(tunnel == 1)),
                ("{tunnel=\"userspace\"}", u64::from(tunnel == 2)),
            ],
        );
        family(
            &mut out,
            "flanneld_backend_peers",
            "gauge",
            "Other nodes held in the backend's own state: the udp tunnel's routes, WireGuard's peers, the leases the extension's SubnetAddCommand ran for.",
            &[("", g(&self.backend_peers))],
        );
        let fw = g(&self.firewall_mode);
        family(
            &mut out,
            "flanneld_firewall_mode",
            "gauge",
            "What writes the masquerade and forward rules: 1 for the one in use (none without rules).",
            &[
                ("{mode=\"iptables-legacy\"}", u64::from(fw == 1)),
                ("{mode=\"iptables-nft\"}", u64::from(fw == 2)),
                ("{mode=\"nftables\"}", u64::from(fw == 3)),
            ],
        );
        family(
            &mut out,
            "flanneld_reconcile_runs_total",
            "counter",
            "Reconciler passes.",
            &[("", g(&self.reconcile_runs))],
        );
        let _ = writeln!(
            out,
            "# HELP flanneld_reconcile_duration_seconds_sum Time spent in reconciler passes.\n# TYPE flanneld_reconcile_duration_seconds_sum counter\nflanneld_reconcile_duration_seconds_sum {:.6}",
            g(&self.reconcile_micros) as f64 / 1e6
        );
        family(
            &mut out,
            "flanneld_entries_repaired_total",
            "counter",
            "Entries written back without a lease change (deleted or changed behind the daemon's back), by kind.",
            &[
                ("{kind=\"route\"}", g(&self.repaired_routes)),
                ("{kind=\"neighbour\"}", g(&self.repaired_neighbours)),
                ("{kind=\"fdb\"}", g(&self.repaired_fdb)),
                ("{kind=\"nexthop\"}", g(&self.repaired_nexthops)),
            ],
        );
        family(
            &mut out,
            "flanneld_registry_errors_total",
            "counter",
            "Failed registry requests and broken watches.",
            &[("", g(&self.registry_errors))],
        );
        family(
            &mut out,
            "flanneld_watch_resyncs_total",
            "counter",
            "Full listings after a broken or compacted watch.",
            &[("", g(&self.resyncs))],
        );
        family(
            &mut out,
            "flanneld_masquerade_restores_total",
            "counter",
            "Times missing firewall rules were written back.",
            &[("", g(&self.masq_restores))],
        );
        out
    }
}

pub fn inc(a: &AtomicU64) {
    a.fetch_add(1, Relaxed);
}

pub fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Relaxed);
}

pub fn set(a: &AtomicU64, n: u64) {
    a.store(n, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_has_help_type_and_samples() {
        let m = Metrics::default();
        set(&m.leases_known, 3);
        add(&m.repaired_routes, 2);
        add(&m.reconcile_micros, 1_500_000);
        set(&m.route_style, 2);
        set(&m.wireguard_tunnel, 2);
        set(&m.firewall_mode, 1);
        let text = m.render();
        assert!(
            text.contains("flanneld_firewall_mode{mode=\"iptables-legacy\"} 1\nflanneld_firewall_mode{mode=\"iptables-nft\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("flanneld_wireguard_tunnel{tunnel=\"kernel\"} 0\nflanneld_wireguard_tunnel{tunnel=\"userspace\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "flanneld_route_style{style=\"plain\"} 0\nflanneld_route_style{style=\"nexthop\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE flanneld_leases_known gauge\nflanneld_leases_known 3\n"),
            "{text}"
        );
        assert!(
            text.contains("flanneld_entries_repaired_total{kind=\"route\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("flanneld_reconcile_duration_seconds_sum 1.500000\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(name.starts_with("flanneld_"), "{line}");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
