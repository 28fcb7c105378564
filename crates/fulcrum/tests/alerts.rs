//! `[[alert]]` end to end: a member going down and coming back raises firing and resolved
//! notifications to a webhook (Alertmanager v4 JSON), syslog (RFC 5424 over UDP), SMTP (aiosmtpd
//! as the server) and Debian's prometheus-alertmanager (API v2); flaps shorter than
//! `hold` raise nothing; a dead receiver is retried and counted while traffic flows.

mod common;

use std::convert::Infallible;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use fulcrum_testkit::HttpBackend;
use http_body_util::BodyExt;
use serde_json::Value;

/// Records the JSON bodies POSTed to it.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<(String, Value, Instant)>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        Self::start_with(None).await
    }

    /// The receiver behind TLS with this certificate and key (PEM files).
    async fn start_tls(cert: &str, key: &str) -> Receiver {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let g = g.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let g = g.clone();
                            async move {
                                let path = req.uri().path().to_string();
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
                                g.lock().unwrap().push((path, v, Instant::now()));
                                Ok::<_, Infallible>(hyper::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                                ))
                            }
                        },
                    );
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                                .await;
                        }
                        Some(acceptor) => {
                            // A client that refuses the certificate ends the handshake here.
                            if let Ok(s) = acceptor.accept(s).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        Receiver { addr, got }
    }

    fn bodies(&self) -> Vec<Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|g| g.1.clone())
            .collect()
    }
}

