//! `#[repr(C)]` mirrors of the structs in bpf/fulcrum_xdp.c. Field order, sizes and padding must
//! match the C side exactly; `layout_matches_c` in the tests pins the sizes.

use std::net::IpAddr;

/// Ring slots per VIP (prime; Katran's size).
pub const RING_SIZE: usize = 65537;
/// Real index 0 means "no member" in a ring slot; reals are numbered from 1.
pub const NO_REAL: u32 = 0;
/// Entries of the `reals` array (MAX_REALS in the C source): reals 1..MAX_REALS.
pub const MAX_REALS: u32 = 4096;

/// The mode bits of `VipMeta::flags`.
pub const MODE_MASK: u32 = 0x3;
pub const MODE_DR: u32 = 1;
pub const MODE_TUNNEL: u32 = 2;
pub const MODE_NAT: u32 = 3;
pub const VIP_F_PERSIST_SRC: u32 = 0x10;
/// The VIP has an access list in the `acl` trie (set by `Dataplane::set_acl`).
pub const VIP_F_ACL: u32 = 0x20;
/// ... with an `allow` list: sources in none of its prefixes are refused.
pub const VIP_F_ALLOW_ONLY: u32 = 0x40;
/// The VIP has flow limits (`Dataplane::set_flow_limits`).
pub const VIP_F_LIMITS: u32 = 0x80;
/// Which generation of the VIP's access list is in force.
pub const VIP_F_ACL_GEN: u32 = 0x100;
/// The bits `Dataplane::set_acl` decides.
pub const VIP_F_ACL_MASK: u32 = VIP_F_ACL | VIP_F_ALLOW_ONLY | VIP_F_ACL_GEN;
/// `AclKey::vip`: the VIP index, and the generation above this bit.
pub const ACL_GEN_SHIFT: u32 = 16;
/// `acl` values: the verdict for addresses whose longest listed prefix is the key.
pub const ACL_DENY: u32 = 0x1;
pub const ACL_ALLOW: u32 = 0x2;
/// Tokens of the flow bucket are in 1/65536 of a flow.
pub const FLOW_COST: u64 = 65536;
pub const CONN_F_FIN: u32 = 0x1;
/// A connection entry written by ha.sync (the peer's flow); the first packet here clears it.
pub const CONN_F_SYNCED: u32 = 0x2;
/// `Conn::seq_next` / `NatEntry::seq_next` holds the sender's next sequence number.
pub const CONN_F_SEQ: u32 = 0x4;
pub const SET_F_NAT: u32 = 0x1;
/// ha.sync: every new flow is reported in the `flow_events` ring buffer.
pub const SET_F_SYNC: u32 = 0x2;
/// Some VIP listens on port 0 or is an ip VIP: a miss of the exact key tries the wildcards.
pub const SET_F_WILDCARD: u32 = 0x4;
/// Some VIP is an ip VIP: packets of protocols without ports are looked up.
pub const SET_F_ANY_PROTO: u32 = 0x8;
/// `VipKey::proto` of an ip VIP (`protocol = "ip"`: every IP protocol; port 0).
pub const VIP_PROTO_ANY: u8 = 0;

/// Why the data plane dropped a packet to a VIP (index into `VipStats::drops`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum DropReason {
    NoReal = 0,
    Fragment = 1,
    Malformed = 2,
    Ipv6Extension = 3,
    Family = 4,
    Adjust = 5,
    NoFlow = 6,
    AclDenied = 7,
    AclNotAllowed = 8,
    FlowRate = 9,
    FlowMax = 10,
}

impl DropReason {
    pub const ALL: [DropReason; 11] = [
        DropReason::NoReal,
        DropReason::Fragment,
        DropReason::Malformed,
        DropReason::Ipv6Extension,
        DropReason::Family,
        DropReason::Adjust,
        DropReason::NoFlow,
        DropReason::AclDenied,
        DropReason::AclNotAllowed,
        DropReason::FlowRate,
        DropReason::FlowMax,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DropReason::NoReal => "no_member",
            DropReason::Fragment => "fragment",
            DropReason::Malformed => "malformed",
            DropReason::Ipv6Extension => "ipv6_extension",
            DropReason::Family => "family_mismatch",
            DropReason::Adjust => "no_headroom",
            DropReason::NoFlow => "no_flow",
            DropReason::AclDenied => "denied",
            DropReason::AclNotAllowed => "not_allowed",
            DropReason::FlowRate => "flow_rate_limited",
            DropReason::FlowMax => "flow_limit_reached",
        }
    }
}

/// Global counters (index into the `global_stats` array).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Global {
    PassNonIp = 0,
    PassNonVip = 1,
    MalformedL3 = 2,
    IpOptions = 3,
    IcmpForwarded = 4,
    IcmpNatPassed = 5,
    Decapsulated = 6,
    SyncLost = 7,
    NoFlowForwarded = 8,
    RstIgnored = 9,
    NatReplyRestored = 10,
    DecapRefused = 11,
    PortlessNoFlowForwarded = 12,
}

