//! The reservation store: the only code that touches the files under the dataDir.
//!
//! The files are the Go plugin's, so a node can switch implementations in place:
//! `<dataDir>/<network>/<ip>` holding `<containerID>\r\n<ifname>` (no trailing newline),
//! `last_reserved_ip.<rangeset index>`, and `lock`, held with flock for each operation.
//!
//! A reservation file appears complete or not at all: its content is written to an
//! unnamed file (O_TMPFILE) that is then linked under the address's name, and the link
//! fails when the name exists, as O_EXCL would. Where O_TMPFILE is not available a
//! named temporary (`.host-local.tmp.*`) is linked instead and removed after; one left
//! by a crash is removed on the next rebuild.
//!
//! ADD makes its unnamed files before taking the lock ([`Store::open_to_reserve`]): creating
//! an inode is the slow part of a reservation (hundreds of microseconds on ext4, more while
//! the journal commits), and under the lock it made concurrent ADDs take turns for it. The
//! lock covers only the decision and the link. An unnamed file that is never linked
//! disappears with the process, also when it is killed.
//!
//! Lookups by key go through [`index::Index`] so that ADD and DEL do not read every
//! reservation; the index is checked against the directory on every open and rebuilt
//! from the files when anything but this store changed them.

pub mod index;

use crate::allocator::{Key, Reservations};
use cni_protocol::error::PLUGIN_NOT_AVAILABLE;
use cni_protocol::CniError;
use index::{key_hash, Index, Stamp, INDEX_NAME};
use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const LOCK_NAME: &str = "lock";
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
const TMP_PREFIX: &str = ".host-local.tmp.";
/// Consecutive taken addresses after which the walk skips the known ones in memory.
const MISSES_BEFORE_SKIPPING: u32 = 32;

fn io_err(what: impl std::fmt::Display, e: io::Error) -> CniError {
    CniError::io(format!("{what}: {e}"))
}

/// A file's content as the Go plugin compares it: surrounding whitespace trimmed.
fn trimmed(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

/// A file name that is a reservation: an address exactly as Go prints it.
fn reservation_ip(name: &str) -> Option<IpAddr> {
    let ip: IpAddr = name.parse().ok()?;
    (ip.to_string() == name).then_some(ip)
}

/// The kernel's id of this boot: an index made before a reboot is not trusted.
fn boot_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(text) = read_small(Path::new("/proc/sys/kernel/random/boot_id")) {
        let hex: Vec<u8> = text.into_iter().filter(u8::is_ascii_hexdigit).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            let s = std::str::from_utf8(pair).unwrap_or("0");
            id[i] = u8::from_str_radix(s, 16).unwrap_or(0);
        }
    }
    id
}

/// A file of at most a few dozen bytes, in one read (std's `read` also stats it first).
fn read_small(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let mut buf = [0u8; 128];
    let mut len = 0;
    loop {
        let n = f.read(&mut buf[len..])?;
        len += n;
        if n == 0 || len == buf.len() {
            break;
        }
    }
    Ok(buf[..len].to_vec())
}

fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

/// An unnamed file (O_TMPFILE, mode 0600) in `dir` holding `content`, for linking later.
fn unnamed_file(dir: &Path, content: &[u8]) -> io::Result<File> {
    let mut f = OpenOptions::new()
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)?;
    f.write_all(content)?;
    Ok(f)
}

/// One reservation found on disk.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub ip: IpAddr,
    /// The trimmed content: `<containerID>\r\n<ifname>`, or a container ID alone.
    pub content: Vec<u8>,
}

/// How unnamed files are linked into the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkMode {
    TmpFile,
    NamedTemp,
}

/// An open, locked network directory.
pub struct Store {
    dir: PathBuf,
    dir_file: File,
    /// Held with flock until the store is dropped.
    _lock: File,
    index: Index,
    boot: [u8; 16],
    /// Whether this session changed the files or the index (the index is then unsealed).
    changed: bool,
    /// Whether the index was rebuilt from the files in this session.
    rebuilt: bool,
    closed: bool,
    link_mode: LinkMode,
    misses: u32,
    known_taken: Option<HashSet<IpAddr>>,
    /// Unnamed files made before the lock, each holding `prepared_content`, to be linked.
    prepared: Vec<File>,
    prepared_content: Vec<u8>,
}

