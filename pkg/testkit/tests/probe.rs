//! The probe matrix's parts: servers answer TCP and UDP on both families, probes get the
//! answer, and a probe whose packets are dropped says so within its timeout.

use std::time::{Duration, Instant};
use testkit::probe::{probe_all, Probe, Proto, Servers};
use testkit::TestNs;

#[test]
fn probes_get_answers_and_dropped_ones_time_out() {
    let server = TestNs::new("prbs");
    let client = TestNs::new("prbc");
    let peer = testkit::unique_name("prb");
    server.ip(&["link", "add", "s0", "type", "veth", "peer", "name", &peer]);
    server.ip(&["link", "set", &peer, "netns", client.name()]);
    client.ip(&["link", "set", &peer, "name", "c0"]);
    for (ns, dev, v4, v6) in [
        (&server, "s0", "10.9.0.1/24", "fd09::1/64"),
        (&client, "c0", "10.9.0.2/24", "fd09::2/64"),
    ] {
        ns.ip(&["addr", "add", v4, "dev", dev]);
        ns.ip(&["addr", "add", v6, "dev", dev, "nodad"]);
        ns.ip(&["link", "set", dev, "up"]);
    }
    let _servers = Servers::start(
        server.path(),
        &[(Proto::Tcp, 80), (Proto::Udp, 80), (Proto::Tcp, 81)],
    );
    server.run("nft", &["add table inet t; add chain inet t in { type filter hook input priority 0; }; add rule inet t in tcp dport 81 drop"]);
    let probe = |proto, to: &str| Probe {
        from: client.path().to_path_buf(),
        proto,
        to: to.parse().unwrap(),
    };
    let probes = [
        probe(Proto::Tcp, "10.9.0.1:80"),
        probe(Proto::Udp, "10.9.0.1:80"),
        probe(Proto::Tcp, "[fd09::1]:80"),
        probe(Proto::Udp, "[fd09::1]:80"),
        probe(Proto::Tcp, "10.9.0.1:81"),
        probe(Proto::Udp, "[fd09::1]:81"),
    ];
    let started = Instant::now();
    let got = probe_all(&probes, Duration::from_secs(2));
    assert_eq!(got, [true, true, true, true, false, false]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "side by side: {took:?}");
}
