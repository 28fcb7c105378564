//! Cookie and Set-Cookie fields, read as bytes (RFC 6265 §4; browsers' lenient syntax).

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The `name=value` pairs of one Cookie field. A pair without `=` is skipped.
pub fn pairs(field: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    field.split(|b| *b == b';').filter_map(|p| {
        let p = trim(p);
        let eq = memchr::memchr(b'=', p)?;
        Some((trim(&p[..eq]), trim(&p[eq + 1..])))
    })
}

/// The cookie a Set-Cookie field sets: its name and value (attributes left out).
pub fn set_cookie_pair(field: &[u8]) -> Option<(&[u8], &[u8])> {
    let first = field.split(|b| *b == b';').next()?;
    let eq = memchr::memchr(b'=', first)?;
    let name = trim(&first[..eq]);
    (!name.is_empty()).then(|| (name, trim(&first[eq + 1..])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pairs() {
        let v: Vec<_> = pairs(b"a=1; b = 2;c=; junk; d=x=y").collect();
        assert_eq!(
            v,
            vec![
                (&b"a"[..], &b"1"[..]),
                (b"b", b"2"),
                (b"c", b""),
                (b"d", b"x=y")
            ]
        );
        assert_eq!(
            set_cookie_pair(b"SID=abc; Path=/; HttpOnly"),
            Some((&b"SID"[..], &b"abc"[..]))
        );
        assert_eq!(set_cookie_pair(b"=abc"), None);
    }
}