impl Store {
    /// Opens `<dataDir>/<network>`, creating it (0755) when missing, and takes its lock.
    pub fn open(dir: &Path) -> Result<Store, CniError> {
        Self::open_to_reserve(dir, None, 0)
    }

    /// As [`Store::open`], for ADD: first, outside the lock, makes `count` unnamed files
    /// holding `key`'s record (one per address ADD will reserve), so that under the lock a
    /// reservation is only a link.
    pub fn open_to_reserve(dir: &Path, key: Option<&Key>, count: usize) -> Result<Store, CniError> {
        if !dir.is_dir() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| io_err(format!("creating {}", dir.display()), e))?;
        }
        let content = key.map(|k| k.record().into_bytes()).unwrap_or_default();
        let mut prepared = Vec::with_capacity(count);
        for _ in 0..count {
            match unnamed_file(dir, &content) {
                Ok(f) => prepared.push(f),
                // Made under the lock instead, or by a named temporary where unsupported.
                Err(_) => break,
            }
        }
        let mut store = Self::lock_and_load(dir, LinkMode::TmpFile)?;
        store.prepared = prepared;
        store.prepared_content = content;
        Ok(store)
    }

    /// Opens an existing network directory; None when there is none (nothing is held there).
    pub fn open_existing(dir: &Path) -> Result<Option<Store>, CniError> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => Self::lock_and_load(dir, LinkMode::TmpFile).map(Some),
            Ok(_) => Err(CniError::io(format!(
                "{} is not a directory",
                dir.display()
            ))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("reading {}", dir.display()), e)),
        }
    }

    /// As [`Store::open`], with named temporaries instead of O_TMPFILE (for tests of that path).
    pub fn open_with_named_temporaries(dir: &Path) -> Result<Store, CniError> {
        let mut s = Self::open(dir)?;
        s.link_mode = LinkMode::NamedTemp;
        Ok(s)
    }

    fn lock_and_load(dir: &Path, link_mode: LinkMode) -> Result<Store, CniError> {
        let dir_file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
            .map_err(|e| io_err(format!("opening {}", dir.display()), e))?;
        let boot = boot_id();
        let lock_path = dir.join(LOCK_NAME);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_err(format!("opening {}", lock_path.display()), e))?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io_err(format!("locking {}", lock_path.display()), e));
            }
        }
        let mut store = Store {
            dir: dir.to_path_buf(),
            dir_file,
            _lock: lock,
            index: Index::build_empty(dir),
            boot,
            changed: false,
            rebuilt: false,
            closed: false,
            link_mode,
            misses: 0,
            known_taken: None,
            prepared: Vec::new(),
            prepared_content: Vec::new(),
        };
        let stamp = store.stamp()?;
        match Index::load(dir, &stamp) {
            Some(index) => store.index = index,
            None => store.rebuild()?,
        }
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn stamp(&self) -> Result<Stamp, CniError> {
        let m = self
            .dir_file
            .metadata()
            .map_err(|e| io_err(format!("reading {}", self.dir.display()), e))?;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime_sec: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            boot: self.boot,
        })
    }

    /// Before the first change of a session: the index stops being trusted until sealed.
    fn begin_change(&mut self) -> Result<(), CniError> {
        if !self.changed {
            self.index
                .mark_dirty()
                .map_err(|e| io_err("marking the reservation index as changing", e))?;
            self.changed = true;
        }
        Ok(())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Every reservation file, read; leftover temporaries are removed on the way.
    pub fn scan(&mut self) -> Result<Vec<Reservation>, CniError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| io_err(format!("listing {}", self.dir.display()), e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io_err(format!("listing {}", self.dir.display()), e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TMP_PREFIX) {
                self.begin_change()?;
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Some(ip) = reservation_ip(name) else {
                continue;
            };
            if !entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                continue;
            }
            match std::fs::read(entry.path()) {
                Ok(bytes) => out.push(Reservation {
                    ip,
                    content: trimmed(&bytes).to_vec(),
                }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(format!("reading {}", entry.path().display()), e)),
            }
        }
        Ok(out)
    }

    /// Rebuilds the index from the files.
    fn rebuild(&mut self) -> Result<(), CniError> {
        let found = self.scan()?;
        self.index_these(&found)
    }

    fn index_these(&mut self, found: &[Reservation]) -> Result<(), CniError> {
        let records: Vec<(u64, IpAddr)> =
            found.iter().map(|r| (key_hash(&r.content), r.ip)).collect();
        self.index = Index::build(&self.dir, &records)
            .map_err(|e| io_err(format!("writing {}", self.path(INDEX_NAME).display()), e))?;
        self.changed = true;
        self.rebuilt = true;
        self.known_taken = None;
        Ok(())
    }

    /// The trimmed content of `ip`'s reservation, None when there is no file.
    fn content_of(&self, ip: IpAddr) -> Result<Option<Vec<u8>>, CniError> {
        let path = self.path(&ip.to_string());
        match std::fs::read(&path) {
            Ok(b) => Ok(Some(trimmed(&b).to_vec())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("reading {}", path.display()), e)),
        }
    }

    /// The addresses whose files hold exactly `content`, through the index and checked on disk.
    /// A record that the files contradict means the index is stale: it is rebuilt and asked again.
    fn find(&mut self, content: &[u8]) -> Result<Vec<IpAddr>, CniError> {
        let hash = key_hash(content);
        loop {
            let candidates = self
                .index
                .lookup(hash)
                .map_err(|e| io_err("reading the reservation index", e))?;
            let mut found = Vec::with_capacity(candidates.len());
            let mut stale = false;
            for ip in candidates {
                match self.content_of(ip)? {
                    Some(c) if c == content => found.push(ip),
                    // Another key with the same hash.
                    Some(c) if key_hash(&c) == hash => {}
                    _ => stale = true,
                }
            }
            if !stale || self.rebuilt {
                return Ok(found);
            }
            self.rebuild()?;
        }
    }

    /// Removes the files of `ips`, which hold `content`.
    fn remove(&mut self, content: &[u8], ips: &[IpAddr]) -> Result<(), CniError> {
        let hash = key_hash(content);
        for ip in ips {
            self.begin_change()?;
            let path = self.path(&ip.to_string());
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_err(format!("removing {}", path.display()), e))
                }
                _ => {}
            }
            self.index
                .remove(hash, *ip)
                .map_err(|e| io_err("updating the reservation index", e))?;
            if let Some(t) = &mut self.known_taken {
                t.remove(ip);
            }
        }
        Ok(())
    }

    /// DEL: releases what `key` holds, or when it holds nothing, what its container ID
    /// holds in the one-line format. Returns the released addresses (none is success).
    pub fn release(&mut self, key: &Key) -> Result<Vec<IpAddr>, CniError> {
        let record = key.record();
        let ips = self.find(record.as_bytes())?;
        if !ips.is_empty() {
            self.remove(record.as_bytes(), &ips)?;
            return Ok(ips);
        }
        let legacy = key.legacy_record().as_bytes();
        let ips = self.find(legacy)?;
        self.remove(legacy, &ips)?;
        Ok(ips)
    }

    /// CHECK: whether `key` (or its container ID, in the one-line format) holds an address.
    pub fn holds(&mut self, key: &Key) -> Result<bool, CniError> {
        Ok(!self.held_by(key)?.is_empty())
    }

    /// GC: releases every reservation not held by one of `valid` (a one-line reservation is
    /// kept when its container ID is valid). Returns the released addresses, or every failure.
    pub fn gc(&mut self, valid: &[Key]) -> Result<Vec<IpAddr>, Vec<String>> {
        let records: HashSet<Vec<u8>> = valid.iter().map(|k| k.record().into_bytes()).collect();
        let ids: HashSet<&[u8]> = valid.iter().map(|k| k.container_id.as_bytes()).collect();
        let found = self.scan().map_err(|e| vec![e.msg])?;
        let mut kept = Vec::with_capacity(found.len());
        let mut released = Vec::new();
        let mut failures = Vec::new();
        let mut found = found.into_iter();
        while let Some(r) = found.next() {
            if records.contains(&r.content) || ids.contains(r.content.as_slice()) {
                kept.push(r);
                continue;
            }
            if let Err(e) = self.begin_change() {
                // Nothing more is removed, and the index made below must still hold
                // every reservation left on disk.
                failures.push(e.msg);
                kept.push(r);
                kept.extend(found);
                break;
            }
            let path = self.path(&r.ip.to_string());
            match std::fs::remove_file(&path) {
                Ok(()) => released.push(r.ip),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    failures.push(format!("releasing {} ({}): {e}", r.ip, path.display()));
                    kept.push(r);
                }
            }
        }
        if let Err(e) = self.index_these(&kept) {
            failures.push(e.msg);
        }
        if failures.is_empty() {
            Ok(released)
        } else {
            Err(failures)
        }
    }

    /// Writes `content` to a new file named `name`; false when the name exists.
    fn create_exclusive(&mut self, name: &str, content: &[u8]) -> Result<bool, CniError> {
        if self.link_mode == LinkMode::TmpFile {
            match self.link_tmpfile(name, content) {
                Ok(done) => return Ok(done),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                    ) =>
                {
                    self.link_mode = LinkMode::NamedTemp;
                }
                Err(e) => return Err(io_err(format!("creating {}", self.path(name).display()), e)),
            }
        }
        self.link_named_temp(name, content)
            .map_err(|e| io_err(format!("creating {}", self.path(name).display()), e))
    }

    fn link_tmpfile(&mut self, name: &str, content: &[u8]) -> io::Result<bool> {
        let prepared = (content == self.prepared_content)
            .then(|| self.prepared.pop())
            .flatten();
        let f = match prepared {
            Some(f) => f,
            None => unnamed_file(&self.dir, content)?,
        };
        let linked = self.link_unnamed(&f, name);
        if matches!(linked, Ok(false)) {
            // Still unnamed: the next candidate address can have it.
            self.prepared.push(f);
        }
        linked
    }

    /// Gives the unnamed file `f` the name `name`; false when the name exists.
    fn link_unnamed(&self, f: &File, name: &str) -> io::Result<bool> {
        let target = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: valid descriptors and NUL-terminated paths.
        let rc = unsafe {
            libc::linkat(
                f.as_raw_fd(),
                c"".as_ptr(),
                self.dir_file.as_raw_fd(),
                target.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = last_os_error();
        match e.raw_os_error() {
            Some(libc::EEXIST) => Ok(false),
            // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc gives the same without it.
            Some(libc::EPERM | libc::ENOENT) => {
                let proc_path = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))
                    .map_err(|_| io::ErrorKind::InvalidInput)?;
                // SAFETY: as above.
                let rc = unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        proc_path.as_ptr(),
                        self.dir_file.as_raw_fd(),
                        target.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                };
                if rc == 0 {
                    return Ok(true);
                }
                let e = last_os_error();
                match e.raw_os_error() {
                    Some(libc::EEXIST) => Ok(false),
                    Some(libc::ENOENT) => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
                    _ => Err(e),
                }
            }
            _ => Err(e),
        }
    }

    fn link_named_temp(&self, name: &str, content: &[u8]) -> io::Result<bool> {
        let tmp = self.path(&format!("{TMP_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let linked = f
            .write_all(content)
            .and_then(|_| std::fs::hard_link(&tmp, self.path(name)));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Stamps the directory so that the next open can tell whether anything else changed it,
    /// and seals the index with that stamp. Errors only cost a rebuild next time.
    fn seal(&mut self) -> Result<(), CniError> {
        if !self.changed {
            return Ok(());
        }
        if self.index.is_empty() {
            return self
                .index
                .discard()
                .map_err(|e| io_err(format!("removing {}", self.path(INDEX_NAME).display()), e));
        }
        // A time in the past that no later change by anyone else can produce: any create or
        // unlink after this sets the mtime to "now", which differs.
        let mark = SystemTime::now()
            .checked_sub(Duration::from_secs(2))
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .unwrap_or_default();
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: mark.as_secs() as libc::time_t,
                tv_nsec: mark.subsec_nanos() as libc::c_long,
            },
        ];
        // SAFETY: a descriptor we own and a two-element array, as futimens requires.
        if unsafe { libc::futimens(self.dir_file.as_raw_fd(), times.as_ptr()) } != 0 {
            return Err(io_err(
                format!("stamping {}", self.dir.display()),
                last_os_error(),
            ));
        }
        let stamp = self.stamp()?;
        self.index
            .seal(&stamp)
            .map_err(|e| io_err("sealing the reservation index", e))
    }

    /// Seals the index and releases the lock. Failures only cost a rebuild on the next open.
    pub fn close(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        if let Err(e) = self.seal() {
            eprintln!("host-local: the reservation index will be rebuilt: {e}");
        }
    }

    fn last_reserved_path(&self, set: usize) -> PathBuf {
        self.path(&format!("{LAST_RESERVED_PREFIX}{set}"))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Reservations for Store {
    fn reserve(&mut self, key: &Key, ip: IpAddr) -> Result<bool, CniError> {
        if self.known_taken.as_ref().is_some_and(|t| t.contains(&ip)) {
            return Ok(false);
        }
        self.begin_change()?;
        let record = key.record();
        if !self.create_exclusive(&ip.to_string(), record.as_bytes())? {
            self.misses += 1;
            if self.misses == MISSES_BEFORE_SKIPPING && self.known_taken.is_none() {
                let all = self
                    .index
                    .all()
                    .map_err(|e| io_err("reading the reservation index", e))?;
                self.known_taken = Some(all.into_iter().map(|(_, ip)| ip).collect());
            }
            return Ok(false);
        }
        self.misses = 0;
        self.index
            .insert(key_hash(record.as_bytes()), ip)
            .map_err(|e| io_err("updating the reservation index", e))?;
        if let Some(t) = &mut self.known_taken {
            t.insert(ip);
        }
        Ok(true)
    }

    fn release_ip(&mut self, key: &Key, ip: IpAddr) -> Result<(), CniError> {
        let record = key.record();
        if self.content_of(ip)?.as_deref() == Some(record.as_bytes()) {
            self.remove(record.as_bytes(), &[ip])?;
        }
        Ok(())
    }

    fn held_by(&mut self, key: &Key) -> Result<Vec<IpAddr>, CniError> {
        let mut ips = self.find(key.record().as_bytes())?;
        ips.extend(self.find(key.legacy_record().as_bytes())?);
        Ok(ips)
    }

    fn last_reserved(&mut self, set: usize) -> Option<IpAddr> {
        let bytes = read_small(&self.last_reserved_path(set)).ok()?;
        let text = std::str::from_utf8(&bytes).ok()?;
        text.trim().parse().ok().map(crate::ip::canonical)
    }

    fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<(), CniError> {
        self.begin_change()?;
        let path = self.last_reserved_path(set);
        let text = ip.to_string();
        // Rewritten in place: on ext4, truncating a file to zero and writing it again
        // forces its blocks out on close, which costs milliseconds under load. A torn
        // write only loses the round-robin position: the Go plugin and this one then
        // start from the range's beginning.
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .and_then(|f| {
                f.write_all_at(text.as_bytes(), 0)?;
                f.set_len(text.len() as u64)
            })
            .map_err(|e| io_err(format!("writing {}", path.display()), e))
    }
}

/// STATUS: the addresses reserved in a network directory, from the file names alone and
/// without the lock (a reservation appears whole, by a link); none when there is no directory.
pub fn reserved_addresses(dir: &Path) -> Result<HashSet<IpAddr>, CniError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(io_err(format!("listing {}", dir.display()), e)),
    };
    let mut out = HashSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_err(format!("listing {}", dir.display()), e))?;
        if let Some(ip) = entry.file_name().to_str().and_then(reservation_ip) {
            out.insert(ip);
        }
    }
    Ok(out)
}

