//! The saved delegate configs: `<dataDir>/<containerID>` holds the JSON ADD ran, so DEL
//! undoes exactly that. Same layout and content as the Go plugin's, in both directions.

use cni_protocol::error::io_err;
use cni_protocol::{gokeys, CniError};
use serde_json::Value;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// NAME_MAX: the longest file name Linux file systems take.
pub const MAX_FILE_NAME_LEN: usize = 255;

/// A name too long to be a file's: no file can exist under it.
fn name_too_long(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENAMETOOLONG)
}

/// What `<dataDir>/<containerID>` holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Saved {
    /// No file: ADD never saved one, or DEL already ran.
    Missing,
    /// The delegate config.
    Config(Value),
    /// A file that is not a JSON object (left by a crash during a non-atomic write).
    Corrupt(String),
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of one container. Container IDs are validated by the protocol layer: one
    /// path component, never starting with a dot.
    pub fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(container_id)
    }

    /// ADD's check: the container ID must be usable as the saved file's name. Code 4, as
    /// for any other container ID the plugin cannot take.
    pub fn check_file_name(container_id: &str) -> Result<(), CniError> {
        if container_id.len() <= MAX_FILE_NAME_LEN {
            return Ok(());
        }
        Err(CniError::env(format!(
            "invalid CNI_CONTAINERID: {} bytes long; flannel saves the delegate config in a file named by it, and a file name holds at most {MAX_FILE_NAME_LEN} bytes",
            container_id.len()
        ))
        .with_details(container_id.to_string()))
    }

    /// Writes the delegate config for `container_id`: directory 0700, file 0600, written to
    /// a temporary file, fsynced, renamed into place and the directory fsynced, so a crash
    /// leaves the old file, the new one or none, never a torn one.
    pub fn save(&self, container_id: &str, delegate: &Value) -> Result<(), CniError> {
        let path = self.path(container_id);
        let what = || format!("saving the delegate config to {}", path.display());
        let bytes = serde_json::to_vec(delegate)
            .map_err(|e| CniError::internal(format!("{}: {e}", what())))?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io_err(what()))?;
        let tmp = self.temp_path(std::process::id());
        let written = write_synced(&tmp, &bytes).and_then(|()| fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map_err(io_err(what()))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(what()))
    }

    /// Reads the delegate config saved for `container_id`.
    pub fn load(&self, container_id: &str) -> Result<Saved, CniError> {
        let path = self.path(container_id);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound || name_too_long(&e) => {
                return Ok(Saved::Missing)
            }
            Err(e) => {
                return Err(CniError::io(format!(
                    "reading the saved delegate config {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v.is_object() => Saved::Config(v),
            Ok(v) => Saved::Corrupt(format!("{} holds {v}, not a config", path.display())),
            Err(e) => Saved::Corrupt(format!("{} is not JSON: {e}", path.display())),
        })
    }

    /// The temporary file `save` writes in process `pid`. Container IDs never start with a
    /// dot, so it cannot collide with a saved file.
    fn temp_path(&self, pid: u32) -> PathBuf {
        self.dir.join(format!(".{pid}.tmp"))
    }

    /// Removes the temporary files of saves whose process is gone (killed between writing
    /// and renaming): nothing else would ever remove them.
    fn remove_orphaned_temp_files(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix('.')?.strip_suffix(".tmp"))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_file(self.temp_path(pid));
            }
        }
    }

    /// Removes the file of `container_id`; one that is already gone is fine.
    pub fn remove(&self, container_id: &str) -> Result<(), CniError> {
        self.remove_orphaned_temp_files();
        let path = self.path(container_id);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound && !name_too_long(&e) => Err(CniError::io(
                format!("removing the saved delegate config {}: {e}", path.display()),
            )),
            _ => Ok(()),
        }
    }

    /// The container IDs that have a saved file, sorted; temporary files are not listed.
    pub fn container_ids(&self) -> Result<Vec<String>, CniError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CniError::io(format!("listing {}: {e}", self.dir.display()))),
        };
        let mut ids: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// GC: removes the files of containers not in `keep` that belong to `network` (or to no
    /// network, being unreadable), leaving other networks sharing the directory alone.
    /// Returns the container IDs removed.
    pub fn remove_stale(
        &self,
        network: &str,
        keep: &HashSet<&str>,
    ) -> Result<Vec<String>, CniError> {
        let mut removed = Vec::new();
        for id in self.container_ids()? {
            if keep.contains(id.as_str()) {
                continue;
            }
            let ours = match self.load(&id)? {
                Saved::Missing => false,
                Saved::Config(c) => {
                    c.as_object()
                        .and_then(|o| gokeys::get(o, "name"))
                        .and_then(Value::as_str)
                        == Some(network)
                }
                Saved::Corrupt(_) => true,
            };
            if ours {
                self.remove(&id)?;
                removed.push(id);
            }
        }
        Ok(removed)
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn save_then_load_then_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("lib/cni/flannel"));
        let d = json!({"type": "bridge", "name": "cbr0", "mtu": 1450});
        store.save("abc", &d).unwrap();
        assert_eq!(mode(store.dir()), 0o700);
        assert_eq!(mode(&store.path("abc")), 0o600);
        assert_eq!(store.load("abc").unwrap(), Saved::Config(d.clone()));
        assert_eq!(store.container_ids().unwrap(), vec!["abc".to_string()]);
        store.remove("abc").unwrap();
        assert_eq!(store.load("abc").unwrap(), Saved::Missing);
        store.remove("abc").unwrap();
        assert!(store.container_ids().unwrap().is_empty());
    }

    #[test]
    fn the_file_is_the_go_plugins_format() {
        // The Go plugin writes json.Marshal of the map: compact, keys sorted.
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let d = json!({"type": "bridge", "name": "cbr0", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.2.0/24"}]]}, "cniVersion": "0.3.1"});
        store.save("c1", &d).unwrap();
        assert_eq!(
            fs::read_to_string(store.path("c1")).unwrap(),
            r#"{"cniVersion":"0.3.1","ipam":{"ranges":[[{"subnet":"10.1.2.0/24"}]],"type":"host-local"},"name":"cbr0","type":"bridge"}"#
        );
    }

    #[test]
    fn a_file_written_by_the_go_plugin_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let go = r#"{"cniVersion":"0.3.1","hairpinMode":true,"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},"isDefaultGateway":true,"isGateway":true,"mtu":1450,"name":"cbr0","type":"bridge"}"#;
        fs::write(store.path("0123abcd"), go).unwrap();
        match store.load("0123abcd").unwrap() {
            Saved::Config(v) => {
                assert_eq!(v["type"], "bridge");
                assert_eq!(v["ipam"]["routes"][0]["dst"], "10.244.0.0/16");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_empty_or_torn_file_is_corrupt_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        for (id, text) in [("empty", ""), ("torn", "{\"type\":\"bri"), ("list", "[1]")] {
            fs::write(store.path(id), text).unwrap();
            match store.load(id).unwrap() {
                Saved::Corrupt(why) => assert!(why.contains(id), "{why}"),
                other => panic!("{id}: {other:?}"),
            }
        }
    }

    #[test]
    fn listing_skips_temporary_files_and_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        store.save("b", &json!({})).unwrap();
        store.save("a", &json!({})).unwrap();
        fs::write(tmp.path().join(".123.tmp"), "{").unwrap();
        fs::create_dir(tmp.path().join("sub")).unwrap();
        assert_eq!(store.container_ids().unwrap(), vec!["a", "b"]);
        assert!(Store::new(tmp.path().join("none"))
            .container_ids()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn remove_sweeps_the_temporary_files_of_killed_saves_only() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        store.save("c", &json!({})).unwrap();
        // pid_max is at most 2^22: this process cannot exist.
        let killed = store.temp_path(4_194_305);
        let running = store.temp_path(std::process::id());
        fs::write(&killed, "{\"type\":").unwrap();
        fs::write(&running, "{").unwrap();
        store.remove("c").unwrap();
        assert!(!killed.exists(), "the killed save's temporary file is left");
        assert!(
            running.exists(),
            "a running save's temporary file was removed"
        );
    }

    #[test]
    fn remove_stale_keeps_valid_containers_and_other_networks() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        store.save("live", &json!({"name": "cbr0"})).unwrap();
        store.save("gone", &json!({"name": "cbr0"})).unwrap();
        store.save("other", &json!({"name": "other-net"})).unwrap();
        fs::write(store.path("torn"), "{").unwrap();
        let keep: HashSet<&str> = ["live"].into();
        assert_eq!(
            store.remove_stale("cbr0", &keep).unwrap(),
            vec!["gone", "torn"]
        );
        assert_eq!(store.container_ids().unwrap(), vec!["live", "other"]);
    }

    #[test]
    fn saving_over_an_existing_file_replaces_it_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        store
            .save("c", &json!({"type": "bridge", "long": "x".repeat(1000)}))
            .unwrap();
        store.save("c", &json!({"type": "ipvlan"})).unwrap();
        assert_eq!(
            store.load("c").unwrap(),
            Saved::Config(json!({"type": "ipvlan"}))
        );
        assert_eq!(store.container_ids().unwrap(), vec!["c"]);
    }
}
