//! Which certificate answers a server name: exact DNS names first, then a wildcard one label
//! deep (`*.example.com` covers `a.example.com`, not `example.com` nor `a.b.example.com`, as
//! RFC 6125 §6.4.3 and every browser have it).
//!
//! Written by hand because rustls' `ResolvesServerCertUsingSni` takes exact names only and
//! offers no default certificate.

use std::collections::HashMap;

/// Certificate indices by the names they serve.
#[derive(Debug, Default, Clone)]
pub struct NameIndex {
    exact: HashMap<String, Vec<usize>>,
    /// `*.example.com` is stored under `example.com`.
    wildcard: HashMap<String, Vec<usize>>,
}

/// Longest DNS name (RFC 1035).
const MAX_NAME: usize = 253;

impl NameIndex {
    /// Records that certificate `index` serves `name` (a DNS name or a `*.` wildcard, any case).
    pub fn add(&mut self, name: &str, index: usize) {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let (map, key) = match name.strip_prefix("*.") {
            Some(rest) => (&mut self.wildcard, rest.to_string()),
            None => (&mut self.exact, name),
        };
        let list = map.entry(key).or_default();
        if !list.contains(&index) {
            list.push(index);
        }
    }

    /// The certificates that serve `server_name`, best first: exact matches, else the wildcard
    /// ones; empty when none does.
    pub fn lookup(&self, server_name: &str) -> &[usize] {
        let name = server_name.strip_suffix('.').unwrap_or(server_name);
        if name.is_empty() || name.len() > MAX_NAME {
            return &[];
        }
        let mut lower = [0u8; MAX_NAME];
        let lower = &mut lower[..name.len()];
        for (d, s) in lower.iter_mut().zip(name.bytes()) {
            *d = s.to_ascii_lowercase();
        }
        let Ok(name) = std::str::from_utf8(lower) else {
            return &[];
        };
        if let Some(l) = self.exact.get(name) {
            return l;
        }
        match name.split_once('.') {
            Some((label, parent)) if !label.is_empty() && label != "*" => {
                self.wildcard.get(parent).map_or(&[], |l| l.as_slice())
            }
            _ => &[],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_before_wildcard_and_one_label_deep() {
        let mut n = NameIndex::default();
        n.add("*.example.com", 0);
        n.add("www.example.com", 1);
        n.add("Example.COM", 2);
        assert_eq!(n.lookup("www.example.com"), &[1]);
        assert_eq!(n.lookup("WWW.Example.com."), &[1]);
        assert_eq!(n.lookup("api.example.com"), &[0]);
        assert_eq!(n.lookup("example.com"), &[2]);
        assert!(n.lookup("a.b.example.com").is_empty());
        assert!(n.lookup(".example.com").is_empty());
        assert!(n.lookup("*.example.com").is_empty());
        assert!(n.lookup("other.test").is_empty());
        assert!(n.lookup("").is_empty());
        assert!(n.lookup(&"a".repeat(300)).is_empty());
    }

    #[test]
    fn several_certificates_for_one_name() {
        let mut n = NameIndex::default();
        n.add("a.test", 0);
        n.add("a.test", 1);
        n.add("a.test", 1);
        assert_eq!(n.lookup("a.test"), &[0, 1]);
    }
}
