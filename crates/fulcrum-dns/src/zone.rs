//! Zones from RFC 1035 master files and inline record lines.
//!
//! hickory-proto parses the record data of every type, but its zone parser reports no line
//! numbers, and a config error must name the file and line. So the master-file structure
//! (entries spanning parentheses, comments, quoted strings, `$ORIGIN`, `$TTL`, `@`, an owner
//! left blank to repeat the previous one, optional TTL and class in either order) is handled
//! here, and each entry is handed to hickory-proto on its own, as one fully explicit line.

use std::net::IpAddr;
use std::path::Path;

use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};
use hickory_proto::serialize::txt::Parser;

/// Record types a zone may hold.
pub const SUPPORTED: [RecordType; 10] = [
    RecordType::SOA,
    RecordType::NS,
    RecordType::A,
    RecordType::AAAA,
    RecordType::CNAME,
    RecordType::MX,
    RecordType::TXT,
    RecordType::SRV,
    RecordType::CAA,
    RecordType::PTR,
];

/// Default TTL of records with none, before any `$TTL` (one hour, as BIND).
const DEFAULT_TTL: u32 = 3600;

/// One record in wire-ready form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneRecord {
    /// Owner name, lower-case wire form.
    pub owner: Vec<u8>,
    pub rtype: u16,
    pub ttl: u32,
    /// RDATA in wire form, names uncompressed.
    pub rdata: Vec<u8>,
    /// For CNAME: the target, lower-case wire form.
    pub target: Option<Vec<u8>>,
    /// For SOA: the MINIMUM field (negative caching TTL, RFC 2308).
    pub soa_minimum: Option<u32>,
    /// The record in presentation form, for logs and the API.
    pub text: String,
}

/// A parse problem: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneError {
    /// 1-based line within the text (a file's line, or 1 for an inline record).
    pub line: usize,
    pub message: String,
}

/// Lower-case wire form of a name.
pub fn wire_name(name: &Name) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name.iter() {
        out.push(label.len() as u8);
        out.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    out.push(0);
    out
}

/// Presentation form of a lower-case wire name ("www.example.com.").
pub fn wire_to_text(wire: &[u8]) -> String {
    let mut s = String::new();
    let mut i = 0;
    while let Some(&len) = wire.get(i) {
        if len == 0 {
            break;
        }
        let label = wire.get(i + 1..i + 1 + len as usize).unwrap_or_default();
        for &b in label {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'*' {
                s.push(b as char);
            } else {
                s.push_str(&format!("\\{b:03}"));
            }
        }
        s.push('.');
        i += 1 + len as usize;
    }
    if s.is_empty() {
        s.push('.');
    }
    s
}

/// Parses a name given in the configuration ("www.example.com.").
pub fn parse_name(text: &str) -> Result<Vec<u8>, String> {
    let name = Name::from_ascii(text).map_err(|e| format!("{text:?} is not a domain name: {e}"))?;
    if !name.is_fqdn() {
        return Err(format!("{text:?} must be fully qualified (end in a dot)"));
    }
    Ok(wire_name(&name))
}

/// One master-file entry: its tokens and the line it starts on.
#[derive(Debug)]
struct Entry {
    line: usize,
    /// The entry started with white space: the owner is the previous entry's.
    blank_owner: bool,
    tokens: Vec<String>,
}

/// Splits master-file text into entries: parentheses join lines, `;` starts a comment outside
/// quotes, quoted strings keep their quotes (hickory-proto reads them).
fn entries(text: &str) -> Result<Vec<Entry>, ZoneError> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut depth = 0usize;
    let mut cur: Option<Entry> = None;
    let mut token = String::new();
    let mut in_quote = false;
    let mut escaped = false;
    let mut in_comment = false;
    let mut at_line_start = true;
    let mut paren_line = 0;
    let flush = |token: &mut String, cur: &mut Option<Entry>| {
        if !token.is_empty() {
            if let Some(e) = cur.as_mut() {
                e.tokens.push(std::mem::take(token));
            }
        }
    };
    for c in text.chars() {
        if in_comment {
            if c == '\n' {
                in_comment = false;
            } else {
                continue;
            }
        }
        if at_line_start && depth == 0 && c != '\n' {
            at_line_start = false;
            if cur.is_none() {
                cur = Some(Entry {
                    line,
                    blank_owner: c == ' ' || c == '\t',
                    tokens: Vec::new(),
                });
            }
        }
        if in_quote {
            token.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quote = false;
            }
            if c == '\n' {
                line += 1;
            }
            continue;
        }
        match c {
            '"' => {
                in_quote = true;
                token.push(c);
            }
            ';' => {
                flush(&mut token, &mut cur);
                in_comment = true;
            }
            '(' => {
                flush(&mut token, &mut cur);
                if depth == 0 {
                    paren_line = line;
                }
                depth += 1;
            }
            ')' => {
                flush(&mut token, &mut cur);
                if depth == 0 {
                    return Err(ZoneError {
                        line,
                        message: "`)` without a matching `(`".into(),
                    });
                }
                depth -= 1;
            }
            '\n' => {
                flush(&mut token, &mut cur);
                line += 1;
                if depth == 0 {
                    if let Some(e) = cur.take() {
                        if !e.tokens.is_empty() {
                            out.push(e);
                        }
                    }
                    at_line_start = true;
                }
            }
            ' ' | '\t' | '\r' => flush(&mut token, &mut cur),
            c => token.push(c),
        }
    }
    if in_quote {
        return Err(ZoneError {
            line,
            message: "unterminated quoted string".into(),
        });
    }
    if depth > 0 {
        return Err(ZoneError {
            line: paren_line,
            message: "`(` is never closed".into(),
        });
    }
    flush(&mut token, &mut cur);
    if let Some(e) = cur.take() {
        if !e.tokens.is_empty() {
            out.push(e);
        }
    }
    Ok(out)
}

