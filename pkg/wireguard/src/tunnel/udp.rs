//! The tunnel's UDP sockets, with batched sends and receives (sendmmsg, recvmmsg).

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

pub const BATCH: usize = 32;

/// Kernel socket buffers large enough for a burst of a fast flow (wireguard-go asks 7 MiB).
const SOCKET_BUFFER: libc::c_int = 7 << 20;

fn setsockopt(sock: &UdpSocket, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a c_int of the size given.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2) call; the descriptor is owned by the UdpSocket at once.
    let fd = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns.
    let sock = unsafe { <UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    if addr.is_ipv6() {
        setsockopt(&sock, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    } else {
        // As the kernel's WireGuard: outer packets may be fragmented, never dropped for DF.
        setsockopt(
            &sock,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DONT,
        )?;
    }
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt(&sock, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
            let _ = setsockopt(&sock, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
        }
    }
    let (storage, len) = to_sockaddr(&addr);
    // SAFETY: storage holds a sockaddr of length len.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// The sockets of one listen port: IPv4 always, IPv6 when the namespace has it.
#[derive(Debug)]
pub struct Sockets {
    pub port: u16,
    pub v4: UdpSocket,
    pub v6: Option<UdpSocket>,
}

impl Sockets {
    /// Binds `port` on both families (0: one free port for both).
    pub fn bind(port: u16, fwmark: u32) -> io::Result<Sockets> {
        let mut last_err = None;
        for _ in 0..10 {
            let v4 = bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
            let chosen = v4.local_addr()?.port();
            let v6 = match bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, chosen))) {
                Ok(s) => Some(s),
                Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => None,
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => None,
                Err(e) if port == 0 && e.kind() == io::ErrorKind::AddrInUse => {
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let s = Sockets {
                port: chosen,
                v4,
                v6,
            };
            s.set_fwmark(fwmark)?;
            return Ok(s);
        }
        Err(last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
    }

    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        for s in std::iter::once(&self.v4).chain(self.v6.as_ref()) {
            setsockopt(s, libc::SOL_SOCKET, libc::SO_MARK, mark as libc::c_int)?;
        }
        Ok(())
    }

    pub fn for_addr(&self, addr: &SocketAddr) -> Option<&UdpSocket> {
        match addr {
            SocketAddr::V4(_) => Some(&self.v4),
            SocketAddr::V6(_) => self.v6.as_ref(),
        }
    }

    /// Wakes threads blocked receiving on these sockets (they then see they are retired).
    pub fn shutdown(&self) {
        for s in std::iter::once(&self.v4).chain(self.v6.as_ref()) {
            // SAFETY: shutdown(2) on a descriptor we own.
            unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }
}

pub fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

pub fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(storage as *const _ as *const _) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 = unsafe { &*(storage as *const _ as *const _) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, u16::from_be(sin6.sin6_port))),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// Buffers for one batch of datagrams received with recvmmsg, reused from batch to batch.
pub struct RecvBatch {
    pub bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside point into the batch's own buffers.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    pub fn new(size: usize) -> RecvBatch {
        RecvBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; size]).collect(),
            // SAFETY: plain data, all-zero valid.
            addrs: vec![unsafe { mem::zeroed() }; BATCH],
            iovs: Vec::with_capacity(BATCH),
            // SAFETY: plain data, all-zero valid.
            hdrs: vec![unsafe { mem::zeroed() }; BATCH],
        }
    }

    /// Blocks for at least one datagram, then takes up to BATCH; returns how many, and
    /// for each its length and source via `datagram`.
    pub fn recv(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        self.iovs.clear();
        for b in self.bufs.iter_mut() {
            self.iovs.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            });
        }
        for i in 0..BATCH {
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        loop {
            // SAFETY: the headers point at live buffers of the lengths they state.
            let n = unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Datagram `i` of the last batch: its source and its bytes.
    pub fn datagram(&mut self, i: usize) -> (Option<SocketAddr>, &mut [u8]) {
        let len = self.hdrs[i].msg_len as usize;
        (from_sockaddr(&self.addrs[i]), &mut self.bufs[i][..len])
    }
}

/// Sends datagrams to their addresses in as few sendmmsg calls as the batch allows.
pub struct SendBatch {
    addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside are rebuilt for each send and never outlive it.
unsafe impl Send for SendBatch {}

impl Default for SendBatch {
    fn default() -> Self {
        SendBatch {
            addrs: Vec::with_capacity(BATCH),
            iovs: Vec::with_capacity(BATCH),
            hdrs: Vec::with_capacity(BATCH),
        }
    }
}

impl SendBatch {
    /// Sends each (address, datagram) through `sock`; errors of single datagrams (an
    /// unreachable peer) are dropped as a network drops packets.
    pub fn send<'a>(
        &mut self,
        sock: &UdpSocket,
        items: impl Iterator<Item = (SocketAddr, &'a [u8])>,
    ) {
        self.addrs.clear();
        self.iovs.clear();
        self.hdrs.clear();
        for (addr, data) in items {
            self.addrs.push(to_sockaddr(&addr));
            self.iovs.push(libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            });
        }
        for i in 0..self.iovs.len() {
            // SAFETY: plain data, all-zero valid.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            h.msg_hdr.msg_name = (&mut self.addrs[i].0 as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = self.addrs[i].1;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            self.hdrs.push(h);
        }
        let mut done = 0;
        while done < self.hdrs.len() {
            // SAFETY: the headers point at live buffers of the lengths they state.
            let n = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    self.hdrs[done..].as_mut_ptr(),
                    (self.hdrs.len() - done) as libc::c_uint,
                    0,
                )
            };
            if n > 0 {
                done += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    let _ = super::tun::wait(sock, libc::POLLOUT, 100);
                }
                // The first datagram failed on its own: skip it, send the rest.
                _ => done += 1,
            }
        }
    }
}
