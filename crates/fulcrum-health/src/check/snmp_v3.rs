//! SNMPv3 with the User-based Security Model (RFC 3414): engine discovery, key localisation,
//! HMAC-SHA-96 / HMAC-SHA-256-192 (RFC 7860) authentication and AES-128-CFB privacy (RFC 3826),
//! for the snmp monitor's one GET.
//!
//! Written here on the v2c check's BER code and RustCrypto primitives rather than taken from an
//! SNMP crate: the maintained ones (snmp2, async-snmp) bring sessions, walks, MIBs, agents and
//! their own BER stack for what is one request and one response here, and the parser of the
//! reply must be one this project fuzzes (fuzz target `snmp_v3_response`).

use aes::cipher::{AsyncStreamCipher, KeyIvInit};
use fulcrum_config::{SnmpAuth, SnmpV3};
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::snmp_ber::{expect, int_value, integer, oid_bytes, parse_pdu, tlv, SnmpValue};
use super::snmp_ber::{GET_REQUEST, INTEGER, NULL, OCTET_STRING, OID, SEQUENCE};

const VERSION_3: i64 = 3;
const USM: i64 = 3;
const REPORT: u8 = 0xa8;
const FLAG_AUTH: u8 = 0x01;
const FLAG_PRIV: u8 = 0x02;
const FLAG_REPORTABLE: u8 = 0x04;
/// The largest message this side accepts (msgMaxSize), as net-snmp advertises.
const MAX_SIZE: i64 = 65507;

type Aes128CfbEnc = cfb_mode::Encryptor<aes::Aes128>;
type Aes128CfbDec = cfb_mode::Decryptor<aes::Aes128>;

/// A user's keys: the password-derived master keys (computed once, ~1 MB of hashing each),
/// localised to an engine at use.
#[derive(Clone)]
pub struct UsmUser {
    /// msgUserName.
    pub name: Vec<u8>,
    auth: SnmpAuth,
    auth_master: Vec<u8>,
    priv_master: Option<Vec<u8>>,
}

impl std::fmt::Debug for UsmUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsmUser")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("auth", &self.auth)
            .field("privacy", &self.priv_master.is_some())
            .finish()
    }
}

/// Keys localised to one engine (RFC 3414 §2.6).
#[derive(Clone)]
pub struct LocalKeys {
    auth: SnmpAuth,
    auth_key: Vec<u8>,
    /// AES-128: the first 16 bytes of the localised privacy key.
    priv_key: Option<[u8; 16]>,
}

fn hash(auth: SnmpAuth, parts: &[&[u8]]) -> Vec<u8> {
    match auth {
        SnmpAuth::Sha1 => {
            let mut h = Sha1::new();
            parts.iter().for_each(|p| h.update(p));
            h.finalize().to_vec()
        }
        SnmpAuth::Sha256 => {
            let mut h = Sha256::new();
            parts.iter().for_each(|p| h.update(p));
            h.finalize().to_vec()
        }
    }
}

/// RFC 3414 A.2: the hash of 1 MiB of the password repeated.
fn password_to_key(auth: SnmpAuth, password: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 << 20);
    if password.is_empty() {
        return hash(auth, &[]);
    }
    while buf.len() < 1 << 20 {
        let take = password.len().min((1 << 20) - buf.len());
        buf.extend_from_slice(&password[..take]);
    }
    hash(auth, &[&buf])
}

/// The truncated MAC length: 12 bytes for HMAC-SHA-96, 24 for HMAC-SHA-256-192.
fn mac_len(auth: SnmpAuth) -> usize {
    match auth {
        SnmpAuth::Sha1 => 12,
        SnmpAuth::Sha256 => 24,
    }
}

