//! The section of http and https virtual services: content-switching rules (`rule.rs`),
//! compression and the response cache, timeouts and limits, forwarding headers, the access log,
//! and the upstream options of a pool (response timeout, idle member connections, HTTP/2 to
//! members, passive status checks). Each struct is read from the same TOML table as its owner
//! (`[[virtual_service]]`, `[[pool]]`).

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::Protocol;
use crate::reader::{Cx, FromNode, Node, Shape, TableReader};
use crate::rule::Rule;
use crate::stream::StreamOptions;
use crate::string_enum;
use crate::tls::TlsTermination;
use crate::types::{read_table, ByteSize};

/// The section of an http or https virtual service.
#[derive(Debug, Clone)]
pub struct HttpSection {
    pub stream: StreamOptions,
    /// https: the certificates and handshake options; `None`: plain http.
    pub tls: Option<TlsTermination>,
    /// Content-switching rules, first match wins; no match: the service's `pool`.
    pub rules: Vec<Rule>,
    /// `[[virtual_service.filter]]`: proxy-wasm filters, in order around the rules.
    pub filters: Vec<crate::filter::Filter>,
    pub compression: Option<Compression>,
    pub cache: Option<Cache>,
    /// Sends clients to another GSLB site when this one cannot serve them.
    pub gslb_redirect: Option<GslbRedirect>,
    /// Timeouts, limits, forwarding headers and access log (Fulcrum additions).
    pub options: HttpOptions,
}

/// `gslb_redirect`: a `gslb.name` whose best other site a client is redirected to (302) when
/// the service's pool has no available member or is over `threshold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GslbRedirect {
    pub name: String,
    /// `gslb_redirect_threshold`: active connections of the service above which it redirects.
    pub threshold: Option<u64>,
}

/// The keys an http / https section reads besides the stream and TLS keys.
pub const HTTP_SECTION_KEYS: &[&str] = &[
    "filter",
    "compression",
    "cache",
    "gslb_redirect",
    "gslb_redirect_threshold",
    "header_timeout",
    "request_timeout",
    "max_header_size",
    "max_headers",
    "max_uri_length",
    "max_body_size",
    "min_body_rate",
    "forward_headers",
    "access_log",
];

impl HttpSection {
    /// Reads and checks the section of an http (`https = false`) or https service.
    pub(crate) fn read(
        t: &mut TableReader<'_>,
        cx: &mut Cx<'_>,
        node: &Node<'_>,
        https: bool,
    ) -> HttpSection {
        let protocol = if https {
            Protocol::Https
        } else {
            Protocol::Http
        };
        let mut stream = StreamOptions::read(t, cx);
        stream.read_source(t, cx);
        let tls = if https {
            TlsTermination::read(t, cx, node, protocol)
        } else {
            None
        };
        let rules: Vec<Rule> = t.opt(cx, "rule").unwrap_or_default();
        let filters = t.opt(cx, "filter").unwrap_or_default();
        let compression = t.opt(cx, "compression");
        let cache = t.opt(cx, "cache");
        let redirect: Option<String> = t.opt(cx, "gslb_redirect");
        let threshold = t.opt(cx, "gslb_redirect_threshold");
        let options = HttpOptions::read(t, cx);
        let at = t.path().to_string();
        if redirect.is_none() && threshold.is_some() {
            cx.error_path(
                &format!("{at}.gslb_redirect_threshold"),
                "`gslb_redirect_threshold` needs `gslb_redirect`",
            );
        }
        check_options(&at, &options, cx);
        for (r, rule) in rules.iter().enumerate() {
            let rule_at = format!("{at}.rule[{r}]");
            crate::rule::check_http_rule(&rule_at, protocol, cx);
            check_rule(&rule_at, rule, cx);
        }
        HttpSection {
            stream,
            tls,
            rules,
            filters,
            compression,
            cache,
            gslb_redirect: redirect.map(|name| GslbRedirect { name, threshold }),
            options,
        }
    }
}

