//! HTTP session persistence end to end: inserted (signed) cookies, passive and rewritten member
//! cookies, header and source address tables, HTTP/2 split Cookie fields, hash keys.

mod http_common;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use http_common::*;
use serde_json::json;

fn sticky(vs: SocketAddr, b: &[HttpBackend], profile: &str, pool_extra: &str) -> String {
    format!(
        "{}{}\n[[persistence]]\nname = \"s\"\n{profile}\n",
        service(vs, "persistence = \"s\""),
        pool(
            "p",
            &addrs(b),
            &format!("algorithm = \"round_robin\"\n{pool_extra}")
        )
    )
}

/// The `name=value` of a Set-Cookie for `name`, and its attributes.
fn set_cookie<'a>(r: &'a HttpResponse, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .find(|v| v.starts_with(&format!("{name}=")))
}

fn cookie_value(set: &str) -> &str {
    set.split(';').next().unwrap().split_once('=').unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_insert_sticks_with_an_opaque_signed_cookie() {
    let b = backends(3).await;
    let vs = free_addr();
    let f = start(&sticky(
        vs,
        &b,
        "type = \"cookie_insert\"\ncookie = \"SRV\"\ntimeout = \"30m\"\nsame_site = \"lax\"",
        "",
    ))
    .await;
    let first = get(vs, "/").await;
    let set = set_cookie(&first, "SRV")
        .expect("a persistence cookie")
        .to_string();
    assert!(set.contains("; Path=/; HttpOnly; Max-Age=1800"), "{set}");
    assert!(
        set.contains("SameSite=Lax") && !set.contains("Secure"),
        "{set}"
    );
    let id = cookie_value(&set).to_string();
    assert_eq!(id.len(), 24, "{id}");
    assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
    for m in &b {
        let a = m.addr.to_string();
        assert!(!id.contains(&a) && !id.contains(&m.addr.port().to_string()));
    }
    let owner = who(&first);
    let with = format!("SRV={id}");
    for _ in 0..12 {
        let r = get_with(vs, "/", &[("Cookie", &with)]).await;
        assert_eq!(who(&r), owner);
        assert!(
            set_cookie(&r, "SRV").is_none(),
            "not re-issued while it holds"
        );
    }
    // A forged or tampered id is not honoured: the client is scheduled and given a real one.
    let mut forged = id.clone().into_bytes();
    forged[0] = if forged[0] == b'0' { b'1' } else { b'0' };
    let forged = format!("SRV={}", String::from_utf8(forged).unwrap());
    let mut owners = BTreeSet::new();
    for _ in 0..6 {
        let r = get_with(vs, "/", &[("Cookie", &forged)]).await;
        owners.insert(who(&r));
        assert!(set_cookie(&r, "SRV").is_some());
    }
    assert!(
        owners.len() > 1,
        "forged cookies are round-robined: {owners:?}"
    );
    // drain: still honoured. disabled: rescheduled and a new cookie issued.
    let owner_addr = b.iter().find(|m| m.name == owner).unwrap().addr;
    let path = format!("/api/v1/pools/p/members/{owner_addr}/state");
    f.api("PUT", &path, Some(json!({"state": "drain"})))
        .await
        .unwrap();
    assert_eq!(who(&get_with(vs, "/", &[("Cookie", &with)]).await), owner);
    f.api("PUT", &path, Some(json!({"state": "disabled"})))
        .await
        .unwrap();
    let r = get_with(vs, "/", &[("Cookie", &with)]).await;
    assert_ne!(who(&r), owner);
    let reissued = set_cookie(&r, "SRV").expect("a new cookie");
    assert_ne!(cookie_value(reissued), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_ids_survive_a_restart_and_rotate() {
    let b = backends(3).await;
    let vs = free_addr();
    let with_secret = sticky(
        vs,
        &b,
        "type = \"cookie_insert\"\nsecret = \"0123456789abcdef0123\"",
        "",
    );
    let cookie_of =
        |r: &HttpResponse| set_cookie(r, "FULCRUM").map(|s| cookie_value(s).to_string());
    let f = start(&with_secret).await;
    let r = get(vs, "/").await;
    let (id, owner) = (cookie_of(&r).unwrap(), who(&r));
    drop(f);
    let _f = start(&with_secret).await;
    let r = get_with(vs, "/", &[("Cookie", &format!("FULCRUM={id}"))]).await;
    assert_eq!(
        who(&r),
        owner,
        "the same secret: the cookie still names the member"
    );
    assert!(cookie_of(&r).is_none());
    drop(_f);
    // Without a secret, the secret file beside the token file signs (issue #11): kept across
    // restarts, and rotated by putting a new line on top.
    let shared = tempfile::tempdir().unwrap();
    let without = sticky(vs, &b, "type = \"cookie_insert\"", "");
    let start_shared = || async {
        let admin = free_addr();
        Fulcrum::start_with_admin_table(
            BIN,
            admin,
            &format!(
                "listen = \"{admin}\"\ntoken_file = \"{}/admin.token\"\n",
                shared.path().display()
            ),
            None,
            &without,
        )
        .await
        .unwrap()
    };
    let f = start_shared().await;
    let r = get(vs, "/").await;
    let (id, owner) = (cookie_of(&r).unwrap(), who(&r));
    drop(f);
    let f = start_shared().await;
    let r = get_with(vs, "/", &[("Cookie", &format!("FULCRUM={id}"))]).await;
    assert_eq!(who(&r), owner, "a restart keeps the cookie's meaning");
    assert!(cookie_of(&r).is_none(), "and does not re-issue it");
    drop(f);
    let file = shared.path().join("cookie.secret");
    let old = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("rotated-0123456789abcdef\n{old}")).unwrap();
    let _f = start_shared().await;
    let r = get_with(vs, "/", &[("Cookie", &format!("FULCRUM={id}"))]).await;
    assert_eq!(who(&r), owner, "the previous secret is still accepted");
    let renewed = cookie_of(&r).expect("re-issued with the newest secret");
    assert_ne!(renewed, id);
    let r = get_with(vs, "/", &[("Cookie", &format!("FULCRUM={renewed}"))]).await;
    assert_eq!(who(&r), owner);
    assert!(cookie_of(&r).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_passive_learns_the_members_cookie() {
    let b = backends(3).await;
    let vs = free_addr();
    let f = start(&sticky(
        vs,
        &b,
        "type = \"cookie_passive\"\ncookie = \"SID\"\ntimeout = \"5m\"",
        "",
    ))
    .await;
    // Whoever answers the login sets SID; later requests carrying it go there.
    let r = get(vs, "/set-cookie/SID/session-42").await;
    let owner = who(&r);
    assert_eq!(
        set_cookie(&r, "SID"),
        Some("SID=session-42; Path=/"),
        "passed on unchanged"
    );
    for _ in 0..9 {
        let r = get_with(vs, "/", &[("Cookie", "lang=en; SID=session-42")]).await;
        assert_eq!(who(&r), owner);
    }
    // Values a client makes up are scheduled, never stored (issue #11): only the member's
    // Set-Cookie teaches the table, so a client cannot fill it with values of its choosing.
    let mut owners = BTreeSet::new();
    for i in 0..60 {
        let cookie = format!("SID=made-up-{i}-{}", "x".repeat(4000));
        owners.insert(who(&get_with(vs, "/", &[("Cookie", &cookie)]).await));
    }
    assert!(owners.len() > 1, "unknown values are scheduled: {owners:?}");
    let metrics = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        metrics.contains("fulcrum_persistence_entries{vs=\"web\"} 1\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_rewrite_prefixes_the_members_cookie_and_strips_it_back() {
    let b = backends(3).await;
    let vs = free_addr();
    let _f = start(&sticky(
        vs,
        &b,
        "type = \"cookie_rewrite\"\ncookie = \"JSESSIONID\"",
        "",
    ))
    .await;
    let r = get(vs, "/set-cookie/JSESSIONID/abc123").await;
    let owner = who(&r);
    let set = set_cookie(&r, "JSESSIONID").unwrap().to_string();
    let value = cookie_value(&set).to_string();
    assert!(
        value.ends_with("~abc123") && value.len() == 24 + 1 + 6,
        "{set}"
    );
    assert!(set.ends_with("; Path=/"), "attributes kept: {set}");
    for _ in 0..6 {
        let r = get_with(
            vs,
            "/echo",
            &[("Cookie", &format!("a=1; JSESSIONID={value}; b=2"))],
        )
        .await;
        let text = r.text();
        assert_eq!(
            r.header("x-server"),
            Some(owner.as_str()),
            "sticks to the member that set it"
        );
        assert!(
            text.contains("cookie: a=1; JSESSIONID=abc123; b=2\n"),
            "the member sees its own cookie: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_source_ip_persistence() {
    let b = backends(3).await;
    let vs = free_addr();
    let _f = start(&sticky(
        vs,
        &b,
        "type = \"header\"\nheader = \"X-Call-ID\"",
        "",
    ))
    .await;
    for call in ["13800000001", "13800000002", "13800000003"] {
        let first = who(&get_with(vs, "/", &[("X-Call-ID", call)]).await);
        for _ in 0..5 {
            assert_eq!(who(&get_with(vs, "/", &[("X-Call-ID", call)]).await), first);
        }
    }
    let vs2 = free_addr();
    let _g = start(&sticky(vs2, &b, "type = \"source_ip\"", "")).await;
    for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        let url = format!("http://{vs2}/");
        let (_, first, _) = curl(&["--interface", source, &url]).await;
        for _ in 0..4 {
            let (_, again, _) = curl(&["--interface", source, &url]).await;
            assert_eq!(again, first, "{source}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_split_cookie_fields_are_understood_and_joined() {
    let b = backends(3).await;
    let vs = free_addr();
    let _f = start(&sticky(vs, &b, "type = \"cookie_insert\"", "")).await;
    let r = get(vs, "/").await;
    let id = cookie_value(set_cookie(&r, "FULCRUM").unwrap()).to_string();
    let owner = who(&r);
    let url = format!("http://{vs}/echo");
    for _ in 0..4 {
        // Two Cookie fields in one HTTP/2 request (RFC 9113 §8.2.3); ours is in the second.
        let (ok, out, err) = curl(&[
            "--http2-prior-knowledge",
            "-i",
            "-H",
            "Cookie: a=1",
            "-H",
            &format!("Cookie: FULCRUM={id}"),
            &url,
        ])
        .await;
        assert!(ok, "{err}");
        assert_eq!(header(&out, "x-server"), Some(owner.as_str()), "{out}");
        assert!(
            out.contains(&format!("cookie: a=1; FULCRUM={id}\n")),
            "joined into one field for the HTTP/1.1 member: {out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_keys_uri_host_header_and_cookie() {
    let b = backends(4).await;
    let cases = [
        ("uri", "/k?x="),
        ("host", ""),
        ("header:X-User", ""),
        ("cookie:uid", ""),
    ];
    for (key, _) in cases {
        let vs = free_addr();
        let _f = start(&format!(
            "{}{}",
            service(vs, ""),
            pool(
                "p",
                &addrs(&b),
                &format!("algorithm = \"hash\"\nhash_key = \"{key}\"")
            )
        ))
        .await;
        let request = |i: usize| {
            let (path, headers): (String, Vec<(&str, String)>) = match key {
                "uri" => (format!("/k?x={i}"), vec![]),
                "host" => ("/".into(), vec![("Host", format!("h{i}.test"))]),
                "header:X-User" => ("/".into(), vec![("X-User", format!("u{i}"))]),
                _ => ("/".into(), vec![("Cookie", format!("a=b; uid=u{i}"))]),
            };
            (path, headers)
        };
        let mut spread = BTreeSet::new();
        for i in 0..40 {
            let (path, headers) = request(i);
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let first = who(&http_request(vs, "GET", &path, &h, b"").await.unwrap());
            for _ in 0..2 {
                let again = who(&http_request(vs, "GET", &path, &h, b"").await.unwrap());
                assert_eq!(again, first, "{key} {i}");
            }
            spread.insert(first);
        }
        assert!(spread.len() >= 3, "{key}: 40 keys on {spread:?}");
    }
}
