//! Response compression (`compression` on a virtual service): gzip, deflate (zlib format, as
//! RFC 9110 §8.4.1.2 defines it), brotli and zstd, negotiated per request from Accept-Encoding.
//!
//! ```text
//!   response head ─▶ Compressor::plan(request, response)
//!        Identity  (not eligible: fields untouched, body relayed as usual: the fast path)
//!        Vary      (eligible, but the client accepts none of the algorithms: Vary added only)
//!        Encode(c) ─▶ fields rewritten (Content-Encoding, Vary, weak ETag; Content-Length and
//!                     Accept-Ranges dropped) ─▶ body streamed through an Encoder
//! ```
//!
//! The body is never buffered whole: each piece the member sends is fed to the encoder as it
//! arrives; the encoder's output goes to the client when it reaches a chunk's worth, and is
//! flushed (a sync flush, a few bytes) whenever the member has nothing more to read right now, so
//! a slow or streaming member's bytes reach the client decodable without waiting for the end.
//! Memory per stream is bounded by the algorithms' windows: 32 KiB for deflate, brotli's and
//! zstd's windows are capped here (`BROTLI_LGWIN`, `ZSTD_WINDOW_LOG`).

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use fulcrum_config::CompressionAlgorithm as Algo;

use crate::chunked;
use crate::head::{list_items, RequestHead, ResponseHead};
use crate::sink::Sink;

/// Encoder output is sent on once it reaches this much.
const OUT_CHUNK: usize = 32 * 1024;
/// Brotli window: 2^19 = 512 KiB (nginx's brotli module uses the same; the format allows 16 MiB).
const BROTLI_LGWIN: u32 = 19;
/// Zstandard window: 2^19 = 512 KiB, so a stream's memory stays bounded whatever the level.
const ZSTD_WINDOW_LOG: u32 = 19;

/// Algorithms in the order of `CompressStats::responses`.
pub const ALGORITHMS: [Algo; 4] = [Algo::Gzip, Algo::Deflate, Algo::Br, Algo::Zstd];

fn index(a: Algo) -> usize {
    match a {
        Algo::Gzip => 0,
        Algo::Deflate => 1,
        Algo::Br => 2,
        Algo::Zstd => 3,
    }
}

/// Counters of a service's compressors (kept across reloads with the service's HTTP counters).
#[derive(Debug, Default)]
pub struct CompressStats {
    /// Body bytes fed to the encoders.
    pub bytes_in: AtomicU64,
    /// Encoded bytes they produced.
    pub bytes_out: AtomicU64,
    /// Responses compressed, by algorithm (indexes of [`ALGORITHMS`]).
    pub responses: [AtomicU64; 4],
}

impl CompressStats {
    pub fn responses_of(&self, a: Algo) -> u64 {
        self.responses[index(a)].load(Ordering::Relaxed)
    }
}

/// One content-type pattern of `types`.
#[derive(Debug, Clone)]
enum TypePattern {
    Any,
    /// `text/*`: the type with its slash, lower case.
    Prefix(String),
    Exact(String),
}

/// A service's compression settings, compiled.
#[derive(Debug)]
pub struct Compressor {
    /// Configured algorithms in preference order, with their levels.
    order: Vec<(Algo, i32)>,
    min_size: u64,
    types: Vec<TypePattern>,
}

/// An algorithm and its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coding {
    pub algo: Algo,
    pub level: i32,
}

/// What to do with one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Plan {
    /// Pass the response as it is.
    #[default]
    Identity,
    /// Compressible, but not for this client: only `Vary: Accept-Encoding` is added, so caches
    /// do not hand this identity response to clients that would get it compressed.
    Vary,
    Encode(Coding),
}

impl Plan {
    /// Whether the response's fields are rewritten.
    #[inline]
    pub fn edits(self) -> bool {
        !matches!(self, Plan::Identity)
    }
    #[inline]
    pub fn coding(self) -> Option<Coding> {
        match self {
            Plan::Encode(c) => Some(c),
            _ => None,
        }
    }
}

