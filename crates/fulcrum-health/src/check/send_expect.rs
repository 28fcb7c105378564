//! send_expect: connect, send the configured bytes, and pass once the reply contains the
//! expected bytes.

use fulcrum_config::Monitor;
use tokio::io::AsyncWriteExt;

use super::{connect, read_more, Probe, Verdict};
use crate::text::{self, contains_from, excerpt, resume_at, EXCERPT};

/// How much of the reply is searched before giving up.
const LIMIT: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) struct SendExpectCheck {
    send: Vec<u8>,
    /// Validation requires `expect`; without it, connecting and sending is the whole check.
    expect: Option<Vec<u8>>,
}

impl SendExpectCheck {
    pub fn new(monitor: &Monitor) -> Self {
        SendExpectCheck {
            send: monitor.send.clone().unwrap_or_default().into_bytes(),
            expect: monitor.expect.clone().map(String::into_bytes),
        }
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        let mut stream = match connect(probe).await {
            Ok(s) => s,
            Err(detail) => return Verdict::fail(detail),
        };
        if !self.send.is_empty() {
            match tokio::time::timeout_at(probe.deadline, stream.write_all(&self.send)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Verdict::fail(format!("send: {}", text::io_error(&e))),
                Err(_) => return Verdict::fail(format!("send: {}", probe.timed_out())),
            }
        }
        let Some(expect) = &self.expect else {
            return Verdict::pass("connected");
        };
        let mut buf = Vec::new();
        let mut from = 0;
        let wanted = excerpt(expect, EXCERPT);
        loop {
            if contains_from(&buf, expect, from) {
                return Verdict::pass(format!("got \"{wanted}\""));
            }
            from = resume_at(buf.len(), expect);
            if buf.len() >= LIMIT {
                return Verdict::fail(format!(
                    "expected \"{wanted}\", not in the first {} KiB",
                    LIMIT / 1024
                ));
            }
            match tokio::time::timeout_at(probe.deadline, read_more(&mut stream, &mut buf, LIMIT))
                .await
            {
                Ok(Ok(0)) if buf.is_empty() => {
                    return Verdict::fail(format!(
                        "expected \"{wanted}\", connection closed without a reply"
                    ))
                }
                Ok(Ok(0)) => {
                    return Verdict::fail(format!(
                        "expected \"{wanted}\", got \"{}\"",
                        excerpt(&buf, EXCERPT)
                    ))
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) if buf.is_empty() => {
                    return Verdict::fail(format!(
                        "expected \"{wanted}\", {} before a reply",
                        text::io_error(&e)
                    ))
                }
                Ok(Err(e)) => {
                    return Verdict::fail(format!(
                        "expected \"{wanted}\", {} after \"{}\"",
                        text::io_error(&e),
                        excerpt(&buf, EXCERPT)
                    ))
                }
                Err(_) if buf.is_empty() => {
                    return Verdict::fail(format!(
                        "{}: expected \"{wanted}\", got nothing",
                        probe.timed_out()
                    ))
                }
                Err(_) => {
                    return Verdict::fail(format!(
                        "{}: expected \"{wanted}\", got \"{}\"",
                        probe.timed_out(),
                        excerpt(&buf, EXCERPT)
                    ))
                }
            }
        }
    }
}
