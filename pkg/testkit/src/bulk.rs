//! A bulk TCP transfer between two namespaces, its bytes compared at the far end: what a
//! tunnel's tests need to show that large flows (segmented, coalesced, reordered on the way)
//! arrive intact, not only that a ping gets through.

use std::process::Command;

use crate::TestNs;

/// Sends `bytes` random bytes over one TCP connection from `from` to `dest` (an address in
/// `to`, port 7000) with socat, and panics unless the same bytes arrived. A stall fails it
/// after 20 s without progress, rather than hanging the test.
pub fn tcp_transfer(from: &TestNs, to: &TestNs, dest: &str, bytes: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (src, dst) = (dir.path().join("sent"), dir.path().join("received"));
    let status = Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(std::fs::File::create(&src).expect("the file to send"))
        .status()
        .expect("running head");
    assert!(status.success(), "writing {bytes} random bytes");
    let v6 = dest.contains(':');
    let listen = if v6 {
        "TCP6-LISTEN:7000,reuseaddr"
    } else {
        "TCP4-LISTEN:7000,reuseaddr"
    };
    let mut server = to
        .command("socat")
        .args(["-u", "-T", "20", listen])
        .arg(format!("CREATE:{}", dst.display()))
        .spawn()
        .expect("starting socat to listen");
    let target = if v6 {
        format!("TCP:[{dest}]:7000,retry=100,interval=0.1")
    } else {
        format!("TCP:{dest}:7000,retry=100,interval=0.1")
    };
    let out = from
        .command("socat")
        .args(["-u", "-T", "20"])
        .arg(format!("OPEN:{}", src.display()))
        .arg(&target)
        .output()
        .expect("running socat to send");
    let served = server.wait().expect("waiting for the listening socat");
    assert!(
        out.status.success() && served.success(),
        "TCP from {} to {dest} in {}: {}",
        from.name(),
        to.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    let (sent, received) = (
        std::fs::read(&src).expect("the bytes sent"),
        std::fs::read(&dst).expect("the bytes received"),
    );
    assert_eq!(received.len(), sent.len(), "bytes to {dest}");
    assert!(received == sent, "the bytes to {dest} arrived changed");
}
