//! The one request loop, for HTTP/1 and HTTP/2 clients and HTTP/1.1 and HTTP/2 members
//! (Pingora's `process_request` is the model):
//!
//! ```text
//!   Attempts::next ─▶ connect or reuse (an HTTP/1.1 connection, or a stream on the member's
//!   HTTP/2 connection) ─▶ the client session sends the head and body ─▶ the response head
//!   ─▶ Attempts::answered, or Attempts::failed: try again (rewinding the body) or answer
//! ```
//!
//! A client session (`h1::Conn` for HTTP/1 clients, `forward::StreamSession` for HTTP/2
//! clients and the cache's fetches) only moves bytes: how the body leaves its client, where
//! interim responses go, which member connections are its own. Which member, whether to try
//! again and what the member is told about its health is decided here and in `exchange`, once.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::{Member, Picked, RequestGuard};
use hyper::client::conn::http2::SendRequest;
use tokio::time::Instant;

use crate::client::Client;
use crate::exchange::{self, Attempts, Failure, RespError, Route};
use crate::h2_upstream::{self, H2Response, SentH2};
use crate::head::{RequestHead, ResponseHead};
use crate::local::Local;
use crate::upstream::{UpBody, UpstreamConn};

/// What a client session sent on an HTTP/1.1 member connection.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    /// Request bytes written to the member.
    pub bytes: u64,
    /// The member began to answer before the request body was complete.
    pub early: bool,
}

/// Why sending on an HTTP/1.1 member connection stopped.
pub(crate) enum SendError<S> {
    /// Writing to the member failed: a failed attempt, like a reset before any response.
    Member(io::Error),
    /// The client session ends the exchange for a reason of its own (its client left, its body
    /// was refused or cut); no member answer follows.
    Stop(S),
}

/// A member's answer over HTTP/1.1, with the connection it came on.
pub(crate) struct Http1Answer {
    pub picked: Picked,
    pub conn: UpstreamConn,
    pub resp: ResponseHead,
    /// Request bytes sent to the member.
    pub sent: u64,
    /// The member began to answer before the request body was complete.
    pub early: bool,
    /// Counts the request as open on its member until the answer has been relayed.
    pub request: RequestGuard,
}

/// A member's answer, over either member protocol.
pub(crate) enum MemberAnswer {
    Http1(Http1Answer),
    Http2(H2Response),
}

/// How an exchange ended without a member's answer.
pub(crate) enum Ended<S> {
    /// The answer for the client: no member, every attempt failed, a request HTTP/2 cannot
    /// carry.
    Answer(Local),
    /// The client went away while interim responses were passed on to it.
    ClientGone,
    /// The client session's own reason (`SendError::Stop`).
    Stop(S),
}

impl<S> From<Local> for Ended<S> {
    fn from(l: Local) -> Self {
        Ended::Answer(l)
    }
}

/// The client side of an exchange, as the loop needs it.
pub(crate) trait ClientSession {
    /// Why the session may end an exchange itself (`SendError::Stop`).
    type Stop;

    /// The request and its client.
    fn request(&self) -> (&RequestHead, &Client);

    /// An idle member connection of this client's own to `member` (routes whose member
    /// connections are private to a client connection).
    fn take_private(&mut self, member: &Arc<Member>) -> Option<UpstreamConn>;

    /// Sends the request head and body on an HTTP/1.1 connection to `member`.
    async fn send_h1(
        &mut self,
        route: Route<'_>,
        member: &Member,
        conn: &mut UpstreamConn,
    ) -> Result<Sent, SendError<Self::Stop>>;

    /// Reads the member's response head by `deadline`, passing interim responses on to the
    /// client where it takes them.
    async fn read_h1_head(
        &mut self,
        conn: &mut UpstreamConn,
        deadline: Instant,
    ) -> Result<ResponseHead, RespError>;

    /// The request goes to a member again: its body is sent from its start.
    fn rewind(&mut self);

    /// Sends the request (`head`, to which the session adds its body) as a stream on an
    /// HTTP/2 member's connection, within `timeout` for the response head
    /// (`h2_upstream::send`).
    async fn send_h2(
        &mut self,
        sender: &mut SendRequest<UpBody>,
        head: http::Request<()>,
        timeout: Duration,
        fresh: bool,
    ) -> Result<SentH2, Self::Stop>;
}