/// HTTP options of a virtual service (http / https).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOptions {
    /// From the first byte of a request until its head is complete (slowloris guard).
    pub header_timeout: Duration,
    /// From a complete request head until the whole response is sent; `None`: no limit.
    pub request_timeout: Option<Duration>,
    /// Largest request head (request line and header fields), in bytes: beyond it, 431.
    pub max_header_size: u64,
    /// Most header fields in a request: beyond it, 431.
    pub max_headers: u32,
    /// Longest request target, in bytes: beyond it, 414.
    pub max_uri_length: u64,
    /// Largest request body, in bytes: beyond it, 413; `None`: no limit.
    pub max_body_size: Option<u64>,
    /// Slowest request body a client may send, in bytes per second, once `header_timeout` has
    /// passed (slow POST guard, as Apache's mod_reqtimeout `MinRate`); 0: no minimum.
    pub min_body_rate: u64,
    pub forward_headers: ForwardHeaders,
    pub access_log: Option<AccessLog>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            header_timeout: Duration::from_secs(10),
            request_timeout: None,
            max_header_size: 32 * 1024,
            max_headers: 100,
            max_uri_length: 8 * 1024,
            max_body_size: None,
            min_body_rate: 64,
            forward_headers: ForwardHeaders::default(),
            access_log: None,
        }
    }
}

impl HttpOptions {
    /// Reads the HTTP keys of a `[[virtual_service]]` table.
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> HttpOptions {
        let d = HttpOptions::default();
        HttpOptions {
            header_timeout: t.opt(cx, "header_timeout").unwrap_or(d.header_timeout),
            request_timeout: t.opt(cx, "request_timeout"),
            max_header_size: t
                .opt::<ByteSize>(cx, "max_header_size")
                .map_or(d.max_header_size, |s| s.0),
            max_headers: t.opt(cx, "max_headers").unwrap_or(d.max_headers),
            max_uri_length: t
                .opt::<ByteSize>(cx, "max_uri_length")
                .map_or(d.max_uri_length, |s| s.0),
            max_body_size: t.opt::<ByteSize>(cx, "max_body_size").map(|s| s.0),
            min_body_rate: t
                .opt::<ByteSize>(cx, "min_body_rate")
                .map_or(d.min_body_rate, |s| s.0),
            forward_headers: t.opt(cx, "forward_headers").unwrap_or_default(),
            access_log: t.opt(cx, "access_log"),
        }
    }
}

/// Which forwarding headers the proxy adds to requests (and `via` to responses too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardHeaders {
    /// Appends the client address to `X-Forwarded-For`.
    pub x_forwarded_for: bool,
    /// Sets `X-Forwarded-Proto` to the client's scheme.
    pub x_forwarded_proto: bool,
    /// Sets `X-Forwarded-Host` to the Host the client asked for.
    pub x_forwarded_host: bool,
    /// Appends an RFC 7239 `Forwarded: for=…;proto=…;host=…` element.
    pub forwarded: bool,
    /// Sets `X-Real-IP` to the client address.
    pub x_real_ip: bool,
    /// Appends `1.1 fulcrum` to `Via`, on requests and responses.
    pub via: bool,
}

impl Default for ForwardHeaders {
    fn default() -> Self {
        ForwardHeaders {
            x_forwarded_for: true,
            x_forwarded_proto: true,
            x_forwarded_host: true,
            forwarded: false,
            x_real_ip: false,
            via: true,
        }
    }
}

impl FromNode for ForwardHeaders {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = ForwardHeaders::default();
            Some(ForwardHeaders {
                x_forwarded_for: t.opt(cx, "x_forwarded_for").unwrap_or(d.x_forwarded_for),
                x_forwarded_proto: t
                    .opt(cx, "x_forwarded_proto")
                    .unwrap_or(d.x_forwarded_proto),
                x_forwarded_host: t.opt(cx, "x_forwarded_host").unwrap_or(d.x_forwarded_host),
                forwarded: t.opt(cx, "forwarded").unwrap_or(d.forwarded),
                x_real_ip: t.opt(cx, "x_real_ip").unwrap_or(d.x_real_ip),
                via: t.opt(cx, "via").unwrap_or(d.via),
            })
        })
    }
}

string_enum!(
    /// Access log line format.
    LogFormat {
        Combined = "combined",
        Json = "json",
    }
);

