//! TLS to members (pool `tls = { verify, ca, sni }`): re-encryption, so traffic stays encrypted
//! end to end. Certificates are verified against the `ca` bundle, else the Mozilla roots
//! (`webpki-roots`); `verify = false` accepts any certificate (still checking the handshake
//! signatures, so the session keys are bound to the key the member presented).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use fulcrum_config::UpstreamTls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::KeyError;

/// How a pool's members are reached over TLS.
pub struct MemberTls {
    connector: tokio_rustls::TlsConnector,
    sni: Option<ServerName<'static>>,
    /// What the client was built from, so that a reload can tell whether it changed (the
    /// message plane keeps its member connections while it has not).
    verify: bool,
    alpn: Vec<Vec<u8>>,
    /// The trust anchors read from `ca` (None: the Mozilla roots, or no verification).
    anchors: Option<Vec<TrustAnchor<'static>>>,
}

/// Two clients are equal when they verify, name and negotiate the same way: same `verify`,
/// same `sni`, same ALPN offer, and the same CA certificates (compared by content, so a CA
/// bundle rewritten in place between two reloads counts as a change).
impl PartialEq for MemberTls {
    fn eq(&self, other: &MemberTls) -> bool {
        self.verify == other.verify
            && self.sni == other.sni
            && self.alpn == other.alpn
            && self.anchors == other.anchors
    }
}

impl Eq for MemberTls {}

impl std::fmt::Debug for MemberTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberTls")
            .field("sni", &self.sni)
            .finish_non_exhaustive()
    }
}

impl MemberTls {
    /// The TLS client of a pool (at `path`, such as `pool[1]`), offering ALPN `h2` when the pool
    /// speaks HTTP/2 to its members, else `http/1.1`.
    pub fn load(tls: &UpstreamTls, http2: bool, path: &str) -> Result<MemberTls, KeyError> {
        let alpn = if http2 {
            b"h2".to_vec()
        } else {
            b"http/1.1".to_vec()
        };
        Self::load_with_alpn(tls, vec![alpn], path)
    }

    /// The TLS client of a pool offering the ALPN protocols `alpn` (none for a tcp service,
    /// which does not know what its bytes are).
    pub fn load_with_alpn(
        tls: &UpstreamTls,
        alpn: Vec<Vec<u8>>,
        path: &str,
    ) -> Result<MemberTls, KeyError> {
        let provider = Arc::new(super::provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| (format!("{path}.tls"), e.to_string()))?;
        let mut anchors = None;
        let mut config = if tls.verify {
            let roots = match &tls.ca {
                Some(ca) => {
                    let roots = super::load_roots(ca).map_err(|e| (format!("{path}.tls.ca"), e))?;
                    anchors = Some(roots.roots.clone());
                    roots
                }
                None => RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                },
            };
            builder.with_root_certificates(roots).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(any_certificate(provider))
                .with_no_client_auth()
        };
        config.alpn_protocols = alpn.clone();
        let sni = match &tls.sni {
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|e| {
                (
                    format!("{path}.tls.sni"),
                    format!("{name:?} is not a DNS name: {e}"),
                )
            })?),
            None => None,
        };
        Ok(MemberTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            sni,
            verify: tls.verify,
            alpn,
            anchors,
        })
    }

    /// The TLS handshake with a member over a connected socket. Without `sni`, no server name
    /// is sent and the certificate must name the member's IP address.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        addr: SocketAddr,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = match &self.sni {
            Some(n) => n.clone(),
            None => ServerName::IpAddress(addr.ip().into()),
        };
        self.connector.connect(name, tcp).await
    }
}

/// A verifier that accepts any certificate but still checks the handshake signature, so the
/// peer does hold the key of the certificate it shows: a pool's `verify = false`, and https
/// health checks (which prove a member answers, not that its certificate is trusted).
pub fn any_certificate(provider: Arc<CryptoProvider>) -> Arc<dyn ServerCertVerifier> {
    Arc::new(AnyCertificate(provider))
}

#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
