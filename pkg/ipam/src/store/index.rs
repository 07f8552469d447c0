//! The reservation index: an open-addressing hash table in one file of the network
//! directory, mapping a reservation's content (its key) to the addresses it holds.
//!
//! It only caches what the reservation files say. The header records the directory's
//! identity and the modification time the store stamped on it when the index was last
//! made consistent, and the boot it was made in; anything else (a write by the Go
//! plugin, a crash that left the `dirty` flag set, a reboot) makes the store rebuild it
//! from the files.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Not an address, not `lock`, not `last_reserved_ip.*`: the Go plugin never mistakes it for a reservation.
pub const INDEX_NAME: &str = ".host-local.index";

const MAGIC: &[u8; 8] = b"HLIDX\0\0\x01";
const HEADER_LEN: u64 = 128;
const SLOT_LEN: u64 = 32;
const MIN_CAPACITY: u64 = 64;
/// Slots read per probe step.
const PROBE_BLOCK: u64 = 16;

const EMPTY: u8 = 0;
const USED: u8 = 1;
const TOMBSTONE: u8 = 2;

/// What the index must agree with to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: i64,
    pub boot: [u8; 16],
}

/// FNV-1a: stable across processes and versions, which the std hasher is not.
pub fn key_hash(content: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in content {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Spreads the hash over the table (FNV's low bits are weak).
fn home_slot(hash: u64, capacity: u64) -> u64 {
    let mut x = hash;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x & (capacity - 1)
}

fn encode_slot(state: u8, hash: u64, ip: IpAddr) -> [u8; SLOT_LEN as usize] {
    let mut s = [0u8; SLOT_LEN as usize];
    s[0] = state;
    let octets = match ip {
        IpAddr::V4(a) => {
            s[1] = 4;
            a.to_ipv6_mapped().octets()
        }
        IpAddr::V6(a) => {
            s[1] = 6;
            a.octets()
        }
    };
    s[8..16].copy_from_slice(&hash.to_le_bytes());
    s[16..32].copy_from_slice(&octets);
    s
}

fn decode_slot(s: &[u8]) -> (u8, u64, IpAddr) {
    let mut hash = [0u8; 8];
    hash.copy_from_slice(&s[8..16]);
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&s[16..32]);
    let v6 = Ipv6Addr::from(octets);
    let ip = if s[1] == 4 {
        IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED))
    } else {
        IpAddr::V6(v6)
    };
    (s[0], u64::from_le_bytes(hash), ip)
}

