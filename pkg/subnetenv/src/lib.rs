//! flannel's `subnet.env`: the node's lease as the fabric daemon hands it to the CNI plugin.
//!
//! ```text
//! FLANNEL_NETWORK=10.244.0.0/16
//! FLANNEL_SUBNET=10.244.1.1/24
//! FLANNEL_MTU=1450
//! FLANNEL_IPMASQ=true
//! ```
//!
//! Read as the Go plugin reads it: `KEY=VALUE` lines split at the first `=`, unknown keys
//! and lines without `=` ignored, a later line overriding an earlier one. `FLANNEL_NETWORK`
//! and `FLANNEL_IPV6_NETWORK` are comma-separated lists; `FLANNEL_SUBNET` and
//! `FLANNEL_IPV6_SUBNET` hold the node's first address with the subnet's prefix.
//! Written as the Go daemon writes it, atomically, so a reader never sees half a file.

use ipnetwork::IpNetwork;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the daemon writes the file and the plugin reads it unless configured otherwise.
pub const DEFAULT_PATH: &str = "/run/flannel/subnet.env";

pub const NETWORK: &str = "FLANNEL_NETWORK";
pub const SUBNET: &str = "FLANNEL_SUBNET";
pub const IPV6_NETWORK: &str = "FLANNEL_IPV6_NETWORK";
pub const IPV6_SUBNET: &str = "FLANNEL_IPV6_SUBNET";
pub const MTU: &str = "FLANNEL_MTU";
pub const IPMASQ: &str = "FLANNEL_IPMASQ";

/// A complete subnet.env: at least one network, at least one subnet, the MTU and IPMASQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetEnv {
    /// `FLANNEL_NETWORK`: the cluster's networks, masked, without duplicates.
    pub networks: Vec<IpNetwork>,
    /// `FLANNEL_SUBNET` as written: the node's first address with the subnet's prefix.
    pub subnet: Option<IpNetwork>,
    /// `FLANNEL_IPV6_NETWORK`: masked, without duplicates.
    pub ipv6_networks: Vec<IpNetwork>,
    /// `FLANNEL_IPV6_SUBNET` as written.
    pub ipv6_subnet: Option<IpNetwork>,
    /// `FLANNEL_MTU`.
    pub mtu: u32,
    /// `FLANNEL_IPMASQ`: true only when the value is exactly `true`.
    pub ipmasq: bool,
}

/// Whatever keys a file holds, complete or not (the daemon reads back a previous lease).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub networks: Option<Vec<IpNetwork>>,
    pub subnet: Option<IpNetwork>,
    pub ipv6_networks: Option<Vec<IpNetwork>>,
    pub ipv6_subnet: Option<IpNetwork>,
    pub mtu: Option<u32>,
    pub ipmasq: Option<bool>,
}

#[derive(Debug)]
pub enum Error {
    /// The file could not be read or written.
    Io { path: PathBuf, source: io::Error },
    /// A known key has a value that does not parse.
    Invalid {
        line: usize,
        key: &'static str,
        value: String,
        reason: String,
    },
    /// Required keys are absent; each alternative pair is listed whole.
    Missing(Vec<&'static str>),
}

impl Error {
    /// True when the file (or its directory) does not exist: the daemon has not written it yet.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Invalid {
                line,
                key,
                value,
                reason,
            } => write!(f, "line {line}: {key}={value}: {reason}"),
            Error::Missing(keys) => write!(f, "missing {}", keys.join(", ")),
        }
    }
}

impl std::error::Error for Error {}

