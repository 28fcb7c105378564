//! `protocol = "ftp"` end to end: two real vsftpd members on loopback, real curl and lftp
//! clients, passive (EPSV and PASV) and active (PORT / EPRT) transfers through the binary.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use fulcrum_testkit::{free_addr_on, free_port};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A vsftpd child process, killed when dropped (also when the test fails).
struct Vsftpd {
    child: Child,
    addr: SocketAddr,
    upload_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Vsftpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an anonymous vsftpd on `ip` that serves `marker.txt` containing `marker` and takes
/// uploads into `upload/`; its passive ports are `passive`.
async fn vsftpd(ip: [u8; 4], marker: &str, passive: (u16, u16)) -> Vsftpd {
    vsftpd_with(ip, marker, passive, None, "").await
}

/// As `vsftpd`, announcing `announce` (else its own address) in passive answers, with `extra`
/// configuration lines.
async fn vsftpd_with(
    ip: [u8; 4],
    marker: &str,
    passive: (u16, u16),
    announce: Option<std::net::IpAddr>,
    extra: &str,
) -> Vsftpd {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("root");
    let empty = dir.path().join("empty");
    let upload = root.join("upload");
    std::fs::create_dir_all(&upload).expect("upload dir");
    std::fs::create_dir_all(&empty).expect("empty dir");
    std::fs::write(root.join(format!("{marker}.txt")), marker).expect("marker file");
    use std::os::unix::fs::PermissionsExt;
    // vsftpd refuses a root the anonymous user can write; the upload dir is theirs.
    for (path, mode) in [(&root, 0o755), (&empty, 0o755), (&upload, 0o777)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let addr = free_addr_on(ip);
    let conf = dir.path().join("vsftpd.conf");
    std::fs::write(
        &conf,
        format!(
            "listen=YES\nlisten_ipv6=NO\nlisten_address={}\nlisten_port={}\nbackground=NO\n\
             anonymous_enable=YES\nlocal_enable=NO\nno_anon_password=YES\nanon_root={}\n\
             write_enable=YES\nanon_upload_enable=YES\nanon_mkdir_write_enable=YES\n\
             anon_umask=022\nanon_other_write_enable=YES\nsecure_chroot_dir={}\n\
             pasv_enable=YES\npasv_address={}\npasv_min_port={}\npasv_max_port={}\n\
             port_enable=YES\nconnect_from_port_20=NO\nseccomp_sandbox=NO\nisolate=NO\n\
             isolate_network=NO\nftpd_banner=member {marker}\nxferlog_enable=NO\n\
             dual_log_enable=NO\nsyslog_enable=NO\nvsftpd_log_file=/dev/null\n{extra}",
            addr.ip(),
            addr.port(),
            root.display(),
            empty.display(),
            announce.unwrap_or(addr.ip()),
            passive.0,
            passive.1,
        ),
    )
    .expect("vsftpd.conf");
    let child = Command::new("/usr/sbin/vsftpd")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("vsftpd starts");
    let server = Vsftpd {
        child,
        addr,
        upload_dir: upload,
        _dir: dir,
    };
    let up = wait_until(Duration::from_secs(5), || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    assert!(up, "vsftpd on {addr} did not start");
    server
}

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The marker of the member behind `vs` for a fresh control connection: the file it lists.
fn listed_marker(vs: SocketAddr, mode: &[&str]) -> String {
    let url = format!("ftp://{vs}/");
    let mut args = mode.to_vec();
    args.extend(["--list-only", url.as_str()]);
    let (ok, text) = curl(&args);
    assert!(ok, "listing through {vs} with {mode:?}: {text}");
    text.lines()
        .find_map(|l| l.trim().strip_suffix(".txt"))
        .unwrap_or_else(|| panic!("no marker in listing {text:?}"))
        .to_string()
}

fn ftp_config(vs: SocketAddr, passive: &str, members: &[&Vsftpd]) -> String {
    let members: String = members
        .iter()
        .map(|m| format!("[[pool.member]]\naddress = \"{}\"\n", m.addr))
        .collect();
    format!(
        "[[virtual_service]]\nname = \"ftp\"\nlisten = [\"{vs}\"]\nprotocol = \"ftp\"\npool = \"p\"\n\
         ftp_passive_ports = \"{passive}\"\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n{members}"
    )
}

/// A port range of `n` ports nobody listens on now (a random start, then bind-checked).
fn free_range(n: u16) -> (u16, u16) {
    for _ in 0..50 {
        let start = free_port();
        let Some(end) = start.checked_add(n - 1) else {
            continue;
        };
        let free = (start..=end).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            return (start, end);
        }
    }
    panic!("no free range of {n} ports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_and_active_transfers_reach_the_member_of_their_control_connection() {
    let a = vsftpd([127, 0, 0, 21], "alpha", free_range(10)).await;
    let b = vsftpd([127, 0, 0, 22], "beta", free_range(10)).await;
    let vs = free_addr();
    let (low, high) = free_range(20);
    let f = start(&ftp_config(vs, &format!("{low}-{high}"), &[&a, &b])).await;

    // EPSV, PASV, PORT and EPRT listings, each on its own control connection: round robin
    // alternates the members, and each listing shows the file set of its own member.
    let modes: [&[&str]; 4] = [
        &["--ftp-pasv"],
        &["--ftp-pasv", "--disable-epsv"],
        &["--ftp-port", "127.0.0.1", "--disable-eprt"],
        &["--ftp-port", "127.0.0.1"],
    ];
    for (n, mode) in modes.iter().enumerate() {
        let first = listed_marker(vs, mode);
        let second = listed_marker(vs, mode);
        let mut seen = [first, second];
        seen.sort();
        assert_eq!(seen, ["alpha".to_string(), "beta".to_string()], "{mode:?}");
        // Every listing's data connection went through Fulcrum, not straight to a member.
        let status = f.get_json("/api/v1/status").await;
        let data = &status["virtual_services"][0]["ftp_data_connections"];
        assert_eq!(
            data.as_u64(),
            Some(2 * (n as u64 + 1)),
            "{mode:?}: {status}"
        );
    }
    // Passive answers name Fulcrum's range, not the member's.
    let url = format!("ftp://{vs}/");
    let (ok, text) = curl(&["-v", "--ftp-pasv", "--disable-epsv", "--list-only", &url]);
    assert!(ok, "{text}");
    let offered = text
        .lines()
        .find_map(|l| l.split("Entering Passive Mode (").nth(1))
        .and_then(|rest| {
            let n: Vec<u16> = rest
                .split([',', ')'])
                .take(6)
                .filter_map(|x| x.parse().ok())
                .collect();
            (n.len() == 6).then(|| (n[4] << 8) | n[5])
        })
        .unwrap_or_else(|| panic!("no 227 in {text}"));
    assert!(
        (low..=high).contains(&offered),
        "{offered} outside {low}-{high}"
    );

    // Upload then download, passive and active: the file lands on the member that served the
    // control connection (a session's data connections follow it).
    let tmp = tempfile::tempdir().expect("temp dir");
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let local = tmp.path().join("up.bin");
    std::fs::write(&local, &body).expect("upload source");
    for (i, mode) in [&["--ftp-pasv"][..], &["--ftp-port", "127.0.0.1"][..]]
        .iter()
        .enumerate()
    {
        let name = format!("f{i}.bin");
        let url = format!("ftp://{vs}/upload/{name}");
        let local_arg = local.display().to_string();
        let mut args = mode.to_vec();
        args.extend(["-T", local_arg.as_str(), url.as_str()]);
        let (ok, text) = curl(&args);
        assert!(ok, "upload {mode:?}: {text}");
        let on_a = a.upload_dir.join(&name);
        let on_b = b.upload_dir.join(&name);
        let landed = if on_a.exists() { &on_a } else { &on_b };
        assert!(on_a.exists() != on_b.exists(), "on exactly one member");
        assert_eq!(std::fs::read(landed).expect("uploaded file"), body);
        // Download it again through the member that has it (lftp this time): retried until the
        // round robin gives that member, at most four control connections.
        let back = tmp.path().join(format!("back{i}"));
        let mut got = false;
        for _ in 0..4 {
            let script = format!(
                "set net:max-retries 1; set net:timeout 5; set ftp:passive-mode {}; \
                 get -O {} upload/{name}; bye",
                if i == 0 { "on" } else { "off" },
                back.display()
            );
            let _ = std::fs::create_dir_all(&back);
            let out = Command::new("lftp")
                .args(["-u", "anonymous,", "-p", &vs.port().to_string()])
                .args(["-e", &script, &vs.ip().to_string()])
                .stdin(Stdio::null())
                .output()
                .expect("lftp runs");
            if std::fs::read(back.join(&name)).ok().as_deref() == Some(body.as_slice()) {
                got = true;
                break;
            }
            let _ = out;
        }
        assert!(got, "download of {name} {mode:?}");
    }

    let status = f.get_json("/api/v1/status").await;
    let svc = &status["virtual_services"][0];
    assert!(
        svc["connections_total"].as_u64().unwrap_or(0) >= 10,
        "{svc}"
    );
    assert!(svc["bytes_in"].as_u64().unwrap_or(0) >= 400_000, "{svc}");
    drop(f);
}

/// A PORT naming another host than the client is answered `500` by Fulcrum itself and never
/// reaches the member (FTP bounce); the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_to_a_foreign_address_is_refused() {
    let a = vsftpd([127, 0, 0, 23], "gamma", free_range(10)).await;
    let vs = free_addr();
    let (low, high) = free_range(10);
    let _f = start(&ftp_config(vs, &format!("{low}-{high}"), &[&a])).await;
    let stream = tokio::net::TcpStream::connect(vs).await.expect("connect");
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    assert!(reply(&mut rd).await.starts_with("220"));
    wr.write_all(b"USER anonymous\r\n").await.expect("send");
    assert!(reply(&mut rd).await.starts_with("230"));
    wr.write_all(b"PORT 127,0,0,99,200,1\r\n")
        .await
        .expect("send");
    let answer = reply(&mut rd).await;
    assert!(answer.starts_with("500"), "{answer}");
    wr.write_all(b"EPRT |1|127.0.0.98|5000|\r\n")
        .await
        .expect("send");
    let answer = reply(&mut rd).await;
    assert!(answer.starts_with("500"), "{answer}");
    // The client's own address is accepted (rewritten to Fulcrum's member side).
    wr.write_all(b"PORT 127,0,0,1,200,1\r\n")
        .await
        .expect("send");
    let answer = reply(&mut rd).await;
    assert!(answer.starts_with("200"), "{answer}");
}

#[test]
fn check_explains_ftp_keys() {
    let base = "[[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"127.0.0.1:21\"\n";
    let vs = |proto: &str, extra: &str| {
        format!(
            "[[virtual_service]]\nname = \"f\"\nlisten = [\"127.0.0.1:2121\"]\nprotocol = \"{proto}\"\npool = \"p\"\n{extra}\n{base}"
        )
    };
    let (ok, text) = check(&vs("ftp", "ftp_passive_ports = \"50000-50100\""));
    assert!(ok, "{text}");
    for (bad, expected) in [
        ("ftp_passive_ports = \"50100-50000\"", "is above"),
        ("ftp_passive_ports = \"0-10\"", "not a port"),
        ("ftp_passive_ports = 50000", "port range"),
    ] {
        let (ok, text) = check(&vs("ftp", bad));
        assert!(
            !ok && text.contains(expected) && text.contains("ftp_passive_ports"),
            "{bad}: {text}"
        );
    }
    let (ok, text) = check(&vs("tcp", "ftp_passive_ports = \"50000-50100\""));
    assert!(!ok && text.contains("applies to protocol ftp"), "{text}");
    let (ok, text) = check(&vs("ftp", "forwarding = \"nat\""));
    assert!(!ok && text.contains("forwarding"), "{text}");
    let (ok, text) = check(&vs(
        "ftp",
        "tls = { certificate = \"c.pem\", key = \"k.pem\" }",
    ));
    assert!(!ok && text.contains("this service is ftp"), "{text}");
}

async fn reply(rd: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> String {
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(5), rd.read_line(&mut line))
        .await
        .expect("reply in time")
        .expect("reply");
    line
}

/// A PORT that cannot be read is answered `501` by Fulcrum; a control line over 8 KiB closes
/// the session. Both are counted in `ftp_refused`, and the process keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_overlong_control_lines_are_refused_and_counted() {
    let a = vsftpd([127, 0, 0, 24], "delta", free_range(10)).await;
    let vs = free_addr();
    let (low, high) = free_range(10);
    let f = start(&ftp_config(vs, &format!("{low}-{high}"), &[&a])).await;
    let stream = tokio::net::TcpStream::connect(vs).await.expect("connect");
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    assert!(reply(&mut rd).await.starts_with("220"));
    wr.write_all(b"PORT 127,0,0,1,999,1\r\n")
        .await
        .expect("send");
    let answer = reply(&mut rd).await;
    assert!(answer.starts_with("501"), "{answer}");
    wr.write_all(&vec![b'A'; 9000]).await.expect("send");
    let mut rest = String::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), rd.read_line(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "{closed:?} {rest:?}"
    );
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["virtual_services"][0]["ftp_refused"], 2, "{status}");
    assert_eq!(listed_marker(vs, &["--ftp-pasv"]), "delta");
}