impl Compressor {
    pub fn new(c: &fulcrum_config::Compression) -> Compressor {
        let mut order = Vec::new();
        for &a in &c.algorithms {
            if order.iter().any(|(b, _)| *b == a) {
                continue;
            }
            let level = match a {
                Algo::Gzip => c.levels.gzip as i32,
                Algo::Deflate => c.levels.deflate as i32,
                Algo::Br => c.levels.br as i32,
                Algo::Zstd => c.levels.zstd,
            };
            order.push((a, level));
        }
        let types = c
            .types
            .iter()
            .map(|t| {
                let t = t.trim().to_ascii_lowercase();
                if t == "*" || t == "*/*" {
                    TypePattern::Any
                } else if let Some(p) = t.strip_suffix('*') {
                    TypePattern::Prefix(p.to_string())
                } else {
                    TypePattern::Exact(t)
                }
            })
            .collect();
        Compressor {
            order,
            min_size: c.min_size,
            types,
        }
    }

    /// Decides how `resp`, the answer to `req`, goes to the client. `bodiless`: the response
    /// has no body whatever its fields say (HEAD, 1xx, 204, 304).
    pub fn plan(&self, req: &RequestHead, resp: &ResponseHead, bodiless: bool) -> Plan {
        if bodiless || resp.status == 206 || resp.status < 200 {
            return Plan::Identity;
        }
        if resp.content_length.is_some_and(|n| n < self.min_size) {
            return Plan::Identity;
        }
        let mut type_ok = false;
        for f in &resp.fields {
            let name = resp.name(f);
            let value = resp.value(f);
            if name.eq_ignore_ascii_case(b"content-encoding") {
                if list_items(value).any(|c| !c.eq_ignore_ascii_case(b"identity")) {
                    return Plan::Identity;
                }
            } else if name.eq_ignore_ascii_case(b"cache-control") {
                if list_items(value).any(|d| d.eq_ignore_ascii_case(b"no-transform")) {
                    return Plan::Identity;
                }
            } else if name.eq_ignore_ascii_case(b"content-range") {
                return Plan::Identity;
            } else if name.eq_ignore_ascii_case(b"content-type") {
                type_ok = self.type_matches(value);
            }
        }
        if !type_ok {
            return Plan::Identity;
        }
        match negotiate(&self.order, req.values_named(b"accept-encoding")) {
            Some(c) => Plan::Encode(c),
            None => Plan::Vary,
        }
    }

    fn type_matches(&self, value: &[u8]) -> bool {
        let media = value.split(|b| *b == b';').next().unwrap_or_default();
        let media = trim(media);
        let Ok(media) = std::str::from_utf8(media) else {
            return false;
        };
        self.types.iter().any(|p| match p {
            TypePattern::Any => true,
            TypePattern::Prefix(pre) => {
                media.len() > pre.len()
                    && media.as_bytes()[..pre.len()].eq_ignore_ascii_case(pre.as_bytes())
            }
            TypePattern::Exact(t) => media.eq_ignore_ascii_case(t),
        })
    }
}

