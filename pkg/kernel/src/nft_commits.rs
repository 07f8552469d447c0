//! The commits that touched one nftables table, as the kernel announces them to listeners of
//! nfnetlink's nftables group: every object a commit adds or deletes, then the new generation
//! with the process that committed it. So a daemon that owns a table learns at once that
//! someone else changed it (the commits of its own `nft` runs it tells by their process id),
//! instead of reading the table back on a timer.

use crate::error::{Error, Result};
use nix::errno::Errno;
use nix::libc;
use nix::sys::socket::{
    bind, recv, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use std::os::fd::{AsRawFd, OwnedFd};

/// nfnetlink's subsystem of nf_tables, in a message type's high byte.
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The multicast group of nf_tables' notifications.
const NFNLGRP_NFTABLES: u32 = 7;
const NFT_MSG_NEWGEN: u16 = 15;
/// NEWGEN's attribute: the committing process's id.
const NFTA_GEN_PROC_PID: u16 = 2;
/// Every other notification's first attribute: the table's name.
const NFTA_TABLE: u16 = 1;
pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NFGENMSG_LEN: usize = 4;
/// The receive buffer asked for: a commit of many elements announces each of them.
const RCVBUF: libc::c_int = 8 << 20;

/// A commit that touched the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Made by this process id (0 when the kernel did not say).
    By(u32),
    /// Announcements were lost (the socket's buffer overflowed): the table may have changed.
    Lost,
}

/// The commits touching the table `name` of nftables family `family` (`inet`, `ip`, `ip6`).
pub struct TableCommits {
    fd: OwnedFd,
    family: u8,
    table: Vec<u8>,
    buf: Vec<u8>,
    /// Messages received but not yet looked at: (start, end) in `buf`.
    pending: (usize, usize),
    touched: bool,
}

pub(crate) fn family_number(family: &str) -> Option<u8> {
    match family {
        "inet" => Some(1),
        "ip" => Some(2),
        "arp" => Some(3),
        "netdev" => Some(5),
        "bridge" => Some(7),
        "ip6" => Some(10),
        _ => None,
    }
}

fn setsockopt_int(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> Errno {
    // SAFETY: fd is an open socket and the option value is a c_int that outlives the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Errno::UnknownErrno
    } else {
        Errno::last()
    }
}

/// An nfnetlink socket bound in this thread's network namespace; `what` names its use in errors.
pub(crate) fn nfnetlink_socket(what: &str) -> Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(|e| Error::os("opening an nfnetlink socket for", what, e))?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
        .map_err(|e| Error::os("binding an nfnetlink socket for", what, e))?;
    Ok(fd)
}

impl TableCommits {
    /// Listens in this thread's network namespace.
    pub fn subscribe(family: &str, table: &str) -> Result<TableCommits> {
        let what = format!("table {family} {table}");
        let family = family_number(family)
            .ok_or_else(|| Error::invalid("watching", &what, "no such nftables family"))?;
        let fd = nfnetlink_socket(&what)?;
        let group = NFNLGRP_NFTABLES as libc::c_int;
        let e = setsockopt_int(&fd, libc::SOL_NETLINK, libc::NETLINK_ADD_MEMBERSHIP, group);
        if e != Errno::UnknownErrno {
            return Err(Error::os("joining nf_tables' notifications for", &what, e));
        }
        // Root may go past rmem_max; otherwise the default buffer, and Lost when it overflows.
        let _ = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF);
        Ok(TableCommits {
            fd,
            family,
            table: table.as_bytes().to_vec(),
            buf: vec![0; 1 << 16],
            pending: (0, 0),
            touched: false,
        })
    }

    /// Blocks until the next commit that touched the table.
    pub fn wait(&mut self) -> Result<Commit> {
        loop {
            while self.pending.0 < self.pending.1 {
                let (start, end) = self.pending;
                let msg = &self.buf[start..end];
                if msg.len() < NLMSG_HDRLEN {
                    self.pending = (end, end);
                    break;
                }
                let len = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize;
                let len = len.clamp(NLMSG_HDRLEN, msg.len());
                self.pending.0 = start + len.next_multiple_of(4).min(msg.len());
                let seen = Seen {
                    family: self.family,
                    table: &self.table,
                };
                if let Some(c) = seen.look(&msg[..len], &mut self.touched) {
                    return Ok(c);
                }
            }
            match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                Ok(n) => self.pending = (0, n),
                Err(Errno::ENOBUFS) => {
                    self.touched = false;
                    return Ok(Commit::Lost);
                }
                Err(Errno::EINTR) => {}
                Err(e) => {
                    return Err(Error::os(
                        "reading nf_tables' notifications of",
                        "the table",
                        e,
                    ))
                }
            }
        }
    }
}

