//! agent: HAProxy's agent-check protocol. The member's agent answers one line of words that set
//! its health, its weight and its admin state:
//! <https://docs.haproxy.org/2.6/configuration.html#5.2-agent-check>.

use fulcrum_balance::AgentState;
use fulcrum_config::Monitor;
use tokio::io::AsyncWriteExt;

use super::{connect, read_more, Probe, Verdict};
use crate::text::{self, excerpt};

/// Longest reply line read; HAProxy reads one buffer, and no agent needs more to say a few
/// words.
pub const MAX_LINE: usize = 1024;
/// Unknown words kept for the debug log, and how much of each.
const MAX_UNKNOWN: usize = 8;
const MAX_WORD: usize = 32;
const MAX_DESCRIPTION: usize = 128;
/// HAProxy's cap on an agent's weight percentage.
pub const MAX_WEIGHT_PCT: u32 = 256;

/// What an agent's reply says. Every field is optional: agents often report only a weight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentReply {
    /// `up` → `Some(true)`; `down`, `fail` or `stopped` → `Some(false)`; the last such word wins.
    pub health: Option<bool>,
    /// `drain`, `maint`, or `ready` (which lifts either).
    pub state: Option<AgentState>,
    /// `NN%`: the share of the configured weight, capped at 256.
    pub weight_pct: Option<u32>,
    /// `maxconn:NN`: understood, not applied.
    pub maxconn: Option<u32>,
    /// The text after `#`, e.g. why the agent reports `down`.
    pub description: Option<String>,
    /// Words not understood (the first few, each cut short), for a debug log.
    pub unknown: Vec<String>,
}

/// Parses an agent's reply: the first line of `bytes` (at most `MAX_LINE` bytes of it), words
/// separated by spaces, commas or tabs, case-insensitive, optionally followed by `#` and a
/// description. Never panics; allocations are bounded whatever the input.
pub fn parse_agent_reply(bytes: &[u8]) -> AgentReply {
    let line = first_line(bytes);
    let (words, description) = match line.iter().position(|&b| b == b'#') {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    let mut reply = AgentReply {
        description: description
            .map(|d| {
                String::from_utf8_lossy(d.trim_ascii())
                    .chars()
                    .take(MAX_DESCRIPTION)
                    .collect::<String>()
            })
            .filter(|d| !d.is_empty()),
        ..AgentReply::default()
    };
    let separators = |b: &u8| matches!(b, b' ' | b',' | b'\t' | b'\r');
    for word in words.split(separators).filter(|w| !w.is_empty()) {
        let is = |w: &[u8]| word.eq_ignore_ascii_case(w);
        if is(b"up") {
            reply.health = Some(true);
        } else if is(b"down") || is(b"fail") || is(b"stopped") {
            reply.health = Some(false);
        } else if is(b"drain") {
            reply.state = Some(AgentState::Drain);
        } else if is(b"maint") {
            reply.state = Some(AgentState::Maint);
        } else if is(b"ready") {
            reply.state = Some(AgentState::None);
        } else if let Some(n) = word.strip_suffix(b"%").and_then(number) {
            reply.weight_pct = Some(n.min(MAX_WEIGHT_PCT));
        } else if let Some(n) = strip_prefix_ignore_case(word, b"maxconn:").and_then(number) {
            reply.maxconn = Some(n);
        } else if reply.unknown.len() < MAX_UNKNOWN {
            reply.unknown.push(excerpt(word, MAX_WORD));
        }
    }
    reply
}

/// The reply up to its first newline, at most `MAX_LINE` bytes, without a trailing CR.
fn first_line(bytes: &[u8]) -> &[u8] {
    let bytes = &bytes[..bytes.len().min(MAX_LINE)];
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A decimal number of ASCII digits, saturating at `u32::MAX`.
fn number(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u32, |n, d| {
        n.saturating_mul(10).saturating_add(u32::from(d - b'0'))
    }))
}

fn strip_prefix_ignore_case<'a>(word: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (word.len() >= prefix.len() && word[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &word[prefix.len()..])
}

#[derive(Debug)]
pub(crate) struct AgentCheck {
    send: Vec<u8>,
}

impl AgentCheck {
    pub fn new(monitor: &Monitor) -> Self {
        AgentCheck {
            send: monitor.send.clone().unwrap_or_default().into_bytes(),
        }
    }

