//! The device as the UAPI sees it: a `set=1` applied, a `get=1` answered.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use wireguard::uapi::{DeviceConfig, DeviceState, PeerConfig, PeerState, UapiError};
use wireguard::Key;

use crate::allowed::{canonical, AllowedIps};
use crate::cookie::Checker;
use crate::device::{random, Device, State};
use crate::noise::Identity;
use crate::peer::{lock, Peer, Settings};
use crate::udp::Sockets;

fn failed(errno: Option<i32>, message: String) -> UapiError {
    UapiError {
        errno: errno.unwrap_or(libc::EIO),
        message,
    }
}

impl Device {
    /// Applies a `set=1` operation.
    pub fn apply(self: &Arc<Self>, config: &DeviceConfig) -> Result<(), UapiError> {
        let mut greet = Vec::new();
        {
            let mut state = self.write_state();
            if let Some(port) = config.listen_port {
                self.rebind(&state, port)?;
            }
            if let Some(mark) = config.fwmark {
                state.fwmark = mark;
                self.sockets()
                    .0
                    .set_fwmark(mark)
                    .map_err(|e| failed(e.raw_os_error(), format!("setting fwmark {mark}: {e}")))?;
            }
            if let Some(key) = config.private_key {
                self.set_identity(&mut state, key);
            }
            if config.replace_peers {
                for peer in state.peers.values() {
                    self.zero_keys(peer);
                }
                state.peers.clear();
                state.allowed = AllowedIps::default();
            }
            for p in &config.peers {
                greet.extend(self.apply_peer(&mut state, p));
            }
        }
        // A peer that now keeps its connection alive says so at once (a handshake first).
        let state = self.read_state();
        for peer in greet {
            if lock(&peer.staged).is_empty() {
                peer.stage(Vec::new());
            }
            self.send_staged(&state, &peer);
        }
        Ok(())
    }

    fn rebind(self: &Arc<Self>, state: &State, port: u16) -> Result<(), UapiError> {
        let (current, generation) = self.sockets();
        if current.port == port && port != 0 {
            return Ok(());
        }
        let fresh = Sockets::bind(port, state.fwmark)
            .map_err(|e| failed(e.raw_os_error(), format!("binding UDP port {port}: {e}")))?;
        let fresh = Arc::new(fresh);
        {
            let mut b = self.bound.write().unwrap_or_else(|e| e.into_inner());
            b.sockets = fresh.clone();
            b.generation = generation + 1;
        }
        current.shutdown();
        self.spawn_socket_readers(&fresh, generation + 1)
            .map_err(|e| failed(None, format!("starting readers: {e}")))
    }

    /// The same key again (a restarted flanneld configuring the tunnel it left) keeps the
    /// sessions, as the kernel's WireGuard does; another key drops them all.
    fn set_identity(&self, state: &mut State, key: Key) {
        let current = state.identity.as_ref().map(|i| Key(i.secret.to_bytes()));
        if Some(key) == current || (key.is_zero() && current.is_none()) {
            return;
        }
        let identity = (!key.is_zero()).then(|| Arc::new(Identity::new(key.0)));
        state.checker = identity
            .as_ref()
            .map(|id| Mutex::new(Checker::new(id, random())));
        state.identity = identity;
        for peer in state.peers.values() {
            self.zero_keys(peer);
            lock(&peer.handshake).keys.forget();
            lock(&peer.timers).stop();
        }
    }

    /// Applies one peer's settings; returns it when it must be greeted (its keepalive
    /// turned on).
    fn apply_peer(&self, state: &mut State, p: &PeerConfig) -> Option<Arc<Peer>> {
        if p.remove {
            if let Some(peer) = state.peers.remove(&p.public_key) {
                self.zero_keys(&peer);
                for net in lock(&peer.settings).allowed_ips.drain(..) {
                    state.allowed.remove(net);
                }
            }
            return None;
        }
        let (peer, new) = match state.peers.get(&p.public_key) {
            Some(peer) => (peer.clone(), false),
            None if p.update_only => return None,
            None => {
                let peer = Arc::new(Peer::new(
                    p.public_key,
                    Settings {
                        psk: None,
                        keepalive: 0,
                        allowed_ips: Vec::new(),
                    },
                ));
                state.peers.insert(p.public_key, peer.clone());
                (peer, true)
            }
        };
        let mut greet = false;
        {
            let mut s = lock(&peer.settings);
            if let Some(psk) = p.preshared_key {
                s.psk = (!psk.is_zero()).then_some(psk);
                lock(&peer.handshake).keys.psk = psk.0;
            }
            if let Some(k) = p.persistent_keepalive {
                greet = k > 0 && (s.keepalive == 0 || new);
                s.keepalive = k;
            }
        }
        if let Some(ep) = p.endpoint {
            peer.set_endpoint(ep);
        }
        if p.replace_allowed_ips {
            for net in lock(&peer.settings).allowed_ips.drain(..) {
                state.allowed.remove(net);
            }
        }
        for net in &p.allowed_ips {
            let net = canonical(*net);
            if let Some(previous) = state.allowed.insert(net, peer.clone()) {
                if !Arc::ptr_eq(&previous, &peer) {
                    lock(&previous.settings).allowed_ips.retain(|n| *n != net);
                }
            }
            let mut s = lock(&peer.settings);
            if !s.allowed_ips.contains(&net) {
                s.allowed_ips.push(net);
            }
        }
        greet.then_some(peer)
    }

    /// What the device holds, for `get=1`.
    pub fn state(&self) -> DeviceState {
        let state = self.read_state();
        let (sockets, _) = self.sockets();
        let mut peers: Vec<PeerState> = state
            .peers
            .values()
            .map(|peer| {
                let s = lock(&peer.settings);
                PeerState {
                    public_key: peer.key,
                    preshared_key: s.psk,
                    endpoint: peer.endpoint(),
                    persistent_keepalive: s.keepalive,
                    allowed_ips: s.allowed_ips.clone(),
                    last_handshake: lock(&peer.last_handshake)
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok()),
                    rx_bytes: peer.rx_bytes.load(Ordering::Relaxed),
                    tx_bytes: peer.tx_bytes.load(Ordering::Relaxed),
                }
            })
            .collect();
        peers.sort_by_key(|p| p.public_key);
        DeviceState {
            private_key: state.identity.as_ref().map(|i| Key(i.secret.to_bytes())),
            listen_port: sockets.port,
            fwmark: state.fwmark,
            peers,
        }
    }
}
