//! proxy-wasm filters (`fulcrum-wasm`) around a service's rules: the chain built from
//! `[[virtual_service.filter]]`, the heads as a filter sees them (pseudo-fields first, names
//! lower-case) and back, the response body as a transform beside compression, and the HTTP
//! calls filters make to pools.
//!
//! Filters are the outermost layer of a service: the request meets them before the rules (so a
//! filter may change what the rules see, or answer itself), the response after the member and
//! before Fulcrum's own response edits (persistence cookie, rule edits, compression).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use fulcrum_balance::{PickContext, Pool};
use fulcrum_wasm::{
    CallResponse, Chain, Filter, FilterStats, Head, HeadPairs, HttpCalls, Limits, LocalReply,
    OnError, OutgoingCall, Pair, Props, RequestLine, Spec, Stream, Verdict,
};
use http_body_util::{BodyExt, Full, Limited};
use parking_lot::Mutex;

use crate::client::{Alpn, Client};
use crate::head::{HeadError, Limits as HeadLimits, RequestHead, ResponseHead, Version};
use crate::local::Local;
use crate::tls::client::MemberTls;

/// The counters of a service's filters by module, kept across reloads with the service's other
/// HTTP counters.
#[derive(Default)]
pub struct FilterCounters(Mutex<Vec<(Arc<str>, Arc<FilterStats>)>>);

impl std::fmt::Debug for FilterCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.lock().iter().map(|(n, _)| n.clone()))
            .finish()
    }
}

impl FilterCounters {
    fn of(&self, name: &str) -> Arc<FilterStats> {
        let mut v = self.0.lock();
        if let Some((_, s)) = v.iter().find(|(n, _)| &**n == name) {
            return s.clone();
        }
        let s = Arc::new(FilterStats::default());
        v.push((name.into(), s.clone()));
        s
    }

    /// Every filter's counters, by module, in the order they were first loaded.
    pub fn all(&self) -> Vec<(Arc<str>, Arc<FilterStats>)> {
        self.0.lock().clone()
    }
}

/// Builds a service's chain: reads and compiles (or finds compiled) each module, starts its
/// instances with its configuration. `None` for a service without filters.
pub fn build_chain(
    filters: &[fulcrum_config::Filter],
    counters: &FilterCounters,
    pools: &[Arc<Pool>],
) -> Result<Option<Arc<Chain>>, String> {
    if filters.is_empty() {
        return Ok(None);
    }
    // One instance per worker thread: a stream's calls hold its instance's lock for the length
    // of one callback, so more instances than threads only cost memory.
    let instances = std::thread::available_parallelism().map_or(2, |n| n.get().min(16));
    let mut built = Vec::with_capacity(filters.len());
    for f in filters {
        let name = f.module.display().to_string();
        let bytes = std::fs::read(&f.module).map_err(|e| format!("filter module {name}: {e}"))?;
        let filter = Filter::new(Spec {
            name: name.clone(),
            root_id: f.root_id.clone(),
            bytes,
            config: f.config.clone().into_bytes(),
            on_error: match f.on_error {
                fulcrum_config::FilterOnError::FailClosed => OnError::FailClosed,
                fulcrum_config::FilterOnError::FailOpen => OnError::FailOpen,
            },
            limits: Limits {
                memory: usize::try_from(f.max_memory).unwrap_or(usize::MAX),
                budget: f.time_budget,
            },
            disable_after: f.disable_after,
            max_request_body: usize::try_from(f.max_request_body).unwrap_or(usize::MAX),
            instances,
            stats: counters.of(&name),
        })
        .map_err(|e| format!("filter module {name}: {e}"))?;
        built.push(Arc::new(filter));
    }
    let chain = Arc::new(Chain {
        filters: built,
        calls: Some(Arc::new(PoolCalls {
            pools: pools
                .iter()
                .map(|p| CallPool {
                    pool: p.clone(),
                    tls: std::sync::OnceLock::new(),
                })
                .collect(),
        })),
    });
    drive_background(&chain);
    Ok(Some(chain))
}

