//! The operator console: the web dashboard in headless Chromium (Debian's), the history and
//! audit endpoints behind it, through the real binary.

mod common;

use std::time::Duration;

use common::*;
use fulcrum_testkit::browser::Browser;
use fulcrum_testkit::HttpBackend;

const TOKEN: &str = "console-test-token-0123456789";

async fn http_pool(n: usize) -> (Vec<HttpBackend>, std::net::SocketAddr, Fulcrum) {
    http_pool_with(n, "").await
}

async fn http_pool_with(
    n: usize,
    extra: &str,
) -> (Vec<HttpBackend>, std::net::SocketAddr, Fulcrum) {
    let mut backends = Vec::new();
    for i in 0..n {
        backends.push(
            HttpBackend::start(free_addr(), &format!("web-{}", i + 1))
                .await
                .unwrap(),
        );
    }
    let vs = free_addr();
    let members: String = backends
        .iter()
        .map(|b| format!("[[pool.member]]\naddress = \"{}\"\nweight = 10\n", b.addr))
        .collect();
    let config = format!(
        r#"[[virtual_service]]
name = "shop"
listen = ["{vs}"]
protocol = "http"
pool = "web"

[[pool]]
name = "web"
algorithm = "least_connections"
monitors = ["web-http"]
{members}
[[monitor]]
name = "web-http"
type = "http"
path = "/health"
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 1

{extra}
"#
    );
    let f = Fulcrum::start_with_token(BIN, free_addr(), Some(TOKEN), &config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (backends, vs, f)
}

/// Some requests through the service so the rates and charts have something to show.
async fn traffic(vs: std::net::SocketAddr, n: usize) {
    for _ in 0..n {
        let _ = fulcrum_testkit::http_get(vs, "/").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_live_members_and_drains_one_with_confirmation() {
    // An https service whose certificate expires in 20 days, and an alert rule: the page shows
    // both.
    let pki = tempfile::tempdir().unwrap();
    let (cert, key) =
        fulcrum_testkit::pki::self_signed(pki.path(), "site", "shop.example.test", 20, None);
    let syslog = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let extra = format!(
        r#"[[virtual_service]]
name = "shop-tls"
listen = ["{}"]
protocol = "https"
pool = "web"
tls = [{{ cert = "{cert}", key = "{key}" }}]

[[alert]]
name = "oncall"
on = ["member_down", "cert_expiry"]
syslog = "{}"
hold = "0s"
"#,
        free_addr(),
        syslog.local_addr().unwrap()
    );
    let (backends, vs, f) = http_pool_with(3, &extra).await;
    let addrs: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    // Members are up (the monitor passed) before the page looks.
    for a in &addrs {
        let ok = wait_until(Duration::from_secs(10), || async {
            f.member("web", a).await["health"] == "up"
        })
        .await;
        assert!(ok, "member {a} never came up:\n{}", f.logs());
    }
    traffic(vs, 60).await;
    let url = format!("http://{}/ui/#token={TOKEN}", f.admin);
    let traffic_task = tokio::spawn(async move {
        for _ in 0..40 {
            traffic(vs, 10).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let addrs2 = addrs.clone();
    let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-dashboard.png");
    let shot2 = shot.clone();
    let (mut b, addrs2, shot2, page) = tokio::task::spawn_blocking(move || {
        let mut b = Browser::launch(1440, 1000).expect("chromium starts");
        b.navigate(&url).unwrap();
        b.wait_for("document.body && document.body.dataset.loaded === '1'", Duration::from_secs(15))
            .expect("the dashboard loads its data");
        // The token left the address bar for sessionStorage; no cookie carries it.
        let page = b
            .eval(
                "({hash: location.hash, stored: sessionStorage.getItem('fulcrum.token'), cookie: document.cookie})",
            )
            .unwrap();
        // Every live member is on the page, up, with its last check's result.
        for a in &addrs2 {
            let sel = serde_json::to_string(&format!("tr[data-key=\"m:web/{a}\"]")).unwrap();
            let health = b
                .wait_for(
                    &format!("(() => {{ const r = document.querySelector({sel}); return r && r.cells[1].textContent === 'up' && r.cells[2].textContent; }})()"),
                    Duration::from_secs(10),
                )
                .unwrap_or_else(|e| panic!("member {a} not shown up: {e}"));
            assert!(
                health.as_str().unwrap_or("").contains("HTTP 200"),
                "last check of {a}: {health}"
            );
        }
        // Rates from the server-side history show up (traffic is flowing).
        b.wait_for(
            "parseFloat(document.getElementById('t-rps').textContent) > 0",
            Duration::from_secs(10),
        )
        .expect("a request rate is shown");
        // Responses by status class on the service's row: 2xx counted.
        let classes = b
            .wait_for(
                "(() => { const r = document.querySelector('tr[data-key=\"svc:shop\"]'); const t = r && r.cells[11].textContent; return t && /^\\d+ \\/ [1-9]/.test(t) && t; })()",
                Duration::from_secs(10),
            )
            .expect("the 1xx/2xx/3xx/4xx/5xx cell counts the responses");
        assert_eq!(classes.as_str().unwrap_or("").split(" / ").count(), 5, "{classes}");
        // Links and HA are not configured here: their panels stay hidden.
        let hidden = b
            .eval("['links-panel', 'ha-panel'].every((id) => document.getElementById(id).classList.contains('hidden'))")
            .unwrap();
        assert_eq!(hidden, true, "link / HA panels shown without links or [ha]");
        // Drain the first member: a click opens the confirmation, a click on Confirm acts.
        let target = &addrs2[0];
        let row = format!("tr[data-key=\"m:web/{target}\"]");
        b.click(&format!("{row} button[data-action=drain]")).unwrap();
        let dialog = b
            .wait_for(
                "document.getElementById('confirm').open && document.getElementById('confirm-title').textContent",
                Duration::from_secs(5),
            )
            .unwrap();
        assert!(
            dialog.as_str().unwrap().contains(target.as_str()),
            "{dialog}"
        );
        b.click("#confirm-ok").unwrap();
        let sel = serde_json::to_string(&row).unwrap();
        b.wait_for(
            &format!("document.querySelector({sel}).cells[3].textContent === 'drain'"),
            Duration::from_secs(10),
        )
        .expect("the member shows drain");
        // The audit log on the page names the call and where it came from.
        b.wait_for(
            "[...document.querySelectorAll('#audit tbody tr')].some(r => r.textContent.includes('PUT /api/v1/pools/web/members/') && r.textContent.includes('drain') && r.textContent.includes('127.0.0.1'))",
            Duration::from_secs(10),
        )
        .expect("the audit log shows the drain");
        // The alert panel lists the certificate that expires within 30 days and, once the third
        // member fails its check, that member.
        if let Err(e) = b.wait_for(
            "document.querySelector('#alerts tbody').textContent.includes('FulcrumCertificateExpiry')",
            Duration::from_secs(10),
        ) {
            let shown = b.eval("document.getElementById('alerts-panel').textContent").unwrap_or_default();
            panic!("the certificate alert does not show: {e}\n{shown}\n{:#?}", b.errors());
        }
        b.wait_for(
            "document.querySelector('#certs tbody').textContent.includes('shop-tls')",
            Duration::from_secs(10),
        )
        .expect("the certificate shows");
        (b, addrs2, shot2, page)
    })
    .await
    .unwrap();
    backends[2].set_healthy(false);
    let errors = tokio::task::spawn_blocking(move || {
        let down = serde_json::to_string(&addrs2[2]).unwrap();
        b.wait_for(
            &format!("document.querySelector('#alerts tbody').textContent.includes({down})"),
            Duration::from_secs(10),
        )
        .expect("the member-down alert shows");
        std::thread::sleep(Duration::from_millis(1500)); // one more refresh for the charts
        b.screenshot(&shot2).unwrap();
        b.errors()
    })
    .await
    .unwrap();
    traffic_task.abort();
    println!("dashboard screenshot: {}", shot.display());
    assert_eq!(page["hash"], "", "the token stays in the URL: {page}");
    assert_eq!(page["stored"], TOKEN);
    assert_eq!(page["cookie"], "");
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    // /api/v1/status carries the same counters per service.
    let status = f.get_json("/api/v1/status").await;
    let shop = status["virtual_services"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["name"] == "shop"))
        .cloned()
        .unwrap_or_default();
    assert!(
        shop["responses"]["2xx"].as_u64().unwrap_or(0) >= 60
            && shop["responses"]["5xx"].is_u64()
            && shop["responses"]["1xx"].is_u64(),
        "{shop}"
    );
    // The API agrees: the click changed the member's state.
    let m = f.member("web", &addrs[0]).await;
    assert_eq!(m["state"], "drain", "{m}");
    assert_eq!(f.member("web", &addrs[1]).await["state"], "enabled");
    let audit = f.get_json("/api/v1/audit").await;
    let e = &audit["entries"][0];
    assert_eq!(e["method"], "PUT");
    assert_eq!(
        e["path"],
        format!("/api/v1/pools/web/members/{}/state", addrs[0])
    );
    assert_eq!(e["body"], r#"{"state":"drain"}"#);
    assert_eq!(e["status"], 200);
    assert!(e["from"].as_str().unwrap().starts_with("127.0.0.1:"), "{e}");
    assert!(
        f.logs().contains("admin API call"),
        "the audit is also logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_without_token_asks_for_one_and_shows_no_data() {
    let (_backends, _vs, f) = http_pool(1).await;
    let url = format!("http://{}/ui/", f.admin);
    let (asked, loaded, errors) = tokio::task::spawn_blocking(move || {
        let mut b = Browser::launch(1200, 800).expect("chromium starts");
        b.navigate(&url).unwrap();
        let asked = b
            .wait_for(
                "document.getElementById('token-dialog').open && document.getElementById('banner').textContent",
                Duration::from_secs(10),
            )
            .unwrap();
        let loaded = b.eval("document.body.dataset.loaded || ''").unwrap();
        // The failed 401 fetches are logged by Chromium as failed loads; nothing else may be.
        let errors: Vec<String> = b
            .errors()
            .into_iter()
            .filter(|e| !e.contains("401"))
            .collect();
        (asked, loaded, errors)
    })
    .await
    .unwrap();
    assert!(asked.as_str().unwrap().contains("token"), "{asked}");
    assert_eq!(loaded, "");
    assert!(errors.is_empty(), "{errors:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_assets_are_embedded_with_a_strict_policy_and_history_fills() {
    let (_backends, vs, f) = http_pool(2).await;
    for path in ["/ui/", "/ui/app.js", "/ui/style.css", "/ui/favicon.svg"] {
        let r = fulcrum_testkit::http_get(f.admin, path).await.unwrap();
        assert_eq!(r.status, 200, "{path}");
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
            "{path}: {csp}"
        );
    }
    let r = fulcrum_testkit::http_get(f.admin, "/ui").await.unwrap();
    assert_eq!(r.status, 308);
    // The history needs the token like the rest of the API.
    let r = fulcrum_testkit::http_get(f.admin, "/api/v1/history")
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    traffic(vs, 50).await;
    let ok = wait_until(Duration::from_secs(10), || async {
        let h = f.get_json("/api/v1/history").await;
        h["samples"].as_array().is_some_and(|s| {
            s.iter()
                .any(|x| x["services"][0]["requests_per_s"].as_f64().unwrap_or(0.0) > 0.0)
        })
    })
    .await;
    assert!(
        ok,
        "no sample with a request rate: {}",
        f.get_json("/api/v1/history").await
    );
    let h = f.get_json("/api/v1/history").await;
    let samples = h["samples"].as_array().unwrap();
    let last = samples.last().unwrap();
    assert_eq!(last["members"].as_array().unwrap().len(), 2);
    assert_eq!(last["services"][0]["name"], "shop");
    // `since` returns only newer samples.
    let t = last["t"].as_f64().unwrap();
    let newer = f.get_json(&format!("/api/v1/history?since={t}")).await;
    assert!(newer["samples"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["t"].as_f64().unwrap() > t));
    // A refused change is audited too.
    let r = fulcrum_testkit::http_request(
        f.admin,
        "PUT",
        "/api/v1/pools/web/members/127.0.0.1:1/state",
        &[("Content-Type", "application/json")],
        br#"{"state":"drain"}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);
    let audit = f.get_json("/api/v1/audit").await;
    assert_eq!(audit["entries"][0]["status"], 401, "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_gslb_sites_and_shares_per_region() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("example.com.zone"),
        "$TTL 300\n@ IN SOA ns1 hostmaster ( 1 3600 600 86400 60 )\n  IN NS ns1\nns1 IN A 192.0.2.1\n",
    )
    .unwrap();
    let config = format!(
        r#"[dns]
listen = ["{}"]

[[dns.zone]]
origin = "example.com."
file = "{}"

[[ip_table]]
name = "tel"
cidrs = ["198.51.100.0/24"]

[[ip_table]]
name = "uni"
cidrs = ["203.0.113.0/24"]

[[gslb.site]]
name = "east"
addresses = ["192.0.2.10"]
regions = ["tel"]

[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
regions = ["uni"]

[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "topology"
"#,
        free_addr(),
        dir.path().join("example.com.zone").display()
    );
    let f = Fulcrum::start_with_token(BIN, free_addr(), Some(TOKEN), &config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://{}/ui/#token={TOKEN}", f.admin);
    let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-gslb.png");
    let (sites, shares, errors) = tokio::task::spawn_blocking({
        let shot = shot.clone();
        move || {
            let mut b = Browser::launch(1440, 900).expect("chromium starts");
            b.navigate(&url).unwrap();
            let sites = b
                .wait_for(
                    "(() => { const p = document.getElementById('gslb-panel'); return !p.classList.contains('hidden') && document.querySelector('#gslb tbody').textContent; })()",
                    Duration::from_secs(15),
                )
                .expect("the GSLB panel shows");
            let shares = b
                .wait_for(
                    "document.querySelector('#gslb-names tbody').textContent",
                    Duration::from_secs(5),
                )
                .unwrap();
            b.screenshot(&shot).unwrap();
            (sites, shares, b.errors())
        }
    })
    .await
    .unwrap();
    println!("GSLB screenshot: {}", shot.display());
    let sites = sites.as_str().unwrap();
    assert!(
        sites.contains("east") && sites.contains("west") && sites.contains("192.0.2.10"),
        "{sites}"
    );
    let shares = shares.as_str().unwrap();
    // Topology: region "tel" answers with east, "uni" with west.
    assert!(shares.contains("app.example.com."), "{shares}");
    assert!(
        shares.contains("tel") && shares.contains("east 100 %"),
        "{shares}"
    );
    assert!(
        shares.contains("uni") && shares.contains("west 100 %"),
        "{shares}"
    );
    assert!(errors.is_empty(), "{errors:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_has_the_cache_hit_ratio_of_a_caching_service() {
    let origin = fulcrum_testkit::Origin::start(free_addr(), |_, n| {
        fulcrum_testkit::Reply::ok(&format!("body {n}"), &[("cache-control", "max-age=60")])
    })
    .await
    .unwrap();
    let vs = free_addr();
    let f = Fulcrum::start_with_token(
        BIN,
        free_addr(),
        Some(TOKEN),
        &format!(
            "[[virtual_service]]\nname = \"cdn\"\nlisten = [\"{vs}\"]\nprotocol = \"http\"\npool = \"o\"\n\
             cache = {{ size = \"8MiB\" }}\n\n[[pool]]\nname = \"o\"\n[[pool.member]]\naddress = \"{}\"\n",
            origin.addr
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Let a first sample pass, then 1 miss and 19 hits within one interval or two.
    let ok = wait_until(Duration::from_secs(5), || async {
        f.get_json("/api/v1/history").await["samples"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    })
    .await;
    assert!(ok);
    for _ in 0..20 {
        let r = fulcrum_testkit::http_get(vs, "/logo.png").await.unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(origin.count(), 1, "the cache answered the rest");
    let ok = wait_until(Duration::from_secs(5), || async {
        let h = f.get_json("/api/v1/history").await;
        h["samples"].as_array().is_some_and(|s| {
            s.iter().any(|x| {
                x["services"][0]["cache_hit_ratio"]
                    .as_f64()
                    .is_some_and(|r| r >= 0.9)
            })
        })
    })
    .await;
    assert!(ok, "{}", f.get_json("/api/v1/history").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_member_window_keeps_member_figures_of_recent_samples_only() {
    let (_backends, _vs, f) = http_pool(2).await;
    let ok = wait_until(Duration::from_secs(10), || async {
        f.get_json("/api/v1/history").await["samples"]
            .as_array()
            .is_some_and(|s| s.len() >= 4)
    })
    .await;
    assert!(ok);
    let h = f.get_json("/api/v1/history?member_window=1.5").await;
    let samples = h["samples"].as_array().unwrap();
    let with_members = samples
        .iter()
        .filter(|s| !s["members"].as_array().unwrap().is_empty())
        .count();
    assert!((1..=2).contains(&with_members), "{h}");
    assert!(samples
        .iter()
        .all(|s| s["services"].as_array().unwrap().len() == 1));
}

/// The dashboard's forms write through the configuration API: a member added to a pool serves,
/// a virtual service is added, and a refused edit shows `fulcrum check`'s words in the form,
/// which stays open and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_forms_add_a_member_and_a_virtual_service_and_show_refusals() {
    let (_backends, vs, f) = http_pool(1).await;
    let extra = HttpBackend::start(free_addr(), "web-new").await.unwrap();
    let new_member = extra.addr.to_string();
    let second = free_addr().to_string();
    let url = format!("http://{}/ui/#token={TOKEN}", f.admin);
    let (nm, sv) = (new_member.clone(), second.clone());
    let (refusal, errors) = tokio::task::spawn_blocking(move || {
        let mut b = Browser::launch(1440, 1000).expect("chromium starts");
        b.navigate(&url).unwrap();
        b.wait_for("document.body && document.body.dataset.loaded === '1'", Duration::from_secs(15))
            .expect("the dashboard loads");
        let set = |b: &mut Browser, name: &str, value: &str| {
            let js = format!(
                "(() => {{ const i = document.querySelector('#edit-fields [name={name}]'); i.value = {}; return true; }})()",
                serde_json::to_string(value).unwrap()
            );
            b.eval(&js).unwrap();
        };
        // Add a member to pool web.
        b.click("section[data-pool=web] button[data-action=add-member]").unwrap();
        b.wait_for("document.getElementById('edit-dialog').open", Duration::from_secs(5))
            .expect("the member form opens");
        set(&mut b, "address", &nm);
        set(&mut b, "weight", "10");
        b.click("#edit-save").unwrap();
        let row = serde_json::to_string(&format!("tr[data-key=\"m:web/{nm}\"]")).unwrap();
        b.wait_for(&format!("!document.getElementById('edit-dialog').open && !!document.querySelector({row})"), Duration::from_secs(10))
            .expect("the new member shows in the pool");
        // Edit the service with a listen address the checks refuse: the form says why.
        b.click("tr[data-key=\"svc:shop\"] button[data-action=edit]").unwrap();
        b.wait_for("document.getElementById('edit-dialog').open && document.querySelector('#edit-fields [name=listen]').value !== ''", Duration::from_secs(5))
            .expect("the service form opens filled in");
        set(&mut b, "listen", "not-an-address");
        b.click("#edit-save").unwrap();
        let refusal = b
            .wait_for("document.getElementById('edit-errors').textContent", Duration::from_secs(10))
            .expect("the refusal shows in the form");
        let still_open = b.eval("document.getElementById('edit-dialog').open").unwrap();
        assert_eq!(still_open, true);
        b.click("#edit-cancel").unwrap();
        // Add a virtual service.
        b.click("#vs-add").unwrap();
        b.wait_for("document.getElementById('edit-dialog').open", Duration::from_secs(5))
            .expect("the service form opens");
        set(&mut b, "name", "second");
        set(&mut b, "protocol", "http");
        set(&mut b, "listen", &sv);
        set(&mut b, "pool", "web");
        b.click("#edit-save").unwrap();
        b.wait_for("!!document.querySelector('tr[data-key=\"svc:second\"]')", Duration::from_secs(10))
            .expect("the new service shows");
        (refusal, b.errors())
    })
    .await
    .unwrap();
    assert!(
        refusal.as_str().unwrap_or("").contains("listen"),
        "{refusal}"
    );
    // Chromium logs the refused PUT (400) as a failed load; nothing else may be logged.
    let errors: Vec<String> = errors.into_iter().filter(|e| !e.contains("400")).collect();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    // What the forms did is in the running configuration and the file.
    let text = std::fs::read_to_string(f.config_path()).unwrap();
    assert!(
        text.contains(&new_member) && text.contains("name = \"second\""),
        "{text}"
    );
    assert!(!text.contains("not-an-address"), "{text}");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        if let Ok(r) = fulcrum_testkit::http_get(vs, "/").await {
            seen.insert(r.text());
        }
    }
    assert!(seen.iter().any(|b| b.contains("web-new")), "{seen:?}");
    let second: std::net::SocketAddr = second.parse().unwrap();
    let r = fulcrum_testkit::http_get(second, "/").await.unwrap();
    assert_eq!(r.status, 200);
}

/// The dashboard lists the proxy-wasm filters of http services with their counters, and marks a
/// filter disabled after its failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_lists_loaded_filters_with_their_counters() {
    let probe = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fulcrum-wasm/filters/probe.wat");
    let backend = HttpBackend::start(free_addr(), "web-1").await.unwrap();
    let vs = free_addr();
    let config = format!(
        "[[virtual_service]]\nname = \"shop\"\nlisten = [\"{vs}\"]\nprotocol = \"http\"\npool = \"web\"\n\
         [[virtual_service.filter]]\nmodule = \"{}\"\ndisable_after = 2\n\
         [[pool]]\nname = \"web\"\n[[pool.member]]\naddress = \"{}\"\n",
        probe.display(),
        backend.addr
    );
    let f = Fulcrum::start_with_token(BIN, free_addr(), Some(TOKEN), &config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..3 {
        let r = fulcrum_testkit::http_get(vs, "/").await.expect("an answer");
        assert_eq!(r.status, 200);
    }
    let url = format!("http://{}/ui/#token={TOKEN}", f.admin);
    let (shown, disabled, errors) = tokio::task::spawn_blocking(move || {
        let mut b = Browser::launch(1440, 900).expect("chromium starts");
        b.navigate(&url).unwrap();
        let shown = b
            .wait_for(
                "(() => { const r = document.querySelector('#filters tbody tr'); return r && !document.getElementById('filters-panel').classList.contains('hidden') && r.cells[3].textContent !== '0' && r.textContent; })()",
                Duration::from_secs(15),
            )
            .expect("the filter row shows with its calls");
        // Two requests that make the filter trap disable it (disable_after = 2).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for _ in 0..2 {
                let _ = fulcrum_testkit::http_request(vs, "GET", "/", &[("x-trap", "1")], b"").await;
            }
        });
        let disabled = b
            .wait_for(
                "(() => { const r = document.querySelector('#filters tbody tr'); return r && r.cells[2].textContent === 'disabled' && r.textContent; })()",
                Duration::from_secs(10),
            )
            .expect("the filter shows disabled");
        (shown, disabled, b.errors())
    })
    .await
    .unwrap();
    let shown = shown.as_str().unwrap_or_default().to_string();
    assert!(
        shown.contains("shop") && shown.contains("probe.wat") && shown.contains("running"),
        "{shown}"
    );
    let disabled = disabled.as_str().unwrap_or_default().to_string();
    assert!(
        disabled.contains("0 / 0 / 2"),
        "two traps counted: {disabled}"
    );
    assert!(errors.is_empty(), "{errors:#?}");
}
