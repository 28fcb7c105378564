//! The host driven by a filter written in the text format: every capability the HTTP plane
//! relies on, and every way a filter can fail, without a proxy around it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::abi::{encode_pairs, Pair};
use crate::{
    CallResponse, Chain, Filter, HttpCalls, Limits, OnError, OutgoingCall, Props, Spec, Verdict,
};

fn escaped(b: &[u8]) -> String {
    b.iter().map(|c| format!("\\{c:02x}")).collect()
}

/// A filter exercising the ABI: each request header below asks it for one behaviour.
fn module() -> String {
    let call_headers = encode_pairs(&[
        (b":path".to_vec(), b"/check".to_vec()),
        (b":method".to_vec(), b"GET".to_vec()),
        (b":authority".to_vec(), b"auth".to_vec()),
    ]);
    format!(
        r#"(module
  (import "env" "proxy_get_header_map_value" (func $get_hdr (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add_hdr (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_remove_header_map_value" (func $rm_hdr (param i32 i32 i32) (result i32)))
  (import "env" "proxy_send_local_response" (func $local (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $set_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_shared_data" (func $get_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_http_call" (func $call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_continue_stream" (func $continue (param i32) (result i32)))
  (import "env" "proxy_set_buffer_bytes" (func $set_buf (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $inc (param i32 i64) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32) (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.and (i32.add (i32.add (global.get $heap) (local.get $n)) (i32.const 7)) (i32.const -8)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.shr_u (local.get $n) (i32.const 16)) (i32.const 1))))))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $define (i32.const 0) (i32.const 1184) (i32.const 16) (i32.const 544)))
    (i32.const 1))
  (func $has (param $k i32) (param $kl i32) (result i32)
    (i32.eqz (call $get_hdr (i32.const 0) (local.get $k) (local.get $kl) (i32.const 512) (i32.const 516))))
  (func (export "proxy_on_request_headers") (param $ctx i32) (param $n i32) (param $eos i32) (result i32)
    (drop (call $inc (i32.load (i32.const 544)) (i64.const 1)))
    (if (call $has (i32.const 1024) (i32.const 6)) (then unreachable))
    (if (call $has (i32.const 1032) (i32.const 6)) (then (loop $l (br $l))))
    (if (call $has (i32.const 1040) (i32.const 6)) (then (loop $g (drop (memory.grow (i32.const 16))) (br $g))))
    (if (call $has (i32.const 1048) (i32.const 6)) (then
      (drop (call $local (i32.const 403) (i32.const 0) (i32.const 0) (i32.const 1056) (i32.const 6) (i32.const 0) (i32.const 0) (i32.const -1)))
      (return (i32.const 1))))
    (if (call $has (i32.const 1168) (i32.const 8)) (then (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))))
    (drop (call $add_hdr (i32.const 0) (i32.const 1064) (i32.const 8) (i32.const 1072) (i32.const 3)))
    (drop (call $rm_hdr (i32.const 0) (i32.const 1080) (i32.const 6)))
    (if (call $has (i32.const 1088) (i32.const 5)) (then
      (drop (call $set_shared (i32.const 1096) (i32.const 1) (i32.const 1100) (i32.const 2) (i32.const 0)))))
    (if (call $has (i32.const 1104) (i32.const 5)) (then
      (if (i32.eqz (call $get_shared (i32.const 1096) (i32.const 1) (i32.const 520) (i32.const 524) (i32.const 528)))
        (then (drop (call $add_hdr (i32.const 0) (i32.const 1112) (i32.const 8) (i32.load (i32.const 520)) (i32.load (i32.const 524))))))))
    (if (call $has (i32.const 1120) (i32.const 6)) (then
      (drop (call $call (i32.const 1128) (i32.const 4) (i32.const 2048) (i32.const {hlen}) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1000) (i32.const 532)))
      (return (i32.const 1))))
    (i32.const 0))
  (func (export "proxy_on_http_call_response") (param $ctx i32) (param $tok i32) (param $nh i32) (param $bs i32) (param $nt i32)
    (if (i32.eqz (call $get_hdr (i32.const 6) (i32.const 1136) (i32.const 7) (i32.const 536) (i32.const 540)))
      (then (if (i32.eq (i32.load8_u (i32.load (i32.const 536))) (i32.const 50))
        (then (drop (call $continue (i32.const 0))) (return)))))
    (drop (call $local (i32.const 401) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const -1))))
  (func (export "proxy_on_response_body") (param $ctx i32) (param $size i32) (param $eos i32) (result i32)
    (if (i32.eqz (local.get $eos)) (then (return (i32.const 1))))
    (drop (call $set_buf (i32.const 1) (i32.const 0) (local.get $size) (i32.const 1144) (i32.const 9)))
    (i32.const 0))
  (data (i32.const 1024) "x-trap")
  (data (i32.const 1032) "x-loop")
  (data (i32.const 1040) "x-grow")
  (data (i32.const 1048) "x-deny")
  (data (i32.const 1056) "denied")
  (data (i32.const 1064) "x-filter")
  (data (i32.const 1072) "yes")
  (data (i32.const 1080) "x-drop")
  (data (i32.const 1088) "x-set")
  (data (i32.const 1096) "k")
  (data (i32.const 1100) "v1")
  (data (i32.const 1104) "x-get")
  (data (i32.const 1112) "x-shared")
  (data (i32.const 1120) "x-auth")
  (data (i32.const 1128) "auth")
  (data (i32.const 1136) ":status")
  (data (i32.const 1144) "rewritten")
  (data (i32.const 1184) "test_requests_ok")
  (data (i32.const 1168) "x-libcio")
  (data (i32.const 2048) "{blob}")
)"#,
        hlen = call_headers.len(),
        blob = escaped(&call_headers),
    )
}