    /// Connection trouble yields `Verdict::Nothing`: HAProxy leaves reachability to the health
    /// checks, so an agent that is down (or not deployed yet) never takes a member down.
    pub async fn run(&self, probe: &Probe) -> Verdict {
        let nothing = |why: String| Verdict::Nothing { why };
        let mut stream = match connect(probe).await {
            Ok(s) => s,
            Err(detail) => return nothing(detail),
        };
        if !self.send.is_empty() {
            match tokio::time::timeout_at(probe.deadline, stream.write_all(&self.send)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return nothing(format!("send: {}", text::io_error(&e))),
                Err(_) => return nothing(format!("send: {}", probe.timed_out())),
            }
        }
        let mut buf = Vec::with_capacity(128);
        while !buf.contains(&b'\n') && buf.len() < MAX_LINE {
            match tokio::time::timeout_at(
                probe.deadline,
                read_more(&mut stream, &mut buf, MAX_LINE),
            )
            .await
            {
                Ok(Ok(0)) => break,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return nothing(text::io_error(&e)),
                Err(_) => return nothing(format!("{} waiting for the agent", probe.timed_out())),
            }
        }
        let line = first_line(&buf);
        Verdict::Agent {
            reply: parse_agent_reply(line),
            detail: format!("agent: {}", excerpt(line.trim_ascii(), 64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_separators() {
        let r = parse_agent_reply(b"up 75%\n");
        assert_eq!(r.health, Some(true));
        assert_eq!(r.weight_pct, Some(75));
        assert_eq!(r.state, None);

        let r = parse_agent_reply(b"DRAIN,50%\tmaxconn:30\r\n");
        assert_eq!(r.state, Some(AgentState::Drain));
        assert_eq!(r.weight_pct, Some(50));
        assert_eq!(r.maxconn, Some(30));
        assert_eq!(r.health, None);

        let r = parse_agent_reply(b"down#disk full  \nup\n");
        assert_eq!(r.health, Some(false), "only the first line counts");
        assert_eq!(r.description.as_deref(), Some("disk full"));

        assert_eq!(parse_agent_reply(b"fail").health, Some(false));
        assert_eq!(parse_agent_reply(b"stopped").health, Some(false));
        assert_eq!(parse_agent_reply(b"maint").state, Some(AgentState::Maint));
        assert_eq!(parse_agent_reply(b"ready").state, Some(AgentState::None));
        assert_eq!(
            parse_agent_reply(b"up down").health,
            Some(false),
            "last wins"
        );
    }

    #[test]
    fn weights_are_capped_and_checked() {
        assert_eq!(parse_agent_reply(b"0%").weight_pct, Some(0));
        assert_eq!(parse_agent_reply(b"300%").weight_pct, Some(256));
        assert_eq!(
            parse_agent_reply(b"99999999999999999999%").weight_pct,
            Some(256)
        );
        let r = parse_agent_reply(b"%  x% 5.5% -1% maxconn:x");
        assert_eq!(r.weight_pct, None);
        assert_eq!(r.maxconn, None);
        assert_eq!(r.unknown, ["%", "x%", "5.5%", "-1%", "maxconn:x"]);
    }

    #[test]
    fn unknown_words_are_bounded() {
        let r = parse_agent_reply(&b"zz ".repeat(1000));
        assert_eq!(r.unknown.len(), MAX_UNKNOWN);
        let long = [b"a".repeat(500), b" up".to_vec()].concat();
        let r = parse_agent_reply(&long);
        assert_eq!(r.health, Some(true));
        assert!(r.unknown[0].chars().count() <= MAX_WORD + 1);
        // Past MAX_LINE nothing is read.
        let far = [b" ".repeat(MAX_LINE), b"down".to_vec()].concat();
        assert_eq!(parse_agent_reply(&far), AgentReply::default());
    }

    #[test]
    fn empty_and_binary_replies() {
        assert_eq!(parse_agent_reply(b""), AgentReply::default());
        assert_eq!(parse_agent_reply(b"\n"), AgentReply::default());
        let r = parse_agent_reply(b"\xff\xfe up #\xc3\x28");
        assert_eq!(r.health, Some(true));
        assert_eq!(r.unknown, ["\\xff\\xfe"]);
        assert_eq!(r.description.as_deref(), Some("\u{fffd}("));
    }

    #[test]
    fn random_input_never_panics() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        let alphabet = b"updownfailstoppeddrainmaintready%0123456789:#,\t \r\n\xff";
        for i in 0..10_000 {
            let len = rng.usize(0..if i % 10 == 0 { 2048 } else { 64 });
            let bytes: Vec<u8> = if i % 2 == 0 {
                (0..len).map(|_| rng.u8(..)).collect()
            } else {
                (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect()
            };
            let r = parse_agent_reply(&bytes);
            assert!(r.weight_pct.is_none_or(|p| p <= MAX_WEIGHT_PCT));
            assert!(r.unknown.len() <= MAX_UNKNOWN);
        }
    }
}
