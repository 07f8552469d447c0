//! The tunnel's threads: outbound, TUN → UDP (a super-packet read, cut into the wire's IPv4
//! packets, each run of them sent as one GSO message to the node the destination's subnet is
//! routed to); inbound, UDP → TUN (a batch of datagrams, GRO-joined, each one IP packet,
//! written with a flow's TCP segments joined). Routes and the socket change under them
//! through [`Tunnel::apply`].

use crate::control::{Change, State};
use crate::routes::Routes;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use tunio::{Coalescer, Plan, RecvBatch, Run, SendScratch, Tun, TunOptions, UdpSock};

/// Super-packets gathered from TUN before one send.
const BATCH: usize = 8;
/// Room for one super-packet cut into the wire's packets (64 KiB and a header per segment).
const WIRE_ROOM: usize = 128 * 1024;

#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    received: AtomicU64,
    unrouted: AtomicU64,
    malformed: AtomicU64,
}

/// One `udp` backend device: its TUN, its routes, its socket.
pub struct Tunnel {
    tun: Tun,
    routes: RwLock<Routes>,
    sock: RwLock<Option<(SocketAddrV4, Arc<UdpSock>)>>,
    /// Serialises changes of the socket.
    binding: Mutex<()>,
    counts: Counts,
}

/// An IPv4 packet's destination, if it is a whole IPv4 header at least.
fn ipv4_dst(pkt: &[u8]) -> Option<Ipv4Addr> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return None;
    }
    Some(Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]))
}

/// Whether a datagram is an IPv4 packet TUN can take: version 4, its length within.
fn is_ipv4_packet(pkt: &[u8]) -> bool {
    if ipv4_dst(pkt).is_none() {
        return false;
    }
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    (20..=pkt.len()).contains(&total)
}

impl Tunnel {
    /// Opens (makes) the TUN device `name` with its offloads.
    pub fn open(name: &str) -> io::Result<Arc<Tunnel>> {
        let tun = Tun::open(
            name,
            &TunOptions {
                queues: 1,
                offloads: true,
            },
        )?;
        Ok(Arc::new(Tunnel {
            tun,
            routes: RwLock::new(Routes::default()),
            sock: RwLock::new(None),
            binding: Mutex::new(()),
            counts: Counts::default(),
        }))
    }

    pub fn name(&self) -> &str {
        self.tun.name()
    }

