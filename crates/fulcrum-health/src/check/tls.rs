//! The TLS client of https checks.
//!
//! It accepts any certificate. An https check proves that the member completes a TLS handshake
//! and answers HTTP inside it; whether its certificate is trusted is the data plane's job
//! (a pool's `tls.verify` and `ca`), and should an expired or self-signed certificate fail the
//! check, every member would go down at once on the day a certificate lapses, turning a warning
//! into an outage. The handshake signature is still verified, so the member does hold the key of
//! the certificate it shows.

use std::sync::{Arc, OnceLock};

use rustls::crypto;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio_rustls::TlsConnector;

/// The connector shared by all https checks, or why it could not be built.
pub(crate) fn connector() -> Result<TlsConnector, String> {
    static CONNECTOR: OnceLock<Result<TlsConnector, String>> = OnceLock::new();
    CONNECTOR.get_or_init(build).clone()
}

fn build() -> Result<TlsConnector, String> {
    let provider = Arc::new(crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(fulcrum_tls::client::any_certificate(provider))
        .with_no_client_auth();
    // Offering only HTTP/1.1 keeps servers that prefer h2 from choosing a protocol the check
    // does not speak.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The server name a check sends as SNI: the monitor's `host` when it is a DNS name (a port
/// after it is dropped), otherwise the member's IP, for which rustls sends no SNI.
pub(crate) fn server_name(host: Option<&str>, ip: std::net::IpAddr) -> ServerName<'static> {
    host.map(strip_port)
        .and_then(|h| ServerName::try_from(h.to_string()).ok())
        .filter(|n| matches!(n, ServerName::DnsName(_)))
        .unwrap_or(ServerName::IpAddress(ip.into()))
}

/// "example.com:8443" → "example.com"; IPv6 literals and names without a port stay as they are.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port))
            if !name.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            name
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn dns(host: &str) -> bool {
        matches!(server_name(Some(host), IP), ServerName::DnsName(n) if n.as_ref() == "example.com")
    }

    #[test]
    fn sni_is_the_host_name_without_port() {
        assert!(dns("example.com"));
        assert!(dns("example.com:8443"));
        assert!(matches!(
            server_name(Some("10.0.0.1"), IP),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name(Some("[::1]:443"), IP),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name(Some("::1"), IP),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(server_name(None, IP), ServerName::IpAddress(_)));
        assert!(matches!(
            server_name(Some("bad name!"), IP),
            ServerName::IpAddress(_)
        ));
    }

    #[test]
    fn the_connector_builds() {
        assert!(connector().is_ok());
    }
}
