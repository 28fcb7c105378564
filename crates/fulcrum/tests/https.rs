//! `protocol = "https"` end to end with real TLS clients (curl, openssl s_client) and a real TLS
//! member (nginx with ssl): certificates by SNI (wildcards, common-name fallback, default),
//! ALPN h2 / http/1.1, TLS versions, resumption by tickets and by the session cache, OCSP
//! stapling, client certificates, re-encryption to members, reloads, configuration errors.
//! Certificates are made in each test with the openssl CLI.

mod http_common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use http_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A throwaway PKI: a CA and certificates it signs, in a temporary folder.
struct Pki {
    dir: tempfile::TempDir,
}

fn run(cmd: &str, args: &[&str], cwd: &Path) {
    let out = std::process::Command::new(cmd)
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("openssl is installed by scripts/test.sh");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    fn new() -> Pki {
        let p = Pki {
            dir: tempfile::tempdir().unwrap(),
        };
        p.ca("ca", "Fulcrum Test CA");
        p
    }

    fn ca(&self, name: &str, cn: &str) {
        run(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
            self.dir.path(),
        );
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn p(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// A certificate `name.crt` / `name.key` for subject CN `cn` with `sans` (`DNS:x`,
    /// `IP:127.0.0.1`), signed by the CA `ca`.
    fn leaf_by(&self, ca: &str, name: &str, cn: &str, sans: &[&str]) {
        let d = self.dir.path();
        run(
            "openssl",
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
            d,
        );
        let mut ext = String::from(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        );
        if !sans.is_empty() {
            ext.push_str(&format!("subjectAltName={}\n", sans.join(",")));
        }
        std::fs::write(d.join(format!("{name}.ext")), ext).unwrap();
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.crt"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.crt"),
                "-extfile",
                &format!("{name}.ext"),
            ],
            d,
        );
    }

    fn leaf(&self, name: &str, cn: &str, sans: &[&str]) {
        self.leaf_by("ca", name, cn, sans)
    }

    /// A DER OCSP response saying `name.crt` is good, signed by the CA.
    fn ocsp(&self, name: &str) -> String {
        let d = self.dir.path();
        let serial = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in", &format!("{name}.crt")])
            .current_dir(d)
            .output()
            .unwrap();
        let serial = String::from_utf8_lossy(&serial.stdout)
            .trim()
            .trim_start_matches("serial=")
            .to_string();
        std::fs::write(
            d.join("index.txt"),
            format!("V\t301231235959Z\t\t{serial}\tunknown\t/CN={name}\n"),
        )
        .unwrap();
        run(
            "openssl",
            &[
                "ocsp",
                "-index",
                "index.txt",
                "-rsigner",
                "ca.crt",
                "-rkey",
                "ca.key",
                "-CA",
                "ca.crt",
                "-issuer",
                "ca.crt",
                "-cert",
                &format!("{name}.crt"),
                "-respout",
                &format!("{name}.ocsp"),
                "-ndays",
                "1",
            ],
            d,
        );
        self.p(&format!("{name}.ocsp"))
    }

    /// `tls = [...]` entries for the named certificates.
    fn tls(&self, names: &[&str]) -> String {
        let entries: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    "{{ cert = \"{}\", key = \"{}\" }}",
                    self.p(&format!("{n}.crt")),
                    self.p(&format!("{n}.key"))
                )
            })
            .collect();
        format!("tls = [{}]\n", entries.join(", "))
    }
}

/// An https virtual service `web` on `vs` with default pool `p`.
fn https_service(vs: SocketAddr, extra: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = [\"{vs}\"]\nprotocol = \"https\"\npool = \"p\"\n{extra}\n"
    )
}