/// `proxy_on_tick` for the filters that asked for ticks (`proxy_set_tick_period_milliseconds`),
/// each at its own period, and `proxy_on_queue_ready` for the filters that take queue
/// notifications, for as long as the chain lives (a reload that replaces the service drops it,
/// and each task ends when it next looks).
fn drive_background(chain: &Arc<Chain>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    for (i, f) in chain.filters.iter().enumerate() {
        if let Some(period) = f.tick_period() {
            let weak = Arc::downgrade(chain);
            rt.spawn(async move {
                let mut every = tokio::time::interval(period);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every.tick().await;
                loop {
                    every.tick().await;
                    let Some(chain) = weak.upgrade() else { return };
                    let Some(f) = chain.filters.get(i).filter(|f| !f.is_disabled()) else {
                        continue;
                    };
                    f.tick();
                }
            });
        }
        if f.interest().queue_ready {
            let weak = Arc::downgrade(f);
            rt.spawn(async move {
                loop {
                    let Some(f) = weak.upgrade() else { return };
                    // Looks again after a while without items, to end once the filter is gone.
                    let ready = tokio::time::timeout(QUEUE_LOOK, f.queues_ready()).await;
                    if let Ok(queues) = ready {
                        if !f.is_disabled() {
                            f.queue_ready(&queues);
                        }
                    }
                }
            });
        }
    }
}

/// How long a queue task waits for items before it checks that its filter still exists.
const QUEUE_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// Opens a request's stream through the chain and runs the request-header callbacks over
/// `head`, which is rebuilt when a filter changed it. `Ok` carries the stream for the response
/// phase; `Err` the answer to give instead of forwarding (a filter's local reply, or 500 when a
/// filter failed closed).
pub(crate) async fn on_request(
    chain: &Arc<Chain>,
    service: &Arc<str>,
    head: &mut RequestHead,
    client: &Client,
    https: bool,
    limits: &HeadLimits,
) -> Result<Box<Stream>, Local> {
    let mut stream = Box::new(chain.stream(Props {
        source: Some(client.info.peer),
        destination: Some(client.info.local),
        virtual_service: service.clone(),
        sni: client.info.sni.as_deref().map(str::to_string),
        protocol: match (head.version, client.info.alpn) {
            (Version::Http2, _) | (_, Alpn::H2) => "HTTP/2",
            (Version::Http10, _) => "HTTP/1.0",
            _ => "HTTP/1.1",
        },
    }));
    if stream.wants_request_headers() {
        request_phase(&mut stream, head, https, limits).await?;
    }
    stream.keep_request_line(|| {
        RequestLine::new(
            head.method_bytes(),
            scheme_of(https),
            head.authority(),
            head.target(),
        )
    });
    Ok(stream)
}

/// The request-header callbacks over `head`, lent to them and rebuilt when one changed it.
async fn request_phase(
    stream: &mut Stream,
    head: &mut RequestHead,
    https: bool,
    limits: &HeadLimits,
) -> Result<(), Local> {
    let end_of_stream = !head.has_body();
    let mut lent = HeadPairs::lend(LentRequest {
        head: std::mem::take(head),
        https,
    });
    let verdict = stream.request_headers(&mut lent, end_of_stream).await;
    // The head comes back before anything else: a local answer is logged with it.
    let (back, pairs) = lent
        .take_back::<LentRequest>()
        .ok_or_else(|| failed("the request head was not handed back"))?;
    *head = back.head;
    match verdict {
        Verdict::Continue => {}
        Verdict::Local(l) => return Err(local_of(l)),
        Verdict::Fail(why) => return Err(failed(&why)),
    }
    if let Some(pairs) = pairs.filter(|_| stream.head_changed()) {
        *head = head
            .rebuilt(&pairs, limits)
            .map_err(|e| invalid(e, "request"))?;
    }
    Ok(())
}

/// Runs the request-body callbacks over the whole body, decoded; `Ok`: the body to forward,
/// `Err`: the answer to give instead (a filter's local reply, or 500 when one failed closed).
pub(crate) async fn on_request_body(
    stream: &mut Stream,
    mut body: Vec<u8>,
) -> Result<Vec<u8>, Local> {
    match stream.request_body(&mut body, true).await {
        Verdict::Continue => Ok(body),
        Verdict::Local(l) => Err(local_of(l)),
        Verdict::Fail(why) => Err(failed(&why)),
    }
}

/// The answer to a request whose body is larger than its filters read.
pub(crate) fn body_over_limit() -> Local {
    let mut l = Local::error(
        413,
        "request body larger than the filters' max_request_body",
    );
    l.close = true;
    l
}