/// Optional whitespace around list elements and parameters.
fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Reads a qvalue (RFC 9110 §12.4.2) as thousandths; `None` when malformed.
fn qvalue(v: &[u8]) -> Option<u16> {
    let (int, frac) = match v.iter().position(|b| *b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// Picks the coding for a request's Accept-Encoding fields (RFC 9110 §12.5.3): among the
/// configured algorithms the client accepts (named, or covered by `*`, with q > 0), those with
/// the highest q; ties go to the configured order. No compression when the client sent no
/// Accept-Encoding, accepts none of them, or ranks `identity` above the best of them.
pub fn negotiate<'a>(
    order: &[(Algo, i32)],
    fields: impl Iterator<Item = &'a [u8]>,
) -> Option<Coding> {
    // q of each configured algorithm as named by the client (u16::MAX: not named).
    const UNNAMED: u16 = u16::MAX;
    let mut named = [UNNAMED; 4];
    let mut star = UNNAMED;
    let mut identity = UNNAMED;
    let mut seen = false;
    for v in fields {
        seen = true;
        for item in list_items(v) {
            let mut parts = item.split(|b| *b == b';');
            let coding = trim(parts.next().unwrap_or_default());
            let mut q = 1000;
            for p in parts {
                let p = trim(p);
                if p.len() >= 2 && p[..2].eq_ignore_ascii_case(b"q=") {
                    // A malformed weight makes the element unusable, not the whole field.
                    q = qvalue(&p[2..]).unwrap_or(0);
                }
            }
            let slot = if coding == b"*" {
                &mut star
            } else if coding.eq_ignore_ascii_case(b"identity") {
                &mut identity
            } else if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip")
            {
                &mut named[index(Algo::Gzip)]
            } else if coding.eq_ignore_ascii_case(b"deflate") {
                &mut named[index(Algo::Deflate)]
            } else if coding.eq_ignore_ascii_case(b"br") {
                &mut named[index(Algo::Br)]
            } else if coding.eq_ignore_ascii_case(b"zstd") {
                &mut named[index(Algo::Zstd)]
            } else {
                continue;
            };
            // A coding listed twice keeps its highest weight.
            *slot = if *slot == UNNAMED { q } else { (*slot).max(q) };
        }
    }
    if !seen {
        return None;
    }
    let mut best: Option<(u16, Coding)> = None;
    for &(algo, level) in order {
        let q = match named[index(algo)] {
            UNNAMED if star != UNNAMED => star,
            UNNAMED => 0,
            q => q,
        };
        if q > 0 && best.is_none_or(|(b, _)| q > b) {
            best = Some((q, Coding { algo, level }));
        }
    }
    let (q, coding) = best?;
    // identity stays acceptable unless excluded; only an explicit higher weight wins over the
    // codings (a bare "gzip, identity" still gets gzip: equal weights, the server's choice).
    if identity != UNNAMED && identity > q {
        return None;
    }
    Some(coding)
}

impl crate::fields::FieldEdits for Plan {
    fn edits(self) -> bool {
        Plan::edits(self)
    }
    fn rewrite_field<S: Sink>(self, out: &mut S, name: &[u8], value: &[u8]) -> bool {
        rewrite_field(out, self, name, value)
    }
    fn write_added_fields<S: Sink>(self, out: &mut S, resp: &ResponseHead) {
        write_added_fields(out, self, resp)
    }
}

/// Writes the response fields a compressed (or Vary-only) response needs instead of the
/// member's. Called for each member field that `write_response_fields` is about to copy:
/// returns true when this function took care of it (rewrote or dropped it).
fn rewrite_field<S: Sink>(out: &mut S, plan: Plan, name: &[u8], value: &[u8]) -> bool {
    if name.eq_ignore_ascii_case(b"vary") {
        // Written merged at the end (`write_added_fields`).
        return true;
    }
    if plan.coding().is_none() {
        return false;
    }
    if name.eq_ignore_ascii_case(b"content-encoding") || name.eq_ignore_ascii_case(b"accept-ranges")
    {
        // "identity" only (anything else is not compressed); ranges of the encoded body are
        // not served.
        return true;
    }
    if name.eq_ignore_ascii_case(b"etag") {
        // The encoded representation is not byte-identical to the member's: a strong validator
        // becomes weak (RFC 9110 §8.8.1), so a later conditional request still validates.
        out.begin(name);
        if !value.starts_with(b"W/") {
            out.push(b"W/");
        }
        out.push(value);
        out.end();
        return true;
    }
    false
}

/// Writes Content-Encoding and the merged Vary after the member's fields.
fn write_added_fields<S: Sink>(out: &mut S, plan: Plan, resp: &ResponseHead) {
    if let Some(c) = plan.coding() {
        out.field(b"content-encoding", c.algo.as_str().as_bytes());
    }
    let values = resp
        .fields
        .iter()
        .filter(|f| resp.name(f).eq_ignore_ascii_case(b"vary"))
        .map(|f| resp.value(f))
        .filter(|v| !trim(v).is_empty());
    out.begin(b"vary");
    let mut covered = false;
    let mut first = true;
    for v in values {
        covered |= list_items(v).any(|i| i == b"*" || i.eq_ignore_ascii_case(b"accept-encoding"));
        if !first {
            out.push(b", ");
        }
        out.push(v);
        first = false;
    }
    if !covered {
        if !first {
            out.push(b", ");
        }
        out.push(b"Accept-Encoding");
    }
    out.end();
}

/// A streaming encoder writing into its own output buffer.
pub enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Deflate(flate2::write::ZlibEncoder<Vec<u8>>),
    /// Brotli's writer finishes only by handing its output back: `done` holds it then.
    Br {
        w: Option<Box<brotli::CompressorWriter<Vec<u8>>>>,
        done: Vec<u8>,
    },
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    /// `size`: the body's length when known (lets zstd size its tables).
    pub fn new(c: Coding, size: Option<u64>) -> io::Result<Encoder> {
        let out = Vec::with_capacity(OUT_CHUNK);
        Ok(match c.algo {
            Algo::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::new(c.level.clamp(1, 9) as u32),
            )),
            Algo::Deflate => Encoder::Deflate(flate2::write::ZlibEncoder::new(
                out,
                flate2::Compression::new(c.level.clamp(1, 9) as u32),
            )),
            Algo::Br => Encoder::Br {
                w: Some(Box::new(brotli::CompressorWriter::new(
                    out,
                    16 * 1024,
                    c.level.clamp(0, 11) as u32,
                    BROTLI_LGWIN,
                ))),
                done: Vec::new(),
            },
            Algo::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(out, c.level.clamp(1, 19))?;
                e.window_log(ZSTD_WINDOW_LOG)?;
                if let Some(n) = size {
                    e.set_pledged_src_size(Some(n))?;
                }
                Encoder::Zstd(e)
            }
        })
    }

    /// Feeds body bytes.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(data),
            Encoder::Deflate(e) => e.write_all(data),
            Encoder::Br { w: Some(e), .. } => e.write_all(data),
            Encoder::Br { w: None, .. } => Err(io::ErrorKind::BrokenPipe.into()),
            Encoder::Zstd(e) => e.write_all(data),
        }
    }

    /// Makes everything fed so far decodable from the output.
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Deflate(e) => e.flush(),
            Encoder::Br { w: Some(e), .. } => e.flush(),
            Encoder::Br { w: None, .. } => Ok(()),
            Encoder::Zstd(e) => e.flush(),
        }
    }

    /// Ends the stream (trailer, checksum).
    pub fn finish(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.try_finish(),
            Encoder::Deflate(e) => e.try_finish(),
            Encoder::Br { w, done } => {
                if let Some(e) = w.take() {
                    *done = e.into_inner();
                }
                Ok(())
            }
            Encoder::Zstd(e) => e.do_finish(),
        }
    }

    /// The encoded bytes produced so far and not yet taken (the caller clears what it took).
    pub fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Deflate(e) => e.get_mut(),
            Encoder::Br { w: Some(e), .. } => e.get_mut(),
            Encoder::Br { w: None, done } => done,
            Encoder::Zstd(e) => e.get_mut(),
        }
    }
}