fn filter(name: &str, on_error: OnError, disable_after: u32) -> Arc<Filter> {
    Arc::new(
        Filter::new(Spec {
            name: name.into(),
            bytes: module().into_bytes(),
            config: b"cfg".to_vec(),
            on_error,
            limits: Limits {
                memory: 1 << 20,
                budget: Duration::from_millis(10),
            },
            disable_after,
            instances: 2,
        })
        .expect("the test filter loads"),
    )
}

struct Auth;

impl HttpCalls for Auth {
    fn call(
        &self,
        call: OutgoingCall,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<CallResponse>> + Send + '_>>
    {
        Box::pin(async move {
            let allowed = call.upstream == "auth"
                && call
                    .headers
                    .iter()
                    .any(|(k, v)| k == b":path" && v == b"/check");
            Some(CallResponse {
                headers: vec![(
                    b":status".to_vec(),
                    if allowed {
                        b"200".to_vec()
                    } else {
                        b"403".to_vec()
                    },
                )],
                body: Vec::new(),
            })
        })
    }
}

fn chain(f: Arc<Filter>) -> Arc<Chain> {
    Arc::new(Chain {
        filters: vec![f],
        calls: Some(Arc::new(Auth)),
    })
}

fn request(extra: &[(&str, &str)]) -> Vec<Pair> {
    let mut h: Vec<Pair> = vec![
        (b":method".to_vec(), b"GET".to_vec()),
        (b":path".to_vec(), b"/".to_vec()),
        (b":authority".to_vec(), b"example".to_vec()),
    ];
    h.extend(
        extra
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())),
    );
    h
}

fn value<'a>(h: &'a [Pair], name: &str) -> Option<&'a [u8]> {
    h.iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| &v[..])
}

async fn run(c: &Arc<Chain>, extra: &[(&str, &str)]) -> (Verdict, Vec<Pair>) {
    let mut s = c.stream(Props::default());
    let mut h = request(extra);
    let v = s.request_headers(&mut h, true).await;
    (v, h)
}

#[tokio::test]
async fn headers_are_added_and_removed_and_a_local_reply_ends_the_request() {
    let c = chain(filter("edit.wasm", OnError::FailClosed, 0));
    let (v, h) = run(&c, &[("x-drop", "1"), ("x-keep", "2")]).await;
    assert_eq!(v, Verdict::Continue);
    assert_eq!(value(&h, "x-filter"), Some(&b"yes"[..]));
    assert_eq!(value(&h, "x-drop"), None);
    assert_eq!(value(&h, "x-keep"), Some(&b"2"[..]));
    let (v, _) = run(&c, &[("x-deny", "1")]).await;
    match v {
        Verdict::Local(l) => assert_eq!((l.status, &l.body[..]), (403, &b"denied"[..])),
        v => panic!("expected a local reply, got {v:?}"),
    }
    assert_eq!(c.filters[0].stats.local_replies.load(Ordering::Relaxed), 1);
    let m = crate::metrics()
        .lock()
        .iter()
        .find(|m| m.name == "test_requests_ok")
        .cloned();
    assert!(
        m.expect("the filter's metric")
            .value
            .load(Ordering::Relaxed)
            >= 2
    );
}

#[tokio::test]
async fn a_trap_a_loop_and_unbounded_memory_fail_only_their_request_and_are_counted() {
    let f = filter("failing.wasm", OnError::FailClosed, 0);
    let c = chain(f.clone());
    for (header, why) in [
        ("x-trap", "trap"),
        ("x-loop", "budget"),
        ("x-grow", "memory"),
    ] {
        let (v, _) = run(&c, &[(header, "1")]).await;
        assert!(matches!(v, Verdict::Fail(_)), "{header}: {v:?}");
        // The next request, through whichever instance, is served.
        for _ in 0..2 {
            let (v, h) = run(&c, &[]).await;
            assert_eq!(v, Verdict::Continue, "after {why}");
            assert_eq!(value(&h, "x-filter"), Some(&b"yes"[..]));
        }
    }
    let s = &f.stats;
    assert_eq!(s.traps.load(Ordering::Relaxed), 1);
    assert_eq!(s.budget_exceeded.load(Ordering::Relaxed), 1);
    assert_eq!(s.memory_exceeded.load(Ordering::Relaxed), 1);
    assert_eq!(s.instance_restarts.load(Ordering::Relaxed), 3);
    assert!(!f.is_disabled());
    // A libc call the host does not answer links as a trap, and fails its request only.
    let (v, _) = run(&c, &[("x-libcio", "1")]).await;
    assert!(matches!(v, Verdict::Fail(_)));
}

