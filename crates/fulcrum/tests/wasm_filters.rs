//! proxy-wasm filters through the binary (`[[virtual_service.filter]]`): header edits and local
//! replies over HTTP/1.1 and HTTP/2, response bodies rewritten as they stream, a filter that
//! traps, one that loops and one that allocates without bound each failing only its request
//! (counted on /metrics), shared data across instances, an HTTP call to an auth pool deciding a
//! request, `fulcrum check` on a module that is no filter, and a reload that swaps a module
//! under load without a failed request.
//!
//! The filters: `probe.wat` (text format; its header comment lists what each request header asks
//! of it) and `add_header.wasm`, built from C by Debian's clang (crates/fulcrum-wasm/filters).

mod http_common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_common::*;

fn filters_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fulcrum-wasm/filters")
}

fn probe() -> String {
    filters_dir().join("probe.wat").display().to_string()
}

fn add_header() -> String {
    filters_dir().join("add_header.wasm").display().to_string()
}

fn filter(module: &str, extra: &str) -> String {
    format!("[[virtual_service.filter]]\nmodule = \"{module}\"\n{extra}\n")
}

/// An http service `web` with the probe filter (and `extra` keys on it) in front of `n`
/// backends: the backends, the service's address and the running process.
async fn probe_service(n: usize, extra: &str) -> (Vec<HttpBackend>, SocketAddr, Fulcrum) {
    let b = backends(n).await;
    let vs = free_addr();
    let config = format!(
        "{}{}{}",
        service(vs, ""),
        filter(&probe(), extra),
        pool("p", &addrs(&b), "")
    );
    let f = start(&config).await;
    (b, vs, f)
}

/// Request fields as the echo member saw them (`name: value` lines).
fn seen(r: &HttpResponse) -> String {
    r.text()
}

async fn metrics(f: &Fulcrum) -> String {
    let r = f.api("GET", "/metrics", None).await.expect("/metrics");
    r.text()
}

