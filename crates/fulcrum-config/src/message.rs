//! Keys of `protocol = "message"` virtual services (message-based load balancing): how the byte
//! stream is cut into messages (`framing`), where the id pairing a response with its request sits
//! (`sequence`), and how Fulcrum keeps and uses its connections to members.
//!
//! The contract names `framing` (length prefix), `message_mode` and `sequence`; the length encodings,
//! the delimiter variant, `length_adjust` and the connection and delivery keys are Fulcrum
//! additions, documented in docs/configuration.md.

use std::ops::Range;
use std::time::Duration;

use crate::protocol::Protocol;
use crate::reader::{Cx, FromNode, Node, Shape, TableReader};
use crate::rule::{read_l4_rules, Rule};
use crate::stream::{MemberSource, StreamOptions};
use crate::string_enum;
use crate::tls::TlsTermination;
use crate::types::{read_table, ByteSize};

string_enum!(MessageMode { Sync = "sync", Async = "async" });

/// The section of a `protocol = "message"` virtual service.
#[derive(Debug, Clone)]
pub struct MessageSection {
    pub stream: StreamOptions,
    /// TLS terminated in front of the members (`tls`).
    pub tls: Option<TlsTermination>,
    /// How the byte stream is cut into messages (the defaults when `framing` is not written).
    pub framing: Framing,
    pub mode: MessageMode,
    pub sequence: Option<Sequence>,
    /// Member connections and delivery (Fulcrum additions).
    pub options: MessageOptions,
    /// `simplex`: each member takes requests on one connection and answers on another.
    pub simplex: Option<Simplex>,
    /// `member_requests`: requests the members send of their own, and where they go.
    pub member_requests: Option<MemberRequests>,
    /// Rules choosing the pool of a client connection (first match wins; none: the service's
    /// pool).
    pub rules: Vec<Rule>,
}

/// The keys a message section reads besides the stream and TLS keys.
pub const MESSAGE_SECTION_KEYS: &[&str] = &[
    "framing",
    "message_mode",
    "sequence",
    "member_connections",
    "max_pending",
    "client_max_pending",
    "member_queue",
    "message_timeout",
    "delivery",
    "max_attempts",
    "simplex",
    "member_requests",
];

