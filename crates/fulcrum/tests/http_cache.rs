//! The HTTP cache (`virtual_service.cache`, RFC 9111) end to end through the binary: a scripted
//! origin decides every response (status, fields, body) and counts what reaches it.

mod http_common;

use std::net::SocketAddr;
use std::time::Duration;

use fulcrum_testkit::{Origin, Reply, Seen};
use http_common::*;
use serde_json::Value;

struct Setup {
    f: Fulcrum,
    vs: SocketAddr,
    origin: Origin,
}

async fn setup_with(
    cache: &str,
    handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
) -> Setup {
    let origin = Origin::start(free_addr(), handler).await.unwrap();
    let vs = free_addr();
    let f = start(&format!(
        "{}{}",
        service(vs, &format!("cache = {cache}")),
        pool("p", &[origin.addr], "")
    ))
    .await;
    Setup { f, vs, origin }
}

async fn setup(handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) -> Setup {
    setup_with("{ size = \"16MiB\", max_object = \"1MiB\" }", handler).await
}

/// A body naming the request number, so a cached answer is told from a fresh one.
fn numbered(n: usize) -> String {
    format!("v{n}")
}

fn status_of(r: &HttpResponse) -> &str {
    r.header("cache-status").unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_responses_are_served_from_the_cache_with_age() {
    let s = setup(|_, n| Reply::ok(&numbered(n), &[("cache-control", "max-age=60")])).await;
    let a = get(s.vs, "/a").await;
    assert_eq!(a.text(), "v0");
    assert_eq!(status_of(&a), "fulcrum; fwd=uri-miss; stored");
    let b = get(s.vs, "/a").await;
    assert_eq!(b.text(), "v0");
    assert_eq!(status_of(&b), "fulcrum; hit");
    let age: u64 = b.header("age").unwrap().parse().unwrap();
    assert!(age <= 2, "{age}");
    assert_eq!(b.header("content-length"), Some("2"));
    assert_eq!(s.origin.count(), 1);
    // The query is part of the key; the host is compared without case.
    assert_eq!(get(s.vs, "/a?x=1").await.text(), "v1");
    let host = s.vs.to_string().to_uppercase();
    assert_eq!(get_with(s.vs, "/a", &[("host", &host)]).await.text(), "v0");
    assert_eq!(s.origin.count(), 2);
    // Stored responses keep an Age from the member and add their time in the cache.
    s.origin.set(|_, n| {
        Reply::ok(
            &numbered(n),
            &[("cache-control", "max-age=600"), ("age", "100")],
        )
    });
    get(s.vs, "/aged").await;
    let r = get(s.vs, "/aged").await;
    let age: u64 = r.header("age").unwrap().parse().unwrap();
    assert!((100..=102).contains(&age), "{age}");
    // Counters.
    let c = s.f.get_json("/api/v1/cache/web").await;
    assert_eq!(c["hits"], 3, "{c}");
    assert_eq!(c["stored"], 3, "{c}");
    assert_eq!(c["entries"], 3, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freshness_from_s_maxage_max_age_expires_and_heuristics() {
    let s = setup(|req, n| {
        let h: &[(&str, &str)] = match req.path.as_str() {
            "/smaxage" => &[("cache-control", "max-age=0, s-maxage=60")],
            "/maxage0" => &[("cache-control", "max-age=0")],
            "/smaxage0" => &[("cache-control", "max-age=60, s-maxage=0")],
            "/expires-future" => &[("expires", "Fri, 01 Jan 2100 00:00:00 GMT")],
            "/expires-past" => &[("expires", "Thu, 01 Jan 1970 00:00:00 GMT")],
            "/expires-invalid" => &[("expires", "0")],
            "/heuristic" => &[("last-modified", "Sat, 01 Jan 2000 00:00:00 GMT")],
            "/heuristic-302" => &[
                ("last-modified", "Sat, 01 Jan 2000 00:00:00 GMT"),
                ("location", "/x"),
            ],
            "/heuristic-expires-wins" => &[
                ("last-modified", "Sat, 01 Jan 2000 00:00:00 GMT"),
                ("expires", "Thu, 01 Jan 1970 00:00:00 GMT"),
            ],
            _ => &[],
        };
        let status = if req.path == "/heuristic-302" {
            302
        } else {
            200
        };
        Reply::status(status, &numbered(n), h)
    })
    .await;
    for (path, cached) in [
        ("/smaxage", true),
        ("/maxage0", false),
        ("/smaxage0", false),
        ("/expires-future", true),
        ("/expires-past", false),
        ("/expires-invalid", false),
        ("/heuristic", true),
        ("/heuristic-302", false),
        ("/heuristic-expires-wins", false),
        ("/no-freshness", false),
    ] {
        let first = get(s.vs, path).await;
        let second = get(s.vs, path).await;
        assert_eq!(
            first.text() == second.text(),
            cached,
            "{path}: {} then {} ({})",
            first.text(),
            second.text(),
            status_of(&second)
        );
        assert_eq!(
            s.origin.count_path(path),
            if cached { 1 } else { 2 },
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_private_and_authorization_are_not_stored() {
    let s = setup(|req, n| {
        let cc = match req.path.as_str() {
            "/no-store" => "no-store, max-age=60",
            "/private" => "private, max-age=60",
            "/auth-public" => "public, max-age=60",
            "/vary-star" => "max-age=60",
            _ => "max-age=60",
        };
        let mut r = Reply::ok(&numbered(n), &[("cache-control", cc)]);
        if req.path == "/vary-star" {
            r.headers.push(("vary".into(), "*".into()));
        }
        r
    })
    .await;
    for path in ["/no-store", "/private", "/vary-star"] {
        assert_ne!(
            get(s.vs, path).await.text(),
            get(s.vs, path).await.text(),
            "{path}"
        );
    }
    // Request no-store: nothing is stored from it.
    get_with(s.vs, "/req-no-store", &[("cache-control", "no-store")]).await;
    get(s.vs, "/req-no-store").await;
    assert_eq!(s.origin.count_path("/req-no-store"), 2);
    // Authorization: only with public (or s-maxage, must-revalidate).
    let auth = [("authorization", "Basic dTpw")];
    get_with(s.vs, "/auth", &auth).await;
    get_with(s.vs, "/auth", &auth).await;
    assert_eq!(s.origin.count_path("/auth"), 2);
    get_with(s.vs, "/auth-public", &auth).await;
    get_with(s.vs, "/auth-public", &auth).await;
    assert_eq!(s.origin.count_path("/auth-public"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_revalidates_with_etag_and_the_304_updates_the_stored_fields() {
    let s = setup(|req, n| {
        if req.header("if-none-match") == Some("\"e1\"") {
            return Reply::status(
                304,
                "",
                &[
                    ("etag", "\"e1\""),
                    ("x-version", &format!("{n}")),
                    ("cache-control", "no-cache"),
                    ("content-length", "0"),
                ],
            );
        }
        Reply::ok(
            "body-one",
            &[
                ("etag", "\"e1\""),
                ("cache-control", "no-cache"),
                ("x-version", "0"),
            ],
        )
    })
    .await;
    let a = get(s.vs, "/nc").await;
    assert_eq!(a.text(), "body-one");
    for i in 1..=2 {
        let b = get(s.vs, "/nc").await;
        assert_eq!(b.text(), "body-one");
        assert_eq!(
            b.header("x-version"),
            Some(i.to_string().as_str()),
            "{:?}",
            b.headers
        );
        assert_eq!(status_of(&b), "fulcrum; fwd=stale; fwd-status=304");
        assert_eq!(b.header("content-length"), Some("8"));
    }
    let seen = s.origin.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].header("if-none-match"), None);
    assert_eq!(seen[1].header("if-none-match"), Some("\"e1\""));
    let c = s.f.get_json("/api/v1/cache/web").await;
    assert_eq!(c["revalidated"], 2, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_entries_revalidate_with_last_modified_and_a_200_replaces_them() {
    let lm = "Sat, 01 Jan 2000 00:00:00 GMT";
    let s = setup(move |req, n| {
        if n == 1 {
            assert_eq!(req.header("if-modified-since"), Some(lm));
            return Reply::status(304, "", &[("cache-control", "max-age=0")]);
        }
        Reply::ok(
            &numbered(n),
            &[("cache-control", "max-age=0"), ("last-modified", lm)],
        )
    })
    .await;
    assert_eq!(get(s.vs, "/lm").await.text(), "v0");
    // Stale at once: the second request validates (304), the third gets a new 200.
    let b = get(s.vs, "/lm").await;
    assert_eq!(b.text(), "v0");
    assert_eq!(status_of(&b), "fulcrum; fwd=stale; fwd-status=304");
    let c = get(s.vs, "/lm").await;
    assert_eq!(c.text(), "v2");
    assert_eq!(status_of(&c), "fulcrum; fwd=stale; stored");
    assert_eq!(get(s.vs, "/lm").await.header("if-modified-since"), None);
    assert_eq!(s.origin.seen()[2].header("if-modified-since"), Some(lm));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_never_serves_stale_and_504s_without_the_member() {
    let s = setup(|req, n| {
        let cc = if req.path == "/mr" {
            "max-age=0, must-revalidate, stale-if-error=600"
        } else {
            "max-age=0, stale-if-error=600"
        };
        Reply::ok(&numbered(n), &[("cache-control", cc), ("etag", "\"t\"")])
    })
    .await;
    get(s.vs, "/mr").await;
    get(s.vs, "/sie").await;
    // A stale request allowance does not beat must-revalidate.
    let r = get_with(s.vs, "/mr", &[("cache-control", "max-stale=600")]).await;
    assert_eq!(r.text(), "v2");
    let r = get_with(s.vs, "/sie", &[("cache-control", "max-stale=600")]).await;
    assert_eq!(r.text(), "v1");
    assert_eq!(status_of(&r), "fulcrum; hit; detail=stale");
    // The member fails with 500: stale-if-error serves the stored copy, must-revalidate 504s.
    s.origin.set(|_, _| Reply::status(500, "down", &[]));
    assert_eq!(get(s.vs, "/mr").await.status, 504);
    let r = get(s.vs, "/sie").await;
    assert_eq!((r.status, r.text().as_str()), (200, "v1"));
    // The member is gone altogether.
    let Setup { f: _f, vs, origin } = s;
    drop(origin);
    assert_eq!(get(vs, "/mr").await.status, 504);
    assert_eq!(get(vs, "/sie").await.text(), "v1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_directives_no_cache_max_age_min_fresh_max_stale_and_pragma() {
    let s = setup(|_, n| Reply::ok(&numbered(n), &[("cache-control", "max-age=100")])).await;
    get(s.vs, "/r").await;
    let cases: [(&[(&str, &str)], bool); 6] = [
        (&[], true),
        (&[("cache-control", "no-cache")], false),
        (&[("pragma", "no-cache")], false),
        (&[("cache-control", "max-age=0")], false),
        (&[("cache-control", "min-fresh=200")], false),
        (&[("cache-control", "max-stale=5, min-fresh=10")], true),
    ];
    for (headers, hit) in cases {
        let before = s.origin.count();
        let r = get_with(s.vs, "/r", headers).await;
        assert_eq!(
            s.origin.count() == before,
            hit,
            "{headers:?}: {}",
            status_of(&r)
        );
    }
    // Pragma is ignored when Cache-Control is present.
    let before = s.origin.count();
    get_with(
        s.vs,
        "/r",
        &[("pragma", "no-cache"), ("cache-control", "max-stale")],
    )
    .await;
    assert_eq!(s.origin.count(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_keeps_one_variant_per_request_value() {
    let s = setup(|req, n| {
        Reply::ok(
            &format!("{}-{}", req.header("accept-language").unwrap_or("none"), n),
            &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
        )
    })
    .await;
    let en = [("accept-language", "en")];
    let fr = [("accept-language", "fr")];
    assert_eq!(get_with(s.vs, "/v", &en).await.text(), "en-0");
    assert_eq!(get_with(s.vs, "/v", &fr).await.text(), "fr-1");
    assert_eq!(get_with(s.vs, "/v", &en).await.text(), "en-0");
    assert_eq!(get_with(s.vs, "/v", &fr).await.text(), "fr-1");
    let r = get(s.vs, "/v").await;
    assert_eq!(r.text(), "none-2");
    assert_eq!(status_of(&r), "fulcrum; fwd=vary-miss; stored");
    assert_eq!(get(s.vs, "/v").await.text(), "none-2");
    // Values are compared after normalisation (case of the language tags, spaces).
    let a = [("accept-language", "en-US, de")];
    let b = [("accept-language", "EN-us,de")];
    assert_eq!(get_with(s.vs, "/v", &a).await.text(), "en-US, de-3");
    assert_eq!(get_with(s.vs, "/v", &b).await.text(), "en-US, de-3");
    assert_eq!(s.origin.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_conditionals_and_head_are_answered_from_the_cache() {
    let lm = "Sat, 01 Jan 2000 00:00:00 GMT";
    let s = setup(move |_, n| {
        Reply::ok(
            &numbered(n),
            &[
                ("cache-control", "max-age=60"),
                ("etag", "\"abc\""),
                ("last-modified", lm),
            ],
        )
    })
    .await;
    get(s.vs, "/c").await;
    let r = get_with(s.vs, "/c", &[("if-none-match", "\"x\", W/\"abc\"")]).await;
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some("\"abc\""));
    assert!(r.body.is_empty());
    let r = get_with(s.vs, "/c", &[("if-none-match", "\"other\"")]).await;
    assert_eq!((r.status, r.text().as_str()), (200, "v0"));
    let r = get_with(s.vs, "/c", &[("if-modified-since", lm)]).await;
    assert_eq!(r.status, 304);
    let r = get_with(
        s.vs,
        "/c",
        &[("if-modified-since", "Fri, 01 Jan 1999 00:00:00 GMT")],
    )
    .await;
    assert_eq!(r.status, 200);
    // If-None-Match wins over If-Modified-Since.
    let r = get_with(
        s.vs,
        "/c",
        &[("if-none-match", "\"other\""), ("if-modified-since", lm)],
    )
    .await;
    assert_eq!(r.status, 200);
    // HEAD from the stored GET.
    let r = http_request(s.vs, "HEAD", "/c", &[], b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("2"));
    assert_eq!(status_of(&r), "fulcrum; hit");
    assert_eq!(s.origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_methods_invalidate_the_uri_and_its_location() {
    let s = setup(|req, n| match req.method.as_str() {
        "POST" if req.path == "/fail" => Reply::status(500, "", &[]),
        "POST" => Reply::status(201, "", &[("location", "/created")]),
        _ => Reply::ok(&numbered(n), &[("cache-control", "max-age=60")]),
    })
    .await;
    for p in ["/i", "/created", "/fail"] {
        get(s.vs, p).await;
        get(s.vs, p).await;
        assert_eq!(s.origin.count_path(p), 1);
    }
    http_request(s.vs, "POST", "/i", &[], b"x").await.unwrap();
    get(s.vs, "/i").await;
    assert_eq!(s.origin.count_path("/i"), 3, "POST + GET again");
    get(s.vs, "/created").await;
    assert_eq!(s.origin.count_path("/created"), 2, "Location invalidated");
    // An error response does not invalidate.
    http_request(s.vs, "POST", "/fail", &[], b"x")
        .await
        .unwrap();
    get(s.vs, "/fail").await;
    assert_eq!(s.origin.count_path("/fail"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_if_cached_answers_504_on_a_miss() {
    let s = setup(|_, n| Reply::ok(&numbered(n), &[("cache-control", "max-age=60")])).await;
    let oic = [("cache-control", "only-if-cached")];
    assert_eq!(get_with(s.vs, "/o", &oic).await.status, 504);
    assert_eq!(s.origin.count(), 0);
    get(s.vs, "/o").await;
    let r = get_with(s.vs, "/o", &oic).await;
    assert_eq!((r.status, r.text().as_str()), (200, "v0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_collapse_into_one_member_request() {
    let s = setup(|_, n| {
        let mut r = Reply::ok(&numbered(n), &[("cache-control", "max-age=60")]);
        r.delay = Duration::from_millis(500);
        r
    })
    .await;
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let vs = s.vs;
        tasks.push(tokio::spawn(async move { get(vs, "/slow").await }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "v0"));
    }
    assert_eq!(s.origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_object_bounds_what_is_stored_streamed_or_not() {
    let s = setup_with("{ size = \"1MiB\", max_object = \"4KiB\" }", |req, n| {
        let size = if req.path.starts_with("/big") {
            5000
        } else {
            3000
        };
        let mut body = numbered(n);
        body.push_str(&"x".repeat(size - body.len()));
        let mut r = Reply::ok(&body, &[("cache-control", "max-age=60")]);
        r.chunked = req.path.ends_with("chunked");
        r
    })
    .await;
    for (path, stored) in [
        ("/small", true),
        ("/small-chunked", true),
        ("/big", false),
        ("/big-chunked", false),
    ] {
        let a = get(s.vs, path).await;
        let b = get(s.vs, path).await;
        let len = if stored { 3000 } else { 5000 };
        assert_eq!((a.body.len(), b.body.len()), (len, len), "{path}");
        assert_eq!(
            s.origin.count_path(path),
            if stored { 1 } else { 2 },
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_bounds_the_cache_by_eviction() {
    let s = setup_with("{ size = \"64KiB\", max_object = \"16KiB\" }", |_, n| {
        let mut body = numbered(n);
        body.push_str(&"x".repeat(8000 - body.len()));
        Reply::ok(&body, &[("cache-control", "max-age=600")])
    })
    .await;
    for i in 0..40 {
        get(s.vs, &format!("/e{i}")).await;
    }
    let ok = wait_until(Duration::from_secs(5), || async {
        let c = s.f.get_json("/api/v1/cache/web").await;
        c["bytes"].as_u64().unwrap_or(u64::MAX) <= 64 * 1024 && c["entries"].as_u64() < Some(40)
    })
    .await;
    let c = s.f.get_json("/api/v1/cache/web").await;
    assert!(ok, "{c}");
    assert!(c["entries"].as_u64().unwrap() >= 1, "{c}");
    let metrics = http_request(s.f.admin, "GET", "/metrics", &[], b"")
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("fulcrum_http_cache_bytes{vs=\"web\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("fulcrum_http_cache_hits_total{vs=\"web\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_url_and_prefix_through_the_api() {
    let s = setup(|_, n| Reply::ok(&numbered(n), &[("cache-control", "max-age=600")])).await;
    for p in ["/static/a", "/static/b", "/other", "/other?q=1"] {
        get(s.vs, p).await;
    }
    assert_eq!(s.origin.count(), 4);
    let r =
        s.f.api("DELETE", "/api/v1/cache/web?prefix=/static/", None)
            .await
            .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["purged"], 2);
    get(s.vs, "/static/a").await;
    get(s.vs, "/other").await;
    assert_eq!(s.origin.count(), 5);
    // By URL, absolute (its host) or with host=.
    let url = format!("http://{}/other", s.vs);
    let r =
        s.f.api("DELETE", &format!("/api/v1/cache/web?url={url}"), None)
            .await
            .unwrap();
    assert_eq!(r.json()["purged"], 1, "{}", r.text());
    get(s.vs, "/other").await;
    assert_eq!(s.origin.count(), 6);
    let r =
        s.f.api(
            "DELETE",
            "/api/v1/cache/web?url=/other%3Fq%3D1&host=127.0.0.1",
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.json()["purged"], 1, "{}", r.text());
    let r =
        s.f.api("DELETE", "/api/v1/cache/nope?url=/x", None)
            .await
            .unwrap();
    assert_eq!(r.status, 404);
    let c: Value = s.f.get_json("/api/v1/cache/web").await;
    assert_eq!(c["urls"], 2, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_share_the_cache() {
    let s = setup(|_, n| Reply::ok(&numbered(n), &[("cache-control", "max-age=60")])).await;
    assert_eq!(get(s.vs, "/h2").await.text(), "v0");
    let url = format!("http://{}/h2", s.vs);
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", &url]).await;
    assert!(ok, "{err}");
    assert!(out.contains("HTTP/2 200"), "{out}");
    assert!(out.contains("cache-status: fulcrum; hit"), "{out}");
    assert!(out.ends_with("v0"), "{out}");
    // An HTTP/2 miss stores for HTTP/1 clients too.
    let url = format!("http://{}/h2b", s.vs);
    let (ok, out, _) = curl(&["--http2-prior-knowledge", &url]).await;
    assert!(ok);
    assert_eq!(out, "v1");
    assert_eq!(get(s.vs, "/h2b").await.text(), "v1");
    assert_eq!(s.origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_response_freshens_the_stored_get_response() {
    let s = setup(|req, n| {
        if req.method == "HEAD" {
            return Reply::ok(
                "",
                &[
                    ("cache-control", "max-age=600"),
                    ("etag", "\"a\""),
                    ("x-new", "1"),
                ],
            );
        }
        Reply::ok(
            &numbered(n),
            &[("cache-control", "max-age=0"), ("etag", "\"a\"")],
        )
    })
    .await;
    assert_eq!(get(s.vs, "/h").await.text(), "v0");
    let r = http_request(s.vs, "HEAD", "/h", &[], b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-new"), Some("1"));
    assert_eq!(r.header("content-length"), Some("2"));
    let r = get(s.vs, "/h").await;
    assert_eq!(r.text(), "v0");
    assert_eq!(r.header("x-new"), Some("1"));
    assert_eq!(status_of(&r), "fulcrum; hit");
    assert_eq!(s.origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_serves_stale_and_refreshes_in_the_background() {
    let s = setup(|_, n| {
        let cc = if n == 0 {
            "max-age=0, stale-while-revalidate=600"
        } else {
            "max-age=600"
        };
        Reply::ok(&numbered(n), &[("cache-control", cc), ("etag", "\"s\"")])
    })
    .await;
    assert_eq!(get(s.vs, "/swr").await.text(), "v0");
    let r = get(s.vs, "/swr").await;
    assert_eq!(r.text(), "v0");
    assert_eq!(status_of(&r), "fulcrum; hit; detail=stale");
    assert!(wait_until(Duration::from_secs(5), || async { s.origin.count() == 2 }).await);
    assert_eq!(s.origin.seen()[1].header("if-none-match"), Some("\"s\""));
    let ok = wait_until(Duration::from_secs(5), || async {
        get(s.vs, "/swr").await.text() == "v1"
    })
    .await;
    assert!(ok);
    assert_eq!(s.origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_is_kept_across_reloads_and_dropped_with_its_key() {
    let s = setup(|_, n| Reply::ok(&numbered(n), &[("cache-control", "max-age=600")])).await;
    get(s.vs, "/k").await;
    let config = |cache: &str| {
        format!(
            "{}{}",
            service(s.vs, cache),
            pool("p", &[s.origin.addr], "")
        )
    };
    // A new size keeps the entries.
    s.f.write_config(&config("cache = { size = \"8MiB\" }"));
    let r = s.f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(s.vs, "/k").await;
    assert_eq!((r.text().as_str(), status_of(&r)), ("v0", "fulcrum; hit"));
    // Without `cache` the service forwards everything and the API has no cache for it.
    s.f.write_config(&config(""));
    let r = s.f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(s.vs, "/k").await;
    assert_eq!(r.text(), "v1");
    assert_eq!(r.header("cache-status"), None);
    let r = s.f.api("GET", "/api/v1/cache/web", None).await.unwrap();
    assert_eq!(r.status, 404);
    assert!(!s.f.logs().contains("not applied in this build yet"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_and_compression_keep_one_variant_per_accept_encoding() {
    let page = "<p>cacheable and compressible</p>\n".repeat(200);
    let body = page.clone();
    let origin = Origin::start(free_addr(), move |_, _| {
        Reply::ok(
            &body,
            &[
                ("cache-control", "max-age=60"),
                ("content-type", "text/html"),
            ],
        )
    })
    .await
    .unwrap();
    let vs = free_addr();
    let _f = start(&format!(
        "{}{}",
        service(
            vs,
            "cache = { size = \"16MiB\", max_object = \"1MiB\" }\ncompression = { algorithms = [\"gzip\"] }"
        ),
        pool("p", &[origin.addr], "")
    ))
    .await;
    let gz = [("accept-encoding", "gzip")];
    let first = get_with(vs, "/page", &gz).await;
    assert_eq!(first.header("content-encoding"), Some("gzip"));
    let second = get_with(vs, "/page", &gz).await;
    assert_eq!(status_of(&second), "fulcrum; hit");
    assert_eq!(second.header("content-encoding"), Some("gzip"));
    assert_eq!(
        second.body, first.body,
        "the stored gzip variant is served as it was"
    );
    // A client that does not accept gzip must never get the stored gzip body.
    let plain = get(vs, "/page").await;
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.text(), page);
    let plain_again = get(vs, "/page").await;
    assert_eq!(status_of(&plain_again), "fulcrum; hit");
    assert_eq!(plain_again.text(), page);
    assert_eq!(origin.count(), 2, "one member fetch per variant");
}

/// Range requests are answered from a stored 200 (RFC 9110 §14): one range is a 206 cut from
/// the stored body, an unsatisfiable one a 416 with `Content-Range: bytes */len`, several
/// ascending ones a `multipart/byteranges` 206; ranges out of order or an If-Range naming
/// another validator the whole 200. A Range miss is forwarded with
/// its Range, and the member's 206 is not stored as the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_are_cut_from_stored_responses_and_misses_forward_the_range() {
    let s = setup(|req, _| match req.header("range") {
        Some(_) => Reply::status(
            206,
            "01",
            &[
                ("cache-control", "max-age=60"),
                ("content-range", "bytes 0-1/10"),
            ],
        ),
        None => Reply::ok(
            "0123456789",
            &[
                ("cache-control", "max-age=60"),
                ("etag", "\"e1\""),
                ("content-type", "text/plain"),
            ],
        ),
    })
    .await;
    assert_eq!(get(s.vs, "/r").await.text(), "0123456789");
    /// Request fields, then the status, body and Content-Range expected.
    type Case<'a> = (&'a [(&'a str, &'a str)], u16, &'a str, Option<&'a str>);
    let cases: [Case; 7] = [
        (&[("range", "bytes=2-4")], 206, "234", Some("bytes 2-4/10")),
        (&[("range", "bytes=-3")], 206, "789", Some("bytes 7-9/10")),
        (&[("range", "bytes=8-")], 206, "89", Some("bytes 8-9/10")),
        (&[("range", "bytes=20-")], 416, "", Some("bytes */10")),
        (&[("range", "bytes=5-6, 0-1")], 200, "0123456789", None),
        (
            &[("range", "bytes=0-0"), ("if-range", "\"e1\"")],
            206,
            "0",
            Some("bytes 0-0/10"),
        ),
        (
            &[("range", "bytes=0-0"), ("if-range", "\"changed\"")],
            200,
            "0123456789",
            None,
        ),
    ];
    for (fields, status, body, range) in cases {
        let r = get_with(s.vs, "/r", fields).await;
        assert_eq!((r.status, r.text().as_str()), (status, body), "{fields:?}");
        assert_eq!(r.header("content-range"), range, "{fields:?}");
        assert_eq!(status_of(&r), "fulcrum; hit", "{fields:?}");
        if status == 206 {
            assert_eq!(r.header("content-type"), Some("text/plain"));
            assert_eq!(r.header("content-length"), Some(&*body.len().to_string()));
        }
    }
    // Several ranges, ascending and apart: one multipart/byteranges body (RFC 9110 §14.6).
    let r = get_with(s.vs, "/r", &[("range", "bytes=0-1, 5-6, 30-40")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), None);
    let ctype = r.header("content-type").unwrap_or_default().to_string();
    let boundary = ctype
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap_or_else(|| panic!("not multipart: {ctype}"));
    let expected = format!(
        "--{boundary}\r\ncontent-type: text/plain\r\ncontent-range: bytes 0-1/10\r\n\r\n01\r\n\
         --{boundary}\r\ncontent-type: text/plain\r\ncontent-range: bytes 5-6/10\r\n\r\n56\r\n\
         --{boundary}--\r\n"
    );
    assert_eq!(r.text(), expected);
    assert_eq!(
        r.header("content-length"),
        Some(&*expected.len().to_string())
    );
    assert_eq!(s.origin.count(), 1, "every range came from the cache");
    // HTTP/2 clients get the same.
    let url = format!("http://{}/r", s.vs);
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", "-r", "3-5", &url]).await;
    assert!(ok, "{err}");
    assert!(out.contains("HTTP/2 206"), "{out}");
    assert!(out.contains("content-range: bytes 3-5/10"), "{out}");
    assert!(out.ends_with("345"), "{out}");
    let (ok, out, err) = curl(&["-i", "--http2-prior-knowledge", "-r", "0-0,9-9", &url]).await;
    assert!(ok, "{err}");
    assert!(out.contains("HTTP/2 206"), "{out}");
    assert!(
        out.contains("content-type: multipart/byteranges; boundary="),
        "{out}"
    );
    assert!(
        out.contains("content-range: bytes 9-9/10\r\n\r\n9\r\n--"),
        "{out}"
    );
    // A miss: the Range goes to the member, its 206 to the client, and nothing is stored.
    let r = get_with(s.vs, "/m", &[("range", "bytes=0-1")]).await;
    assert_eq!((r.status, r.text().as_str()), (206, "01"));
    assert_eq!(s.origin.seen()[1].header("range"), Some("bytes=0-1"));
    let r = get(s.vs, "/m").await;
    assert_eq!((r.status, r.text().as_str()), (200, "0123456789"));
    assert_eq!(status_of(&r), "fulcrum; fwd=uri-miss; stored");
    assert_eq!(s.origin.count(), 3);
}

/// `no-cache="field"` and `private="field"` (RFC 9111 §5.2.2.4, §5.2.2.7): the response is
/// stored and reused without the named fields, instead of being revalidated every time or not
/// stored at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qualified_no_cache_and_private_store_the_response_without_the_named_fields() {
    let s = setup(|_, n| {
        Reply::ok(
            &numbered(n),
            &[
                (
                    "cache-control",
                    "no-cache=\"x-secret, X-Token\", max-age=60",
                ),
                ("cache-control", "private=\"set-cookie\""),
                ("x-secret", "s"),
                ("x-token", "t"),
                ("set-cookie", "id=1"),
                ("x-other", "o"),
            ],
        )
    })
    .await;
    let first = get(s.vs, "/q").await;
    assert_eq!(
        first.header("x-secret"),
        Some("s"),
        "the member's answer is whole"
    );
    assert_eq!(first.header("set-cookie"), Some("id=1"));
    let r = get(s.vs, "/q").await;
    assert_eq!(r.text(), "v0");
    assert_eq!(status_of(&r), "fulcrum; hit");
    assert_eq!(r.header("x-other"), Some("o"));
    for name in ["x-secret", "x-token", "set-cookie"] {
        assert_eq!(r.header(name), None, "{name} is not reused");
    }
    assert_eq!(s.origin.count(), 1);
}

/// Concurrent misses collapse per variant: while a slow fetch of one variant is under way,
/// a request for another variant of the same URL goes to the member at once instead of
/// waiting for it, and each gets its own variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_collapse_per_variant_not_per_url() {
    let s = setup(|req, n| {
        let lang = req.header("accept-language").unwrap_or("none").to_string();
        let mut r = Reply::ok(
            &format!("{lang}-{n}"),
            &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
        );
        r.delay = Duration::from_millis(if lang == "fr" { 3000 } else { 200 });
        r
    })
    .await;
    // One stored variant tells the cache what the URL varies on.
    assert_eq!(
        get_with(s.vs, "/v", &[("accept-language", "en")])
            .await
            .text(),
        "en-0"
    );
    let vs = s.vs;
    let slow = tokio::spawn(async move { get_with(vs, "/v", &[("accept-language", "fr")]).await });
    assert!(
        wait_until(Duration::from_secs(5), || async { s.origin.count() == 2 }).await,
        "the slow fetch reached the member"
    );
    let de = get_with(s.vs, "/v", &[("accept-language", "de")]).await;
    assert_eq!(de.text(), "de-2");
    assert!(
        !slow.is_finished(),
        "the other variant did not wait for the slow fetch"
    );
    assert_eq!(slow.await.unwrap().text(), "fr-1");
    // Requests for the same variant still collapse into one fetch.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(tokio::spawn(async move {
            get_with(vs, "/v", &[("accept-language", "it")]).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().text(), "it-3");
    }
    assert_eq!(s.origin.count(), 4);
}

/// With nothing stored yet, a miss waiting for another request's fetch learns that fetch's
/// Vary from its response head and, being another variant, goes to the member itself instead
/// of waiting for the slow body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_miss_of_another_variant_leaves_at_the_fetchs_head() {
    let s = setup(|req, n| {
        let lang = req.header("accept-language").unwrap_or("none").to_string();
        let mut r = Reply::ok(
            &format!("{lang}-{n}"),
            &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
        );
        if lang == "fr" {
            r.body_delay = Duration::from_secs(3);
        }
        r
    })
    .await;
    let vs = s.vs;
    let slow = tokio::spawn(async move { get_with(vs, "/w", &[("accept-language", "fr")]).await });
    assert!(
        wait_until(Duration::from_secs(5), || async { s.origin.count() == 1 }).await,
        "the slow fetch reached the member"
    );
    let de = get_with(s.vs, "/w", &[("accept-language", "de")]).await;
    assert_eq!(de.text(), "de-1");
    assert!(
        !slow.is_finished(),
        "the other variant did not wait for the slow body"
    );
    assert_eq!(slow.await.unwrap().text(), "fr-0");
    assert_eq!(
        get_with(s.vs, "/w", &[("accept-language", "fr")])
            .await
            .text(),
        "fr-0"
    );
    assert_eq!(s.origin.count(), 2);
}

/// Interim responses (103 Early Hints) a member sends before its final answer reach an
/// HTTP/1.1 client on the cached path too, and are not stored: a hit has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_responses_pass_through_on_a_miss_and_are_not_stored() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = fulcrum_testkit::bind_tcp(free_addr()).await.unwrap();
    let member = listener.local_addr().unwrap();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    let origin = tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let _ = c
                            .write_all(
                                b"HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\n\r\n",
                            )
                            .await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let _ = c
                            .write_all(
                                b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\n\
                                  content-length: 2\r\n\r\nok",
                            )
                            .await;
                    }
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    let vs = free_addr();
    let _f = start(&format!(
        "{}{}",
        service(vs, "cache = { size = \"1MiB\" }"),
        pool("p", &[member], "")
    ))
    .await;
    let ask = || async move {
        let mut s = tokio::net::TcpStream::connect(vs).await.unwrap();
        s.write_all(b"GET /e HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    };
    let miss = ask().await;
    assert!(
        miss.starts_with(
            "HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200"
        ),
        "{miss}"
    );
    assert!(miss.ends_with("ok"), "{miss}");
    let hit = ask().await;
    assert!(hit.starts_with("HTTP/1.1 200"), "{hit}");
    assert!(hit.contains("cache-status: fulcrum; hit"), "{hit}");
    assert!(!hit.contains("link:"), "{hit}");
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);
    origin.abort();
}