fn parse_ttl(s: &str) -> Option<u32> {
    if !s.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    hickory_proto::serialize::txt::parse_ttl(s).ok()
}

/// Parses master-file text for the zone `origin` (lower-case wire form). Relative names are
/// relative to `origin` (or to a `$ORIGIN` in the text).
pub fn parse_master(text: &str, origin: &Name) -> Result<Vec<ZoneRecord>, ZoneError> {
    let mut origin = origin.clone();
    let mut default_ttl: Option<u32> = None;
    let mut last_ttl: Option<u32> = None;
    let mut owner: Option<Name> = None;
    let mut records = Vec::new();
    for e in entries(text)? {
        let err = |message: String| ZoneError {
            line: e.line,
            message,
        };
        let mut t = e.tokens.iter().map(String::as_str).peekable();
        if !e.blank_owner {
            let first = t.next().unwrap_or_default();
            match first.to_ascii_uppercase().as_str() {
                "$ORIGIN" => {
                    let name = t.next().ok_or_else(|| err("$ORIGIN needs a name".into()))?;
                    origin = Name::parse(name, Some(&origin))
                        .map_err(|x| err(format!("$ORIGIN {name}: {x}")))?;
                    continue;
                }
                "$TTL" => {
                    let v = t.next().ok_or_else(|| err("$TTL needs a value".into()))?;
                    default_ttl =
                        Some(parse_ttl(v).ok_or_else(|| err(format!("$TTL {v:?} is not a TTL")))?);
                    continue;
                }
                "$INCLUDE" => {
                    return Err(err(
                        "$INCLUDE is not supported: list each file as its own zone or records"
                            .into(),
                    ))
                }
                "@" => owner = Some(origin.clone()),
                _ => {
                    owner = Some(
                        Name::parse(first, Some(&origin))
                            .map_err(|x| err(format!("owner {first:?}: {x}")))?,
                    )
                }
            }
        }
        let Some(owner_name) = owner.clone() else {
            return Err(err("the first record needs an owner name".into()));
        };
        let mut ttl = None;
        let mut rtype = None;
        for tok in t.by_ref() {
            if let Some(v) = parse_ttl(tok) {
                ttl = Some(v);
                continue;
            }
            let up = tok.to_ascii_uppercase();
            if up == "IN" {
                continue;
            }
            if matches!(up.as_str(), "CH" | "HS" | "CS" | "NONE" | "ANY") {
                return Err(err(format!("class {tok} is not served; only IN is")));
            }
            let ty: RecordType = up
                .parse()
                .map_err(|_| err(format!("{tok:?} is not a record type")))?;
            rtype = Some(ty);
            break;
        }
        let rtype = rtype.ok_or_else(|| err("the record has no type".into()))?;
        if !SUPPORTED.contains(&rtype) {
            return Err(err(format!(
                "record type {rtype} is not supported; these are: {}",
                SUPPORTED.map(|t| t.to_string()).join(", ")
            )));
        }
        let rdata_tokens: Vec<&str> = t.collect();
        if rdata_tokens.is_empty() {
            return Err(err(format!("the {rtype} record has no data")));
        }
        let ttl = match ttl.or(default_ttl).or(last_ttl) {
            Some(v) => v,
            None => DEFAULT_TTL,
        };
        last_ttl = Some(ttl);
        let line = format!(
            "{} {ttl} IN {rtype} {}\n",
            owner_name.to_ascii(),
            rdata_tokens.join(" ")
        );
        let parsed = Parser::new(line.as_str(), None, Some(origin.clone()))
            .parse()
            .map_err(|x| err(format!("{rtype} record: {x}")))?;
        for (_, set) in parsed.1 {
            for r in set.records_without_rrsigs() {
                records.push(to_zone_record(r).map_err(&err)?);
            }
        }
    }
    Ok(records)
}

