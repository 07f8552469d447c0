//! WireGuard keys: the private key file flanneld keeps across restarts, base64 (lease, config)
//! and hex (UAPI) forms, and the public key a private key gives.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

pub const KEY_LEN: usize = 32;

/// Where flanneld keeps its private key unless `$WIREGUARD_KEY_FILE` names another file.
pub const DEFAULT_KEY_FILE: &str = "/run/flannel/wgkey";
pub const KEY_FILE_ENV: &str = "WIREGUARD_KEY_FILE";

/// A 32-byte WireGuard key: private, public or preshared.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Key(pub [u8; KEY_LEN]);

/// Why a text is not a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

impl Key {
    /// A new private key from the kernel's random source, clamped as X25519 wants it.
    pub fn generate() -> io::Result<Key> {
        let mut bytes = [0u8; KEY_LEN];
        let mut filled = 0;
        while filled < KEY_LEN {
            // SAFETY: the pointer and length describe the unfilled tail of `bytes`.
            let n = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), KEY_LEN - filled, 0)
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            filled += n as usize;
        }
        bytes[0] &= 248;
        bytes[31] = (bytes[31] & 127) | 64;
        Ok(Key(bytes))
    }

    /// The public key of this private key.
    pub fn public(&self) -> Key {
        let secret = x25519_dalek::StaticSecret::from(self.0);
        Key(x25519_dalek::PublicKey::from(&secret).to_bytes())
    }

    /// Parses the base64 form (44 characters) `wg genkey` and flanneld's leases use; blanks
    /// around it are ignored.
    pub fn from_base64(text: &str) -> Result<Key, KeyError> {
        let text = text.trim();
        let bytes = STANDARD
            .decode(text)
            .map_err(|e| KeyError(format!("{text:?} is not base64: {e}")))?;
        let bytes: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            KeyError(format!(
                "{text:?} decodes to {} bytes, a key has {KEY_LEN}",
                bytes.len()
            ))
        })?;
        Ok(Key(bytes))
    }

    /// Parses the 64 hex digits of the UAPI text protocol.
    pub fn from_hex(text: &str) -> Result<Key, KeyError> {
        if text.len() != 2 * KEY_LEN {
            return Err(KeyError(format!(
                "{text:?} has {} characters, a hex key has {}",
                text.len(),
                2 * KEY_LEN
            )));
        }
        let mut bytes = [0u8; KEY_LEN];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|_| KeyError(format!("{text:?} is not hex")))?;
        }
        Ok(Key(bytes))
    }

    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0; KEY_LEN]
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// A key's Debug shows its base64 form only for public keys' sake; never log a private key.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.to_base64())
    }
}

/// Parses the `PSK` of the backend config; the error names the key.
pub fn parse_psk(text: &str) -> Result<Key, KeyError> {
    Key::from_base64(text).map_err(|e| KeyError(format!("PSK: {e}")))
}

/// Why the private key file could not be used; the message names the path.
#[derive(Debug)]
pub struct KeyFileError {
    pub path: PathBuf,
    pub reason: String,
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WireGuard key file {}: {}",
            self.path.display(),
            self.reason
        )
    }
}

impl std::error::Error for KeyFileError {}

/// The key file's path: `$WIREGUARD_KEY_FILE` when set, else /run/flannel/wgkey.
pub fn key_file_path() -> PathBuf {
    std::env::var_os(KEY_FILE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KEY_FILE))
}

