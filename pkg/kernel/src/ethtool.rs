//! A device's transmit checksum offload, through the ethtool ioctl (`ethtool -k` / `-K`'s
//! `tx-checksumming`): on some kernels and NICs the checksums of vxlan packets are left wrong
//! (flannel-io/flannel#2152, kubernetes#88986), and turning it off on the vxlan device is the
//! cure.

use crate::error::{Error, Result};
use nix::errno::Errno;
use std::os::fd::{AsRawFd, OwnedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with `ifr_data`, padded to the kernel's size.
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

/// A socket of this thread's namespace to ask the kernel about its devices.
fn socket() -> Result<OwnedFd> {
    nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::os("opening a socket for ethtool", "", e))
}

/// One ethtool value command on `dev`; the value the kernel left.
fn value(op: &str, dev: &str, cmd: u32, data: u32) -> Result<u32> {
    if dev.is_empty() || dev.len() >= libc::IFNAMSIZ {
        return Err(Error::invalid(op, dev, "not an interface name"));
    }
    let mut v = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: &mut v,
        _pad: [0; 16],
    };
    for (to, from) in req.name.iter_mut().zip(dev.bytes()) {
        *to = from as libc::c_char;
    }
    let sock = socket()?;
    // SAFETY: the request is an ifreq whose data points at a live ethtool_value.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req) };
    if r < 0 {
        return Err(Error::os(op, dev, Errno::last()));
    }
    Ok(v.data)
}

/// Whether `dev` offloads transmit checksums.
pub fn tx_checksum(dev: &str) -> Result<bool> {
    value(
        "reading the tx checksum offload of",
        dev,
        ETHTOOL_GTXCSUM,
        0,
    )
    .map(|d| d != 0)
}

/// Turns `dev`'s transmit checksum offload on or off (every tx checksum feature, as
/// `ethtool -K <dev> tx <on|off>`; off also takes segmentation offload with it).
pub fn set_tx_checksum(dev: &str, on: bool) -> Result<()> {
    value(
        "setting the tx checksum offload of",
        dev,
        ETHTOOL_STXCSUM,
        u32::from(on),
    )
    .map(|_| ())
}
