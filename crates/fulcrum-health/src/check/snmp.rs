//! snmp: an SNMP v2c GET (RFC 3416) of one OID over UDP. Any value passes; an error status,
//! `noSuchObject`/`noSuchInstance`, a wrong community (no answer) or a timeout fails. With `max`
//! the value also sets the member's weight percentage, 100 × (max − value) ÷ max from 1 to 100,
//! through the same path as an agent's `NN%`, so `algorithm = "dynamic_feedback"` follows the
//! member's load without an agent on it.
//!
//! With `version = "3"` the same GET goes through USM (snmp_v3.rs): discovery of the agent's
//! engine, then an authenticated (and optionally encrypted) request.
//!
//! The message is a few nested BER TLVs; an SNMP library would bring MIB handling, sessions and
//! its own BER stack this check does not use, so the encoding and the bounded parser are
//! written here.

use std::net::SocketAddr;

use fulcrum_config::Monitor;
use tokio::net::UdpSocket;

use super::snmp_ber::*;
use super::udp::any_local;
use super::{AgentReply, Probe, Verdict};
use crate::text;

const SNMP_PORT: u16 = 161;
/// Largest datagram read: a GetResponse with one varbind fits easily.
const MAX_RESPONSE: usize = 4096;

const VERSION_2C: u8 = 1;

#[derive(Debug)]
pub(crate) struct SnmpCheck {
    community: Vec<u8>,
    v3: Option<super::snmp_v3::UsmUser>,
    oid: Vec<u32>,
    oid_text: String,
    max: Option<f64>,
    port: Option<u16>,
}

/// A GetRequest for `oid`.
pub(crate) fn get_request(community: &[u8], request_id: i32, oid: &[u32]) -> Vec<u8> {
    let varbind = tlv(SEQUENCE, &[oid_bytes(oid), vec![NULL, 0]].concat());
    let pdu = tlv(
        GET_REQUEST,
        &[
            integer(i64::from(request_id)),
            integer(0),
            integer(0),
            tlv(SEQUENCE, &varbind),
        ]
        .concat(),
    );
    tlv(
        SEQUENCE,
        &[
            integer(i64::from(VERSION_2C)),
            tlv(OCTET_STRING, community),
            pdu,
        ]
        .concat(),
    )
}

/// Parses a GetResponse to `request_id`: the first varbind's value. Errors are finished
/// details ("error status 2 (noSuchName)", "noSuchObject", "not an SNMP response: …").
/// Never panics, whatever the bytes.
pub fn parse_snmp_response(bytes: &[u8], request_id: i32) -> Result<SnmpValue, String> {
    let bad = |e: String| format!("not an SNMP response: {e}");
    let (msg, _) = expect(bytes, SEQUENCE, "message").map_err(bad)?;
    let (version, rest) = expect(msg, INTEGER, "version").map_err(bad)?;
    if int_value(version).map_err(bad)? != i64::from(VERSION_2C) {
        return Err(bad("not version 2c".into()));
    }
    let (_community, rest) = expect(rest, OCTET_STRING, "community").map_err(bad)?;
    let (tag, pdu, _) = fulcrum_tls::der::element(rest).map_err(|e| bad(format!("pdu: {e}")))?;
    parse_pdu(tag, pdu, request_id)
}

/// 100 × (max − value) ÷ max, from 1 to 100.
pub(crate) fn weight_pct(value: f64, max: f64) -> u32 {
    let pct = (100.0 * (max - value) / max).round();
    pct.clamp(1.0, 100.0) as u32
}