/// Reads every known key of `text`.
pub fn parse_entries(text: &str) -> Result<Entries, Error> {
    let mut e = Entries::default();
    for (i, line) in text.lines().enumerate() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let invalid = |key: &'static str, reason: String| Error::Invalid {
            line: i + 1,
            key,
            value: value.to_string(),
            reason,
        };
        match key {
            NETWORK => e.networks = Some(parse_networks(value).map_err(|r| invalid(NETWORK, r))?),
            SUBNET => e.subnet = Some(parse_cidr(value).map_err(|r| invalid(SUBNET, r))?),
            IPV6_NETWORK => {
                e.ipv6_networks = Some(parse_networks(value).map_err(|r| invalid(IPV6_NETWORK, r))?)
            }
            IPV6_SUBNET => {
                e.ipv6_subnet = Some(parse_cidr(value).map_err(|r| invalid(IPV6_SUBNET, r))?)
            }
            MTU => e.mtu = Some(parse_mtu(value).map_err(|r| invalid(MTU, r))?),
            IPMASQ => e.ipmasq = Some(value == "true"),
            _ => {}
        }
    }
    Ok(e)
}

impl Entries {
    /// The keys a complete file needs and this one lacks, in file order.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        let empty = |n: &Option<Vec<IpNetwork>>| n.as_ref().is_none_or(Vec::is_empty);
        if empty(&self.networks) && empty(&self.ipv6_networks) {
            m.extend([NETWORK, IPV6_NETWORK]);
        }
        if self.subnet.is_none() && self.ipv6_subnet.is_none() {
            m.extend([SUBNET, IPV6_SUBNET]);
        }
        if self.mtu.is_none() {
            m.push(MTU);
        }
        if self.ipmasq.is_none() {
            m.push(IPMASQ);
        }
        m
    }

    /// The complete form, or every missing key.
    pub fn complete(self) -> Result<SubnetEnv, Error> {
        match (self.mtu, self.ipmasq, self.missing().is_empty()) {
            (Some(mtu), Some(ipmasq), true) => Ok(SubnetEnv {
                networks: self.networks.unwrap_or_default(),
                subnet: self.subnet,
                ipv6_networks: self.ipv6_networks.unwrap_or_default(),
                ipv6_subnet: self.ipv6_subnet,
                mtu,
                ipmasq,
            }),
            _ => Err(Error::Missing(self.missing())),
        }
    }
}

impl SubnetEnv {
    /// Parses a complete file.
    pub fn parse(text: &str) -> Result<SubnetEnv, Error> {
        parse_entries(text)?.complete()
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<SubnetEnv, Error> {
        let bytes = fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&String::from_utf8_lossy(&bytes))
    }

    /// `FLANNEL_SUBNET` as a network (`10.1.17.1/24` is `10.1.17.0/24`).
    pub fn subnet_network(&self) -> Option<IpNetwork> {
        self.subnet.map(masked)
    }

    /// `FLANNEL_IPV6_SUBNET` as a network.
    pub fn ipv6_subnet_network(&self) -> Option<IpNetwork> {
        self.ipv6_subnet.map(masked)
    }

