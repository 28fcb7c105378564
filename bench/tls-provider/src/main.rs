//! Server-side cost of rustls with the ring and aws-lc-rs providers: full handshakes (TLS 1.3 and
//! 1.2, ECDSA P-256, X25519), and bulk AES-128-GCM records. Client and server run in memory; only
//! the server's calls are timed.
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

fn pump(from: &mut dyn FnMut(&mut Vec<u8>), to: &mut dyn FnMut(&[u8])) -> bool {
    let mut buf = Vec::new();
    from(&mut buf);
    if buf.is_empty() { return false; }
    to(&buf);
    true
}

struct Setup { server: Arc<ServerConfig>, client: Arc<ClientConfig> }

fn setup(p: Arc<CryptoProvider>, v: &'static rustls::SupportedProtocolVersion, cert: &CertificateDer<'static>, key: &[u8]) -> Setup {
    let server = ServerConfig::builder_with_provider(p.clone()).with_protocol_versions(&[v]).unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.to_vec()))).unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let mut client = ClientConfig::builder_with_provider(p).with_protocol_versions(&[v]).unwrap()
        .with_root_certificates(roots).with_no_client_auth();
    client.resumption = rustls::client::Resumption::disabled();
    Setup { server: Arc::new(server), client: Arc::new(client) }
}

/// Returns server time spent.
fn handshake(s: &Setup, bulk: usize) -> Duration {
    let mut c = ClientConnection::new(s.client.clone(), ServerName::try_from("bench.test").unwrap()).unwrap();
    let mut sv = ServerConnection::new(s.server.clone()).unwrap();
    let mut spent = Duration::ZERO;
    loop {
        let mut moved = false;
        let mut buf = Vec::new();
        while c.wants_write() { c.write_tls(&mut buf).unwrap(); }
        if !buf.is_empty() {
            moved = true;
            let t = Instant::now();
            let mut r = &buf[..];
            while !r.is_empty() { sv.read_tls(&mut r).unwrap(); sv.process_new_packets().unwrap(); }
            let mut out = Vec::new();
            while sv.wants_write() { sv.write_tls(&mut out).unwrap(); }
            spent += t.elapsed();
            let mut r = &out[..];
            while !r.is_empty() { c.read_tls(&mut r).unwrap(); c.process_new_packets().unwrap(); }
        }
        if !moved && !c.is_handshaking() && !sv.is_handshaking() { break; }
    }
    if bulk > 0 {
        // server -> client bulk: server encrypts `bulk` bytes, client reads them; and the reverse.
        let chunk = vec![7u8; 16384];
        let mut sent = 0;
        let mut sink = vec![0u8; 65536];
        while sent < bulk {
            let t = Instant::now();
            sv.writer().write_all(&chunk).unwrap();
            let mut out = Vec::with_capacity(17000);
            while sv.wants_write() { sv.write_tls(&mut out).unwrap(); }
            spent += t.elapsed();
            let mut r = &out[..];
            while !r.is_empty() { c.read_tls(&mut r).unwrap(); c.process_new_packets().unwrap(); }
            while let Ok(n) = c.reader().read(&mut sink) { if n == 0 { break; } }
            // client -> server
            c.writer().write_all(&chunk).unwrap();
            let mut out = Vec::with_capacity(17000);
            while c.wants_write() { c.write_tls(&mut out).unwrap(); }
            let t = Instant::now();
            let mut r = &out[..];
            while !r.is_empty() { sv.read_tls(&mut r).unwrap(); sv.process_new_packets().unwrap(); }
            while let Ok(n) = sv.reader().read(&mut sink) { if n == 0 { break; } }
            spent += t.elapsed();
            sent += chunk.len();
        }
    }
    spent
}

fn main() {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["bench.test".to_string()]).unwrap();
    let cert = params.self_signed(&kp).unwrap();
    let der = cert.der().clone();
    let key = kp.serialize_der();
    let providers: [(&str, fn() -> CryptoProvider); 2] = [
        ("ring", rustls::crypto::ring::default_provider),
        ("aws-lc-rs", rustls::crypto::aws_lc_rs::default_provider),
    ];
    println!("{:<10} {:<8} {:>22} {:>26}", "provider", "version", "server µs/handshake", "server µs/MB (each way)");
    for round in 0..2 {
        for (name, p) in providers {
            for (vn, v) in [("1.3", &rustls::version::TLS13), ("1.2", &rustls::version::TLS12)] {
                let s = setup(Arc::new(p()), v, &der, &key);
                let n = 400;
                let mut hs = Vec::new();
                for _ in 0..n { hs.push(handshake(&s, 0)); }
                hs.sort();
                let med = hs[n / 2];
                let mb = 64usize;
                let bulk_t = handshake(&s, mb << 20) - med;
                if round == 1 {
                    println!("{:<10} {:<8} {:>22.1} {:>26.1}", name, vn, med.as_secs_f64() * 1e6, bulk_t.as_secs_f64() * 1e6 / (2.0 * mb as f64));
                }
            }
        }
    }
}