/// Where and how a virtual service logs its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// A file, appended to; relative paths are from the configuration's folder.
    pub path: PathBuf,
    pub format: LogFormat,
}

impl FromNode for AccessLog {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let path: Option<String> = t.req(cx, "path");
            let format = t.opt(cx, "format").unwrap_or(LogFormat::Combined);
            Some(AccessLog {
                path: path?.into(),
                format,
            })
        })
    }
}

/// HTTP options of a pool: how the HTTP data plane talks to its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpPoolOptions {
    /// From the request sent until the response head arrived: beyond it, 504.
    pub response_timeout: Duration,
    /// Speak HTTP/2 (prior knowledge, h2c) to the members instead of HTTP/1.1.
    pub http2: bool,
    /// Idle connections kept per member for reuse.
    pub max_idle: u32,
    /// An idle member connection is closed after this long unused.
    pub idle_timeout: Duration,
    /// Response statuses that count as a passive failure of the member.
    pub passive_statuses: StatusSet,
}

impl Default for HttpPoolOptions {
    fn default() -> Self {
        HttpPoolOptions {
            response_timeout: Duration::from_secs(60),
            http2: false,
            max_idle: 1000,
            idle_timeout: Duration::from_secs(30),
            passive_statuses: StatusSet(vec![StatusMatch::Class(5)]),
        }
    }
}

/// The keys `HttpPoolOptions` reads from a pool table.
pub const HTTP_POOL_KEYS: &[&str] = &[
    "response_timeout",
    "http2",
    "max_idle",
    "idle_timeout",
    "passive_statuses",
];

impl HttpPoolOptions {
    /// Reads the HTTP keys of a `[[pool]]` table.
    pub fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> HttpPoolOptions {
        let d = HttpPoolOptions::default();
        HttpPoolOptions {
            response_timeout: t.opt(cx, "response_timeout").unwrap_or(d.response_timeout),
            http2: t.opt(cx, "http2").unwrap_or(d.http2),
            max_idle: t.opt(cx, "max_idle").unwrap_or(d.max_idle),
            idle_timeout: t.opt(cx, "idle_timeout").unwrap_or(d.idle_timeout),
            passive_statuses: t.opt(cx, "passive_statuses").unwrap_or(d.passive_statuses),
        }
    }
}

/// One entry of a status list: a status, or a whole class (`"5xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    Code(u16),
    /// The hundreds digit: 5 for "5xx".
    Class(u8),
}

/// A set of HTTP statuses, written as integers and classes: `[403, 404, "5xx"]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusSet(pub Vec<StatusMatch>);

impl StatusSet {
    pub fn contains(&self, status: u16) -> bool {
        self.0.iter().any(|m| match *m {
            StatusMatch::Code(c) => c == status,
            StatusMatch::Class(c) => status / 100 == u16::from(c),
        })
    }
}

impl FromNode for StatusMatch {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Int(i) if (100..=599).contains(&i) => Some(StatusMatch::Code(i as u16)),
            Shape::Str(s)
                if s.len() == 3
                    && s[1..].eq_ignore_ascii_case("xx")
                    && (b'1'..=b'5').contains(&s.as_bytes()[0]) =>
            {
                Some(StatusMatch::Class(s.as_bytes()[0] - b'0'))
            }
            _ => {
                cx.error(
                    node,
                    "expected an HTTP status from 100 to 599 or a class \"1xx\" to \"5xx\"",
                );
                None
            }
        }
    }
}

impl FromNode for StatusSet {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        Vec::<StatusMatch>::from_node(node, cx).map(StatusSet)
    }
}

string_enum!(
    /// The `SameSite` attribute of an inserted persistence cookie.
    SameSite {
        Strict = "strict",
        Lax = "lax",
        None = "none",
    }
);

