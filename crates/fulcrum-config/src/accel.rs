//! Acceleration keys beyond the contract (Fulcrum additions): the per-algorithm levels
//! of `compression.levels`, and the client-side TCP tuning of a virtual service (`tcp`).
//!
//! They live apart from `schema.rs` so the contract's tables stay readable.

use std::time::Duration;

use crate::reader::{Cx, FromNode, Node, Shape};
use crate::types::{read_table, ByteSize};

/// Compression level of each algorithm (`compression.levels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionLevels {
    /// 1 (fastest) to 9 (smallest); nginx's `gzip_comp_level`.
    pub gzip: u32,
    /// 1 to 9, the same scale as gzip (deflate is zlib's format, RFC 9110 §8.4.1.2).
    pub deflate: u32,
    /// Brotli quality, 0 to 11.
    pub br: u32,
    /// Zstandard level, 1 to 19.
    pub zstd: i32,
}

impl Default for CompressionLevels {
    /// Levels that compress text well at a CPU cost close to nginx's gzip level 6: zlib's own
    /// default, brotli 4 and zstd 3 (both faster than gzip 6 and at least as small).
    fn default() -> Self {
        CompressionLevels {
            gzip: 6,
            deflate: 6,
            br: 4,
            zstd: 3,
        }
    }
}

fn level_in(node: &Node<'_>, cx: &mut Cx<'_>, lo: i64, hi: i64) -> Option<i64> {
    match node.shape() {
        Shape::Int(i) if (lo..=hi).contains(&i) => Some(i),
        Shape::Int(i) => {
            cx.error(
                node,
                format!("level {i} is out of range; expected an integer from {lo} to {hi}"),
            );
            None
        }
        _ => {
            cx.error(
                node,
                format!("expected an integer level, found {}", node.type_name()),
            );
            None
        }
    }
}

impl FromNode for CompressionLevels {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = CompressionLevels::default();
            let mut get = |key: &'static str, lo: i64, hi: i64, cx: &mut Cx<'_>| {
                t.node(key).map(|n| level_in(&n, cx, lo, hi))
            };
            let gzip = get("gzip", 1, 9, cx);
            let deflate = get("deflate", 1, 9, cx);
            let br = get("br", 0, 11, cx);
            let zstd = get("zstd", 1, 19, cx);
            Some(CompressionLevels {
                gzip: gzip.map_or(Some(d.gzip), |v| v.map(|v| v as u32))?,
                deflate: deflate.map_or(Some(d.deflate), |v| v.map(|v| v as u32))?,
                br: br.map_or(Some(d.br), |v| v.map(|v| v as u32))?,
                zstd: zstd.map_or(Some(d.zstd), |v| v.map(|v| v as i32))?,
            })
        })
    }
}

/// TCP keepalive probes on client connections (`tcp.keepalive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (TCP_KEEPIDLE).
    pub idle: Duration,
    /// Between probes (TCP_KEEPINTVL).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (TCP_KEEPCNT).
    pub count: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle: Duration::from_secs(60),
            interval: Duration::from_secs(10),
            count: 6,
        }
    }
}

/// The kernel takes keepalive timings in whole seconds from 1 to 32767.
fn whole_secs(n: &Node<'_>, cx: &mut Cx<'_>) -> Option<Duration> {
    let v = Duration::from_node(n, cx)?;
    if v.as_secs() == 0 || v.as_secs() > 32767 || v.subsec_nanos() != 0 {
        cx.error(n, "expected whole seconds from 1s to 32767s");
        return None;
    }
    Some(v)
}

/// `keepalive = false` or a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveSetting(pub Option<Keepalive>);

impl FromNode for KeepaliveSetting {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Bool(false) => Some(KeepaliveSetting(None)),
            Shape::Bool(true) => Some(KeepaliveSetting(Some(Keepalive::default()))),
            Shape::Table(_) => read_table(node, cx, |t, cx| {
                let d = Keepalive::default();
                let idle = match t.node("idle") {
                    Some(n) => whole_secs(&n, cx)?,
                    None => d.idle,
                };
                let interval = match t.node("interval") {
                    Some(n) => whole_secs(&n, cx)?,
                    None => d.interval,
                };
                let count = match t.node("count") {
                    Some(n) => match n.shape() {
                        Shape::Int(i) if (1..=127).contains(&i) => i as u32,
                        _ => {
                            cx.error(&n, "expected an integer from 1 to 127");
                            return None;
                        }
                    },
                    None => d.count,
                };
                Some(KeepaliveSetting(Some(Keepalive {
                    idle,
                    interval,
                    count,
                })))
            }),
            _ => {
                cx.error(
                    node,
                    format!(
                        "expected false or a table {{ idle, interval, count }}, found {}",
                        node.type_name()
                    ),
                );
                None
            }
        }
    }
}

