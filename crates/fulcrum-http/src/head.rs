//! Request and response heads: parsed in place with `httparse`, kept as byte spans into the
//! buffer they were read into, and checked against RFC 9112's framing rules before anything is
//! forwarded.
//!
//! A head is never rebuilt into a header map: the proxy forwards the fields as they came, skipping
//! or replacing the few it must, so each field is classified once here (`FieldKind`) and the
//! forwarding code only looks at the tag.

/// Largest number of header fields any head may have (the configurable limit is at most this).
pub const MAX_FIELDS: usize = 1000;

/// A byte range of a head's buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    #[inline]
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        buf.get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }
    #[inline]
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
    fn of(base: &[u8], part: &[u8]) -> Span {
        let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize) as u32;
        Span {
            start,
            end: start + part.len() as u32,
        }
    }

    /// Appends `part` to `buf`: the span it takes there.
    #[inline]
    fn pushed(buf: &mut Vec<u8>, part: &[u8]) -> Span {
        let start = buf.len() as u32;
        buf.extend_from_slice(part);
        Span {
            start,
            end: buf.len() as u32,
        }
    }
}

/// What the proxy needs to know about a field without comparing its name again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    Host,
    ContentLength,
    TransferEncoding,
    Connection,
    KeepAlive,
    ProxyConnection,
    Te,
    Upgrade,
    Expect,
    Cookie,
    SetCookie,
    Location,
    XForwardedFor,
    XForwardedProto,
    XForwardedHost,
    Forwarded,
    XRealIp,
    Via,
    Http2Settings,
    Trailer,
    Other,
}

impl FieldKind {
    /// Classifies a field name (case-insensitive).
    pub fn of(name: &[u8]) -> FieldKind {
        use FieldKind::*;
        let eq = |s: &[u8]| name.eq_ignore_ascii_case(s);
        match name.len() {
            2 if eq(b"te") => Te,
            3 if eq(b"via") => Via,
            4 if eq(b"host") => Host,
            6 if eq(b"cookie") => Cookie,
            6 if eq(b"expect") => Expect,
            7 if eq(b"upgrade") => Upgrade,
            7 if eq(b"trailer") => Trailer,
            8 if eq(b"location") => Location,
            9 if eq(b"forwarded") => Forwarded,
            9 if eq(b"x-real-ip") => XRealIp,
            10 if eq(b"connection") => Connection,
            10 if eq(b"keep-alive") => KeepAlive,
            10 if eq(b"set-cookie") => SetCookie,
            14 if eq(b"content-length") => ContentLength,
            14 if eq(b"http2-settings") => Http2Settings,
            15 if eq(b"x-forwarded-for") => XForwardedFor,
            16 if eq(b"x-forwarded-host") => XForwardedHost,
            16 if eq(b"proxy-connection") => ProxyConnection,
            17 if eq(b"transfer-encoding") => TransferEncoding,
            17 if eq(b"x-forwarded-proto") => XForwardedProto,
            _ => Other,
        }
    }

    /// Hop-by-hop fields (RFC 9110 §7.6.1) and the framing fields the proxy writes itself.
    #[inline]
    pub fn is_hop_by_hop(self) -> bool {
        use FieldKind::*;
        matches!(
            self,
            Connection
                | KeepAlive
                | ProxyConnection
                | Te
                | TransferEncoding
                | Upgrade
                | Http2Settings
                | ContentLength
        )
    }
}

/// One header field: spans of its name and (trimmed) value, and its kind.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: Span,
    pub value: Span,
    pub kind: FieldKind,
    /// Named in the message's Connection field: hop-by-hop, not forwarded.
    pub hop: bool,
}

/// What the Connection fields of a message say (RFC 9110 §7.6.1).
#[derive(Default)]
struct ConnectionField {
    close: bool,
    keep_alive: bool,
    upgrade: bool,
    hops: HopNames,
}

impl ConnectionField {
    /// Reads one Connection field's value (a span of `buf`); `false` when an item is not a token.
    fn read(&mut self, buf: &[u8], value: &[u8]) -> bool {
        let mut valid = true;
        for t in list_items(value) {
            if t.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if t.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if t.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade = true;
            } else if is_token(t) {
                self.hops.add(Span::of(buf, t));
            } else {
                valid = false;
            }
        }
        valid
    }
}

/// The field names a Connection field lists (RFC 9110 §7.6.1): hop-by-hop, never forwarded.
/// The first eight are kept; a message naming more is not worth a heap allocation.
#[derive(Default)]
struct HopNames {
    names: [Option<Span>; 8],
    len: usize,
}

impl HopNames {
    fn add(&mut self, name: Span) {
        if let Some(slot) = self.names.get_mut(self.len) {
            *slot = Some(name);
            self.len += 1;
        }
    }

    /// Marks the fields the Connection field named as hop-by-hop.
    fn mark(&self, fields: &mut [Field], buf: &[u8]) {
        let named = &self.names[..self.len];
        if named.is_empty() {
            return;
        }
        for f in fields {
            let name = f.name.get(buf);
            if named
                .iter()
                .flatten()
                .any(|s| s.get(buf).eq_ignore_ascii_case(name))
            {
                f.hop = true;
            }
        }
    }
}

