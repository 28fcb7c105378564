//! One response plan for every path a member's response takes to a client: how its body is
//! framed for the client, whether it is compressed on the way, which persistence cookie it
//! carries, and the fields written for it. HTTP/1 and HTTP/2 clients, HTTP/1.1 and HTTP/2
//! members all decide here; the adapters only write what it says.

use crate::body::{DownBody, InFraming};
use crate::chunked::Decoder;
use crate::compress::{self, Stream};
use crate::exchange::Route;
use crate::fields::{self, RespFraming, ResponseCtx, Sink};
use crate::head::{RequestHead, ResponseHead, Version};
use crate::sticky::{Lookup, MemberId};
use crate::transform::{Transform, TransformBody};
use crate::wasm_filters::FilterBody;

/// What is done with one member response.
pub(crate) struct ResponsePlan<'s> {
    /// The member (index in the pool) that answered.
    member: usize,
    /// The persistence cookie to insert (cookie_insert) and the id for cookie_rewrite.
    insert_cookie: Option<&'s MemberId>,
    rewrite_id: Option<&'s MemberId>,
    compress: compress::Plan,
    /// What changes the body on the way (filters, compression), if anything does.
    pub encoder: Option<Transform>,
    /// How the body goes to the client.
    pub framing: RespFraming,
}

impl<'s> ResponsePlan<'s> {
    /// `body` as the client gets it: through the compressor when the plan compresses (the body
    /// filter is the same for HTTP/1 and HTTP/2 clients).
    pub fn filter(&mut self, body: DownBody) -> DownBody {
        match self.encoder.take() {
            Some(s) => DownBody::filtered(TransformBody::new(body, s)),
            None => body,
        }
    }