/// Explicit FTPS, not terminated: after `AUTH` the control channel is opaque, and the member,
/// announcing the service's address and the same range (vsftpd `pasv_address`,
/// `pasv_min_port` / `pasv_max_port`), is reached through the range Fulcrum forwards port for
/// port. Nothing listens on those ports of the service's address but Fulcrum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_ftps_is_passed_through_with_the_passive_range() {
    let range = free_range(10);
    let vs = free_addr();
    let certs = tempfile::tempdir().expect("temp dir");
    let (cert, key) =
        fulcrum_testkit::pki::self_signed(certs.path(), "ftps", "ftps", 2, Some("IP:127.0.0.1"));
    let tls = format!(
        "ssl_enable=YES\nallow_anon_ssl=YES\nforce_anon_logins_ssl=YES\nforce_anon_data_ssl=YES\n\
         require_ssl_reuse=NO\nrsa_cert_file={cert}\nrsa_private_key_file={key}\n"
    );
    let a = vsftpd_with([127, 0, 0, 25], "epsilon", range, Some(vs.ip()), &tls).await;
    let f = start(&ftp_config(vs, &format!("{}-{}", range.0, range.1), &[&a])).await;
    let url = format!("ftp://{vs}/");
    for mode in [&["--ftp-pasv"][..], &["--ftp-pasv", "--disable-epsv"][..]] {
        let mut args = vec!["--ssl-reqd", "-k", "--list-only"];
        args.extend(mode);
        args.push(&url);
        let (ok, text) = curl(&args);
        assert!(ok && text.contains("epsilon.txt"), "{mode:?}: {text}");
    }
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(
        status["virtual_services"][0]["ftp_data_connections"], 2,
        "{status}"
    );
}