fn mac(auth: SnmpAuth, key: &[u8], msg: &[u8]) -> Vec<u8> {
    let full = match auth {
        SnmpAuth::Sha1 => Hmac::<Sha1>::new_from_slice(key).map(|mut m| {
            m.update(msg);
            m.finalize().into_bytes().to_vec()
        }),
        SnmpAuth::Sha256 => Hmac::<Sha256>::new_from_slice(key).map(|mut m| {
            m.update(msg);
            m.finalize().into_bytes().to_vec()
        }),
    };
    // HMAC takes keys of any length; the error arm cannot happen.
    let mut full = full.unwrap_or_default();
    full.truncate(mac_len(auth));
    full
}

impl UsmUser {
    /// Derives the master keys from the monitor's passwords.
    pub fn new(v3: &SnmpV3) -> UsmUser {
        UsmUser {
            name: v3.user.clone().into_bytes(),
            auth: v3.auth,
            auth_master: password_to_key(v3.auth, v3.auth_password.as_bytes()),
            priv_master: v3
                .privacy
                .as_ref()
                .map(|(_, p)| password_to_key(v3.auth, p.as_bytes())),
        }
    }

    /// The keys for `engine_id`: H(Ku ‖ engineID ‖ Ku).
    pub fn localize(&self, engine_id: &[u8]) -> LocalKeys {
        let local = |master: &[u8]| hash(self.auth, &[master, engine_id, master]);
        LocalKeys {
            auth: self.auth,
            auth_key: local(&self.auth_master),
            priv_key: self.priv_master.as_deref().map(|m| {
                let k = local(m);
                let mut out = [0u8; 16];
                out.copy_from_slice(&k[..16]);
                out
            }),
        }
    }
}

/// The authoritative engine's identity and clock, from discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// snmpEngineID.
    pub id: Vec<u8>,
    /// snmpEngineBoots.
    pub boots: i64,
    /// snmpEngineTime, seconds since the last boot.
    pub time: i64,
}

/// USM security parameters as sent and received.
struct SecParams<'a> {
    engine_id: &'a [u8],
    boots: i64,
    time: i64,
    user: &'a [u8],
    auth: &'a [u8],
    privacy: &'a [u8],
}

fn sec_params(p: &SecParams<'_>) -> Vec<u8> {
    tlv(
        SEQUENCE,
        &[
            tlv(OCTET_STRING, p.engine_id),
            integer(p.boots),
            integer(p.time),
            tlv(OCTET_STRING, p.user),
            tlv(OCTET_STRING, p.auth),
            tlv(OCTET_STRING, p.privacy),
        ]
        .concat(),
    )
}

fn get_pdu(request_id: i32, oid: &[u32]) -> Vec<u8> {
    let list = if oid.is_empty() {
        Vec::new()
    } else {
        tlv(SEQUENCE, &[oid_bytes(oid), vec![NULL, 0]].concat())
    };
    tlv(
        GET_REQUEST,
        &[
            integer(i64::from(request_id)),
            integer(0),
            integer(0),
            tlv(SEQUENCE, &list),
        ]
        .concat(),
    )
}

fn message(msg_id: i32, flags: u8, params: &[u8], data: &[u8]) -> Vec<u8> {
    let global = tlv(
        SEQUENCE,
        &[
            integer(i64::from(msg_id)),
            integer(MAX_SIZE),
            tlv(OCTET_STRING, &[flags]),
            integer(USM),
        ]
        .concat(),
    );
    tlv(
        SEQUENCE,
        &[
            integer(VERSION_3),
            global,
            tlv(OCTET_STRING, params),
            data.to_vec(),
        ]
        .concat(),
    )
}

/// The discovery request (RFC 3414 §4): no user, no engine, an empty GET, reportable.
pub fn discovery_request(msg_id: i32, request_id: i32) -> Vec<u8> {
    let params = sec_params(&SecParams {
        engine_id: &[],
        boots: 0,
        time: 0,
        user: &[],
        auth: &[],
        privacy: &[],
    });
    let scoped = tlv(
        SEQUENCE,
        &[
            tlv(OCTET_STRING, &[]),
            tlv(OCTET_STRING, &[]),
            get_pdu(request_id, &[]),
        ]
        .concat(),
    );
    message(msg_id, FLAG_REPORTABLE, &params, &scoped)
}