/// Drives one request through `attempts` until a member answers or the client gets an answer
/// of Fulcrum's own.
pub(crate) async fn run<C: ClientSession>(
    route: Route<'_>,
    attempts: &mut Attempts<'_>,
    session: &mut C,
) -> Result<MemberAnswer, Ended<C::Stop>> {
    loop {
        let picked = {
            let (req, client) = session.request();
            attempts.next(req, client)?
        };
        let answer = if route.target.http2 {
            // Boxed: an HTTP/2 member's attempt (its connection's handshake, hyper's request)
            // is the larger state, and would size every request's future, HTTP/1.1 members'
            // too; it allocates far more than this box per request anyway.
            Box::pin(attempt_h2(route, attempts, session, picked))
                .await?
                .map(MemberAnswer::Http2)
        } else {
            attempt_h1(route, attempts, session, picked)
                .await?
                .map(MemberAnswer::Http1)
        };
        if let Some(a) = answer {
            return Ok(a);
        }
    }
}

/// One attempt over an HTTP/1.1 connection; `None`: try again.
async fn attempt_h1<C: ClientSession>(
    route: Route<'_>,
    attempts: &mut Attempts<'_>,
    session: &mut C,
    picked: Picked,
) -> Result<Option<Http1Answer>, Ended<C::Stop>> {
    let member = picked.member.clone();
    let private = session.take_private(&member);
    let fresh_only = attempts.fresh_only();
    let retryable = attempts.retryable();
    let info = &session.request().1.info;
    let acquired = exchange::acquire(route, &picked, info, private, fresh_only, retryable).await;
    let (mut conn, fresh) = match acquired {
        Ok(c) => c,
        Err(e) => {
            attempts.failed(&picked, Failure::Connect(e))?;
            return Ok(None);
        }
    };
    let request = member.open_request();
    let (head, sent, sent_at) = match session.send_h1(route, &member, &mut conn).await {
        Ok(sent) => {
            let sent_at = Instant::now();
            let deadline = sent_at + route.target.response_timeout;
            (
                session.read_h1_head(&mut conn, deadline).await,
                sent,
                sent_at,
            )
        }
        Err(SendError::Member(e)) => (
            Err(RespError::Io(e, false)),
            Sent::default(),
            Instant::now(),
        ),
        Err(SendError::Stop(s)) => return Err(Ended::Stop(s)),
    };
    let resp = match head {
        Ok(r) => r,
        Err(RespError::Client) => return Err(Ended::ClientGone),
        Err(e) => {
            attempts.failed(&picked, Failure::of_response(e, fresh))?;
            session.rewind();
            return Ok(None);
        }
    };
    attempts.answered(&picked, resp.status, sent_at.elapsed());
    Ok(Some(Http1Answer {
        picked,
        conn,
        resp,
        sent: sent.bytes,
        early: sent.early,
        request,
    }))
}

/// One attempt as a stream on the member's HTTP/2 connection; `None`: try again.
async fn attempt_h2<C: ClientSession>(
    route: Route<'_>,
    attempts: &mut Attempts<'_>,
    session: &mut C,
    picked: Picked,
) -> Result<Option<H2Response>, Ended<C::Stop>> {
    let (svc, t) = (&**route.svc, &**route.target);
    let member = picked.member.clone();
    let Some(h2) = t.h2.get(picked.index) else {
        return Err(Local::error(502, "no HTTP/2 connection for the member").into());
    };
    if attempts.fresh_only() {
        h2.reset();
    }
    let connected = h2
        .sender(
            t.pool.connect_timeout,
            t.tls.as_deref(),
            svc.snat.as_deref(),
            t.pool.config.vrf.as_deref(),
        )
        .await;
    let (mut sender, fresh) = match connected {
        Ok(s) => s,
        Err(e) => {
            attempts.failed(&picked, Failure::Connect(e))?;
            return Ok(None);
        }
    };
    let request_guard = member.open_request();
    let connection_guard = member.use_connection(fresh);
    let head = {
        let (req, client) = session.request();
        h2_upstream::request_head(route, req, client, &member)?
    };
    let sent_at = Instant::now();
    let (result, sent) = session
        .send_h2(&mut sender, head, t.response_timeout, fresh)
        .await
        .map_err(Ended::Stop)?;
    match result {
        Ok(response) => {
            attempts.answered(&picked, response.status().as_u16(), sent_at.elapsed());
            Ok(Some(H2Response {
                picked,
                response,
                request_guard,
                connection_guard,
                sent,
            }))
        }
        Err(failure) => {
            if matches!(failure, Failure::Broken { .. }) {
                // The shared connection is gone or refused the stream: the next request opens
                // another.
                h2.reset();
            }
            attempts.failed(&picked, failure)?;
            session.rewind();
            Ok(None)
        }
    }
}
