//! Per-service access log, in the combined format or as JSON lines.
//!
//! Lines are formatted on the worker and handed to a writer thread through a bounded channel:
//! a slow disk never blocks a request. When the channel is full the line is dropped and counted
//! (`dropped`), which is what an operator wants from a log under overload.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_config::LogFormat;

use crate::client::Client;
use crate::date::Utc;
use crate::head::RequestHead;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 16 * 1024;

/// One finished request, as the log sees it.
pub struct Entry<'a> {
    pub client: &'a Client,
    pub req: &'a RequestHead,
    /// 0 when nothing was answered (drop rule, client gone).
    pub status: u16,
    /// Body bytes sent to the client.
    pub bytes: u64,
    pub duration: Duration,
    pub member: Option<SocketAddr>,
    pub rule: Option<&'a str>,
}

/// A service's access log.
pub struct AccessLog {
    format: LogFormat,
    service: Arc<str>,
    tx: SyncSender<String>,
    pub dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("format", &self.format)
            .finish()
    }
}

impl AccessLog {
    /// Opens (appends to) the file and starts its writer thread.
    pub fn open(cfg: &fulcrum_config::AccessLog, service: &str) -> io::Result<AccessLog> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.path)?;
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("fulcrum-log".into())
            .spawn(move || write_lines(rx, BufWriter::new(file)))?;
        Ok(AccessLog {
            format: cfg.format,
            service: Arc::from(service),
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn record(&self, e: &Entry<'_>) {
        let line = match self.format {
            LogFormat::Combined => combined(e),
            LogFormat::Json => json(e, &self.service),
        };
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn write_lines(rx: Receiver<String>, mut w: BufWriter<std::fs::File>) {
    // Flush when the queue runs dry, so lines appear promptly without a write per line.
    while let Ok(line) = rx.recv() {
        let _ = w.write_all(line.as_bytes());
        while let Ok(line) = rx.try_recv() {
            let _ = w.write_all(line.as_bytes());
        }
        let _ = w.flush();
    }
    let _ = w.flush();
}

fn lossy(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

/// A quoted CLF field: `"` and `\` escaped, control bytes as `\xNN`.
fn quoted(out: &mut String, b: &[u8]) {
    out.push('"');
    for c in lossy(b).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `client - - [time] "METHOD target VERSION" status bytes "referer" "user-agent"`
fn combined(e: &Entry<'_>) -> String {
    let mut s = String::with_capacity(160);
    s.push_str(&e.client.ip_text);
    s.push_str(" - - [");
    s.push_str(&Utc::now().clf());
    s.push_str("] ");
    let mut request = Vec::with_capacity(64);
    request.extend_from_slice(e.req.method_bytes());
    request.push(b' ');
    request.extend_from_slice(e.req.target());
    request.push(b' ');
    request.extend_from_slice(e.req.version.as_str().as_bytes());
    quoted(&mut s, &request);
    s.push(' ');
    s.push_str(&e.status.to_string());
    s.push(' ');
    s.push_str(&e.bytes.to_string());
    s.push(' ');
    quoted(&mut s, e.req.first_value_named(b"referer").unwrap_or(b"-"));
    s.push(' ');
    quoted(
        &mut s,
        e.req.first_value_named(b"user-agent").unwrap_or(b"-"),
    );
    s.push('\n');
    s
}

fn json_str(out: &mut String, b: &[u8]) {
    out.push('"');
    for c in lossy(b).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json(e: &Entry<'_>, service: &str) -> String {
    let mut s = String::with_capacity(256);
    s.push_str("{\"time\":\"");
    s.push_str(&Utc::now().rfc3339());
    s.push_str("\",\"service\":");
    json_str(&mut s, service.as_bytes());
    s.push_str(",\"client\":");
    json_str(&mut s, e.client.info.peer.to_string().as_bytes());
    s.push_str(",\"method\":");
    json_str(&mut s, e.req.method_bytes());
    s.push_str(",\"uri\":");
    json_str(&mut s, e.req.target());
    s.push_str(",\"protocol\":");
    json_str(&mut s, e.req.version.as_str().as_bytes());
    s.push_str(",\"host\":");
    json_str(&mut s, e.req.authority().unwrap_or_default());
    s.push_str(&format!(
        ",\"status\":{},\"bytes\":{},\"duration_ms\":{:.3}",
        e.status,
        e.bytes,
        e.duration.as_secs_f64() * 1000.0
    ));
    s.push_str(",\"member\":");
    match e.member {
        Some(m) => json_str(&mut s, m.to_string().as_bytes()),
        None => s.push_str("null"),
    }
    s.push_str(",\"rule\":");
    match e.rule {
        Some(r) => json_str(&mut s, r.as_bytes()),
        None => s.push_str("null"),
    }
    s.push_str(",\"referer\":");
    json_str(
        &mut s,
        e.req.first_value_named(b"referer").unwrap_or_default(),
    );
    s.push_str(",\"user_agent\":");
    json_str(
        &mut s,
        e.req.first_value_named(b"user-agent").unwrap_or_default(),
    );
    s.push_str("}\n");
    s
}
