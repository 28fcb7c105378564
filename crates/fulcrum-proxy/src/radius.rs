//! Reading RADIUS packets (RFC 2865 authentication, RFC 2866 accounting) far enough to find one
//! attribute, for `type = "radius"` persistence.
//!
//! Written by hand rather than taken from a crate: the RADIUS crates on crates.io are client or
//! server stacks that decode every attribute into owned values (an allocation per attribute per
//! packet) and verify authenticators, which a balancer that only routes by one attribute neither
//! needs nor can do without the secrets. The format is a 20-byte header and a flat list of
//! type-length-value attributes; this reader checks every length against the packet's and the
//! datagram's size, walks the list once and borrows the value, so it allocates nothing and no
//! datagram can make it read out of bounds.

/// Header: code, identifier, length (2), authenticator (16).
pub const HEADER_LEN: usize = 20;
/// RFC 2865 §3: the largest packet.
pub const MAX_PACKET: usize = 4096;

/// Why a datagram is not a RADIUS packet Fulcrum can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("shorter than the 20-byte RADIUS header")]
    Short,
    #[error("length field outside 20..=4096 or beyond the datagram")]
    Length,
    #[error("an attribute's length runs past the packet or is below 2")]
    Attribute,
}

/// A RADIUS packet whose attribute list has been checked to be well-formed.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// 1 Access-Request, 4 Accounting-Request, 12 Status-Server, …
    pub code: u8,
    pub identifier: u8,
    attributes: &'a [u8],
}

/// Parses the header and checks the attribute list. Bytes past the header's length are padding
/// and ignored (RFC 2865 §3).
pub fn parse(data: &[u8]) -> Result<Packet<'_>, Malformed> {
    if data.len() < HEADER_LEN {
        return Err(Malformed::Short);
    }
    let length = usize::from(u16::from_be_bytes([data[2], data[3]]));
    if !(HEADER_LEN..=MAX_PACKET).contains(&length) || length > data.len() {
        return Err(Malformed::Length);
    }
    let attributes = &data[HEADER_LEN..length];
    let mut rest = attributes;
    while !rest.is_empty() {
        let len = match rest {
            [_, len, ..] => usize::from(*len),
            _ => return Err(Malformed::Attribute),
        };
        if len < 2 || len > rest.len() {
            return Err(Malformed::Attribute);
        }
        rest = &rest[len..];
    }
    Ok(Packet {
        code: data[0],
        identifier: data[1],
        attributes,
    })
}

impl<'a> Packet<'a> {
    /// Every attribute as (type, value), in packet order.
    pub fn attributes(&self) -> Attributes<'a> {
        Attributes {
            rest: self.attributes,
        }
    }

    /// The value of the first attribute of type `kind` with a non-empty value.
    pub fn attribute(&self, kind: u8) -> Option<&'a [u8]> {
        self.attributes()
            .find(|(t, v)| *t == kind && !v.is_empty())
            .map(|(_, v)| v)
    }
}

/// Iterator over a checked attribute list.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attributes<'a> {
    type Item = (u8, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        // `parse` checked every length, but stay total: a short tail ends the walk.
        let (&kind, &len) = (self.rest.first()?, self.rest.get(1)?);
        let len = usize::from(len);
        let value = self.rest.get(2..len)?;
        self.rest = &self.rest[len..];
        Some((kind, value))
    }
}

/// The persistence key of a datagram: the value of attribute `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOf<'a> {
    Value(&'a [u8]),
    /// A well-formed packet without the attribute (Status-Server, a NAS that omits it).
    Absent,
    Malformed(Malformed),
}

pub fn key_of(data: &[u8], kind: u8) -> KeyOf<'_> {
    match parse(data) {
        Ok(p) => p.attribute(kind).map_or(KeyOf::Absent, KeyOf::Value),
        Err(e) => KeyOf::Malformed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Access-Request with the given attributes.
    fn packet(code: u8, attrs: &[(u8, &[u8])]) -> Vec<u8> {
        let mut p = vec![code, 7, 0, 0];
        p.extend_from_slice(&[0xab; 16]);
        for (t, v) in attrs {
            p.push(*t);
            p.push(v.len() as u8 + 2);
            p.extend_from_slice(v);
        }
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    #[test]
    fn finds_attributes() {
        let p = packet(
            1,
            &[
                (4, &[127, 0, 0, 1]),
                (1, b"alice"),
                (31, b"02-00-00-00-00-01"),
            ],
        );
        let parsed = parse(&p).unwrap();
        assert_eq!(parsed.code, 1);
        assert_eq!(parsed.identifier, 7);
        assert_eq!(parsed.attribute(1), Some(&b"alice"[..]));
        assert_eq!(parsed.attribute(31), Some(&b"02-00-00-00-00-01"[..]));
        assert_eq!(parsed.attribute(44), None);
        assert_eq!(parsed.attributes().count(), 3);
        assert_eq!(key_of(&p, 1), KeyOf::Value(b"alice"));
        assert_eq!(key_of(&p, 8), KeyOf::Absent);
    }

    #[test]
    fn padding_past_the_length_is_ignored() {
        let mut p = packet(4, &[(44, b"sess-1")]);
        p.extend_from_slice(&[1, 200, 0, 0]);
        assert_eq!(key_of(&p, 44), KeyOf::Value(b"sess-1"));
        assert_eq!(key_of(&p, 1), KeyOf::Absent);
    }

    #[test]
    fn empty_values_do_not_count() {
        let p = packet(1, &[(1, b""), (1, b"bob")]);
        assert_eq!(key_of(&p, 1), KeyOf::Value(b"bob"));
    }

    #[test]
    fn malformed_packets_are_named() {
        let good = packet(1, &[(1, b"alice")]);
        assert_eq!(key_of(&good[..19], 1), KeyOf::Malformed(Malformed::Short));
        let mut long = good.clone();
        long[2..4].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(key_of(&long, 1), KeyOf::Malformed(Malformed::Length));
        let mut beyond = good.clone();
        beyond[3] += 1;
        assert_eq!(key_of(&beyond, 1), KeyOf::Malformed(Malformed::Length));
        let mut short_header = good.clone();
        short_header[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert_eq!(
            key_of(&short_header, 1),
            KeyOf::Malformed(Malformed::Length)
        );
        let mut bad_attr = good.clone();
        bad_attr[21] = 40;
        assert_eq!(key_of(&bad_attr, 1), KeyOf::Malformed(Malformed::Attribute));
        let mut zero_attr = good.clone();
        zero_attr[21] = 0;
        assert_eq!(
            key_of(&zero_attr, 1),
            KeyOf::Malformed(Malformed::Attribute)
        );
        let mut dangling = good;
        dangling.push(1);
        let len = dangling.len() as u16;
        dangling[2..4].copy_from_slice(&len.to_be_bytes());
        assert_eq!(key_of(&dangling, 1), KeyOf::Malformed(Malformed::Attribute));
    }
}