impl SnmpCheck {
    pub fn new(monitor: &Monitor) -> SnmpCheck {
        let oid = monitor.snmp.oid.clone().unwrap_or_default();
        SnmpCheck {
            community: monitor.snmp.community.clone().into_bytes(),
            v3: monitor.snmp.v3.as_ref().map(super::snmp_v3::UsmUser::new),
            oid_text: oid.iter().map(u32::to_string).collect::<Vec<_>>().join("."),
            oid,
            max: monitor.snmp.max,
            port: monitor.port,
        }
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        let addr = match self.port {
            Some(_) => probe.addr,
            None => SocketAddr::new(probe.addr.ip(), SNMP_PORT),
        };
        let sock = match UdpSocket::bind(any_local(addr)).await {
            Ok(s) => s,
            Err(e) => return Verdict::fail(format!("snmp: socket: {}", text::io_error(&e))),
        };
        if let Err(e) = sock.connect(addr).await {
            return Verdict::fail(format!("snmp: {}", text::io_error(&e)));
        }
        let value = match &self.v3 {
            None => self.get_v2c(&sock, probe).await,
            Some(user) => self.get_v3(user, &sock, probe).await,
        };
        match value {
            Err(e) => Verdict::fail(e),
            Ok(SnmpValue::Number(v)) => match self.max {
                Some(max) => {
                    let pct = weight_pct(v, max);
                    Verdict::Agent {
                        reply: AgentReply {
                            health: Some(true),
                            weight_pct: Some(pct),
                            ..AgentReply::default()
                        },
                        detail: format!("snmp {}: {v} of {max} -> weight {pct}%", self.oid_text),
                    }
                }
                None => Verdict::pass(format!("snmp {}: {v}", self.oid_text)),
            },
            Ok(SnmpValue::Text(t)) if self.max.is_some() => Verdict::fail(format!(
                "snmp {}: {t:?} is not a number (max is set)",
                self.oid_text
            )),
            Ok(SnmpValue::Text(t)) => Verdict::pass(format!("snmp {}: {t:?}", self.oid_text)),
        }
    }

    /// Sends `req` and returns the first datagram `accept` takes (`None`: not ours, keep
    /// waiting), within the probe's deadline.
    async fn exchange<T>(
        &self,
        sock: &UdpSocket,
        probe: &Probe,
        req: &[u8],
        timeout_hint: &str,
        mut accept: impl FnMut(&[u8]) -> Option<Result<T, String>>,
    ) -> Result<T, String> {
        sock.send(req)
            .await
            .map_err(|e| format!("snmp: send: {}", text::io_error(&e)))?;
        let mut buf = vec![0u8; MAX_RESPONSE];
        loop {
            let n = match tokio::time::timeout_at(probe.deadline, sock.recv(&mut buf)).await {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(format!("snmp: {}", text::io_error(&e))),
                Err(_) => return Err(format!("snmp: {} ({timeout_hint})", probe.timed_out())),
            };
            if let Some(r) = accept(&buf[..n]) {
                return r;
            }
        }
    }

    async fn get_v2c(&self, sock: &UdpSocket, probe: &Probe) -> Result<SnmpValue, String> {
        let id = (fastrand_id() & 0x7fff_ffff) as i32;
        let req = get_request(&self.community, id, &self.oid);
        // A wrong community gets no answer at all from net-snmp.
        self.exchange(
            sock,
            probe,
            &req,
            "community?",
            |b| match parse_snmp_response(b, id) {
                Err(e) if e == "a response to another request" => None,
                Err(e) => Some(Err(format!("snmp {}: {e}", self.oid_text))),
                Ok(v) => Some(Ok(v)),
            },
        )
        .await
    }

    /// Discovery (the agent's engine ID, boots and time, from a Report), then the GET with
    /// keys localised to that engine. Discovering at every check costs one more datagram and
    /// keeps the engine clock exact, so the time window (RFC 3414 §3.2 step 7) never bites.
    async fn get_v3(
        &self,
        user: &super::snmp_v3::UsmUser,
        sock: &UdpSocket,
        probe: &Probe,
    ) -> Result<SnmpValue, String> {
        use super::snmp_v3::{describe_report, discovery_request, parse_v3_response, V3Reply};
        let id = || (fastrand_id() & 0x7fff_ffff) as i32;
        let (msg_id, req_id) = (id(), id());
        let fail = |e: String| format!("snmp {}: {e}", self.oid_text);
        let engine = self
            .exchange(
                sock,
                probe,
                &discovery_request(msg_id, req_id),
                "no engine discovery answer",
                |b| match parse_v3_response(b, msg_id, req_id, None) {
                    Err(e) if e == "a response to another request" => None,
                    Err(e) => Some(Err(fail(format!("discovery: {e}")))),
                    Ok(V3Reply::Report { engine, .. }) if !engine.id.is_empty() => Some(Ok(engine)),
                    Ok(_) => Some(Err(fail("discovery: no engine ID in the answer".into()))),
                },
            )
            .await?;
        let keys = user.localize(&engine.id);
        let (msg_id, req_id) = (id(), id());
        let req = super::snmp_v3::get_request(
            user,
            &keys,
            &engine,
            msg_id,
            req_id,
            &self.oid,
            u64::from(fastrand_id()) << 32 | u64::from(fastrand_id()),
        );
        self.exchange(sock, probe, &req, "user, keys or security level?", |b| {
            match parse_v3_response(b, msg_id, req_id, Some(&keys)) {
                Err(e) if e == "a response to another request" => None,
                Err(e) if e.starts_with(super::snmp_v3::BELOW_LEVEL) => {
                    // Someone other than the agent may be answering: worth a line in the log
                    // beside the failed check.
                    tracing::warn!(agent = %probe.addr, "snmp {}: {e}", self.oid_text);
                    Some(Err(fail(e)))
                }
                Err(e) => Some(Err(fail(e))),
                Ok(V3Reply::Report { oid, .. }) => Some(Err(fail(describe_report(&oid)))),
                Ok(V3Reply::Value(v)) => Some(v.map_err(fail)),
            }
        })
        .await
    }
}