    /// What `get` answers.
    pub fn state(&self) -> State {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<_> = routes.iter().collect();
        list.sort();
        let c = &self.counts;
        State {
            listen: self
                .sock
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|(a, _)| *a),
            routes: list,
            counts: vec![
                ("sent".into(), c.sent.load(Relaxed)),
                ("received".into(), c.received.load(Relaxed)),
                ("unrouted".into(), c.unrouted.load(Relaxed)),
                ("malformed".into(), c.malformed.load(Relaxed)),
            ],
        }
    }

    /// Applies a `set`: a new socket bound first (nothing changes when it cannot be), then
    /// the routes.
    pub fn apply(self: &Arc<Self>, change: &Change) -> Result<(), String> {
        if let Some(addr) = change.listen {
            self.listen(addr)
                .map_err(|e| format!("binding UDP {addr}: {e}"))?;
        }
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        for net in &change.remove {
            routes.remove(*net);
        }
        for (net, to) in &change.put {
            routes.put(*net, *to);
        }
        Ok(())
    }

    /// Receives on `addr` from now on (the old socket closed, its thread ending with it).
    fn listen(self: &Arc<Self>, addr: SocketAddrV4) -> io::Result<()> {
        let _one_at_a_time = self.binding.lock().unwrap_or_else(|e| e.into_inner());
        let held = self.sock.read().unwrap_or_else(|e| e.into_inner()).clone();
        if held.as_ref().is_some_and(|(a, _)| *a == addr) {
            return Ok(());
        }
        // The old socket goes first: the new one may take the same port on another address.
        if let Some((_, old)) = self.sock.write().unwrap_or_else(|e| e.into_inner()).take() {
            old.shutdown();
        }
        let sock = Arc::new(UdpSock::bind(SocketAddr::V4(addr))?);
        *self.sock.write().unwrap_or_else(|e| e.into_inner()) = Some((addr, sock.clone()));
        let me = self.clone();
        thread::Builder::new()
            .name("udp-inbound".into())
            .spawn(move || me.inbound(&sock))?;
        Ok(())
    }

    /// UDP → TUN until the socket is shut down.
    fn inbound(&self, sock: &UdpSock) {
        let mut batch = RecvBatch::for_socket(sock);
        let mut gro = Coalescer::default();
        loop {
            let n = match batch.recv(sock) {
                Ok(n) => n,
                Err(_) => return,
            };
            let mut packets: Vec<&[u8]> = Vec::new();
            let mut malformed = 0;
            for m in batch.messages(n) {
                let seg = m.seg.max(1);
                let data: &[u8] = m.data;
                for d in data.chunks(seg) {
                    if is_ipv4_packet(d) {
                        packets.push(d);
                    } else {
                        malformed += 1;
                    }
                }
            }
            self.counts.malformed.fetch_add(malformed, Relaxed);
            if packets.is_empty() {
                continue;
            }
            match self.tun.write_packets(0, &packets, &mut gro) {
                Ok(_) => {
                    self.counts
                        .received
                        .fetch_add(packets.len() as u64, Relaxed);
                }
                Err(e) => eprintln!("{}: writing to TUN: {e}", self.name()),
            }
        }
    }

    /// TUN → UDP until the device is gone; why it ended.
    pub fn outbound(&self) -> io::Error {
        let mut buf = vec![0u8; tunio::tun::READ_MAX];
        let mut wire: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; WIRE_ROOM]).collect();
        let mut scratch = SendScratch::default();
        loop {
            // Cut up to BATCH super-packets into the wire's packets, then send them at once.
            let mut batch: Vec<(SocketAddrV4, usize, usize)> = Vec::with_capacity(BATCH);
            while batch.len() < BATCH {
                let (hdr, range) = match self.tun.read(0, &mut buf) {
                    Ok(Some(read)) => read,
                    Ok(None) if batch.is_empty() => {
                        if let Err(e) = tunio::tun::wait(self.tun.queue(0), libc::POLLIN, 1000) {
                            return e;
                        }
                        continue;
                    }
                    Ok(None) => break,
                    Err(e) => return e,
                };
                let pkt = &buf[range];
                let Some(dst) = ipv4_dst(pkt) else {
                    self.counts.unrouted.fetch_add(1, Relaxed);
                    continue;
                };
                let to = self
                    .routes
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .lookup(dst);
                let (Some(to), Ok(plan)) = (to, Plan::new(&hdr, pkt)) else {
                    self.counts.unrouted.fetch_add(1, Relaxed);
                    continue;
                };
                let out = &mut wire[batch.len()];
                let mut at = 0;
                for i in 0..plan.count() {
                    at += plan.write(pkt, i, &mut out[at..]);
                }
                self.counts.sent.fetch_add(plan.count() as u64, Relaxed);
                batch.push((to, at, plan.segment_len(0)));
            }
            let sock = self
                .sock
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|(_, s)| s.clone());
            let Some(sock) = sock else {
                continue;
            };
            let runs: Vec<Run<'_>> = batch
                .iter()
                .zip(&wire)
                .map(|(&(to, len, seg), out)| Run {
                    dst: SocketAddr::V4(to),
                    data: &out[..len],
                    seg,
                })
                .collect();
            sock.send_runs(&mut scratch, &runs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_ipv4_packets_pass() {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[16..20].copy_from_slice(&[10, 5, 2, 9]);
        assert_eq!(ipv4_dst(&p), Some(Ipv4Addr::new(10, 5, 2, 9)));
        assert!(is_ipv4_packet(&p));
        // Its length beyond the datagram, an IPv6 packet, a short one: not.
        p[2..4].copy_from_slice(&29u16.to_be_bytes());
        assert!(!is_ipv4_packet(&p));
        p[0] = 0x60;
        assert!(!is_ipv4_packet(&p) && ipv4_dst(&p).is_none());
        assert!(!is_ipv4_packet(&[0x45; 19]));
    }
}
