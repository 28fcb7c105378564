//! Next hops and interfaces from the kernel: a member's next-hop MAC and egress interface (from
//! the routing and neighbour tables, through iproute2's JSON output), and this node's
//! interfaces by name and by index (for the nat flows ha.sync carries).

use std::net::{IpAddr, SocketAddr};

/// `02:00:5e:10:00:ff`.
pub fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Six colon-separated hex bytes, nothing more.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

fn ip_json(args: &[&str]) -> Option<serde_json::Value> {
    let out = std::process::Command::new("ip").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The next hop's MAC and the egress interface for `addr`, from the kernel's routing and
/// neighbour tables. iproute2's JSON output is used rather than a netlink library: two
/// read-only queries, off the packet path, once per member until resolved. When the neighbour
/// is not known yet, a datagram to the discard port makes the kernel resolve it.
pub fn resolve(addr: IpAddr) -> Option<([u8; 6], u32)> {
    let a = addr.to_string();
    let route = ip_json(&["-j", "route", "get", &a])?;
    let r = route.get(0)?;
    let dev = r.get("dev")?.as_str()?.to_string();
    let hop = r
        .get("gateway")
        .and_then(|g| g.as_str())
        .unwrap_or(&a)
        .to_string();
    let neigh = ip_json(&["-j", "neigh", "show", "to", &hop, "dev", &dev])?;
    let mac = neigh
        .as_array()?
        .iter()
        .filter(|n| {
            n.get("state").and_then(|s| s.as_array()).is_none_or(|s| {
                !s.iter()
                    .any(|v| v.as_str() == Some("FAILED") || v.as_str() == Some("INCOMPLETE"))
            })
        })
        .find_map(|n| parse_mac(n.get("lladdr")?.as_str()?));
    let Some(mac) = mac else {
        if let Ok(hop_ip) = hop.parse::<IpAddr>() {
            let bind: SocketAddr = if hop_ip.is_ipv4() {
                "0.0.0.0:0".parse().ok()?
            } else {
                "[::]:0".parse().ok()?
            };
            if let Ok(s) = std::net::UdpSocket::bind(bind) {
                let _ = s.send_to(b"", SocketAddr::new(hop_ip, 9));
            }
        }
        return None;
    };
    let c = std::ffi::CString::new(dev).ok()?;
    // SAFETY: if_nametoindex reads the NUL-terminated string `c`, which outlives the call.
    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (ifindex != 0).then_some((mac, ifindex))
}

/// The name of this node's interface `ifindex`.
pub fn interface_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, what if_indextoname may write (NUL included).
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success if_indextoname wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    name.to_str().ok().map(str::to_string)
}

/// This node's interface `name`: its index and MAC address.
pub fn local_interface(name: &str) -> Option<(u32, [u8; 6])> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: if_nametoindex reads the NUL-terminated string `c`, which outlives the call.
    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if ifindex == 0 {
        return None;
    }
    let mac = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).ok()?;
    Some((ifindex, parse_mac(mac.trim())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(
            parse_mac("02:00:5e:10:00:ff"),
            Some([2, 0, 0x5e, 0x10, 0, 0xff])
        );
        assert_eq!(parse_mac("02:00:5e:10:00"), None);
        assert_eq!(parse_mac("02:00:5e:10:00:ff:01"), None);
        assert_eq!(parse_mac("zz:00:5e:10:00:ff"), None);
        assert_eq!(fmt_mac([2, 0, 0x5e, 0x10, 0, 0xff]), "02:00:5e:10:00:ff");
    }
}