impl MessageSection {
    /// Reads and checks the section of a message service.
    pub(crate) fn read(
        t: &mut TableReader<'_>,
        cx: &mut Cx<'_>,
        node: &Node<'_>,
    ) -> MessageSection {
        let mut stream = StreamOptions::read(t, cx);
        stream.read_source(t, cx);
        if stream.source == MemberSource::Client {
            // A member connection of a message service carries the messages of many clients,
            // scheduled one by one; it has no single client whose address it could take. One
            // set of member connections per client connection would give up the point of the
            // service (many clients over few long-lived member connections, per-message
            // balancing) and cost member_connections × members connects per client.
            cx.error_path(
                &format!("{}.source", t.path()),
                "`source = \"client\"` is not available on message services: a member connection carries the messages of many clients, so it cannot come from one client's address; use a tcp service for members that must see each client's address",
            );
        }
        let tls = TlsTermination::read(t, cx, node, Protocol::Message);
        let framing: Framing = t.opt(cx, "framing").unwrap_or_default();
        let mode = t.opt(cx, "message_mode").unwrap_or(MessageMode::Async);
        let sequence: Option<Sequence> = t.opt(cx, "sequence");
        let simplex: Option<Simplex> = t.opt(cx, "simplex");
        let mut options = MessageOptions::read(t, cx, node, mode);
        let member_requests: Option<MemberRequests> = t.opt(cx, "member_requests");
        let rules = read_l4_rules(
            t,
            cx,
            Protocol::Message,
            &crate::forwarding::ForwardingOptions::default(),
        );
        let at = format!("{}.sequence", t.path());
        if sequence.is_some() && framing.wasm.is_some() {
            cx.error_path(
                &at,
                "a framing hook (`framing.wasm`) gives each message's sequence key itself; remove `sequence`",
            );
        }
        if let Some(seq) = &sequence {
            if mode == MessageMode::Sync {
                cx.error_path(
                    &at,
                    "`sequence` pairs pipelined responses: it needs message_mode = \"async\"",
                );
            }
            if seq.offset.saturating_add(seq.length) > framing.max_message {
                cx.error_path(
                    &at,
                    format!(
                        "the id at bytes {}..{} of the body lies beyond max_message ({} bytes)",
                        seq.offset,
                        seq.offset.saturating_add(seq.length),
                        framing.max_message
                    ),
                );
            }
        }
        let pairs_by_id =
            mode == MessageMode::Async && (sequence.is_some() || framing.wasm.is_some());
        if simplex.is_some() {
            let at = format!("{}.simplex", t.path());
            if !pairs_by_id {
                cx.error_path(
                    &at,
                    "a simplex member answers on another connection than the one the request went out on, so answers can only be paired by id: it needs message_mode = \"async\" and `sequence`",
                );
            }
            if t.has("member_connections") && options.member_connections != 1 {
                key_error(
                    t,
                    cx,
                    node,
                    "member_connections",
                    format!(
                        "a simplex member has one send and one receive connection; member_connections = {} needs a duplex pool (remove `simplex`), or write 1",
                        options.member_connections
                    ),
                );
            }
            options.member_connections = 1;
        }
        if let Some(reqs) = &member_requests {
            let at = format!("{}.member_requests", t.path());
            if mode == MessageMode::Sync {
                cx.error_path(
                    &at,
                    "a member's own requests share its connections with the answers Fulcrum waits for; sync mode has one message at a time on a connection: it needs message_mode = \"async\"",
                );
            } else if !pairs_by_id {
                cx.error_path(
                    &at,
                    "a member's own request is told from an answer, and the client's answer is told from a new request, by the sequence id: it needs `sequence`",
                );
            }
            for (key, field) in [
                ("client_field", &reqs.client_field),
                (
                    "marker",
                    &reqs.marker.as_ref().map(|m| Sequence {
                        offset: m.offset,
                        length: m.value.len(),
                    }),
                ),
            ] {
                if let Some(f) = field {
                    if f.offset.saturating_add(f.length) > framing.max_message {
                        cx.error_path(
                            &format!("{at}.{key}"),
                            format!(
                                "the field at bytes {}..{} of the body lies beyond max_message ({} bytes)",
                                f.offset,
                                f.offset.saturating_add(f.length),
                                framing.max_message
                            ),
                        );
                    }
                }
            }
        }
        MessageSection {
            stream,
            tls,
            framing,
            mode,
            sequence,
            options,
            simplex,
            member_requests,
            rules,
        }
    }
}

string_enum!(
    /// How the length field of a length-prefixed frame is written.
    LengthEncoding {
        /// An unsigned binary integer of `length_bytes` bytes (`big_endian` or little-endian).
        Binary = "binary",
        /// `length_bytes` ASCII decimal digits, e.g. "0123" (common on ISO 8583 links).
        Ascii = "ascii",
        /// Packed BCD: two decimal digits per byte, `length_bytes` bytes, e.g. 0x01 0x23 = 123.
        Bcd = "bcd",
    }
);

string_enum!(
    /// What happens to a message whose member connection died before the member answered it.
    Delivery {
        /// Sent again to another member (up to `max_attempts` sends in all): the client gets its
        /// answer, and a member may see the message twice.
        AtLeastOnce = "at_least_once",
        /// Never sent twice: the message fails, and the client gets no answer for it.
        AtMostOnce = "at_most_once",
    }
);

/// The largest message (`max_message`) a service may allow: bounds the memory one frame can take.
pub const MAX_MESSAGE_LIMIT: u64 = 64 << 20;
/// The longest `sequence` id, in bytes.
pub const MAX_SEQUENCE_LENGTH: usize = 64;
/// The longest delimiter, in bytes.
pub const MAX_DELIMITER: usize = 16;