/// Runs the response-header callbacks over `resp` (rebuilt when a filter changed it). `Err`:
/// answer this instead of the member's response.
pub(crate) async fn on_response(
    stream: &mut Stream,
    resp: &mut ResponseHead,
    pool: &Arc<str>,
    member: std::net::SocketAddr,
) -> Result<(), Local> {
    stream.set_upstream(Some(pool.clone()), Some(member));
    if !stream.wants_response_headers() {
        return Ok(());
    }
    let bodiless = resp.content_length == Some(0);
    let mut lent = HeadPairs::lend(LentResponse(std::mem::take(resp)));
    let verdict = stream.response_headers(&mut lent, bodiless).await;
    let (back, pairs) = lent
        .take_back::<LentResponse>()
        .ok_or_else(|| failed("the response head was not handed back"))?;
    *resp = back.0;
    match verdict {
        Verdict::Continue => {}
        Verdict::Local(l) => return Err(local_of(l)),
        Verdict::Fail(why) => return Err(failed(&why)),
    }
    if let Some(pairs) = pairs.filter(|_| stream.head_changed()) {
        *resp = resp.rebuilt(&pairs).map_err(|e| invalid(e, "response"))?;
    }
    Ok(())
}

/// A response head held as `http` types (an answer of the cache), lent to the filters of the
/// response phase.
pub(crate) struct LentMap {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
}

/// `:status`, then the fields.
impl Head for LentMap {
    fn pairs(&self) -> Vec<Pair> {
        let status = (
            b":status".to_vec(),
            self.status.as_str().as_bytes().to_vec(),
        );
        pairs_of(Some(status), &self.headers)
    }

    fn count(&self) -> usize {
        1 + self.headers.len()
    }
}

/// A header map as filters see it, after `first` (a pseudo-field) when given.
pub(crate) fn pairs_of(first: Option<Pair>, map: &http::HeaderMap) -> Vec<Pair> {
    let mut pairs = Vec::with_capacity(map.len() + 1);
    pairs.extend(first);
    pairs.extend(
        map.iter()
            .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())),
    );
    pairs
}

/// A response head from pairs (`:status`, then fields); `None` when a filter left a name,
/// value or status that is not valid.
pub(crate) fn map_of(pairs: &[Pair]) -> Option<(Option<http::StatusCode>, http::HeaderMap)> {
    let mut status = None;
    let mut map = http::HeaderMap::with_capacity(pairs.len());
    for (n, v) in pairs {
        if n == b":status" {
            status = Some(http::StatusCode::from_bytes(v).ok()?);
        } else if !n.starts_with(b":") {
            map.append(
                http::HeaderName::from_bytes(n).ok()?,
                http::HeaderValue::from_bytes(v).ok()?,
            );
        }
    }
    Some((status, map))
}

pub(crate) fn failed(why: &str) -> Local {
    tracing::debug!("{why}");
    Local::error(500, "a filter failed")
}

fn invalid(e: HeadError, what: &str) -> Local {
    tracing::warn!("a filter left an invalid {what} head: {}", e.reason);
    Local::error(500, "a filter left an invalid head")
}

/// A filter's `proxy_send_local_response` as the proxy's own answer.
pub(crate) fn local_of(l: LocalReply) -> Local {
    let status = if (100..1000).contains(&l.status) {
        l.status
    } else {
        500
    };
    Local {
        status,
        location: None,
        body: Bytes::from(l.body),
        retry_after: false,
        close: false,
        fields: l.headers,
    }
}

fn lower(name: &[u8]) -> Vec<u8> {
    name.to_ascii_lowercase()
}

/// The request head lent to the filters of the request phase, with the scheme they see.
struct LentRequest {
    head: RequestHead,
    https: bool,
}

fn scheme_of(https: bool) -> &'static [u8] {
    if https {
        b"https"
    } else {
        b"http"
    }
}

impl LentRequest {
    /// `:method`, `:scheme`, `:authority` (none without a host) and `:path`, in that order.
    fn pseudo_fields(&self) -> [(&'static [u8], Option<&[u8]>); 4] {
        let head = &self.head;
        [
            (b":method", Some(head.method_bytes())),
            (b":scheme", Some(scheme_of(self.https))),
            (b":authority", head.authority()),
            (b":path", Some(head.target())),
        ]
    }

    /// The fields filters see (Host is `:authority`).
    fn fields(&self) -> impl Iterator<Item = &crate::head::Field> {
        let head = &self.head;
        head.fields
            .iter()
            .filter(move |f| !head.name(f).eq_ignore_ascii_case(b"host"))
    }
}

/// The request head as filters see it: `:method`, `:scheme`, `:authority`, `:path`, then the
/// fields.
impl Head for LentRequest {
    fn pairs(&self) -> Vec<Pair> {
        let head = &self.head;
        let mut pairs = Vec::with_capacity(head.fields.len() + 4);
        for (name, value) in self.pseudo_fields() {
            if let Some(v) = value {
                pairs.push((name.to_vec(), v.to_vec()));
            }
        }
        pairs.extend(
            self.fields()
                .map(|f| (lower(head.name(f)), head.value(f).to_vec())),
        );
        pairs
    }