/// A request id: not secret, only distinct enough to pair a response with its request.
fn fastrand_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GetResponse built the way agents build one.
    fn response(id: i32, status: i64, value: Vec<u8>) -> Vec<u8> {
        let varbind = tlv(
            SEQUENCE,
            &[oid_bytes(&[1, 3, 6, 1, 2, 1, 1, 3, 0]), value].concat(),
        );
        let pdu = tlv(
            GET_RESPONSE,
            &[
                integer(i64::from(id)),
                integer(status),
                integer(0),
                tlv(SEQUENCE, &varbind),
            ]
            .concat(),
        );
        tlv(
            SEQUENCE,
            &[integer(1), tlv(OCTET_STRING, b"public"), pdu].concat(),
        )
    }

    #[test]
    fn request_encodes_as_net_snmp_does() {
        // snmpget -v2c -c public HOST 1.3.6.1.2.1.1.3.0 with request id 1 (from a capture).
        let req = get_request(b"public", 1, &[1, 3, 6, 1, 2, 1, 1, 3, 0]);
        assert_eq!(
            req,
            [
                0x30, 0x26, 0x02, 0x01, 0x01, 0x04, 0x06, b'p', b'u', b'b', b'l', b'i', b'c', 0xa0,
                0x19, 0x02, 0x01, 0x01, 0x02, 0x01, 0x00, 0x02, 0x01, 0x00, 0x30, 0x0e, 0x30, 0x0c,
                0x06, 0x08, 0x2b, 0x06, 0x01, 0x02, 0x01, 0x01, 0x03, 0x00, 0x05, 0x00
            ]
        );
        assert_eq!(
            oid_bytes(&[1, 3, 6, 1, 4, 1, 2021])[2..],
            [0x2b, 6, 1, 4, 1, 0x8f, 0x65]
        );
        assert_eq!(integer(128), [2, 2, 0, 128]);
        assert_eq!(integer(-1), [2, 1, 0xff]);
    }

    #[test]
    fn values_errors_and_garbage() {
        let r = response(7, 0, integer(150));
        assert_eq!(parse_snmp_response(&r, 7), Ok(SnmpValue::Number(150.0)));
        assert_eq!(
            parse_snmp_response(&r, 8),
            Err("a response to another request".into())
        );
        let r = response(7, 0, tlv(GAUGE32, &[0, 0xff, 0xff, 0xff, 0xff]));
        assert_eq!(
            parse_snmp_response(&r, 7),
            Ok(SnmpValue::Number(4294967295.0))
        );
        let r = response(7, 0, tlv(OCTET_STRING, b"0.42\n"));
        assert_eq!(parse_snmp_response(&r, 7), Ok(SnmpValue::Number(0.42)));
        let r = response(7, 0, vec![NO_SUCH_OBJECT, 0]);
        assert_eq!(parse_snmp_response(&r, 7), Err("noSuchObject".into()));
        let r = response(7, 2, vec![NULL, 0]);
        assert!(parse_snmp_response(&r, 7)
            .unwrap_err()
            .contains("noSuchName"));
        for cut in 0..r.len() {
            assert!(parse_snmp_response(&r[..cut], 7).is_err());
        }
        assert!(parse_snmp_response(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff], 7).is_err());
    }

    #[test]
    fn weights_follow_the_load() {
        assert_eq!(weight_pct(0.0, 400.0), 100);
        assert_eq!(weight_pct(100.0, 400.0), 75);
        assert_eq!(weight_pct(400.0, 400.0), 1);
        assert_eq!(weight_pct(900.0, 400.0), 1);
        assert_eq!(weight_pct(-5.0, 400.0), 100);
    }
}