#[tokio::test]
async fn fail_open_goes_on_without_the_filter_and_repeated_failures_disable_it() {
    let f = filter("open.wasm", OnError::FailOpen, 3);
    let c = chain(f.clone());
    let (v, h) = run(&c, &[("x-trap", "1")]).await;
    assert_eq!(v, Verdict::Continue);
    assert_eq!(
        value(&h, "x-filter"),
        None,
        "the failed filter's edits are not applied"
    );
    for _ in 0..2 {
        run(&c, &[("x-trap", "1")]).await;
    }
    assert!(f.is_disabled());
    let (v, h) = run(&c, &[("x-deny", "1")]).await;
    assert_eq!(v, Verdict::Continue, "a disabled filter is skipped");
    assert_eq!(value(&h, "x-filter"), None);

    let g = filter("closed.wasm", OnError::FailClosed, 1);
    let c = chain(g.clone());
    run(&c, &[("x-trap", "1")]).await;
    assert!(g.is_disabled());
    let (v, _) = run(&c, &[]).await;
    assert!(
        matches!(v, Verdict::Fail(_)),
        "fail_closed: refused while disabled"
    );
}

#[tokio::test]
async fn shared_data_set_in_one_instance_is_read_in_another() {
    let f = filter("shared.wasm", OnError::FailClosed, 0);
    let c = chain(f.clone());
    run(&c, &[("x-set", "1")]).await;
    // Streams go to the instances in turn: of the next two, one is the other instance.
    let mut seen = 0;
    for _ in 0..2 {
        let (_, h) = run(&c, &[("x-get", "1")]).await;
        if value(&h, "x-shared") == Some(&b"v1"[..]) {
            seen += 1;
        }
    }
    assert_eq!(seen, 2);
}

#[tokio::test]
async fn an_http_call_decides_the_request() {
    let c = chain(filter("auth.wasm", OnError::FailClosed, 0));
    let (v, h) = run(&c, &[("x-auth", "1")]).await;
    assert_eq!(v, Verdict::Continue);
    assert_eq!(value(&h, "x-filter"), Some(&b"yes"[..]));
    assert_eq!(c.filters[0].stats.http_calls.load(Ordering::Relaxed), 1);
    // Without an answer (no caller, or the pool does not answer) the filter denies.
    let denied = Arc::new(Chain {
        filters: c.filters.clone(),
        calls: None,
    });
    match run(&denied, &[("x-auth", "1")]).await.0 {
        Verdict::Local(l) => assert_eq!(l.status, 401),
        v => panic!("expected 401, got {v:?}"),
    }
}

#[tokio::test]
async fn a_streamed_body_is_held_back_and_rewritten_at_its_end() {
    let c = chain(filter("body.wasm", OnError::FailClosed, 0));
    let mut s = c.stream(Props::default());
    assert!(s.wants_response_body());
    let mut chunk = b"hello ".to_vec();
    s.response_body(&mut chunk, false).unwrap();
    assert!(chunk.is_empty(), "held back until the end");
    let mut chunk = b"world".to_vec();
    s.response_body(&mut chunk, true).unwrap();
    assert_eq!(chunk, b"rewritten");
}

#[test]
fn modules_that_are_not_filters_are_refused_with_the_reason() {
    let e = crate::check(b"(module (memory (export \"memory\") 1))", b"").unwrap_err();
    assert!(e.contains("ABI 0.2.1"), "{e}");
    let e = crate::check(b"not wasm at all", b"").unwrap_err();
    assert!(!e.is_empty());
    let info = crate::check(module().as_bytes(), b"").expect("the test filter");
    assert_eq!(info.abi, "proxy_abi_version_0_2_1");
    assert!(info
        .callbacks
        .iter()
        .any(|c| c == "proxy_on_request_headers"));
}

#[tokio::test]
async fn a_filter_built_from_c_by_clang_runs_as_committed() {
    let f = Filter::new(Spec {
        name: "filters/add_header.wasm".into(),
        bytes: include_bytes!("../filters/add_header.wasm").to_vec(),
        config: b"from-c".to_vec(),
        on_error: OnError::FailClosed,
        limits: Limits::default(),
        disable_after: 0,
        instances: 2,
    })
    .expect("the committed C filter loads");
    let c = chain(Arc::new(f));
    let (v, h) = run(&c, &[("x-internal", "secret")]).await;
    assert_eq!(v, Verdict::Continue);
    assert_eq!(value(&h, "x-filter"), Some(&b"from-c"[..]));
    assert_eq!(value(&h, "x-internal"), None);
    match run(&c, &[("x-deny", "1")]).await.0 {
        Verdict::Local(l) => assert_eq!((l.status, &l.body[..]), (403, &b"denied by filter\n"[..])),
        v => panic!("expected 403, got {v:?}"),
    }
}