    fn count(&self) -> usize {
        let pseudo = self
            .pseudo_fields()
            .iter()
            .filter(|(_, v)| v.is_some())
            .count();
        pseudo + self.fields().count()
    }

    fn pseudo(&self, name: &[u8]) -> Option<Vec<u8>> {
        let (_, value) = self.pseudo_fields().into_iter().find(|(n, _)| *n == name)?;
        value.map(<[u8]>::to_vec)
    }
}

/// The response head lent to the filters of the response phase.
struct LentResponse(ResponseHead);

/// The response head as filters see it: `:status`, then the member's fields.
impl Head for LentResponse {
    fn pairs(&self) -> Vec<Pair> {
        let resp = &self.0;
        let mut pairs = Vec::with_capacity(resp.fields.len() + 1);
        pairs.push((b":status".to_vec(), status_text(resp.status)));
        pairs.extend(
            resp.fields
                .iter()
                .map(|f| (lower(resp.name(f)), resp.value(f).to_vec())),
        );
        pairs
    }

    fn count(&self) -> usize {
        1 + self.0.fields.len()
    }

    fn pseudo(&self, name: &[u8]) -> Option<Vec<u8>> {
        (name == b":status").then(|| status_text(self.0.status))
    }
}

fn status_text(status: u16) -> Vec<u8> {
    itoa::Buffer::new().format(status).as_bytes().to_vec()
}

/// The response body through the filters that read it, as a transform with the interface of
/// the compressor's (`compress::Stream`): input in, output waiting to be drained. A filter that
/// fails closed makes `write` / `finish` fail, which cuts the response.
pub struct FilterBody {
    stream: Box<Stream>,
    out: Vec<u8>,
    /// The length the client was told (the member's, kept), which the filters must keep.
    length: Option<u64>,
    produced: u64,
}

impl FilterBody {
    pub(crate) fn new(stream: Box<Stream>) -> FilterBody {
        FilterBody {
            stream,
            out: Vec::new(),
            length: None,
            produced: 0,
        }
    }

    /// Holds the filters to the body length the client is told, if it is told one.
    pub(crate) fn held_to(mut self, length: Option<u64>) -> FilterBody {
        self.length = length;
        self
    }

    fn run(&mut self, data: &[u8], end: bool) -> std::io::Result<()> {
        let mut chunk = data.to_vec();
        self.stream
            .response_body(&mut chunk, end)
            .map_err(std::io::Error::other)?;
        self.produced += chunk.len() as u64;
        if let Some(n) = self.length {
            if self.produced > n || (end && self.produced != n) {
                tracing::warn!(
                    "a filter changed a response body's length but left its content-length \
                     (a filter that changes the length removes it in the response-header \
                     phase): the response is cut"
                );
                return Err(std::io::Error::other("a filter broke the body's length"));
            }
        }
        if self.out.is_empty() {
            self.out = chunk;
        } else {
            self.out.extend_from_slice(&chunk);
        }
        Ok(())
    }

    pub fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.run(data, false)
    }

    pub fn finish(&mut self) -> std::io::Result<()> {
        self.run(&[], true)
    }

    /// Runs the filters' `proxy_on_response_trailers` over `t`, rebuilt from what they leave
    /// (a field a filter made invalid is dropped, with a warning).
    pub fn trailers(&mut self, t: &mut http::HeaderMap) -> std::io::Result<()> {
        if !self.stream.wants_response_trailers() {
            return Ok(());
        }
        let mut pairs = pairs_of(None, t);
        self.stream
            .response_trailers(&mut pairs)
            .map_err(std::io::Error::other)?;
        t.clear();
        for (n, v) in pairs {
            match (
                http::HeaderName::from_bytes(&n),
                http::HeaderValue::from_bytes(&v),
            ) {
                (Ok(n), Ok(v)) => {
                    t.append(n, v);
                }
                _ => tracing::warn!("a filter left an invalid trailer field; it is dropped"),
            }
        }
        Ok(())
    }

    /// The output waiting to be sent.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }
}

/// The most bytes of an HTTP call's response body handed to the filter.
const MAX_CALL_BODY: usize = 1 << 20;