    /// Plans `resp`, from the `member`-th member of the route's pool, for `req`; `lookup` is
    /// what persistence found for the request; `body_filter`: the filters that read the body.
    pub fn new(
        route: Route<'s>,
        req: &RequestHead,
        member: usize,
        lookup: &Lookup,
        resp: &ResponseHead,
        body_filter: Option<FilterBody>,
    ) -> ResponsePlan<'s> {
        let svc: &'s crate::service::HttpService = route.svc;
        // A 101 starts a tunnel: nothing of it is a body to frame or encode.
        let upgrade = resp.status == 101;
        let bodiless = upgrade || resp.bodiless(req.method);
        let (compress, encoder) = if upgrade {
            (compress::Plan::Identity, None)
        } else {
            prepare(svc, req, resp, bodiless)
        };
        // Filters alone keep the member's length, as Envoy does: a filter that changes a
        // body's length removes content-length in its header phase (the SDKs' examples do),
        // and one that does not is held to it. The compressor always re-frames.
        let kept = resp
            .content_length
            .filter(|_| !resp.chunked && encoder.is_none() && resp.states_length());
        let body_filter = body_filter.filter(|_| !bodiless).map(|f| f.held_to(kept));
        let encoder = Transform::of(body_filter, encoder);
        let framing = if bodiless {
            RespFraming::None
        } else if let Some(n) = kept {
            RespFraming::Length(n)
        } else if req.version == Version::Http10 {
            RespFraming::Close
        } else {
            RespFraming::Chunked
        };
        let (insert_cookie, rewrite_id) =
            crate::sticky::response_ids(svc.sticky.as_ref(), route.index, member, lookup);
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
            settings: route.svc.field_settings(),
            authorities: route.target.authorities(),
            member: route
                .target
                .pool
                .members()
                .get(self.member)
                .map(|m| m.address),
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

/// The plan for a response and, when it is compressed, its encoder. The fast path: a service
/// without `compression` costs one branch.
#[inline]
fn prepare(
    svc: &crate::service::HttpService,
    req: &RequestHead,
    resp: &ResponseHead,
    bodiless: bool,
) -> (compress::Plan, Option<Stream>) {
    let Some(c) = &svc.compress else {
        return (compress::Plan::Identity, None);
    };
    match c.plan(req, resp, bodiless) {
        compress::Plan::Encode(coding) => {
            match Stream::start(
                coding,
                resp.content_length,
                svc.http_stats.compression.clone(),
            ) {
                Ok(s) => (compress::Plan::Encode(coding), Some(s)),
                Err(e) => {
                    tracing::warn!(service = %svc.name, error = %e, "cannot start a {} encoder; response sent uncompressed", coding.algo);
                    (compress::Plan::Vary, None)
                }
            }
        }
        p => (p, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::Attempts;
    use crate::testing::{client, request, response, service};

    const COMPRESS: &str =
        "compression = { algorithms = [\"gzip\"], min_size = 10, types = [\"text/*\"] }";

    /// The HTTP/1 head a plan writes for `resp` (from member 0) to `req`.
    fn head_for(vs: &str, profile: &str, req: &str, resp: &str) -> (String, RespFraming, bool) {
        let svc = service(2, vs, profile);
        let route = Route {
            svc: &svc,
            target: &svc.targets[0],
            index: 0,
            rule: None,
            member: None,
        };
        let (req, resp) = (request(req), response(resp));
        let a = Attempts::new(route, &req, &client(), true);
        let plan = ResponsePlan::new(route, &req, 0, a.lookup(), &resp, None);
        let mut out = Vec::new();
        plan.write_h1_head(&mut out, route, &req, &resp, false);
        let text = String::from_utf8(out).expect("text");
        (text, plan.framing, plan.encoder.is_some())
    }

    const GET: &str = "GET / HTTP/1.1\r\nhost: a\r\naccept-encoding: gzip\r\n\r\n";
    const PAGE: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5000\r\n\r\n";

    #[test]
    fn a_length_passes_through_when_nothing_changes_the_body() {
        let (head, framing, encoded) = head_for("", "", GET, PAGE);
        assert_eq!(framing, RespFraming::Length(5000));
        assert!(!encoded);
        assert!(head.contains("content-length: 5000\r\n"), "{head}");
    }

    #[test]
    fn a_compressed_body_is_chunked_for_http11_and_until_close_for_http10() {
        let (head, framing, encoded) = head_for(COMPRESS, "", GET, PAGE);
        assert!(encoded);
        assert_eq!(framing, RespFraming::Chunked);
        assert!(head.contains("content-encoding: gzip\r\n"), "{head}");
        assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        let get10 = "GET / HTTP/1.0\r\nhost: a\r\naccept-encoding: gzip\r\n\r\n";
        let (_, framing, _) = head_for(COMPRESS, "", get10, PAGE);
        assert_eq!(framing, RespFraming::Close);
    }

    #[test]
    fn bodiless_answers_keep_the_members_length_and_are_not_compressed() {
        let head_req = "HEAD / HTTP/1.1\r\nhost: a\r\naccept-encoding: gzip\r\n\r\n";
        let (head, framing, encoded) = head_for(COMPRESS, "", head_req, PAGE);
        assert_eq!(framing, RespFraming::None);
        assert!(!encoded);
        assert!(head.contains("content-length: 5000\r\n"), "{head}");
        let switching = "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n";
        let (_, framing, encoded) = head_for(COMPRESS, "", GET, switching);
        assert_eq!((framing, encoded), (RespFraming::None, false));
    }

    #[test]
    fn cookie_insert_sets_the_cookie_unless_the_request_named_the_member() {
        let vs = "persistence = \"s\"";
        let profile = "type = \"cookie_insert\"\ncookie = \"SRV\"";
        let (head, _, _) = head_for(vs, profile, GET, PAGE);
        let cookie = head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: SRV="))
            .expect("a persistence cookie")
            .split(';')
            .next()
            .expect("a value")
            .to_string();
        let again = format!("GET / HTTP/1.1\r\nhost: a\r\ncookie: SRV={cookie}\r\n\r\n");
        let (head, _, _) = head_for(vs, profile, &again, PAGE);
        assert!(!head.contains("set-cookie: SRV="), "{head}");
    }

    #[test]
    fn member_framing_follows_the_members_head() {
        let svc = service(1, "", "");
        let route = Route {
            svc: &svc,
            target: &svc.targets[0],
            index: 0,
            rule: None,
            member: None,
        };
        let req = request(GET);
        let a = Attempts::new(route, &req, &client(), true);
        let chunked = response("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        let plan = ResponsePlan::new(route, &req, 0, a.lookup(), &chunked, None);
        assert!(matches!(
            plan.member_framing(&chunked),
            InFraming::Chunked(_)
        ));
        let close = response("HTTP/1.1 200 OK\r\n\r\n");
        let plan = ResponsePlan::new(route, &req, 0, a.lookup(), &close, None);
        assert!(matches!(plan.member_framing(&close), InFraming::Close));
        assert_eq!(plan.framing, RespFraming::Chunked);
    }
}