/// An authenticated (and, with a privacy key, encrypted) GET of `oid`. `salt` makes the AES IV
/// unique per message (RFC 3826 §3.1.2.1: a counter or random 64 bits).
pub fn get_request(
    user: &UsmUser,
    keys: &LocalKeys,
    engine: &Engine,
    msg_id: i32,
    request_id: i32,
    oid: &[u32],
    salt: u64,
) -> Vec<u8> {
    let scoped = tlv(
        SEQUENCE,
        &[
            tlv(OCTET_STRING, &engine.id),
            tlv(OCTET_STRING, &[]),
            get_pdu(request_id, oid),
        ]
        .concat(),
    );
    let (flags, data, privacy) = match &keys.priv_key {
        Some(k) => {
            let salt = salt.to_be_bytes();
            let mut enc = scoped;
            Aes128CfbEnc::new(k.into(), &iv(engine.boots, engine.time, &salt).into())
                .encrypt(&mut enc);
            (
                FLAG_AUTH | FLAG_PRIV | FLAG_REPORTABLE,
                tlv(OCTET_STRING, &enc),
                salt.to_vec(),
            )
        }
        None => (FLAG_AUTH | FLAG_REPORTABLE, scoped, Vec::new()),
    };
    let placeholder = vec![0u8; mac_len(keys.auth)];
    let params = sec_params(&SecParams {
        engine_id: &engine.id,
        boots: engine.boots,
        time: engine.time,
        user: &user.name,
        auth: &placeholder,
        privacy: &privacy,
    });
    let mut msg = message(msg_id, flags, &params, &data);
    if let Some(at) = auth_offset(&msg, &params, &placeholder) {
        let m = mac(keys.auth, &keys.auth_key, &msg);
        msg[at..at + m.len()].copy_from_slice(&m);
    }
    msg
}

/// Where msgAuthenticationParameters' bytes start in `msg`, given the encoded parameters.
fn auth_offset(msg: &[u8], params: &[u8], auth: &[u8]) -> Option<usize> {
    let p = msg.windows(params.len()).position(|w| w == params)?;
    let a = params
        .windows(auth.len() + 2)
        .position(|w| w[0] == OCTET_STRING && usize::from(w[1]) == auth.len() && w[2..] == *auth)?;
    Some(p + a + 2)
}

fn iv(boots: i64, time: i64, salt: &[u8; 8]) -> [u8; 16] {
    let mut iv = [0u8; 16];
    iv[..4].copy_from_slice(&(boots as u32).to_be_bytes());
    iv[4..8].copy_from_slice(&(time as u32).to_be_bytes());
    iv[8..].copy_from_slice(salt);
    iv
}

/// What came back.
#[derive(Debug, PartialEq)]
pub enum V3Reply {
    /// A Report: the agent's engine (discovery), with the report's counter OID as text.
    Report {
        /// The reporting engine (discovery's answer).
        engine: Engine,
        /// The counter reported, e.g. usmStatsUnknownEngineIDs.0.
        oid: String,
    },
    /// The GetResponse's value (or its error).
    Value(Result<SnmpValue, String>),
}

/// The names of the USM and MPD report counters a failed request draws.
fn report_reason(oid: &str) -> &'static str {
    match oid {
        "1.3.6.1.6.3.15.1.1.1.0" => "unsupported security level",
        "1.3.6.1.6.3.15.1.1.2.0" => "not in time window",
        "1.3.6.1.6.3.15.1.1.3.0" => "unknown user name",
        "1.3.6.1.6.3.15.1.1.4.0" => "unknown engine ID",
        "1.3.6.1.6.3.15.1.1.5.0" => "wrong digest (auth password?)",
        "1.3.6.1.6.3.15.1.1.6.0" => "decryption error (priv password?)",
        _ => "report",
    }
}

