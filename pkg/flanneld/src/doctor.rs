//! `flanneld doctor`: reads the registry and the kernel (no daemon needed) and says, entry by
//! entry, what the datapath should hold for the other nodes and what it holds; then the
//! masquerade rules, subnet.env against the lease, and the MTU chain.

use crate::alloc::Node;
use crate::backend::datapath::{device_name, read_actual};
use crate::backend::desired::{desired, diff, Entries, Local};
use crate::backend::mode::{self, Mode};
use crate::config::{self, NetConfig};
use crate::iface::{self, LinkFacts, Route, Wanted};
use crate::lease::{Lease, SubnetKey};
use crate::masq::{self, MasqSpec};
use crate::registry::Registry;
use cni_kernel::netlink::{format_mac, Conn, Route as KRoute};
use serde::Serialize;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::hash::Hash;
use std::path::Path;

/// One thing looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// `route`, `neighbour`, `fdb`, `device`, `lease`, `subnet.env`, `mtu`, `masquerade`, ...
    pub kind: String,
    /// `missing`, `extra`, `wrong` or `ok`.
    pub state: String,
    pub detail: String,
}

fn finding(kind: &str, state: &str, detail: impl Into<String>) -> Finding {
    Finding {
        kind: kind.into(),
        state: state.into(),
        detail: detail.into(),
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn problems(&self) -> usize {
        self.findings.iter().filter(|f| f.state != "ok").count()
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let mark = if f.state == "ok" { "ok  " } else { "FAIL" };
            let _ = writeln!(out, "{mark} {:<10} {:<8} {}", f.kind, f.state, f.detail);
        }
        let _ = match self.problems() {
            0 => writeln!(out, "all right"),
            n => writeln!(out, "{n} problem(s)"),
        };
        out
    }
}

fn show_route(r: &KRoute) -> String {
    let mut s = r.dst.to_string();
    if let Some(gw) = r.gw {
        let _ = write!(s, " via {gw}");
    }
    if let Some(o) = r.oif {
        let _ = write!(s, " dev #{o}");
    }
    if r.onlink {
        s.push_str(" onlink");
    }
    s
}

/// One kind of entry: each wanted one is ok, missing or wrong (`put` holds what the diff would
/// write), each held one whose key nobody wants is extra.
fn classify<T, K: Eq + Hash>(
    kind: &str,
    want: &[T],
    have: &[T],
    (put, removed): (&[&T], &[&T]),
    key: impl Fn(&T) -> K,
    show: impl Fn(&T) -> String,
) -> Vec<Finding> {
    let bad: HashSet<K> = put.iter().map(|t| key(t)).collect();
    let wanted: HashSet<K> = want.iter().map(&key).collect();
    let held: HashSet<K> = have.iter().map(&key).collect();
    let mut out: Vec<Finding> = want
        .iter()
        .map(|w| {
            let k = key(w);
            let state = if !bad.contains(&k) {
                "ok"
            } else if held.contains(&k) {
                "wrong"
            } else {
                "missing"
            };
            finding(kind, state, show(w))
        })
        .collect();
    out.extend(
        removed
            .iter()
            .filter(|r| !wanted.contains(&key(r)))
            .map(|r| finding(kind, "extra", show(r))),
    );
    out
}

/// Each wanted entry is ok, missing or wrong; each held one nobody wants is extra.
pub fn compare(want: &Entries, have: &Entries) -> Vec<Finding> {
    let plan = diff(want, have);
    let mut out = classify(
        "route",
        &want.routes,
        &have.routes,
        (&plan.put.routes, &plan.remove.routes),
        |r| r.dst,
        show_route,
    );
    out.extend(classify(
        "neighbour",
        &want.neighbours,
        &have.neighbours,
        (&plan.put.neighbours, &plan.remove.neighbours),
        |n| n.ip,
        |n| format!("{} lladdr {}", n.ip, format_mac(&n.mac)),
    ));
    out.extend(classify(
        "fdb",
        &want.fdb,
        &have.fdb,
        (&plan.put.fdb, &plan.remove.fdb),
        |f| f.mac,
        |f| {
            let dst = f.dst.map(|d| d.to_string()).unwrap_or_default();
            format!("{} dst {dst}", format_mac(&f.mac))
        },
    ));
    out
}

