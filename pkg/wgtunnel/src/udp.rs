//! The tunnel's UDP sockets: one listen port, on IPv4 and (where the namespace has it) IPv6.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use tunio::UdpSock;

/// The sockets of one listen port: IPv4 always, IPv6 when the namespace has it.
#[derive(Debug)]
pub struct Sockets {
    pub port: u16,
    pub v4: UdpSock,
    pub v6: Option<UdpSock>,
}

impl Sockets {
    /// Binds `port` on both families (0: one free port for both).
    pub fn bind(port: u16, fwmark: u32) -> io::Result<Sockets> {
        let mut last_err = None;
        for _ in 0..10 {
            let v4 = UdpSock::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
            let chosen = v4.local_addr()?.port();
            let v6 = match UdpSock::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, chosen))) {
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
            s.set_fwmark(mark)?;
        }
        Ok(())
    }

    pub fn for_addr(&self, addr: &SocketAddr) -> Option<&UdpSock> {
        match addr {
            SocketAddr::V4(_) => Some(&self.v4),
            SocketAddr::V6(_) => self.v6.as_ref(),
        }
    }

    /// Wakes threads blocked receiving on these sockets (they then see they are retired).
    pub fn shutdown(&self) {
        for s in std::iter::once(&self.v4).chain(self.v6.as_ref()) {
            s.shutdown();
        }
    }
}
