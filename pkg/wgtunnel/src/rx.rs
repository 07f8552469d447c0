//! From the network to TUN: a burst of GRO messages received, handshake messages answered on
//! the way, data opened in place across the crypto pool, then in the burst's order each
//! counter taken by its session's window, the source checked against the peer's allowed IPs,
//! and the packets written to TUN with each flow's segments joined.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use tunio::{Coalescer, RecvBatch, UdpSock};

use crate::device::{Device, Indexed, State};
use crate::noise::{DATA_HEADER_LEN, MSG_DATA};
use crate::peer::{lock, Peer};
use crate::session::{data_header, Session};

/// Datagrams per part of the crypto pool's split.
const MIN_PART: usize = 16;

struct Job<'a> {
    data: &'a mut [u8],
    peer: Arc<Peer>,
    session: Arc<Session>,
    counter: u64,
    src: SocketAddr,
    plain: Option<usize>,
}

/// What a burst did for one peer, applied once after it.
struct Heard {
    peer: Arc<Peer>,
    src: SocketAddr,
    bytes: usize,
    data: bool,
    confirm: Option<Arc<Session>>,
}

impl Device {
    pub(crate) fn run_socket_reader(
        self: Arc<Self>,
        sock: &UdpSock,
        queue: usize,
        generation: u64,
    ) {
        let mut batch = RecvBatch::for_socket(sock);
        let mut gro = Coalescer::default();
        loop {
            let received = batch.recv(sock);
            if self.is_stopped.load(Ordering::Relaxed) || self.sockets().1 != generation {
                return;
            }
            let n = match received {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("{}: receiving on {:?}: {e}", self.name, sock.local_addr());
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if let Err(e) = self.receive_burst(&mut batch, n, queue, &mut gro) {
                return self.stop(format!("writing to TUN device {}: {e}", self.name));
            }
        }
    }

    fn receive_burst(
        &self,
        batch: &mut RecvBatch,
        n: usize,
        queue: usize,
        gro: &mut Coalescer,
    ) -> std::io::Result<()> {
        let state = self.read_state();
        let mut jobs: Vec<Job> = Vec::new();
        let mut last: Option<(u32, Indexed)> = None;
        for m in batch.messages(n) {
            let (src, seg) = (m.src, m.seg.max(1));
            for d in m.data.chunks_mut(seg) {
                if d.first() != Some(&MSG_DATA) {
                    if !d.is_empty() {
                        self.handshake_message(&state, src, d);
                    }
                    continue;
                }
                let Some((index, counter)) = data_header(d) else {
                    continue;
                };
                let entry = match &last {
                    Some((i, e)) if *i == index => e.clone(),
                    _ => match self.lookup(index) {
                        Some(e) => {
                            last = Some((index, e.clone()));
                            e
                        }
                        None => continue,
                    },
                };
                let Some(session) = entry.session else {
                    continue;
                };
                if !session.may_receive(counter) {
                    continue;
                }
                jobs.push(Job {
                    data: d,
                    peer: entry.peer,
                    session,
                    counter,
                    src,
                    plain: None,
                });
            }
        }
        self.pool.for_each(&mut jobs, MIN_PART, |j| {
            j.plain = j.session.open(j.counter, j.data);
        });
        let mut deliver: Vec<&[u8]> = Vec::with_capacity(jobs.len());
        let mut heard: Vec<Heard> = Vec::new();
        for j in jobs {
            let Some(len) = j.plain else { continue };
            if !j.session.receive(j.counter) {
                continue;
            }
            let h = match heard
                .iter_mut()
                .rposition(|h| Arc::ptr_eq(&h.peer, &j.peer))
            {
                Some(i) => &mut heard[i],
                None => {
                    heard.push(Heard {
                        peer: j.peer.clone(),
                        src: j.src,
                        bytes: 0,
                        data: false,
                        confirm: None,
                    });
                    let at = heard.len() - 1;
                    &mut heard[at]
                }
            };
            h.bytes += j.data.len();
            h.src = j.src;
            if !j.session.confirmed.load(Ordering::Relaxed) {
                h.confirm = Some(j.session.clone());
            }
            if len == 0 {
                continue; // a keepalive
            }
            h.data = true;
            let data: &[u8] = j.data;
            let plain = &data[DATA_HEADER_LEN..DATA_HEADER_LEN + len];
            let Some(ip) = tunio::ip::IpHdr::parse(plain) else {
                continue;
            };
            let packet = &plain[..ip.total];
            let from = tunio::ip::src_addr(packet);
            match from.and_then(|a| state.allowed.lookup(a)) {
                Some(owner) if Arc::ptr_eq(owner, &j.peer) => deliver.push(packet),
                _ => {}
            }
        }
        if !deliver.is_empty() {
            self.tun.write_packets(queue, &deliver, gro)?;
        }
        let now = Instant::now();
        for h in heard {
            self.heard_from(&state, h, now);
        }
        Ok(())
    }

    /// What a burst's authentic packets from one peer mean: where it is, that it lives,
    /// that the session it used is confirmed, that a keepalive is owed.
    fn heard_from(&self, state: &State, h: Heard, now: Instant) {
        let peer = &h.peer;
        peer.rx_bytes.fetch_add(h.bytes as u64, Ordering::Relaxed);
        peer.set_endpoint(h.src);
        let mut complete = false;
        if let Some(s) = &h.confirm {
            let (done, gone) = peer.confirm(s);
            self.forget_indices(gone.map(|g| g.local_index));
            if done {
                *lock(&peer.last_handshake) = Some(SystemTime::now());
                complete = true;
            }
        }
        {
            let mut t = lock(&peer.timers);
            if complete {
                t.handshake_complete();
            }
            t.any_received();
            t.traversal(now, peer.keepalive());
            if h.data {
                t.data_received(now);
            }
        }
        if complete {
            self.send_staged(state, peer);
        }
        self.keep_fresh_receiving(state, peer);
    }
}