    /// The file's text, in the order and form the Go daemon writes it.
    pub fn render(&self) -> String {
        let join = |nets: &[IpNetwork]| {
            nets.iter()
                .map(IpNetwork::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = String::new();
        if !self.networks.is_empty() {
            out += &format!("{NETWORK}={}\n", join(&self.networks));
        }
        if let Some(s) = self.subnet {
            out += &format!("{SUBNET}={s}\n");
        }
        if !self.ipv6_networks.is_empty() {
            out += &format!("{IPV6_NETWORK}={}\n", join(&self.ipv6_networks));
        }
        if let Some(s) = self.ipv6_subnet {
            out += &format!("{IPV6_SUBNET}={s}\n");
        }
        out += &format!("{MTU}={}\n{IPMASQ}={}\n", self.mtu, self.ipmasq);
        out
    }

    /// Writes the file atomically (a temporary file in the same directory, fsynced, renamed
    /// over `path`, the directory fsynced), mode 0644, creating the directory if needed.
    /// A value a reader would reject is refused.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let no_network = self.networks.is_empty() && self.ipv6_networks.is_empty();
        let no_subnet = self.subnet.is_none() && self.ipv6_subnet.is_none();
        if no_network || no_subnet {
            let mut keys = Vec::new();
            if no_network {
                keys.extend([NETWORK, IPV6_NETWORK]);
            }
            if no_subnet {
                keys.extend([SUBNET, IPV6_SUBNET]);
            }
            return Err(Error::Missing(keys));
        }
        write_atomically(path, self.render().as_bytes(), 0o644).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn masked(n: IpNetwork) -> IpNetwork {
    IpNetwork::new(n.network(), n.prefix()).unwrap_or(n)
}

/// `addr/prefix`, both parts required, as Go's `net.ParseCIDR` takes it; the host part is kept.
pub fn parse_cidr(s: &str) -> Result<IpNetwork, String> {
    let (addr, prefix) = s
        .split_once('/')
        .ok_or_else(|| "not an address with a prefix length (addr/len)".to_string())?;
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix.parse::<u8>() {
        Ok(p) if prefix.bytes().all(|b| b.is_ascii_digit()) && p <= max => p,
        _ => {
            return Err(format!(
                "prefix length {prefix:?} is not a number from 0 to {max}"
            ))
        }
    };
    IpNetwork::new(addr, prefix).map_err(|e| e.to_string())
}

/// A comma-separated list of CIDRs, each masked, duplicates dropped.
fn parse_networks(s: &str) -> Result<Vec<IpNetwork>, String> {
    let mut out: Vec<IpNetwork> = Vec::new();
    for part in s.split(',') {
        let n = masked(parse_cidr(part).map_err(|e| format!("{part:?}: {e}"))?);
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if s.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err("not an unsigned 32-bit number".to_string()),
    }
}

fn write_atomically(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path names no file"))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn sample(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata")
            .join(name);
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn ipv4_sample() {
        assert_eq!(
            SubnetEnv::parse(&sample("subnet-ipv4.env")).unwrap(),
            SubnetEnv {
                networks: vec![net("10.244.0.0/16")],
                subnet: Some(net("10.244.1.1/24")),
                ipv6_networks: vec![],
                ipv6_subnet: None,
                mtu: 1450,
                ipmasq: true,
            }
        );
    }

    #[test]
    fn ipv6_sample() {
        assert_eq!(
            SubnetEnv::parse(&sample("subnet-ipv6.env")).unwrap(),
            SubnetEnv {
                networks: vec![],
                subnet: None,
                ipv6_networks: vec![net("fd00:10:244::/56")],
                ipv6_subnet: Some(net("fd00:10:244:1::1/64")),
                mtu: 1430,
                ipmasq: false,
            }
        );
    }

    #[test]
    fn dual_stack_sample() {
        assert_eq!(
            SubnetEnv::parse(&sample("subnet-dual.env")).unwrap(),
            SubnetEnv {
                networks: vec![net("10.244.0.0/16")],
                subnet: Some(net("10.244.1.1/24")),
                ipv6_networks: vec![net("fd00:10:244::/56")],
                ipv6_subnet: Some(net("fd00:10:244:1::1/64")),
                mtu: 1450,
                ipmasq: true,
            }
        );
    }

    #[test]
    fn several_networks_sample() {
        assert_eq!(
            SubnetEnv::parse(&sample("subnet-multi.env")).unwrap(),
            SubnetEnv {
                networks: vec![net("10.244.0.0/16"), net("10.245.0.0/16")],
                subnet: Some(net("10.244.1.1/24")),
                ipv6_networks: vec![net("fd00:10:244::/56"), net("fd00:10:245::/56")],
                ipv6_subnet: Some(net("fd00:10:244:1::1/64")),
                mtu: 8951,
                ipmasq: false,
            }
        );
    }

    #[test]
    fn networks_are_masked_and_deduplicated() {
        let text = "FLANNEL_NETWORK=10.244.3.0/16,10.245.0.0/16,10.244.0.0/16\nFLANNEL_IPV6_NETWORK=fd00::1/64,fd00::/64\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1\nFLANNEL_IPMASQ=true\n";
        let env = SubnetEnv::parse(text).unwrap();
        assert_eq!(
            env.networks,
            vec![net("10.244.0.0/16"), net("10.245.0.0/16")]
        );
        assert_eq!(env.ipv6_networks, vec![net("fd00::/64")]);
    }

    #[test]
    fn subnet_network_drops_the_host_part() {
        let env = SubnetEnv::parse(&sample("subnet-dual.env")).unwrap();
        assert_eq!(env.subnet_network(), Some(net("10.244.1.0/24")));
        assert_eq!(env.ipv6_subnet_network(), Some(net("fd00:10:244:1::/64")));
    }

    #[test]
    fn every_missing_key_combination_is_listed_whole() {
        let lines = [
            (NETWORK, "FLANNEL_NETWORK=10.1.0.0/16"),
            (SUBNET, "FLANNEL_SUBNET=10.1.17.1/24"),
            (MTU, "FLANNEL_MTU=1472"),
            (IPMASQ, "FLANNEL_IPMASQ=false"),
        ];
        for mask in 0u32..16 {
            let present: Vec<&str> = lines
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, (_, l))| *l)
                .collect();
            let mut expected: Vec<&str> = Vec::new();
            for (i, (key, _)) in lines.iter().enumerate() {
                if mask & (1 << i) == 0 {
                    expected.push(key);
                    match *key {
                        NETWORK => expected.push(IPV6_NETWORK),
                        SUBNET => expected.push(IPV6_SUBNET),
                        _ => {}
                    }
                }
            }
            let got = SubnetEnv::parse(&present.join("\n"));
            if expected.is_empty() {
                assert!(got.is_ok(), "{present:?}: {got:?}");
            } else {
                match got {
                    Err(Error::Missing(keys)) => assert_eq!(keys, expected, "{present:?}"),
                    other => panic!("{present:?}: expected Missing, got {other:?}"),
                }
            }
        }
    }

