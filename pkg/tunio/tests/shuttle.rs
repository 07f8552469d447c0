//! The layer against the real kernel: a bare tunnel made of nothing else (IP packets in UDP,
//! as flannel's `udp` backend carries them) between two namespaces on a veth. TCP through it
//! arrives intact both ways over both underlay families, and the offloads were used: TUN gave
//! super-packets, the UDP socket received GRO messages, writes to TUN joined segments.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use testkit::{unique_name, TestNs};
use tunio::{Coalescer, Plan, RecvBatch, Run, SendScratch, Tun, TunOptions, UdpSock};

#[derive(Default)]
struct Counts {
    super_packets: AtomicU64,
    gro_messages: AtomicU64,
    packets_in: AtomicU64,
    writes_in: AtomicU64,
}

struct Side {
    tun: Arc<Tun>,
    sock: Arc<UdpSock>,
}

/// Moves packets between `side`'s TUN and its socket until `stop`; the peer is `peer`.
fn shuttle(
    side: &Side,
    peer: SocketAddr,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) -> Vec<thread::JoinHandle<()>> {
    let (tun, sock) = (side.tun.clone(), side.sock.clone());
    let (stop_out, counts_out) = (stop.clone(), counts.clone());
    let out = thread::spawn(move || {
        let mut buf = vec![0u8; tunio::tun::READ_MAX];
        let mut wire = vec![0u8; 70_000];
        let mut scratch = SendScratch::default();
        while !stop_out.load(Ordering::Relaxed) {
            let Some((hdr, range)) = tun.read(0, &mut buf).unwrap() else {
                let _ = tunio::tun::wait(tun.queue(0), libc::POLLIN, 100);
                continue;
            };
            let pkt = &buf[range];
            let Ok(plan) = Plan::new(&hdr, pkt) else {
                continue;
            };
            if plan.count() > 1 {
                counts_out.super_packets.fetch_add(1, Ordering::Relaxed);
            }
            let mut at = 0;
            for i in 0..plan.count() {
                at += plan.write(pkt, i, &mut wire[at..]);
            }
            let run = Run {
                dst: peer,
                data: &wire[..at],
                seg: plan.segment_len(0),
            };
            sock.send_runs(&mut scratch, &[run]);
        }
    });
    let (tun, sock) = (side.tun.clone(), side.sock.clone());
    let inbound = thread::spawn(move || {
        let mut batch = RecvBatch::for_socket(&sock);
        let mut gro = Coalescer::default();
        loop {
            let n = match batch.recv(&sock) {
                Ok(n) => n,
                Err(_) => return,
            };
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let mut packets: Vec<&[u8]> = Vec::new();
            for m in batch.messages(n) {
                if m.data.len() > m.seg {
                    counts.gro_messages.fetch_add(1, Ordering::Relaxed);
                }
                let seg = m.seg;
                let data: &[u8] = m.data;
                packets.extend(data.chunks(seg.max(1)));
            }
            if packets.is_empty() {
                continue;
            }
            let writes = tun.write_packets(0, &packets, &mut gro).unwrap();
            counts
                .packets_in
                .fetch_add(packets.len() as u64, Ordering::Relaxed);
            counts.writes_in.fetch_add(writes as u64, Ordering::Relaxed);
        }
    });
    vec![out, inbound]
}

#[test]
fn tcp_crosses_a_bare_udp_tunnel_intact_with_every_offload_used() {
    if !testkit::runs_here(
        std::process::Command::new("socat")
            .arg("-V")
            .output()
            .is_ok(),
        testkit::Need::Installed("socat"),
    ) {
        return;
    }
    for v6_underlay in [false, true] {
        let a = TestNs::new("tioa");
        let b = TestNs::new("tiob");
        let under = |n: u8| {
            if v6_underlay {
                format!("fd91::{n}")
            } else {
                format!("192.168.91.{n}")
            }
        };
        let plen = if v6_underlay { "64" } else { "24" };
        a.veth_to(
            &b,
            Some((
                &format!("{}/{plen}", under(1)),
                &format!("{}/{plen}", under(2)),
            )),
        );
        let name = unique_name("tio");
        let open = |ns: &TestNs, n: u8| -> Side {
            let addr: SocketAddr = if v6_underlay {
                format!("[{}]:8285", under(n)).parse().unwrap()
            } else {
                format!("{}:8285", under(n)).parse().unwrap()
            };
            let (tun, sock) = ns.run_inside(|| {
                (
                    Tun::open(&name, &TunOptions::default()).unwrap(),
                    UdpSock::bind(addr).unwrap(),
                )
            });
            assert!(tun.offloads() & tunio::tun::TUN_F_TSO4 != 0, "TSO granted");
            ns.ip(&["addr", "add", &format!("10.91.{n}.1/24"), "dev", &name]);
            ns.ip(&[
                "addr",
                "add",
                &format!("fd00:91:{n}::1/64"),
                "dev",
                &name,
                "nodad",
            ]);
            ns.ip(&["link", "set", &name, "mtu", "1400", "up"]);
            let m = 3 - n;
            ns.ip(&["route", "add", &format!("10.91.{m}.0/24"), "dev", &name]);
            ns.ip(&[
                "-6",
                "route",
                "add",
                &format!("fd00:91:{m}::/64"),
                "dev",
                &name,
            ]);
            Side {
                tun: Arc::new(tun),
                sock: Arc::new(sock),
            }
        };
        let (sa, sb) = (open(&a, 1), open(&b, 2));
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let peer = |s: &Side| s.sock.local_addr().unwrap();
        let mut threads = shuttle(&sa, peer(&sb), stop.clone(), counts.clone());
        threads.extend(shuttle(&sb, peer(&sa), stop.clone(), counts.clone()));
        a.run("ping", &["-c", "1", "-W", "5", "10.91.2.1"]);
        testkit::bulk::tcp_transfer(&a, &b, "10.91.2.1", 20 << 20);
        testkit::bulk::tcp_transfer(&b, &a, "fd00:91:1::1", 20 << 20);
        stop.store(true, Ordering::Relaxed);
        for s in [&sa, &sb] {
            s.sock.shutdown();
        }
        for t in threads {
            t.join().unwrap();
        }
        let case = if v6_underlay {
            "IPv6 underlay"
        } else {
            "IPv4 underlay"
        };
        let c = &counts;
        assert!(
            c.super_packets.load(Ordering::Relaxed) > 0,
            "{case}: no TSO read"
        );
        assert!(
            c.gro_messages.load(Ordering::Relaxed) > 0,
            "{case}: no GRO message"
        );
        let (p, w) = (
            c.packets_in.load(Ordering::Relaxed),
            c.writes_in.load(Ordering::Relaxed),
        );
        assert!(w * 4 < p, "{case}: {p} packets took {w} writes to TUN");
    }
}