/// Runs `openssl` with `args`, `input` on stdin; returns (success, stdout + stderr).
async fn openssl(args: &[&str], input: &str) -> (bool, String) {
    let mut child = tokio::process::Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl is installed by scripts/test.sh");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(15), child.wait_with_output())
        .await
        .expect("openssl finished within 15 s")
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `openssl s_client` to `vs` sending one HTTP request and reading to the end, so TLS 1.3
/// tickets that follow the handshake are received.
async fn s_client(vs: SocketAddr, args: &[&str]) -> (bool, String) {
    let connect = vs.to_string();
    let mut all = vec!["s_client", "-connect", &connect, "-ign_eof"];
    all.extend_from_slice(args);
    openssl(
        &all,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
}

/// A metric sample's value from the Prometheus text.
async fn metric(f: &Fulcrum, name_and_labels: &str) -> f64 {
    let r = f.api("GET", "/metrics", None).await.unwrap();
    let text = r.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name_and_labels} in\n{text}"))
}

async fn wait_metric(f: &Fulcrum, sample: &str, at_least: f64) -> f64 {
    let mut v = 0.0;
    for _ in 0..100 {
        v = metric(f, sample).await;
        if v >= at_least {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    v
}

fn resolve(name: &str, vs: SocketAddr) -> String {
    format!("{name}:{}:127.0.0.1", vs.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_by_sni_wildcard_common_name_and_default_with_alpn() {
    let pki = Pki::new();
    pki.leaf("a", "a.test", &["DNS:a.test", "DNS:www.a.test"]);
    pki.leaf("wild", "wild", &["DNS:*.wild.test"]);
    pki.leaf("legacy", "cn.test", &[]);
    let b = backends(1).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}\n[[persistence]]\nname = \"s\"\ntype = \"cookie_insert\"\n{}",
        https_service(
            vs,
            &format!("{}persistence = \"s\"", pki.tls(&["a", "wild", "legacy"]))
        ),
        pool("p", &addrs(&b), "")
    ))
    .await;
    let ca = pki.p("ca.crt");
    // SNI www.a.test: certificate a; curl negotiates h2 by ALPN.
    let url = format!("https://www.a.test:{}/echo", vs.port());
    let (ok, out, err) = curl(&[
        "-v",
        "-i",
        "--cacert",
        &ca,
        "--resolve",
        &resolve("www.a.test", vs),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(err.contains("subject: CN=a.test"), "{err}");
    assert!(err.contains("ALPN: server accepted h2"), "{err}");
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("x-forwarded-proto: https"),
        "{out}"
    );
    let cookie = header(&out, "set-cookie").unwrap_or_default().to_string();
    assert!(cookie.contains("Secure"), "{out}");
    // HTTP/1.1 by ALPN.
    let (ok, out, err) = curl(&[
        "-v",
        "-i",
        "--http1.1",
        "--cacert",
        &ca,
        "--resolve",
        &resolve("www.a.test", vs),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(err.contains("ALPN: server accepted http/1.1"), "{err}");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // Wildcard: one label deep.
    let url = format!("https://x.wild.test:{}/", vs.port());
    let (ok, out, err) = curl(&[
        "-v",
        "--cacert",
        &ca,
        "--resolve",
        &resolve("x.wild.test", vs),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(err.contains("subject: CN=wild"), "{err}");
    assert_eq!(out.trim(), "m0");
    // Common name, when the certificate has no DNS names.
    let (ok, out) = s_client(vs, &["-servername", "cn.test"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("subject=CN = cn.test"), "{out}");
    // No SNI, or a name no certificate has: the first certificate.
    for args in [
        &["-noservername"][..],
        &["-servername", "unknown.test"],
        &["-servername", "a.b.wild.test"],
    ] {
        let (ok, out) = s_client(vs, args).await;
        assert!(ok, "{out}");
        assert!(out.contains("subject=CN = a.test"), "{args:?}: {out}");
        assert!(out.contains("HTTP/1.1 200"), "{out}");
    }
    // ALPN as openssl asks for it.
    // (the HTTP/1.1 request s_client then sends is refused by the HTTP/2 server)
    let (_, out) = s_client(vs, &["-alpn", "h2,http/1.1", "-servername", "a.test"]).await;
    assert!(out.contains("ALPN protocol: h2"), "{out}");
    let (ok, out) = s_client(vs, &["-alpn", "http/1.1", "-servername", "a.test"]).await;
    assert!(ok && out.contains("ALPN protocol: http/1.1"), "{out}");
    assert!(
        wait_metric(
            &f,
            "fulcrum_tls_handshakes_total{vs=\"web\",version=\"1.3\",resumed=\"false\"}",
            7.0
        )
        .await
            >= 7.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_resumption_ocsp_and_counted_handshake_failures() {
    let pki = Pki::new();
    pki.leaf("a", "a.test", &["DNS:a.test"]);
    let ocsp = pki.ocsp("a");
    let b = backends(1).await;
    let (vs, strict, cache_only) = (free_addr(), free_addr(), free_addr());
    let cert = format!(
        "tls = [{{ cert = \"{}\", key = \"{}\", ocsp = \"{ocsp}\" }}]\n",
        pki.p("a.crt"),
        pki.p("a.key")
    );
    let f = start(&format!(
        "{}{}{}{}",
        https_service(
            vs,
            &format!("{cert}tls_options = {{ handshake_timeout = \"500ms\" }}")
        ),
        https_service(strict, &pki.tls(&["a"])).replace("\"web\"", "\"strict\"")
            + "tls_options = { min_version = \"1.3\" }\n",
        https_service(cache_only, &pki.tls(&["a"])).replace("\"web\"", "\"cache\"")
            + "tls_options = { session_tickets = false, session_cache = 100 }\n",
        pool("p", &addrs(&b), "")
    ))
    .await;
    let ca = pki.p("ca.crt");
    // TLS 1.2 and 1.3.
    let (ok, out) = s_client(
        vs,
        &[
            "-tls1_2",
            "-CAfile",
            &ca,
            "-verify_return_error",
            "-servername",
            "a.test",
        ],
    )
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("New, TLSv1.2, Cipher is ECDHE-ECDSA"), "{out}");
    let (ok, out) = s_client(vs, &["-tls1_3", "-CAfile", &ca, "-verify_return_error"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("New, TLSv1.3"), "{out}");
    // min_version = "1.3" refuses TLS 1.2.
    let (ok, out) = s_client(strict, &["-tls1_2"]).await;
    assert!(!ok, "{out}");
    let (ok, out) = s_client(strict, &["-tls1_3"]).await;
    assert!(ok && out.contains("TLSv1.3"), "{out}");
    assert!(
        wait_metric(
            &f,
            "fulcrum_tls_handshake_failures_total{vs=\"strict\",reason=\"version\"}",
            1.0
        )
        .await
            >= 1.0
    );
    // Resumption by ticket, TLS 1.3 and 1.2.
    let sess = pki.p("sess.pem");
    for v in ["-tls1_3", "-tls1_2"] {
        let (ok, out) = s_client(vs, &[v, "-sess_out", &sess]).await;
        assert!(ok && out.contains("New, TLSv1."), "{out}");
        let (ok, out) = s_client(vs, &[v, "-sess_in", &sess]).await;
        assert!(ok, "{out}");
        assert!(out.contains("Reused, TLSv1."), "{v}: {out}");
    }
    assert!(
        metric(
            &f,
            "fulcrum_tls_handshakes_total{vs=\"web\",version=\"1.3\",resumed=\"true\"}"
        )
        .await
            >= 1.0
    );
    assert!(
        metric(
            &f,
            "fulcrum_tls_handshakes_total{vs=\"web\",version=\"1.2\",resumed=\"true\"}"
        )
        .await
            >= 1.0
    );
    // Resumption from the server's session cache, without tickets (TLS 1.2 session ids).
    let (ok, out) = s_client(cache_only, &["-tls1_2", "-no_ticket", "-sess_out", &sess]).await;
    assert!(ok, "{out}");
    let (ok, out) = s_client(cache_only, &["-tls1_2", "-no_ticket", "-sess_in", &sess]).await;
    assert!(ok && out.contains("Reused, TLSv1.2"), "{out}");
    // OCSP stapling.
    let (ok, out) = s_client(vs, &["-status", "-servername", "a.test"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");
    // Bad handshakes are counted, never fatal: plain HTTP, no shared cipher, silence.
    let (got, _) = raw(
        vs,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(!String::from_utf8_lossy(&got).contains("200"));
    let (ok, out) = s_client(vs, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"]).await;
    assert!(!ok, "{out}");
    let mut silent = TcpStream::connect(vs).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed after the handshake timeout");
    assert!(matches!(n, Ok(0) | Err(_)));
    for reason in ["not_tls", "no_shared_cipher", "timeout"] {
        let sample =
            format!("fulcrum_tls_handshake_failures_total{{vs=\"web\",reason=\"{reason}\"}}");
        assert!(
            wait_metric(&f, &sample, 1.0).await >= 1.0,
            "{reason}: {}",
            f.api("GET", "/metrics", None).await.unwrap().text()
        );
    }
    let (ok, out) = s_client(vs, &["-servername", "a.test"]).await;
    assert!(ok && out.contains("HTTP/1.1 200"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_required_and_optional() {
    let pki = Pki::new();
    pki.leaf("a", "a.test", &["DNS:a.test"]);
    pki.leaf("client", "client one", &[]);
    pki.ca("other", "Other CA");
    pki.leaf_by("other", "stranger", "stranger", &[]);
    let b = backends(1).await;
    let (req, opt) = (free_addr(), free_addr());
    let ca = pki.p("ca.crt");
    let f = start(&format!(
        "{}{}{}",
        https_service(req, &pki.tls(&["a"]))
            + &format!("tls_options = {{ client_auth = \"required\", client_ca = \"{ca}\" }}\n"),
        https_service(opt, &pki.tls(&["a"])).replace("\"web\"", "\"opt\"")
            + &format!("tls_options = {{ client_auth = \"optional\", client_ca = \"{ca}\" }}\n"),
        pool("p", &addrs(&b), "")
    ))
    .await;
    let with_cert = [
        "--cert",
        &pki.p("client.crt"),
        "--key",
        &pki.p("client.key"),
    ];
    for vs in [req, opt] {
        let url = format!("https://a.test:{}/", vs.port());
        let r = resolve("a.test", vs);
        let (ok, out, err) =
            curl(&[&["--cacert", &ca, "--resolve", &r, &url][..], &with_cert].concat()).await;
        assert!(ok, "{err}");
        assert_eq!(out.trim(), "m0");
    }
    // Without a certificate: refused when required, served when optional.
    let url = format!("https://a.test:{}/", req.port());
    let (ok, out, _) = curl(&["--cacert", &ca, "--resolve", &resolve("a.test", req), &url]).await;
    assert!(!ok, "{out}");
    let url = format!("https://a.test:{}/", opt.port());
    let (ok, out, err) = curl(&["--cacert", &ca, "--resolve", &resolve("a.test", opt), &url]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "m0");
    // A certificate from another CA is refused in both modes.
    for vs in [req, opt] {
        let url = format!("https://a.test:{}/", vs.port());
        let (ok, out, _) = curl(&[
            "--cacert",
            &ca,
            "--resolve",
            &resolve("a.test", vs),
            &url,
            "--cert",
            &pki.p("stranger.crt"),
            "--key",
            &pki.p("stranger.key"),
        ])
        .await;
        assert!(!ok, "{out}");
    }
    assert!(
        wait_metric(
            &f,
            "fulcrum_tls_handshake_failures_total{vs=\"web\",reason=\"client_cert_missing\"}",
            1.0
        )
        .await
            >= 1.0
    );
    assert!(
        wait_metric(
            &f,
            "fulcrum_tls_handshake_failures_total{vs=\"opt\",reason=\"client_cert_invalid\"}",
            1.0
        )
        .await
            >= 1.0
    );
}

/// nginx serving TLS with `name.crt` on a free port; its answer names the TLS session.
struct Nginx {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn nginx_tls(pki: &Pki, name: &str) -> Nginx {
    let dir = tempfile::tempdir().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_addr().port()).parse().unwrap();
    let conf = format!(
        "master_process off;\nworker_processes 1;\ndaemon off;\nerror_log stderr error;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; keepalive_requests 100000; client_body_temp_path {d};\n\
         server {{ listen {addr} ssl http2; ssl_certificate {crt}; ssl_certificate_key {key};\n\
         ssl_protocols TLSv1.2 TLSv1.3;
         location / {{ return 200 \"tls $ssl_protocol sni=$ssl_server_name $server_protocol conn=$connection proto=$http_x_forwarded_proto\\n\"; }} }} }}\n",
        d = dir.path().display(),
        crt = pki.p(&format!("{name}.crt")),
        key = pki.p(&format!("{name}.key")),
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let child = std::process::Command::new("nginx")
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx is installed by scripts/test.sh");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            TcpStream::connect(addr).await.is_ok()
        })
        .await
    );
    Nginx {
        child,
        addr,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reencryption_to_tls_members_with_verification_and_reuse() {
    let pki = Pki::new();
    pki.leaf("front", "front.test", &["DNS:front.test"]);
    pki.leaf(
        "backend",
        "backend",
        &["DNS:backend.internal", "IP:127.0.0.1"],
    );
    pki.ca("other", "Other CA");
    let nginx = nginx_tls(&pki, "backend").await;
    let (vs, h2vs, bad, any) = (free_addr(), free_addr(), free_addr(), free_addr());
    let ca = pki.p("ca.crt");
    let other = pki.p("other.crt");
    let svc = |name: &str, addr: SocketAddr, pool: &str| {
        https_service(addr, &pki.tls(&["front"]))
            .replace("name = \"web\"", &format!("name = \"{name}\""))
            .replace("pool = \"p\"", &format!("pool = \"{pool}\""))
    };
    let m = [nginx.addr];
    let f = start(&format!(
        "{}{}{}{}{}{}{}{}",
        svc("web", vs, "p"),
        svc("h2", h2vs, "h2p"),
        svc("bad", bad, "badp"),
        svc("any", any, "anyp"),
        pool(
            "p",
            &m,
            &format!("tls = {{ verify = true, ca = \"{ca}\", sni = \"backend.internal\" }}")
        ),
        pool(
            "h2p",
            &m,
            &format!("http2 = true\ntls = {{ ca = \"{ca}\" }}")
        ),
        pool(
            "badp",
            &m,
            &format!("retries = 0\ntls = {{ ca = \"{other}\" }}")
        ),
        pool("anyp", &m, "tls = { verify = false }"),
    ))
    .await;
    let url = |a: SocketAddr| format!("https://front.test:{}/", a.port());
    let get = |a: SocketAddr, v: &'static str| {
        let (r, u) = (resolve("front.test", a), url(a));
        let ca = ca.clone();
        async move { curl(&["--cacert", &ca, "--resolve", &r, v, &u]).await }
    };
    // Verified against the CA, SNI backend.internal, HTTP/1.1 to the member; connections reused.
    let mut conns = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let (ok, out, err) = get(vs, "--http1.1").await;
        assert!(ok, "{err}");
        assert!(
            out.starts_with("tls TLSv1.3 sni=backend.internal HTTP/1.1"),
            "{out}"
        );
        assert!(out.contains("proto=https"), "{out}");
        conns.insert(
            out.split("conn=")
                .nth(1)
                .unwrap_or_default()
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert!(conns.len() <= 2, "nginx saw connections {conns:?}");
    assert!(
        member(&f, "p", nginx.addr).await["connections_reused"]
            .as_u64()
            .unwrap()
            >= 8
    );
    // HTTP/2 clients over the same reused TLS member connections.
    for _ in 0..3 {
        let (ok, out, err) = get(vs, "--http2").await;
        assert!(ok, "{err}");
        assert!(
            out.starts_with("tls TLSv1.3 sni=backend.internal HTTP/1.1"),
            "{out}"
        );
    }
    // Streamed request bodies go over the TLS member connection too (HTTP/1.1 and HTTP/2
    // clients), and the connection is reused after them.
    let body = pki.p("upload.bin");
    std::fs::write(&body, vec![b'x'; 300_000]).unwrap();
    for v in ["--http1.1", "--http2"] {
        let (ok, out, err) = curl(&[
            "--cacert",
            &ca,
            "--resolve",
            &resolve("front.test", vs),
            v,
            "--data-binary",
            &format!("@{body}"),
            &url(vs),
        ])
        .await;
        assert!(ok, "{err}");
        assert!(
            out.starts_with("tls TLSv1.3 sni=backend.internal HTTP/1.1"),
            "{v}: {out}"
        );
    }
    // A pool speaking HTTP/2 to its member over TLS (ALPN h2); no SNI: the member's IP address
    // is checked against the certificate.
    let (ok, out, err) = get(h2vs, "--http1.1").await;
    assert!(ok, "{err}");
    assert!(out.starts_with("tls TLSv1.3 sni= HTTP/2.0"), "{out}");
    // A member certificate from another CA: 502 and a failure on the member.
    let (ok, out, err) = get(bad, "--http1.1").await;
    assert!(ok, "{err}");
    assert!(out.contains("502"), "{out}");
    let m = member(&f, "badp", nginx.addr).await;
    assert!(m["connect_failures"].as_u64().unwrap() >= 1, "{m}");
    // verify = false accepts it.
    let (ok, out, err) = get(any, "--http1.1").await;
    assert!(ok, "{err}");
    assert!(out.starts_with("tls TLSv1.3"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_certificates_without_cutting_a_connection() {
    let pki = Pki::new();
    pki.leaf("old", "old.test", &["DNS:a.test"]);
    pki.leaf("new", "new.test", &["DNS:a.test"]);
    let b = backends(1).await;
    let vs = free_addr();
    let cfg = |cert: &str| {
        format!(
            "{}{}",
            https_service(vs, &pki.tls(&[cert])),
            pool("p", &addrs(&b), "")
        )
    };
    let f = start(&cfg("old")).await;
    let ca = pki.p("ca.crt");
    let (r, url) = (
        resolve("a.test", vs),
        format!("https://a.test:{}/delay/1500", vs.port()),
    );
    // A request in flight over the old certificate's connection while the reload happens.
    let slow = {
        let (ca, r, url) = (ca.clone(), r.clone(), url.clone());
        tokio::spawn(async move { curl(&["-v", "--cacert", &ca, "--resolve", &r, &url]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.write_config(&cfg("new"));
    let resp = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    let (ok, out, err) = curl(&[
        "-v",
        "--cacert",
        &ca,
        "--resolve",
        &r,
        &format!("https://a.test:{}/", vs.port()),
    ])
    .await;
    assert!(ok, "{err}");
    assert!(err.contains("subject: CN=new.test"), "{err}");
    assert_eq!(out.trim(), "m0");
    let (ok, out, err) = slow.await.unwrap();
    assert!(ok, "{err}");
    assert!(err.contains("subject: CN=old.test"), "{err}");
    assert_eq!(out.trim(), "m0");
    // A reload with a key that does not match is refused; the running certificate stays.
    let bad = cfg("new").replace(&pki.p("new.key"), &pki.p("old.key"));
    f.write_config(&bad);
    let resp = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert!(
        resp.text().contains("virtual_service[0].tls[0].key"),
        "{}",
        resp.text()
    );
    let (ok, _, err) = curl(&[
        "-v",
        "--cacert",
        &ca,
        "--resolve",
        &r,
        &format!("https://a.test:{}/", vs.port()),
    ])
    .await;
    assert!(ok && err.contains("subject: CN=new.test"), "{err}");
}

#[test]
fn check_reports_bad_certificates_and_keys_with_file_and_key_path() {
    let pki = Pki::new();
    pki.leaf("a", "a.test", &["DNS:a.test"]);
    pki.leaf("b", "b.test", &["DNS:b.test"]);
    std::fs::write(pki.path("empty.pem"), "# nothing here\n").unwrap();
    std::fs::write(
        pki.path("garbage.pem"),
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let base = |tls: &str, extra: &str| {
        format!(
            "[[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"https\"\npool = \"p\"\ntls = [{tls}]\n{extra}\n[[pool]]\nname = \"p\"\n"
        )
    };
    let entry = |c: &str, k: &str| format!("{{ cert = \"{}\", key = \"{}\" }}", pki.p(c), pki.p(k));
    let good = entry("a.crt", "a.key");
    let (ok, text) = check(&base(&good, ""));
    assert!(ok, "{text}");
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("{good}, {}", entry("missing.crt", "b.key")),
            "virtual_service[0].tls[1].cert",
            "missing.crt",
        ),
        (
            format!("{good}, {}", entry("b.crt", "a.key")),
            "virtual_service[0].tls[1].key",
            "does not match the certificate",
        ),
        (
            format!("{good}, {}", entry("empty.pem", "b.key")),
            "virtual_service[0].tls[1].cert",
            "no certificate in the file",
        ),
        (
            format!("{good}, {}", entry("garbage.pem", "b.key")),
            "virtual_service[0].tls[1].cert",
            "garbage.pem",
        ),
        (
            format!("{good}, {}", entry("b.crt", "b.crt")),
            "virtual_service[0].tls[1].key",
            "no usable private key",
        ),
        (
            format!("{good}, {}", entry("b.crt", "nokey.pem")),
            "virtual_service[0].tls[1].key",
            "nokey.pem",
        ),
        (
            format!(
                "{{ cert = \"{}\", key = \"{}\", ocsp = \"{}\" }}",
                pki.p("a.crt"),
                pki.p("a.key"),
                pki.p("a.crt")
            ),
            "virtual_service[0].tls[0].ocsp",
            "not a DER OCSP response",
        ),
    ];
    for (tls, key, what) in &cases {
        let (ok, text) = check(&base(tls, ""));
        assert!(!ok, "{tls}: {text}");
        assert!(
            text.contains(key) && text.contains(what),
            "{tls}: expected {key}: …{what}… in\n{text}"
        );
    }
    let (ok, text) = check(&base(
        &good,
        "tls_options = { cipher_suites = [\"TLS13_AES_128_GCM_SHA256\", \"RC4-MD5\"] }",
    ));
    assert!(!ok);
    assert!(
        text.contains(
            "virtual_service[0].tls_options.cipher_suites[1]: unknown cipher suite \"RC4-MD5\""
        ),
        "{text}"
    );
    let (ok, text) = check(&base(&good, "tls_options = { client_auth = \"required\" }"));
    assert!(!ok);
    assert!(
        text.contains("virtual_service[0].tls_options") && text.contains("needs `client_ca`"),
        "{text}"
    );
    let (ok, text) = check(&base(&good, "tls_options = { cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"ECDHE-ECDSA-AES128-GCM-SHA256\"], min_version = \"1.2\" }"));
    assert!(ok, "{text}");
    let (ok, text) = check(&format!(
        "{}tls = {{ ca = \"{}\" }}\n",
        base(&good, ""),
        pki.p("missing-ca.pem")
    ));
    assert!(!ok);
    assert!(
        text.contains("pool[0].tls.ca") && text.contains("missing-ca.pem"),
        "{text}"
    );
}

/// `fulcrum check` on `config` text; (success, output).
fn check(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// HTTPS over IPv6 end to end: a listener on ::1 and members on ::1, HTTP/1.1 and HTTP/2 (ALPN)
/// clients, the v6 client address in X-Forwarded-For, persistence by source address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_listener_and_members_over_tls() {
    let pki = Pki::new();
    pki.leaf("a", "a.test", &["DNS:a.test"]);
    let mut b = Vec::new();
    for i in 0..2 {
        b.push(
            HttpBackend::start("[::1]:0".parse().unwrap(), &format!("m{i}"))
                .await
                .unwrap(),
        );
    }
    let vs: SocketAddr = {
        let l = std::net::TcpListener::bind("[::1]:0").unwrap();
        l.local_addr().unwrap()
    };
    let _f = start(&format!(
        "{}[[persistence]]\nname = \"src\"\ntype = \"source_ip\"\n{}",
        https_service(vs, &format!("{}persistence = \"src\"", pki.tls(&["a"]))),
        pool("p", &addrs(&b), "algorithm = \"round_robin\""),
    ))
    .await;
    let ca = pki.p("ca.crt");
    let url = format!("https://a.test:{}/echo", vs.port());
    let resolve = format!("a.test:{}:[::1]", vs.port());
    let mut servers = std::collections::BTreeSet::new();
    for http2 in [false, true, false, true] {
        let version = if http2 { "--http2" } else { "--http1.1" };
        let (ok, out, err) =
            curl(&["-i", version, "--cacert", &ca, "--resolve", &resolve, &url]).await;
        assert!(ok, "{err}");
        let expected = if http2 { "HTTP/2 200" } else { "HTTP/1.1 200" };
        assert!(out.starts_with(expected), "{out}");
        assert!(out.contains("x-forwarded-for: ::1\n"), "{out}");
        assert!(out.contains("x-forwarded-proto: https\n"), "{out}");
        servers.insert(header(&out, "x-server").unwrap_or_default().to_string());
    }
    // Persistence by the v6 source: one member for every connection.
    assert_eq!(servers.len(), 1, "{servers:?}");
}

/// A tcp virtual service `name` on `vs` with pool `pool` and extra keys.
fn tcp_service(name: &str, vs: SocketAddr, pool: &str, extra: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"{name}\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"{pool}\"\n{extra}\n"
    )
}

/// TLS on a tcp service with the https options: certificates by SNI, no ALPN unless set,
/// client certificates; and re-encryption to TLS members (the pool's `tls`), verified.
/// The member behind the plain services speaks HTTP only so that curl can be the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_tcp_services_terminates_and_reencrypts() {
    let pki = Pki::new();
    pki.leaf("a", "a.test", &["DNS:a.test"]);
    pki.leaf("b", "b.test", &["DNS:b.test"]);
    pki.leaf("front", "front.test", &["DNS:front.test"]);
    pki.leaf(
        "backend",
        "backend",
        &["DNS:backend.internal", "IP:127.0.0.1"],
    );
    pki.leaf("client", "client one", &[]);
    let nginx = nginx_tls(&pki, "backend").await;
    let b = backends(1).await;
    let (plain, alpn, re, mtls) = (free_addr(), free_addr(), free_addr(), free_addr());
    let ca = pki.p("ca.crt");
    let f = start(&format!(
        "{}{}{}{}{}{}",
        tcp_service("plain", plain, "p", &pki.tls(&["a", "b"])),
        tcp_service(
            "alpn",
            alpn,
            "p",
            &format!(
                "{}tls_options = {{ alpn = [\"http/1.1\"] }}\n",
                pki.tls(&["a"])
            )
        ),
        tcp_service("re", re, "tlsp", &pki.tls(&["front"])),
        tcp_service(
            "mtls",
            mtls,
            "p",
            &format!(
                "{}tls_options = {{ client_auth = \"required\", client_ca = \"{ca}\" }}\n",
                pki.tls(&["a"])
            )
        ),
        pool("p", &addrs(&b), ""),
        pool(
            "tlsp",
            &[nginx.addr],
            &format!("tls = {{ ca = \"{ca}\", sni = \"backend.internal\" }}")
        ),
    ))
    .await;

    // Termination, the certificate chosen by SNI; no ALPN offered by default (the bytes are
    // the member's business), so curl speaks HTTP/1.1.
    for (name, cn) in [("a.test", "CN=a.test"), ("b.test", "CN=b.test")] {
        let url = format!("https://{name}:{}/", plain.port());
        let (ok, out, err) = curl(&[
            "-v",
            "--cacert",
            &ca,
            "--resolve",
            &resolve(name, plain),
            &url,
        ])
        .await;
        assert!(ok, "{err}");
        assert_eq!(out.trim(), "m0");
        assert!(err.contains(&format!("subject: {cn}")), "{err}");
        assert!(!err.contains("ALPN: server accepted"), "{err}");
    }
    // ALPN when the service says what its members speak.
    let url = format!("https://a.test:{}/", alpn.port());
    let (ok, out, err) = curl(&[
        "-v",
        "--cacert",
        &ca,
        "--resolve",
        &resolve("a.test", alpn),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "m0");
    assert!(err.contains("ALPN: server accepted http/1.1"), "{err}");

    // Re-encryption: the member (nginx) sees TLS with the pool's SNI, verified against the CA.
    let url = format!("https://front.test:{}/", re.port());
    let (ok, out, err) = curl(&[
        "--cacert",
        &ca,
        "--resolve",
        &resolve("front.test", re),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("tls TLSv1.3 sni=backend.internal HTTP/1.1"),
        "{out}"
    );

    // Client certificates: required here.
    let url = format!("https://a.test:{}/", mtls.port());
    let r = resolve("a.test", mtls);
    let (ok, out, _) = curl(&["--cacert", &ca, "--resolve", &r, &url]).await;
    assert!(!ok, "served without a client certificate: {out}");
    let (ok, out, err) = curl(&[
        "--cacert",
        &ca,
        "--resolve",
        &r,
        "--cert",
        &pki.p("client.crt"),
        "--key",
        &pki.p("client.key"),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "m0");
    // fastest_response samples through TLS are the time to the member's first byte too: a
    // member that answers after 150 ms is measured at about that, not at its connect time.
    let q = backends(1).await;
    let slow = free_addr();
    f.write_config(&format!(
        "{}{}{}",
        tcp_service("plain", plain, "p", &pki.tls(&["a", "b"])),
        tcp_service("slow", slow, "q", &pki.tls(&["a"])),
        pool("p", &addrs(&b), "") + &pool("q", &addrs(&q), "")
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let url = format!("https://a.test:{}/delay/150", slow.port());
    let (ok, out, err) =
        curl(&["--cacert", &ca, "--resolve", &resolve("a.test", slow), &url]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "m0");
    let ms = member(&f, "q", q[0].addr).await["response_time_ms"]
        .as_f64()
        .unwrap();
    assert!(ms >= 100.0, "measured {ms} ms");

    // The handshakes are counted like https ones.
    let sample = "fulcrum_tls_handshakes_total{vs=\"plain\",version=\"1.3\",resumed=\"false\"}";
    assert!(wait_metric(&f, sample, 2.0).await >= 2.0);
}

/// A TLS client (rustls) trusting `ca` (PEM), sending SNI `name`.
async fn tls_client(
    addr: SocketAddr,
    ca: &str,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    connector.connect(name, tcp).await
}

/// TLS on a message service: clients speak TLS, messages are cut from the decrypted stream and
/// balanced as usual; a client that does not trust the certificate gets no service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_message_services() {
    use fulcrum_testkit::message::{id, Answer, MessageSwitch, SwitchOptions, WireFraming};
    let pki = Pki::new();
    pki.leaf("bank", "bank.test", &["DNS:bank.test"]);
    pki.ca("other", "Other CA");
    let framing = WireFraming::two_byte();
    let mut switches = Vec::new();
    for i in 0..2 {
        switches.push(
            MessageSwitch::start(
                free_addr(),
                &format!("s{i}"),
                framing.clone(),
                SwitchOptions::default(),
            )
            .await
            .unwrap(),
        );
    }
    let vs = free_addr();
    let f = start(&format!(
        "[[virtual_service]]\nname = \"bank\"\nlisten = \"{vs}\"\nprotocol = \"message\"\npool = \"p\"\n\
         message_mode = \"async\"\nsequence = {{ offset = 0, length = 12 }}\n{}\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\nmonitors = []\n\
         [[pool.member]]\naddress = \"{}\"\n[[pool.member]]\naddress = \"{}\"\n",
        pki.tls(&["bank"]),
        switches[0].addr,
        switches[1].addr,
    ))
    .await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            switches.iter().all(|s| s.active() >= 2)
        })
        .await
    );
    let mut s = tls_client(vs, &pki.p("ca.crt"), "bank.test").await.unwrap();
    for n in 0..6u64 {
        let mut body = id(n).to_vec();
        body.extend_from_slice(b"pay");
        s.write_all(&framing.encode(&body)).await.unwrap();
    }
    let mut buf = Vec::new();
    let mut answers = Vec::new();
    let mut chunk = [0u8; 4096];
    while answers.len() < 6 {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
            .await
            .expect("answers within 5 s")
            .unwrap();
        assert!(n > 0, "closed after {} answers", answers.len());
        buf.extend_from_slice(&chunk[..n]);
        while let Some(body) = framing.decode(&mut buf).unwrap() {
            answers.push(Answer::parse(&body).unwrap());
        }
    }
    let servers: std::collections::BTreeSet<String> =
        answers.iter().map(|a| a.server.clone()).collect();
    assert_eq!(servers.len(), 2, "{answers:?}");
    assert!(answers.iter().all(|a| a.payload == b"pay"));
    assert_eq!(switches[0].messages() + switches[1].messages(), 6);
    // A client that does not trust the certificate fails the handshake; no message goes out.
    assert!(tls_client(vs, &pki.p("other.crt"), "bank.test")
        .await
        .is_err());
    let sample = "fulcrum_tls_handshakes_total{vs=\"bank\",version=\"1.3\",resumed=\"false\"}";
    assert!(wait_metric(&f, sample, 1.0).await >= 1.0);
}

/// The SNI and ALPN protocol a TLS client sent.
type Hello = (Option<String>, Option<Vec<u8>>);

/// A TLS member for message services: terminates TLS with the certificate `cert` and relays the
/// plain bytes to the message switch at `to` (connected only once the handshake is done).
/// Remembers the SNI and ALPN of every handshake.
struct TlsFront {
    addr: SocketAddr,
    seen: Arc<std::sync::Mutex<Vec<Hello>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsFront {
    async fn start(pki: &Pki, cert: &str, to: SocketAddr) -> TlsFront {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(pki.p(&format!("{cert}.crt")))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
        let key = PrivateKeyDer::from_pem_file(pki.p(&format!("{cert}.key"))).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: its connections go down with the front.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, log) = (acceptor.clone(), log.clone());
                conns.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let (_, c) = tls.get_ref();
                    let hello = (
                        c.server_name().map(str::to_string),
                        c.alpn_protocol().map(<[u8]>::to_vec),
                    );
                    log.lock().unwrap().push(hello);
                    let Ok(mut plain) = TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront { addr, seen, task }
    }

    fn handshakes(&self) -> Vec<Hello> {
        self.seen.lock().unwrap().clone()
    }
}

/// Sends messages `ids` over `s` (framed with `framing`) and returns their answers.
async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    framing: &fulcrum_testkit::message::WireFraming,
    ids: std::ops::Range<u64>,
) -> Vec<fulcrum_testkit::message::Answer> {
    use fulcrum_testkit::message::{id, Answer};
    let want = ids.clone().count();
    for n in ids {
        let mut body = id(n).to_vec();
        body.extend_from_slice(b"pay");
        s.write_all(&framing.encode(&body)).await.unwrap();
    }
    // A TLS stream keeps records the socket did not take until flushed.
    s.flush().await.unwrap();
    let mut buf = Vec::new();
    let mut answers = Vec::new();
    let mut chunk = [0u8; 4096];
    while answers.len() < want {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("answers within 5 s; {} came", answers.len()))
            .unwrap();
        assert!(n > 0, "closed after {} answers", answers.len());
        buf.extend_from_slice(&chunk[..n]);
        while let Some(body) = framing.decode(&mut buf).unwrap() {
            answers.push(Answer::parse(&body).unwrap());
        }
    }
    answers
}

/// Re-encryption on a message service (pool `tls`): every member connection is TLS, verified
/// against the pool's CA with its SNI and no ALPN; a member whose certificate does not verify
/// fails its connects (counted) and goes down, and the messages go to the others; a reload that
/// changes the pool's `tls` re-makes the member connections with the new settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_services_reencrypt_to_tls_members() {
    use fulcrum_testkit::message::{MessageSwitch, SwitchOptions, WireFraming};
    let pki = Pki::new();
    pki.leaf("bank", "bank.test", &["DNS:bank.test"]);
    pki.leaf("switch", "switch", &["DNS:switch.internal"]);
    pki.ca("other", "Other CA");
    pki.leaf_by("other", "rogue", "rogue", &["DNS:switch.internal"]);
    let framing = WireFraming::two_byte();
    let mut switches = Vec::new();
    for i in 0..3 {
        switches.push(
            MessageSwitch::start(
                free_addr(),
                &format!("s{i}"),
                framing.clone(),
                SwitchOptions::default(),
            )
            .await
            .unwrap(),
        );
    }
    let fronts = [
        TlsFront::start(&pki, "switch", switches[0].addr).await,
        TlsFront::start(&pki, "switch", switches[1].addr).await,
        TlsFront::start(&pki, "rogue", switches[2].addr).await,
    ];
    let vs = free_addr();
    let ca = pki.p("ca.crt");
    let config = |pool_tls: &str| {
        format!(
            "[[virtual_service]]\nname = \"bank\"\nlisten = \"{vs}\"\nprotocol = \"message\"\npool = \"p\"\n\
             message_mode = \"async\"\nsequence = {{ offset = 0, length = 12 }}\n{}\
             [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\nmonitors = []\n{pool_tls}\n\
             [[pool.member]]\naddress = \"{}\"\n[[pool.member]]\naddress = \"{}\"\n\
             [[pool.member]]\naddress = \"{}\"\n",
            pki.tls(&["bank"]),
            fronts[0].addr,
            fronts[1].addr,
            fronts[2].addr,
        )
    };
    let f = start(&config(&format!(
        "tls = {{ ca = \"{ca}\", sni = \"switch.internal\" }}"
    )))
    .await;
    let rogue = fronts[2].addr.to_string();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            switches[0].active() >= 2
                && switches[1].active() >= 2
                && f.member("p", &rogue).await["health"] == "down"
        })
        .await,
        "verified members connected, the unverifiable one down: {}",
        f.get_json("/api/v1/pools/p").await
    );
    let m = f.member("p", &rogue).await;
    assert!(m["connect_failures"].as_u64().unwrap() >= 1, "{m}");
    assert_eq!(
        switches[2].connections(),
        0,
        "no handshake with it completed"
    );
    // Each handshake sent the pool's SNI and offered no ALPN (the bytes are not HTTP).
    for front in &fronts[..2] {
        let seen = front.handshakes();
        assert!(seen.len() >= 2, "{seen:?}");
        assert!(seen
            .iter()
            .all(|(sni, alpn)| sni.as_deref() == Some("switch.internal") && alpn.is_none()));
    }

    // TLS on both sides: the client's messages, a burst of many TLS records each way, are
    // answered by the two verified members.
    let mut s = tls_client(vs, &ca, "bank.test").await.unwrap();
    let answers = exchange(&mut s, &framing, 0..3000).await;
    let servers: std::collections::BTreeSet<String> =
        answers.iter().map(|a| a.server.clone()).collect();
    assert_eq!(
        servers,
        ["s0", "s1"].iter().map(|s| s.to_string()).collect(),
        "{answers:?}"
    );
    assert!(answers.iter().all(|a| a.payload == b"pay"));
    let ids: std::collections::BTreeSet<_> = answers.iter().map(|a| a.id.clone()).collect();
    assert_eq!(ids.len(), 3000, "every message answered once");
    assert_eq!(switches[0].messages() + switches[1].messages(), 3000);
    assert_eq!(switches[2].messages(), 0);

    // A reload with the same `tls` (its client rebuilt, equal by content) keeps the dispatcher
    // and its member connections: a new client connection is served over the same ones.
    let verified = format!("tls = {{ ca = \"{ca}\", sni = \"switch.internal\" }}");
    let opened = [switches[0].connections(), switches[1].connections()];
    f.write_config(&config(&verified));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let mut same = tls_client(vs, &ca, "bank.test").await.unwrap();
    let answers = exchange(&mut same, &framing, 50..60).await;
    assert_eq!(answers.len(), 10);
    assert_eq!(
        [switches[0].connections(), switches[1].connections()],
        opened,
        "an unchanged pool tls keeps the member connections"
    );

    // A reload that turns verification off re-makes the member connections: the rogue member's
    // handshake now completes.
    f.write_config(&config("tls = { verify = false }"));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            switches[2].active() >= 1
        })
        .await,
        "the reload re-made the member connections with the new TLS settings"
    );
    let seen = fronts[2].handshakes();
    assert!(
        seen.iter().all(|(sni, _)| sni.is_none()),
        "no SNI without `sni` (the member is named by its address): {seen:?}"
    );
    // A new client connection gets the new dispatcher; its messages are answered.
    let mut s2 = tls_client(vs, &ca, "bank.test").await.unwrap();
    let answers = exchange(&mut s2, &framing, 100..106).await;
    assert_eq!(answers.len(), 6);
    assert!(answers.iter().all(|a| a.payload == b"pay"));
}