fn to_zone_record(r: &Record) -> Result<ZoneRecord, String> {
    let mut rdata = Vec::new();
    {
        let mut enc = BinEncoder::new(&mut rdata);
        enc.set_name_encoding(NameEncoding::Uncompressed);
        r.data
            .emit(&mut enc)
            .map_err(|e| format!("cannot encode the record: {e}"))?;
    }
    if rdata.len() > u16::MAX as usize {
        return Err("the record data is longer than 65535 bytes".into());
    }
    let (target, soa_minimum) = match &r.data {
        RData::CNAME(c) => (Some(wire_name(&c.0)), None),
        RData::SOA(soa) => (None, Some(soa.minimum)),
        _ => (None, None),
    };
    Ok(ZoneRecord {
        owner: wire_name(&r.name),
        rtype: u16::from(r.record_type()),
        ttl: r.ttl,
        rdata,
        target,
        soa_minimum,
        text: format!(
            "{} {} IN {} {}",
            r.name.to_ascii().to_ascii_lowercase(),
            r.ttl,
            r.record_type(),
            r.data
        ),
    })
}

/// An address record for a synthesized answer (GSLB), in the same form as zone records.
pub fn address_rdata(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Reads a zone file; errors carry the file's line.
pub fn load_file(path: &Path, origin: &Name) -> Result<Vec<ZoneRecord>, ZoneError> {
    let text = std::fs::read_to_string(path).map_err(|e| ZoneError {
        line: 0,
        message: format!("cannot read {}: {e}", path.display()),
    })?;
    parse_master(&text, origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Name {
        Name::from_ascii("example.com.").unwrap()
    }

    #[test]
    fn master_file_with_parentheses_defaults_and_blank_owners() {
        let text = "$TTL 300\n\
            @ IN SOA ns1 hostmaster ( 2024010101 ; serial\n  3600 600 86400 60 )\n\
            \tIN NS ns1\n\
            ns1 IN A 192.0.2.1\n\
            www 60 CNAME app\n\
            mail IN 120 MX 10 mx.example.net.\n\
            txt TXT \"hello world\" \"two\"\n\
            _sip._tcp SRV 10 5 5060 sip\n\
            caa CAA 0 issue \"letsencrypt.org\"\n\
            v6 AAAA 2001:db8::1\n\
            1 PTR host.example.com.\n";
        let recs = parse_master(text, &origin()).unwrap();
        assert_eq!(recs.len(), 10);
        assert_eq!(recs[0].rtype, u16::from(RecordType::SOA));
        assert_eq!(recs[0].soa_minimum, Some(60));
        assert_eq!(recs[0].ttl, 300);
        assert_eq!(recs[1].owner, wire_name(&origin()));
        assert_eq!(recs[3].ttl, 60);
        assert_eq!(
            recs[3].target.as_deref(),
            Some(&parse_name("app.example.com.").unwrap()[..])
        );
        assert_eq!(recs[4].ttl, 120);
        assert_eq!(recs[2].rdata, vec![192, 0, 2, 1]);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "$TTL 300\nwww IN A 192.0.2.1\n\nbad IN A 300.1.1.1\n";
        let e = parse_master(text, &origin()).unwrap_err();
        assert_eq!(e.line, 4, "{e:?}");
        let e = parse_master("a IN A 1.2.3.4\nb IN (\n A\n", &origin()).unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        let e = parse_master("x IN NAPTR 1 2 \"\" \"\" \"\" .\n", &origin()).unwrap_err();
        assert!(e.message.contains("not supported"), "{e:?}");
        let e = parse_master("  IN A 1.2.3.4\n", &origin()).unwrap_err();
        assert!(e.message.contains("owner"), "{e:?}");
    }

    #[test]
    fn names_are_lower_cased_and_escaped_back() {
        let recs = parse_master("WWW.Example.COM. 1 IN A 192.0.2.1\n", &origin()).unwrap();
        assert_eq!(recs[0].owner, parse_name("www.example.com.").unwrap());
        assert_eq!(wire_to_text(&recs[0].owner), "www.example.com.");
        assert_eq!(wire_to_text(&[0]), ".");
    }
}
