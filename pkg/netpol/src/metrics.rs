//! The enforcer's gauges and counters, served on `/metrics` in Prometheus' text format: the
//! policies and pods it enforces, the size of its rule set, its transactions and repairs, and
//! the time from an API event to the kernel holding its consequence.

use crate::enforcer::Sizes;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The upper bounds of the event-to-kernel histogram, in seconds.
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default)]
pub struct Metrics {
    pub policies: AtomicU64,
    pub local_pods: AtomicU64,
    pub isolated_ingress: AtomicU64,
    pub isolated_egress: AtomicU64,
    pub elements: AtomicU64,
    pub problems: AtomicU64,
    pub transactions: AtomicU64,
    pub passes: AtomicU64,
    pub repairs: AtomicU64,
    pub write_errors: AtomicU64,
    pub api_errors: AtomicU64,
    /// 1 while every watch runs, 0 while one fails.
    pub api_up: AtomicU64,
    /// The highest resourceVersion whose consequences the kernel holds.
    pub applied_version: AtomicU64,
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
}

pub static METRICS: Metrics = Metrics {
    policies: AtomicU64::new(0),
    local_pods: AtomicU64::new(0),
    isolated_ingress: AtomicU64::new(0),
    isolated_egress: AtomicU64::new(0),
    elements: AtomicU64::new(0),
    problems: AtomicU64::new(0),
    transactions: AtomicU64::new(0),
    passes: AtomicU64::new(0),
    repairs: AtomicU64::new(0),
    write_errors: AtomicU64::new(0),
    api_errors: AtomicU64::new(0),
    api_up: AtomicU64::new(0),
    applied_version: AtomicU64::new(0),
    latency_buckets: [const { AtomicU64::new(0) }; BUCKETS.len()],
    latency_count: AtomicU64::new(0),
    latency_micros: AtomicU64::new(0),
};

fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

impl Metrics {
    pub fn set_sizes(&self, s: &Sizes) {
        self.policies.store(s.policies as u64, Relaxed);
        self.local_pods.store(s.local_pods as u64, Relaxed);
        self.isolated_ingress
            .store(s.isolated_ingress as u64, Relaxed);
        self.isolated_egress
            .store(s.isolated_egress as u64, Relaxed);
        self.elements.store(s.elements as u64, Relaxed);
        self.problems.store(s.problems as u64, Relaxed);
    }

    /// An API event reached the kernel `took` after it came.
    pub fn event_applied(&self, took: Duration) {
        let secs = took.as_secs_f64();
        for (b, bound) in self.latency_buckets.iter().zip(BUCKETS) {
            if secs <= bound {
                b.fetch_add(1, Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_micros
            .fetch_add(took.as_micros().min(u128::from(u64::MAX)) as u64, Relaxed);
    }

    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let mut out = String::new();
        family(
            &mut out,
            "flannel_netpol_policies",
            "gauge",
            "NetworkPolicies known, in every namespace.",
            &[("", g(&self.policies))],
        );
        family(
            &mut out,
            "flannel_netpol_local_pods",
            "gauge",
            "Pods of this node that policies apply to (an address of their own, not finished).",
            &[("", g(&self.local_pods))],
        );
        family(
            &mut out,
            "flannel_netpol_isolated_pods",
            "gauge",
            "Pods of this node isolated by a policy, by direction.",
            &[
                ("{direction=\"ingress\"}", g(&self.isolated_ingress)),
                ("{direction=\"egress\"}", g(&self.isolated_egress)),
            ],
        );
        family(
            &mut out,
            "flannel_netpol_set_elements",
            "gauge",
            "Elements in the allow sets of the table (the rule set's size).",
            &[("", g(&self.elements))],
        );
        family(
            &mut out,
            "flannel_netpol_policy_problems",
            "gauge",
            "Parts of policies the API server would have refused, enforced as allowing nothing.",
            &[("", g(&self.problems))],
        );
        family(
            &mut out,
            "flannel_netpol_passes_total",
            "counter",
            "Passes: compile, compare with the table, write the difference.",
            &[("", g(&self.passes))],
        );
        family(
            &mut out,
            "flannel_netpol_transactions_total",
            "counter",
            "Transactions written to the table.",
            &[("", g(&self.transactions))],
        );
        family(
            &mut out,
            "flannel_netpol_repairs_total",
            "counter",
            "Changes to the table by someone else, undone.",
            &[("", g(&self.repairs))],
        );
        family(
            &mut out,
            "flannel_netpol_write_errors_total",
            "counter",
            "Transactions the kernel refused.",
            &[("", g(&self.write_errors))],
        );
        family(
            &mut out,
            "flannel_netpol_api_errors_total",
            "counter",
            "Failed requests to the API server.",
            &[("", g(&self.api_errors))],
        );
        family(
            &mut out,
            "flannel_netpol_api_up",
            "gauge",
            "1 while the watches of namespaces, pods and policies run.",
            &[("", g(&self.api_up))],
        );
        family(&mut out, "flannel_netpol_applied_resource_version", "gauge",
            "The highest resourceVersion of a namespace, pod or policy whose consequences the kernel holds.",
            &[("", g(&self.applied_version))]);
        let name = "flannel_netpol_event_to_kernel_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} From an API event's arrival to the kernel holding what it changes.\n# TYPE {name} histogram"
        );
        for (b, bound) in self.latency_buckets.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", g(b));
        }
        let count = g(&self.latency_count);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", g(&self.latency_micros) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_counts_each_event_in_every_bucket_above_it() {
        let m = Metrics::default();
        m.event_applied(Duration::from_millis(30));
        m.event_applied(Duration::from_millis(3));
        let text = m.render();
        for line in [
            "flannel_netpol_event_to_kernel_seconds_bucket{le=\"0.005\"} 1",
            "flannel_netpol_event_to_kernel_seconds_bucket{le=\"0.025\"} 1",
            "flannel_netpol_event_to_kernel_seconds_bucket{le=\"0.05\"} 2",
            "flannel_netpol_event_to_kernel_seconds_bucket{le=\"+Inf\"} 2",
            "flannel_netpol_event_to_kernel_seconds_sum 0.033",
            "flannel_netpol_event_to_kernel_seconds_count 2",
            "flannel_netpol_isolated_pods{direction=\"egress\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }
}
