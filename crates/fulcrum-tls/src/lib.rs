//! TLS termination for `https`, `tcp` and `message` services (rustls): certificates chosen by
//! SNI, ALPN, TLS 1.2 and 1.3, session resumption by rotated-key tickets and a server-side
//! cache, OCSP stapling, optional client certificates, and per-service handshake counters.
//!
//! Everything that reads files happens in [`ServerTls::load`], when the configuration loads:
//! a bad certificate or key is a configuration error with its key path, never a failure at the
//! first handshake. A reload builds a new `ServerTls`; connections keep the one they began with.

pub mod client;
pub mod der;
pub mod names;
pub mod ticket;

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_config::{ClientAuth, TlsOptions, TlsVersion, VirtualService};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{
    ClientHello, NoServerSessionStorage, ProducesTickets, ResolvesServerCert,
    ServerSessionMemoryCache, StoresServerSessions, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::{HandshakeKind, ProtocolVersion, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use names::NameIndex;

/// The cryptography every TLS connection of Fulcrum uses (server and member side). Chosen by
/// measurement: see bench/RESULTS.md "## HTTPS".
pub fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Why a handshake failed, as counted in `fulcrum_tls_handshake_failures_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// The client did not speak TLS (plain HTTP on the TLS port, a port scanner).
    NotTls,
    /// A malformed or unexpected TLS message.
    BadMessage,
    /// No TLS version both sides accept (an old client, or `min_version = "1.3"`).
    Version,
    /// No cipher suite both sides accept.
    Cipher,
    /// Other parameters in common missing (groups, signature schemes, ALPN).
    Incompatible,
    /// `client_auth = "required"` and the client presented no certificate.
    ClientCertMissing,
    /// The client's certificate does not verify against `client_ca`.
    ClientCertInvalid,
    /// The client aborted with an alert (for example: it does not trust our certificate).
    Alert,
    /// The handshake did not finish within the handshake timeout.
    Timeout,
    /// The client closed or reset the connection during the handshake.
    Closed,
    Other,
}

impl FailReason {
    pub const ALL: [FailReason; 11] = [
        FailReason::NotTls,
        FailReason::BadMessage,
        FailReason::Version,
        FailReason::Cipher,
        FailReason::Incompatible,
        FailReason::ClientCertMissing,
        FailReason::ClientCertInvalid,
        FailReason::Alert,
        FailReason::Timeout,
        FailReason::Closed,
        FailReason::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::NotTls => "not_tls",
            FailReason::BadMessage => "bad_message",
            FailReason::Version => "version",
            FailReason::Cipher => "no_shared_cipher",
            FailReason::Incompatible => "incompatible",
            FailReason::ClientCertMissing => "client_cert_missing",
            FailReason::ClientCertInvalid => "client_cert_invalid",
            FailReason::Alert => "alert",
            FailReason::Timeout => "timeout",
            FailReason::Closed => "closed",
            FailReason::Other => "other",
        }
    }

    fn of(e: &io::Error) -> FailReason {
        use rustls::{Error as E, InvalidMessage as M, PeerIncompatible as P};
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<E>()) else {
            return match e.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => FailReason::Closed,
                _ => FailReason::Other,
            };
        };
        match tls {
            E::InvalidMessage(M::InvalidContentType | M::UnknownProtocolVersion) => {
                FailReason::NotTls
            }
            E::InvalidMessage(_) | E::InappropriateHandshakeMessage { .. } => {
                FailReason::BadMessage
            }
            E::InappropriateMessage { .. } => FailReason::BadMessage,
            E::PeerIncompatible(
                P::SupportedVersionsExtensionRequired
                | P::Tls12NotOffered
                | P::Tls12NotOfferedOrEnabled
                | P::ServerTlsVersionIsDisabledByOurConfig,
            ) => FailReason::Version,
            E::PeerIncompatible(P::NoCipherSuitesInCommon) => FailReason::Cipher,
            E::PeerIncompatible(_) | E::NoApplicationProtocol => FailReason::Incompatible,
            E::NoCertificatesPresented => FailReason::ClientCertMissing,
            E::InvalidCertificate(_) => FailReason::ClientCertInvalid,
            E::AlertReceived(_) => FailReason::Alert,
            _ => FailReason::Other,
        }
    }
}

/// Handshake counters of one https service, kept across reloads by service name.
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Completed handshakes: [TLS 1.2, TLS 1.3] × [full, resumed].
    handshakes: [[AtomicU64; 2]; 2],
    failures: [AtomicU64; FailReason::ALL.len()],
}

impl TlsStats {
    /// (version, resumed, count) for every combination.
    pub fn handshakes(&self) -> [(&'static str, bool, u64); 4] {
        let g = |v: usize, r: usize| self.handshakes[v][r].load(Ordering::Relaxed);
        [
            ("1.2", false, g(0, 0)),
            ("1.2", true, g(0, 1)),
            ("1.3", false, g(1, 0)),
            ("1.3", true, g(1, 1)),
        ]
    }

    pub fn failures(&self, reason: FailReason) -> u64 {
        self.failures[reason as usize].load(Ordering::Relaxed)
    }

    fn fail(&self, reason: FailReason) {
        self.failures[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// What a service's TLS keeps across reloads: counters, ticket keys (so tickets issued before a
/// reload still resume) and the session cache.
pub struct TlsShared {
    pub stats: Arc<TlsStats>,
    ticketer: Arc<dyn ProducesTickets>,
    /// The secret of a `ticket::SharedTicketer` in use, if any (else the keys are this
    /// process's own).
    ticket_secret: Option<[u8; 32]>,
    cache: Option<(usize, Arc<ServerSessionMemoryCache>)>,
}

impl std::fmt::Debug for TlsShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsShared").finish_non_exhaustive()
    }
}

impl TlsShared {
    pub fn new() -> Result<TlsShared, String> {
        Ok(TlsShared {
            stats: Arc::default(),
            ticketer: rustls::crypto::ring::Ticketer::new()
                .map_err(|e| format!("cannot make session ticket keys: {e}"))?,
            ticket_secret: None,
            cache: None,
        })
    }

    /// Ticket keys derived from `secret` (shared by HA nodes, see `ticket`), or this process's
    /// own random ones with `None`. Unchanged while the secret stays the same, so tickets keep
    /// resuming across reloads.
    pub fn share_tickets(&mut self, secret: Option<[u8; 32]>, service: &str) -> Result<(), String> {
        if self.ticket_secret == secret {
            return Ok(());
        }
        self.ticketer = match &secret {
            Some(s) => Arc::new(ticket::SharedTicketer::new(s, service)),
            None => rustls::crypto::ring::Ticketer::new()
                .map_err(|e| format!("cannot make session ticket keys: {e}"))?,
        };
        self.ticket_secret = secret;
        Ok(())
    }

    /// The session cache for a service with `session_cache = size`: the current one while
    /// the size stays the same.
    fn cache(&mut self, size: usize) -> Arc<ServerSessionMemoryCache> {
        match &self.cache {
            Some((n, c)) if *n == size => c.clone(),
            _ => {
                let c = ServerSessionMemoryCache::new(size);
                self.cache = Some((size, c.clone()));
                c
            }
        }
    }
}

/// A server configuration with one certificate and no client certificates, TLS 1.2 and 1.3
/// with the default suites, ALPN `http/1.1` (the admin API's `admin.tls`). Errors name `at`'s
/// keys (`admin.tls.cert`, `admin.tls.key`) and the file.
pub fn single_cert_acceptor(
    c: &fulcrum_config::TlsCert,
    at: &str,
) -> Result<tokio_rustls::TlsAcceptor, KeyError> {
    let provider = Arc::new(provider());
    let (ck, _) = load_cert(c, at, &provider)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| (at.to_string(), format!("no TLS version available: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver {
            certs: vec![Arc::new(ck)],
            names: NameIndex::default(),
        }));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Handshake limit of a tcp or message service without `tls_options.handshake_timeout`.
pub const DEFAULT_STREAM_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A configuration error: key path (`virtual_service[0].tls[1].key`) and message.
pub type KeyError = (String, String);

/// The TLS side of an https service.
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    /// `tls_options.handshake_timeout`, else the service's `header_timeout` (http) or 10 s.
    pub handshake_timeout: Duration,
    pub stats: Arc<TlsStats>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads the certificates, keys, OCSP responses and client CA of `vs` (at `path`, such as
    /// `virtual_service[2]`) and builds its TLS configuration. Every problem is reported, each
    /// with its key path and the file it concerns.
    pub fn load(
        vs: &VirtualService,
        path: &str,
        shared: &mut TlsShared,
    ) -> Result<ServerTls, Vec<KeyError>> {
        let Some(tls) = vs.tls() else {
            return Err(vec![(
                format!("{path}.tls"),
                "the service terminates no TLS".to_string(),
            )]);
        };
        let opts = &tls.options;
        let http = vs.as_http();
        let mut errors = Vec::new();
        let provider = match provider_for(opts, path) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                errors.push(e);
                Arc::new(provider())
            }
        };
        let mut resolver = Resolver {
            certs: Vec::new(),
            names: NameIndex::default(),
        };
        for (i, c) in tls.certs.iter().enumerate() {
            let at = format!("{path}.tls[{i}]");
            match load_cert(c, &at, &provider) {
                Ok((ck, names)) => {
                    let index = resolver.certs.len();
                    for n in &names {
                        resolver.names.add(n, index);
                    }
                    resolver.certs.push(Arc::new(ck));
                }
                Err(e) => errors.push(e),
            }
        }
        let verifier = match opts.client_auth {
            ClientAuth::None => None,
            auth => match client_verifier(opts, auth, &provider, path) {
                Ok(v) => Some(v),
                Err(e) => {
                    errors.push(e);
                    None
                }
            },
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        let versions: &[&rustls::SupportedProtocolVersion] = match opts.min_version {
            TlsVersion::V12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::V13 => &[&rustls::version::TLS13],
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| {
                vec![(
                    format!("{path}.tls_options.cipher_suites"),
                    format!("no cipher suite left for the TLS versions allowed: {e}"),
                )]
            })?;
        let builder = match verifier {
            Some(v) => builder.with_client_cert_verifier(v),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(resolver));
        // https offers its protocols by default; a tcp or message service carries bytes it does
        // not read, so it offers ALPN only when told which protocols its members speak.
        if http.is_some() || opts.alpn_set {
            config.alpn_protocols = opts.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        }
        config.ignore_client_order = !opts.cipher_suites.is_empty();
        config.session_storage = match opts.session_cache {
            0 => Arc::new(NoServerSessionStorage {}) as Arc<dyn StoresServerSessions>,
            n => shared.cache(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        if opts.session_tickets {
            config.ticketer = shared.ticketer.clone();
        } else if opts.session_cache == 0 {
            // No way to resume: do not send TLS 1.3 tickets that could never be redeemed.
            config.send_tls13_tickets = 0;
        }
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            handshake_timeout: opts.handshake_timeout.unwrap_or(match http {
                Some(h) => h.options.header_timeout,
                None => DEFAULT_STREAM_HANDSHAKE_TIMEOUT,
            }),
            stats: shared.stats.clone(),
        })
    }

    /// Runs the server handshake within the handshake timeout. A failure is counted, logged at
    /// debug and ends the connection; it is never an error of the service.
    /// Returns the stream and the protocol ALPN settled on, if any.
    pub async fn accept(
        &self,
        tcp: TcpStream,
        service: &str,
        peer: SocketAddr,
    ) -> Option<(TlsStream<TcpStream>, Option<Vec<u8>>)> {
        let result = tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(tcp)).await;
        let stream = match result {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let reason = FailReason::of(&e);
                self.stats.fail(reason);
                tracing::debug!(service, client = %peer, reason = reason.as_str(), error = %e, "TLS handshake failed");
                return None;
            }
            Err(_) => {
                self.stats.fail(FailReason::Timeout);
                tracing::debug!(service, client = %peer, reason = "timeout", "TLS handshake not finished within {:?}", self.handshake_timeout);
                return None;
            }
        };
        let (_, conn) = stream.get_ref();
        let version = usize::from(conn.protocol_version() == Some(ProtocolVersion::TLSv1_3));
        let resumed = usize::from(conn.handshake_kind() == Some(HandshakeKind::Resumed));
        self.stats.handshakes[version][resumed].fetch_add(1, Ordering::Relaxed);
        let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
        Some((stream, alpn))
    }
}

/// Picks a certificate by SNI: among those naming the server, the first whose key can sign with
/// a scheme the client offers (an RSA and an ECDSA certificate may serve the same name); the
/// first certificate of the service without SNI or for an unknown name.
#[derive(Debug)]
struct Resolver {
    certs: Vec<Arc<CertifiedKey>>,
    names: NameIndex,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let candidates = hello
            .server_name()
            .map_or(&[][..], |n| self.names.lookup(n));
        match candidates {
            [] => self.certs.first().cloned(),
            [one] => self.certs.get(*one).cloned(),
            many => {
                let schemes = hello.signature_schemes();
                many.iter()
                    .filter_map(|i| self.certs.get(*i))
                    .find(|ck| ck.key.choose_scheme(schemes).is_some())
                    .or_else(|| self.certs.get(many[0]))
                    .cloned()
            }
        }
    }
}

/// The provider restricted to `cipher_suites` (in that order), when given.
fn provider_for(opts: &TlsOptions, path: &str) -> Result<CryptoProvider, KeyError> {
    let mut p = provider();
    if opts.cipher_suites.is_empty() {
        return Ok(p);
    }
    let all = p.cipher_suites.clone();
    let name_of = |s: &rustls::SupportedCipherSuite| format!("{:?}", s.suite());
    let mut chosen = Vec::new();
    for (i, want) in opts.cipher_suites.iter().enumerate() {
        let want_iana = openssl_to_iana(want).unwrap_or(want);
        match all
            .iter()
            .find(|s| name_of(s).eq_ignore_ascii_case(want_iana))
        {
            Some(s) => chosen.push(*s),
            None => {
                let names: Vec<String> = all.iter().map(name_of).collect();
                return Err((
                    format!("{path}.tls_options.cipher_suites[{i}]"),
                    format!(
                        "unknown cipher suite {want:?}; this build offers: {}",
                        names.join(", ")
                    ),
                ));
            }
        }
    }
    let has13 = chosen
        .iter()
        .any(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)));
    if !has13 {
        return Err((
            format!("{path}.tls_options.cipher_suites"),
            "at least one TLS 1.3 cipher suite is needed (TLS 1.3 is always offered)".into(),
        ));
    }
    if opts.min_version == TlsVersion::V12
        && !chosen
            .iter()
            .any(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)))
    {
        return Err((
            format!("{path}.tls_options.cipher_suites"),
            "min_version is 1.2 but no TLS 1.2 cipher suite is listed; add one or set min_version = \"1.3\"".into(),
        ));
    }
    p.cipher_suites = chosen;
    Ok(p)
}

/// OpenSSL's names of the suites rustls offers, for operators coming from HAProxy or nginx.
fn openssl_to_iana(name: &str) -> Option<&'static str> {
    Some(match name {
        "TLS_AES_128_GCM_SHA256" => "TLS13_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384" => "TLS13_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256" => "TLS13_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256" => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384" => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305" => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256" => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES256-GCM-SHA384" => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-CHACHA20-POLY1305" => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        _ => return None,
    })
}

/// Reads one `tls` entry: the chain, the key (which must match the first certificate), the
/// OCSP response; returns the key and the DNS names the certificate serves.
fn load_cert(
    c: &fulcrum_config::TlsCert,
    at: &str,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, Vec<String>), KeyError> {
    let cert_at = format!("{at}.cert");
    let key_at = format!("{at}.key");
    let chain = read_chain(&c.cert).map_err(|e| (cert_at.clone(), e))?;
    let names = cert_names(&chain[0])
        .map_err(|e| (cert_at.clone(), format!("{}: {e}", c.cert.display())))?;
    let key_pem = read_file(&c.key).map_err(|e| (key_at.clone(), e))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        (
            key_at.clone(),
            format!(
                "{}: no usable private key (PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\"): {e}",
                c.key.display()
            ),
        )
    })?;
    let signing = provider.key_provider.load_private_key(key).map_err(|e| {
        (
            key_at.clone(),
            format!("{}: unsupported private key: {e}", c.key.display()),
        )
    })?;
    let mut ck = CertifiedKey::new(chain, signing);
    match ck.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err((
                key_at,
                format!(
                    "{}: this private key does not match the certificate in {}",
                    c.key.display(),
                    c.cert.display()
                ),
            ))
        }
        Err(e) => return Err((cert_at, format!("{}: {e}", c.cert.display()))),
    }
    if let Some(ocsp) = &c.ocsp {
        let der = std::fs::read(ocsp).map_err(|e| {
            (
                format!("{at}.ocsp"),
                format!("cannot read {}: {e}", ocsp.display()),
            )
        })?;
        if der.first() != Some(&0x30) {
            return Err((
                format!("{at}.ocsp"),
                format!(
                    "{}: not a DER OCSP response (openssl ocsp -respout writes one)",
                    ocsp.display()
                ),
            ));
        }
        ck.ocsp = Some(der);
    }
    Ok((ck, names))
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The certificates of a PEM file, leaf first.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_file(path)?;
    let mut chain = Vec::new();
    for c in CertificateDer::pem_slice_iter(&pem) {
        chain.push(c.map_err(|e| format!("{}: bad PEM: {e}", path.display()))?);
    }
    if chain.is_empty() {
        return Err(format!(
            "{}: no certificate in the file (expected PEM \"BEGIN CERTIFICATE\" blocks, leaf first)",
            path.display()
        ));
    }
    Ok(chain)
}

/// The DNS names a certificate serves: its subjectAltName DNS entries, else its subject's
/// common name (as clients accepted before RFC 6125).
fn cert_names(cert: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    let parsed = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| format!("not a valid X.509 certificate: {e:?}"))?;
    let mut names: Vec<String> = parsed.valid_dns_names().map(str::to_string).collect();
    if names.is_empty() {
        names = common_names(parsed.subject());
    }
    Ok(names)
}

/// The commonName values of an X.509 Name (the DER content of its SEQUENCE). Public for the
/// fuzz target; certificate files are read through [`ServerTls::load`].
pub fn common_names(mut name: &[u8]) -> Vec<String> {
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    let mut out = Vec::new();
    while let Some((0x31, mut set, rest)) = der_next(name) {
        name = rest;
        while let Some((0x30, atv, more)) = der_next(set) {
            set = more;
            if let Some((0x06, oid, value)) = der_next(atv) {
                if oid == CN {
                    if let Some((_, v, _)) = der_next(value) {
                        if let Ok(s) = std::str::from_utf8(v) {
                            out.push(s.to_string());
                        }
                    }
                }
            }
        }
    }
    out
}

/// One DER element: (tag, content, rest).
fn der_next(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, mut b) = b.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let mut len = 0usize;
        for &x in &b[..n] {
            len = (len << 8) | usize::from(x);
        }
        b = &b[n..];
        len
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

fn client_verifier(
    opts: &TlsOptions,
    auth: ClientAuth,
    provider: &Arc<CryptoProvider>,
    path: &str,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, KeyError> {
    let at = format!("{path}.tls_options.client_ca");
    let Some(ca) = &opts.client_ca else {
        return Err((at, "client_auth needs `client_ca`".into()));
    };
    let roots = load_roots(ca).map_err(|e| (at.clone(), e))?;
    let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let b = if auth == ClientAuth::Optional {
        b.allow_unauthenticated()
    } else {
        b
    };
    b.build()
        .map_err(|e| (at, format!("{}: {e}", ca.display())))
}

/// A CA bundle (PEM) as a root store.
pub fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let chain = read_chain(path)?;
    let mut roots = RootCertStore::empty();
    for c in chain {
        roots
            .add(c)
            .map_err(|e| format!("{}: unusable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_fallback() {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "legacy.example.test");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "Fulcrum");
        let kp = rcgen::KeyPair::generate().unwrap();
        let c = p.self_signed(&kp).unwrap();
        assert_eq!(
            cert_names(c.der()).unwrap(),
            vec!["legacy.example.test".to_string()]
        );
        let p = rcgen::CertificateParams::new(vec!["*.a.test".into(), "a.test".into()]).unwrap();
        let c = p.self_signed(&kp).unwrap();
        assert_eq!(cert_names(c.der()).unwrap(), vec!["*.a.test", "a.test"]);
    }

    #[test]
    fn der_lengths_are_bounded() {
        assert_eq!(der_next(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(der_next(&[0x30, 0x82, 0xff, 0xff, 0]), None);
        assert_eq!(
            der_next(&[0x30, 0x01, 7, 9]),
            Some((0x30, &[7u8][..], &[9u8][..]))
        );
        assert!(common_names(&[0x31, 0x80, 0x31]).is_empty());
    }
}