/// Client-side TCP options of a virtual service (`tcp`). Unset options keep the system's
/// defaults. They are set on the listening sockets, and Linux copies them to every accepted
/// connection (no system call per connection).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TcpTuning {
    /// Congestion control algorithm (TCP_CONGESTION): "bbr", "cubic", … as the kernel lists
    /// them in /proc/sys/net/ipv4/tcp_available_congestion_control.
    pub congestion: Option<String>,
    /// TCP_NODELAY: send small segments at once instead of coalescing them (Nagle).
    pub nodelay: Option<bool>,
    /// TCP_NOTSENT_LOWAT: unsent bytes the kernel buffers before the socket stops being
    /// writable.
    pub notsent_lowat: Option<u32>,
    /// SO_KEEPALIVE and its timings; `Some(None)` = explicitly off.
    pub keepalive: Option<Option<Keepalive>>,
    /// TCP Fast Open queue length on the listener; 0 = off.
    pub fast_open: Option<u32>,
    /// SO_SNDBUF in bytes (the kernel doubles it for bookkeeping; autotuning stops).
    pub send_buffer: Option<u32>,
    /// SO_RCVBUF in bytes (also bounds the window scale offered in the SYN-ACK).
    pub recv_buffer: Option<u32>,
}

/// Keys of `tcp`, for messages.
pub const TCP_TUNING_KEYS: &[&str] = &[
    "congestion",
    "nodelay",
    "notsent_lowat",
    "keepalive",
    "fast_open",
    "send_buffer",
    "recv_buffer",
];

fn size_u32(node: &Node<'_>, cx: &mut Cx<'_>, lo: u64, hi: u64) -> Option<u32> {
    let v = ByteSize::from_node(node, cx)?.0;
    if !(lo..=hi).contains(&v) {
        cx.error(
            node,
            format!("{v} bytes is out of range; expected {lo} to {hi}"),
        );
        return None;
    }
    Some(v as u32)
}