/// The whole check; `flags` as the daemon would run with them.
pub async fn examine<R: Registry>(
    reg: &R,
    wanted: &Wanted,
    kernel: (&[LinkFacts], &[Route]),
    subnet_file: &Path,
    masq_flags: (bool, bool, bool),
) -> Report {
    let mut report = Report::default();
    let f = &mut report.findings;
    let cfg: NetConfig = match reg.config().await {
        Ok(Some(b)) => match config::parse(&String::from_utf8_lossy(&b)) {
            Ok(c) => c,
            Err(e) => {
                f.push(finding("config", "wrong", e.to_string()));
                return report;
            }
        },
        Ok(None) => {
            f.push(finding(
                "config",
                "missing",
                format!("no network config at {}", reg.config_location()),
            ));
            return report;
        }
        Err(e) => {
            f.push(finding(
                "registry",
                "wrong",
                format!("{}: {e}", reg.describe()),
            ));
            return report;
        }
    };
    let mode = match mode::mode(&cfg) {
        Ok(m) => m,
        Err(e) => {
            f.push(finding("config", "wrong", e.to_string()));
            return report;
        }
    };
    let wanted = Wanted {
        ipv4: cfg.ipv4.is_some(),
        ipv6: cfg.ipv6.is_some(),
        ..wanted.clone()
    };
    let ext = match iface::choose(kernel.0, kernel.1, &wanted) {
        Ok(e) => e,
        Err(e) => {
            f.push(finding("interface", "wrong", e));
            return report;
        }
    };
    f.push(finding(
        "interface",
        "ok",
        format!("{} (mtu {})", ext.name, ext.mtu),
    ));
    let ext = &ext;
    let listing = match reg.list().await {
        Ok(l) => l,
        Err(e) => {
            f.push(finding(
                "registry",
                "wrong",
                format!("{}: {e}", reg.describe()),
            ));
            return report;
        }
    };
    let leases: Vec<Lease> = listing
        .entries
        .iter()
        .filter_map(|e| match Lease::decode(&e.key, &e.value) {
            Ok(l) => Some(l),
            Err(why) => {
                f.push(finding("lease", "wrong", format!("{}: {why}", e.key)));
                None
            }
        })
        .collect();
    let node = Node {
        public_ip: ext.public_ip,
        public_ipv6: ext.public_ipv6,
    };
    let own = leases
        .iter()
        .find(|l| crate::alloc::is_mine(&cfg, &node, l));
    let Some(own) = own else {
        f.push(finding(
            "lease",
            "missing",
            format!("no lease carries this node's address in {}", reg.describe()),
        ));
        return report;
    };
    f.push(finding("lease", "ok", format!("{own}")));
    let own_key: SubnetKey = own.key;
    let conn = match Conn::open() {
        Ok(c) => c,
        Err(e) => {
            f.push(finding("kernel", "wrong", e.to_string()));
            return report;
        }
    };
    let mut local = Local {
        mode: mode.clone(),
        backend_type: cfg.backend_type.clone(),
        own: own_key,
        network4: cfg.ipv4.map(|x| x.network),
        network6: cfg.ipv6.map(|x| x.network),
        ext_index: ext.index,
        ext_nets: ext.addrs.clone(),
        dev4: None,
        dev6: None,
    };
    let mut device_mtu = None;
    if let Mode::Vxlan(p) = &mode {
        for v6 in [false, true] {
            let wanted = if v6 {
                cfg.ipv6.is_some()
            } else {
                cfg.ipv4.is_some()
            };
            if !wanted {
                continue;
            }
            let name = device_name(v6, p.vni);
            match conn.link_by_name(&name).await {
                Ok(Some(l)) => {
                    let announced = crate::backend::desired::vtep_mac(if v6 {
                        own.attrs.backend_v6_data.as_deref()
                    } else {
                        own.attrs.backend_data.as_deref()
                    });
                    let mac_ok = announced.is_some_and(|m| l.mac == m);
                    f.push(finding(
                        "device",
                        if mac_ok { "ok" } else { "wrong" },
                        format!(
                            "{name} mac {} (the lease says {})",
                            l.mac_string(),
                            announced
                                .map(|m| format_mac(&m))
                                .unwrap_or_else(|| "nothing".into())
                        ),
                    ));
                    if !v6 {
                        device_mtu = l.mtu;
                    }
                    if v6 {
                        local.dev6 = Some(l.index);
                    } else {
                        local.dev4 = Some(l.index);
                    }
                }
                Ok(None) => f.push(finding("device", "missing", name)),
                Err(e) => f.push(finding("device", "wrong", format!("{name}: {e}"))),
            }
        }
    }
    let others: Vec<Lease> = leases
        .iter()
        .filter(|l| l.key != own_key)
        .cloned()
        .collect();
    let want = desired(&local, &others);
    for (key, why) in &want.skipped {
        f.push(finding(
            "lease",
            "ok",
            format!("{key} gives no entry: {why}"),
        ));
    }
    match read_actual(&conn, &local).await {
        Ok(have) => f.extend(compare(&want.entries, &have)),
        Err(e) => f.push(finding("kernel", "wrong", e)),
    }

    // subnet.env against the lease, and the MTU chain.
    let env = std::fs::read_to_string(subnet_file)
        .ok()
        .and_then(|t| subnetenv::parse_entries(&t).ok());
    match env {
        None => f.push(finding(
            "subnet.env",
            "missing",
            subnet_file.display().to_string(),
        )),
        Some(e) => {
            let sub = e.subnet.map(|s| s.network().to_string());
            let leased = own_key.ipv4.map(|s| s.network().to_string());
            let state = if sub == leased { "ok" } else { "wrong" };
            f.push(finding(
                "subnet.env",
                state,
                format!(
                    "FLANNEL_SUBNET {} for lease {own_key}",
                    e.subnet
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "(none)".into())
                ),
            ));
            let env_mtu = e.mtu.unwrap_or(0);
            let expect = match &mode {
                Mode::Vxlan(_) => device_mtu.unwrap_or(0),
                _ => ext.mtu,
            };
            f.push(finding(
                "mtu",
                if env_mtu == expect && env_mtu != 0 {
                    "ok"
                } else {
                    "wrong"
                },
                format!(
                    "{} {} -> device {} -> FLANNEL_MTU {env_mtu}",
                    ext.name,
                    ext.mtu,
                    device_mtu
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "-".into())
                ),
            ));
        }
    }

    let (ip_masq, random_fully, forward_rules) = masq_flags;
    if ip_masq || forward_rules {
        let spec = MasqSpec {
            ipv4: cfg.ipv4.zip(own_key.ipv4).map(|(x, s)| (x.network, s)),
            ipv6: cfg.ipv6.zip(own_key.ipv6).map(|(x, s)| (x.network, s)),
            nftables: cfg.enable_nftables,
            masq: ip_masq,
            random_fully,
            forward_rules,
        };
        match tokio::task::spawn_blocking(move || masq::check(&spec)).await {
            Ok(Ok(reasons)) if reasons.is_empty() => {
                f.push(finding("masquerade", "ok", "the rules are flannel's"))
            }
            Ok(Ok(reasons)) => {
                for r in reasons {
                    f.push(finding("masquerade", "wrong", r));
                }
            }
            Ok(Err(e)) => f.push(finding("masquerade", "wrong", e.to_string())),
            Err(e) => f.push(finding("masquerade", "wrong", e.to_string())),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_kernel::netlink::{FdbEntry, Neighbour, Route};

    #[test]
    fn each_entry_is_ok_missing_wrong_or_extra() {
        let gw: std::net::IpAddr = "10.5.2.0".parse().unwrap();
        let want = Entries {
            routes: vec![Route::new("10.5.2.0/24".parse().unwrap(), Some(gw), Some(10)).onlink()],
            neighbours: vec![Neighbour::permanent(10, gw, [2, 0, 0, 0, 0, 1])],
            fdb: vec![FdbEntry::permanent(
                10,
                [2, 0, 0, 0, 0, 1],
                "192.168.0.2".parse().unwrap(),
            )],
        };
        let states = |have: &Entries| -> Vec<(String, String)> {
            compare(&want, have)
                .into_iter()
                .map(|f| (f.kind, f.state))
                .collect()
        };
        let s = |k: &str, st: &str| (k.to_string(), st.to_string());
        assert_eq!(
            states(&want),
            vec![s("route", "ok"), s("neighbour", "ok"), s("fdb", "ok")]
        );
        let mut have = want.clone();
        have.routes.clear();
        have.neighbours[0].mac = vec![9; 6];
        have.fdb.push(FdbEntry::permanent(
            10,
            [7; 6],
            "192.168.0.7".parse().unwrap(),
        ));
        assert_eq!(
            states(&have),
            vec![
                s("route", "missing"),
                s("neighbour", "wrong"),
                s("fdb", "ok"),
                s("fdb", "extra")
            ]
        );
        let report = Report {
            findings: compare(&want, &have),
        };
        assert_eq!(report.problems(), 3);
        assert!(report.text().ends_with("3 problem(s)\n"));
    }
}