/// One response's encoder and its accounting.
pub struct Stream {
    enc: Encoder,
    stats: Arc<CompressStats>,
    /// Input fed since the last flush.
    unflushed: bool,
}

impl Stream {
    /// Starts encoding a response; counts it for its algorithm.
    pub fn start(c: Coding, size: Option<u64>, stats: Arc<CompressStats>) -> io::Result<Stream> {
        let enc = Encoder::new(c, size)?;
        stats.responses[index(c.algo)].fetch_add(1, Ordering::Relaxed);
        Ok(Stream {
            enc,
            stats,
            unflushed: false,
        })
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.unflushed = true;
        self.stats
            .bytes_in
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.enc.write(data)
    }

    /// Flushes when input arrived since the last flush.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.unflushed {
            return Ok(());
        }
        self.unflushed = false;
        self.enc.flush()
    }

    pub fn finish(&mut self) -> io::Result<()> {
        self.unflushed = false;
        self.enc.finish()
    }

    /// Bytes of output waiting.
    pub fn pending(&mut self) -> usize {
        self.enc.output().len()
    }

    /// Moves the waiting output to `out` (as one chunk when `chunked`); returns the bytes
    /// added to `out`.
    pub fn drain_into(&mut self, out: &mut Vec<u8>, chunked_out: bool) -> usize {
        let o = self.enc.output();
        if o.is_empty() {
            return 0;
        }
        self.stats
            .bytes_out
            .fetch_add(o.len() as u64, Ordering::Relaxed);
        chunked::drain_body(out, o, chunked_out)
    }

    /// Takes the waiting output as a frame's bytes.
    pub fn take(&mut self) -> Option<Bytes> {
        let o = self.enc.output();
        if o.is_empty() {
            return None;
        }
        self.stats
            .bytes_out
            .fetch_add(o.len() as u64, Ordering::Relaxed);
        let b = Bytes::copy_from_slice(o);
        o.clear();
        Some(b)
    }
}

