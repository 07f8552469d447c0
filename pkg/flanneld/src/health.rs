//! `/healthz` (200 while the daemon runs), `/readyz` (503 until subnet.env is written and the
//! backend is ready) and `/metrics`, over a minimal HTTP/1.1 server: three answers need no
//! framework.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The answer to one request line.
pub fn answer(request: &str, ready: bool) -> (u16, std::borrow::Cow<'static, str>) {
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return (405, "method not allowed\n".into());
    }
    match path {
        "/healthz" => (200, "ok\n".into()),
        "/readyz" if ready => (200, "ok\n".into()),
        "/readyz" => (503, "not ready: no subnet.env or backend yet\n".into()),
        "/metrics" => (200, crate::metrics::METRICS.render().into()),
        _ => (404, "not found\n".into()),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    }
}

async fn serve_one(mut s: TcpStream, ready: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 2048];
    let mut len = 0;
    // The request line and headers; a client that sends nothing is dropped.
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while len < buf.len() {
            match s.read(&mut buf[len..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => len += n,
            }
            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") || buf[..len].contains(&b'\n') {
                break;
            }
        }
    })
    .await;
    if read.is_err() || len == 0 {
        return;
    }
    let text = String::from_utf8_lossy(&buf[..len]);
    let line = text.lines().next().unwrap_or("");
    let (code, body) = answer(line, ready.load(Ordering::SeqCst));
    let head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(code),
        body.len()
    );
    let mut out = head.into_bytes();
    if !line.starts_with("HEAD ") {
        out.extend_from_slice(body.as_bytes());
    }
    let _ = s.write_all(&out).await;
    let _ = s.shutdown().await;
}

/// Binds now (so a port in use is reported at start) and serves in the background.
pub async fn start(addr: SocketAddr, ready: Arc<AtomicBool>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((s, _)) => {
                    tokio::spawn(serve_one(s, ready.clone()));
                }
                Err(e) => {
                    tracing::warn!("health endpoint: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(answer("GET /healthz HTTP/1.1", false).0, 200);
        assert_eq!(answer("GET /readyz HTTP/1.1", false).0, 503);
        assert_eq!(answer("GET /readyz?verbose HTTP/1.1", true).0, 200);
        assert_eq!(answer("GET /other HTTP/1.1", true).0, 404);
        assert_eq!(answer("POST /healthz HTTP/1.1", true).0, 405);
        assert_eq!(answer("", true).0, 405);
    }
}
