//! Reading one TLV of DER/BER at a time: the walk `fulcrum-admin` does over a certificate (its
//! notAfter) and the one the SNMP monitor does over a response (SNMP is BER too). A full ASN.1
//! parser would be a large dependency for reading a few fields.

/// One element at the start of `b`: (tag, contents, rest). Definite lengths of up to 4 bytes;
/// nothing is read past the buffer.
pub fn element(b: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let (&tag, b) = b.split_first().ok_or("truncated")?;
    let (&first, mut b) = b.split_first().ok_or("truncated")?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return Err("bad length".into());
        }
        let len = b[..n]
            .iter()
            .fold(0usize, |a, &x| (a << 8) | usize::from(x));
        b = &b[n..];
        len
    };
    if b.len() < len {
        return Err("truncated".into());
    }
    Ok((tag, &b[..len], &b[len..]))
}

#[cfg(test)]
mod tests {
    use super::element;

    #[test]
    fn short_and_long_lengths_and_truncation() {
        assert_eq!(
            element(&[0x04, 2, 1, 2, 9]),
            Ok((4, &[1u8, 2][..], &[9u8][..]))
        );
        let mut long = vec![0x30, 0x81, 200];
        long.extend(std::iter::repeat_n(7u8, 200));
        assert_eq!(
            element(&long).map(|(t, v, r)| (t, v.len(), r.len())),
            Ok((0x30, 200, 0))
        );
        assert_eq!(element(&[0x04, 3, 1]), Err("truncated".into()));
        assert_eq!(
            element(&[0x04, 0x85, 1, 1, 1, 1, 1]),
            Err("bad length".into())
        );
        assert_eq!(element(&[0x04, 0x80]), Err("bad length".into()));
        assert_eq!(element(&[0x04]), Err("truncated".into()));
    }
}