    #[test]
    fn either_family_satisfies_network_and_subnet() {
        let text = "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_IPV6_SUBNET=fd00::1/64\nFLANNEL_MTU=1\nFLANNEL_IPMASQ=x\n";
        let env = SubnetEnv::parse(text).unwrap();
        assert_eq!(env.networks, vec![net("10.1.0.0/16")]);
        assert_eq!(env.subnet, None);
        assert_eq!(env.ipv6_subnet, Some(net("fd00::1/64")));
    }

    #[test]
    fn junk_lines_unknown_keys_and_crlf_are_ignored() {
        let text = "# written by hand\r\n\r\nexport FOO\r\nFLANNEL_NETWORK=10.1.0.0/16\r\nFLANNEL_BACKEND=vxlan\r\nflannel_mtu=9\r\nFLANNEL_MTU =7\r\nFLANNEL_SUBNET=10.1.17.1/24\r\nFLANNEL_MTU=1472\r\nFLANNEL_IPMASQ=true\r\n=\r\n";
        let env = SubnetEnv::parse(text).unwrap();
        assert_eq!(env.mtu, 1472);
        assert!(env.ipmasq);
        assert_eq!(env.subnet, Some(net("10.1.17.1/24")));
    }

    #[test]
    fn ipmasq_is_true_only_for_exactly_true() {
        for (value, expected) in [
            ("true", true),
            ("True", false),
            ("TRUE", false),
            ("1", false),
            ("true ", false),
            ("", false),
            ("false", false),
        ] {
            let text = format!(
                "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.2.1/24\nFLANNEL_MTU=1\nFLANNEL_IPMASQ={value}\n"
            );
            assert_eq!(
                SubnetEnv::parse(&text).unwrap().ipmasq,
                expected,
                "{value:?}"
            );
        }
    }