/// The reason a report names, for details.
pub fn describe_report(oid: &str) -> String {
    format!("{} ({oid})", report_reason(oid))
}

fn oid_text(v: &[u8]) -> String {
    let mut arcs = Vec::new();
    let mut acc: u64 = 0;
    for &b in v {
        acc = (acc << 7) | u64::from(b & 0x7f);
        if acc > u64::from(u32::MAX) {
            return "?".into();
        }
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (acc / 40).min(2);
                arcs.push(first);
                arcs.push(acc - first * 40);
            } else {
                arcs.push(acc);
            }
            acc = 0;
        }
    }
    arcs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// Parses a v3 reply to `msg_id` / `request_id`. With `keys`, an authenticated reply must
/// carry a valid MAC and an encrypted one is decrypted; a Report may come unauthenticated (as
/// discovery's does, and as agents answer a wrong digest). Never panics, whatever the bytes.
pub fn parse_v3_response(
    bytes: &[u8],
    msg_id: i32,
    request_id: i32,
    keys: Option<&LocalKeys>,
) -> Result<V3Reply, String> {
    let bad = |e: String| format!("not an SNMPv3 response: {e}");
    let (msg, _) = expect(bytes, SEQUENCE, "message").map_err(bad)?;
    let (version, rest) = expect(msg, INTEGER, "version").map_err(bad)?;
    if int_value(version).map_err(bad)? != VERSION_3 {
        return Err(bad("not version 3".into()));
    }
    let (global, rest) = expect(rest, SEQUENCE, "msgGlobalData").map_err(bad)?;
    let (id, g) = expect(global, INTEGER, "msgID").map_err(bad)?;
    if int_value(id).map_err(bad)? != i64::from(msg_id) {
        return Err("a response to another request".into());
    }
    let (_max, g) = expect(g, INTEGER, "msgMaxSize").map_err(bad)?;
    let (flags, g) = expect(g, OCTET_STRING, "msgFlags").map_err(bad)?;
    let (model, _) = expect(g, INTEGER, "msgSecurityModel").map_err(bad)?;
    if int_value(model).map_err(bad)? != USM {
        return Err(bad("security model is not USM".into()));
    }
    let flags = *flags.first().ok_or_else(|| bad("empty msgFlags".into()))?;
    let (params_raw, data) = expect(rest, OCTET_STRING, "msgSecurityParameters").map_err(bad)?;
    let (params, _) = expect(params_raw, SEQUENCE, "UsmSecurityParameters").map_err(bad)?;
    let (engine_id, p) = expect(params, OCTET_STRING, "engine ID").map_err(bad)?;
    let (boots, p) = expect(p, INTEGER, "engine boots").map_err(bad)?;
    let (time, p) = expect(p, INTEGER, "engine time").map_err(bad)?;
    let (_user, p) = expect(p, OCTET_STRING, "user name").map_err(bad)?;
    let (auth, p) = expect(p, OCTET_STRING, "auth parameters").map_err(bad)?;
    let (salt, _) = expect(p, OCTET_STRING, "priv parameters").map_err(bad)?;
    let engine = Engine {
        id: engine_id.to_vec(),
        boots: int_value(boots).map_err(bad)?,
        time: int_value(time).map_err(bad)?,
    };
    if flags & FLAG_AUTH != 0 {
        let Some(k) = keys else {
            return Err(bad("authenticated before discovery".into()));
        };
        if auth.len() != mac_len(k.auth) {
            return Err("authentication failed: wrong MAC length".into());
        }
        // The MAC covers the message with its own field zeroed; the field is a slice of
        // `bytes`, so its offset is where it lies.
        let at = auth.as_ptr() as usize - bytes.as_ptr() as usize;
        let mut zeroed = bytes[..bytes.len() - rest_len(bytes, msg)].to_vec();
        zeroed[at..at + auth.len()].fill(0);
        if mac(k.auth, &k.auth_key, &zeroed) != auth {
            return Err(
                "authentication failed: the response's MAC is wrong (auth password?)".into(),
            );
        }
    }
    let plain;
    let scoped_bytes: &[u8] = if flags & FLAG_PRIV != 0 {
        let key = keys
            .and_then(|k| k.priv_key)
            .ok_or_else(|| bad("encrypted, and no privacy key".into()))?;
        if flags & FLAG_AUTH == 0 {
            return Err(bad("privacy without authentication".into()));
        }
        let salt: [u8; 8] = salt
            .try_into()
            .map_err(|_| bad("priv parameters are not 8 bytes".into()))?;
        let (enc, _) = expect(data, OCTET_STRING, "encryptedPDU").map_err(bad)?;
        let mut buf = enc.to_vec();
        Aes128CfbDec::new((&key).into(), &iv(engine.boots, engine.time, &salt).into())
            .decrypt(&mut buf);
        plain = buf;
        &plain
    } else {
        data
    };
    let (scoped, _) = expect(scoped_bytes, SEQUENCE, "scopedPDU")
        .map_err(|e| bad(format!("{e} (decryption with the wrong priv password?)")))?;
    let (_ctx_engine, s) = expect(scoped, OCTET_STRING, "contextEngineID").map_err(bad)?;
    let (_ctx_name, s) = expect(s, OCTET_STRING, "contextName").map_err(bad)?;
    let (tag, pdu, _) = fulcrum_tls::der::element(s).map_err(|e| bad(format!("pdu: {e}")))?;
    if tag == REPORT {
        let (_id, r) = expect(pdu, INTEGER, "request-id").map_err(bad)?;
        let (_s, r) = expect(r, INTEGER, "error-status").map_err(bad)?;
        let (_i, r) = expect(r, INTEGER, "error-index").map_err(bad)?;
        let (list, _) = expect(r, SEQUENCE, "varbind list").map_err(bad)?;
        let (vb, _) = expect(list, SEQUENCE, "varbind").map_err(bad)?;
        let (oid, _) = expect(vb, OID, "name").map_err(bad)?;
        return Ok(V3Reply::Report {
            engine,
            oid: oid_text(oid),
        });
    }
    // A GetResponse is only as trustworthy as its security level: one with less than the
    // request asked for (no MAC, or in clear after an encrypted request) could come from
    // anyone able to send a datagram to this socket.
    if let Some(k) = keys {
        let wanted = FLAG_AUTH | if k.priv_key.is_some() { FLAG_PRIV } else { 0 };
        if flags & wanted != wanted {
            return Err(format!(
                "{BELOW_LEVEL}: {} in reply to {}",
                level_name(flags),
                level_name(wanted)
            ));
        }
    }
    Ok(V3Reply::Value(parse_pdu(tag, pdu, request_id)))
}