/// aiosmtpd (Debian's python3-aiosmtpd) with its Debugging handler: a real SMTP server that
/// prints each message it accepts.
struct SmtpServer {
    child: Child,
    addr: SocketAddr,
    out: Arc<Mutex<String>>,
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SmtpServer {
    fn start() -> SmtpServer {
        let addr = free_addr();
        // Debian's python3 (not one a developer may have first in PATH) has the package.
        let mut child = Command::new("/usr/bin/python3")
            .args(["-u", "-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("{}:{}", addr.ip(), addr.port()))
            .args(["-c", "aiosmtpd.handlers.Debugging", "stdout"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3-aiosmtpd is installed by scripts/test.sh");
        let stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let o = out.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let mut o = o.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        });
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < end, "aiosmtpd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        SmtpServer { child, addr, out }
    }

    fn text(&self) -> String {
        self.out.lock().unwrap().clone()
    }
}

fn pool_config(vs: SocketAddr, backends: &[&HttpBackend], alert: &str) -> String {
    let members: String = backends
        .iter()
        .map(|b| format!("[[pool.member]]\naddress = \"{}\"\n", b.addr))
        .collect();
    format!(
        r#"[[virtual_service]]
name = "shop"
listen = ["{vs}"]
protocol = "http"
pool = "web"

[[pool]]
name = "web"
min_active = 2
monitors = ["hc"]
{members}
[[monitor]]
name = "hc"
type = "http"
path = "/health"
interval = "100ms"
timeout = "90ms"
rise = 1
fall = 1

{alert}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_down_fires_and_resolves_to_webhook_syslog_and_smtp() {
    let a = HttpBackend::start(free_addr(), "a").await.unwrap();
    let b = HttpBackend::start(free_addr(), "b").await.unwrap();
    let hook = Receiver::start().await;
    let syslog = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let smtp = tokio::task::spawn_blocking(SmtpServer::start)
        .await
        .unwrap();
    let vs = free_addr();
    let alert = format!(
        "[[alert]]\nname = \"ops\"\non = [\"member_down\", \"pool_below_min\"]\nwebhook = \"http://{}/hook\"\n\
         syslog = \"{}\"\nsmtp = {{ server = \"{}\", from = \"fulcrum@lb.example.org\", to = [\"oncall@example.org\"] }}\n\
         hold = \"300ms\"\nrepeat = \"1h\"\n",
        hook.addr,
        syslog.local_addr().unwrap(),
        smtp.addr
    );
    let f = start(&pool_config(vs, &[&a, &b], &alert)).await;
    let ok = wait_until(Duration::from_secs(5), || async {
        f.member("web", &a.addr.to_string()).await["health"] == "up"
    })
    .await;
    assert!(ok);
    a.set_healthy(false);
    let down_at = Instant::now();
    // Two rules' worth of conditions: the member and the pool (2 available < min_active 2).
    let ok = wait_until(Duration::from_secs(10), || async {
        let b = hook.bodies();
        b.iter()
            .any(|v| v["alerts"][0]["labels"]["alertname"] == "FulcrumMemberDown")
            && b.iter()
                .any(|v| v["alerts"][0]["labels"]["alertname"] == "FulcrumPoolBelowMinActive")
    })
    .await;
    assert!(ok, "no firing webhook: {:?}\n{}", hook.bodies(), f.logs());
    let firing_latency = {
        let got = hook.got.lock().unwrap();
        got.iter()
            .find(|g| g.1["alerts"][0]["labels"]["alertname"] == "FulcrumMemberDown")
            .unwrap()
            .2
            - down_at
    };
    let v = hook
        .bodies()
        .into_iter()
        .find(|v| v["alerts"][0]["labels"]["alertname"] == "FulcrumMemberDown")
        .unwrap();
    assert_eq!(v["version"], "4");
    assert_eq!(v["status"], "firing");
    assert_eq!(v["receiver"], "ops");
    let al = &v["alerts"][0];
    assert_eq!(al["labels"]["member"], a.addr.to_string());
    assert_eq!(al["labels"]["pool"], "web");
    assert_eq!(al["endsAt"], "0001-01-01T00:00:00Z");
    assert!(
        al["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("is down"),
        "{al}"
    );
    assert_eq!(al["fingerprint"].as_str().unwrap().len(), 16);
    let api = f.get_json("/api/v1/alerts").await;
    assert!(
        api["firing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["labels"]["member"] == a.addr.to_string()),
        "{api}"
    );
    // Syslog: RFC 5424, warning from facility daemon.
    let mut buf = vec![0u8; 4096];
    let mut messages = Vec::new();
    while messages.len() < 2 {
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), syslog.recv_from(&mut buf))
            .await
            .expect("a syslog datagram")
            .unwrap();
        messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let m = messages
        .iter()
        .find(|m| m.contains(" member_down "))
        .expect("member_down syslog");
    assert!(m.starts_with("<28>1 "), "{m}");
    assert!(m.contains(&format!("member=\"{}\"", a.addr)), "{m}");
    assert!(m.contains("FIRING member"), "{m}");
    // SMTP: the message reached the server with subject and body.
    let ok = wait_until(Duration::from_secs(10), || {
        let t = smtp.text();
        async move { t.contains("Subject: [FIRING] FulcrumMemberDown") }
    })
    .await;
    assert!(ok, "no mail: {}", smtp.text());
    assert!(smtp.text().contains("oncall@example.org"));

    // Back up: resolved, once it has stayed up for `hold`.
    a.set_healthy(true);
    let ok = wait_until(Duration::from_secs(10), || async {
        hook.bodies().iter().any(|v| {
            v["status"] == "resolved"
                && v["alerts"][0]["labels"]["alertname"] == "FulcrumMemberDown"
        })
    })
    .await;
    assert!(ok, "no resolved webhook: {:?}", hook.bodies());
    let v = hook
        .bodies()
        .into_iter()
        .find(|v| {
            v["status"] == "resolved"
                && v["alerts"][0]["labels"]["alertname"] == "FulcrumMemberDown"
        })
        .unwrap();
    assert_ne!(v["alerts"][0]["endsAt"], "0001-01-01T00:00:00Z");
    let ok = wait_until(Duration::from_secs(10), || {
        let t = smtp.text();
        async move { t.contains("Subject: [RESOLVED] FulcrumMemberDown") }
    })
    .await;
    assert!(ok, "no resolved mail: {}", smtp.text());
    let api = f.get_json("/api/v1/alerts").await;
    assert_eq!(api["firing"].as_array().unwrap().len(), 0, "{api}");
    let sinks = &api["delivery"]["ops"]["sinks"];
    for s in ["webhook", "syslog", "smtp"] {
        assert!(sinks[s]["sent"].as_u64().unwrap() >= 4, "{s}: {api}");
        assert_eq!(sinks[s]["failed"], 0, "{s}: {api}");
    }
    // Exactly one firing and one resolved per alert (repeat is an hour away).
    let member_notes = hook
        .bodies()
        .iter()
        .filter(|v| v["alerts"][0]["labels"]["alertname"] == "FulcrumMemberDown")
        .count();
    assert_eq!(member_notes, 2);
    let metrics = fulcrum_testkit::http_get(f.admin, "/metrics")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(
            "fulcrum_alert_notifications_total{rule=\"ops\",sink=\"webhook\",result=\"sent\"} 4"
        ),
        "{text}"
    );
    println!(
        "member down -> webhook received: {:?} (hold 300ms, monitor interval 100ms); delivery latency per sink: {}",
        firing_latency, api["delivery"]["ops"]["sinks"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaps_shorter_than_hold_are_damped_and_a_dead_receiver_is_retried_and_counted() {
    let a = HttpBackend::start(free_addr(), "a").await.unwrap();
    let b = HttpBackend::start(free_addr(), "b").await.unwrap();
    let hook = Receiver::start().await;
    let dead = free_addr();
    let vs = free_addr();
    let alert = format!(
        "[[alert]]\nname = \"ops\"\non = [\"member_down\"]\nwebhook = \"http://{}/hook\"\nhold = \"2s\"\n\n\
         [[alert]]\nname = \"lost\"\non = [\"member_down\"]\nwebhook = \"http://{dead}/hook\"\nhold = \"0s\"\n",
        hook.addr
    );
    let f = start(&pool_config(vs, &[&a, &b], &alert)).await;
    let aa = a.addr.to_string();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.member("web", &aa).await["health"] == "up"
        })
        .await
    );
    // A flap of ~0.5 s: seen (pending), never sent.
    a.set_healthy(false);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.member("web", &aa).await["health"] == "down"
        })
        .await
    );
    let pending = wait_until(Duration::from_secs(3), || async {
        f.get_json("/api/v1/alerts").await["pending"]
            .as_array()
            .is_some_and(|p| p.iter().any(|x| x["rule"] == "ops"))
    })
    .await;
    assert!(pending, "{}", f.get_json("/api/v1/alerts").await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.set_healthy(true);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.member("web", &aa).await["health"] == "up"
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        hook.bodies().is_empty(),
        "a short flap was sent: {:?}",
        hook.bodies()
    );
    // The dead receiver's rule (hold 0) fired and resolved: each send retried, then counted failed,
    // while the service kept serving.
    let ok = wait_until(Duration::from_secs(15), || async {
        let v = f.get_json("/api/v1/alerts").await;
        v["delivery"]["lost"]["sinks"]["webhook"]["failed"].as_u64() == Some(2)
    })
    .await;
    let v = f.get_json("/api/v1/alerts").await;
    assert!(ok, "{v}");
    assert_eq!(
        v["delivery"]["lost"]["sinks"]["webhook"]["retries"], 6,
        "{v}"
    );
    assert_eq!(v["delivery"]["lost"]["sinks"]["webhook"]["sent"], 0, "{v}");
    let r = fulcrum_testkit::http_get(vs, "/").await.unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_webhook_is_verified_against_its_ca_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    // Self-signed, and not a CA (webpki refuses a CA certificate as a server's own).
    let (cert, key) = (
        dir.path().join("hook.crt").display().to_string(),
        dir.path().join("hook.key").display().to_string(),
    );
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-subj", "/CN=alerts.test", "-days", "10"])
        .args(["-keyout", &key, "-out", &cert])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hook = Receiver::start_tls(&cert, &key).await;
    let a = HttpBackend::start(free_addr(), "a").await.unwrap();
    let b = HttpBackend::start(free_addr(), "b").await.unwrap();
    let vs = free_addr();
    let alert = format!(
        "[[alert]]\nname = \"tls\"\non = [\"member_down\"]\nwebhook = \"https://{0}/hook\"\nwebhook_ca = \"{cert}\"\nhold = \"0s\"\n\n\
         [[alert]]\nname = \"untrusted\"\non = [\"member_down\"]\nwebhook = \"https://{0}/hook\"\nhold = \"0s\"\n",
        hook.addr
    );
    let f = start(&pool_config(vs, &[&a, &b], &alert)).await;
    let aa = a.addr.to_string();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.member("web", &aa).await["health"] == "up"
        })
        .await
    );
    a.set_healthy(false);
    // Trusted through `webhook_ca`: delivered over TLS.
    let ok = wait_until(Duration::from_secs(10), || async {
        hook.bodies()
            .iter()
            .any(|v| v["receiver"] == "tls" && v["status"] == "firing")
    })
    .await;
    assert!(ok, "{:?}\n{}", hook.bodies(), f.logs());
    // The same self-signed receiver without `webhook_ca`: the Mozilla roots do not trust it,
    // so every attempt fails and is counted; nothing reaches the receiver from that rule.
    let ok = wait_until(Duration::from_secs(20), || async {
        let v = f.get_json("/api/v1/alerts").await;
        v["delivery"]["untrusted"]["sinks"]["webhook"]["failed"].as_u64() >= Some(1)
    })
    .await;
    let v = f.get_json("/api/v1/alerts").await;
    assert!(ok, "{v}");
    assert_eq!(
        v["delivery"]["untrusted"]["sinks"]["webhook"]["sent"], 0,
        "{v}"
    );
    assert_eq!(v["delivery"]["tls"]["sinks"]["webhook"]["failed"], 0, "{v}");
    println!(
        "https webhook: decision to acknowledgement {} ms (new TCP + TLS 1.3 handshake per delivery)",
        v["delivery"]["tls"]["sinks"]["webhook"]["last_latency_ms"]
    );
    assert!(
        !hook.bodies().iter().any(|v| v["receiver"] == "untrusted"),
        "{:?}",
        hook.bodies()
    );
    assert!(
        f.logs().contains("certificate") || f.logs().contains("UnknownIssuer"),
        "the failure names the certificate: {}",
        f.logs()
    );
}

