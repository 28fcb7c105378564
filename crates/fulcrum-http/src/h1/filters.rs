//! The proxy-wasm filters of an HTTP/1 client's request: its head, its body (read whole and
//! decoded before the rules, when a filter reads request bodies) and its response.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::Conn;
use crate::chunked::Decoder;
use crate::exchange::Route;
use crate::head::{ResponseHead, Version};
use crate::local::Local;
use crate::wasm_filters::{body_over_limit, on_request_body, FilterBody};

/// How much chunk framing (size lines, extensions) a filtered body may carry beyond twice its
/// data before it is refused.
const FRAMING_ALLOWANCE: usize = 64 << 10;

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Runs the request callbacks of the service's filters (head, then the body when one
    /// reads it); `Some`: the answer to give instead of going on.
    pub(super) async fn request_filters(
        &mut self,
        chain: &Arc<fulcrum_wasm::Chain>,
    ) -> Option<Local> {
        let svc = &self.svc;
        let r = crate::wasm_filters::on_request(
            chain,
            &svc.name,
            &mut self.head,
            &self.client,
            svc.https,
            &svc.limits,
        )
        .await;
        let mut stream = match r {
            Ok(stream) => stream,
            Err(local) => return Some(local),
        };
        let refused = match stream.request_body_limit() {
            Some(limit) if self.head.has_body() => self.filter_body(&mut stream, limit).await,
            _ => None,
        };
        self.filters = Some(stream);
        refused
    }

    /// Reads the request body whole (up to `limit` decoded bytes), runs the filters' body
    /// callbacks over it and puts what they leave in its place, as a Content-Length body the
    /// exchange can replay. A body that does not come in time, is malformed or is larger than
    /// `limit` is answered here (the connection closes after: its rest was not read).
    async fn filter_body(
        &mut self,
        stream: &mut fulcrum_wasm::Stream,
        limit: usize,
    ) -> Option<Local> {
        let closing = |status, why| Some(Local::closing_error(status, why));
        if self.head.content_length.is_some_and(|n| n > limit as u64) {
            return Some(body_over_limit());
        }
        if self.head.expect_continue && self.head.version == Version::Http11 {
            // The client waits for this before it sends the body the filters need.
            if self
                .io
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
            {
                return closing(400, "");
            }
        }
        let start = self.head.head_len;
        let mut decoder = self.head.chunked.then(Decoder::default);
        let mut body = Vec::new();
        // Where the undecoded bytes start (chunked), and where the body ends once known.
        let mut fed = start;
        // What the slow-body guard (`body_wait`) counts.
        let (mut received, mut waited) = (0u64, Duration::ZERO);
        let end = loop {
            match &mut decoder {
                Some(d) => {
                    let used =
                        match d.feed(&self.head.buf[fed..], |data| body.extend_from_slice(data)) {
                            Ok(n) => n,
                            Err(e) => return closing(400, e.0),
                        };
                    fed += used;
                    // The framing counts too: one-byte chunks would otherwise hold six bytes
                    // of buffer per byte of body.
                    if body.len() > limit || fed - start > 2 * limit + FRAMING_ALLOWANCE {
                        return Some(body_over_limit());
                    }
                    if d.is_done() {
                        break fed;
                    }
                }
                None => {
                    let n = self.head.content_length.unwrap_or(0) as usize;
                    if self.head.buf.len() - start >= n {
                        body.extend_from_slice(&self.head.buf[start..start + n]);
                        break start + n;
                    }
                }
            }
            let (wait, slow) = self.body_wait(received, waited);
            self.timer.set_after(wait);
            let asked = Instant::now();
            self.head.buf.reserve(crate::h1_out::BODY_CHUNK);
            match self.timer.run(self.io.read_buf(&mut self.head.buf)).await {
                Some(Ok(0)) | Some(Err(_)) => {
                    return closing(400, "the request body was cut short")
                }
                Some(Ok(n)) => received += n as u64,
                None if slow => return closing(408, "request body slower than min_body_rate"),
                None => return closing(408, "request body timeout"),
            }
            waited += asked.elapsed();
        };
        let result = on_request_body(stream, body).await;
        let (kept, refused) = match result {
            Ok(b) => (b, None),
            Err(local) => (Vec::new(), Some(local)),
        };
        // Replaced even when refused: the body then counts as read, and the connection can
        // go on after the answer.
        self.head.replace_body(&kept, end);
        refused
    }

    /// Runs the response-header callbacks of the request's filters over `resp`; `Err`: the
    /// answer to give instead of the member's.
    pub(super) async fn response_filters(
        &mut self,
        resp: &mut ResponseHead,
        route: Route<'_>,
        member: SocketAddr,
    ) -> Result<(), Local> {
        match self.filters.as_deref_mut() {
            Some(stream) => {
                crate::wasm_filters::on_response(stream, resp, &route.target.pool.name, member)
                    .await
            }
            None => Ok(()),
        }
    }

    /// The request's filters that read the response body, for the response plan.
    pub(super) fn body_filter(&mut self) -> Option<FilterBody> {
        self.filters
            .take_if(|s| s.wants_response_transform())
            .map(FilterBody::new)
    }
}
