//! The host calls of the proxy-wasm ABI 0.2.1 (module `env`), and the few WASI calls a filter
//! built against a libc makes at start-up (module `wasi_snapshot_preview1`).
//!
//! Every pointer and length comes from the filter: each is checked against its memory (a bad
//! one answers `InvalidMemoryAccess`, it never reaches the host's memory), and every size the
//! filter hands over is bounded before the host copies it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime::{Caller, InstancePre, Linker, Module};

use crate::abi::{self, buffer, map, status, Pair};
use crate::plugin::{self, LocalReply, OutgoingCall};
use crate::vm::{give, read, write, HostState, HttpState, Vm};

type C<'a> = Caller<'a, HostState>;
type R = wasmtime::Result<i32>;

/// The largest body, header block or shared value a filter may hand the host in one call.
const MAX_HANDED: i32 = 16 << 20;

fn st(s: u32) -> R {
    Ok(s as i32)
}

/// Reads a length-checked byte range, or answers the call with the status.
macro_rules! bytes {
    ($c:expr, $p:expr, $l:expr) => {
        if !(0..=MAX_HANDED).contains(&$l) {
            return st(status::BAD_ARGUMENT);
        } else {
            match read($c, $p, $l) {
                Ok(b) => b,
                Err(s) => return st(s),
            }
        }
    };
}

fn headers_mut(http: &mut HttpState, map_type: i32) -> Option<&mut Vec<Pair>> {
    match map_type as u32 {
        map::REQUEST_HEADERS => Some(http.request_headers.pairs_mut()),
        map::RESPONSE_HEADERS => Some(http.response_headers.pairs_mut()),
        map::REQUEST_TRAILERS => Some(&mut http.request_trailers),
        map::RESPONSE_TRAILERS => Some(&mut http.response_trailers),
        map::HTTP_CALL_RESPONSE_HEADERS => Some(&mut http.call_headers),
        _ => None,
    }
}

/// A header map the filter is about to change: a change to the stream's own heads is noted,
/// so the proxy rebuilds a head only when a filter changed it.
fn headers_to_change(http: &mut HttpState, map_type: i32) -> Option<&mut Vec<Pair>> {
    if matches!(
        map_type as u32,
        map::REQUEST_HEADERS | map::RESPONSE_HEADERS
    ) {
        http.headers_changed = true;
    }
    headers_mut(http, map_type)
}

fn put_u32(c: &mut C<'_>, at: i32, v: u32) -> R {
    st(write(c, at, &v.to_le_bytes()).err().unwrap_or(status::OK))
}

