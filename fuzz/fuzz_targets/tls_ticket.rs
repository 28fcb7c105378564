//! Session tickets a client presents to an HA pair's shared ticketer (`fulcrum_tls::ticket`):
//! any bytes are refused or opened without a panic, only a ticket sealed under the secret opens,
//! and what is sealed opens to itself.
#![no_main]
use fulcrum_http::tls::ticket::SharedTicketer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let t = SharedTicketer::new(&[9; 32], "web");
    let now = data.first().map_or(0, |b| u32::from(*b));
    // Made-up bytes never open: forging one needs the key.
    assert!(t.open(now, data).is_none());
    let sealed = t.seal(now, data).expect("seal");
    assert_eq!(t.open(now, &sealed).as_deref(), Some(data));
    assert!(t.open(now.wrapping_add(5), &sealed).is_none());
});
