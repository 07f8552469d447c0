//! From TUN to the network: a burst of (super-)packets read, cut into what the wire carries,
//! numbered per peer in order, sealed across the crypto pool, and sent as one GSO run per
//! super-packet, all runs of a family in one `sendmmsg`.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tunio::{tun::READ_MAX, Plan, Run, SendScratch, VnetHdr};

use crate::device::{Device, State};
use crate::noise::{DATA_HEADER_LEN, TAG_LEN};
use crate::peer::{lock, Peer};
use crate::session::{padded, Session};

/// Super-packets read before the burst is sent.
const BURST: usize = 16;
/// Segments per part of the crypto pool's split: a part is worth waking a thread for.
const MIN_PART: usize = 16;

/// A reader's buffers, reused from burst to burst.
pub(crate) struct TxBuffers {
    bufs: Vec<Vec<u8>>,
    reads: Vec<(VnetHdr, Range<usize>)>,
    arena: Vec<u8>,
    scratch: SendScratch,
}

impl TxBuffers {
    pub(crate) fn new() -> TxBuffers {
        TxBuffers {
            bufs: (0..BURST).map(|_| vec![0u8; READ_MAX]).collect(),
            reads: Vec::with_capacity(BURST),
            arena: Vec::new(),
            scratch: SendScratch::default(),
        }
    }
}

/// One packet on the wire: segment `seg` of read `read`, sealed with counter `counter` of
/// session `session` into `out`.
struct Job<'a> {
    read: usize,
    plan: Plan,
    seg: usize,
    session: usize,
    counter: u64,
    out: &'a mut [u8],
}

/// A peer's share of the burst.
struct Share {
    peer: Arc<Peer>,
    reads: Vec<(usize, Plan)>,
}

impl Device {
    pub(crate) fn run_tun_reader(self: Arc<Self>, queue: usize) {
        let mut tx = TxBuffers::new();
        while !self.is_stopped.load(Ordering::Relaxed) {
            tx.reads.clear();
            while tx.reads.len() < BURST {
                let i = tx.reads.len();
                match self.tun.read(queue, &mut tx.bufs[i]) {
                    Ok(Some(r)) => tx.reads.push(r),
                    Ok(None) => break,
                    Err(e) => return self.stop(format!("reading TUN device {}: {e}", self.name)),
                }
            }
            if tx.reads.is_empty() {
                if let Err(e) = tunio::tun::wait(self.tun.queue(queue), libc::POLLIN, 1000) {
                    return self.stop(format!("waiting on TUN device {}: {e}", self.name));
                }
                continue;
            }
            self.send_burst(&mut tx);
        }
    }