fn put_u64(c: &mut C<'_>, at: i32, v: u64) -> R {
    st(write(c, at, &v.to_le_bytes()).err().unwrap_or(status::OK))
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Links `module` against the host calls once; every instance of the filter is made from it.
pub fn prepare(module: &Module) -> Result<InstancePre<HostState>, String> {
    let mut linker = Linker::new(crate::engine::engine());
    define(&mut linker).map_err(|e| format!("{e:#}"))?;
    // Filters built against a libc (WASI) import calls a proxy never answers (files, sockets):
    // they link, and trap if ever called.
    linker
        .define_unknown_imports_as_traps(module)
        .map_err(|e| format!("{e:#}"))?;
    linker
        .instantiate_pre(module)
        .map_err(|e| format!("linking: {e:#}"))
}

fn define(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    logging(l)?;
    headers(l)?;
    buffers(l)?;
    stream(l)?;
    shared(l)?;
    metrics(l)?;
    wasi(l)?;
    Ok(())
}

fn logging(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_log",
        |mut c: C<'_>, level: i32, p: i32, n: i32| -> R {
            // A line the log level drops is not copied or decoded (SDKs log at debug on
            // every context they create).
            let wanted = match level {
                0 => tracing::enabled!(tracing::Level::TRACE),
                1 => tracing::enabled!(tracing::Level::DEBUG),
                2 => tracing::enabled!(tracing::Level::INFO),
                3 => tracing::enabled!(tracing::Level::WARN),
                _ => true,
            };
            if !wanted {
                return st(status::OK);
            }
            let msg = bytes!(&mut c, p, n.min(64 << 10));
            let text = String::from_utf8_lossy(&msg);
            let filter = &*c.data().plugin.name;
            match level {
                0 => tracing::trace!(filter, "{text}"),
                1 => tracing::debug!(filter, "{text}"),
                2 => tracing::info!(filter, "{text}"),
                3 => tracing::warn!(filter, "{text}"),
                _ => tracing::error!(filter, "{text}"),
            }
            st(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: C<'_>, ret: i32| -> R {
            let level = if tracing::enabled!(tracing::Level::TRACE) {
                0
            } else if tracing::enabled!(tracing::Level::DEBUG) {
                1
            } else {
                2
            };
            put_u32(&mut c, ret, level)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: i32| -> R { put_u64(&mut c, ret, now_ns()) },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, ms: i32| -> R {
            c.data_mut().tick_ms = ms.max(0) as u32;
            st(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        |_: C<'_>, _ctx: i32| -> R { st(status::OK) },
    )?;
    l.func_wrap("env", "proxy_done", |_: C<'_>| -> R { st(status::OK) })?;
    l.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| -> R { st(status::NOT_FOUND) },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: C<'_>, code: i32, p: i32, n: i32| -> R {
            let r = put_u32(&mut c, code, 0)?;
            if r != status::OK as i32 {
                return Ok(r);
            }
            give(&mut c, b"", p, n).map(|s| s as i32)
        },
    )?;
    Ok(())
}

fn headers(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, m: i32, p: i32, n: i32| -> R {
            let Some(h) = headers_mut(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            let b = abi::encode_pairs(h);
            give(&mut c, &b, p, n).map(|s| s as i32)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, m: i32, p: i32, n: i32| -> R {
            let b = bytes!(&mut c, p, n);
            let Some(pairs) = abi::decode_pairs(&b) else {
                return st(status::BAD_ARGUMENT);
            };
            let Some(h) = headers_to_change(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            *h = pairs;
            st(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_size",
        |mut c: C<'_>, m: i32, ret: i32| -> R {
            let Some(h) = headers_mut(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            let size = abi::encode_pairs(h).len() as u32;
            put_u32(&mut c, ret, size)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>, m: i32, kp: i32, kn: i32, p: i32, n: i32| -> R {
            let key = bytes!(&mut c, kp, kn);
            let Some(h) = headers_mut(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            let Some(v) = h
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(&key))
                .map(|(_, v)| v.clone())
            else {
                return st(status::NOT_FOUND);
            };
            give(&mut c, &v, p, n).map(|s| s as i32)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C<'_>, m: i32, kp: i32, kn: i32, vp: i32, vn: i32| -> R {
            let key = bytes!(&mut c, kp, kn).to_ascii_lowercase();
            let value = bytes!(&mut c, vp, vn);
            let Some(h) = headers_to_change(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            h.push((key, value));
            st(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C<'_>, m: i32, kp: i32, kn: i32, vp: i32, vn: i32| -> R {
            let key = bytes!(&mut c, kp, kn).to_ascii_lowercase();
            let value = bytes!(&mut c, vp, vn);
            let Some(h) = headers_to_change(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            match h.iter().position(|(k, _)| k.eq_ignore_ascii_case(&key)) {
                Some(i) => {
                    h[i].1 = value;
                    let mut j = i + 1;
                    while j < h.len() {
                        if h[j].0.eq_ignore_ascii_case(&key) {
                            h.remove(j);
                        } else {
                            j += 1;
                        }
                    }
                }
                None => h.push((key, value)),
            }
            st(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C<'_>, m: i32, kp: i32, kn: i32| -> R {
            let key = bytes!(&mut c, kp, kn);
            let Some(h) = headers_to_change(&mut c.data_mut().http, m) else {
                return st(status::BAD_ARGUMENT);
            };
            h.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
            st(status::OK)
        },
    )?;
    Ok(())
}

fn buffers(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>, t: i32, start: i32, max: i32, p: i32, n: i32| -> R {
            let data: Vec<u8> = {
                let s = c.data();
                let whole: &[u8] = match t as u32 {
                    buffer::REQUEST_BODY
                    | buffer::RESPONSE_BODY
                    | buffer::DOWNSTREAM_DATA
                    | buffer::UPSTREAM_DATA => &s.http.body,
                    buffer::HTTP_CALL_RESPONSE_BODY => &s.http.call_body,
                    buffer::PLUGIN_CONFIGURATION => &s.plugin.config,
                    buffer::VM_CONFIGURATION => &[],
                    _ => return st(status::BAD_ARGUMENT),
                };
                let from = (start.max(0) as usize).min(whole.len());
                let to = from.saturating_add(max.max(0) as usize).min(whole.len());
                whole[from..to].to_vec()
            };
            if data.is_empty() {
                return st(status::NOT_FOUND);
            }
            give(&mut c, &data, p, n).map(|s| s as i32)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_status",
        |mut c: C<'_>, t: i32, len: i32, flags: i32| -> R {
            let size = {
                let s = c.data();
                match t as u32 {
                    buffer::HTTP_CALL_RESPONSE_BODY => s.http.call_body.len(),
                    buffer::PLUGIN_CONFIGURATION => s.plugin.config.len(),
                    buffer::VM_CONFIGURATION => 0,
                    _ => s.http.body.len(),
                }
            };
            let r = put_u32(&mut c, len, size as u32)?;
            if r != status::OK as i32 {
                return Ok(r);
            }
            put_u32(&mut c, flags, 0)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C<'_>, t: i32, start: i32, size: i32, p: i32, n: i32| -> R {
            if !matches!(
                t as u32,
                buffer::REQUEST_BODY
                    | buffer::RESPONSE_BODY
                    | buffer::DOWNSTREAM_DATA
                    | buffer::UPSTREAM_DATA
            ) {
                return st(status::BAD_ARGUMENT);
            }
            let data = bytes!(&mut c, p, n);
            let body = &mut c.data_mut().http.body;
            // The SDKs' set_*_body(start, size, data): replace that range (clamped) with data.
            let from = (start.max(0) as usize).min(body.len());
            let to = from.saturating_add(size.max(0) as usize).min(body.len());
            body.splice(from..to, data);
            st(status::OK)
        },
    )?;
    Ok(())
}

fn stream(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>,
         code: i32,
         dp: i32,
         dn: i32,
         bp: i32,
         bn: i32,
         hp: i32,
         hn: i32,
         _grpc: i32|
         -> R {
            if !(200..=599).contains(&code) {
                return st(status::BAD_ARGUMENT);
            }
            let details = bytes!(&mut c, dp, dn.min(4096));
            let body = bytes!(&mut c, bp, bn);
            let hb = bytes!(&mut c, hp, hn);
            let Some(headers) = abi::decode_pairs(&hb) else {
                return st(status::BAD_ARGUMENT);
            };
            c.data_mut().http.local = Some(LocalReply {
                status: code as u16,
                details: String::from_utf8_lossy(&details).into_owned(),
                body,
                headers,
            });
            st(status::OK)
        },
    )?;
    let resume = |mut c: C<'_>| -> R {
        c.data_mut().http.resumed = true;
        st(status::OK)
    };
    l.func_wrap("env", "proxy_continue_request", resume)?;
    l.func_wrap("env", "proxy_continue_response", resume)?;
    l.func_wrap(
        "env",
        "proxy_continue_stream",
        move |c: C<'_>, _t: i32| -> R { resume(c) },
    )?;
    l.func_wrap("env", "proxy_close_stream", |mut c: C<'_>, _t: i32| -> R {
        c.data_mut().http.closed = true;
        st(status::OK)
    })?;
    l.func_wrap("env", "proxy_clear_route_cache", |_: C<'_>| -> R {
        st(status::OK)
    })?;
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         un: i32,
         hp: i32,
         hn: i32,
         bp: i32,
         bn: i32,
         _tp: i32,
         _tn: i32,
         timeout_ms: i32,
         ret: i32|
         -> R {
            let upstream = bytes!(&mut c, up, un.min(256));
            let hb = bytes!(&mut c, hp, hn);
            let body = bytes!(&mut c, bp, bn);
            let Some(headers) = abi::decode_pairs(&hb) else {
                return st(status::BAD_ARGUMENT);
            };
            if !headers.iter().any(|(k, _)| k == b":path") {
                return st(status::BAD_ARGUMENT);
            }
            // Calls go out once the callback returns; a filter cannot queue more than a few.
            if c.data().http.calls.len() >= 16 {
                return st(status::INTERNAL_FAILURE);
            }
            let token = Vm::next_token(c.data_mut());
            c.data_mut().http.calls.push(OutgoingCall {
                token,
                upstream: String::from_utf8_lossy(&upstream).into_owned(),
                headers,
                body,
                timeout: Duration::from_millis(timeout_ms.clamp(1, 60_000) as u64),
            });
            put_u32(&mut c, ret, token)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, pp: i32, pn: i32, p: i32, n: i32| -> R {
            let path = bytes!(&mut c, pp, pn.min(1024));
            let value = property(&c.data().http, &c.data().plugin, &path);
            match value {
                Some(v) => give(&mut c, &v, p, n).map(|s| s as i32),
                None => st(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C<'_>, pp: i32, pn: i32, vp: i32, vn: i32| -> R {
            let path = bytes!(&mut c, pp, pn.min(1024));
            let value = bytes!(&mut c, vp, vn.min(64 << 10));
            let custom = &mut c.data_mut().http.custom;
            if custom.len() >= 64 && !custom.iter().any(|(k, _)| *k == path) {
                return st(status::INTERNAL_FAILURE);
            }
            custom.retain(|(k, _)| *k != path);
            custom.push((path, value));
            st(status::OK)
        },
    )?;
    Ok(())
}

/// A property by its path (segments separated by NUL, as the SDKs send them), in Envoy's names
/// where Envoy has one and under `fulcrum.` where it has none.
fn property(http: &HttpState, plugin: &plugin::Plugin, path: &[u8]) -> Option<Vec<u8>> {
    if let Some((_, v)) = http.custom.iter().find(|(k, _)| k == path) {
        return Some(v.clone());
    }
    let p = &*http.props;
    let dotted: Vec<u8> = path
        .iter()
        .map(|&b| if b == 0 { b'.' } else { b })
        .collect();
    let text = |s: &str| Some(s.as_bytes().to_vec());
    let port =
        |a: Option<std::net::SocketAddr>| a.map(|a| (a.port() as i64).to_le_bytes().to_vec());
    // During the request's header phase from its lent head (with earlier filters' edits),
    // after it from what the phase left.
    let header = |name: &[u8]| {
        http.request_headers.pseudo(name).or_else(|| {
            let line = http.request_line.as_ref()?;
            line.get(name).map(<[u8]>::to_vec)
        })
    };
    match &dotted[..] {
        b"source.address" => p.source.map(|a| a.to_string().into_bytes()),
        b"source.port" => port(p.source),
        b"destination.address" => p.destination.map(|a| a.to_string().into_bytes()),
        b"destination.port" => port(p.destination),
        b"upstream.address" | b"fulcrum.member" => http.member.map(|a| a.to_string().into_bytes()),
        b"connection.requested_server_name" | b"fulcrum.sni" => {
            p.sni.clone().map(String::into_bytes)
        }
        b"cluster_name" | b"xds.cluster_name" | b"fulcrum.pool" => {
            http.pool.as_deref().map(|s| s.as_bytes().to_vec())
        }
        b"fulcrum.virtual_service" | b"xds.listener_name" => text(&p.virtual_service),
        b"plugin_name" | b"plugin_vm_id" => text(&plugin.name),
        b"plugin_root_id" => text(&plugin.root_id),
        b"request.protocol" => text(p.protocol),
        b"request.path" => header(b":path"),
        b"request.method" => header(b":method"),
        b"request.host" => header(b":authority"),
        b"request.scheme" => header(b":scheme"),
        b"response.code" => http
            .response_headers
            .pseudo(b":status")
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<i64>().ok())
            .map(|s| s.to_le_bytes().to_vec()),
        _ => None,
    }
}

fn shared(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C<'_>, kp: i32, kn: i32, p: i32, n: i32, cas: i32| -> R {
            let key = bytes!(&mut c, kp, kn.min(64 << 10));
            let Some((v, version)) = c.data().plugin.shared.get(&key) else {
                return st(status::NOT_FOUND);
            };
            let r = give(&mut c, &v, p, n)? as i32;
            if r != status::OK as i32 {
                return Ok(r);
            }
            put_u32(&mut c, cas, version)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: C<'_>, kp: i32, kn: i32, vp: i32, vn: i32, cas: i32| -> R {
            let key = bytes!(&mut c, kp, kn.min(64 << 10));
            let value = bytes!(&mut c, vp, vn);
            let r = c.data().plugin.shared.set(&key, value, cas as u32);
            st(r.err().unwrap_or(status::OK))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: C<'_>, np: i32, nn: i32, ret: i32| -> R {
            let name = bytes!(&mut c, np, nn.min(1024));
            let plugin = c.data().plugin.clone();
            let id = plugin.shared.register_queue(&name, &plugin.queues_ready);
            let mine = &mut c.data_mut().queues;
            if !mine.contains(&id) {
                mine.push(id);
            }
            put_u32(&mut c, ret, id)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, _vp: i32, _vn: i32, np: i32, nn: i32, ret: i32| -> R {
            let name = bytes!(&mut c, np, nn.min(1024));
            match c.data().plugin.shared.resolve_queue(&name) {
                Some(id) => put_u32(&mut c, ret, id),
                None => st(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, id: i32, vp: i32, vn: i32| -> R {
            let value = bytes!(&mut c, vp, vn.min(1 << 20));
            let r = c.data().plugin.shared.enqueue(id as u32, value);
            st(r.err().unwrap_or(status::OK))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: i32, p: i32, n: i32| -> R {
            match c.data().plugin.shared.dequeue(id as u32) {
                Ok(v) => give(&mut c, &v, p, n).map(|s| s as i32),
                Err(s) => st(s),
            }
        },
    )?;
    Ok(())
}

fn metrics(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, kind: i32, np: i32, nn: i32, ret: i32| -> R {
            if !(0..=2).contains(&kind) {
                return st(status::BAD_ARGUMENT);
            }
            let name = bytes!(&mut c, np, nn.min(256));
            let Ok(name) = std::str::from_utf8(&name) else {
                return st(status::BAD_ARGUMENT);
            };
            match plugin::define_metric(kind as u32, name) {
                Some(id) => put_u32(&mut c, ret, id),
                None => st(status::INTERNAL_FAILURE),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_increment_metric",
        |_: C<'_>, id: i32, by: i64| -> R {
            match plugin::metric(id as u32) {
                Some(m) if m.kind != abi::metric::HISTOGRAM => {
                    m.increment(by);
                    st(status::OK)
                }
                Some(_) => st(status::BAD_ARGUMENT),
                None => st(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_record_metric",
        |_: C<'_>, id: i32, v: i64| -> R {
            match plugin::metric(id as u32) {
                Some(m) => {
                    m.record(v);
                    st(status::OK)
                }
                None => st(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C<'_>, id: i32, ret: i32| -> R {
            match plugin::metric(id as u32) {
                Some(m) => {
                    let v = m.value.load(std::sync::atomic::Ordering::Relaxed);
                    put_u64(&mut c, ret, v as u64)
                }
                None => st(status::NOT_FOUND),
            }
        },
    )?;
    Ok(())
}

/// The WASI calls a filter's libc makes at start-up or for its clock; everything else of WASI
/// links as a trap (`define_unknown_imports_as_traps`).
fn wasi(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    const W: &str = "wasi_snapshot_preview1";
    const BADF: i32 = 8;
    l.func_wrap(
        W,
        "fd_write",
        |mut c: C<'_>, fd: i32, iovs: i32, n: i32, ret: i32| -> R {
            if fd != 1 && fd != 2 {
                return Ok(BADF);
            }
            let mut total = 0u32;
            for i in 0..n.clamp(0, 64) {
                let Ok(iov) = read(&mut c, iovs.wrapping_add(i * 8), 8) else {
                    return Ok(21);
                };
                let p = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let Ok(b) = read(&mut c, p, len.clamp(0, 64 << 10)) else {
                    return Ok(21);
                };
                total += b.len() as u32;
                let filter = &*c.data().plugin.name;
                tracing::info!(filter, fd, "{}", String::from_utf8_lossy(&b).trim_end());
            }
            put_u32(&mut c, ret, total).map(|_| 0)
        },
    )?;
    l.func_wrap(
        W,
        "proc_exit",
        |_: C<'_>, code: i32| -> wasmtime::Result<()> {
            Err(wasmtime::format_err!("the filter exited with {code}"))
        },
    )?;
    l.func_wrap(
        W,
        "clock_time_get",
        |mut c: C<'_>, _id: i32, _precision: i64, ret: i32| -> R {
            put_u64(&mut c, ret, now_ns()).map(|_| 0)
        },
    )?;
    l.func_wrap(W, "random_get", |mut c: C<'_>, p: i32, n: i32| -> R {
        let mut b = vec![0u8; n.clamp(0, 4096) as usize];
        let mut x = now_ns() | 1;
        for byte in &mut b {
            // xorshift: seeds hash maps in a filter's libc, nothing that needs secrecy.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        Ok(write(&mut c, p, &b).map_or(21, |_| 0))
    })?;
    let zero_pair = |mut c: C<'_>, a: i32, b: i32| -> R {
        let _ = put_u32(&mut c, a, 0)?;
        put_u32(&mut c, b, 0).map(|_| 0)
    };
    l.func_wrap(W, "environ_sizes_get", zero_pair)?;
    l.func_wrap(W, "args_sizes_get", zero_pair)?;
    l.func_wrap(W, "environ_get", |_: C<'_>, _: i32, _: i32| -> R { Ok(0) })?;
    l.func_wrap(W, "args_get", |_: C<'_>, _: i32, _: i32| -> R { Ok(0) })?;
    l.func_wrap(W, "fd_close", |_: C<'_>, _: i32| -> R { Ok(BADF) })?;
    l.func_wrap(
        W,
        "fd_seek",
        |_: C<'_>, _: i32, _: i64, _: i32, _: i32| -> R { Ok(BADF) },
    )?;
    l.func_wrap(W, "fd_fdstat_get", |_: C<'_>, _: i32, _: i32| -> R {
        Ok(BADF)
    })?;
    Ok(())
}