impl Global {
    pub const ALL: [Global; 13] = [
        Global::PassNonIp,
        Global::PassNonVip,
        Global::MalformedL3,
        Global::IpOptions,
        Global::IcmpForwarded,
        Global::IcmpNatPassed,
        Global::Decapsulated,
        Global::SyncLost,
        Global::NoFlowForwarded,
        Global::RstIgnored,
        Global::NatReplyRestored,
        Global::DecapRefused,
        Global::PortlessNoFlowForwarded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Global::PassNonIp => "passed_non_ip",
            Global::PassNonVip => "passed_non_vip",
            Global::MalformedL3 => "passed_malformed_l3",
            Global::IpOptions => "ip_options_forwarded",
            Global::IcmpForwarded => "icmp_errors_forwarded",
            Global::IcmpNatPassed => "icmp_errors_nat_passed",
            Global::Decapsulated => "decapsulated",
            Global::SyncLost => "sync_events_lost",
            Global::NoFlowForwarded => "tcp_without_flow_forwarded",
            Global::RstIgnored => "rst_outside_window",
            Global::NatReplyRestored => "nat_reply_entries_restored",
            Global::DecapRefused => "decap_source_refused",
            Global::PortlessNoFlowForwarded => "ip_without_flow_forwarded",
        }
    }
}

/// An address as the C side stores it: the bytes as on the wire, IPv4 in the first word.
pub fn addr_words(addr: IpAddr) -> ([u32; 4], u8) {
    match addr {
        IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], 4),
        IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], 6)
        }
    }
}