/// Checks of the HTTP options, once read.
fn check_options(path: &str, o: &HttpOptions, cx: &mut Cx<'_>) {
    let mut err = |k: &str, m: String| cx.error_path(&format!("{path}.{k}"), m);
    if o.header_timeout.is_zero() {
        err("header_timeout", "must be longer than 0s".into());
    }
    if o.request_timeout.is_some_and(|d| d.is_zero()) {
        err("request_timeout", "must be longer than 0s".into());
    }
    if !(1024..=1 << 20).contains(&o.max_header_size) {
        err(
            "max_header_size",
            format!(
                "{} is out of range; expected 1KiB (1024) to 1MiB (1048576)",
                o.max_header_size
            ),
        );
    }
    if !(1..=1000).contains(&o.max_headers) {
        err(
            "max_headers",
            format!("{} is out of range; expected 1 to 1000", o.max_headers),
        );
    }
    if o.max_uri_length < 16 || o.max_uri_length > o.max_header_size {
        err(
            "max_uri_length",
            format!(
                "{} is out of range; expected 16 up to max_header_size ({})",
                o.max_uri_length, o.max_header_size
            ),
        );
    }
}

/// Checks of one rule of an http section: patterns compile, names and values are well-formed.
/// Its pool is a reference, checked by `validate`.
pub(crate) fn check_rule(at: &str, rule: &Rule, cx: &mut Cx<'_>) {
    let rp = |k: &str| format!("{at}.{k}");
    if let Some(re) = &rule.path_regex {
        regex_ok(cx, &rp("path_regex"), re);
    }
    if let Some(re) = &rule.user_agent {
        regex_ok(cx, &rp("user_agent"), re);
    }
    for (key, map) in [
        ("header", &rule.header),
        ("cookie", &rule.cookie),
        ("query", &rule.query),
    ] {
        for (name, re) in &map.0 {
            regex_ok(cx, &format!("{}.{name}", rp(key)), re);
        }
    }
    if let Some(rw) = &rule.rewrite_path {
        regex_ok(cx, &rp("rewrite_path.regex"), &rw.regex);
    }
    check_rule_edits(at, rule, cx);
    if let Some(h) = &rule.host {
        let bare = h.strip_prefix("*.").unwrap_or(h);
        if bare.is_empty() || bare.contains(['*', '/', ' ']) {
            cx.error_path(
                &rp("host"),
                format!("{h:?} is not a host name or a \"*.domain\" wildcard"),
            );
        }
    }
    for m in &rule.method {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase() || b == b'-') {
            cx.error_path(
                &rp("method"),
                format!("{m:?} is not an HTTP method (upper case, e.g. \"GET\")"),
            );
        }
    }
}

fn regex_ok(cx: &mut Cx<'_>, path: &str, pattern: &str) {
    if let Err(e) = regex::Regex::new(pattern) {
        let first = e
            .to_string()
            .lines()
            .last()
            .unwrap_or("invalid")
            .trim()
            .to_string();
        cx.error_path(
            path,
            format!("invalid regular expression {pattern:?}: {first}"),
        );
    }
}

pub(crate) fn check_pool(path: &str, o: &HttpPoolOptions, cx: &mut Cx<'_>) {
    if o.response_timeout.is_zero() {
        cx.error_path(
            &format!("{path}.response_timeout"),
            "must be longer than 0s",
        );
    }
    if o.idle_timeout.is_zero() {
        cx.error_path(&format!("{path}.idle_timeout"), "must be longer than 0s");
    }
}

