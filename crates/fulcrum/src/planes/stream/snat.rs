//! Metrics of the services' source address pools (`snat`).

use std::sync::atomic::Ordering;

use fulcrum_admin::MetricFamilies;
use fulcrum_net::snat::SnatAddress;
use fulcrum_net::Snat;

/// A per-address counter: its family, help text and reader.
type PerAddress = (&'static str, &'static str, fn(&SnatAddress) -> u64);

pub fn metrics(w: &mut MetricFamilies) {
    let pools = Snat::all();
    if pools.is_empty() {
        return;
    }
    let per_address: [PerAddress; 2] = [
        (
            "fulcrum_snat_connections_total",
            "Member connections established from a source address of a service's snat pool.",
            |a| a.connections.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_snat_exhausted_total",
            "Connection attempts that found no free port on a snat address towards the member (EADDRNOTAVAIL); the next address was tried.",
            |a| a.exhausted.load(Ordering::Relaxed),
        ),
    ];
    for (family, help, get) in per_address {
        let mut samples = w.counter(family, help);
        for p in &pools {
            for a in &p.addresses {
                let ip = a.ip.to_string();
                samples.sample(&[("vs", &p.service), ("address", &ip)], get(a));
            }
        }
    }
    let mut samples = w.counter(
        "fulcrum_snat_failures_total",
        "Member connections refused because every snat address of the service was exhausted.",
    );
    for p in &pools {
        samples.sample(&[("vs", &p.service)], p.failures.load(Ordering::Relaxed));
    }
}