/// Drained mid-session: the session on the drained member goes on — its next passive transfer
/// still reaches that member, through the service's range — while every new session goes to
/// the other member, and the drained member shows the session as its one open connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_member_keeps_its_session_while_new_ones_go_elsewhere() {
    let a = vsftpd([127, 0, 0, 25], "epsilon", free_range(10)).await;
    let b = vsftpd([127, 0, 0, 26], "zeta", free_range(10)).await;
    let vs = free_addr();
    let (low, high) = free_range(10);
    let f = start(&ftp_config(vs, &format!("{low}-{high}"), &[&a, &b])).await;
    let stream = tokio::net::TcpStream::connect(vs).await.expect("connect");
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let banner = reply(&mut rd).await;
    let (mine, marker, other) = if banner.contains("epsilon") {
        (&a, "epsilon", "zeta")
    } else {
        (&b, "zeta", "epsilon")
    };
    // The members take anonymous users without a password (`no_anon_password`).
    wr.write_all(b"USER anonymous\r\n").await.expect("send");
    let answer = reply(&mut rd).await;
    assert!(answer.starts_with("230"), "{answer}");

    let path = format!("/api/v1/pools/p/members/{}/state", mine.addr);
    let r = f
        .api("PUT", &path, Some(serde_json::json!({"state": "drain"})))
        .await
        .expect("admin API");
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..4 {
        assert_eq!(listed_marker(vs, &["--ftp-pasv"]), other, "a new session");
    }

    wr.write_all(b"PASV\r\n").await.expect("send");
    let pasv = reply(&mut rd).await;
    assert!(pasv.starts_with("227"), "{pasv}");
    let numbers: Vec<u16> = pasv
        .split(['(', ')'])
        .nth(1)
        .unwrap_or_else(|| panic!("no address in {pasv:?}"))
        .split(',')
        .map(|n| n.trim().parse().expect("a number"))
        .collect();
    assert_eq!(numbers.len(), 6, "{pasv}");
    let data_port = numbers[4] * 256 + numbers[5];
    assert!(
        (low..=high).contains(&data_port),
        "{pasv}: not in the service's range"
    );
    let data_addr = SocketAddr::new(vs.ip(), data_port);
    let mut data = tokio::net::TcpStream::connect(data_addr)
        .await
        .expect("data connection");
    wr.write_all(b"NLST\r\n").await.expect("send");
    let opening = reply(&mut rd).await;
    assert!(opening.starts_with("150"), "{opening}");
    let mut listing = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_string(&mut data, &mut listing),
    )
    .await
    .expect("listing in time")
    .expect("listing");
    assert!(
        listing.contains(&format!("{marker}.txt")),
        "the drained member's session listed {listing:?}"
    );
    let done = reply(&mut rd).await;
    assert!(done.starts_with("226"), "{done}");

    let pool = f.get_json("/api/v1/pools/p").await;
    let drained = pool["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["address"] == mine.addr.to_string()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(drained["state"], "drain", "{pool}");
    assert_eq!(drained["active_connections"], 1, "{pool}");
    wr.write_all(b"QUIT\r\n").await.expect("send");
    assert!(reply(&mut rd).await.starts_with("221"));
}