/// A port as the C side stores it (network order in memory).
pub fn port_raw(port: u16) -> u16 {
    u16::from_ne_bytes(port.to_be_bytes())
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct VipKey {
    pub addr: [u32; 4],
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

impl VipKey {
    pub fn new(addr: IpAddr, port: u16, proto: u8) -> VipKey {
        let (addr, family) = addr_words(addr);
        VipKey {
            addr,
            port: port_raw(port),
            proto,
            family,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct VipMeta {
    pub index: u32,
    pub flags: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct AddrKey {
    pub addr: [u32; 4],
    pub family: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Real {
    pub addr: [u32; 4],
    pub mac: [u8; 6],
    /// nat only: the member's port in network order; 0 = the VIP's port.
    pub port: u16,
    /// Egress interface; 0 = the interface the packet came in on (XDP_TX).
    pub ifindex: u32,
    pub family: u8,
    pub flags: u8,
    pub pad: u16,
}

impl Real {
    pub fn new(addr: IpAddr, mac: [u8; 6], port: u16, ifindex: u32) -> Real {
        let (addr, family) = addr_words(addr);
        Real {
            addr,
            mac,
            port: port_raw(port),
            ifindex,
            family,
            flags: 0,
            pad: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub pad: u16,
}

impl FlowKey {
    pub fn new(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, proto: u8) -> FlowKey {
        let (src, family) = addr_words(src);
        let (dst, _) = addr_words(dst);
        FlowKey {
            src,
            dst,
            sport: port_raw(sport),
            dport: port_raw(dport),
            proto,
            family,
            pad: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Conn {
    pub real: u32,
    pub flags: u32,
    /// Last packet, in jiffies.
    pub last: u64,
    /// TCP: the client's next sequence number (with `CONN_F_SEQ`), to judge its RSTs by.
    pub seq_next: u32,
    pub pad: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct NatEntry {
    pub vip_addr: [u32; 4],
    pub vip_port: u16,
    pub client_mac: [u8; 6],
    pub local_mac: [u8; 6],
    pub pad: u16,
    pub ifindex: u32,
    pub vip_index: u32,
    pub flags: u32,
    /// TCP: the member's next sequence number (with `CONN_F_SEQ`), to judge its RSTs by.
    pub seq_next: u32,
    /// Last packet, in jiffies.
    pub last: u64,
    /// The acknowledgment number of an RST refusing the client's SYN; 0: not made from a SYN.
    pub syn_ack: u32,
    pub pad2: u32,
}

/// A prefix of outer sources `fulcrum_decap` accepts (LPM trie data: family, then address).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DecapSource {
    pub family: u32,
    pub addr: [u32; 4],
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Settings {
    /// Timeouts in jiffies.
    pub tcp_idle: u64,
    pub tcp_fin: u64,
    pub udp_idle: u64,
    /// Protocols without ports (ip VIPs).
    pub other_idle: u64,
    /// Tunnel outer source (network order words); the bits set in the mask come from the flow hash.
    pub tun_src4: u32,
    pub tun_src4_mask: u32,
    pub tun_src6: [u32; 4],
    pub tun_src6_mask: u32,
    pub flags: u32,
    pub nr_cpus: u32,
    pub pad: u32,
}

/// A new flow the program reported for ha.sync (`flow_events`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct FlowEvent {
    pub key: FlowKey,
    /// This node's real index.
    pub real: u32,
    pub vip_index: u32,
    /// The interface the flow came in on.
    pub ifindex: u32,
    /// Source MAC of the flow's first frame: the client or its router (nat replies go there).
    pub client_mac: [u8; 6],
    pub pad: u16,
    pub pad2: u32,
}

impl FlowEvent {
    /// Reads an event from the ring buffer's bytes; `None` when they are not one.
    pub fn from_bytes(b: &[u8]) -> Option<FlowEvent> {
        if b.len() < std::mem::size_of::<FlowEvent>() {
            return None;
        }
        // SAFETY: `b` holds at least size_of::<FlowEvent>() bytes (checked above), FlowEvent is
        // plain integers with no padding (any bit pattern is valid), and read_unaligned has no
        // alignment requirement.
        Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<FlowEvent>()) })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct VipStats {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub reply_packets: u64,
    pub reply_bytes: u64,
    pub drops: [u64; 12],
}

impl std::ops::AddAssign for VipStats {
    fn add_assign(&mut self, s: Self) {
        self.packets += s.packets;
        self.bytes += s.bytes;
        self.new_flows += s.new_flows;
        self.reply_packets += s.reply_packets;
        self.reply_bytes += s.reply_bytes;
        for (a, b) in self.drops.iter_mut().zip(s.drops) {
            *a += b;
        }
    }
}

/// Key of the `acl` LPM trie: `vip` (index | generation) and `family` are matched whole, then
/// the address's leading bits (the trie's prefix length counts 64 + those bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct AclKey {
    pub vip: u32,
    pub family: u32,
    pub addr: [u32; 4],
}

/// A VIP's flow limits as the program reads them (`vip_limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct FlowLimit {
    /// Tokens (1/65536 flow) added per jiffy; 0: no rate limit.
    pub rate: u64,
    /// Most tokens the bucket holds.
    pub burst: u64,
    /// Most concurrent flows; 0: no cap.
    pub max: u64,
    /// Userspace's correction of the flow count: the VIP holds created - ended - base flows.
    pub base: u64,
}

/// A VIP's flow accounting, written by the program (`vip_flows`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct FlowState {
    pub tokens: i64,
    pub last: u64,
    pub created: u64,
    pub ended: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RealStats {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

impl std::ops::AddAssign for RealStats {
    fn add_assign(&mut self, s: Self) {
        self.packets += s.packets;
        self.bytes += s.bytes;
        self.new_flows += s.new_flows;
    }
}

// SAFETY: every type here is #[repr(C)], made only of integers and integer arrays, with no
// implicit padding (the C side's explicit pads are fields here), so any bit pattern is valid and
// the kernel may copy them byte for byte.
unsafe impl aya::Pod for VipKey {}
// SAFETY: as above.
unsafe impl aya::Pod for VipMeta {}
// SAFETY: as above.
unsafe impl aya::Pod for AddrKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Real {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Conn {}
// SAFETY: as above.
unsafe impl aya::Pod for NatEntry {}
// SAFETY: as above.
unsafe impl aya::Pod for DecapSource {}
// SAFETY: as above.
unsafe impl aya::Pod for Settings {}
// SAFETY: as above.
unsafe impl aya::Pod for VipStats {}
// SAFETY: as above.
unsafe impl aya::Pod for RealStats {}
// SAFETY: as above.
unsafe impl aya::Pod for AclKey {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowLimit {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowState {}

/// A reading of the kernel's clocks by `fulcrum_clock`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ClockSample {
    pub jiffies: u64,
    pub ns: u64,
}

// SAFETY: as above.
unsafe impl aya::Pod for ClockSample {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn layout_matches_c() {
        assert_eq!(size_of::<VipKey>(), 20);
        assert_eq!(size_of::<VipMeta>(), 8);
        assert_eq!(size_of::<AddrKey>(), 20);
        assert_eq!(size_of::<Real>(), 32);
        assert_eq!(size_of::<FlowKey>(), 40);
        assert_eq!(size_of::<Conn>(), 24);
        assert_eq!(size_of::<NatEntry>(), 64);
        assert_eq!(size_of::<DecapSource>(), 20);
        assert_eq!(size_of::<Settings>(), 72);
        assert_eq!(size_of::<VipStats>(), 136);
        assert_eq!(size_of::<AclKey>(), 24);
        assert_eq!(size_of::<FlowLimit>(), 32);
        assert_eq!(size_of::<FlowState>(), 32);
        assert_eq!(size_of::<RealStats>(), 24);
        assert_eq!(size_of::<FlowEvent>(), 64);
    }
}