/// The private key in `path`, or None when the file does not exist: a read, nothing made.
pub fn load(path: &Path) -> Result<Option<Key>, KeyFileError> {
    let fail = |reason: String| KeyFileError {
        path: path.to_path_buf(),
        reason,
    };
    match fs::read_to_string(path) {
        Ok(text) => Key::from_base64(&text)
            .map(Some)
            .map_err(|e| fail(format!("not a private key: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fail(format!("reading it: {e}"))),
    }
}

/// The private key in `path`, made (mode 0400, base64 without a newline, as flanneld writes
/// it) when the file does not exist; the boolean says whether it was made now.
pub fn load_or_create(path: &Path) -> Result<(Key, bool), KeyFileError> {
    let fail = |reason: String| KeyFileError {
        path: path.to_path_buf(),
        reason,
    };
    match load(path)? {
        Some(key) => Ok((key, false)),
        None => {
            let key = Key::generate().map_err(|e| fail(format!("generating a key: {e}")))?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(dir)
                    .map_err(|e| fail(format!("creating its directory: {e}")))?;
            }
            // create_new: two starts racing keep one key, the loser reads the winner's.
            let mut file = match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o400)
                .open(path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return load_or_create(path);
                }
                Err(e) => return Err(fail(format!("creating it: {e}"))),
            };
            file.write_all(key.to_base64().as_bytes())
                .and_then(|_| file.sync_all())
                .map_err(|e| fail(format!("writing it: {e}")))?;
            Ok((key, true))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    // RFC 7748 section 6.1: Alice's private and public keys.
    const ALICE_PRIVATE: &str = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
    const ALICE_PUBLIC: &str = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";

    #[test]
    fn public_key_is_x25519_of_the_private_key() {
        let private = Key::from_hex(ALICE_PRIVATE).unwrap();
        assert_eq!(private.public().to_hex(), ALICE_PUBLIC);
    }

    #[test]
    fn base64_and_hex_round_trip() {
        let key = Key::from_hex(ALICE_PUBLIC).unwrap();
        let b64 = key.to_base64();
        assert_eq!(b64.len(), 44);
        assert_eq!(Key::from_base64(&b64).unwrap(), key);
        assert_eq!(Key::from_base64(&format!("{b64}\n")).unwrap(), key);
        assert_eq!(Key::from_hex(&key.to_hex()).unwrap(), key);
    }

    #[test]
    fn a_key_of_the_wrong_length_or_alphabet_is_refused_with_the_text() {
        let short = Key::from_base64("AAAA").unwrap_err();
        assert!(
            short.0.contains("\"AAAA\"") && short.0.contains("3 bytes"),
            "{short}"
        );
        let junk = Key::from_base64("not base64!").unwrap_err();
        assert!(junk.0.contains("not base64"), "{junk}");
        assert!(Key::from_hex("zz").is_err());
        assert!(Key::from_hex(&"g".repeat(64)).is_err());
        let psk = parse_psk("short").unwrap_err();
        assert!(psk.0.starts_with("PSK: "), "{psk}");
    }

    #[test]
    fn generated_keys_are_clamped_and_differ() {
        let a = Key::generate().unwrap();
        let b = Key::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.0[0] & 7, 0);
        assert_eq!(a.0[31] & 0xc0, 0x40);
    }

    #[test]
    fn key_file_is_made_once_with_mode_0400_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/wgkey");
        let (made, fresh) = load_or_create(&path).unwrap();
        assert!(fresh);
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o400);
        assert_eq!(fs::read_to_string(&path).unwrap(), made.to_base64());
        let (again, fresh) = load_or_create(&path).unwrap();
        assert!(!fresh);
        assert_eq!(again, made);
    }

    #[test]
    fn loading_reads_the_key_and_makes_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/wgkey");
        assert_eq!(load(&path).unwrap(), None);
        assert!(!dir.path().join("sub").exists());
        let (made, _) = load_or_create(&path).unwrap();
        assert_eq!(load(&path).unwrap(), Some(made));
    }

    #[test]
    fn a_malformed_key_file_is_refused_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wgkey");
        fs::write(&path, "garbage").unwrap();
        let err = load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("not a private key"), "{err}");
    }

    #[test]
    fn an_unreadable_key_file_is_refused_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading fails even as root.
        let path = dir.path().join("wgkey");
        fs::create_dir(&path).unwrap();
        let err = load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("reading it"), "{err}");
    }
}
