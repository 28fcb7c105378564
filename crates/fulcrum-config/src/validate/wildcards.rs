//! The in-kernel wildcards (a tcp / udp service on port 0, a `protocol = "ip"` service) against
//! the other listeners: one ip service per address, and no proxied listener on an address whose
//! packets a wildcard takes (the XDP program sees them first: the listener would never get one).
//! And their members of port 0, which a monitor cannot probe on their own port.

use std::collections::HashMap;
use std::net::IpAddr;

use super::Checker;
use crate::ip::wildcard_of;
use crate::monitor::MonitorKind;
use crate::protocol::Protocol;
use crate::schema::Config;

pub(super) fn check_wildcards(c: &mut Checker<'_>, cfg: &Config) {
    check_port_zero_members(c, cfg);
    let mut ip_owner: HashMap<IpAddr, usize> = HashMap::new();
    // (address, protocol, what it takes, service index)
    let mut wild: Vec<(IpAddr, Protocol, &'static str, usize)> = Vec::new();
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        let protocol = vs.protocol();
        for (j, a) in vs.listen.iter().enumerate() {
            if protocol == Protocol::Ip {
                if let Some(prev) = ip_owner.insert(a.ip(), i) {
                    let other = &cfg.virtual_services[prev].name;
                    c.err(
                        &format!("virtual_service[{i}].listen[{j}]"),
                        format!(
                            "{} is already the address of the ip service virtual_service[{prev}] ({other}): one ip service takes every protocol of an address",
                            a.ip()
                        ),
                    );
                }
            }
            if let Some(what) = wildcard_of(protocol, vs.in_kernel(), *a) {
                wild.push((a.ip(), protocol, what, i));
            }
        }
    }
    if wild.is_empty() {
        return;
    }
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        if vs.in_kernel() {
            continue;
        }
        let udp = vs.protocol().is_datagram();
        for (j, a) in vs.listen.iter().enumerate() {
            let taken = wild.iter().find(|(ip, p, _, _)| {
                *ip == a.ip() && (*p == Protocol::Ip || (*p == Protocol::Udp) == udp)
            });
            if let Some((ip, _, what, w)) = taken {
                let owner = &cfg.virtual_services[*w];
                c.err(
                    &format!("virtual_service[{i}].listen[{j}]"),
                    format!(
                        "{a}: the in-kernel service virtual_service[{w}] ({}, forwarding = \"{}\") forwards {what} to {ip} before the kernel's sockets see it, so this proxied listener would never get a packet; listen on another address",
                        owner.name,
                        owner.forwarding().forwarding
                    ),
                );
            }
        }
    }
}

/// A member of port 0 (in a pool of a port-0 or ip service: "the port the client chose") has no
/// port of its own for a monitor to probe: its pool's monitors must name one (`port`), or not
/// need one (icmp; snmp has its own). Otherwise every check fails and the pool never comes up.
fn check_port_zero_members(c: &mut Checker<'_>, cfg: &Config) {
    for (i, pool) in cfg.pools.iter().enumerate() {
        let Some(member) = pool.members.iter().find(|m| m.address.port() == 0) else {
            continue;
        };
        for name in &pool.monitors {
            let Some(m) = cfg.monitor(name) else {
                continue;
            };
            if m.port.is_none() && !matches!(m.kind, MonitorKind::Icmp | MonitorKind::Snmp) {
                c.err(
                    &format!("pool[{i}].monitors"),
                    format!(
                        "monitor {name:?} ({}) probes each member on its own port, and member {} has port 0: give the monitor a `port`, or use an icmp monitor",
                        m.kind, member.address
                    ),
                );
            }
        }
    }
}
