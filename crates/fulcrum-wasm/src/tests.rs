//! The host driven by a filter written in the text format: every capability the HTTP plane
//! relies on, and every way a filter can fail, without a proxy around it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::abi::Pair;
use crate::{
    CallResponse, Chain, Filter, HeadPairs, HttpCalls, Limits, OnError, OutgoingCall, Props, Spec,
    Verdict,
};

/// A filter exercising the ABI: each request header asks it for one behaviour (its comments
/// list them). The binary's tests load the same file.
fn module() -> String {
    include_str!("../filters/probe.wat").to_string()
}

fn filter(name: &str, on_error: OnError, disable_after: u32) -> Arc<Filter> {
    Arc::new(
        Filter::new(Spec {
            root_id: String::new(),
            name: name.into(),
            bytes: module().into_bytes(),
            config: b"cfg".to_vec(),
            on_error,
            limits: Limits {
                memory: 1 << 20,
                budget: Duration::from_millis(10),
            },
            disable_after,
            max_request_body: 1 << 20,
            instances: 2,
            stats: Default::default(),
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

/// A head held as a list of pairs, lent as the proxy lends its own.
struct Listed(Vec<Pair>);

impl crate::Head for Listed {
    fn pairs(&self) -> Vec<Pair> {
        self.0.clone()
    }

    fn count(&self) -> usize {
        self.0.len()
    }
}

fn lend(pairs: Vec<Pair>) -> HeadPairs {
    HeadPairs::lend(Listed(pairs))
}

/// What the filters left of a lent head: their pairs when they built them, else the head.
fn seen(h: HeadPairs) -> Vec<Pair> {
    let (head, pairs) = h.take_back::<Listed>().expect("a list of pairs was lent");
    pairs.unwrap_or(head.0)
}

fn value<'a>(h: &'a [Pair], name: &str) -> Option<&'a [u8]> {
    h.iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| &v[..])
}

async fn run(c: &Arc<Chain>, extra: &[(&str, &str)]) -> (Verdict, Vec<Pair>) {
    let mut s = c.stream(Props::default());
    let mut h = lend(request(extra));
    let v = s.request_headers(&mut h, true).await;
    (v, seen(h))
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
    let mut h = lend(request(&[("x-rewrite", "1")]));
    assert_eq!(s.request_headers(&mut h, true).await, Verdict::Continue);
    let mut chunk = b"hello ".to_vec();
    s.response_body(&mut chunk, false).unwrap();
    assert!(chunk.is_empty(), "held back until the end");
    let mut chunk = b"world".to_vec();
    s.response_body(&mut chunk, true).unwrap();
    assert_eq!(chunk, b"rewritten");
}

#[tokio::test]
async fn a_streamed_body_is_rewritten_piece_by_piece_or_passed_untouched() {
    let c = chain(filter("upper.wasm", OnError::FailClosed, 0));
    let mut s = c.stream(Props::default());
    let mut h = lend(request(&[("x-upper", "1")]));
    assert_eq!(s.request_headers(&mut h, true).await, Verdict::Continue);
    for (piece, end) in [(&b"hello "[..], false), (&b"world!"[..], true)] {
        let mut chunk = piece.to_vec();
        s.response_body(&mut chunk, end).unwrap();
        assert_eq!(chunk, piece.to_ascii_uppercase(), "each piece as it comes");
    }
    let mut s = c.stream(Props::default());
    let mut h = lend(request(&[]));
    assert_eq!(s.request_headers(&mut h, true).await, Verdict::Continue);
    let mut chunk = b"as is".to_vec();
    s.response_body(&mut chunk, false).unwrap();
    assert_eq!(chunk, b"as is");
}

#[test]
fn modules_that_are_not_filters_are_refused_with_the_reason() {
    let e = crate::check(b"(module (memory (export \"memory\") 1))", "", b"").unwrap_err();
    assert!(e.contains("ABI 0.2.1"), "{e}");
    let e = crate::check(b"not wasm at all", "", b"").unwrap_err();
    assert!(!e.is_empty());
    let info = crate::check(module().as_bytes(), "", b"").expect("the test filter");
    assert_eq!(info.abi, "proxy_abi_version_0_2_1");
    assert!(info
        .callbacks
        .iter()
        .any(|c| c == "proxy_on_request_headers"));
}

#[tokio::test]
async fn a_filter_built_from_c_by_clang_runs_as_committed() {
    let f = Filter::new(Spec {
        config: b"from-c".to_vec(),
        instances: 2,
        ..Spec::of(
            "filters/add_header.wasm",
            include_bytes!("../filters/add_header.wasm").to_vec(),
        )
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

/// A head that counts how often its pairs are built.
struct CountedHead {
    pairs: Vec<Pair>,
    built: Arc<std::sync::atomic::AtomicUsize>,
}

impl crate::Head for CountedHead {
    fn pairs(&self) -> Vec<Pair> {
        self.built.fetch_add(1, Ordering::Relaxed);
        self.pairs.clone()
    }

    fn count(&self) -> usize {
        self.pairs.len()
    }
}

fn filter_of(name: &str, wat: &str) -> Arc<Filter> {
    Arc::new(Filter::new(Spec::of(name, wat.as_bytes().to_vec())).expect("the test filter loads"))
}

#[tokio::test]
async fn header_pairs_are_built_only_when_a_filter_reads_them_and_once_per_chain() {
    // What an SDK-built filter that ignores headers looks like: the callback is exported and
    // returns Continue.
    let ignoring = filter_of(
        "ignoring",
        r#"(module
             (memory (export "memory") 1)
             (func (export "proxy_abi_version_0_2_1"))
             (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
             (func (export "proxy_on_context_create") (param i32 i32))
             (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
               (i32.const 0)))"#,
    );
    let built = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let lend = || {
        HeadPairs::lend(CountedHead {
            pairs: request(&[("x-drop", "1")]),
            built: built.clone(),
        })
    };
    let c = Arc::new(Chain {
        filters: vec![ignoring.clone()],
        calls: None,
    });
    let mut s = c.stream(Props::default());
    let mut h = lend();
    assert_eq!(s.request_headers(&mut h, true).await, Verdict::Continue);
    assert_eq!(built.load(Ordering::Relaxed), 0, "nobody looked");
    assert!(!s.head_changed());
    let (head, pairs) = h.take_back::<CountedHead>().expect("the head comes back");
    assert!(pairs.is_none());
    assert_eq!(head.pairs.len(), 4);

    // Two filters that read and change the head: built once, the second sees the first's
    // change, and the ignoring filter between them changes nothing.
    let probe = filter("probe", OnError::FailClosed, 0);
    let c = Arc::new(Chain {
        filters: vec![probe.clone(), ignoring, probe],
        calls: None,
    });
    let mut s = c.stream(Props::default());
    let mut h = lend();
    assert_eq!(s.request_headers(&mut h, true).await, Verdict::Continue);
    assert_eq!(built.load(Ordering::Relaxed), 1);
    assert!(s.head_changed());
    let (_, pairs) = h.take_back::<CountedHead>().expect("the head comes back");
    let pairs = pairs.expect("built");
    assert_eq!(
        pairs.iter().filter(|(k, _)| k == b"x-filter").count(),
        2,
        "{pairs:?}"
    );
    assert!(value(&pairs, "x-drop").is_none(), "{pairs:?}");
}

#[tokio::test]
async fn request_properties_are_read_after_the_request_phase() {
    // On its response head, the filter copies the property request.path into x-path.
    let f = filter_of(
        "path_on_response.wat",
        include_str!("../filters/path_on_response.wat"),
    );
    let c = Arc::new(Chain {
        filters: vec![f],
        calls: None,
    });
    let response = || lend(vec![(b":status".to_vec(), b"200".to_vec())]);

    let mut s = c.stream(Props::default());
    s.keep_request_line(|| {
        crate::RequestLine::new(b"GET", b"https", Some(b"example"), b"/the/path?q=1")
    });
    let mut h = response();
    assert_eq!(s.response_headers(&mut h, true).await, Verdict::Continue);
    let h = seen(h);
    assert_eq!(value(&h, "x-path"), Some(&b"/the/path?q=1"[..]), "{h:?}");

    // Without a kept request line the property is not found, and the filter adds nothing.
    let mut s = c.stream(Props::default());
    let mut h = response();
    assert_eq!(s.response_headers(&mut h, true).await, Verdict::Continue);
    assert_eq!(value(&seen(h), "x-path"), None);
}

#[test]
fn a_request_line_answers_each_pseudo_field_and_no_authority_when_it_had_none() {
    let l = crate::RequestLine::new(b"POST", b"http", None, b"/");
    assert_eq!(l.get(b":method"), Some(&b"POST"[..]));
    assert_eq!(l.get(b":scheme"), Some(&b"http"[..]));
    assert_eq!(l.get(b":authority"), None);
    assert_eq!(l.get(b":path"), Some(&b"/"[..]));
    assert_eq!(l.get(b"host"), None);
    let l = crate::RequestLine::new(b"GET", b"https", Some(b"a.test:8443"), b"/x");
    assert_eq!(l.get(b":authority"), Some(&b"a.test:8443"[..]));
    assert_eq!(l.get(b":path"), Some(&b"/x"[..]));
}
