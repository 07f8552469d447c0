//! The underlay's UDP sockets, a batch per system call both ways: runs of equal datagrams to
//! one address sent as one GSO message (`UDP_SEGMENT`), several messages per `sendmmsg`;
//! received with GRO (`UDP_GRO`), a message holding many datagrams from one source, several
//! messages per `recvmmsg`. Where the kernel refuses either, one datagram per message, said
//! once.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::tun::wait;

/// Kernel socket buffers large enough for a burst of a fast flow.
const SOCKET_BUFFER: libc::c_int = 7 << 20;
/// Datagrams per GSO message: the kernel's UDP_MAX_SEGMENTS before 6.9.
const MAX_SEGMENTS: usize = 64;
/// Bytes per GSO message: under the 64 KiB an IP packet holds, for either family.
const MAX_GSO_BYTES: usize = 65_000;
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

fn setsockopt(fd: libc::c_int, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a c_int of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd,
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

/// A bound UDP socket and the offloads it has.
#[derive(Debug)]
pub struct UdpSock {
    sock: UdpSocket,
    /// Cleared for good when the kernel refuses a GSO send.
    gso: AtomicBool,
    gro: bool,
}

impl UdpSock {
    /// Binds `addr` (IPv6: IPv6 only), with large buffers, outer packets fragmented rather
    /// than dropped for DF (as the kernel's tunnels do), and GRO when the kernel has it.
    pub fn bind(addr: SocketAddr) -> io::Result<UdpSock> {
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
        let sock = unsafe { UdpSocket::from_raw_fd(fd) };
        if addr.is_ipv6() {
            setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
        } else {
            setsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            )?;
        }
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                let _ = setsockopt(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
            }
        }
        let (storage, len) = to_sockaddr(&addr);
        // SAFETY: storage holds a sockaddr of length len.
        if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let gro = match setsockopt(fd, SOL_UDP, UDP_GRO, 1) {
            Ok(()) => true,
            Err(e) => {
                said_once(&GRO_REFUSED, || {
                    tracing::warn!(
                        "UDP GRO refused by the kernel ({e}): one datagram per receive buffer"
                    )
                });
                false
            }
        };
        Ok(UdpSock {
            sock,
            gso: AtomicBool::new(true),
            gro,
        })
    }

    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn has_gro(&self) -> bool {
        self.gro
    }

    pub fn has_gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        setsockopt(
            self.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            mark as libc::c_int,
        )
    }

    /// Wakes a thread blocked receiving on this socket.
    pub fn shutdown(&self) {
        // SAFETY: shutdown(2) on a descriptor we own.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Sends each run: its datagrams of `seg` bytes back to back in `data` (the last may be
    /// shorter), all to `dst`. A datagram the network refuses (an unreachable peer) is dropped
    /// as a network drops it.
    pub fn send_runs(&self, scratch: &mut SendScratch, runs: &[Run<'_>]) {
        self.send_messages(scratch, runs, self.has_gso());
    }

    fn send_messages(&self, scratch: &mut SendScratch, runs: &[Run<'_>], gso: bool) {
        scratch.clear();
        for (dst, data, segment) in messages(runs, gso) {
            scratch.push(dst, data, segment);
        }
        let Some((errno, from)) = scratch.send(self.sock.as_raw_fd()) else {
            return;
        };
        // EINVAL: datagrams larger than the route's MTU, which only GSO refuses (a plain
        // send fragments them); anything else: the kernel has no GSO here, said once.
        if errno != libc::EINVAL {
            self.gso.store(false, Ordering::Relaxed);
            said_once(&GSO_REFUSED, || {
                tracing::warn!(
                    "UDP GSO refused by the kernel ({}): one datagram per message from now on",
                    io::Error::from_raw_os_error(errno)
                )
            });
        }
        let rest: Vec<Run<'_>> = messages(runs, gso)
            .skip(from)
            .map(|(dst, data, segment)| Run {
                dst,
                data,
                seg: segment.map_or(data.len(), usize::from),
            })
            .collect();
        self.send_messages(scratch, &rest, false);
    }
}

/// The messages that carry `runs`: with GSO, up to 64 datagrams and 64 KiB each; else one
/// datagram each. (address, bytes, GSO segment size when more than one datagram)
fn messages<'a>(
    runs: &'a [Run<'a>],
    gso: bool,
) -> impl Iterator<Item = (SocketAddr, &'a [u8], Option<u16>)> + 'a {
    runs.iter().flat_map(move |run| {
        let seg = run.seg.clamp(1, u16::MAX as usize);
        let per_msg = if gso {
            (MAX_GSO_BYTES / seg).clamp(1, MAX_SEGMENTS) * seg
        } else {
            seg
        };
        run.data.chunks(per_msg).map(move |chunk| {
            let segment = (gso && chunk.len() > seg).then_some(seg as u16);
            (run.dst, chunk, segment)
        })
    })
}

static GSO_REFUSED: AtomicBool = AtomicBool::new(false);
static GRO_REFUSED: AtomicBool = AtomicBool::new(false);

fn said_once(flag: &AtomicBool, say: impl FnOnce()) {
    if !flag.swap(true, Ordering::Relaxed) {
        say();
    }
}

/// Datagrams of `seg` bytes, back to back (the last may be shorter), all to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    pub dst: SocketAddr,
    pub data: &'a [u8],
    pub seg: usize,
}