/// Debian's prometheus-alertmanager on loopback, with its own storage and no clustering.
struct Alertmanager {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Alertmanager {
    async fn start() -> Alertmanager {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("am.yml");
        std::fs::write(
            &conf,
            "route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n",
        )
        .unwrap();
        let addr = free_addr();
        let child = Command::new("prometheus-alertmanager")
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-alertmanager is installed by scripts/test.sh");
        let am = Alertmanager {
            child,
            addr,
            _dir: dir,
        };
        let ok = wait_until(Duration::from_secs(20), || async {
            fulcrum_testkit::http_get(addr, "/-/ready")
                .await
                .is_ok_and(|r| r.status == 200)
        })
        .await;
        assert!(ok, "alertmanager not ready");
        am
    }

    async fn alerts(&self) -> Vec<Value> {
        fulcrum_testkit::http_get(self.addr, "/api/v2/alerts")
            .await
            .map(|r| r.json())
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_api_v2_receives_the_alert_and_its_resolution() {
    let am = Alertmanager::start().await;
    let a = HttpBackend::start(free_addr(), "a").await.unwrap();
    let b = HttpBackend::start(free_addr(), "b").await.unwrap();
    let vs = free_addr();
    let alert = format!(
        "[[alert]]\nname = \"am\"\non = [\"member_down\"]\nwebhook = \"http://{}/api/v2/alerts\"\nhold = \"0s\"\n",
        am.addr
    );
    let f = start(&pool_config(vs, &[&a, &b], &alert)).await;
    let aa = a.addr.to_string();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.member("web", &aa).await["health"] == "up"
        })
        .await
    );
    b.set_healthy(false);
    let bb = b.addr.to_string();
    let ok = wait_until(Duration::from_secs(10), || async {
        am.alerts().await.iter().any(|x| {
            x["labels"]["alertname"] == "FulcrumMemberDown"
                && x["labels"]["member"] == bb.as_str()
                && x["status"]["state"] == "active"
        })
    })
    .await;
    assert!(
        ok,
        "alertmanager never listed the alert: {:?}\n{}",
        am.alerts().await,
        f.logs()
    );
    let x = am
        .alerts()
        .await
        .into_iter()
        .find(|x| x["labels"]["member"] == bb.as_str())
        .unwrap();
    assert!(
        x["annotations"]["summary"].as_str().unwrap().contains(&bb),
        "{x}"
    );
    b.set_healthy(true);
    // Resolved: endsAt now, so Alertmanager stops listing it as active.
    let ok = wait_until(Duration::from_secs(10), || async {
        !am.alerts()
            .await
            .iter()
            .any(|x| x["labels"]["member"] == bb.as_str() && x["status"]["state"] == "active")
    })
    .await;
    assert!(ok, "alert still active: {:?}", am.alerts().await);
    let v = f.get_json("/api/v1/alerts").await;
    assert_eq!(v["delivery"]["am"]["sinks"]["webhook"]["failed"], 0, "{v}");
    assert!(
        v["delivery"]["am"]["sinks"]["webhook"]["sent"]
            .as_u64()
            .unwrap()
            >= 2,
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_expiring_within_the_threshold_fires_cert_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) =
        fulcrum_testkit::pki::self_signed(dir.path(), "site", "shop.example.test", 10, None);
    let backend = HttpBackend::start(free_addr(), "a").await.unwrap();
    let hook = Receiver::start().await;
    let vs = free_addr();
    let f = start(&format!(
        r#"[[virtual_service]]
name = "secure"
listen = ["{vs}"]
protocol = "https"
pool = "web"
tls = [{{ cert = "{cert}", key = "{key}" }}]

[[pool]]
name = "web"
[[pool.member]]
address = "{}"

[[alert]]
name = "certs"
on = ["cert_expiry"]
webhook = "http://{}/hook"
cert_expiry = "30d"
hold = "0s"
"#,
        backend.addr, hook.addr
    ))
    .await;
    let ok = wait_until(Duration::from_secs(10), || async {
        hook.bodies()
            .iter()
            .any(|v| v["alerts"][0]["labels"]["alertname"] == "FulcrumCertificateExpiry")
    })
    .await;
    assert!(ok, "{:?}\n{}", hook.bodies(), f.logs());
    let v = &hook.bodies()[0]["alerts"][0];
    assert_eq!(v["labels"]["service"], "secure");
    assert_eq!(v["labels"]["certificate"], cert.as_str());
    assert!(
        v["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("expires in 9 days"),
        "{v}"
    );
    let c = f.get_json("/api/v1/certificates").await;
    assert_eq!(c["certificates"][0]["days_left"], 9, "{c}");
    assert_eq!(c["certificates"][0]["service"], "secure");
}

/// The most a misbehaving receiver below streams on one connection: far more than Fulcrum may
/// hold, bounded so a Fulcrum without limits is shown up without exhausting the host.
const FLOOD_BYTES: usize = 128 << 20;

/// A webhook receiver and an SMTP server on raw sockets that, while `endless` is set, answer
/// with a reply that never ends (an HTTP body, an SMTP line without its end), and otherwise
/// answer properly and count what they accepted.
struct Misbehaving {
    endless: Arc<std::sync::atomic::AtomicBool>,
    webhook: SocketAddr,
    smtp: SocketAddr,
    flood_connections: Arc<std::sync::atomic::AtomicUsize>,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl Misbehaving {
    async fn start() -> Misbehaving {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        let endless = Arc::new(AtomicBool::new(true));
        let flood_connections = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let hook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let smtp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let m = Misbehaving {
            endless: endless.clone(),
            webhook: hook.local_addr().unwrap(),
            smtp: smtp.local_addr().unwrap(),
            flood_connections: flood_connections.clone(),
            accepted: accepted.clone(),
        };
        let (e, f, a) = (endless.clone(), flood_connections.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = hook.accept().await {
                let (e, f, a) = (e.clone(), f.clone(), a.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(30),
                        Self::webhook_connection(s, e, f, a),
                    )
                    .await;
                });
            }
        });
        tokio::spawn(async move {
            while let Ok((s, _)) = smtp.accept().await {
                let (e, f, a) = (endless.clone(), flood_connections.clone(), accepted.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(30),
                        Self::smtp_connection(s, e, f, a),
                    )
                    .await;
                });
            }
        });
        m
    }

    /// Writes `prefix`, then filler up to FLOOD_BYTES or until the peer stops reading, then
    /// holds the connection open (the caller's timeout ends it).
    async fn flood(s: &mut tokio::net::TcpStream, prefix: &[u8], chunk: &[u8]) {
        use tokio::io::AsyncWriteExt;
        if s.write_all(prefix).await.is_err() {
            return;
        }
        let mut sent = 0;
        while sent < FLOOD_BYTES {
            if s.write_all(chunk).await.is_err() {
                return;
            }
            sent += chunk.len();
        }
        std::future::pending::<()>().await;
    }

    async fn webhook_connection(
        mut s: tokio::net::TcpStream,
        endless: Arc<std::sync::atomic::AtomicBool>,
        floods: Arc<std::sync::atomic::AtomicUsize>,
        accepted: Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // The request: headers, then Content-Length bytes of body.
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        let body_at = loop {
            if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut buf).await {
                Ok(n) if n > 0 && req.len() < 1 << 20 => req.extend_from_slice(&buf[..n]),
                _ => return,
            }
        };
        let head = String::from_utf8_lossy(&req[..body_at]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while req.len() < body_at + length {
            match s.read(&mut buf).await {
                Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                _ => return,
            }
        }
        if endless.load(Ordering::SeqCst) {
            floods.fetch_add(1, Ordering::SeqCst);
            // One chunk of a chunked body, repeated: a body without end.
            let mut chunk = b"10000\r\n".to_vec();
            chunk.extend(std::iter::repeat_n(b'x', 0x10000));
            chunk.extend_from_slice(b"\r\n");
            Self::flood(
                &mut s,
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                &chunk,
            )
            .await;
        } else {
            accepted.fetch_add(1, Ordering::SeqCst);
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
        }
    }

    async fn smtp_connection(
        mut s: tokio::net::TcpStream,
        endless: Arc<std::sync::atomic::AtomicBool>,
        floods: Arc<std::sync::atomic::AtomicUsize>,
        accepted: Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        if endless.load(Ordering::SeqCst) {
            floods.fetch_add(1, Ordering::SeqCst);
            // A greeting whose line never ends.
            Self::flood(&mut s, b"220 ", &[b'x'; 0x10000]).await;
            return;
        }
        let (r, mut w) = s.split();
        let mut r = tokio::io::BufReader::new(r);
        if w.write_all(b"220 fake ESMTP\r\n").await.is_err() {
            return;
        }
        let mut in_data = false;
        // A transaction is a handful of lines and a short message.
        for _ in 0..1000 {
            let mut line = String::new();
            match r.read_line(&mut line).await {
                Ok(n) if n > 0 => {}
                _ => return,
            }
            let answer: &[u8] = if in_data {
                if line != ".\r\n" {
                    continue;
                }
                in_data = false;
                accepted.fetch_add(1, Ordering::SeqCst);
                b"250 queued\r\n"
            } else if line.starts_with("DATA") {
                in_data = true;
                b"354 go on\r\n"
            } else if line.starts_with("QUIT") {
                let _ = w.write_all(b"221 bye\r\n").await;
                return;
            } else {
                b"250 ok\r\n"
            };
            if w.write_all(answer).await.is_err() {
                return;
            }
        }
    }
}

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_webhook_and_smtp_replies_fail_the_delivery_within_bounded_memory() {
    use std::sync::atomic::Ordering;
    let a = HttpBackend::start(free_addr(), "a").await.unwrap();
    let b = HttpBackend::start(free_addr(), "b").await.unwrap();
    let receivers = Misbehaving::start().await;
    let alert = format!(
        "[[alert]]\nname = \"ops\"\non = [\"member_down\"]\nwebhook = \"http://{}/hook\"\n\
         smtp = {{ server = \"{}\", from = \"fulcrum@lb.example.org\", to = [\"oncall@example.org\"] }}\n\
         hold = \"0s\"\nrepeat = \"1h\"\n",
        receivers.webhook, receivers.smtp
    );
    let f = start(&pool_config(free_addr(), &[&a, &b], &alert)).await;
    let aa = a.addr.to_string();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.member("web", &aa).await["health"] == "up"
        })
        .await
    );
    let before = peak_rss(f.pid());
    a.set_healthy(false);
    // Every attempt draws an endless reply; the notification counts as failed on both sinks.
    let failed = wait_until(Duration::from_secs(60), || async {
        let v = f.get_json("/api/v1/alerts").await;
        let sinks = &v["delivery"]["ops"]["sinks"];
        sinks["webhook"]["failed"].as_u64() >= Some(1)
            && sinks["smtp"]["failed"].as_u64() >= Some(1)
    })
    .await;
    let grown = peak_rss(f.pid()).saturating_sub(before);
    println!("Fulcrum's peak memory grew by {} KiB", grown >> 10);
    assert!(
        receivers.flood_connections.load(Ordering::SeqCst) >= 2,
        "the receivers were not reached"
    );
    assert!(
        grown < 48 << 20,
        "Fulcrum's peak memory grew by {} MiB reading endless replies",
        grown >> 20
    );
    assert!(failed, "{}", f.get_json("/api/v1/alerts").await);
    // Later alerts still go out once the receivers behave.
    receivers.endless.store(false, Ordering::SeqCst);
    a.set_healthy(true);
    let sent = wait_until(Duration::from_secs(20), || async {
        let v = f.get_json("/api/v1/alerts").await;
        let sinks = &v["delivery"]["ops"]["sinks"];
        sinks["webhook"]["sent"].as_u64() >= Some(1) && sinks["smtp"]["sent"].as_u64() >= Some(1)
    })
    .await;
    assert!(sent, "{}", f.get_json("/api/v1/alerts").await);
    assert!(receivers.accepted.load(Ordering::SeqCst) >= 2);
}
