//! The DNS query path: any datagram or TCP message is answered or dropped without a panic, and
//! every response it sends decodes as a DNS message with the query's id.
#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use fulcrum_dns::iptable::{GeoCache, Locator};
use fulcrum_dns::{Action, Counters, Engine, GslbState, Transport};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
[dns]
listen = "127.0.0.1:5353"
rate_limit = { responses_per_second = 1000000 }
[[dns.zone]]
origin = "example.com."
records = [
  "@ 300 IN SOA ns1 hostmaster 1 3600 600 86400 60",
  "@ 300 IN NS ns1",
  "ns1 300 IN A 192.0.2.1",
  "www 300 IN CNAME app",
  "loop 300 IN CNAME loop",
  "a 300 IN CNAME b", "b 300 IN CNAME a",
  "mail 300 IN MX 10 mx.example.net.",
  "txt 300 IN TXT \"x\"",
  "sub 300 IN NS ns.sub",
  "ns.sub 300 IN A 192.0.2.53",
  "*.wild 300 IN A 192.0.2.77",
]
[[ip_table]]
name = "t"
cidrs = ["198.51.100.0/24", "2001:db8::/32"]
[[gslb.site]]
name = "east"
addresses = ["192.0.2.10", "2001:db8::10"]
regions = ["t"]
[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "topology"
answers = 2
"#;

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let config =
            fulcrum_config::parse(CONFIG, "fuzz.toml", std::path::Path::new(".")).expect("valid");
        let compiled = fulcrum_dns::compile(&config, &mut GeoCache::new()).expect("compiles");
        let locator: Arc<Locator> = compiled.locator;
        let gslb = Arc::new(GslbState::build(&config, locator, None));
        Engine {
            catalog: compiled.catalog,
            gslb,
            udp_payload: 1232,
            rrl: config
                .dns
                .as_ref()
                .and_then(|d| d.rate_limit.as_ref())
                .map(|r| Arc::new(fulcrum_dns::rrl::Rrl::new(r))),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let e = engine();
    let stats = Counters::default();
    let mut out = Vec::new();
    for (transport, peer) in [
        (Transport::Udp, IpAddr::from([198, 51, 100, 9])),
        (Transport::Tcp, IpAddr::from([127, 0, 0, 1])),
    ] {
        if e.answer(data, peer, transport, &mut out, &stats) == Action::Send {
            assert!(out.len() >= 12, "a response has a header");
            assert_eq!(out[..2], data[..2], "the response carries the query's id");
            if let Err(err) = hickory_proto::op::Message::from_vec(&out) {
                panic!("undecodable response {err}: {out:02x?} to {data:02x?}");
            }
            if transport == Transport::Udp {
                assert!(out.len() <= 1232, "UDP responses fit the payload size");
            }
        }
    }
});
