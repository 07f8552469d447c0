//! The TUN device the userspace tunnel reads pod packets from and writes them to.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens `queues` queues of TUN device `name` (made if missing, gone when the last queue
/// closes), each non-blocking so a reader can drain a burst and then wait in poll.
pub fn open(name: &str, queues: usize) -> io::Result<Vec<OwnedFd>> {
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
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    (0..queues.max(1))
        .map(|_| {
            let file: File = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open("/dev/net/tun")?;
            // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is laid out as.
            if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: into_raw_fd hands over sole ownership of an open descriptor.
            Ok(unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(file)) })
        })
        .collect()
}

/// Reads one packet; Ok(None) when none is waiting.
pub fn read(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(err),
        }
    }
}

/// Writes one packet, waiting while the queue is full; a dropped packet is not an error.
pub fn write(fd: &OwnedFd, packet: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: packet is valid for reads of its length.
        let n = unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
        if n >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {
                wait(fd, libc::POLLOUT, 100)?;
            }
            // The kernel refuses packets it cannot route (e.g. the link is down): drop them.
            _ if err.raw_os_error() == Some(libc::EINVAL) => return Ok(()),
            _ => return Err(err),
        }
    }
}

/// Waits up to `timeout_ms` for `events` on `fd`; true when they came.
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
