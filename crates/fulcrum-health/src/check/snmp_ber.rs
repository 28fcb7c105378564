//! The SNMP message encoding both versions share (BER, X.690, as SNMP uses it): the tags, the
//! values a check understands, writers of the few elements requests need, and the readers of a
//! response's PDU. Its own module so that the v2c and v3 checks each depend on it and not on
//! one another.

pub(crate) const INTEGER: u8 = 0x02;
pub(crate) const OCTET_STRING: u8 = 0x04;
pub(crate) const NULL: u8 = 0x05;
pub(crate) const OID: u8 = 0x06;
pub(crate) const SEQUENCE: u8 = 0x30;
pub(crate) const IP_ADDRESS: u8 = 0x40;
pub(crate) const COUNTER32: u8 = 0x41;
pub(crate) const GAUGE32: u8 = 0x42;
pub(crate) const TIMETICKS: u8 = 0x43;
pub(crate) const COUNTER64: u8 = 0x46;
pub(crate) const GET_REQUEST: u8 = 0xa0;
pub(crate) const GET_RESPONSE: u8 = 0xa2;
pub(crate) const NO_SUCH_OBJECT: u8 = 0x80;
pub(crate) const NO_SUCH_INSTANCE: u8 = 0x81;
pub(crate) const END_OF_MIB_VIEW: u8 = 0x82;

/// The value of the varbind, as far as a check cares.
#[derive(Debug, Clone, PartialEq)]
pub enum SnmpValue {
    /// INTEGER, Counter32/64, Gauge32, TimeTicks, or an OCTET STRING holding a number.
    Number(f64),
    /// Any other value, as text.
    Text(String),
}

pub(crate) fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    push_len(&mut out, content.len());
    out.extend_from_slice(content);
    out
}

pub(crate) fn integer(v: i64) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    // Minimal two's complement: drop leading bytes that only repeat the sign.
    let mut start = 0;
    while start < 7
        && ((bytes[start] == 0 && bytes[start + 1] & 0x80 == 0)
            || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
    {
        start += 1;
    }
    tlv(INTEGER, &bytes[start..])
}

pub(crate) fn oid_bytes(oid: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut arcs = oid.iter().copied();
    let first = arcs.next().unwrap_or(0);
    let second = arcs.next().unwrap_or(0);
    let mut sub = |mut v: u32| {
        let mut tmp = vec![(v & 0x7f) as u8];
        v >>= 7;
        while v > 0 {
            tmp.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        tmp.reverse();
        out.extend_from_slice(&tmp);
    };
    sub(first * 40 + second);
    for a in arcs {
        sub(a);
    }
    tlv(OID, &out)
}

pub(crate) fn expect<'a>(b: &'a [u8], tag: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    let (t, v, rest) = fulcrum_tls::der::element(b).map_err(|e| format!("{what}: {e}"))?;
    if t != tag {
        return Err(format!("{what}: tag 0x{t:02x}, expected 0x{tag:02x}"));
    }
    Ok((v, rest))
}

pub(crate) fn int_value(v: &[u8]) -> Result<i64, String> {
    if v.is_empty() || v.len() > 8 {
        return Err("bad integer".into());
    }
    let mut n: i64 = if v[0] & 0x80 != 0 { -1 } else { 0 };
    for &b in v {
        n = (n << 8) | i64::from(b);
    }
    Ok(n)
}

pub(crate) fn uint_value(v: &[u8]) -> Result<u64, String> {
    if v.is_empty() || v.len() > 9 || (v.len() == 9 && v[0] != 0) {
        return Err("bad unsigned integer".into());
    }
    Ok(v.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)))
}

/// A GetResponse PDU's (tag and contents) first value, v2c and v3 alike.
pub(crate) fn parse_pdu(tag: u8, pdu: &[u8], request_id: i32) -> Result<SnmpValue, String> {
    let bad = |e: String| format!("not an SNMP response: {e}");
    if tag != GET_RESPONSE {
        return Err(bad(format!(
            "pdu: tag 0x{tag:02x}, expected 0x{GET_RESPONSE:02x}"
        )));
    }
    let (id, rest) = expect(pdu, INTEGER, "request-id").map_err(bad)?;
    if int_value(id).map_err(bad)? != i64::from(request_id) {
        return Err("a response to another request".into());
    }
    let (status, rest) = expect(rest, INTEGER, "error-status").map_err(bad)?;
    let (_index, rest) = expect(rest, INTEGER, "error-index").map_err(bad)?;
    let status = int_value(status).map_err(bad)?;
    if status != 0 {
        let name = match status {
            1 => "tooBig",
            2 => "noSuchName",
            3 => "badValue",
            5 => "genErr",
            6 => "noAccess",
            16 => "authorizationError",
            _ => "error",
        };
        return Err(format!("error status {status} ({name})"));
    }
    let (list, _) = expect(rest, SEQUENCE, "varbind list").map_err(bad)?;
    let (varbind, _) = expect(list, SEQUENCE, "varbind").map_err(bad)?;
    let (_oid, rest) = expect(varbind, OID, "name").map_err(bad)?;
    let (tag, v, _) = fulcrum_tls::der::element(rest).map_err(|e| bad(format!("value: {e}")))?;
    match tag {
        INTEGER => Ok(SnmpValue::Number(int_value(v).map_err(bad)? as f64)),
        COUNTER32 | GAUGE32 | TIMETICKS | COUNTER64 => {
            Ok(SnmpValue::Number(uint_value(v).map_err(bad)? as f64))
        }
        OCTET_STRING => {
            // UCD-SNMP-MIB's laLoad is "0.42"; extend scripts print numbers as text.
            let s: String = String::from_utf8_lossy(&v[..v.len().min(128)])
                .trim()
                .chars()
                .filter(|c| !c.is_control())
                .collect();
            Ok(match s.parse::<f64>() {
                Ok(n) if n.is_finite() => SnmpValue::Number(n),
                _ => SnmpValue::Text(s),
            })
        }
        IP_ADDRESS if v.len() == 4 => Ok(SnmpValue::Text(format!(
            "{}.{}.{}.{}",
            v[0], v[1], v[2], v[3]
        ))),
        NO_SUCH_OBJECT => Err("noSuchObject".into()),
        NO_SUCH_INSTANCE => Err("noSuchInstance".into()),
        END_OF_MIB_VIEW => Err("endOfMibView".into()),
        NULL => Err("no value (NULL)".into()),
        t => Ok(SnmpValue::Text(format!("value of type 0x{t:02x}"))),
    }
}
