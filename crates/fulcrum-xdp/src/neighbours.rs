//! This node's interfaces by name and by index (for the nat flows ha.sync carries).

/// Six colon-separated hex bytes, nothing more.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
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