/// How a byte stream is cut into messages; the same framing applies to requests and responses.
///
/// With a length prefix, a frame is `length_offset` bytes of leading header, the length field of
/// `length_bytes` bytes, then the body. The length field counts the body (or, with
/// `length_includes_header`, the whole frame), plus `length_adjust`. With a `delimiter`, a frame is
/// everything up to and including the delimiter, and the body is what precedes the delimiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framing {
    pub length_bytes: u8,
    pub length_offset: usize,
    pub big_endian: bool,
    pub length_includes_header: bool,
    /// The largest body accepted, in bytes (the bytes after the length field, or before the
    /// delimiter). A larger frame closes the connection that sent it.
    pub max_message: usize,
    /// Fulcrum addition: binary, ASCII decimal or BCD length field.
    pub length_encoding: LengthEncoding,
    /// Fulcrum addition: added to the length field's value to get the body length (or the frame
    /// length with `length_includes_header`), for protocols whose length counts something else.
    pub length_adjust: i64,
    /// Fulcrum addition: frames end with these bytes instead of having a length prefix.
    pub delimiter: Option<Vec<u8>>,
    /// A WebAssembly framing hook (`fulcrum_on_message_frame`): the module says where each
    /// message ends and where its sequence key lies, as an iRule would.
    pub wasm: Option<std::path::PathBuf>,
}

impl Default for Framing {
    fn default() -> Self {
        Framing {
            length_bytes: 2,
            length_offset: 0,
            big_endian: true,
            length_includes_header: false,
            max_message: 65536,
            length_encoding: LengthEncoding::Binary,
            length_adjust: 0,
            delimiter: None,
            wasm: None,
        }
    }
}

impl Framing {
    /// Bytes before the body: the leading header and the length field (0 with a delimiter).
    pub fn header_len(&self) -> usize {
        if self.delimiter.is_some() {
            0
        } else {
            self.length_offset + usize::from(self.length_bytes)
        }
    }
}

/// Reports an error at `key` of the table `t` (at the key itself when it was written).
fn key_error(
    t: &mut TableReader<'_>,
    cx: &mut Cx<'_>,
    table: &Node<'_>,
    key: &'static str,
    msg: String,
) {
    let span = t
        .node(key)
        .and_then(|n| n.span.clone())
        .or_else(|| table.span.clone());
    cx.error_at(span, &format!("{}.{key}", t.path()), msg);
}

/// Delimiter bytes: a string (its UTF-8 bytes, TOML escapes such as "\r\n" or "\u0003"), or an
/// array of byte values (`[0x03]`) for bytes a string cannot hold.
struct DelimiterBytes(Vec<u8>);

impl FromNode for DelimiterBytes {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Str(s) => Some(DelimiterBytes(s.as_bytes().to_vec())),
            Shape::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in &items {
                    match item.shape() {
                        Shape::Int(i) if (0..=255).contains(&i) => out.push(i as u8),
                        _ => {
                            cx.error(item, "expected a byte value from 0 to 255");
                            return None;
                        }
                    }
                }
                Some(DelimiterBytes(out))
            }
            _ => {
                cx.error(
                    node,
                    format!(
                        "expected a string or an array of byte values, found {}",
                        node.type_name()
                    ),
                );
                None
            }
        }
    }
}

/// The keys that describe a length prefix (a frame with a `delimiter` or a `wasm` hook has none).
const LENGTH_PREFIX_KEYS: [&str; 6] = [
    "length_bytes",
    "length_offset",
    "big_endian",
    "length_includes_header",
    "length_encoding",
    "length_adjust",
];

