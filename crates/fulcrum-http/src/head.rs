//! Request and response heads: parsed in place with `httparse`, kept as byte spans into the
//! buffer they were read into, and checked against RFC 9112's framing rules before anything is
//! forwarded.
//!
//! A head is never rebuilt into a header map: the proxy forwards the fields as they came, skipping
//! or replacing the few it must, so each field is classified once here (`FieldKind`) and the
//! forwarding code only looks at the tag.

use std::mem::MaybeUninit;

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

impl RequestHead {
    /// An empty head around `buf` (bytes already read are kept).
    pub fn with_buffer(buf: Vec<u8>) -> RequestHead {
        RequestHead {
            buf,
            ..RequestHead::default()
        }
    }

    /// Forgets the parsed head, keeping the buffer's bytes.
    pub fn reset(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut fields = std::mem::take(&mut self.fields);
        fields.clear();
        *self = RequestHead {
            buf,
            fields,
            ..RequestHead::default()
        };
    }

    /// Parses `buf` as an HTTP/1.x request head. `Partial` asks for more bytes; an error names
    /// the status to answer (400, 414, 431, 505) before closing.
    pub fn parse(&mut self, limits: &Limits) -> Result<Parse, HeadError> {
        let max_fields = limits.max_headers.min(MAX_FIELDS);
        let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_FIELDS] =
            [const { MaybeUninit::uninit() }; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut []);
        let buf = &self.buf[..];
        let status = req
            .parse_with_uninit_headers(buf, &mut slots[..max_fields])
            .map_err(|e| match e {
                // "GET /a b HTTP/1.1" fails on its version, but is a malformed request line.
                httparse::Error::Version if !request_line_has_three_parts(buf) => {
                    bad("invalid request line")
                }
                e => httparse_error(e),
            })?;
        let head_len = match status {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => {
                if buf.len() >= limits.max_header_size {
                    return Err(match memchr::memchr(b'\n', buf) {
                        None if buf.len() > limits.max_uri => HeadError {
                            status: 414,
                            reason: "request target too long",
                        },
                        _ => HeadError {
                            status: 431,
                            reason: "request header too large",
                        },
                    });
                }
                if memchr::memchr(b'\n', buf).is_none() && buf.len() > limits.max_uri + 32 {
                    return Err(HeadError {
                        status: 414,
                        reason: "request target too long",
                    });
                }
                return Ok(Parse::Partial);
            }
        };
        if head_len > limits.max_header_size {
            return Err(HeadError {
                status: 431,
                reason: "request header too large",
            });
        }
        let method = req.method.unwrap_or_default().as_bytes();
        let target = req.path.unwrap_or_default().as_bytes();
        if target.len() > limits.max_uri {
            return Err(HeadError {
                status: 414,
                reason: "request target too long",
            });
        }
        self.head_len = head_len;
        self.method_span = Span::of(buf, method);
        self.method = Method::of(method);
        self.target = Span::of(buf, target);
        self.version = Version::of_minor(req.version);
        copy_fields(&mut self.fields, buf, req.headers);
        self.validate()?;
        Ok(Parse::Complete)
    }

    /// Builds a head from parts that an HTTP/2 connection already decoded: serialises them into
    /// the same byte form, so everything after this point treats both protocols alike. RFC 9113
    /// §8.2.3 lets a client split Cookie over several fields; they stay separate here and are
    /// joined when forwarded to an HTTP/1.1 member.
    pub fn from_h2(
        method: &[u8],
        path_and_query: &[u8],
        authority: Option<&[u8]>,
        headers: &http::HeaderMap,
        limits: &Limits,
    ) -> Result<RequestHead, HeadError> {
        if path_and_query.len() > limits.max_uri {
            return Err(HeadError {
                status: 414,
                reason: "request target too long",
            });
        }
        if headers.len() > limits.max_headers {
            return Err(HeadError {
                status: 431,
                reason: "too many header fields",
            });
        }
        let mut buf = Vec::with_capacity(256);
        let mut h = RequestHead::default();
        let push = |buf: &mut Vec<u8>, b: &[u8]| {
            let start = buf.len() as u32;
            buf.extend_from_slice(b);
            Span {
                start,
                end: buf.len() as u32,
            }
        };
        h.method_span = push(&mut buf, method);
        h.method = Method::of(method);
        let target = if path_and_query.is_empty() {
            &b"/"[..]
        } else {
            path_and_query
        };
        h.target = push(&mut buf, target);
        h.version = Version::Http2;
        let mut size = buf.len();
        if let Some(a) = authority {
            let name = push(&mut buf, b"host");
            let value = push(&mut buf, a);
            h.fields.push(Field {
                name,
                value,
                kind: FieldKind::Host,
                hop: false,
            });
        }
        for (name, value) in headers {
            // An HTTP/2 request carries its authority in :authority; a Host field as well is
            // allowed, but :authority wins (RFC 9113 §8.3.1).
            if authority.is_some() && name == http::header::HOST {
                continue;
            }
            let n = name.as_str().as_bytes();
            size += n.len() + value.len() + 4;
            let ns = push(&mut buf, n);
            let vs = push(&mut buf, value.as_bytes());
            h.fields.push(Field {
                name: ns,
                value: vs,
                kind: FieldKind::of(n),
                hop: false,
            });
        }
        if size > limits.max_header_size {
            return Err(HeadError {
                status: 431,
                reason: "request header too large",
            });
        }
        h.head_len = buf.len();
        h.buf = buf;
        h.validate()?;
        Ok(h)
    }

    /// This head as a filter left it: `pairs` holds the pseudo-fields (`:method`, `:path`,
    /// `:authority`; `:scheme` is the connection's and is ignored) and the fields, and the result
    /// is checked as a received head is. The bytes after the head (body, pipelined requests)
    /// stay after it. The framing may not change: the client's body is framed as it sent it.
    pub fn rebuilt(
        &self,
        pairs: &[(Vec<u8>, Vec<u8>)],
        limits: &Limits,
    ) -> Result<RequestHead, HeadError> {
        let pseudo = |n: &[u8]| {
            pairs
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_slice())
        };
        let method = pseudo(b":method").unwrap_or(self.method_bytes());
        let target = pseudo(b":path").unwrap_or(self.target());
        let authority = pseudo(b":authority");
        if !is_token(method) {
            return Err(bad("a filter set an invalid :method"));
        }
        if target.is_empty() || target.iter().any(|&b| b <= b' ' || b == 0x7f) {
            return Err(bad("a filter set an invalid :path"));
        }
        if target.len() > limits.max_uri {
            return Err(HeadError {
                status: 414,
                reason: "request target too long",
            });
        }
        let size: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
        if size > limits.max_header_size {
            return Err(HeadError {
                status: 431,
                reason: "request header too large",
            });
        }
        let mut buf = Vec::with_capacity(size + 16 + self.after_head().len());
        let push = |buf: &mut Vec<u8>, b: &[u8]| {
            let start = buf.len() as u32;
            buf.extend_from_slice(b);
            Span {
                start,
                end: buf.len() as u32,
            }
        };
        let mut h = RequestHead {
            method_span: push(&mut buf, method),
            method: Method::of(method),
            target: push(&mut buf, target),
            version: self.version,
            ..RequestHead::default()
        };
        let regular = pairs.iter().filter(|(n, _)| !n.starts_with(b":"));
        let host = authority.map(|a| (&b"host"[..], a));
        for (n, v) in host.into_iter().chain(
            regular
                .filter(|(n, _)| authority.is_none() || !n.eq_ignore_ascii_case(b"host"))
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        ) {
            if !is_token(n) || v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(bad("a filter set an invalid header field"));
            }
            let name = push(&mut buf, n);
            let value = push(&mut buf, trim(v));
            h.fields.push(Field {
                name,
                value,
                kind: FieldKind::of(n),
                hop: false,
            });
        }
        h.head_len = buf.len();
        buf.extend_from_slice(self.after_head());
        h.buf = buf;
        h.validate()?;
        if h.content_length != self.content_length || h.chunked != self.chunked {
            return Err(HeadError {
                status: 500,
                reason: "a filter changed the framing of the request body",
            });
        }
        Ok(h)
    }

    /// Puts `body` in place of the request's body, which ended at `old_end` in the buffer (the
    /// bytes after it, pipelined requests, stay): the request then has a Content-Length body
    /// held whole in the buffer. Filters that read request bodies see them decoded and
    /// buffered; what they leave is forwarded this way (chunked trailers are not kept).
    pub fn replace_body(&mut self, body: &[u8], old_end: usize) {
        let rest = self.buf.split_off(old_end.min(self.buf.len()));
        self.buf.truncate(self.head_len);
        self.buf.extend_from_slice(body);
        self.buf.extend_from_slice(&rest);
        self.content_length = Some(body.len() as u64);
        self.chunked = false;
    }

    /// RFC 9112 framing checks: anything ambiguous is refused, never forwarded.
    fn validate(&mut self) -> Result<(), HeadError> {
        let buf = &self.buf[..];
        let h2 = self.version == Version::Http2;
        let mut host: Option<Span> = None;
        let mut connection = ConnectionField::default();
        let mut transfer_encoding = false;
        let mut te_chunked_last = false;
        let mut upgrade: Option<Span> = None;
        for f in &self.fields {
            let v = f.value.get(buf);
            match f.kind {
                FieldKind::Host => {
                    if host.is_some() {
                        return Err(bad("more than one Host field"));
                    }
                    if !valid_host(v) {
                        return Err(bad("invalid Host"));
                    }
                    host = Some(f.value);
                }
                FieldKind::ContentLength => {
                    if self.content_length.is_some() {
                        return Err(bad("repeated Content-Length"));
                    }
                    let Some(n) = parse_length(v) else {
                        return Err(bad("invalid Content-Length"));
                    };
                    self.content_length = Some(n);
                }
                FieldKind::TransferEncoding => {
                    if h2 {
                        return Err(bad("Transfer-Encoding in an HTTP/2 request"));
                    }
                    if self.version == Version::Http10 {
                        return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
                    }
                    transfer_encoding = true;
                    for coding in v.split(|b| *b == b',').map(trim) {
                        if coding.is_empty() {
                            continue;
                        }
                        // `chunked` may be applied once, and only as the last coding.
                        if te_chunked_last {
                            return Err(bad("Transfer-Encoding coding after chunked"));
                        }
                        if coding.eq_ignore_ascii_case(b"chunked") {
                            te_chunked_last = true;
                        } else if !is_token(coding) {
                            return Err(bad("invalid Transfer-Encoding"));
                        }
                    }
                }
                FieldKind::Connection if !connection.read(buf, v) => {
                    return Err(bad("invalid Connection"));
                }
                FieldKind::Upgrade => upgrade = Some(f.value),
                FieldKind::Expect if v.eq_ignore_ascii_case(b"100-continue") => {
                    self.expect_continue = true;
                }
                _ => {}
            }
        }
        if transfer_encoding {
            if !te_chunked_last {
                return Err(bad("Transfer-Encoding does not end with chunked"));
            }
            if self.content_length.is_some() {
                return Err(bad("both Content-Length and Transfer-Encoding"));
            }
            self.chunked = true;
        }
        connection.hops.mark(&mut self.fields, buf);

        let (host, target_path) = self.target_form(host)?;
        if let Some(p) = target_path {
            self.split_target(p);
        }
        let buf = &self.buf[..];
        if host.is_none() && self.version == Version::Http11 {
            return Err(bad("HTTP/1.1 request without Host"));
        }
        self.host = host;
        self.close = match self.version {
            Version::Http10 => !connection.keep_alive,
            Version::Http11 => connection.close,
            Version::Http2 => false,
        };
        if connection.upgrade && upgrade.is_some() && self.version == Version::Http11 {
            let proto = upgrade.map(|s| s.get(buf)).unwrap_or_default();
            // An h2c upgrade is a request to this hop, which speaks HTTP/2 only by prior
            // knowledge: answered as HTTP/1.1 and not passed on.
            if !list_items(proto).any(|p| p.eq_ignore_ascii_case(b"h2c")) {
                self.upgrade = upgrade;
            }
        }
        Ok(())
    }

    /// Reads the request target's form: origin (`/path`), asterisk (`*`, OPTIONS only) or
    /// absolute (`http://host/path`, whose authority replaces Host: RFC 9112 §3.2.2). Returns
    /// the host and the span to split into path and query.
    fn target_form(
        &mut self,
        mut host: Option<Span>,
    ) -> Result<(Option<Span>, Option<Span>), HeadError> {
        let buf = &self.buf[..];
        let target = self.target.get(buf);
        let mut split = None;
        match target.first() {
            Some(b'/') => {
                split = Some(self.target);
            }
            Some(b'*') if target.len() == 1 => {
                if self.method != Method::Options {
                    return Err(bad("asterisk-form target outside OPTIONS"));
                }
                self.path = self.target;
            }
            _ if self.method == Method::Connect => {
                return Err(HeadError {
                    status: 405,
                    reason: "CONNECT is not served here",
                });
            }
            _ => {
                // absolute-form: the authority in the target replaces Host (RFC 9112 §3.2.2).
                let lower = target.get(..8).map(|p| p.to_ascii_lowercase());
                let rest = match lower.as_deref() {
                    Some(p) if p.starts_with(b"http://") => &target[7..],
                    Some(p) if p.starts_with(b"https://") => &target[8..],
                    _ => return Err(bad("invalid request target")),
                };
                let end = rest
                    .iter()
                    .position(|b| matches!(b, b'/' | b'?' | b'#'))
                    .unwrap_or(rest.len());
                let authority = &rest[..end];
                if authority.contains(&b'@') || !valid_host(authority) {
                    return Err(bad("invalid authority in the request target"));
                }
                host = Some(Span::of(buf, authority));
                self.host_from_target = true;
                let path = Span::of(buf, &rest[end..]);
                if path.is_empty() {
                    self.path = path;
                } else {
                    split = Some(path);
                }
            }
        }
        Ok((host, split))
    }

    fn split_target(&mut self, t: Span) {
        let bytes = t.get(&self.buf);
        let end = memchr::memchr(b'#', bytes).unwrap_or(bytes.len());
        match memchr::memchr(b'?', &bytes[..end]) {
            Some(q) => {
                self.path = Span {
                    start: t.start,
                    end: t.start + q as u32,
                };
                self.query = Some(Span {
                    start: t.start + q as u32 + 1,
                    end: t.start + end as u32,
                });
            }
            None => {
                self.path = Span {
                    start: t.start,
                    end: t.start + end as u32,
                };
            }
        }
    }

    pub fn method_bytes(&self) -> &[u8] {
        self.method_span.get(&self.buf)
    }
    /// The request target as received.
    pub fn target(&self) -> &[u8] {
        self.target.get(&self.buf)
    }
    /// The path of the target, as received (percent-encoding kept).
    pub fn path(&self) -> &[u8] {
        self.path.get(&self.buf)
    }
    /// The query string without its `?`.
    pub fn query(&self) -> Option<&[u8]> {
        self.query.map(|q| q.get(&self.buf))
    }
    /// The authority the client asked for: Host, or the target's for an absolute-form target.
    pub fn authority(&self) -> Option<&[u8]> {
        self.host.map(|h| h.get(&self.buf))
    }
    /// The host name without port, for matching; brackets of an IPv6 literal kept.
    pub fn host_name(&self) -> Option<&[u8]> {
        let a = self.authority()?;
        if a.first() == Some(&b'[') {
            let end = memchr::memchr(b']', a).map_or(a.len(), |i| i + 1);
            return Some(&a[..end]);
        }
        let a = match memchr::memrchr(b':', a) {
            Some(i) => &a[..i],
            None => a,
        };
        Some(a.strip_suffix(b".").unwrap_or(a))
    }
    /// The protocol the client asks to upgrade to.
    pub fn upgrade(&self) -> Option<&[u8]> {
        self.upgrade.map(|s| s.get(&self.buf))
    }
    pub fn has_body(&self) -> bool {
        self.chunked || self.content_length.is_some_and(|n| n > 0)
    }
    pub fn name(&self, f: &Field) -> &[u8] {
        f.name.get(&self.buf)
    }
    pub fn value(&self, f: &Field) -> &[u8] {
        f.value.get(&self.buf)
    }
    /// Values of the fields of `kind`.
    pub fn values(&self, kind: FieldKind) -> impl Iterator<Item = &[u8]> {
        self.fields
            .iter()
            .filter(move |f| f.kind == kind)
            .map(|f| f.value.get(&self.buf))
    }
    /// Values of the fields named `name` (case-insensitive).
    pub fn values_named<'a>(&'a self, name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |f| f.name.get(&self.buf).eq_ignore_ascii_case(name))
            .map(|f| f.value.get(&self.buf))
    }
    pub fn first_value_named(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.name.get(&self.buf).eq_ignore_ascii_case(name))
            .map(|f| f.value.get(&self.buf))
    }
    /// The first cookie named `name`, over every Cookie field.
    pub fn cookie(&self, name: &[u8]) -> Option<&[u8]> {
        self.values(FieldKind::Cookie)
            .flat_map(crate::cookie::pairs)
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }
    /// The body bytes (and anything after) read together with the head.
    pub fn after_head(&self) -> &[u8] {
        self.buf.get(self.head_len..).unwrap_or_default()
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

/// Appends a field's name and value to `buf` and its spans to `fields` (heads built rather than
/// parsed: from HTTP/2, or as a filter left them).
fn push_field(buf: &mut Vec<u8>, fields: &mut Vec<Field>, name: &[u8], value: &[u8], hop: bool) {
    let ns = buf.len() as u32;
    buf.extend_from_slice(name);
    let vs = buf.len() as u32;
    buf.extend_from_slice(value);
    fields.push(Field {
        name: Span { start: ns, end: vs },
        value: Span {
            start: vs,
            end: buf.len() as u32,
        },
        kind: FieldKind::of(name),
        hop,
    });
}

/// Largest response head accepted from a member.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;
const MAX_RESPONSE_FIELDS: usize = 256;

fn bad_response(reason: &'static str) -> HeadError {
    HeadError {
        status: 502,
        reason,
    }
}

impl ResponseHead {
    /// Whether the head still has a Content-Length field (a filter may have removed it, which
    /// leaves the member's framing in `content_length` for reading its body).
    pub fn states_length(&self) -> bool {
        self.fields
            .iter()
            .any(|f| f.kind == FieldKind::ContentLength)
    }

    /// An empty head around `buf` (bytes already read are kept).
    pub fn with_buffer(buf: Vec<u8>) -> ResponseHead {
        ResponseHead {
            buf,
            ..ResponseHead::default()
        }
    }

    /// Parses a response head at the start of `buf`; `Partial` asks for more bytes. Errors are
    /// 502: the member sent something the proxy cannot pass on safely.
    pub fn parse(&mut self) -> Result<Parse, HeadError> {
        let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_RESPONSE_FIELDS] =
            [const { MaybeUninit::uninit() }; MAX_RESPONSE_FIELDS];
        let mut resp = httparse::Response::new(&mut []);
        let buf = &self.buf[..];
        let n = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if buf.len() >= MAX_RESPONSE_HEAD {
                    return Err(bad_response("response head too large"));
                }
                return Ok(Parse::Partial);
            }
            Err(_) => return Err(bad_response("malformed response head")),
        };
        self.head_len = n;
        self.status = resp.code.unwrap_or(0);
        self.reason = Span::of(buf, resp.reason.unwrap_or_default().as_bytes());
        self.version = Version::of_minor(resp.version);
        copy_fields(&mut self.fields, buf, resp.headers);
        self.analyse()?;
        Ok(Parse::Complete)
    }

    /// Builds a head from an HTTP/2 member's response.
    pub fn from_h2(parts: &http::response::Parts) -> ResponseHead {
        let mut h = ResponseHead {
            status: parts.status.as_u16(),
            version: Version::Http2,
            ..ResponseHead::default()
        };
        let reason = parts.status.canonical_reason().unwrap_or("");
        h.buf.extend_from_slice(reason.as_bytes());
        h.reason = Span {
            start: 0,
            end: reason.len() as u32,
        };
        for (name, value) in &parts.headers {
            let n = name.as_str().as_bytes();
            push_field(&mut h.buf, &mut h.fields, n, value.as_bytes(), false);
        }
        h.head_len = h.buf.len();
        // Framing is HTTP/2's own; a content-length is kept as a hint for HTTP/1.1 clients.
        let _ = h.analyse();
        h.chunked = false;
        h
    }

    /// This head as a filter left it: `:status` and the fields in `pairs`. The framing of the
    /// member's body (length, chunked, close) stays the member's: it is how the body that
    /// follows is read. The bytes after the head stay after it.
    pub fn rebuilt(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<ResponseHead, HeadError> {
        let status = pairs
            .iter()
            .find(|(n, _)| n == b":status")
            .map(|(_, v)| v.as_slice());
        let status = match status {
            None => self.status,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .filter(|s| (100..1000).contains(s))
                .ok_or(HeadError {
                    status: 500,
                    reason: "a filter set an invalid :status",
                })?,
        };
        let mut h = ResponseHead {
            status,
            version: self.version,
            content_length: self.content_length,
            chunked: self.chunked,
            close: self.close,
            ..ResponseHead::default()
        };
        let reason: &[u8] = if status == self.status {
            self.reason()
        } else {
            http::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .as_bytes()
        };
        h.buf.extend_from_slice(reason);
        h.reason = Span {
            start: 0,
            end: reason.len() as u32,
        };
        for (n, v) in pairs.iter().filter(|(n, _)| !n.starts_with(b":")) {
            if !is_token(n) || v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(HeadError {
                    status: 500,
                    reason: "a filter set an invalid header field",
                });
            }
            // A field the member's Connection named stays hop-by-hop.
            let hop = self
                .fields
                .iter()
                .any(|f| f.hop && self.name(f).eq_ignore_ascii_case(n));
            push_field(&mut h.buf, &mut h.fields, n, v, hop);
        }
        h.head_len = h.buf.len();
        h.buf.extend_from_slice(self.after_head());
        Ok(h)
    }

    fn analyse(&mut self) -> Result<(), HeadError> {
        let buf = &self.buf[..];
        let mut connection = ConnectionField::default();
        let mut te = false;
        let mut te_chunked_last = false;
        let mut lengths: Option<u64> = None;
        for f in &self.fields {
            let v = f.value.get(buf);
            match f.kind {
                FieldKind::ContentLength => {
                    // Members sometimes repeat an identical Content-Length; different values
                    // are ambiguous (RFC 9112 §6.3).
                    for item in v.split(|b| *b == b',').map(trim) {
                        let Some(n) = parse_length(item) else {
                            return Err(bad_response("invalid Content-Length from the member"));
                        };
                        if lengths.is_some_and(|l| l != n) {
                            return Err(bad_response("conflicting Content-Length from the member"));
                        }
                        lengths = Some(n);
                    }
                }
                FieldKind::TransferEncoding => {
                    te = true;
                    te_chunked_last = v
                        .rsplit(|b| *b == b',')
                        .map(trim)
                        .find(|c| !c.is_empty())
                        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
                }
                FieldKind::Connection => {
                    // A member's odd token is not worth refusing its answer for.
                    connection.read(buf, v);
                }
                _ => {}
            }
        }
        connection.hops.mark(&mut self.fields, buf);
        self.close = match self.version {
            Version::Http10 => !connection.keep_alive,
            _ => connection.close,
        };
        if te {
            // Transfer-Encoding overrides Content-Length; a response with both is passed on
            // de-chunked and the member connection closed afterwards (RFC 9112 §6.3).
            if lengths.is_some() {
                self.close = true;
            }
            if !te_chunked_last {
                // Framed by the end of the connection.
                self.close = true;
                self.content_length = None;
                self.chunked = false;
                return Ok(());
            }
            self.chunked = true;
            self.content_length = None;
        } else {
            self.content_length = lengths;
        }
        Ok(())
    }

    pub fn reason(&self) -> &[u8] {
        self.reason.get(&self.buf)
    }
    pub fn name(&self, f: &Field) -> &[u8] {
        f.name.get(&self.buf)
    }
    pub fn value(&self, f: &Field) -> &[u8] {
        f.value.get(&self.buf)
    }
    pub fn after_head(&self) -> &[u8] {
        self.buf.get(self.head_len..).unwrap_or_default()
    }
    /// Whether a response to `method` with this status has no body, whatever its fields say.
    pub fn bodiless(&self, method: Method) -> bool {
        method == Method::Head
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<RequestHead, HeadError> {
        let mut h = RequestHead::with_buffer(raw.to_vec());
        match h.parse(&Limits::default())? {
            Parse::Complete => Ok(h),
            Parse::Partial => Err(HeadError {
                status: 0,
                reason: "partial",
            }),
        }
    }

    fn status(raw: &[u8]) -> u16 {
        match parse(raw) {
            Ok(_) => 200,
            Err(e) => e.status,
        }
    }

    #[test]
    fn parses_a_simple_request() {
        let h = parse(b"GET /a/b?x=1&y=2 HTTP/1.1\r\nHost: Example.COM:8080\r\nCookie: a=1; b=2\r\nCookie: c=3\r\n\r\nBODY").unwrap();
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.path(), b"/a/b");
        assert_eq!(h.query(), Some(&b"x=1&y=2"[..]));
        assert_eq!(h.host_name(), Some(&b"Example.COM"[..]));
        assert_eq!(h.after_head(), b"BODY");
        assert_eq!(h.cookie(b"c"), Some(&b"3"[..]));
        assert_eq!(h.cookie(b"b"), Some(&b"2"[..]));
        assert!(!h.close);
    }

    #[test]
    fn smuggling_is_refused() {
        // Both framings.
        assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
        // Repeated or odd Content-Length.
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n"),
            400
        );
        // Transfer-Encoding other than a final chunked.
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            400
        );
        assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            200
        );
        // obs-fold, bare CR, bad names, space before the colon.
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n 2\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\rX-B: 2\r\n\r\n"),
            400
        );
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n"), 400);
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nHost: a\r\n\x00X: 1\r\n\r\n"),
            400
        );
        // Host rules.
        assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.0\r\n\r\n"), 200);
        // Targets.
        assert_eq!(status(b"GET x HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
        assert_eq!(status(b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"), 405);
        assert_eq!(status(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
        assert_eq!(status(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), 200);
        assert_eq!(status(b"GET / HTTP/1.2\r\nHost: a\r\n\r\n"), 505);
    }

    #[test]
    fn absolute_form_overrides_host() {
        let h = parse(b"GET http://b.example:81/x?y HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(h.authority(), Some(&b"b.example:81"[..]));
        assert_eq!(h.path(), b"/x");
        assert!(h.host_from_target);
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
        assert_eq!(status(long.as_bytes()), 414);
        let mut h = RequestHead::with_buffer(format!("GET /{}", "a".repeat(40000)).into_bytes());
        assert_eq!(h.parse(&Limits::default()).unwrap_err().status, 414);
        let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n", "a".repeat(40000));
        let mut h = RequestHead::with_buffer(big.into_bytes());
        assert_eq!(h.parse(&Limits::default()).unwrap_err().status, 431);
        let many: String = (0..101).map(|i| format!("X-{i}: 1\r\n")).collect();
        assert_eq!(
            status(format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes()),
            431
        );
    }

    #[test]
    fn connection_tokens() {
        let h = parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nUpgrade: websocket\r\n\r\n").unwrap();
        assert!(h.close);
        assert!(h.fields.iter().any(|f| f.hop && h.name(f) == b"X-Secret"));
        assert_eq!(h.upgrade(), None, "Upgrade without the upgrade token");
        let h = parse(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.upgrade(), Some(&b"websocket"[..]));
        let h = parse(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap();
        assert!(!h.close);
        let h = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(h.close);
    }

    #[test]
    fn responses() {
        let mut r = ResponseHead {
            buf: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
            ..Default::default()
        };
        assert_eq!(r.parse().unwrap(), Parse::Complete);
        assert_eq!(r.content_length, Some(5));
        assert_eq!(r.after_head(), b"hello");
        let mut r = ResponseHead {
            buf: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n".to_vec(),
            ..Default::default()
        };
        assert_eq!(r.parse().unwrap_err().status, 502);
        let mut r = ResponseHead {
            buf: b"HTTP/1.0 200 OK\r\n\r\n".to_vec(),
            ..Default::default()
        };
        r.parse().unwrap();
        assert!(r.close && r.content_length.is_none() && !r.chunked);
    }
}