/// Room for the messages of one `send_runs`, reused from call to call.
#[derive(Default)]
pub struct SendScratch {
    addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<[u64; 4]>,
    segs: Vec<Option<u16>>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside are rebuilt for each send and never outlive it.
unsafe impl Send for SendScratch {}

impl SendScratch {
    fn clear(&mut self) {
        self.addrs.clear();
        self.iovs.clear();
        self.cmsgs.clear();
        self.segs.clear();
        self.hdrs.clear();
    }

    fn push(&mut self, dst: SocketAddr, data: &[u8], segment: Option<u16>) {
        self.addrs.push(to_sockaddr(&dst));
        self.iovs.push(libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        });
        self.segs.push(segment);
    }

    /// Sends what was pushed; Some((errno, i)) when the kernel refused GSO message i (it
    /// and those after it were not sent).
    fn send(&mut self, fd: libc::c_int) -> Option<(i32, usize)> {
        let n = self.iovs.len();
        self.cmsgs.resize(n, [0; 4]);
        self.hdrs.clear();
        for i in 0..n {
            // SAFETY: plain data, all-zero valid.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            h.msg_hdr.msg_name = (&mut self.addrs[i].0 as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = self.addrs[i].1;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            if let Some(seg) = self.segs[i] {
                let buf = &mut self.cmsgs[i];
                h.msg_hdr.msg_control = buf.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE of a u16 fits the 32 bytes of buf.
                h.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                // SAFETY: the control buffer is long enough for one cmsghdr and its u16.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    (*c).cmsg_level = SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
                }
            }
            self.hdrs.push(h);
        }
        let mut done = 0;
        while done < n {
            // SAFETY: the headers point at live buffers of the lengths they state.
            let sent = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[done..].as_mut_ptr(),
                    (n - done) as libc::c_uint,
                    0,
                )
            };
            if sent > 0 {
                done += sent as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) => {
                    let _ = wait(&fd_ref(fd), libc::POLLOUT, 100);
                }
                // No checksum offload on the way out, no GSO at all, or segments over the MTU.
                Some(e @ (libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EINVAL))
                    if self.segs[done].is_some() =>
                {
                    return Some((e, done));
                }
                // The first message failed on its own: skip it, send the rest.
                _ => done += 1,
            }
        }
        None
    }
}

struct RawFd(libc::c_int);

impl AsRawFd for RawFd {
    fn as_raw_fd(&self) -> libc::c_int {
        self.0
    }
}

fn fd_ref(fd: libc::c_int) -> RawFd {
    RawFd(fd)
}

/// Buffers for one `recvmmsg`, reused from batch to batch.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<[u64; 4]>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside point into the batch's own buffers.
unsafe impl Send for RecvBatch {}