impl FromNode for Framing {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Framing::default();
            let length_bytes: u8 = t.opt(cx, "length_bytes").unwrap_or(d.length_bytes);
            let length_offset: usize = t.opt(cx, "length_offset").unwrap_or(d.length_offset);
            let big_endian = t.opt(cx, "big_endian").unwrap_or(d.big_endian);
            let length_includes_header = t
                .opt(cx, "length_includes_header")
                .unwrap_or(d.length_includes_header);
            let max_message: Option<ByteSize> = t.opt(cx, "max_message");
            let length_encoding: LengthEncoding =
                t.opt(cx, "length_encoding").unwrap_or(d.length_encoding);
            let length_adjust: i64 = t.opt(cx, "length_adjust").unwrap_or(0);
            let delimiter: Option<DelimiterBytes> = t.opt(cx, "delimiter");
            let wasm: Option<String> = t.opt(cx, "wasm");

            let (allowed, what): (&[u8], &str) = match length_encoding {
                LengthEncoding::Binary => (&[1, 2, 4, 8], "1, 2, 4 or 8 bytes"),
                LengthEncoding::Ascii => (&[1, 2, 3, 4, 5, 6, 7, 8], "1 to 8 digits"),
                LengthEncoding::Bcd => (&[1, 2, 3, 4], "1 to 4 bytes (2 to 8 digits)"),
            };
            if !allowed.contains(&length_bytes) {
                key_error(
                    t,
                    cx,
                    node,
                    "length_bytes",
                    format!(
                        "{length_bytes} is not supported for a {length_encoding} length; expected {what}"
                    ),
                );
            }
            if length_offset > 4096 {
                key_error(
                    t,
                    cx,
                    node,
                    "length_offset",
                    format!("{length_offset} is too large; expected 0 to 4096"),
                );
            }
            if t.has("big_endian") && length_encoding != LengthEncoding::Binary {
                key_error(
                    t,
                    cx,
                    node,
                    "big_endian",
                    format!(
                        "`big_endian` applies to binary lengths; a {length_encoding} length is always written most significant digit first"
                    ),
                );
            }
            if !(-65536..=65536).contains(&length_adjust) {
                key_error(
                    t,
                    cx,
                    node,
                    "length_adjust",
                    format!("{length_adjust} is out of range; expected -65536 to 65536"),
                );
            }
            let max_message = max_message.map_or(d.max_message as u64, |s| s.0);
            if max_message == 0 || max_message > MAX_MESSAGE_LIMIT {
                key_error(
                    t,
                    cx,
                    node,
                    "max_message",
                    format!(
                        "{max_message} is out of range; expected 1 to {MAX_MESSAGE_LIMIT} (64 MiB)"
                    ),
                );
            }
            let delimiter = delimiter.map(|d| d.0);
            if let Some(bytes) = &delimiter {
                if bytes.is_empty() || bytes.len() > MAX_DELIMITER {
                    key_error(
                        t,
                        cx,
                        node,
                        "delimiter",
                        format!(
                            "a delimiter of {} bytes is not supported; expected 1 to {MAX_DELIMITER} bytes",
                            bytes.len()
                        ),
                    );
                }
                if let Some(k) = LENGTH_PREFIX_KEYS.iter().find(|k| t.has(k)) {
                    key_error(
                        t,
                        cx,
                        node,
                        "delimiter",
                        format!(
                            "a frame ends with `delimiter` or has a length prefix, not both; remove `delimiter` or `{k}`"
                        ),
                    );
                }
            }
            if let Some(m) = &wasm {
                let mut other = LENGTH_PREFIX_KEYS.iter().chain(&["delimiter"]);
                if let Some(k) = other.find(|k| t.has(k)) {
                    key_error(
                        t,
                        cx,
                        node,
                        "wasm",
                        format!(
                            "a framing hook decides where frames end: remove `{k}` (or `wasm`)"
                        ),
                    );
                } else if !(m.ends_with(".wasm") || m.ends_with(".wat")) {
                    key_error(
                        t,
                        cx,
                        node,
                        "wasm",
                        "expected the path of a WebAssembly module (.wasm, or .wat in the text format)".to_string(),
                    );
                }
            }
            Some(Framing {
                wasm: wasm.map(Into::into),
                length_bytes,
                length_offset,
                big_endian,
                length_includes_header,
                max_message: usize::try_from(max_message).unwrap_or(usize::MAX),
                length_encoding,
                length_adjust,
                delimiter,
            })
        })
    }
}

