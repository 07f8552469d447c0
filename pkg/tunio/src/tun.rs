//! A TUN device: opened with virtio-net headers and the offloads the kernel grants (checksum,
//! TSO for both families, USO where the kernel has it), read one (super-)packet at a time,
//! written a batch at a time with the batch's TCP segments coalesced.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::gro::{self, Coalescer};
use crate::vnet::{self, VnetHdr};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const IFF_VNET_HDR: libc::c_short = 0x4000;

/// `TUNSETOFFLOAD` flags: what the kernel may hand this end unfinished.
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;
pub const TUN_F_TSO_ECN: u32 = 0x08;
pub const TUN_F_USO4: u32 = 0x20;
pub const TUN_F_USO6: u32 = 0x40;

/// The largest read: a 64 KiB super-packet after its virtio-net header.
pub const READ_MAX: usize = vnet::HDR_LEN + 65_535;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// How to open a device.
#[derive(Debug, Clone, Copy)]
pub struct TunOptions {
    /// Queues (IFF_MULTI_QUEUE), each its own descriptor for a reader of its own.
    pub queues: usize,
    /// Ask for virtio-net headers and offloads; false: plain packets, one per read and write.
    pub offloads: bool,
}

impl Default for TunOptions {
    fn default() -> Self {
        TunOptions {
            queues: 1,
            offloads: true,
        }
    }
}

/// An open TUN device (made if missing; gone when its last queue closes, unless persistent).
#[derive(Debug)]
pub struct Tun {
    name: String,
    queues: Vec<OwnedFd>,
    vnet: bool,
    offloads: u32,
}

fn ioctl(fd: &impl AsRawFd, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the requests used here take an integer, or a pointer the caller keeps alive.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Tun {
    pub fn open(name: &str, opts: &TunOptions) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?}: an interface name has 1 to 15 bytes"),
            ));
        }
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE,
            _pad: [0; 22],
        };
        if opts.offloads {
            req.flags |= IFF_VNET_HDR;
        }
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        let mut queues = Vec::new();
        for _ in 0..opts.queues.max(1) {
            let file: File = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open("/dev/net/tun")?;
            ioctl(&file, TUNSETIFF, &mut req as *mut IfReq as libc::c_ulong)?;
            // SAFETY: into_raw_fd hands over sole ownership of an open descriptor.
            queues.push(unsafe { OwnedFd::from_raw_fd(file.into_raw_fd()) });
        }
        let mut tun = Tun {
            name: name.to_string(),
            queues,
            vnet: opts.offloads,
            offloads: 0,
        };
        if opts.offloads {
            tun.offloads = tun.set_offloads();
        }
        Ok(tun)
    }

    /// Asks for TSO and USO, then TSO alone (a kernel before 6.2 has no USO); says once
    /// when the kernel grants less.
    fn set_offloads(&self) -> u32 {
        let tso = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        let mut refused = Vec::new();
        for flags in [tso | TUN_F_USO4 | TUN_F_USO6, tso] {
            match ioctl(&self.queues[0], TUNSETOFFLOAD, flags as libc::c_ulong) {
                Ok(()) => {
                    if flags & TUN_F_USO4 == 0 {
                        tracing::info!(
                            "{}: the kernel has no UDP segmentation offload for TUN ({}); \
                             UDP leaves one datagram per read",
                            self.name,
                            refused.join("; ")
                        );
                    }
                    return flags;
                }
                Err(e) => refused.push(e.to_string()),
            }
        }
        tracing::warn!(
            "{}: the kernel refused TUN offloads ({}); one packet per read and write",
            self.name,
            refused.join("; ")
        );
        0
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    pub fn queue(&self, q: usize) -> &OwnedFd {
        &self.queues[q]
    }

    /// The device's MTU as the kernel holds it now (`ip link set mtu` changes it).
    pub fn mtu(&self) -> io::Result<usize> {
        // SAFETY: a plain socket(2) call; the descriptor is owned at once.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is ours alone.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ifreq is plain data; all-zero is valid.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(self.name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        ioctl(
            &sock,
            libc::SIOCGIFMTU,
            &mut req as *mut libc::ifreq as libc::c_ulong,
        )?;
        // SAFETY: SIOCGIFMTU filled the union's MTU.
        Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
    }

    /// The TUNSETOFFLOAD flags granted (0: none).
    pub fn offloads(&self) -> u32 {
        self.offloads
    }

    /// Reads one packet of queue `q` into `buf` (READ_MAX long); Ok(None) when none waits.
    /// Returns its virtio-net header (a plain one without offloads) and where the packet lies
    /// in `buf`.
    pub fn read(
        &self,
        q: usize,
        buf: &mut [u8],
    ) -> io::Result<Option<(VnetHdr, std::ops::Range<usize>)>> {
        let fd = self.queues[q].as_raw_fd();
        loop {
            // SAFETY: buf is valid for writes of its length.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                let n = n as usize;
                if !self.vnet {
                    return Ok(Some((VnetHdr::default(), 0..n)));
                }
                return match VnetHdr::decode(&buf[..n]) {
                    Some(h) => Ok(Some((h, vnet::HDR_LEN..n))),
                    None => continue,
                };
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(err),
            }
        }
    }

    /// Writes one packet to queue `q` as it is.
    pub fn write(&self, q: usize, packet: &[u8]) -> io::Result<()> {
        let plain = VnetHdr::default().encode();
        let head = if self.vnet { &plain[..] } else { &plain[..0] };
        write_all(&self.queues[q], &mut [iovec(head), iovec(packet)])
    }

    /// Writes `packets` to queue `q`, a flow's consecutive TCP segments joined into one
    /// super-packet each (planned by `gro`, reused from batch to batch); returns how many
    /// writes it took.
    pub fn write_packets<P: AsRef<[u8]>>(
        &self,
        q: usize,
        packets: &[P],
        gro: &mut Coalescer,
    ) -> io::Result<usize> {
        let fd = &self.queues[q];
        if !self.vnet {
            for p in packets {
                write_all(fd, &mut [iovec(p.as_ref())])?;
            }
            return Ok(packets.len());
        }
        let mut head = [0u8; gro::HEADER_MAX];
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(66);
        let writes = gro.plan(packets);
        for w in writes {
            let n = Coalescer::header(w, packets[w.head].as_ref(), &mut head);
            iov.clear();
            iov.push(iovec(&head[..n]));
            for (p, r) in &w.parts {
                iov.push(iovec(&packets[*p].as_ref()[r.clone()]));
            }
            write_all(fd, &mut iov)?;
        }
        Ok(writes.len())
    }
}

fn iovec(b: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    }
}

/// One packet written whole, waiting while the queue is full; a packet the kernel refuses
/// (a link that is down, a malformed one) is dropped as a network drops it.
fn write_all(fd: &OwnedFd, iov: &mut [libc::iovec]) -> io::Result<()> {
    loop {
        // SAFETY: the iovecs point at live buffers of the lengths they state.
        let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
        if n >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => {
                wait(fd, libc::POLLOUT, 100)?;
            }
            Some(libc::EINVAL) | Some(libc::EIO) | Some(libc::EMSGSIZE) => return Ok(()),
            _ => return Err(err),
        }
    }
}

/// Waits up to `timeout_ms` for `events` on `fd`; true when they came. A descriptor in error
/// or hung up (its interface deleted) is an error.
pub fn wait(fd: &impl AsRawFd, events: libc::c_short, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(err);
    }
    if pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADFD));
    }
    Ok(n > 0)
}