/// The value of the sample of `family` whose labels contain every one of `labels`.
fn sample(text: &str, family: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(family) && !l.starts_with('#'))
        .filter(|l| l[family.len()..].starts_with('{'))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_edit_heads_and_answer_over_http1_and_http2() {
    let b = backends(1).await;
    let vs = free_addr();
    let config = format!(
        "{}{}{}{}",
        service(vs, ""),
        filter(&probe(), ""),
        filter(&add_header(), "config = \"from-c\""),
        pool("p", &addrs(&b), "")
    );
    let f = start(&config).await;

    let r = get_with(
        vs,
        "/echo",
        &[("x-drop", "1"), ("x-internal", "1"), ("x-keep", "2")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = seen(&r);
    assert!(echo.contains("x-filter: yes"), "the probe's field: {echo}");
    assert!(echo.contains("x-filter: from-c"), "the C filter's: {echo}");
    assert!(echo.contains("x-keep: 2"), "{echo}");
    assert!(!echo.contains("x-drop"), "removed by the probe: {echo}");
    assert!(
        !echo.contains("x-internal"),
        "removed by the C filter: {echo}"
    );
    assert_eq!(r.header("x-filter"), Some("yes"), "added to the response");
    assert_eq!(r.header("x-server"), None, "removed from the response");

    let r = get_with(vs, "/echo", &[("x-deny", "1")]).await;
    assert_eq!((r.status, r.text().as_str()), (403, "denied"));
    assert_eq!(b[0].requests(), 1, "a local reply never reaches the member");

    let url = format!("http://{vs}/echo");
    let (ok, out, err) = curl(&[
        "-i",
        "--http2-prior-knowledge",
        "-H",
        "x-drop: 1",
        "-H",
        "x-internal: 1",
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert_eq!(header(&out, "x-filter"), Some("yes"), "{out}");
    assert_eq!(header(&out, "x-server"), None, "{out}");
    assert!(out.contains("x-filter: from-c"), "{out}");
    assert!(
        !out.contains("x-drop") && !out.contains("x-internal"),
        "{out}"
    );
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", "-H", "x-deny: 1", &url]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("HTTP/2 403"), "{out}");
    assert!(out.ends_with("denied"), "{out}");

    let m = metrics(&f).await;
    let local = sample(
        &m,
        "fulcrum_filter_local_replies_total",
        &["vs=\"web\"", "probe.wat"],
    );
    assert_eq!(local, Some(2.0), "{m}");
    let requests = sample(
        &m,
        "fulcrum_filter_defined_counter_total",
        &["name=\"test_requests_ok\""],
    );
    assert!(
        requests.is_some_and(|n| n >= 4.0),
        "the filter's own metric: {m}"
    );
    let api = f.get_json("/api/v1/http/filters").await;
    let list = api["filters"].as_array().cloned().unwrap_or_default();
    assert_eq!(list.len(), 2, "{api}");
    assert!(list.iter().all(|x| x["service"] == "web"), "{api}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_is_rewritten_as_it_streams() {
    let (_b, vs, _f) = probe_service(1, "").await;
    let plain: String = (0..200).map(|i| format!("m0 chunk {i}\n")).collect();

    let r = get_with(vs, "/chunked/200", &[("x-upper", "1")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), plain.to_uppercase());
    let r = get_with(vs, "/chunked/200", &[("x-rewrite", "1")]).await;
    assert_eq!(r.text(), "rewritten");
    let r = get(vs, "/chunked/200").await;
    assert_eq!(r.text(), plain, "untouched without a request for it");
    // A member that sends a length: a filter that keeps the length keeps the member's
    // content-length (as in Envoy); one that removes it has its body go out chunked; one that
    // changes the length but leaves content-length has the response cut, never mis-framed.
    let r = get_with(vs, "/bytes/5000", &[("x-upper", "1")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("5000"));
    assert_eq!(r.body.len(), 5000);
    let r = get_with(vs, "/bytes/5000", &[("x-rewrite", "1")]).await;
    assert_eq!((r.status, r.text().as_str()), (200, "rewritten"));
    assert_eq!(r.header("content-length"), None);
    let url = format!("http://{vs}/bytes/5000");
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let (ok, out, _) = curl(&[
            version,
            "-H",
            "x-rewrite: 1",
            "-H",
            "x-keep-length: 1",
            &url,
        ])
        .await;
        assert!(
            !ok && out.len() < 5000,
            "{version}: cut short, not mis-framed: {out}"
        );
    }

    let url = format!("http://{vs}/slow/5/20");
    let (ok, out, err) = curl(&["--http2-prior-knowledge", "-H", "x-upper: 1", &url]).await;
    assert!(ok, "{err}");
    let want: String = (0..5).map(|i| format!("M0 CHUNK {i}\n")).collect();
    assert_eq!(out, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_a_loop_and_unbounded_memory_fail_only_their_request() {
    let b = backends(1).await;
    let (closed, open) = (free_addr(), free_addr());
    let limits = "time_budget = \"50ms\"\nmax_memory = \"4MiB\"\ndisable_after = 0";
    let config = format!(
        "{}{}[[virtual_service]]\nname = \"open\"\nlisten = [\"{open}\"]\nprotocol = \"http\"\npool = \"p\"\n{}{}",
        service(closed, ""),
        filter(&probe(), limits),
        filter(&probe(), &format!("{limits}\non_error = \"fail_open\"")),
        pool("p", &addrs(&b), "")
    );
    let f = start(&config).await;
    for bad in ["x-trap", "x-loop", "x-grow", "x-libcio"] {
        let r = get_with(closed, "/echo", &[(bad, "1")]).await;
        assert_eq!(r.status, 500, "{bad}: {}", r.text());
        // The next request, on a new connection, is served as usual.
        let r = get_with(closed, "/echo", &[]).await;
        assert_eq!(r.status, 200, "after {bad}");
        assert!(seen(&r).contains("x-filter: yes"));
        // fail_open: the request goes on as if the filter were absent.
        let r = get_with(open, "/echo", &[(bad, "1"), ("x-drop", "kept")]).await;
        assert_eq!(r.status, 200, "{bad} open: {}", r.text());
        assert!(seen(&r).contains("x-drop: kept"), "{}", r.text());
    }
    let m = metrics(&f).await;
    for (vs, kind, n) in [
        ("web", "trap", 2.0),
        ("web", "budget", 1.0),
        ("web", "memory", 1.0),
        ("open", "trap", 2.0),
        ("open", "budget", 1.0),
        ("open", "memory", 1.0),
    ] {
        let got = sample(
            &m,
            "fulcrum_filter_failures_total",
            &[&format!("vs=\"{vs}\""), &format!("kind=\"{kind}\"")],
        );
        assert_eq!(got, Some(n), "{vs} {kind}: {m}");
    }
    let disabled = sample(&m, "fulcrum_filter_disabled", &["vs=\"web\""]);
    assert_eq!(disabled, Some(0.0), "disable_after = 0 never disables: {m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_disable_a_filter_until_the_next_reload() {
    let (_b, vs, f) = probe_service(1, "disable_after = 3\non_error = \"fail_open\"").await;
    for _ in 0..3 {
        let r = get_with(vs, "/echo", &[("x-trap", "1")]).await;
        assert_eq!(r.status, 200);
    }
    let r = get(vs, "/echo").await;
    assert!(!seen(&r).contains("x-filter"), "disabled: {}", r.text());
    let m = metrics(&f).await;
    assert_eq!(
        sample(&m, "fulcrum_filter_disabled", &["vs=\"web\""]),
        Some(1.0),
        "{m}"
    );
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(vs, "/echo").await;
    assert!(
        seen(&r).contains("x-filter: yes"),
        "enabled again: {}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_data_crosses_instances_and_an_http_call_decides() {
    let b = backends(1).await;
    let auth = backends(1).await;
    let vs = free_addr();
    let config = format!(
        "{}{}{}{}",
        service(vs, ""),
        filter(&probe(), ""),
        pool("p", &addrs(&b), ""),
        pool("auth", &addrs(&auth), "")
    );
    let _f = start(&config).await;
    let r = get_with(vs, "/echo", &[("x-set", "1")]).await;
    assert_eq!(r.status, 200);
    // Instances are taken in turn: four requests meet every one of them.
    for _ in 0..4 {
        let r = get_with(vs, "/echo", &[("x-get", "1")]).await;
        assert!(seen(&r).contains("x-shared: v1"), "{}", r.text());
    }

    let r = get_with(vs, "/echo", &[("x-auth", "1")]).await;
    assert_eq!(r.status, 200, "the auth pool said yes: {}", r.text());
    assert_eq!(auth[0].requests(), 1);
    auth[0].set_status(403);
    let r = get_with(vs, "/echo", &[("x-auth", "1")]).await;
    assert_eq!(r.status, 401, "the auth pool said no");
    assert_eq!(auth[0].requests(), 2);
    let before = b[0].requests();
    let r = get_with(vs, "/echo", &[("x-auth", "1")]).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        b[0].requests(),
        before,
        "a refused request never reaches the member"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_a_module_that_is_not_a_filter() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let module = dir.join("empty.wat");
    std::fs::write(&module, "(module (memory (export \"memory\") 1))").unwrap();
    let conf = dir.join("fulcrum.toml");
    let text = format!(
        "{}{}{}",
        service(free_addr(), ""),
        filter("empty.wat", ""),
        pool("p", &[free_addr()], "")
    );
    std::fs::write(&conf, text).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("fulcrum.toml:"), "names the file: {err}");
    assert!(err.contains("filter[0].module"), "names the key: {err}");
    assert!(err.contains("not a proxy-wasm filter"), "says why: {err}");
    std::fs::write(
        &module,
        std::fs::read(filters_dir().join("probe.wat")).unwrap(),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Clients keep requesting over keep-alive connections while the module file changes and the
/// configuration is reloaded: every request is answered 200, by the old module before and the
/// new one after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_a_changed_module_under_load_without_a_failed_request() {
    let b = backends(1).await;
    let vs = free_addr();
    let tmp = tempfile::tempdir().unwrap();
    let module = tmp.path().join("filter.wasm");
    std::fs::copy(filters_dir().join("add_header.wasm"), &module).unwrap();
    let config = format!(
        "{}{}{}",
        service(vs, ""),
        filter(&module.display().to_string(), "config = \"old\""),
        pool("p", &addrs(&b), "")
    );
    let f = start(&config).await;

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (old, new, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (done, old, new, failed) = (done.clone(), old.clone(), new.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = KeepAlive::connect(vs).await;
            // Bounded: at most 2000 requests per client, and the test stops them.
            for _ in 0..2000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                match conn.get("/echo").await {
                    Some((200, body)) if body.contains("x-filter: old") => {
                        old.fetch_add(1, Ordering::Relaxed);
                    }
                    Some((200, body)) if body.contains("x-filter: yes") => {
                        new.fetch_add(1, Ordering::Relaxed);
                    }
                    Some((200, _)) => {}
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        conn = KeepAlive::connect(vs).await;
                    }
                }
            }
        }));
    }
    let count = |c: &Arc<AtomicU64>| {
        let c = c.clone();
        move || {
            let c = c.clone();
            async move { c.load(Ordering::Relaxed) > 50 }
        }
    };
    assert!(wait_until(Duration::from_secs(10), count(&old)).await);
    // The new module: the probe, in the text format, at the same path.
    std::fs::copy(filters_dir().join("probe.wat"), &module).unwrap();
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let switched = wait_until(Duration::from_secs(10), count(&new)).await;
    assert!(
        switched,
        "old {} new {} failed {}: {}",
        old.load(Ordering::Relaxed),
        new.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        f.logs()
    );
    done.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed");
    assert!(old.load(Ordering::Relaxed) > 50 && new.load(Ordering::Relaxed) > 50);
}

/// One HTTP/1.1 keep-alive connection (hyper's client), requests one at a time.
struct KeepAlive {
    send: hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    vs: SocketAddr,
}

impl KeepAlive {
    async fn connect(vs: SocketAddr) -> KeepAlive {
        let tcp = tokio::net::TcpStream::connect(vs).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        KeepAlive { send, vs }
    }

    async fn get(&mut self, path: &str) -> Option<(u16, String)> {
        use http_body_util::BodyExt;
        let req = http::Request::get(path)
            .header("host", self.vs.to_string())
            .body(http_body_util::Empty::new())
            .ok()?;
        let work = async {
            let r = self.send.send_request(req).await.ok()?;
            let status = r.status().as_u16();
            let body = r.into_body().collect().await.ok()?.to_bytes();
            Some((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::time::timeout(Duration::from_secs(5), work)
            .await
            .ok()?
    }
}

/// A filter built with a public proxy-wasm SDK (AssemblyScript, @solo-io/proxy-runtime), as it
/// would be written for Envoy: it registers its root context under a root id, reads its
/// configuration, adds a request field and a response field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_built_with_a_public_sdk_runs_unchanged() {
    let b = backends(1).await;
    let vs = free_addr();
    let module = filters_dir().join("sdk_add_header.wasm");
    let config = format!(
        "{}{}{}",
        service(vs, ""),
        filter(
            &module.display().to_string(),
            "root_id = \"add_header\"\nconfig = \"from-sdk\""
        ),
        pool("p", &addrs(&b), "")
    );
    let _f = start(&config).await;
    for _ in 0..3 {
        let r = get(vs, "/echo").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(seen(&r).contains("x-sdk: from-sdk"), "{}", r.text());
        assert_eq!(r.header("hello"), Some("world!"));
    }
    let url = format!("http://{vs}/chunked/20");
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", &url]).await;
    assert!(ok, "{err}");
    assert_eq!(header(&out, "hello"), Some("world!"), "{out}");
    assert!(
        out.contains("m0 chunk 19"),
        "the body passes the SDK's body callbacks: {out}"
    );
}

/// Fulcrum's member-choice hook: a filter names the member (`fulcrum.member`); one that is not
/// in the pool leaves the choice to the scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_chooses_the_member_or_leaves_it_to_the_scheduler() {
    let (b, vs, _f) = probe_service(2, "").await;
    let chosen = b[1].addr.to_string();
    for _ in 0..6 {
        let r = get_with(vs, "/", &[("x-member", &chosen)]).await;
        assert_eq!(who(&r), "m1");
    }
    let url = format!("http://{vs}/");
    for _ in 0..4 {
        let (ok, out, err) = curl(&[
            "--http2-prior-knowledge",
            "-H",
            &format!("x-member: {chosen}"),
            &url,
        ])
        .await;
        assert!(ok, "{err}");
        assert!(out.starts_with("m1"), "{out}");
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..6 {
        let r = get_with(vs, "/", &[("x-member", "127.0.0.1:1")]).await;
        assert_eq!(r.status, 200);
        seen.insert(who(&r));
    }
    assert_eq!(seen.len(), 2, "not in the pool: the scheduler spreads them");
}

/// Ticks (`proxy_set_tick_period_milliseconds`): the probe asks for one every 20 ms and counts
/// them in a metric of its own; they stop with the service that loaded it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_asks_for_ticks_gets_them() {
    let (b, vs, f) = probe_service(1, "").await;
    let ticks = || async {
        sample(
            &metrics(&f).await,
            "fulcrum_filter_defined_counter_total",
            &["name=\"test_ticks\""],
        )
        .unwrap_or(0.0)
    };
    let ticked = wait_until(Duration::from_secs(10), || async { ticks().await >= 10.0 }).await;
    assert!(ticked, "ticks: {}", ticks().await);
    // Without the filter in the configuration, the ticks stop.
    f.write_config(&format!("{}{}", service(vs, ""), pool("p", &addrs(&b), "")));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = ticks().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ticks().await, before, "no filter, no ticks");
}

/// Request bodies through a filter that reads them (`proxy_on_request_body`): read whole and
/// decoded, edited (the member gets the new length, chunked or not as the client sent it) or
/// refused by the filter before any member sees the request, and answered 413 past the filter's
/// `max_request_body`; over HTTP/1.1 (pipelined, Expect: 100-continue) and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_is_read_whole_and_edited_or_refused_by_a_filter() {
    let (b, vs, _f) = probe_service(1, "max_request_body = \"1KiB\"").await;

    // A Content-Length body, a chunked one, then a GET: pipelined in one write. (The probe
    // reads response bodies, so the answers come chunked.)
    let pipelined = "POST /echo HTTP/1.1\r\nHost: a\r\nx-req-upper: 1\r\nContent-Length: 11\r\n\r\nhello world\
        POST /echo HTTP/1.1\r\nHost: a\r\nx-req-upper: 1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n chunk\r\n0\r\n\r\n\
        GET /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let (out, _) = raw(vs, pipelined.as_bytes(), Duration::from_secs(10)).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(out.matches("HTTP/1.1 200").count(), 3, "{out}");
    let answers: Vec<&str> = out.split("HTTP/1.1 200").skip(1).collect();
    assert!(answers[0].contains("HELLO WORLD!"), "{out}");
    assert!(answers[0].contains("content-length: 12"), "{out}");
    assert!(answers[1].contains("HELLO CHUNK!"), "{out}");
    assert!(
        answers[1].contains("content-length: 12")
            && !answers[1].contains("transfer-encoding: chunked\n"),
        "the decoded body goes on with its length: {out}"
    );
    assert!(answers[2].contains("GET /echo"), "{out}");

    // Refused on its content: the member never sees it, the connection goes on.
    let before = b[0].requests();
    let (out, _) = raw(
        vs,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\ndeny this\
          GET /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    )
    .await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("\r\n\r\nbody refused"), "{out}");
    assert!(
        out.contains("HTTP/1.1 200"),
        "the next request is served: {out}"
    );
    assert_eq!(
        b[0].requests(),
        before + 1,
        "only the GET reached the member"
    );

    let url = format!("http://{vs}/echo");
    // A client that waits for 100 Continue before it sends the body the filter needs.
    let (ok, out, err) = curl(&[
        "-i",
        "-H",
        "Expect: 100-continue",
        "-H",
        "x-req-upper: 1",
        "--data-binary",
        "waited",
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("HTTP/1.1 100 Continue"), "{out}");
    assert!(out.contains("WAITED!"), "{out}");

    let big = "b".repeat(2048);
    let (ok, out, err) = curl(&["-i", "--data-binary", &big, &url]).await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("HTTP/1.1 413"),
        "past max_request_body: {out}"
    );
    let (ok, out, err) = curl(&[
        "-i",
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &big,
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(out.starts_with("HTTP/1.1 413"), "chunked, past it: {out}");

    // Chunk framing counts against the limit too: a few bytes of body in 200 chunks, each with
    // a long extension, is refused rather than buffered.
    let ext = "x".repeat(400);
    let mut chunked = String::from(
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    for _ in 0..200 {
        chunked.push_str(&format!("1;{ext}\r\nb\r\n"));
    }
    chunked.push_str("0\r\n\r\n");
    let (out, _) = raw(vs, chunked.as_bytes(), Duration::from_secs(10)).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert!(
        out.starts_with("HTTP/1.1 413"),
        "framing past the allowance: {out}"
    );

    // HTTP/2.
    let h2 = |body: &'static str, upper: bool| {
        let url = url.clone();
        async move {
            let mut args = vec!["-i", "--http2-prior-knowledge", "--data-binary", body];
            if upper {
                args.extend(["-H", "x-req-upper: 1"]);
            }
            args.push(&url);
            curl(&args).await
        }
    };
    let (ok, out, err) = h2("over http2", true).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(out.contains("OVER HTTP2!"), "{out}");
    assert!(out.contains("content-length: 11"), "{out}");
    let (ok, out, err) = h2("deny over http2", false).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("HTTP/2 403"), "{out}");
    assert!(out.ends_with("body refused"), "{out}");
    let (ok, out, err) = curl(&[
        "-iS",
        "--http2-prior-knowledge",
        "--data-binary",
        &big,
        &url,
    ])
    .await;
    assert!(out.starts_with("HTTP/2 413"), "{ok} {out} {err}");
}

/// The TLS server name the client asked for reaches filters as
/// `connection.requested_server_name`, over HTTP/1.1 and HTTP/2 (ALPN h2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_reads_the_tls_server_name() {
    let b = backends(1).await;
    let vs = free_addr();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (crt, key) =
        fulcrum_testkit::pki::self_signed(dir.path(), "a", "www.a.test", 1, Some("DNS:www.a.test"));
    let config = format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = [\"{vs}\"]\nprotocol = \"https\"\npool = \"p\"\n\
         tls = [{{ cert = \"{crt}\", key = \"{key}\" }}]\n{}{}",
        filter(&probe(), ""),
        pool("p", &addrs(&b), "")
    );
    let _f = start(&config).await;
    let resolve = format!("www.a.test:{}:127.0.0.1", vs.port());
    let url = format!("https://www.a.test:{}/echo", vs.port());
    for version in ["--http1.1", "--http2"] {
        let (ok, out, err) =
            curl(&["-k", version, "--resolve", &resolve, "-H", "x-sni: 1", &url]).await;
        assert!(ok, "{version}: {err}");
        assert!(out.contains("x-sni-seen: www.a.test"), "{version}: {out}");
    }
}

/// Shared queues: an item a request adds reaches the instances that registered the queue
/// (`proxy_on_queue_ready` on their root context), which take it off the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_item_is_announced_to_the_instances_that_registered_the_queue() {
    let (_b, vs, _f) = probe_service(1, "").await;
    let r = get_with(vs, "/echo", &[("x-enqueue", "queued-item")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut last = String::new();
    for _ in 0..100 {
        let r = get_with(vs, "/echo", &[("x-get-q", "1")]).await;
        last = seen(&r);
        if last.contains("x-shared: queued-item") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the queue's item never reached its registrant: {last}");
}

/// `proxy_http_call` to a pool with `tls` goes in TLS (the member here is `openssl s_server`,
/// which answers 200 to any GET and speaks nothing but TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_call_to_a_pool_with_tls_goes_in_tls() {
    let b = backends(1).await;
    let vs = free_addr();
    let auth = free_addr();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (crt, key) = fulcrum_testkit::pki::self_signed(dir.path(), "auth", "auth", 1, None);
    let mut server = tokio::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept", &auth.to_string()])
        .arg("-cert")
        .arg(&crt)
        .arg("-key")
        .arg(&key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl s_server");
    let mut up = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(auth).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(up, "openssl s_server listens on {auth}");
    let config = format!(
        "{}{}{}{}",
        service(vs, ""),
        filter(&probe(), ""),
        pool("p", &addrs(&b), ""),
        pool("auth", &[auth], "tls = { verify = false }")
    );
    let _f = start(&config).await;
    let r = get_with(vs, "/echo", &[("x-auth", "1")]).await;
    assert_eq!(r.status, 200, "the TLS auth member said yes: {}", r.text());
    server.kill().await.expect("stop s_server");
    let r = get_with(vs, "/echo", &[("x-auth", "1")]).await;
    assert_eq!(
        r.status, 401,
        "no auth member: the call fails, the filter refuses"
    );
}

/// Response trailers (an HTTP/2 member's, as gRPC sends its status) go through
/// `proxy_on_response_trailers`: the probe adds `x-filter` and removes `x-server` there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_trailers_go_through_the_filters() {
    use http_body_util::BodyExt;
    let member = free_addr();
    let listener = tokio::net::TcpListener::bind(member).await.expect("bind");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let (mut tx, body) = http_body_util::channel::Channel::<
                        bytes::Bytes,
                        std::convert::Infallible,
                    >::new(2);
                    tokio::spawn(async move {
                        let _ = tx.send_data(bytes::Bytes::from_static(b"payload")).await;
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", http::HeaderValue::from_static("0"));
                        t.insert("x-server", http::HeaderValue::from_static("m0"));
                        let _ = tx.send_trailers(t).await;
                    });
                    Ok::<_, std::convert::Infallible>(http::Response::new(body))
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
            });
        }
    });
    let vs = free_addr();
    let config = format!(
        "{}{}{}",
        service(vs, ""),
        filter(&probe(), ""),
        pool("p", &[member], "http2 = true")
    );
    let _f = start(&config).await;
    let tcp = tokio::net::TcpStream::connect(vs).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("an HTTP/2 connection");
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(format!("http://{vs}/rpc"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("a request");
    let resp = send.send_request(req).await.expect("an answer");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("the body");
    let trailers = body.trailers().cloned().expect("trailers");
    assert_eq!(body.to_bytes().as_ref(), b"payload");
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
    assert_eq!(
        trailers.get("x-filter").map(|v| v.as_bytes()),
        Some(&b"yes"[..])
    );
    assert!(trailers.get("x-server").is_none(), "{trailers:?}");
}

/// Filters are the service's outermost layer: answers from the HTTP cache (hits, and the
/// member's answer being stored) go through their response callbacks too, while the cache keeps
/// the member's own response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_answers_go_through_the_response_filters() {
    use fulcrum_testkit::{Origin, Reply};
    let origin = Origin::start(free_addr(), |_, n| {
        Reply::ok(
            &format!("v{n}"),
            &[("cache-control", "max-age=60"), ("x-server", "o")],
        )
    })
    .await
    .expect("the origin starts");
    let vs = free_addr();
    let config = format!(
        "{}{}{}",
        service(vs, "cache = { size = \"16MiB\", max_object = \"1MiB\" }"),
        filter(&probe(), ""),
        pool("p", &[origin.addr], "")
    );
    let _f = start(&config).await;
    let miss = get_with(vs, "/a", &[("x-upper", "1")]).await;
    let hit = get_with(vs, "/a", &[("x-upper", "1")]).await;
    for (r, what) in [(&miss, "the stored miss"), (&hit, "the hit")] {
        assert_eq!(r.status, 200, "{what}");
        assert_eq!(r.text(), "V0", "{what}: the body filter ran");
        assert_eq!(r.header("x-filter"), Some("yes"), "{what}");
        assert_eq!(r.header("x-server"), None, "{what}");
        assert_eq!(r.header("content-length"), Some("2"), "{what}");
    }
    assert!(miss.header("cache-status").unwrap_or("").contains("stored"));
    assert_eq!(hit.header("cache-status"), Some("fulcrum; hit"));
    let plain = get(vs, "/a").await;
    assert_eq!(plain.text(), "v0", "the cache holds the member's body");
    assert_eq!(origin.count(), 1);
    let url = format!("http://{vs}/a");
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", "-H", "x-upper: 1", &url]).await;
    assert!(ok, "{err}");
    assert!(out.contains("cache-status: fulcrum; hit"), "{out}");
    assert_eq!(header(&out, "x-filter"), Some("yes"), "{out}");
    assert!(out.ends_with("V0"), "{out}");
    // HEAD from the cache: the fields through the filters, no body to filter.
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let (ok, out, err) = curl(&["-I", version, "-H", "x-upper: 1", &url]).await;
        assert!(ok, "{version}: {err}");
        assert!(out.contains(" 200"), "{version}: {out}");
        assert_eq!(header(&out, "x-filter"), Some("yes"), "{version}: {out}");
        assert_eq!(
            header(&out, "content-length"),
            Some("2"),
            "{version}: {out}"
        );
    }
}

/// `request.path` read by a filter in the response phase: the path as it went to the member,
/// over HTTP/1.1 and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_reads_the_request_path_on_the_response() {
    let b = backends(1).await;
    let vs = free_addr();
    let module = filters_dir().join("path_on_response.wat");
    let config = format!(
        "{}{}{}",
        service(vs, ""),
        filter(&module.display().to_string(), ""),
        pool("p", &addrs(&b), "")
    );
    let _f = start(&config).await;
    let r = get_with(vs, "/echo/a?b=1", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-path"), Some("/echo/a?b=1"));
    let url = format!("http://{vs}/echo/h2");
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", &url]).await;
    assert!(ok, "{err}");
    assert_eq!(header(&out, "x-path"), Some("/echo/h2"), "{out}");
}