/// The start of the error for a reply below the request's security level.
pub const BELOW_LEVEL: &str = "refused a response below the request's security level";

fn level_name(flags: u8) -> &'static str {
    match (flags & FLAG_AUTH != 0, flags & FLAG_PRIV != 0) {
        (true, true) => "authPriv",
        (true, false) => "authNoPriv",
        (false, _) => "noAuthNoPriv",
    }
}

/// A reply without authentication or privacy (msgFlags 0) carrying `pdu`: what anyone who can
/// send a datagram could forge, for the fake agents of tests.
#[cfg(test)]
pub(crate) fn unauthenticated_reply(msg_id: i32, engine: &Engine, pdu: Vec<u8>) -> Vec<u8> {
    let scoped = tlv(
        SEQUENCE,
        &[tlv(OCTET_STRING, &engine.id), tlv(OCTET_STRING, &[]), pdu].concat(),
    );
    let params = sec_params(&SecParams {
        engine_id: &engine.id,
        boots: engine.boots,
        time: engine.time,
        user: b"fulcrum",
        auth: &[],
        privacy: &[],
    });
    message(msg_id, 0, &params, &scoped)
}

/// Bytes after the outer message (trailing garbage is not part of the MAC).
fn rest_len(bytes: &[u8], msg: &[u8]) -> usize {
    let end = msg.as_ptr() as usize + msg.len() - bytes.as_ptr() as usize;
    bytes.len() - end
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_config::SnmpPriv;

    fn user(auth: SnmpAuth, privacy: bool) -> UsmUser {
        UsmUser::new(&SnmpV3 {
            user: "fulcrum".into(),
            auth,
            auth_password: "maplesyrup".into(),
            privacy: privacy.then(|| (SnmpPriv::Aes128, "maplesyrup".to_string())),
        })
    }

    #[test]
    fn keys_match_rfc_3414_and_7860_vectors() {
        // RFC 3414 A.3.2: "maplesyrup", engine 00..02 → SHA-1 localized key.
        let engine = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let k = user(SnmpAuth::Sha1, false).localize(&engine);
        assert_eq!(
            k.auth_key,
            [
                0x66, 0x95, 0xfe, 0xbc, 0x92, 0x88, 0xe3, 0x62, 0x82, 0x23, 0x5f, 0xc7, 0x15, 0x1f,
                0x12, 0x84, 0x97, 0xb3, 0x8f, 0x3f
            ]
        );
        // The SHA-256 path derives keys of the hash's length.
        let u = user(SnmpAuth::Sha256, true);
        let k = u.localize(&engine);
        assert_eq!((k.auth_key.len(), u.auth_master.len()), (32, 32));
        assert_ne!(k.auth_key, u.auth_master);
    }

    fn agent_reply(
        keys: &LocalKeys,
        engine: &Engine,
        msg_id: i32,
        pdu: Vec<u8>,
        privacy: bool,
    ) -> Vec<u8> {
        let scoped = tlv(
            SEQUENCE,
            &[tlv(OCTET_STRING, &engine.id), tlv(OCTET_STRING, &[]), pdu].concat(),
        );
        let salt = 7u64.to_be_bytes();
        let (flags, data, privp) = if privacy {
            let mut enc = scoped;
            Aes128CfbEnc::new(
                (&keys.priv_key.unwrap()).into(),
                &iv(engine.boots, engine.time, &salt).into(),
            )
            .encrypt(&mut enc);
            (
                FLAG_AUTH | FLAG_PRIV,
                tlv(OCTET_STRING, &enc),
                salt.to_vec(),
            )
        } else {
            (FLAG_AUTH, scoped, vec![])
        };
        let ph = vec![0u8; mac_len(keys.auth)];
        let params = sec_params(&SecParams {
            engine_id: &engine.id,
            boots: engine.boots,
            time: engine.time,
            user: b"fulcrum",
            auth: &ph,
            privacy: &privp,
        });
        let mut msg = message(msg_id, flags, &params, &data);
        let at = auth_offset(&msg, &params, &ph).unwrap();
        let m = mac(keys.auth, &keys.auth_key, &msg);
        msg[at..at + m.len()].copy_from_slice(&m);
        msg
    }

    fn response_pdu(id: i32, value: Vec<u8>) -> Vec<u8> {
        let vb = tlv(
            SEQUENCE,
            &[oid_bytes(&[1, 3, 6, 1, 2, 1, 1, 3, 0]), value].concat(),
        );
        tlv(
            0xa2,
            &[
                integer(i64::from(id)),
                integer(0),
                integer(0),
                tlv(SEQUENCE, &vb),
            ]
            .concat(),
        )
    }

    #[test]
    fn authenticated_and_encrypted_replies_round_trip_and_tampering_fails() {
        let engine = Engine {
            id: b"\x80\x00\x1f\x88\x80fulcrum".to_vec(),
            boots: 3,
            time: 12345,
        };
        for (auth, privacy) in [
            (SnmpAuth::Sha1, false),
            (SnmpAuth::Sha256, false),
            (SnmpAuth::Sha256, true),
            (SnmpAuth::Sha1, true),
        ] {
            let u = user(auth, privacy);
            let k = u.localize(&engine.id);
            // The request verifies with the agent's copy of the keys.
            let req = get_request(&u, &k, &engine, 9, 10, &[1, 3, 6, 1, 2, 1, 1, 3, 0], 1);
            assert!(req.len() > 40);
            let r = agent_reply(&k, &engine, 9, response_pdu(10, integer(42)), privacy);
            assert_eq!(
                parse_v3_response(&r, 9, 10, Some(&k)),
                Ok(V3Reply::Value(Ok(SnmpValue::Number(42.0)))),
                "{auth:?} {privacy}"
            );
            let mut t = r.clone();
            let last = t.len() - 1;
            t[last] ^= 1;
            assert!(parse_v3_response(&t, 9, 10, Some(&k)).is_err());
            let other = user(auth, privacy).localize(b"another engine");
            assert!(parse_v3_response(&r, 9, 10, Some(&other))
                .unwrap_err()
                .contains("authentication failed"));
            for cut in 0..r.len() {
                let _ = parse_v3_response(&r[..cut], 9, 10, Some(&k));
            }
        }
    }

    /// A reply whose msgFlags say less than the request asked for is refused, even with the
    /// right ids and a well-formed value: without a MAC anyone could have sent it.
    #[test]
    fn replies_below_the_requested_security_level_are_refused() {
        let engine = Engine {
            id: b"\x80\x00\x1f\x88\x80fulcrum".to_vec(),
            boots: 3,
            time: 12345,
        };
        let forged = unauthenticated_reply(9, &engine, response_pdu(10, integer(42)));
        for privacy in [true, false] {
            let k = user(SnmpAuth::Sha256, privacy).localize(&engine.id);
            let e = parse_v3_response(&forged, 9, 10, Some(&k)).unwrap_err();
            assert!(e.starts_with(BELOW_LEVEL), "{e}");
            assert!(e.contains("noAuthNoPriv in reply to auth"), "{e}");
        }
        // Authenticated but in clear after an authPriv request.
        let k = user(SnmpAuth::Sha1, true).localize(&engine.id);
        let clear = agent_reply(&k, &engine, 9, response_pdu(10, integer(42)), false);
        let e = parse_v3_response(&clear, 9, 10, Some(&k)).unwrap_err();
        assert!(e.contains("authNoPriv in reply to authPriv"), "{e}");
    }

    #[test]
    fn discovery_report_gives_the_engine() {
        let req = discovery_request(5, 6);
        assert_eq!(req[0], SEQUENCE);
        let engine = Engine {
            id: b"\x80\x00\x1f\x88\x80abc".to_vec(),
            boots: 1,
            time: 99,
        };
        let vb = tlv(
            SEQUENCE,
            &[
                oid_bytes(&[1, 3, 6, 1, 6, 3, 15, 1, 1, 4, 0]),
                tlv(0x41, &[1]),
            ]
            .concat(),
        );
        let pdu = tlv(
            REPORT,
            &[integer(6), integer(0), integer(0), tlv(SEQUENCE, &vb)].concat(),
        );
        let scoped = tlv(
            SEQUENCE,
            &[tlv(OCTET_STRING, &engine.id), tlv(OCTET_STRING, &[]), pdu].concat(),
        );
        let params = sec_params(&SecParams {
            engine_id: &engine.id,
            boots: 1,
            time: 99,
            user: &[],
            auth: &[],
            privacy: &[],
        });
        let r = message(5, 0, &params, &scoped);
        assert_eq!(
            parse_v3_response(&r, 5, 6, None),
            Ok(V3Reply::Report {
                engine,
                oid: "1.3.6.1.6.3.15.1.1.4.0".into()
            })
        );
        assert_eq!(
            describe_report("1.3.6.1.6.3.15.1.1.5.0"),
            "wrong digest (auth password?) (1.3.6.1.6.3.15.1.1.5.0)"
        );
    }
}