/// One message received: its source, its bytes, and the size of each datagram in it (the
/// last may be shorter).
pub struct Message<'a> {
    pub src: SocketAddr,
    pub data: &'a mut [u8],
    pub seg: usize,
}

impl Message<'_> {
    /// Its datagrams, one by one.
    pub fn datagrams(&mut self) -> std::slice::ChunksMut<'_, u8> {
        let seg = self.seg.max(1);
        self.data.chunks_mut(seg)
    }
}

impl RecvBatch {
    /// Room for `count` messages of up to `size` bytes each: 64 KiB holds any GRO message.
    pub fn new(count: usize, size: usize) -> RecvBatch {
        RecvBatch {
            bufs: (0..count).map(|_| vec![0u8; size]).collect(),
            // SAFETY: plain data, all-zero valid.
            addrs: vec![unsafe { mem::zeroed() }; count],
            iovs: Vec::with_capacity(count),
            cmsgs: vec![[0; 4]; count],
            // SAFETY: plain data, all-zero valid.
            hdrs: vec![unsafe { mem::zeroed() }; count],
        }
    }

    /// The usual room for a socket: GRO's messages are large, plain datagrams many.
    pub fn for_socket(sock: &UdpSock) -> RecvBatch {
        if sock.has_gro() {
            RecvBatch::new(32, 65_536)
        } else {
            RecvBatch::new(64, 16_384)
        }
    }

    /// Blocks for at least one message, then takes what else waits, up to the batch's room;
    /// returns how many came.
    pub fn recv(&mut self, sock: &UdpSock) -> io::Result<usize> {
        self.iovs.clear();
        for b in self.bufs.iter_mut() {
            self.iovs.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            });
        }
        for i in 0..self.bufs.len() {
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i].as_mut_ptr().cast();
            h.msg_controllen = mem::size_of::<[u64; 4]>() as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        loop {
            // SAFETY: the headers point at live buffers of the lengths they state.
            let n = unsafe {
                libc::recvmmsg(
                    sock.sock.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    self.bufs.len() as libc::c_uint,
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

    /// The first `n` messages of the last `recv`, each cut-short one or one from no address
    /// left out.
    pub fn messages(&mut self, n: usize) -> impl Iterator<Item = Message<'_>> {
        self.bufs
            .iter_mut()
            .zip(self.hdrs.iter().zip(self.addrs.iter()))
            .take(n)
            .filter_map(|(buf, (h, addr))| {
                if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    return None;
                }
                let len = h.msg_len as usize;
                Some(Message {
                    src: from_sockaddr(addr)?,
                    seg: gro_segment(&h.msg_hdr).unwrap_or(len),
                    data: &mut buf[..len],
                })
            })
    }
}

/// The datagram size of a GRO message, from its control message.
fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    // SAFETY: the kernel wrote msg_controllen bytes of well-formed cmsgs into the buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return (size > 0).then_some(size as usize);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_both_families_survive_the_round_trip() {
        for a in ["192.0.2.7:51820", "[fd00::7]:8285"] {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(from_sockaddr(&to_sockaddr(&addr).0), Some(addr));
        }
    }

    #[test]
    fn runs_become_gso_messages_of_at_most_64_datagrams_under_64_kib() {
        let sock = UdpSock::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let rx = UdpSock::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let dst = rx.local_addr().unwrap();
        let data: Vec<u8> = (0..100 * 1000 + 10).map(|i| (i % 251) as u8).collect();
        let mut scratch = SendScratch::default();
        sock.send_runs(
            &mut scratch,
            &[Run {
                dst,
                data: &data,
                seg: 1000,
            }],
        );
        let mut batch = RecvBatch::for_socket(&rx);
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while got.len() < data.len() {
            let n = batch.recv(&rx).unwrap();
            for mut m in batch.messages(n) {
                assert_eq!(m.src, sock.local_addr().unwrap());
                for d in m.datagrams() {
                    sizes.push(d.len());
                    got.extend_from_slice(d);
                }
            }
        }
        assert_eq!(got, data);
        assert_eq!(sizes.len(), 101, "each datagram as sent");
        assert!(sizes[..100].iter().all(|s| *s == 1000) && sizes[100] == 10);
    }
}