/// Header edits of a rule: names must be field names (tokens), values visible characters.
fn check_rule_edits(path: &str, rule: &Rule, cx: &mut Cx<'_>) {
    let token = |n: &str| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    let value_ok = |v: &str| {
        v.bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
    };
    for (key, edits) in [
        ("request_headers", &rule.request_headers),
        ("response_headers", &rule.response_headers),
    ] {
        let Some(e) = edits else { continue };
        for (part, map) in [("set", &e.set), ("add", &e.add)] {
            for (n, v) in &map.0 {
                let at = format!("{path}.{key}.{part}.{n}");
                if !token(n) {
                    cx.error_path(&at, format!("{n:?} is not a header field name"));
                }
                if !value_ok(v) {
                    cx.error_path(&at, format!("{v:?} contains control characters"));
                }
            }
        }
        for (j, n) in e.remove.iter().enumerate() {
            if !token(n) {
                cx.error_path(
                    &format!("{path}.{key}.remove[{j}]"),
                    format!("{n:?} is not a header field name"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_keys_are_read_and_validated() {
        let ok = crate::parse(
            "[[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"http\"\npool = \"p\"\n\
             header_timeout = \"2s\"\nmax_uri_length = \"1KiB\"\nforward_headers = { via = false }\n\
             access_log = { path = \"a.log\", format = \"json\" }\n\
             [[pool]]\nname = \"p\"\nhttp2 = true\nmax_idle = 8\npassive_statuses = [404, \"5xx\"]\n",
            "t.toml",
            std::path::Path::new("/etc/f"),
        )
        .unwrap();
        let vs = &ok.virtual_services[0].as_http().unwrap().options;
        assert_eq!(vs.header_timeout, Duration::from_secs(2));
        assert_eq!(vs.max_uri_length, 1024);
        assert!(!vs.forward_headers.via && vs.forward_headers.x_forwarded_for);
        let log = vs.access_log.as_ref().unwrap();
        assert_eq!(log.path, PathBuf::from("/etc/f/a.log"));
        assert_eq!(log.format, LogFormat::Json);
        let p = &ok.pools[0].http;
        assert!(p.http2 && p.max_idle == 8);
        assert!(p.passive_statuses.contains(404) && p.passive_statuses.contains(502));
        assert!(!p.passive_statuses.contains(403));

        let errors = crate::parse(
            "[[virtual_service]]\nname = \"t\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"tcp\"\npool = \"p\"\n\
             max_headers = 5\n[[pool]]\nname = \"p\"\nhttp2 = true\n\
             [[persistence]]\nname = \"s\"\ntype = \"cookie_insert\"\nsecret = \"short\"\n",
            "t.toml",
            std::path::Path::new("."),
        )
        .unwrap_err()
        .messages()
        .join("\n");
        assert!(
            errors.contains(
                "virtual_service[0].max_headers: `max_headers` applies to protocol http / https"
            ),
            "{errors}"
        );
        assert!(
            errors.contains("pool[0].http2: `http2` applies to pools of http/https services"),
            "{errors}"
        );
        assert!(
            errors.contains("persistence[0].secret: too short"),
            "{errors}"
        );
    }

    #[test]
    fn status_sets() {
        let s = StatusSet(vec![StatusMatch::Class(5), StatusMatch::Code(404)]);
        assert!(s.contains(500) && s.contains(599) && s.contains(404));
        assert!(!s.contains(403) && !s.contains(200));
    }
}

string_enum!(CompressionAlgorithm {
    Br = "br",
    Zstd = "zstd",
    Gzip = "gzip",
    Deflate = "deflate",
});

#[derive(Debug, Clone)]
pub struct Compression {
    pub algorithms: Vec<CompressionAlgorithm>,
    pub min_size: u64,
    pub types: Vec<String>,
    /// Level of each algorithm (Fulcrum addition).
    pub levels: crate::accel::CompressionLevels,
}

impl FromNode for Compression {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(Compression {
                algorithms: t.opt(cx, "algorithms").unwrap_or_else(|| {
                    vec![
                        CompressionAlgorithm::Br,
                        CompressionAlgorithm::Zstd,
                        CompressionAlgorithm::Gzip,
                        CompressionAlgorithm::Deflate,
                    ]
                }),
                min_size: t.opt::<ByteSize>(cx, "min_size").map_or(1024, |s| s.0),
                types: t.opt(cx, "types").unwrap_or_else(|| {
                    [
                        "text/*",
                        "application/json",
                        "application/javascript",
                        "application/xml",
                        "image/svg+xml",
                    ]
                    .map(String::from)
                    .to_vec()
                }),
                levels: t.opt(cx, "levels").unwrap_or_default(),
            })
        })
    }
}

#[derive(Debug, Clone)]
pub struct Cache {
    pub size: u64,
    pub max_object: u64,
}

impl FromNode for Cache {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(Cache {
                size: t.opt::<ByteSize>(cx, "size").map_or(256 << 20, |s| s.0),
                max_object: t.opt::<ByteSize>(cx, "max_object").map_or(8 << 20, |s| s.0),
            })
        })
    }
}
