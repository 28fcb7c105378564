//! TLS options of an `https` virtual service beyond the contract (Fulcrum additions):
//! protocol versions, cipher suites, session resumption, client certificates, handshake timeout
//! and the ALPN protocols offered. The certificates themselves are the contract's `tls` array.
//!
//! Only the shape is checked here; what needs the files or the TLS library (certificates, keys,
//! cipher suite names) is checked when the data plane loads them, with the same key paths.

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::Protocol;
use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::string_enum;
use crate::types::read_table;

/// TLS a virtual service terminates: https, and tcp / message services with `tls`.
#[derive(Debug, Clone)]
pub struct TlsTermination {
    /// The certificate chains and keys (`tls`), at least one.
    pub certs: Vec<TlsCert>,
    /// `tls_options` (Fulcrum additions).
    pub options: TlsOptions,
}

/// The keys `TlsTermination` reads from a virtual service.
pub const TLS_KEYS: &[&str] = &["tls", "tls_options"];

impl TlsTermination {
    /// Reads `tls` and `tls_options` of a service of `protocol`; `None` without certificates
    /// (an error for https, and for `tls_options` alone).
    pub(crate) fn read(
        t: &mut TableReader<'_>,
        cx: &mut Cx<'_>,
        node: &Node<'_>,
        protocol: Protocol,
    ) -> Option<TlsTermination> {
        let certs: Vec<TlsCert> = t.opt(cx, "tls").unwrap_or_default();
        let options: Option<TlsOptions> = t.opt(cx, "tls_options");
        let at = t.path().to_string();
        if certs.is_empty() {
            if protocol == Protocol::Https {
                cx.error_at(
                    node.span.clone(),
                    &at,
                    "protocol https needs `tls` with at least one certificate",
                );
            } else if t.has("tls_options") {
                cx.error_path(
                    &format!("{at}.tls_options"),
                    format!("`tls_options` needs `tls` (the certificates) on a {protocol} service"),
                );
            }
            return None;
        }
        let options = options.unwrap_or_default();
        if protocol.is_http() {
            for (j, p) in options.alpn.iter().enumerate() {
                if !ALPN_PROTOCOLS.contains(&p.as_str()) {
                    cx.error_path(
                        &format!("{at}.tls_options.alpn[{j}]"),
                        format!("unknown ALPN protocol {p:?}; expected h2 or http/1.1"),
                    );
                }
            }
        }
        Some(TlsTermination { certs, options })
    }
}

string_enum!(
    /// Lowest TLS version a client may negotiate.
    TlsVersion { V12 = "1.2", V13 = "1.3" }
);

string_enum!(
    /// Whether clients present a certificate.
    ClientAuth {
        None = "none",
        Optional = "optional",
        Required = "required",
    }
);

/// `tls_options = { … }` of an https virtual service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub min_version: TlsVersion,
    /// Cipher suites in order of preference (rustls / IANA names such as
    /// `TLS13_AES_128_GCM_SHA256`, `TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`); empty: the
    /// library's defaults.
    pub cipher_suites: Vec<String>,
    /// Stateless resumption tickets (keys rotated every 6 hours).
    pub session_tickets: bool,
    /// Server-side session cache, in entries; 0 turns it off.
    pub session_cache: u64,
    pub client_auth: ClientAuth,
    /// PEM bundle of the CAs client certificates must chain to.
    pub client_ca: Option<PathBuf>,
    /// From accept to a finished handshake; `None`: the service's `header_timeout`.
    pub handshake_timeout: Option<Duration>,
    /// ALPN protocols offered, in order of preference (`h2`, `http/1.1`).
    pub alpn: Vec<String>,
    /// Whether `alpn` was written in the file: tcp and message services offer ALPN only then.
    pub alpn_set: bool,
}

/// ALPN protocol names the HTTP data plane serves.
pub const ALPN_PROTOCOLS: &[&str] = &["h2", "http/1.1"];

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            min_version: TlsVersion::V12,
            cipher_suites: Vec::new(),
            session_tickets: true,
            session_cache: 20_000,
            client_auth: ClientAuth::None,
            client_ca: None,
            handshake_timeout: None,
            alpn: ALPN_PROTOCOLS.iter().map(|s| s.to_string()).collect(),
            alpn_set: false,
        }
    }
}

impl FromNode for TlsOptions {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = TlsOptions::default();
            let alpn_given: Option<Vec<String>> = t.opt(cx, "alpn");
            let alpn_set = alpn_given.is_some();
            let alpn = alpn_given.unwrap_or(d.alpn);
            let client_auth = t.opt(cx, "client_auth").unwrap_or(d.client_auth);
            let client_ca = t.opt::<String>(cx, "client_ca").map(PathBuf::from);
            let opts = TlsOptions {
                min_version: t.opt(cx, "min_version").unwrap_or(d.min_version),
                cipher_suites: t.opt(cx, "cipher_suites").unwrap_or_default(),
                session_tickets: t.opt(cx, "session_tickets").unwrap_or(d.session_tickets),
                session_cache: t.opt(cx, "session_cache").unwrap_or(d.session_cache),
                client_auth,
                client_ca,
                handshake_timeout: t.opt(cx, "handshake_timeout"),
                alpn,
                alpn_set,
            };
            // Any protocol id for tcp and message services (RFC 7301: 1 to 255 bytes); the
            // http data plane's own names are checked where the protocol is known.
            for (i, p) in opts.alpn.iter().enumerate() {
                if p.is_empty() || p.len() > 255 {
                    cx.error_at(
                        node.span.clone(),
                        &format!("{}.alpn[{i}]", node.path),
                        format!("{p:?}: an ALPN protocol id is 1 to 255 bytes"),
                    );
                }
            }
            if opts.client_auth != ClientAuth::None && opts.client_ca.is_none() {
                cx.error(
                    node,
                    format!(
                        "client_auth = \"{}\" needs `client_ca`, the CA bundle client certificates must chain to",
                        opts.client_auth
                    ),
                );
            }
            if opts.handshake_timeout.is_some_and(|d| d.is_zero()) {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.handshake_timeout", node.path),
                    "must be longer than 0s",
                );
            }
            Some(opts)
        })
    }
}

/// A certificate chain and its private key, PEM files; relative paths are from the config's folder.
#[derive(Debug, Clone)]
pub struct TlsCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// A DER OCSP response stapled to handshakes with this certificate (Fulcrum addition).
    pub ocsp: Option<PathBuf>,
}

impl FromNode for TlsCert {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let cert: Option<String> = t.req(cx, "cert");
            let key: Option<String> = t.req(cx, "key");
            let ocsp: Option<String> = t.opt(cx, "ocsp");
            Some(TlsCert {
                cert: cert?.into(),
                key: key?.into(),
                ocsp: ocsp.map(PathBuf::from),
            })
        })
    }
}
