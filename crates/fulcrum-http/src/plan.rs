//! One response plan for every path a member's response takes to a client: how its body is
//! framed for the client, whether it is compressed on the way, which persistence cookie it
//! carries, and the fields written for it. HTTP/1 and HTTP/2 clients, HTTP/1.1 and HTTP/2
//! members all decide here; the adapters only write what it says.

use crate::body::InFraming;
use crate::chunked::Decoder;
use crate::compress::{self, Stream};
use crate::exchange::Route;
use crate::fields::{self, RespFraming, ResponseCtx, Sink};
use crate::head::{RequestHead, ResponseHead, Version};
use crate::sticky::{Lookup, MemberId};

/// What is done with one member response.
pub(crate) struct ResponsePlan<'s> {
    /// The member (index in the pool) that answered.
    member: usize,
    /// The persistence cookie to insert (cookie_insert) and the id for cookie_rewrite.
    insert_cookie: Option<&'s MemberId>,
    rewrite_id: Option<&'s MemberId>,
    compress: compress::Plan,
    /// The encoder when the body is compressed on the way.
    pub encoder: Option<Stream>,
    /// How the body goes to the client.
    pub framing: RespFraming,
}

impl<'s> ResponsePlan<'s> {
    /// Plans `resp`, from the `member`-th member of the route's pool, for `req`; `lookup` is
    /// what persistence found for the request.
    pub fn new(
        route: Route<'s>,
        req: &RequestHead,
        member: usize,
        lookup: &Lookup,
        resp: &ResponseHead,
    ) -> ResponsePlan<'s> {
        let svc: &'s crate::service::HttpService = route.svc;
        // A 101 starts a tunnel: nothing of it is a body to frame or encode.
        let upgrade = resp.status == 101;
        let bodiless = upgrade || resp.bodiless(req.method);
        let (compress, encoder) = if upgrade {
            (compress::Plan::Identity, None)
        } else {
            compress::prepare(svc, req, resp, bodiless)
        };
        let length = resp.content_length.filter(|_| !resp.chunked);
        let framing = if bodiless {
            RespFraming::None
        } else if let Some(n) = length.filter(|_| encoder.is_none()) {
            RespFraming::Length(n)
        } else if req.version == Version::Http10 {
            RespFraming::Close
        } else {
            RespFraming::Chunked
        };
        let (insert_cookie, rewrite_id) =
            crate::sticky::response_ids(svc, route.index, member, lookup);
        ResponsePlan {
            member,
            insert_cookie,
            rewrite_id,
            compress,
            encoder,
            framing,
        }
    }

    /// How an HTTP/1.1 member frames the body of `resp` (none when the client gets none).
    pub fn member_framing(&self, resp: &ResponseHead) -> InFraming {
        if self.framing == RespFraming::None {
            InFraming::None
        } else if resp.chunked {
            InFraming::Chunked(Decoder::default())
        } else if let Some(n) = resp.content_length {
            InFraming::Length(n)
        } else {
            InFraming::Close
        }
    }

    /// Writes the response fields for the client; `close`: an HTTP/1 client is told the
    /// connection closes after this response.
    pub fn write_fields<S: Sink>(
        &self,
        out: &mut S,
        route: Route<'_>,
        req: &RequestHead,
        resp: &ResponseHead,
        close: bool,
    ) {
        let cx = ResponseCtx {
            svc: route.svc,
            target: route.target,
            member: self.member,
            req,
            rule: route.rule,
            insert_cookie: self.insert_cookie,
            rewrite_id: self.rewrite_id,
            framing: self.framing,
            close,
            h2: req.version == Version::Http2,
            plan: self.compress,
        };
        fields::write_response_fields(out, resp, &cx);
    }

    /// The whole head for an HTTP/1.x client, appended to `out`.
    pub fn write_h1_head(
        &self,
        out: &mut Vec<u8>,
        route: Route<'_>,
        req: &RequestHead,
        resp: &ResponseHead,
        close: bool,
    ) {
        fields::write_status_line(out, resp.status, resp.reason());
        self.write_fields(out, route, req, resp, close);
        out.extend_from_slice(b"\r\n");
    }
}