/// The table the messages are looked through for.
struct Seen<'a> {
    family: u8,
    table: &'a [u8],
}

impl Seen<'_> {
    /// One message: a commit when it ends one that touched the table (`touched` says whether
    /// one of the commit's earlier messages did).
    fn look(&self, msg: &[u8], touched: &mut bool) -> Option<Commit> {
        let kind = u16::from_ne_bytes([msg[4], msg[5]]);
        if kind >> 8 != NFNL_SUBSYS_NFTABLES || msg.len() < NLMSG_HDRLEN + NFGENMSG_LEN {
            return None;
        }
        let family = msg[NLMSG_HDRLEN];
        let attrs = &msg[NLMSG_HDRLEN + NFGENMSG_LEN..];
        if kind & 0xff == NFT_MSG_NEWGEN {
            let pid = attr(attrs, NFTA_GEN_PROC_PID)
                .filter(|a| a.len() >= 4)
                .map(|a| u32::from_be_bytes([a[0], a[1], a[2], a[3]]))
                .unwrap_or(0);
            return std::mem::take(touched).then_some(Commit::By(pid));
        }
        let name = attr(attrs, NFTA_TABLE).map(|a| a.split(|b| *b == 0).next().unwrap_or(a));
        if family == self.family && name == Some(self.table) {
            *touched = true;
        }
        None
    }
}

/// The payload of the first attribute of type `kind` (flags masked off).
fn attr(mut attrs: &[u8], kind: u16) -> Option<&[u8]> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let t = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if t == kind {
            return Some(&attrs[4..len]);
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr_bytes(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        a.extend(kind.to_ne_bytes());
        a.extend(payload);
        while !a.len().is_multiple_of(4) {
            a.push(0);
        }
        a
    }

    fn message(msg: u16, family: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = attrs.concat();
        let len = NLMSG_HDRLEN + NFGENMSG_LEN + body.len();
        let mut m = (len as u32).to_ne_bytes().to_vec();
        m.extend((NFNL_SUBSYS_NFTABLES << 8 | msg).to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend([family, 0, 0, 0]);
        m.extend(body);
        m
    }

    #[test]
    fn a_commit_counts_when_one_of_its_messages_names_the_table() {
        let c = Seen {
            family: 1,
            table: b"t",
        };
        let mut touched = false;
        let mut look = |m: Vec<u8>| c.look(&m, &mut touched);
        let newgen = |pid: u32| {
            message(
                NFT_MSG_NEWGEN,
                0,
                &[
                    attr_bytes(1, &7u32.to_be_bytes()),
                    attr_bytes(2, &pid.to_be_bytes()),
                ],
            )
        };
        // Another table's rule, then the generation: nothing.
        assert_eq!(look(message(6, 1, &[attr_bytes(1, b"other\0")])), None);
        assert_eq!(look(newgen(42)), None);
        // This table's element (in another family: no), then this family's: the commit by 42.
        assert_eq!(look(message(12, 2, &[attr_bytes(1, b"t\0")])), None);
        assert_eq!(look(newgen(42)), None);
        assert_eq!(look(message(12, 1, &[attr_bytes(1, b"t\0")])), None);
        assert_eq!(look(newgen(42)), Some(Commit::By(42)));
        assert_eq!(look(newgen(42)), None, "each commit once");
    }
}