/// The member fields as a compressed (or Vary-only) response rewrites them, then the added
/// ones: for the fuzz target, which has no service to run the full field writer with.
#[doc(hidden)]
pub fn write_fields_for_fuzzing(out: &mut Vec<u8>, plan: Plan, resp: &ResponseHead) {
    for f in &resp.fields {
        let (name, value) = (resp.name(f), resp.value(f));
        if !(plan.edits() && rewrite_field(out, plan, name, value)) {
            crate::sink::Sink::field(out, name, value);
        }
    }
    if plan.edits() {
        write_added_fields(out, plan, resp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn order() -> Vec<(Algo, i32)> {
        vec![
            (Algo::Br, 4),
            (Algo::Zstd, 3),
            (Algo::Gzip, 6),
            (Algo::Deflate, 6),
        ]
    }

    fn pick(ae: &[&str]) -> Option<Algo> {
        negotiate(&order(), ae.iter().map(|s| s.as_bytes())).map(|c| c.algo)
    }

    #[test]
    fn negotiation_follows_rfc_9110() {
        assert_eq!(pick(&[]), None, "no Accept-Encoding: identity");
        assert_eq!(pick(&[""]), None, "empty Accept-Encoding: identity only");
        assert_eq!(pick(&["gzip, deflate, br"]), Some(Algo::Br), "server order");
        assert_eq!(pick(&["gzip, deflate"]), Some(Algo::Gzip));
        assert_eq!(pick(&["deflate"]), Some(Algo::Deflate));
        assert_eq!(pick(&["x-gzip"]), Some(Algo::Gzip));
        assert_eq!(
            pick(&["GZIP;Q=0.5, Zstd;q=0.8"]),
            Some(Algo::Zstd),
            "highest q"
        );
        assert_eq!(
            pick(&["br;q=0.5, gzip;q=0.5"]),
            Some(Algo::Br),
            "tie: order"
        );
        assert_eq!(pick(&["br;q=0, gzip"]), Some(Algo::Gzip), "q=0 excludes");
        assert_eq!(pick(&["*"]), Some(Algo::Br));
        assert_eq!(
            pick(&["*;q=0.1, br;q=0"]),
            Some(Algo::Zstd),
            "* covers the unnamed"
        );
        assert_eq!(pick(&["*;q=0"]), None);
        assert_eq!(pick(&["identity"]), None);
        assert_eq!(pick(&["gzip;q=0.5, identity"]), None, "identity preferred");
        assert_eq!(pick(&["gzip, identity;q=0.5"]), Some(Algo::Gzip));
        assert_eq!(pick(&["gzip, identity"]), Some(Algo::Gzip));
        assert_eq!(pick(&["compress, gzip;q=0.001"]), Some(Algo::Gzip));
        assert_eq!(pick(&["gzip;q=1.5"]), None, "malformed weight");
        assert_eq!(
            pick(&["gzip;q=0.5", "br;q=0.9"]),
            Some(Algo::Br),
            "several fields"
        );
        assert_eq!(pick(&["gzip ; q=0.2 , deflate"]), Some(Algo::Deflate));
        let gzip_only = [(Algo::Gzip, 1)];
        assert_eq!(
            negotiate(&gzip_only, [&b"br, zstd"[..]].into_iter()),
            None,
            "only configured algorithms"
        );
    }

    #[test]
    fn qvalues() {
        assert_eq!(qvalue(b"1"), Some(1000));
        assert_eq!(qvalue(b"1.000"), Some(1000));
        assert_eq!(qvalue(b"0.5"), Some(500));
        assert_eq!(qvalue(b"0.25"), Some(250));
        assert_eq!(qvalue(b"0"), Some(0));
        assert_eq!(qvalue(b"1.5"), None);
        assert_eq!(qvalue(b"0.1234"), None);
        assert_eq!(qvalue(b"x"), None);
    }

    fn compressor(types: &[&str]) -> Compressor {
        Compressor::new(&fulcrum_config::Compression {
            algorithms: vec![Algo::Gzip],
            min_size: 100,
            types: types.iter().map(|s| s.to_string()).collect(),
            levels: Default::default(),
        })
    }

    fn response(raw: &str) -> ResponseHead {
        let mut r = ResponseHead::with_buffer(raw.as_bytes().to_vec());
        r.parse().unwrap();
        r
    }

    fn request(raw: &str) -> RequestHead {
        let mut r = RequestHead::with_buffer(raw.as_bytes().to_vec());
        r.parse(&crate::head::Limits::default()).unwrap();
        r
    }

    #[test]
    fn plan_skips_what_must_not_be_compressed() {
        let c = compressor(&["text/*", "application/json"]);
        let req = request("GET / HTTP/1.1\r\nhost: a\r\naccept-encoding: gzip\r\n\r\n");
        let plain = request("GET / HTTP/1.1\r\nhost: a\r\n\r\n");
        let ok =
            "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: 500\r\n";
        let gz = Plan::Encode(Coding {
            algo: Algo::Gzip,
            level: 6,
        });
        assert_eq!(c.plan(&req, &response(&format!("{ok}\r\n")), false), gz);
        assert_eq!(
            c.plan(&plain, &response(&format!("{ok}\r\n")), false),
            Plan::Vary
        );
        assert_eq!(
            c.plan(&req, &response(&format!("{ok}\r\n")), true),
            Plan::Identity
        );
        let chunked = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(
            c.plan(&req, &response(chunked), false),
            gz,
            "unknown length"
        );
        for (why, extra) in [
            ("encoded", "content-encoding: br\r\n"),
            ("no-transform", "cache-control: public, no-transform\r\n"),
            ("range", "content-range: bytes 0-499/1000\r\n"),
        ] {
            let r = response(&format!("{ok}{extra}\r\n"));
            assert_eq!(c.plan(&req, &r, false), Plan::Identity, "{why}");
        }
        let identity = response(&format!("{ok}content-encoding: identity\r\n\r\n"));
        assert_eq!(c.plan(&req, &identity, false), gz);
        let small = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 99\r\n\r\n";
        assert_eq!(c.plan(&req, &response(small), false), Plan::Identity);
        let partial = "HTTP/1.1 206 Partial Content\r\ncontent-type: text/plain\r\ncontent-length: 500\r\n\r\n";
        assert_eq!(c.plan(&req, &response(partial), false), Plan::Identity);
        let image = "HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: 500\r\n\r\n";
        assert_eq!(c.plan(&req, &response(image), false), Plan::Identity);
        let untyped = "HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n";
        assert_eq!(c.plan(&req, &response(untyped), false), Plan::Identity);
        let upper =
            "HTTP/1.1 200 OK\r\ncontent-type: Application/JSON;x=1\r\ncontent-length: 500\r\n\r\n";
        assert_eq!(c.plan(&req, &response(upper), false), gz);
        let text_only = "HTTP/1.1 200 OK\r\ncontent-type: text/\r\ncontent-length: 500\r\n\r\n";
        assert_eq!(c.plan(&req, &response(text_only), false), Plan::Identity);
        let any = compressor(&["*/*"]);
        assert_eq!(any.plan(&req, &response(image), false), gz);
    }

    fn fields(plan: Plan, raw: &str) -> String {
        let r = response(raw);
        let mut out = Vec::new();
        for f in &r.fields {
            if !rewrite_field(&mut out, plan, r.name(f), r.value(f)) {
                crate::sink::Sink::field(&mut out, r.name(f), r.value(f));
            }
        }
        write_added_fields(&mut out, plan, &r);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn fields_are_rewritten() {
        let gz = Plan::Encode(Coding {
            algo: Algo::Gzip,
            level: 6,
        });
        let f = fields(
            gz,
            "HTTP/1.1 200 OK\r\nETag: \"abc\"\r\nAccept-Ranges: bytes\r\nVary: Cookie\r\nContent-Encoding: identity\r\nX-A: 1\r\n\r\n",
        );
        assert_eq!(
            f,
            "ETag: W/\"abc\"\r\nX-A: 1\r\ncontent-encoding: gzip\r\nvary: Cookie, Accept-Encoding\r\n"
        );
        let f = fields(
            gz,
            "HTTP/1.1 200 OK\r\nETag: W/\"x\"\r\nvary: accept-encoding\r\n\r\n",
        );
        assert_eq!(
            f,
            "ETag: W/\"x\"\r\ncontent-encoding: gzip\r\nvary: accept-encoding\r\n"
        );
        let f = fields(
            Plan::Vary,
            "HTTP/1.1 200 OK\r\nETag: \"abc\"\r\nVary: *\r\n\r\n",
        );
        assert_eq!(f, "ETag: \"abc\"\r\nvary: *\r\n");
        let f = fields(
            Plan::Vary,
            "HTTP/1.1 200 OK\r\nAccept-Ranges: bytes\r\n\r\n",
        );
        assert_eq!(f, "Accept-Ranges: bytes\r\nvary: Accept-Encoding\r\n");
    }

    fn decode(algo: Algo, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match algo {
            Algo::Gzip => {
                flate2::read::GzDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Algo::Deflate => {
                flate2::read::ZlibDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Algo::Br => {
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Algo::Zstd => out = zstd::stream::decode_all(data).unwrap(),
        }
        out
    }

    #[test]
    fn encoders_round_trip_and_flush_incrementally() {
        let text: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("<li>item {i} of the list</li>\n").into_bytes())
            .collect();
        for algo in ALGORITHMS {
            let stats = Arc::new(CompressStats::default());
            let mut s = Stream::start(
                Coding { algo, level: 3 },
                Some(text.len() as u64),
                stats.clone(),
            )
            .unwrap();
            let mut out = Vec::new();
            // The first piece, flushed: decodable on its own as a prefix of the body.
            s.write(&text[..1000]).unwrap();
            s.flush().unwrap();
            s.drain_into(&mut out, false);
            let mut prefix = Vec::new();
            match algo {
                Algo::Gzip => {
                    let _ = flate2::read::GzDecoder::new(&out[..]).read_to_end(&mut prefix);
                }
                Algo::Deflate => {
                    let _ = flate2::read::ZlibDecoder::new(&out[..]).read_to_end(&mut prefix);
                }
                Algo::Br => {
                    let _ = brotli::Decompressor::new(&out[..], 4096).read_to_end(&mut prefix);
                }
                Algo::Zstd => {
                    let _ = zstd::stream::read::Decoder::new(&out[..])
                        .unwrap()
                        .read_to_end(&mut prefix);
                }
            }
            assert_eq!(prefix, &text[..1000], "{algo}: flushed prefix");
            for piece in text[1000..].chunks(7000) {
                s.write(piece).unwrap();
                if s.pending() > 4096 {
                    s.drain_into(&mut out, false);
                }
            }
            s.finish().unwrap();
            s.drain_into(&mut out, false);
            assert_eq!(decode(algo, &out), text, "{algo}");
            assert!(out.len() < text.len() / 5, "{algo}: {}", out.len());
            let c = &stats;
            assert_eq!(c.bytes_in.load(Ordering::Relaxed), text.len() as u64);
            assert_eq!(c.bytes_out.load(Ordering::Relaxed), out.len() as u64);
            assert_eq!(c.responses_of(algo), 1);
        }
    }
}