/// `proxy_http_call`: the request goes to a member of the pool the call names (chosen by the
/// pool's scheduler, another member tried once if the first cannot be reached), over HTTP/1.1,
/// in TLS when the pool has `tls`.
struct PoolCalls {
    pools: Vec<CallPool>,
}

struct CallPool {
    pool: Arc<Pool>,
    /// The pool's TLS client, loaded at its first call (most pools are never called).
    tls: std::sync::OnceLock<Option<Arc<MemberTls>>>,
}

impl CallPool {
    /// `Err` when the pool has `tls` that does not load (its files changed since the check).
    fn tls(&self) -> Result<Option<&MemberTls>, ()> {
        let loaded = self.tls.get_or_init(|| {
            let cfg = self.pool.config.tls.as_ref()?;
            match MemberTls::load(cfg, false, "pool") {
                Ok(t) => Some(Arc::new(t)),
                Err((k, m)) => {
                    tracing::warn!(pool = %self.pool.name, "filter HTTP calls: {k}: {m}");
                    None
                }
            }
        });
        match (loaded, &self.pool.config.tls) {
            (Some(t), _) => Ok(Some(t)),
            (None, Some(_)) => Err(()),
            (None, None) => Ok(None),
        }
    }
}

impl HttpCalls for PoolCalls {
    fn call(
        &self,
        call: OutgoingCall,
    ) -> Pin<Box<dyn Future<Output = Option<CallResponse>> + Send + '_>> {
        Box::pin(async move {
            let Some(called) = self.pools.iter().find(|p| *p.pool.name == *call.upstream) else {
                tracing::warn!(pool = %call.upstream, "a filter called a pool that is not configured");
                return None;
            };
            let (pool, tls) = (&called.pool, called.tls().ok()?);
            let request = call_request(&call)?;
            let mut tried = Vec::new();
            for _ in 0..2 {
                let picked = pool.pick(&PickContext::default(), &tried)?;
                tried.push(picked.index);
                let _guard = picked.member.open_request();
                let answer = call_member(
                    picked.member.address,
                    tls,
                    pool.config.connect_timeout,
                    request.clone(),
                )
                .await;
                match answer {
                    Ok(r) => {
                        picked.member.record_exchange_success();
                        return Some(r);
                    }
                    Err(e) => {
                        picked
                            .member
                            .record_passive_failure("a filter's HTTP call failed");
                        tracing::debug!(member = %picked.member.address, "filter HTTP call: {e}");
                    }
                }
            }
            None
        })
    }
}

/// The call's request: `:method`, `:path` and `:authority` are required (as Envoy requires
/// them).
fn call_request(call: &OutgoingCall) -> Option<http::Request<Full<Bytes>>> {
    let get = |n: &[u8]| {
        call.headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_slice())
    };
    let (Some(method), Some(path), Some(authority)) =
        (get(b":method"), get(b":path"), get(b":authority"))
    else {
        tracing::warn!(pool = %call.upstream, "a filter's HTTP call lacks :method, :path or :authority");
        return None;
    };
    let mut b = http::Request::builder()
        .method(http::Method::from_bytes(method).ok()?)
        .uri(http::Uri::try_from(path).ok()?)
        .header(http::header::HOST, authority);
    for (n, v) in call.headers.iter().filter(|(n, _)| !n.starts_with(b":")) {
        b = b.header(n.as_slice(), v.as_slice());
    }
    b.body(Full::new(Bytes::from(call.body.clone()))).ok()
}

async fn call_member(
    addr: std::net::SocketAddr,
    tls: Option<&MemberTls>,
    connect_timeout: std::time::Duration,
    request: http::Request<Full<Bytes>>,
) -> Result<CallResponse, crate::BoxError> {
    let tcp = crate::upstream::connect(None, None, addr, connect_timeout).await?;
    let _ = tcp.set_nodelay(true);
    let io = crate::upstream::secure(tcp, tls, addr, connect_timeout).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    let driver = tokio::spawn(conn);
    let resp = send.send_request(request).await?;
    let (parts, body) = resp.into_parts();
    let body = Limited::new(body, MAX_CALL_BODY)
        .collect()
        .await?
        .to_bytes();
    driver.abort();
    let mut headers = Vec::with_capacity(parts.headers.len() + 1);
    headers.push((
        b":status".to_vec(),
        parts.status.as_str().as_bytes().to_vec(),
    ));
    for (n, v) in &parts.headers {
        headers.push((n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()));
    }
    Ok(CallResponse {
        headers,
        body: body.to_vec(),
    })
}
