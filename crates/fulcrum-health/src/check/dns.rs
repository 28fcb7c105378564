//! dns: one query over UDP (hickory-proto for the wire format); the member passes when it
//! answers our query with the expected response code and, if configured, an answer record
//! containing the expected text.

use std::str::FromStr;

use fulcrum_config::Monitor;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::net::UdpSocket;

use super::udp::{any_local, udp_exchange, UdpExchange};
use super::{Probe, Verdict};
use crate::text;

#[derive(Debug)]
pub(crate) struct DnsCheck {
    /// The query, or why the monitor's name/type cannot make one (every run fails with it).
    query: Result<Query, String>,
    rcode: u16,
    rcode_name: String,
    expect_answer: Option<String>,
}

/// The query over TCP (2-byte length prefix), for an answer that was truncated over UDP.
async fn query_tcp(probe: &Probe, wire: &[u8], id: u16) -> Result<Message, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = super::connect(probe).await?;
    let len = u16::try_from(wire.len()).map_err(|_| "query too long".to_string())?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(wire);
    let exchange = async {
        stream.write_all(&out).await?;
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await?;
        let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let body = match tokio::time::timeout_at(probe.deadline, exchange).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(text::io_error(&e)),
        Err(_) => return Err(probe.timed_out()),
    };
    let answer = Message::from_vec(&body).map_err(|_| "not a DNS message".to_string())?;
    if answer.metadata.id != id {
        return Err("an answer to another query".into());
    }
    Ok(answer)
}

/// Response code numbers of the names validation allows.
fn rcode_number(name: &str) -> u16 {
    match name {
        "FORMERR" => 1,
        "SERVFAIL" => 2,
        "NXDOMAIN" => 3,
        "NOTIMP" => 4,
        "REFUSED" => 5,
        _ => 0,
    }
}

fn rcode_name(n: u16) -> String {
    match n {
        0 => "NOERROR".into(),
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        3 => "NXDOMAIN".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        n => format!("RCODE{n}"),
    }
}

impl DnsCheck {
    pub fn new(monitor: &Monitor) -> Self {
        let name = monitor.query.as_deref().unwrap_or(".");
        let query = Name::from_ascii(name)
            .map_err(|e| format!("invalid query name {name:?}: {e}"))
            .and_then(|mut n| {
                n.set_fqdn(true);
                let t = RecordType::from_str(&monitor.query_type)
                    .map_err(|_| format!("unknown record type {:?}", monitor.query_type))?;
                Ok(Query::query(n, t))
            });
        DnsCheck {
            query,
            rcode: rcode_number(&monitor.expect_rcode),
            rcode_name: monitor.expect_rcode.clone(),
            expect_answer: monitor.expect_answer.clone(),
        }
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        let query = match &self.query {
            Ok(q) => q.clone(),
            Err(e) => return Verdict::fail(e.clone()),
        };
        let id: u16 = fastrand::u16(..);
        let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
        msg.metadata.recursion_desired = true;
        msg.add_query(query.clone());
        let wire = match msg.to_vec() {
            Ok(w) => w,
            Err(e) => return Verdict::fail(format!("cannot encode the query: {e}")),
        };
        let local = any_local(probe.addr);
        let bound = || -> std::io::Result<UdpSocket> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(local),
                socket2::Type::DGRAM,
                None,
            )?;
            s.set_nonblocking(true)?;
            match &probe.via {
                Some(via) if via.source.is_some() => via.apply(&s, true)?,
                Some(via) => {
                    via.apply(&s, false)?;
                    s.bind(&local.into())?;
                }
                None => s.bind(&local.into())?,
            }
            UdpSocket::from_std(s.into())
        };
        let socket = match bound() {
            Ok(s) => s,
            Err(e) => return Verdict::fail(format!("socket: {}", text::io_error(&e))),
        };
        let exchange = udp_exchange(socket, &wire, probe, "DNS", |datagram| {
            let Ok(answer) = Message::from_vec(datagram) else {
                return Some(Err(Verdict::fail(format!(
                    "not a DNS message: \"{}\"",
                    text::excerpt(datagram, text::EXCERPT)
                ))));
            };
            if answer.metadata.id != id || answer.metadata.message_type != MessageType::Response {
                return None; // a late answer to an earlier check
            }
            Some(Ok(answer))
        });
        let answer = match exchange.await {
            UdpExchange::Answer(Ok(answer)) => answer,
            UdpExchange::Answer(Err(v)) | UdpExchange::Failed(v) => return v,
            UdpExchange::TimedOut => {
                return Verdict::fail(format!("{}: no DNS answer", probe.timed_out()))
            }
        };
        if answer.metadata.truncation {
            // Too big for a datagram: ask again over TCP (RFC 7766).
            return match query_tcp(probe, &wire, id).await {
                Ok(full) => self.judge(&full, &query),
                Err(e) => Verdict::fail(format!("truncated over UDP; TCP: {e}")),
            };
        }
        self.judge(&answer, &query)
    }

    fn judge(&self, answer: &Message, query: &Query) -> Verdict {
        let rcode = u16::from(answer.metadata.response_code);
        let got = rcode_name(rcode);
        if rcode != self.rcode {
            return Verdict::fail(format!("DNS {got}, expected {}", self.rcode_name));
        }
        let Some(expected) = &self.expect_answer else {
            return Verdict::pass(format!("DNS {got}, {} answers", answer.answers.len()));
        };
        let texts: Vec<String> = answer.answers.iter().map(|r| r.data.to_string()).collect();
        if texts.iter().any(|t| t.contains(expected.as_str())) {
            Verdict::pass(format!("DNS {got}, answer {expected}"))
        } else if texts.is_empty() {
            Verdict::fail(format!(
                "DNS {got}, no {} answer for {}; expected {expected}",
                query.query_type(),
                query.name()
            ))
        } else {
            Verdict::fail(format!(
                "DNS {got}, answers {}; expected {expected}",
                text::excerpt(texts.join(", ").as_bytes(), 80)
            ))
        }
    }
}

/// For the fuzz target `health_replies`: `reply` judged as the answer to an `A www.example.`
/// check expecting `192.0.2.1`; true when it passes, `None` when it is not a DNS message.
#[doc(hidden)]
pub fn fuzz_judge(reply: &[u8]) -> Option<bool> {
    let answer = Message::from_vec(reply).ok()?;
    let query = Query::query(Name::from_ascii("www.example.").ok()?, RecordType::A);
    let check = DnsCheck {
        query: Ok(query.clone()),
        rcode: 0,
        rcode_name: "NOERROR".into(),
        expect_answer: Some("192.0.2.1".into()),
    };
    Some(matches!(
        check.judge(&answer, &query),
        Verdict::Health { ok: true, .. }
    ))
}