/// STATUS: the dataDir exists as a writable directory, or can be created.
pub fn check_usable(data_dir: &Path) -> Result<(), CniError> {
    let unavailable = |why: String| {
        CniError::new(
            PLUGIN_NOT_AVAILABLE,
            format!(
                "dataDir {:?} is not usable: {why}",
                data_dir.display().to_string()
            ),
        )
    };
    let mut probe = data_dir;
    loop {
        match std::fs::metadata(probe) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(unavailable(format!(
                    "{} is not a directory",
                    probe.display()
                )))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                match probe.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => probe = parent,
                    _ => return Err(unavailable(e.to_string())),
                }
            }
            Err(e) => return Err(unavailable(e.to_string())),
        }
    }
    let c = CString::new(probe.as_os_str().as_bytes()).map_err(|e| unavailable(e.to_string()))?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(unavailable(format!(
            "{} is not writable: {}",
            probe.display(),
            last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn both_ways_of_linking_write_complete_files_and_refuse_taken_names() {
        for named in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("net");
            let mut s = if named {
                Store::open_with_named_temporaries(&dir).unwrap()
            } else {
                Store::open(&dir).unwrap()
            };
            let k = Key::new("ctr", "eth0");
            assert!(s.reserve(&k, ip("10.0.0.2")).unwrap());
            assert!(!s
                .reserve(&Key::new("other", "eth0"), ip("10.0.0.2"))
                .unwrap());
            s.set_last_reserved(0, ip("10.0.0.2")).unwrap();
            s.close();
            assert_eq!(std::fs::read(dir.join("10.0.0.2")).unwrap(), b"ctr\r\neth0");
            let mode = std::fs::metadata(dir.join("10.0.0.2"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
            assert_eq!(
                names(&dir),
                [
                    ".host-local.index",
                    "10.0.0.2",
                    "last_reserved_ip.0",
                    "lock"
                ],
                "named temporaries: {named}"
            );
        }
    }

    #[test]
    fn files_made_before_the_lock_are_linked_and_a_taken_name_keeps_them_for_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("net");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("10.0.0.2"), "someone\r\neth0").unwrap();
        let k = Key::new("ctr", "eth0");
        let mut s = Store::open_to_reserve(&dir, Some(&k), 2).unwrap();
        assert_eq!(s.prepared.len(), 2);
        // A taken name leaves the prepared file unnamed and ready for the next address.
        assert!(!s.reserve(&k, ip("10.0.0.2")).unwrap());
        assert_eq!(s.prepared.len(), 2);
        assert!(s.reserve(&k, ip("10.0.0.3")).unwrap());
        assert!(s.reserve(&k, ip("fd00::3")).unwrap());
        assert!(s.prepared.is_empty());
        // Once they are used up, a file is made under the lock as before.
        assert!(s.reserve(&k, ip("10.0.0.4")).unwrap());
        s.close();
        for name in ["10.0.0.3", "fd00::3", "10.0.0.4"] {
            assert_eq!(
                std::fs::read(dir.join(name)).unwrap(),
                b"ctr\r\neth0",
                "{name}"
            );
        }
        assert_eq!(
            std::fs::read(dir.join("10.0.0.2")).unwrap(),
            b"someone\r\neth0"
        );

        // Files never linked leave nothing behind.
        let s = Store::open_to_reserve(&dir, Some(&Key::new("unused", "eth0")), 2).unwrap();
        drop(s);
        assert_eq!(
            names(&dir),
            [
                ".host-local.index",
                "10.0.0.2",
                "10.0.0.3",
                "10.0.0.4",
                "fd00::3",
                "lock"
            ]
        );
    }

    #[test]
    fn last_reserved_is_rewritten_in_place_to_the_exact_text() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Store::open(tmp.path()).unwrap();
        s.set_last_reserved(3, ip("10.0.0.100")).unwrap();
        s.set_last_reserved(3, ip("10.0.0.9")).unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("last_reserved_ip.3")).unwrap(),
            b"10.0.0.9"
        );
        assert_eq!(s.last_reserved(3), Some(ip("10.0.0.9")));
        std::fs::write(tmp.path().join("last_reserved_ip.3"), "10.0.0.9990").unwrap();
        assert_eq!(s.last_reserved(3), None);
    }

    #[test]
    fn the_index_is_dropped_when_the_network_empties() {
        let tmp = tempfile::tempdir().unwrap();
        let k = Key::new("a", "eth0");
        let mut s = Store::open(tmp.path()).unwrap();
        s.reserve(&k, ip("10.0.0.2")).unwrap();
        s.close();
        assert!(tmp.path().join(INDEX_NAME).exists());
        let mut s = Store::open(tmp.path()).unwrap();
        assert_eq!(s.release(&k).unwrap(), [ip("10.0.0.2")]);
        s.close();
        assert_eq!(names(tmp.path()), ["lock"]);
    }

    #[test]
    fn a_sealed_index_is_reused_and_anything_else_is_rebuilt() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (Key::new("a", "eth0"), Key::new("b", "eth0"));
        let mut s = Store::open(tmp.path()).unwrap();
        s.reserve(&a, ip("10.0.0.2")).unwrap();
        s.close();

        let s = Store::open(tmp.path()).unwrap();
        assert!(!s.rebuilt, "sealed and unchanged: trusted");
        drop(s);

        // A write by someone else right away: the directory's mtime no longer matches.
        std::fs::write(tmp.path().join("10.0.0.3"), "b\r\neth0").unwrap();
        let mut s = Store::open(tmp.path()).unwrap();
        assert!(s.rebuilt);
        assert_eq!(s.held_by(&b).unwrap(), [ip("10.0.0.3")]);
        s.close();

        // A crash mid-change leaves the dirty flag set.
        let s = Store::open(tmp.path()).unwrap();
        assert!(!s.rebuilt);
        s.index.mark_dirty().unwrap();
        let mut s = s;
        s.closed = true; // dies here without sealing
        drop(s);
        let mut s = Store::open(tmp.path()).unwrap();
        assert!(s.rebuilt);
        assert!(s.holds(&a).unwrap() && s.holds(&b).unwrap());
    }

    #[test]
    fn a_record_the_files_contradict_triggers_a_rebuild() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Key::new("a", "eth0");
        let mut s = Store::open(tmp.path()).unwrap();
        s.reserve(&a, ip("10.0.0.2")).unwrap();
        s.close();
        // Rewritten in place: the directory does not change, the content does.
        std::fs::write(tmp.path().join("10.0.0.2"), "z\r\neth0").unwrap();
        let mut s = Store::open(tmp.path()).unwrap();
        assert!(!s.rebuilt);
        assert!(!s.holds(&a).unwrap());
        assert!(s.rebuilt);
        assert!(s.holds(&Key::new("z", "eth0")).unwrap());
    }

    #[test]
    fn gc_that_cannot_start_changing_keeps_every_reservation_in_the_index() {
        let tmp = tempfile::tempdir().unwrap();
        let keys: Vec<Key> = (0..20)
            .map(|i| Key::new(&format!("c{i}"), "eth0"))
            .collect();
        let mut s = Store::open(tmp.path()).unwrap();
        for (i, k) in keys.iter().enumerate() {
            assert!(s.reserve(k, ip(&format!("10.0.0.{}", i + 2))).unwrap());
        }
        s.close();

        let mut s = Store::open(tmp.path()).unwrap();
        assert!(!s.rebuilt);
        s.index.make_read_only_for_test();
        // Every other key is gone: the first one met cannot mark the index dirty.
        let valid: Vec<Key> = keys.iter().step_by(2).cloned().collect();
        let failures = s.gc(&valid).unwrap_err();
        assert!(
            failures[0].contains("marking the reservation index"),
            "{failures:?}"
        );
        s.close();

        // The index sealed by that GC still finds every reservation, without a rebuild.
        let mut s = Store::open(tmp.path()).unwrap();
        assert!(!s.rebuilt);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.held_by(k).unwrap(), [ip(&format!("10.0.0.{}", i + 2))]);
        }
        assert!(!s.rebuilt);
        assert_eq!(s.release(&keys[1]).unwrap(), [ip("10.0.0.3")]);
    }

    #[test]
    fn temporaries_left_by_a_crash_are_removed_on_rebuild() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(".host-local.tmp.12345"), "half").unwrap();
        let s = Store::open(tmp.path()).unwrap();
        s.close();
        assert_eq!(names(tmp.path()), ["lock"]);
    }

    #[test]
    fn many_taken_addresses_are_skipped_in_memory_after_a_while() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Store::open(tmp.path()).unwrap();
        let holder = Key::new("h", "eth0");
        for i in 2..200u32 {
            s.reserve(&holder, ip(&format!("10.0.0.{i}"))).unwrap();
        }
        let k = Key::new("k", "eth0");
        for i in 2..200u32 {
            assert!(!s.reserve(&k, ip(&format!("10.0.0.{i}"))).unwrap());
        }
        assert!(s.known_taken.is_some());
        assert!(s.reserve(&k, ip("10.0.0.200")).unwrap());
        assert!(!s.reserve(&holder, ip("10.0.0.200")).unwrap());
    }

    #[test]
    fn status_wants_a_writable_directory_or_a_place_to_make_one() {
        let tmp = tempfile::tempdir().unwrap();
        check_usable(&tmp.path().join("a/b/c")).unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "").unwrap();
        let e = check_usable(&file.join("x")).unwrap_err();
        assert_eq!(e.code, 50);
        assert!(e.msg.contains("is not a directory"), "{}", e.msg);
    }
}