    #[test]
    fn the_last_line_of_a_key_wins() {
        let text = "FLANNEL_NETWORK=10.1.0.0/16,10.2.0.0/16\nFLANNEL_NETWORK=10.3.0.0/16\nFLANNEL_SUBNET=10.3.2.1/24\nFLANNEL_MTU=1\nFLANNEL_IPMASQ=true\n";
        assert_eq!(
            SubnetEnv::parse(text).unwrap().networks,
            vec![net("10.3.0.0/16")]
        );
    }

    #[test]
    fn a_bad_value_names_the_line_the_key_and_the_value() {
        for (line, key) in [
            ("FLANNEL_NETWORK=10.1.0.0", NETWORK),
            ("FLANNEL_NETWORK=10.1.0.0/16,", NETWORK),
            ("FLANNEL_NETWORK=", NETWORK),
            ("FLANNEL_IPV6_NETWORK=fd00::/129", IPV6_NETWORK),
            ("FLANNEL_SUBNET=10.1.300.1/24", SUBNET),
            ("FLANNEL_SUBNET=10.1.3.1/+4", SUBNET),
            ("FLANNEL_IPV6_SUBNET=fd00::1", IPV6_SUBNET),
            ("FLANNEL_MTU=-1", MTU),
            ("FLANNEL_MTU=+1450", MTU),
            ("FLANNEL_MTU=4294967296", MTU),
            ("FLANNEL_MTU=", MTU),
        ] {
            let text = format!("FLANNEL_IPMASQ=true\n{line}\n");
            let e = SubnetEnv::parse(&text).unwrap_err();
            assert!(e.to_string().contains(line), "{e}");
            match e {
                Error::Invalid {
                    line: n,
                    key: k,
                    value,
                    ..
                } => {
                    assert_eq!((n, k), (2, key), "{line}");
                    assert_eq!(Some(value.as_str()), line.split_once('=').map(|p| p.1));
                }
                other => panic!("{line}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn render_is_what_the_go_daemon_writes_and_parses_back() {
        let env = SubnetEnv::parse(&sample("subnet-multi.env")).unwrap();
        assert_eq!(
            env.render(),
            "FLANNEL_NETWORK=10.244.0.0/16,10.245.0.0/16\n\
             FLANNEL_SUBNET=10.244.1.1/24\n\
             FLANNEL_IPV6_NETWORK=fd00:10:244::/56,fd00:10:245::/56\n\
             FLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\n\
             FLANNEL_MTU=8951\n\
             FLANNEL_IPMASQ=false\n"
        );
        for name in [
            "subnet-ipv4.env",
            "subnet-ipv6.env",
            "subnet-dual.env",
            "subnet-multi.env",
        ] {
            let env = SubnetEnv::parse(&sample(name)).unwrap();
            assert_eq!(SubnetEnv::parse(&env.render()).unwrap(), env, "{name}");
        }
        assert_eq!(
            SubnetEnv::parse(&sample("subnet-ipv4.env"))
                .unwrap()
                .render(),
            sample("subnet-ipv4.env")
        );
    }

    #[test]
    fn write_is_atomic_readable_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/flannel/subnet.env");
        let env = SubnetEnv::parse(&sample("subnet-dual.env")).unwrap();
        env.write(&path).unwrap();
        assert_eq!(SubnetEnv::read(&path).unwrap(), env);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let mut changed = env.clone();
        changed.mtu = 1400;
        changed.write(&path).unwrap();
        assert_eq!(SubnetEnv::read(&path).unwrap().mtu, 1400);
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("subnet.env")]);
    }

    #[test]
    fn write_refuses_what_a_reader_would_reject() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subnet.env");
        let mut env = SubnetEnv::parse(&sample("subnet-ipv4.env")).unwrap();
        env.subnet = None;
        assert!(matches!(env.write(&path), Err(Error::Missing(k)) if k == [SUBNET, IPV6_SUBNET]));
        assert!(!path.exists());
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let e = SubnetEnv::read(&dir.path().join("nope/subnet.env")).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(e.to_string().contains("nope/subnet.env"), "{e}");
    }
}
