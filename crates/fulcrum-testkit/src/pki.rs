//! Test certificates made by the openssl CLI (which the test command installs).

use std::path::Path;
use std::process::Command;

/// A self-signed P-256 certificate for `cn`, valid for `days`, written as `{name}.crt` and
/// `{name}.key` in `dir`, with `san` (e.g. "IP:127.0.0.1") as its subjectAltName when given.
/// Returns the certificate's and the key's paths.
pub fn self_signed(
    dir: &Path,
    name: &str,
    cn: &str,
    days: u32,
    san: Option<&str>,
) -> (String, String) {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let mut cmd = Command::new("openssl");
    cmd.args([
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
        &format!("/CN={cn}"),
        "-days",
        &days.to_string(),
    ])
    .arg("-keyout")
    .arg(&key)
    .arg("-out")
    .arg(&cert);
    if let Some(san) = san {
        cmd.args(["-addext", &format!("subjectAltName={san}")]);
    }
    let out = cmd
        .output()
        .expect("openssl is installed by scripts/test.sh");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert.display().to_string(), key.display().to_string())
}