impl FromNode for TcpTuning {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let congestion = match t.node("congestion") {
                Some(n) => match n.shape() {
                    Shape::Str(s)
                        if !s.is_empty()
                            && s.len() < 16
                            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                    {
                        Some(s.to_string())
                    }
                    _ => {
                        cx.error(
                            &n,
                            "expected a congestion control name such as \"bbr\" or \"cubic\"",
                        );
                        return None;
                    }
                },
                None => None,
            };
            let nodelay = t.opt(cx, "nodelay");
            let notsent_lowat = t
                .node("notsent_lowat")
                .map(|n| size_u32(&n, cx, 1, u32::MAX as u64));
            let keepalive = t.opt::<KeepaliveSetting>(cx, "keepalive").map(|k| k.0);
            let fast_open = match t.node("fast_open") {
                Some(n) => match n.shape() {
                    Shape::Int(i) if (0..=65535).contains(&i) => Some(i as u32),
                    Shape::Bool(false) => Some(0),
                    _ => {
                        cx.error(
                            &n,
                            "expected the Fast Open queue length, an integer from 0 (off) to 65535",
                        );
                        return None;
                    }
                },
                None => None,
            };
            // The kernel's floor is a few KiB; above 1 GiB it clamps to its own maximum.
            let send_buffer = t
                .node("send_buffer")
                .map(|n| size_u32(&n, cx, 4096, 1 << 30));
            let recv_buffer = t
                .node("recv_buffer")
                .map(|n| size_u32(&n, cx, 4096, 1 << 30));
            Some(TcpTuning {
                congestion,
                nodelay,
                notsent_lowat: notsent_lowat.map_or(Some(None), |v| v.map(Some))?,
                keepalive,
                fast_open,
                send_buffer: send_buffer.map_or(Some(None), |v| v.map(Some))?,
                recv_buffer: recv_buffer.map_or(Some(None), |v| v.map(Some))?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::parse;
    use std::path::Path;

    fn service(extra: &str) -> String {
        format!(
            "[[pool]]\nname = \"p\"\nmember = [{{ address = \"127.0.0.1:8080\" }}]\n\n[[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:80\"\nprotocol = \"http\"\npool = \"p\"\n{extra}\n"
        )
    }

    fn errors(extra: &str) -> String {
        match parse(&service(extra), "t.toml", Path::new(".")) {
            Ok(_) => String::new(),
            Err(e) => e.messages().join("\n"),
        }
    }

    #[test]
    fn levels_default_and_override() {
        let c = parse(
            &service("compression = { levels = { gzip = 1, br = 11 } }"),
            "t.toml",
            Path::new("."),
        )
        .unwrap();
        let l = c.virtual_services[0]
            .as_http()
            .unwrap()
            .compression
            .as_ref()
            .unwrap()
            .levels;
        assert_eq!((l.gzip, l.deflate, l.br, l.zstd), (1, 6, 11, 3));
    }

    #[test]
    fn levels_out_of_range_are_located() {
        let e = errors("compression = { levels = { gzip = 10 } }");
        assert!(e.contains("t.toml:10:"), "{e}");
        assert!(e.contains("compression.levels.gzip"), "{e}");
        assert!(e.contains("from 1 to 9"), "{e}");
        let e = errors("compression = { levels = { zstd = 0, brotli = 3 } }");
        assert!(e.contains("from 1 to 19"), "{e}");
        assert!(e.contains("unknown key `brotli`"), "{e}");
    }

    #[test]
    fn tcp_tuning_reads_every_key() {
        let c = parse(
            &service(
                "tcp = { congestion = \"bbr\", nodelay = true, notsent_lowat = \"16KiB\", keepalive = { idle = \"30s\", count = 3 }, fast_open = 256, send_buffer = \"1MiB\", recv_buffer = 262144 }",
            ),
            "t.toml",
            Path::new("."),
        )
        .unwrap();
        let t = c.virtual_services[0].tcp_tuning().cloned().unwrap();
        assert_eq!(t.congestion.as_deref(), Some("bbr"));
        assert_eq!(t.nodelay, Some(true));
        assert_eq!(t.notsent_lowat, Some(16384));
        let k = t.keepalive.unwrap().unwrap();
        assert_eq!(
            (k.idle.as_secs(), k.interval.as_secs(), k.count),
            (30, 10, 3)
        );
        assert_eq!(t.fast_open, Some(256));
        assert_eq!(t.send_buffer, Some(1 << 20));
        assert_eq!(t.recv_buffer, Some(262144));
        let c = parse(
            &service("tcp = { keepalive = false }"),
            "t.toml",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(
            c.virtual_services[0].tcp_tuning().unwrap().keepalive,
            Some(None)
        );
    }

    #[test]
    fn tcp_tuning_errors_are_located() {
        let e = errors("tcp = { congestion = \"b b r\" }");
        assert!(e.contains("tcp.congestion"), "{e}");
        let e = errors("tcp = { keepalive = { idle = \"0s\" } }");
        assert!(e.contains("tcp.keepalive.idle"), "{e}");
        let e = errors("tcp = { send_buffer = 12 }");
        assert!(e.contains("tcp.send_buffer") && e.contains("4096"), "{e}");
        let e = errors("tcp = { fast_open = -1 }");
        assert!(e.contains("tcp.fast_open"), "{e}");
        let e = errors("tcp = { nagle = true }");
        assert!(e.contains("unknown key `nagle`"), "{e}");
    }

    #[test]
    fn tcp_tuning_not_for_udp() {
        let text = "[[pool]]\nname = \"p\"\nmember = [{ address = \"127.0.0.1:53\" }]\n[[virtual_service]]\nname = \"u\"\nlisten = \"127.0.0.1:53\"\nprotocol = \"udp\"\npool = \"p\"\ntcp = { nodelay = true }\n";
        let e = parse(text, "t.toml", Path::new("."))
            .err()
            .unwrap()
            .messages()
            .join("\n");
        assert!(e.contains("`tcp` applies to protocol"), "{e}");
    }
}