/// The fields httparse found in `buf`, as spans of it (the head keeps the bytes, not borrows).
fn copy_fields(fields: &mut Vec<Field>, buf: &[u8], parsed: &[httparse::Header<'_>]) {
    fields.clear();
    fields.extend(parsed.iter().map(|h| {
        let name = h.name.as_bytes();
        Field {
            name: Span::of(buf, name),
            value: Span::of(buf, h.value),
            kind: FieldKind::of(name),
            hop: false,
        }
    }));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    Http10,
    #[default]
    Http11,
    Http2,
}

impl Version {
    /// From httparse's minor version of an HTTP/1.x message.
    fn of_minor(minor: Option<u8>) -> Version {
        if minor == Some(0) {
            Version::Http10
        } else {
            Version::Http11
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
            Version::Http2 => "HTTP/2.0",
        }
    }
}

/// The methods the proxy treats specially.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    #[default]
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Trace,
    Connect,
    Other,
}

impl Method {
    fn of(m: &[u8]) -> Method {
        match m {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"TRACE" => Method::Trace,
            b"CONNECT" => Method::Connect,
            _ => Method::Other,
        }
    }

    /// Idempotent methods (RFC 9110 §9.2.2): a request may be sent again after a failure.
    pub fn is_idempotent(self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Put
                | Method::Delete
                | Method::Options
                | Method::Trace
        )
    }
}

/// Why a request cannot be forwarded; answered with `status` and the connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadError {
    pub status: u16,
    pub reason: &'static str,
}

const TARGET_TOO_LONG: HeadError = HeadError {
    status: 414,
    reason: "request target too long",
};

const HEAD_TOO_LARGE: HeadError = HeadError {
    status: 431,
    reason: "request header too large",
};

const fn bad(reason: &'static str) -> HeadError {
    HeadError {
        status: 400,
        reason,
    }
}

/// Size limits of a request head.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_size: usize,
    pub max_headers: usize,
    pub max_uri: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_size: 32 * 1024,
            max_headers: 100,
            max_uri: 8 * 1024,
        }
    }
}

/// A request head, owning the buffer it was read into. For HTTP/1 the bytes after `head_len` are
/// the start of the body (and possibly of pipelined requests).
#[derive(Debug, Default)]
pub struct RequestHead {
    pub buf: Vec<u8>,
    pub head_len: usize,
    method_span: Span,
    pub method: Method,
    target: Span,
    path: Span,
    query: Option<Span>,
    pub version: Version,
    pub fields: Vec<Field>,
    host: Option<Span>,
    /// The host came from an absolute-form target, not from the Host field.
    pub host_from_target: bool,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// The client wants the connection closed after this exchange.
    pub close: bool,
    /// The protocol a client asks to switch to (`Upgrade` with `Connection: upgrade`).
    upgrade: Option<Span>,
    pub expect_continue: bool,
}

/// Outcome of feeding bytes to the parser.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse {
    Complete,
    Partial,
}

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Iterates the comma-separated elements of a list field value, trimmed, empties skipped.
pub fn list_items(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|b| *b == b',').map(trim).filter(|t| !t.is_empty())
}

fn is_token(v: &[u8]) -> bool {
    !v.is_empty()
        && v.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses a Content-Length value strictly: one or more digits, nothing else.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// A Host value: a reg-name, IPv4 or bracketed IPv6 literal, with an optional port.
fn valid_host(h: &[u8]) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b))
}

/// Whether the first line is `METHOD SP TARGET SP VERSION` (two single spaces).
fn request_line_has_three_parts(buf: &[u8]) -> bool {
    let line = match memchr::memchr(b'\n', buf) {
        Some(i) => &buf[..i],
        None => buf,
    };
    memchr::memchr_iter(b' ', line).count() == 2
}

fn httparse_error(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError {
            status: 431,
            reason: "too many header fields",
        },
        httparse::Error::Version => HeadError {
            status: 505,
            reason: "HTTP version not supported",
        },
        httparse::Error::HeaderName => bad("invalid header field name (or obsolete line folding)"),
        httparse::Error::HeaderValue => {
            bad("invalid header field value (bare CR or control character)")
        }
        httparse::Error::NewLine => bad("invalid line ending"),
        httparse::Error::Token => bad("invalid request line"),
        _ => bad("malformed request head"),
    }
}

/// A response head from a member, owning the buffer it was read into (the body's first bytes
/// follow it).
#[derive(Debug, Default)]
pub struct ResponseHead {
    pub buf: Vec<u8>,
    pub head_len: usize,
    pub status: u16,
    reason: Span,
    pub version: Version,
    pub fields: Vec<Field>,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// The member will close the connection after this response.
    pub close: bool,
}

/// Largest response head accepted from a member.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

mod request;
mod response;

#[cfg(test)]
mod tests;