fn capacity_for(entries: u64) -> u64 {
    (entries.saturating_mul(4))
        .max(MIN_CAPACITY)
        .next_power_of_two()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// The index of one network directory. Without a file it is empty.
pub struct Index {
    path: PathBuf,
    file: Option<File>,
    capacity: u64,
    used: u64,
    tombstones: u64,
}

impl Index {
    /// The index in `dir` if it is sound, sealed and made for `stamp`.
    pub fn load(dir: &Path, stamp: &Stamp) -> Option<Index> {
        let path = dir.join(INDEX_NAME);
        let file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
        let mut h = [0u8; HEADER_LEN as usize];
        file.read_exact_at(&mut h, 0).ok()?;
        let capacity = u64_at(&h, 16);
        let sealed = &h[0..8] == MAGIC
            && h[8] == 0
            && capacity.is_power_of_two()
            && capacity >= MIN_CAPACITY
            && Stamp {
                dev: u64_at(&h, 40),
                ino: u64_at(&h, 48),
                mtime_sec: u64_at(&h, 56) as i64,
                mtime_nsec: u64_at(&h, 64) as i64,
                boot: h[72..88].try_into().ok()?,
            } == *stamp;
        let len = file.metadata().ok()?.len();
        if !sealed || len != HEADER_LEN + capacity * SLOT_LEN {
            return None;
        }
        Some(Index {
            path,
            file: Some(file),
            capacity,
            used: u64_at(&h, 24),
            tombstones: u64_at(&h, 32),
        })
    }

    /// An index with no file, holding nothing.
    pub fn build_empty(dir: &Path) -> Index {
        Index {
            path: dir.join(INDEX_NAME),
            file: None,
            capacity: 0,
            used: 0,
            tombstones: 0,
        }
    }

    /// A new index of `records`, written unsealed; none at all when there are no records.
    pub fn build(dir: &Path, records: &[(u64, IpAddr)]) -> io::Result<Index> {
        let mut index = Index {
            path: dir.join(INDEX_NAME),
            file: None,
            capacity: 0,
            used: 0,
            tombstones: 0,
        };
        if records.is_empty() {
            index.discard()?;
        } else {
            index.rewrite(records)?;
        }
        Ok(index)
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    pub fn len(&self) -> u64 {
        self.used
    }

    fn header(&self, dirty: bool, stamp: &Stamp) -> [u8; HEADER_LEN as usize] {
        let mut h = [0u8; HEADER_LEN as usize];
        h[0..8].copy_from_slice(MAGIC);
        h[8] = dirty as u8;
        h[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        h[24..32].copy_from_slice(&self.used.to_le_bytes());
        h[32..40].copy_from_slice(&self.tombstones.to_le_bytes());
        h[40..48].copy_from_slice(&stamp.dev.to_le_bytes());
        h[48..56].copy_from_slice(&stamp.ino.to_le_bytes());
        h[56..64].copy_from_slice(&stamp.mtime_sec.to_le_bytes());
        h[64..72].copy_from_slice(&stamp.mtime_nsec.to_le_bytes());
        h[72..88].copy_from_slice(&stamp.boot);
        h
    }

    /// Writes a whole table of `records`, unsealed.
    fn rewrite(&mut self, records: &[(u64, IpAddr)]) -> io::Result<()> {
        let capacity = capacity_for(records.len() as u64);
        let mut table = vec![0u8; (capacity * SLOT_LEN) as usize];
        for (hash, ip) in records {
            let mut pos = home_slot(*hash, capacity);
            while table[(pos * SLOT_LEN) as usize] != EMPTY {
                pos = (pos + 1) & (capacity - 1);
            }
            let at = (pos * SLOT_LEN) as usize;
            table[at..at + SLOT_LEN as usize].copy_from_slice(&encode_slot(USED, *hash, *ip));
        }
        self.capacity = capacity;
        self.used = records.len() as u64;
        self.tombstones = 0;
        let file = match self.file.take() {
            Some(f) => f,
            None => OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&self.path)?,
        };
        // The dirty header goes first, so a crash part-way leaves a file that is never trusted.
        file.write_all_at(&self.header(true, &Stamp::default()), 0)?;
        file.set_len(HEADER_LEN + capacity * SLOT_LEN)?;
        file.write_all_at(&table, HEADER_LEN)?;
        self.file = Some(file);
        Ok(())
    }

    /// Marks the file as being changed: until sealed again it will not be trusted.
    pub fn mark_dirty(&self) -> io::Result<()> {
        match &self.file {
            Some(f) => f.write_all_at(&[1], 8),
            None => Ok(()),
        }
    }

    /// Reopens the file read-only, so that every write to it fails (for tests of that path).
    #[cfg(test)]
    pub fn make_read_only_for_test(&mut self) {
        self.file = Some(File::open(&self.path).expect("index file"));
    }

    /// Records the counts and the stamp the directory now carries, and clears the dirty flag.
    pub fn seal(&self, stamp: &Stamp) -> io::Result<()> {
        match &self.file {
            Some(f) => f.write_all_at(&self.header(false, stamp), 0),
            None => Ok(()),
        }
    }

    /// Removes the file: an empty network keeps only `lock` and `last_reserved_ip.*`.
    pub fn discard(&mut self) -> io::Result<()> {
        self.file = None;
        self.used = 0;
        self.tombstones = 0;
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Walks the probe sequence of `hash` until an empty slot; `visit` sees each slot's
    /// position, state, hash and address and returns true to stop.
    fn probe(
        &self,
        hash: u64,
        mut visit: impl FnMut(u64, u8, u64, IpAddr) -> bool,
    ) -> io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let mut pos = home_slot(hash, self.capacity);
        let mut seen = 0;
        let mut buf = vec![0u8; (PROBE_BLOCK * SLOT_LEN) as usize];
        while seen < self.capacity {
            let n = PROBE_BLOCK.min(self.capacity - pos);
            let block = &mut buf[..(n * SLOT_LEN) as usize];
            file.read_exact_at(block, HEADER_LEN + pos * SLOT_LEN)?;
            for i in 0..n {
                let s = &block[(i * SLOT_LEN) as usize..((i + 1) * SLOT_LEN) as usize];
                let (state, h, ip) = decode_slot(s);
                if state == EMPTY || visit(pos + i, state, h, ip) {
                    return Ok(());
                }
            }
            seen += n;
            pos = (pos + n) & (self.capacity - 1);
        }
        Ok(())
    }

    /// The addresses recorded under `hash`.
    pub fn lookup(&self, hash: u64) -> io::Result<Vec<IpAddr>> {
        let mut out = Vec::new();
        self.probe(hash, |_, state, h, ip| {
            if state == USED && h == hash {
                out.push(ip);
            }
            false
        })?;
        Ok(out)
    }

    pub fn insert(&mut self, hash: u64, ip: IpAddr) -> io::Result<()> {
        if self.file.is_none() || (self.used + self.tombstones + 1) * 2 > self.capacity {
            let mut all = self.all()?;
            all.push((hash, ip));
            return self.rewrite(&all);
        }
        let mut free = None;
        self.probe(hash, |pos, state, _, _| {
            if state == TOMBSTONE {
                free = Some(pos);
                return true;
            }
            false
        })?;
        let pos = match free {
            Some(p) => {
                self.tombstones -= 1;
                p
            }
            None => self.first_empty(hash)?,
        };
        self.write_slot(pos, &encode_slot(USED, hash, ip))?;
        self.used += 1;
        Ok(())
    }

    fn first_empty(&self, hash: u64) -> io::Result<u64> {
        let mut last = home_slot(hash, self.capacity);
        let mut count = 0;
        self.probe(hash, |pos, _, _, _| {
            last = pos;
            count += 1;
            false
        })?;
        // The probe stopped on the slot after the last one it visited.
        Ok(if count == 0 {
            last
        } else {
            (last + 1) & (self.capacity - 1)
        })
    }

    /// Removes the record of `ip` under `hash`; false when there was none.
    pub fn remove(&mut self, hash: u64, ip: IpAddr) -> io::Result<bool> {
        let mut at = None;
        self.probe(hash, |pos, state, h, a| {
            if state == USED && h == hash && a == ip {
                at = Some(pos);
                return true;
            }
            false
        })?;
        let Some(pos) = at else { return Ok(false) };
        self.write_slot(
            pos,
            &encode_slot(TOMBSTONE, 0, Ipv4Addr::UNSPECIFIED.into()),
        )?;
        self.used -= 1;
        self.tombstones += 1;
        Ok(true)
    }

    fn write_slot(&self, pos: u64, slot: &[u8]) -> io::Result<()> {
        match &self.file {
            Some(f) => f.write_all_at(slot, HEADER_LEN + pos * SLOT_LEN),
            None => Ok(()),
        }
    }

    /// Every record.
    pub fn all(&self) -> io::Result<Vec<(u64, IpAddr)>> {
        let Some(file) = &self.file else {
            return Ok(Vec::new());
        };
        let mut table = vec![0u8; (self.capacity * SLOT_LEN) as usize];
        file.read_exact_at(&mut table, HEADER_LEN)?;
        Ok(table
            .chunks_exact(SLOT_LEN as usize)
            .map(decode_slot)
            .filter(|(state, _, _)| *state == USED)
            .map(|(_, h, ip)| (h, ip))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ip(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
    }

    #[test]
    fn insert_lookup_remove_through_growth_and_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = Index::build(dir.path(), &[]).unwrap();
        assert!(!dir.path().join(INDEX_NAME).exists());
        let mut model: HashMap<u32, u64> = HashMap::new();
        // Few distinct hashes, so chains collide and hold several addresses.
        for i in 0..2000u32 {
            let h = key_hash(format!("c{}", i % 700).as_bytes());
            idx.insert(h, ip(i)).unwrap();
            model.insert(i, h);
            if i % 3 == 0 {
                let victim = i / 2;
                if let Some(hv) = model.remove(&victim) {
                    assert!(idx.remove(hv, ip(victim)).unwrap());
                    assert!(!idx.remove(hv, ip(victim)).unwrap());
                }
            }
        }
        assert_eq!(idx.len(), model.len() as u64);
        for (i, h) in &model {
            assert!(idx.lookup(*h).unwrap().contains(&ip(*i)), "{i}");
        }
        let mut all: Vec<(u64, IpAddr)> = idx.all().unwrap();
        all.sort();
        let mut want: Vec<(u64, IpAddr)> = model.iter().map(|(i, h)| (*h, ip(*i))).collect();
        want.sort();
        assert_eq!(all, want);
    }

    #[test]
    fn only_a_sealed_index_with_the_same_stamp_loads() {
        let dir = tempfile::tempdir().unwrap();
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        let idx = Index::build(dir.path(), &[(1, ip(1)), (2, v6)]).unwrap();
        let stamp = Stamp {
            dev: 1,
            ino: 2,
            mtime_sec: 3,
            mtime_nsec: 4,
            boot: [9; 16],
        };
        assert!(Index::load(dir.path(), &stamp).is_none(), "unsealed");
        idx.seal(&stamp).unwrap();
        let loaded = Index::load(dir.path(), &stamp).unwrap();
        assert_eq!(loaded.lookup(2).unwrap(), vec![v6]);
        assert_eq!(loaded.len(), 2);
        for other in [
            Stamp {
                mtime_nsec: 5,
                ..stamp
            },
            Stamp { ino: 7, ..stamp },
            Stamp {
                boot: [0; 16],
                ..stamp
            },
        ] {
            assert!(Index::load(dir.path(), &other).is_none());
        }
        loaded.mark_dirty().unwrap();
        assert!(Index::load(dir.path(), &stamp).is_none(), "dirty");
        // A torn file is never trusted.
        idx.seal(&stamp).unwrap();
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(INDEX_NAME))
            .unwrap();
        f.set_len(HEADER_LEN + 5).unwrap();
        assert!(Index::load(dir.path(), &stamp).is_none());
    }
}