/// Where, in a message's body, the id pairing a response with its request sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    pub offset: usize,
    pub length: usize,
}

impl Sequence {
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.length
    }
}

impl FromNode for Sequence {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let offset = t.req(cx, "offset");
            let length: Option<usize> = t.req(cx, "length");
            if let Some(l) = length {
                if l == 0 || l > MAX_SEQUENCE_LENGTH {
                    key_error(
                        t,
                        cx,
                        node,
                        "length",
                        format!("{l} is out of range; expected 1 to {MAX_SEQUENCE_LENGTH} bytes"),
                    );
                }
            }
            Some(Sequence {
                offset: offset?,
                length: length?,
            })
        })
    }
}

/// `simplex`: the members of the service's pools answer on another connection than the one they
/// receive requests on. Per member, Fulcrum keeps a send-only connection to the member's address
/// and a receive-only connection, which it opens to the member's IP at `receive_port`, or which
/// the member opens to `receive_listen`; a member is up only while both are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Simplex {
    /// `receive_port`: Fulcrum connects to the member's IP at this port.
    ReceivePort(u16),
    /// `receive_listen`: the member connects here; its source IP says which member it is.
    ReceiveListen(std::net::SocketAddr),
}

impl FromNode for Simplex {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let port: Option<u16> = t.opt(cx, "receive_port");
            let listen: Option<std::net::SocketAddr> = t.opt(cx, "receive_listen");
            match (port, listen) {
                (Some(0), _) => {
                    key_error(
                        t,
                        cx,
                        node,
                        "receive_port",
                        "0 is not a port; expected 1 to 65535".to_string(),
                    );
                    None
                }
                (Some(port), None) => Some(Simplex::ReceivePort(port)),
                (None, Some(listen)) => Some(Simplex::ReceiveListen(listen)),
                (Some(_), Some(_)) => {
                    cx.error(
                        node,
                        "the receive connection is opened by Fulcrum (`receive_port`) or by the member (`receive_listen`), not both: remove one",
                    );
                    None
                }
                (None, None) if t.has("receive_port") || t.has("receive_listen") => None,
                (None, None) => {
                    cx.error(
                        node,
                        "a simplex member answers on a receive connection: write `receive_port` (Fulcrum connects to the member's IP at that port) or `receive_listen` (the members connect to that address)",
                    );
                    None
                }
            }
        })
    }
}

/// Bytes at a fixed place of a message's body that mark it as a request (`member_requests.marker`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub offset: usize,
    pub value: Vec<u8>,
}

impl FromNode for Marker {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let offset: Option<usize> = t.req(cx, "offset");
            let value: Option<DelimiterBytes> = t.req(cx, "value");
            let value = value?.0;
            if value.is_empty() || value.len() > MAX_SEQUENCE_LENGTH {
                key_error(
                    t,
                    cx,
                    node,
                    "value",
                    format!(
                        "a marker of {} bytes is not supported; expected 1 to {MAX_SEQUENCE_LENGTH} bytes",
                        value.len()
                    ),
                );
            }
            Some(Marker {
                offset: offset?,
                value,
            })
        })
    }
}

/// `member_requests`: a member sends requests of its own (not answers to anything Fulcrum sent:
/// their sequence id matches no waiting message, or they carry `marker`). Each goes to the
/// client connection whose messages carry the same `client_field`, else to a member of
/// `fallback_pool` (round robin over Fulcrum's own connections to that pool); the answer, paired
/// by sequence id, goes back to the member that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRequests {
    /// Where the name of the client connection sits in a message's body (e.g. a terminal id).
    pub client_field: Option<Sequence>,
    /// The pool that takes member requests no named client connection can take.
    pub fallback_pool: Option<String>,
    /// Marks a message from a member as a request; without it, a message whose id matches no
    /// waiting message is one.
    pub marker: Option<Marker>,
}

