//! The hand-written parts of TLS termination: SNI lookup in the certificate name index (exact
//! and wildcard names, any bytes a client may send as a server name) and the commonName reader
//! of certificate subjects.
#![no_main]
use fulcrum_http::tls::names::NameIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fulcrum_http::tls::common_names(data);
    // Lines before an empty line are certificate names, the rest are looked up.
    let text = String::from_utf8_lossy(data);
    let (names, lookups) = text.split_once("\n\n").unwrap_or((&text, &text));
    let mut index = NameIndex::default();
    for (i, n) in names.lines().enumerate() {
        index.add(n, i % 4);
    }
    for l in lookups.lines() {
        for &i in index.lookup(l) {
            assert!(i < 4);
        }
        // A name served by a wildcard has a label before the registered parent.
        if !index.lookup(l).is_empty() {
            assert!(!l.is_empty());
        }
    }
});