    fn send_burst(&self, tx: &mut TxBuffers) {
        let TxBuffers {
            bufs,
            reads,
            arena,
            scratch,
        } = tx;
        let state = self.read_state();
        if state.identity.is_none() {
            return;
        }
        let now = Instant::now();
        let shares = route(&state, bufs, reads);
        let mtu = self.mtu.load(Ordering::Relaxed);
        // Counters in order per peer, and where each sealed packet goes.
        let mut sessions: Vec<Arc<Session>> = Vec::new();
        let mut plan_out: Vec<(usize, Plan, usize, usize, u64, usize)> = Vec::new();
        let mut runs_at: Vec<(usize, std::net::SocketAddr, Range<usize>, usize)> = Vec::new();
        let mut sent: Vec<(usize, usize)> = Vec::new();
        let mut len = 0;
        for (si, share) in shares.iter().enumerate() {
            let total: usize = share.reads.iter().map(|(_, p)| p.count()).sum();
            let ready = share
                .peer
                .sending_session(now)
                .zip(share.peer.endpoint())
                .and_then(|(s, ep)| Some((s.reserve(total as u64)?, s, ep)));
            let Some((first, session, dst)) = ready else {
                self.stage(&state, &share.peer, bufs, reads, &share.reads);
                continue;
            };
            sessions.push(session);
            let mut counter = first;
            let start = len;
            for (read, plan) in &share.reads {
                let run = len;
                for seg in 0..plan.count() {
                    let wire = DATA_HEADER_LEN + padded(plan.segment_len(seg), mtu) + TAG_LEN;
                    plan_out.push((*read, *plan, seg, sessions.len() - 1, counter, wire));
                    counter += 1;
                    len += wire;
                }
                let seg = plan_out[plan_out.len() - plan.count()].5;
                runs_at.push((si, dst, run..len, seg));
            }
            sent.push((si, len - start));
        }
        if arena.len() < len {
            arena.resize(len, 0);
        }
        let mut rest = &mut arena[..len];
        let mut jobs: Vec<Job> = Vec::with_capacity(plan_out.len());
        for (read, plan, seg, session, counter, wire) in plan_out {
            let (out, tail) = std::mem::take(&mut rest).split_at_mut(wire);
            rest = tail;
            jobs.push(Job {
                read,
                plan,
                seg,
                session,
                counter,
                out,
            });
        }
        let (bufs, reads, sessions) = (&*bufs, &*reads, &sessions);
        self.pool.for_each(&mut jobs, MIN_PART, |j| {
            let pkt = &bufs[j.read][reads[j.read].1.clone()];
            let body = j.out.len() - DATA_HEADER_LEN - TAG_LEN;
            let plain = &mut j.out[DATA_HEADER_LEN..DATA_HEADER_LEN + body];
            let n = j.plan.write(pkt, j.seg, plain);
            plain[n..].fill(0);
            sessions[j.session].seal(j.counter, j.out);
        });
        drop(jobs);
        let (sockets, _) = self.sockets();
        for (sock, v4) in [(Some(&sockets.v4), true), (sockets.v6.as_ref(), false)] {
            let Some(sock) = sock else { continue };
            let runs: Vec<Run> = runs_at
                .iter()
                .filter(|(_, dst, _, _)| dst.is_ipv4() == v4)
                .map(|(_, dst, r, seg)| Run {
                    dst: *dst,
                    data: &arena[r.clone()],
                    seg: *seg,
                })
                .collect();
            if !runs.is_empty() {
                sock.send_runs(scratch, &runs);
            }
        }
        let mut session_of = sessions.iter();
        for (si, bytes) in sent {
            let peer = &shares[si].peer;
            peer.add_tx(bytes);
            {
                let mut t = lock(&peer.timers);
                t.any_sent();
                t.traversal(now, peer.keepalive());
                t.data_sent(now, self.jitter());
            }
            if let Some(s) = session_of.next() {
                self.keep_fresh_sending(&state, peer, s);
            }
        }
    }

    /// Holds a share's packets, cut, until its peer has a session, and starts a handshake.
    fn stage(
        &self,
        state: &State,
        peer: &Arc<Peer>,
        bufs: &[Vec<u8>],
        reads: &[(VnetHdr, Range<usize>)],
        share: &[(usize, Plan)],
    ) {
        for (read, plan) in share {
            let pkt = &bufs[*read][reads[*read].1.clone()];
            for seg in 0..plan.count() {
                let mut p = vec![0u8; plan.segment_len(seg)];
                plan.write(pkt, seg, &mut p);
                peer.stage(p);
            }
        }
        self.send_staged(state, peer);
    }
}

/// Each packet of the burst planned and given to the peer its destination belongs to;
/// packets to no peer, or malformed, dropped.
fn route(state: &State, bufs: &[Vec<u8>], reads: &[(VnetHdr, Range<usize>)]) -> Vec<Share> {
    let mut shares: Vec<Share> = Vec::new();
    for (i, (hdr, range)) in reads.iter().enumerate() {
        let pkt = &bufs[i][range.clone()];
        let Ok(plan) = Plan::new(hdr, pkt) else {
            continue;
        };
        let Some(peer) = tunio::ip::dst_addr(pkt).and_then(|d| state.allowed.lookup(d)) else {
            continue;
        };
        match shares.iter_mut().find(|s| Arc::ptr_eq(&s.peer, peer)) {
            Some(s) => s.reads.push((i, plan)),
            None => shares.push(Share {
                peer: peer.clone(),
                reads: vec![(i, plan)],
            }),
        }
    }
    shares
}
