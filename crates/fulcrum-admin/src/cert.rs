//! A certificate's notAfter, for `cert_expiry` alerts. Reading one field of the first
//! certificate of a PEM file is a short walk over DER (RFC 5280 §4.1); a full X.509 parser
//! would be a large dependency for it.

use std::time::SystemTime;

/// One DER element at the start of `b`: (tag, contents, rest).
fn element(b: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    fulcrum_tls::der::element(b).map_err(|e| format!("DER: {e}"))
}

/// UTCTime (YYMMDDHHMMSSZ) or GeneralizedTime (YYYYMMDDHHMMSSZ) to a time.
fn der_time(tag: u8, v: &[u8]) -> Result<SystemTime, String> {
    let s = std::str::from_utf8(v).map_err(|_| "DER: time is not ASCII")?;
    let full = match (tag, s.len()) {
        (0x17, 13) => {
            let yy: u32 = s[..2].parse().map_err(|_| "DER: bad UTCTime")?;
            format!(
                "{}{}",
                if yy >= 50 { 1900 + yy } else { 2000 + yy },
                &s[2..]
            )
        }
        (0x18, 15) => s.to_string(),
        _ => return Err(format!("DER: unsupported time {s:?}")),
    };
    let iso = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &full[0..4],
        &full[4..6],
        &full[6..8],
        &full[8..10],
        &full[10..12],
        &full[12..14]
    );
    humantime::parse_rfc3339(&iso).map_err(|e| format!("{iso}: {e}"))
}

/// notAfter of the first certificate in `pem`.
pub fn not_after(pem: &[u8]) -> Result<SystemTime, String> {
    let der = rustls_pemfile::certs(&mut &pem[..])
        .next()
        .ok_or("no CERTIFICATE in the file")?
        .map_err(|e| format!("PEM: {e}"))?;
    let (_, cert, _) = element(&der)?; // Certificate
    let (_, mut tbs, _) = element(cert)?; // TBSCertificate
    let (tag, _, rest) = element(tbs)?;
    if tag == 0xa0 {
        tbs = rest; // [0] version
    }
    let (_, _, rest) = element(tbs)?; // serialNumber
    let (_, _, rest) = element(rest)?; // signature
    let (_, _, rest) = element(rest)?; // issuer
    let (tag, validity, _) = element(rest)?;
    if tag != 0x30 {
        return Err("DER: no validity".into());
    }
    let (_, _, rest) = element(validity)?; // notBefore
    let (tag, v, _) = element(rest)?;
    der_time(tag, v)
}

#[cfg(test)]
mod tests {
    /// A certificate from the openssl CLI (an independent encoder) valid for 10 days.
    #[test]
    fn reads_not_after_of_an_openssl_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (key, cert) = (dir.path().join("k.pem"), dir.path().join("c.pem"));
        let ok = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args([
                "-nodes",
                "-subj",
                "/CN=example.test",
                "-days",
                "10",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl is installed by scripts/test.sh");
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let t = super::not_after(&std::fs::read(&cert).unwrap()).unwrap();
        let left = t
            .duration_since(std::time::SystemTime::now())
            .unwrap()
            .as_secs();
        assert!((10 * 86400 - 120..=10 * 86400).contains(&left), "{left}");
        let broken = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(super::not_after(broken).is_err());
        assert!(super::not_after(b"nothing").is_err());
    }
}