impl FromNode for MemberRequests {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let client_field: Option<Sequence> = t.opt(cx, "client_field");
            let fallback_pool: Option<String> = t.opt(cx, "fallback_pool");
            let marker: Option<Marker> = t.opt(cx, "marker");
            if !t.has("client_field") && !t.has("fallback_pool") {
                cx.error(
                    node,
                    "a member's request needs somewhere to go: write `client_field` (the client connection named in the message), `fallback_pool`, or both",
                );
            }
            Some(MemberRequests {
                client_field,
                fallback_pool,
                marker,
            })
        })
    }
}

/// Default `member_queue`: messages waiting per member before client connections are paused.
pub const DEFAULT_MEMBER_QUEUE: u32 = 4096;

/// Fulcrum additions for message services: the member connections and message delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageOptions {
    /// Connections Fulcrum keeps to each member. async: opened at once and kept; sync: opened as
    /// messages need them, up to this many, and kept for reuse.
    pub member_connections: u32,
    /// async: messages outstanding on one member connection at most (sync: always 1).
    pub max_pending: u32,
    /// Messages one client connection may have outstanding; past it Fulcrum stops reading that
    /// client until answers come back.
    pub client_max_pending: u32,
    /// Messages waiting for one member's connections at most: a member at the bound is passed
    /// over while another has room; when none has, client connections stop reading until the
    /// queue is half empty (back-pressure).
    pub member_queue: u32,
    /// How long a message may wait for its answer, from its arrival, before it fails.
    pub message_timeout: Duration,
    pub delivery: Delivery,
    /// Sends of one message to members in all (the first and the re-sends).
    pub max_attempts: u32,
}

impl MessageOptions {
    /// Reads the keys from a virtual service table; defaults depend on the message mode.
    pub(crate) fn read(
        t: &mut TableReader<'_>,
        cx: &mut Cx<'_>,
        node: &Node<'_>,
        mode: MessageMode,
    ) -> Self {
        let default_connections = match mode {
            MessageMode::Async => 2,
            MessageMode::Sync => 8,
        };
        let mut o = MessageOptions {
            member_connections: t
                .opt(cx, "member_connections")
                .unwrap_or(default_connections),
            max_pending: t.opt(cx, "max_pending").unwrap_or(256),
            client_max_pending: t.opt(cx, "client_max_pending").unwrap_or(1024),
            member_queue: t.opt(cx, "member_queue").unwrap_or(DEFAULT_MEMBER_QUEUE),
            message_timeout: t
                .opt(cx, "message_timeout")
                .unwrap_or(Duration::from_secs(30)),
            delivery: t.opt(cx, "delivery").unwrap_or(Delivery::AtLeastOnce),
            max_attempts: t.opt(cx, "max_attempts").unwrap_or(3),
        };
        for (key, value, max) in [
            ("member_connections", &mut o.member_connections, 1024),
            ("max_pending", &mut o.max_pending, 65536),
            ("client_max_pending", &mut o.client_max_pending, 65536),
            ("member_queue", &mut o.member_queue, 1 << 20),
            ("max_attempts", &mut o.max_attempts, 16),
        ] {
            if *value == 0 || *value > max {
                key_error(
                    t,
                    cx,
                    node,
                    key,
                    format!("{value} is out of range; expected 1 to {max}"),
                );
                *value = (*value).clamp(1, max);
            }
        }
        if o.message_timeout.is_zero() {
            key_error(
                t,
                cx,
                node,
                "message_timeout",
                "must be longer than 0s".into(),
            );
        }
        if o.delivery == Delivery::AtMostOnce && t.has("max_attempts") && o.max_attempts > 1 {
            key_error(
                t,
                cx,
                node,
                "max_attempts",
                format!(
                    "delivery = \"at_most_once\" never sends a message twice; max_attempts = {} needs delivery = \"at_least_once\"",
                    o.max_attempts
                ),
            );
        }
        if o.delivery == Delivery::AtMostOnce {
            o.max_attempts = 1;
        }
        o
    }
}
