//! Fulcrum's in-kernel L4 forwarder: an XDP program (bpf/fulcrum_xdp.c) in `dr`, `tunnel` and
//! `nat` modes, and the userspace side that loads it, fills its maps from pools and members,
//! attaches it and reads its counters.
//!
//! The program is written in C because an eBPF program in Rust needs a nightly toolchain and
//! bpf-linker. The compiled object is checked in and embedded, so `cargo build` needs no clang;
//! tests/object.rs rebuilds it with bpf/build.sh and requires it to be byte-identical.
//!
//! Above `Dataplane`: `tables` holds what the process wrote into the maps (services and reals)
//! and `flow_sync` syncs the connection tables with an HA peer through a transport the caller
//! gives (`FlowSink`, `FlowSync::apply`); `refresh` keeps rings, reals and the connection
//! table in line with the members, and `neighbours` resolves their next hops and reads this
//! node's interfaces.

pub mod flow_sync;
pub mod hash;
pub mod maps;
pub mod neighbours;
pub mod packet;
pub mod refresh;
pub mod tables;

use std::collections::HashMap as StdHashMap;
use std::net::IpAddr;

use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::{ProgramError, TestRun, TestRunOptions, Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use fulcrum_balance::sched::MaglevTable;

pub use maps::*;

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

// The ELF parser reads headers in place and needs them aligned; include_bytes! guarantees none.
static OBJECT_ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!("../bpf/fulcrum_xdp.o"));

/// The compiled XDP object (bpf/fulcrum_xdp.o).
pub fn object() -> &'static [u8] {
    &OBJECT_ALIGNED.0
}

/// The program that forwards; `xdp_pass` in the same object is the benchmark's baseline.
pub const PROGRAM: &str = "fulcrum_xdp";
pub const PASS_PROGRAM: &str = "xdp_pass";
/// Member side of tunnel mode: strips IPIP / IP6IP6 where the kernel cannot.
pub const DECAP_PROGRAM: &str = "fulcrum_decap";
/// Reads jiffies and the monotonic clock (run through BPF_PROG_RUN, never attached).
pub const CLOCK_PROGRAM: &str = "fulcrum_clock";

/// XDP return codes.
pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the XDP object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("XDP program: {0}")]
    Program(#[from] ProgramError),
    #[error("XDP map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("XDP map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("VIP index {0} out of range (at most {1} VIPs)")]
    VipIndex(u32, u32),
    #[error("mapping the rings array: {0}")]
    Mmap(std::io::Error),
    #[error("attaching XDP to {interface}: {message}")]
    Attach { interface: String, message: String },
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |source| Error::Map { name, source }
}

/// How many entries the maps get. The defaults suit a production balancer; tests shrink them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub vips: u32,
    pub conns: u32,
    pub nat_entries: u32,
    /// Entries of the `acl` trie: all VIPs' prefixes (IPv4 ones count twice, see
    /// `acl_entries`), and during a reload a changed VIP's old and new lists.
    pub acl_entries: u32,
}

impl Default for Limits {
    /// 262144 flows in each table: the kernel preallocates LRU maps, about 100 bytes per
    /// connection entry plus 16 per CPU, and 150 per NAT entry: ~70 MB on a 2-CPU machine.
    /// The rings take 64 × 65537 × 8 bytes (~34 MB).
    fn default() -> Limits {
        Limits {
            vips: 64,
            conns: 262_144,
            nat_entries: 262_144,
            acl_entries: 262_144,
        }
    }
}

/// Connection-tracking timeouts and tunnel sources, copied into the `settings` map.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub tcp_idle: std::time::Duration,
    pub tcp_fin: std::time::Duration,
    pub udp_idle: std::time::Duration,
    /// Flows of protocols without ports (ESP, GRE, ICMP echo, ...) to ip VIPs.
    pub other_idle: std::time::Duration,
    /// Tunnel outer source for IPv4: `prefix/len`; host bits come from the flow hash.
    pub tunnel_source_v4: (std::net::Ipv4Addr, u8),
    /// Tunnel outer source for IPv6: `prefix/len` (at most the last 32 bits vary).
    pub tunnel_source_v6: (std::net::Ipv6Addr, u8),
    /// Some VIP is in nat mode: look up replies from members.
    pub nat: bool,
    /// ha.sync: report new flows in `flow_events` (see `Dataplane::take_flow_events`).
    pub sync: bool,
    /// Some VIP listens on port 0 (every port of its protocol) or is an ip VIP
    /// (`VIP_PROTO_ANY`): the program tries those after a miss of the exact key.
    pub wildcard: bool,
    /// Some VIP is an ip VIP: packets of protocols without ports are looked up at all.
    pub any_proto: bool,
}

impl Default for Config {
    fn default() -> Config {
        // IPVS's defaults: established TCP 15 min, FIN_WAIT 2 min, UDP 5 min.
        Config {
            tcp_idle: std::time::Duration::from_secs(900),
            tcp_fin: std::time::Duration::from_secs(120),
            udp_idle: std::time::Duration::from_secs(300),
            other_idle: std::time::Duration::from_secs(300),
            tunnel_source_v4: (std::net::Ipv4Addr::new(172, 16, 0, 0), 16),
            tunnel_source_v6: (
                "100::".parse().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED),
                96,
            ),
            nat: false,
            sync: false,
            wildcard: false,
            any_proto: false,
        }
    }
}

impl Config {
    /// The prefixes tunnel mode's outer sources come from: what a member's decapsulator
    /// accepts (`Dataplane::set_decap_sources`).
    pub fn tunnel_sources(&self) -> [(IpAddr, u8); 2] {
        [
            (IpAddr::V4(self.tunnel_source_v4.0), self.tunnel_source_v4.1),
            (IpAddr::V6(self.tunnel_source_v6.0), self.tunnel_source_v6.1),
        ]
    }

    fn to_settings(self, hz: u64) -> Settings {
        let ticks = |d: std::time::Duration| {
            let t = d
                .as_nanos()
                .saturating_mul(u128::from(hz))
                .div_ceil(1_000_000_000);
            u64::try_from(t).unwrap_or(u64::MAX)
        };
        let host4 = u32::MAX
            .checked_shr(u32::from(self.tunnel_source_v4.1))
            .unwrap_or(0);
        let bits6 = 128u32
            .saturating_sub(u32::from(self.tunnel_source_v6.1))
            .min(32);
        let host6 = if bits6 == 0 {
            0
        } else {
            u32::MAX >> (32 - bits6)
        };
        let o6 = self.tunnel_source_v6.0.octets();
        let w = |i: usize| u32::from_ne_bytes([o6[i], o6[i + 1], o6[i + 2], o6[i + 3]]);
        Settings {
            tcp_idle: ticks(self.tcp_idle),
            tcp_fin: ticks(self.tcp_fin),
            udp_idle: ticks(self.udp_idle),
            other_idle: ticks(self.other_idle),
            tun_src4: u32::from_ne_bytes(self.tunnel_source_v4.0.octets()),
            tun_src4_mask: u32::from_ne_bytes(host4.to_be_bytes()),
            tun_src6: [w(0), w(4), w(8), w(12)],
            tun_src6_mask: u32::from_ne_bytes(host6.to_be_bytes()),
            flags: [
                (self.nat, SET_F_NAT),
                (self.sync, SET_F_SYNC),
                (self.wildcard || self.any_proto, SET_F_WILDCARD),
                (self.any_proto, SET_F_ANY_PROTO),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .fold(0, |f, (_, bit)| f | bit),
            nr_cpus: aya::util::nr_cpus().map_or(256, |n| n as u32),
            pad: 0,
        }
    }
}

/// Builds a VIP's ring: Maglev over the members' names and weights (fulcrum-balance's table,
/// the same one `algorithm = "hash"` uses), each slot holding the member's real index.
pub fn build_ring(names: &[String], weights: &[u32], reals: &[u32]) -> Vec<u32> {
    let table = MaglevTable::build_with_size(names, weights, RING_SIZE);
    if table.slots.is_empty() {
        return vec![NO_REAL; RING_SIZE];
    }
    table
        .slots
        .iter()
        .map(|&i| reals.get(i as usize).copied().unwrap_or(NO_REAL))
        .collect()
}

/// The kernel stores array elements 8 bytes apart (value size rounded up to 8), in u32 units;
/// the value is the element's first (little-endian low) word.
const RING_STRIDE: usize = 2;

/// The `rings` array mapped into this process (the map is BPF_F_MMAPABLE), so a ring is
/// written with stores rather than one bpf() call per slot.
struct RingMemory {
    base: std::ptr::NonNull<std::sync::atomic::AtomicU32>,
    slots: usize,
    bytes: usize,
}

impl RingMemory {
    fn map(fd: std::os::fd::BorrowedFd<'_>, slots: usize) -> Result<RingMemory, Error> {
        use std::os::fd::AsRawFd;
        let page = 4096usize;
        let bytes = (slots * RING_STRIDE * 4).div_ceil(page) * page;
        // SAFETY: mapping a BPF array map's fd shared and read-write is how the kernel exposes
        // BPF_F_MMAPABLE arrays; the length covers the map's value area rounded to pages, the
        // offset is 0, and the result is checked for MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::Mmap(std::io::Error::last_os_error()));
        }
        let base = std::ptr::NonNull::new(ptr.cast())
            .ok_or_else(|| Error::Mmap(std::io::Error::other("mmap returned a null mapping")))?;
        Ok(RingMemory { base, slots, bytes })
    }

    fn store(&self, slot: usize, value: u32) {
        if slot < self.slots {
            // SAFETY: slot < slots, and the mapping holds `slots` elements of RING_STRIDE u32s
            // (page-aligned, so each is 8-aligned) for as long as self lives. The XDP program reads the same
            // words concurrently; going through AtomicU32 makes each store a single aligned
            // 32-bit write, which is what such a concurrent reader needs.
            let cell = unsafe { self.base.as_ptr().add(slot * RING_STRIDE).as_ref() };
            if let Some(cell) = cell {
                cell.store(value, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

impl Drop for RingMemory {
    fn drop(&mut self) {
        // SAFETY: base/bytes are exactly what mmap returned in RingMemory::map, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
        }
    }
}

// SAFETY: RingMemory owns its mapping; the stores go through atomics, so moving it to (or
// sharing it with) another thread is sound.
unsafe impl Send for RingMemory {}
// SAFETY: as above.
unsafe impl Sync for RingMemory {}

/// The loaded program and its maps.
pub struct Dataplane {
    ebpf: Ebpf,
    ring_memory: RingMemory,
    limits: Limits,
    /// The ring last written per VIP index, so an update writes only the slots that changed.
    rings: StdHashMap<u32, Vec<u32>>,
    /// Interfaces with a program of ours attached, and the link to detach it with.
    attached: Vec<(String, &'static str, aya::programs::xdp::XdpLinkId)>,
    /// The kernel's timer frequency, measured at load.
    hz: u64,
    /// What `set_config` last wrote (its timeouts bound how long a flow entry lives).
    config: Config,
}

impl Dataplane {
    /// Loads the embedded object with `limits` and verifies both programs.
    pub fn load(limits: Limits) -> Result<Dataplane, Error> {
        Dataplane::load_object(object(), limits)
    }

    /// Loads another build of the object (experiments: bench/xdp.sh takes one in
    /// FULCRUM_XDP_OBJECT to compare a change against the embedded one in the same run).
    pub fn load_object(elf: &[u8], limits: Limits) -> Result<Dataplane, Error> {
        let rings = limits.vips.saturating_mul(RING_SIZE as u32);
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("rings", rings)
            .map_max_entries("vip_stats", limits.vips)
            .map_max_entries("conns", limits.conns)
            .map_max_entries("nat_replies", limits.nat_entries)
            .map_max_entries("acl", limits.acl_entries.max(1))
            .map_max_entries("vip_limits", limits.vips)
            .map_max_entries("vip_flows", limits.vips)
            .load(elf)?;
        for name in [PROGRAM, PASS_PROGRAM, DECAP_PROGRAM, CLOCK_PROGRAM] {
            xdp_program(&mut ebpf, name)?.load()?;
        }
        let ring_memory = {
            let m = ebpf.map("rings").ok_or(Error::MissingMap("rings"))?;
            let data = match m {
                aya::maps::Map::Array(d) => d,
                _ => return Err(Error::MissingMap("rings")),
            };
            use std::os::fd::AsFd;
            RingMemory::map(data.fd().as_fd(), rings as usize)?
        };
        let mut dp = Dataplane {
            ebpf,
            ring_memory,
            limits,
            rings: StdHashMap::new(),
            attached: Vec::new(),
            hz: 0,
            config: Config::default(),
        };
        dp.hz = dp.measure_hz()?;
        dp.set_config(&Config::default())?;
        Ok(dp)
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map, Error> {
        self.ebpf.map_mut(name).ok_or(Error::MissingMap(name))
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map, Error> {
        self.ebpf.map(name).ok_or(Error::MissingMap(name))
    }

    /// The connection table, to read.
    fn conns(&self) -> Result<PerCpuHashMap<&MapData, FlowKey, Conn>, Error> {
        PerCpuHashMap::try_from(self.map("conns")?).map_err(map_err("conns"))
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn set_config(&mut self, config: &Config) -> Result<(), Error> {
        self.config = *config;
        let hz = self.hz;
        let mut m: Array<&mut MapData, Settings> =
            Array::try_from(self.map_mut("settings")?).map_err(map_err("settings"))?;
        m.set(0, config.to_settings(hz), 0)
            .map_err(map_err("settings"))
    }

    /// The kernel's clocks now, read by the clock program.
    pub fn clock(&self) -> Result<ClockSample, Error> {
        // BPF_PROG_RUN wants at least an Ethernet header's worth of packet.
        self.test_run_program(CLOCK_PROGRAM, &[0u8; 14])?;
        let m: Array<&MapData, ClockSample> =
            Array::try_from(self.map("clock")?).map_err(map_err("clock"))?;
        m.get(&0, 0).map_err(map_err("clock"))
    }

    /// Jiffies now: the unit of `Conn::last` and `NatEntry::last`.
    pub fn now(&self) -> Result<u64, Error> {
        Ok(self.clock()?.jiffies)
    }

    /// The kernel's HZ (ticks per second), measured at load.
    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// HZ is a build option of the kernel (100, 250, 300 or 1000) that userspace cannot read
    /// reliably (/proc/config.gz is optional), so it is measured: jiffies against the
    /// monotonic clock over ~60 ms, snapped to the nearest of the values Linux allows.
    fn measure_hz(&self) -> Result<u64, Error> {
        let a = self.clock()?;
        std::thread::sleep(std::time::Duration::from_millis(60));
        let b = self.clock()?;
        let dt = b.ns.saturating_sub(a.ns).max(1) as f64 / 1e9;
        let rate = b.jiffies.saturating_sub(a.jiffies) as f64 / dt;
        let hz = [100u64, 250, 300, 1000]
            .into_iter()
            .min_by(|x, y| {
                (*x as f64 - rate)
                    .abs()
                    .total_cmp(&(*y as f64 - rate).abs())
            })
            .unwrap_or(250);
        tracing::debug!(rate, hz, "kernel HZ measured");
        Ok(hz)
    }

    /// Adds or updates a VIP. `index` selects its ring and counters (0..limits.vips).
    pub fn set_vip(&mut self, key: VipKey, meta: VipMeta) -> Result<(), Error> {
        if meta.index >= self.limits.vips {
            return Err(Error::VipIndex(meta.index, self.limits.vips));
        }
        {
            let mut m: HashMap<&mut MapData, VipKey, VipMeta> =
                HashMap::try_from(self.map_mut("vips")?).map_err(map_err("vips"))?;
            m.insert(key, meta, 0).map_err(map_err("vips"))?;
        }
        // The address's first VIP carries the counters of unclassifiable packets to it.
        let ak = AddrKey {
            addr: key.addr,
            family: u32::from(key.family),
        };
        let mut a: HashMap<&mut MapData, AddrKey, u32> =
            HashMap::try_from(self.map_mut("vip_addrs")?).map_err(map_err("vip_addrs"))?;
        if a.get(&ak, 0).is_err() {
            a.insert(ak, meta.index, 0).map_err(map_err("vip_addrs"))?;
        }
        Ok(())
    }

    /// Removes a VIP (its address entry goes when no other VIP uses the address).
    pub fn remove_vip(&mut self, key: &VipKey) -> Result<(), Error> {
        let remaining: Vec<VipKey> = {
            let mut m: HashMap<&mut MapData, VipKey, VipMeta> =
                HashMap::try_from(self.map_mut("vips")?).map_err(map_err("vips"))?;
            let _ = m.remove(key);
            m.keys().filter_map(Result::ok).collect()
        };
        if !remaining
            .iter()
            .any(|k| k.addr == key.addr && k.family == key.family)
        {
            let mut a: HashMap<&mut MapData, AddrKey, u32> =
                HashMap::try_from(self.map_mut("vip_addrs")?).map_err(map_err("vip_addrs"))?;
            let _ = a.remove(&AddrKey {
                addr: key.addr,
                family: u32::from(key.family),
            });
        }
        Ok(())
    }

    /// Sets real `index` (1..): its address, next-hop MAC, NAT port and egress interface.
    pub fn set_real(&mut self, index: u32, real: Real) -> Result<(), Error> {
        let mut m: Array<&mut MapData, Real> =
            Array::try_from(self.map_mut("reals")?).map_err(map_err("reals"))?;
        m.set(index, real, 0).map_err(map_err("reals"))
    }

    /// Writes VIP `index`'s ring (RING_SIZE real indices; missing slots are empty), touching only
    /// the slots that changed since the last write: a Maglev change moves about 1/N of them.
    /// Each slot is one aligned 32-bit store, so the data plane sees every slot either old or
    /// new, never torn; during the write some flows see the old ring and some the new.
    pub fn set_ring(&mut self, index: u32, ring: &[u32]) -> Result<usize, Error> {
        if index >= self.limits.vips {
            return Err(Error::VipIndex(index, self.limits.vips));
        }
        let previous = self.rings.remove(&index);
        let base = index as usize * RING_SIZE;
        let mut written = 0;
        for slot in 0..RING_SIZE {
            let real = ring.get(slot).copied().unwrap_or(NO_REAL);
            let old = previous.as_ref().and_then(|p| p.get(slot)).copied();
            if old != Some(real) {
                self.ring_memory.store(base + slot, real);
                written += 1;
            }
        }
        self.rings.insert(
            index,
            (0..RING_SIZE)
                .map(|i| ring.get(i).copied().unwrap_or(NO_REAL))
                .collect(),
        );
        Ok(written)
    }

    /// Drops every connection (and NAT reply entry) that points at real `index`: a disabled or
    /// dead member's flows are rescheduled on their next packet instead of black-holed.
    pub fn forget_real(&mut self, index: u32) -> Result<usize, Error> {
        let mut gone = 0;
        let doomed: Vec<(FlowKey, Option<FlowKey>)> = {
            let conns = self.conns()?;
            conns
                .iter()
                .filter_map(Result::ok)
                .filter(|(_, v)| v.iter().any(|c| c.real == index))
                .map(|(k, _)| (k, None))
                .collect()
        };
        let real = {
            let reals: Array<&MapData, Real> =
                Array::try_from(self.map("reals")?).map_err(map_err("reals"))?;
            reals.get(&index, 0).ok()
        };
        {
            let mut conns: PerCpuHashMap<&mut MapData, FlowKey, Conn> =
                PerCpuHashMap::try_from(self.map_mut("conns")?).map_err(map_err("conns"))?;
            for (k, _) in &doomed {
                if conns.remove(k).is_ok() {
                    gone += 1;
                }
            }
        }
        if let Some(real) = real {
            let mut nat: HashMap<&mut MapData, FlowKey, NatEntry> =
                HashMap::try_from(self.map_mut("nat_replies")?).map_err(map_err("nat_replies"))?;
            let keys: Vec<FlowKey> = nat
                .keys()
                .filter_map(Result::ok)
                .filter(|k| k.src == real.addr && k.family == real.family)
                .collect();
            for k in keys {
                let _ = nat.remove(&k);
            }
        }
        Ok(gone)
    }

    /// The outer sources `DECAP_PROGRAM` accepts, replacing the previous set: the balancers'
    /// tunnel source prefixes (`Config::tunnel_source_v4` / `_v6`). Tunnel packets from
    /// anywhere else are dropped and counted (`Global::DecapRefused`); with none set, all are.
    pub fn set_decap_sources(&mut self, prefixes: &[(IpAddr, u8)]) -> Result<(), Error> {
        use aya::maps::lpm_trie::{Key, LpmTrie};
        let mut trie: LpmTrie<&mut MapData, DecapSource, u32> =
            LpmTrie::try_from(self.map_mut("decap_sources")?).map_err(map_err("decap_sources"))?;
        let old: Vec<Key<DecapSource>> = trie.keys().filter_map(Result::ok).collect();
        for k in &old {
            let _ = trie.remove(k);
        }
        for &(addr, len) in prefixes {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let (addr, family) = addr_words(addr);
            let data = DecapSource {
                family: u32::from(family),
                addr,
            };
            // The family word is matched whole, then `len` bits of the address.
            let key = Key::new(32 + u32::from(len.min(max)), data);
            trie.insert(&key, 1, 0).map_err(map_err("decap_sources"))?;
        }
        Ok(())
    }

    /// Writes generation `gen` of VIP `index`'s access list (whatever that generation held
    /// before is removed first) and returns the VIP flags that put it in force: none for empty
    /// lists, else VIP_F_ACL, VIP_F_ALLOW_ONLY with an allow list, VIP_F_ACL_GEN for gen 1.
    /// The caller sets those flags on the VIP's keys, then `clear_acl`s the other generation:
    /// the program sees the old list or the new one, never a mix.
    pub fn set_acl(
        &mut self,
        index: u32,
        gen: bool,
        allow: &[(IpAddr, u8)],
        deny: &[(IpAddr, u8)],
    ) -> Result<u32, Error> {
        if index >= self.limits.vips {
            return Err(Error::VipIndex(index, self.limits.vips));
        }
        self.clear_acl(index, gen)?;
        if allow.is_empty() && deny.is_empty() {
            return Ok(0);
        }
        use aya::maps::lpm_trie::{Key, LpmTrie};
        let vip = index | (u32::from(gen) << ACL_GEN_SHIFT);
        let mut trie: LpmTrie<&mut MapData, AclKey, u32> =
            LpmTrie::try_from(self.map_mut("acl")?).map_err(map_err("acl"))?;
        for e in acl_entries(allow, deny) {
            let (addr, family) = addr_words(e.addr);
            let key = Key::new(
                64 + u32::from(e.len),
                AclKey {
                    vip,
                    family: u32::from(family),
                    addr,
                },
            );
            trie.insert(&key, e.verdict, 0).map_err(map_err("acl"))?;
        }
        Ok(VIP_F_ACL
            | if allow.is_empty() {
                0
            } else {
                VIP_F_ALLOW_ONLY
            }
            | if gen { VIP_F_ACL_GEN } else { 0 })
    }

    /// Removes generation `gen` of VIP `index`'s access list; the number of entries removed.
    pub fn clear_acl(&mut self, index: u32, gen: bool) -> Result<usize, Error> {
        use aya::maps::lpm_trie::{Key, LpmTrie};
        let vip = index | (u32::from(gen) << ACL_GEN_SHIFT);
        let mut trie: LpmTrie<&mut MapData, AclKey, u32> =
            LpmTrie::try_from(self.map_mut("acl")?).map_err(map_err("acl"))?;
        let old: Vec<Key<AclKey>> = trie
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.data().vip == vip)
            .collect();
        for k in &old {
            trie.remove(k).map_err(map_err("acl"))?;
        }
        Ok(old.len())
    }

    /// Entries in the `acl` trie (all VIPs, both generations).
    pub fn acl_len(&self) -> Result<usize, Error> {
        use aya::maps::lpm_trie::LpmTrie;
        let trie: LpmTrie<&MapData, AclKey, u32> =
            LpmTrie::try_from(self.map("acl")?).map_err(map_err("acl"))?;
        Ok(trie.keys().filter_map(Result::ok).count())
    }

    /// Sets VIP `index`'s flow limits (None: none) and returns the VIP flag that enables them.
    /// The flow count's correction (`FlowLimit::base`) is kept: a reload that changes the
    /// numbers does not forget the VIP's flows.
    pub fn set_flow_limits(
        &mut self,
        index: u32,
        limits: Option<FlowLimits>,
    ) -> Result<u32, Error> {
        if index >= self.limits.vips {
            return Err(Error::VipIndex(index, self.limits.vips));
        }
        let hz = self.hz.max(1);
        let old = {
            let m: Array<&MapData, FlowLimit> =
                Array::try_from(self.map("vip_limits")?).map_err(map_err("vip_limits"))?;
            m.get(&index, 0).map_err(map_err("vip_limits"))?
        };
        let entry = match limits {
            None => FlowLimit {
                base: old.base,
                ..FlowLimit::default()
            },
            Some(l) => {
                let rate = u128::from(l.new_per_second) * u128::from(FLOW_COST) / u128::from(hz);
                let mut entry = FlowLimit {
                    rate: u64::try_from(rate).unwrap_or(u64::MAX),
                    burst: l.burst.max(1).saturating_mul(FLOW_COST),
                    max: l.max,
                    base: old.base,
                };
                if old.max == 0 && l.max > 0 {
                    // A cap that starts now: the program did not count while there was none,
                    // so the count starts at 0 (admitting) until `recount_flows` finds the
                    // flows there are.
                    let s: Array<&MapData, FlowState> =
                        Array::try_from(self.map("vip_flows")?).map_err(map_err("vip_flows"))?;
                    let st = s.get(&index, 0).map_err(map_err("vip_flows"))?;
                    entry.base = st.created.wrapping_sub(st.ended);
                }
                entry
            }
        };
        let mut m: Array<&mut MapData, FlowLimit> =
            Array::try_from(self.map_mut("vip_limits")?).map_err(map_err("vip_limits"))?;
        m.set(index, entry, 0).map_err(map_err("vip_limits"))?;
        Ok(if limits.is_some() { VIP_F_LIMITS } else { 0 })
    }

    /// Starts VIP `index`'s flow accounting afresh (a service new at this index): a full
    /// bucket, no flows.
    pub fn reset_flows(&mut self, index: u32) -> Result<(), Error> {
        {
            let mut s: Array<&mut MapData, FlowState> =
                Array::try_from(self.map_mut("vip_flows")?).map_err(map_err("vip_flows"))?;
            s.set(index, FlowState::default(), 0)
                .map_err(map_err("vip_flows"))?;
        }
        let mut m: Array<&mut MapData, FlowLimit> =
            Array::try_from(self.map_mut("vip_limits")?).map_err(map_err("vip_limits"))?;
        let old = m.get(&index, 0).map_err(map_err("vip_limits"))?;
        m.set(index, FlowLimit { base: 0, ..old }, 0)
            .map_err(map_err("vip_limits"))
    }

    /// VIP `index`'s flow accounting as the program keeps it, and the flows it counts.
    pub fn flow_state(&self, index: u32) -> Result<(FlowState, i64), Error> {
        let s: Array<&MapData, FlowState> =
            Array::try_from(self.map("vip_flows")?).map_err(map_err("vip_flows"))?;
        let m: Array<&MapData, FlowLimit> =
            Array::try_from(self.map("vip_limits")?).map_err(map_err("vip_limits"))?;
        let st = s.get(&index, 0).map_err(map_err("vip_flows"))?;
        let l = m.get(&index, 0).map_err(map_err("vip_limits"))?;
        let n = st.created.wrapping_sub(st.ended).wrapping_sub(l.base) as i64;
        Ok((st, n))
    }

    /// Recounts the live flows of VIPs `indices` in the connection table and corrects their
    /// count (`FlowLimit::base`), which the program alone cannot keep: flows that go idle or
    /// that the LRU evicts leave without a word. Reads created/ended first, then walks the
    /// table (a key is one flow whatever the CPUs holding it; live: some CPU's entry is within
    /// its timeout); flows created during the walk may be counted twice until the next recount
    /// (too many, the safe side), an RST during it may be discounted twice. Returns the live
    /// flows per index.
    pub fn recount_flows(&mut self, indices: &[u32]) -> Result<StdHashMap<u32, u64>, Error> {
        let mut start: StdHashMap<u32, u64> = StdHashMap::new();
        {
            let s: Array<&MapData, FlowState> =
                Array::try_from(self.map("vip_flows")?).map_err(map_err("vip_flows"))?;
            for &i in indices {
                let st = s.get(&i, 0).map_err(map_err("vip_flows"))?;
                start.insert(i, st.created.wrapping_sub(st.ended));
            }
        }
        let vips: StdHashMap<VipKey, u32> = {
            let m: HashMap<&MapData, VipKey, VipMeta> =
                HashMap::try_from(self.map("vips")?).map_err(map_err("vips"))?;
            m.iter()
                .filter_map(Result::ok)
                .map(|(k, v)| (k, v.index))
                .collect()
        };
        let now = self.now()?;
        let s = self.config.to_settings(self.hz);
        let mut live: StdHashMap<u32, u64> = indices.iter().map(|&i| (i, 0)).collect();
        {
            let conns = self.conns()?;
            for (k, v) in conns.iter().filter_map(Result::ok) {
                let vk = VipKey {
                    addr: k.dst,
                    port: k.dport,
                    proto: k.proto,
                    family: k.family,
                };
                let Some(n) = vips.get(&vk).and_then(|i| live.get_mut(i)) else {
                    continue;
                };
                let alive = v.iter().any(|c| {
                    let idle = if k.proto == 17 {
                        s.udp_idle
                    } else if c.flags & CONN_F_FIN != 0 {
                        s.tcp_fin
                    } else {
                        s.tcp_idle
                    };
                    c.real != NO_REAL && now.saturating_sub(c.last) < idle
                });
                *n += u64::from(alive);
            }
        }
        let mut m: Array<&mut MapData, FlowLimit> =
            Array::try_from(self.map_mut("vip_limits")?).map_err(map_err("vip_limits"))?;
        for (&i, &n) in &live {
            let l = m.get(&i, 0).map_err(map_err("vip_limits"))?;
            let base = start.get(&i).copied().unwrap_or(0).wrapping_sub(n);
            m.set(i, FlowLimit { base, ..l }, 0)
                .map_err(map_err("vip_limits"))?;
        }
        Ok(live)
    }

    /// Whether a ring last written by `set_ring` holds real `index`.
    pub fn ring_holds(&self, index: u32) -> bool {
        self.rings.values().any(|r| r.contains(&index))
    }

    /// Reals that some connection entry (any CPU's) may still send packets to: entries idle
    /// for less than the longest timeout. Older ones are dead to the program (it reschedules
    /// their flow) even while the LRU keeps them.
    pub fn reals_in_use(&self) -> Result<std::collections::HashSet<u32>, Error> {
        let now = self.now()?;
        let s = self.config.to_settings(self.hz);
        let longest = s.tcp_idle.max(s.tcp_fin).max(s.udp_idle);
        let conns = self.conns()?;
        Ok(conns
            .iter()
            .filter_map(Result::ok)
            .flat_map(|(_, v)| {
                v.iter()
                    .filter(|c| c.real != NO_REAL && now.saturating_sub(c.last) < longest)
                    .map(|c| c.real)
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    /// Empties real `index`'s entry: a packet of a stale flow still naming it is dropped
    /// (no_member) rather than sent to an address that left.
    pub fn clear_real(&mut self, index: u32) -> Result<(), Error> {
        self.set_real(index, Real::default())
    }

    /// The ring buffer of new flows (ha.sync), to be drained by its own thread: taken once.
    pub fn take_flow_events(&mut self) -> Result<FlowEvents, Error> {
        let map = self
            .ebpf
            .take_map("flow_events")
            .ok_or(Error::MissingMap("flow_events"))?;
        let ring = aya::maps::RingBuf::try_from(map).map_err(map_err("flow_events"))?;
        Ok(FlowEvents { ring })
    }

    /// Every live connection entry (any CPU's), with the last packet seen on any CPU: the
    /// full dump ha.sync sends a peer that (re)connects. One bpf() call per entry.
    pub fn connections(&self) -> Result<Vec<(FlowKey, Conn)>, Error> {
        let conns = self.conns()?;
        Ok(conns
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(k, v)| {
                let live = v.iter().filter(|c| c.real != NO_REAL);
                live.max_by_key(|c| c.last).map(|c| (k, *c))
            })
            .collect())
    }

    /// The connection table entry of a flow (this CPU's or any CPU's), for tests and the API.
    pub fn conn(&self, key: &FlowKey) -> Result<Option<Conn>, Error> {
        let conns = self.conns()?;
        Ok(conns
            .get(key, 0)
            .ok()
            .and_then(|v| v.iter().find(|c| c.real != NO_REAL).copied()))
    }

    /// Writes a connection entry on every CPU (tests: pre-age an entry to check expiry).
    pub fn set_conn(&mut self, key: FlowKey, conn: Conn) -> Result<(), Error> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Attach {
            interface: String::new(),
            message: e.to_string(),
        })?;
        let values =
            aya::maps::PerCpuValues::try_from(vec![conn; cpus]).map_err(|e| Error::Map {
                name: "conns",
                source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                    call: "nr_cpus",
                    io_error: e,
                }),
            })?;
        let mut conns: PerCpuHashMap<&mut MapData, FlowKey, Conn> =
            PerCpuHashMap::try_from(self.map_mut("conns")?).map_err(map_err("conns"))?;
        conns.insert(key, values, 0).map_err(map_err("conns"))
    }

    pub fn conn_count(&self) -> Result<usize, Error> {
        let conns = self.conns()?;
        Ok(conns.keys().filter_map(Result::ok).count())
    }

    pub fn nat_entry(&self, key: &FlowKey) -> Result<Option<NatEntry>, Error> {
        let nat: HashMap<&MapData, FlowKey, NatEntry> =
            HashMap::try_from(self.map("nat_replies")?).map_err(map_err("nat_replies"))?;
        Ok(nat.get(key, 0).ok())
    }

    pub fn set_nat_entry(&mut self, key: FlowKey, entry: NatEntry) -> Result<(), Error> {
        let mut nat: HashMap<&mut MapData, FlowKey, NatEntry> =
            HashMap::try_from(self.map_mut("nat_replies")?).map_err(map_err("nat_replies"))?;
        nat.insert(key, entry, 0).map_err(map_err("nat_replies"))
    }

    /// Removes a NAT reply entry (tests: an entry the LRU evicted).
    pub fn remove_nat_entry(&mut self, key: &FlowKey) -> Result<(), Error> {
        let mut nat: HashMap<&mut MapData, FlowKey, NatEntry> =
            HashMap::try_from(self.map_mut("nat_replies")?).map_err(map_err("nat_replies"))?;
        nat.remove(key).map_err(map_err("nat_replies"))
    }

    /// Entry `index` of the per-CPU array `name`, one value a CPU.
    fn per_cpu<T: aya::Pod>(
        &self,
        name: &'static str,
        index: u32,
    ) -> Result<aya::maps::PerCpuValues<T>, Error> {
        let m: PerCpuArray<&MapData, T> =
            PerCpuArray::try_from(self.map(name)?).map_err(map_err(name))?;
        m.get(&index, 0).map_err(map_err(name))
    }

    /// Entry `index` of the per-CPU counters `name`, summed over CPUs.
    fn per_cpu_sum<T: aya::Pod + Default + std::ops::AddAssign>(
        &self,
        name: &'static str,
        index: u32,
    ) -> Result<T, Error> {
        let mut sum = T::default();
        for s in self.per_cpu::<T>(name, index)?.iter() {
            sum += *s;
        }
        Ok(sum)
    }

    /// A VIP's counters summed over CPUs.
    pub fn vip_stats(&self, index: u32) -> Result<VipStats, Error> {
        self.per_cpu_sum("vip_stats", index)
    }

    /// A real's counters summed over CPUs.
    pub fn real_stats(&self, index: u32) -> Result<RealStats, Error> {
        self.per_cpu_sum("real_stats", index)
    }

    /// A global counter summed over CPUs.
    pub fn global(&self, which: Global) -> Result<u64, Error> {
        self.per_cpu_sum("global_stats", which as u32)
    }

    fn program(&self, name: &'static str) -> Result<&Xdp, Error> {
        let p = self.ebpf.program(name).ok_or(Error::MissingMap(name))?;
        Ok(p.try_into()?)
    }

    /// Runs the forwarder once on `packet` through BPF_PROG_RUN: (XDP action, output frame).
    pub fn test_run(&self, packet: &[u8]) -> Result<(u32, Vec<u8>), Error> {
        self.test_run_program(PROGRAM, packet)
    }

    /// Runs `program` once on `packet` through BPF_PROG_RUN.
    pub fn test_run_program(
        &self,
        program: &'static str,
        packet: &[u8],
    ) -> Result<(u32, Vec<u8>), Error> {
        let mut out = vec![0u8; packet.len() + 256];
        let r = self.program(program)?.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            repeat: 1,
            ..TestRunOptions::default()
        })?;
        out.truncate(r.data_size_out as usize);
        Ok((r.return_value, out))
    }

    /// Runs `program` `repeat` times on `packet`; the kernel's mean time per run.
    pub fn bench(
        &self,
        program: &'static str,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(u32, std::time::Duration), Error> {
        let mut out = vec![0u8; packet.len() + 256];
        let r = self.program(program)?.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })?;
        Ok((r.return_value, r.duration))
    }

    /// Attaches the forwarder to `interface`. Attachment goes through a bpf_link, which the
    /// kernel removes when this process exits, however it exits: a crash cannot leave a stale
    /// program behind. A program already attached makes the attach fail (EBUSY; the netlink
    /// fallback asks for XDP_FLAGS_UPDATE_IF_NOEXIST). If it is one of this object's programs
    /// (by name), left the legacy (netlink) way by an older run or by hand, it is removed and
    /// the attach retried; another tool's program is left alone and the attach refused.
    /// Detaching (and exiting) removes only the links this process made.
    pub fn attach(&mut self, interface: &str, mode: XdpMode) -> Result<(), Error> {
        self.attach_program(PROGRAM, interface, mode)
    }

    /// Attaches the member-side decapsulator (`DECAP_PROGRAM`) instead of the forwarder.
    pub fn attach_decap(&mut self, interface: &str, mode: XdpMode) -> Result<(), Error> {
        self.attach_program(DECAP_PROGRAM, interface, mode)
    }

    fn attach_program(
        &mut self,
        program: &'static str,
        interface: &str,
        mode: XdpMode,
    ) -> Result<(), Error> {
        let err = |message: String| Error::Attach {
            interface: interface.to_string(),
            message,
        };
        let link = match xdp_program(&mut self.ebpf, program)?.attach(interface, mode) {
            Ok(link) => link,
            Err(e) => {
                let attached = attached_xdp_programs(interface).map_err(err)?;
                if attached.is_empty() {
                    return Err(err(e.to_string()));
                }
                if let Some(other) = attached
                    .iter()
                    .find(|n| !OWN_PROGRAMS.contains(&n.as_str()))
                {
                    return Err(err(format!(
                        "another tool's XDP program ({other}) is attached; Fulcrum replaces only \
                         its own: detach it (ip link set dev {interface} xdp off) or leave \
                         this interface out ({e})"
                    )));
                }
                tracing::warn!(%interface, error = %e, "XDP attach failed; removing a stale program and retrying");
                remove_legacy_xdp(interface).map_err(err)?;
                xdp_program(&mut self.ebpf, program)?
                    .attach(interface, mode)
                    .map_err(|e| err(format!("{e} (after removing the old program)")))?
            }
        };
        self.attached.push((interface.to_string(), program, link));
        Ok(())
    }

    /// Interfaces with the forwarder (or the decapsulator) attached.
    pub fn attached(&self) -> Vec<String> {
        self.attached.iter().map(|(i, _, _)| i.clone()).collect()
    }

    /// Detaches from `interface` (a reload that no longer lists it).
    pub fn detach(&mut self, interface: &str) -> Result<(), Error> {
        let Some(pos) = self.attached.iter().position(|(i, _, _)| i == interface) else {
            return Ok(());
        };
        let (_, program, link) = self.attached.remove(pos);
        xdp_program(&mut self.ebpf, program)?.detach(link)?;
        Ok(())
    }
}

fn xdp_program<'e>(ebpf: &'e mut Ebpf, name: &'static str) -> Result<&'e mut Xdp, Error> {
    let p = ebpf.program_mut(name).ok_or(Error::MissingMap(name))?;
    Ok(p.try_into()?)
}

/// Numbers for reals (members) in the `reals` array, reused once their member is gone.
///
/// A connection entry holds a real's number, not its address, so a number may go to another
/// member only when no entry can still send a packet to it. A number is retired when no pool
/// lists its member any more (the caller rewrites the rings without it); it is free again when
/// (1) no ring written through the Dataplane holds it, (2) `grace` has passed since it was
/// retired, which covers a program run that read an old ring slot just before the rewrite and
/// is about to write an entry with it (a run lasts microseconds), and (3) no connection entry
/// idle for less than the longest timeout names it: such a flow is still forwarded to the
/// member that left, as a removed member keeps its established flows, and keeps the number
/// until it ends or expires. On reuse, entries left naming the number (expired ones the LRU
/// kept) and the member's NAT reply entries are deleted first (`forget_real`) and the reals
/// entry is cleared, so nothing from the old member survives into the new one's number.
pub struct RealSlots {
    grace: std::time::Duration,
    /// Connection scans (one bpf() call per entry) at most this often.
    scan_every: std::time::Duration,
    next_scan: Option<std::time::Instant>,
    /// Never handed out yet.
    next: u32,
    free: Vec<u32>,
    retiring: Vec<(u32, std::time::Instant)>,
}

impl Default for RealSlots {
    fn default() -> RealSlots {
        RealSlots::new(
            std::time::Duration::from_secs(2),
            std::time::Duration::from_secs(10),
        )
    }
}

impl RealSlots {
    pub fn new(grace: std::time::Duration, scan_every: std::time::Duration) -> RealSlots {
        RealSlots {
            grace,
            scan_every,
            next_scan: None,
            next: 1,
            free: Vec::new(),
            retiring: Vec::new(),
        }
    }

    /// A number for a new member; `None` when all MAX_REALS - 1 are in use or retiring.
    pub fn allocate(&mut self) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        (self.next < MAX_REALS).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// `index`'s member is in no pool any more; its number is freed by `reclaim` later.
    pub fn retire(&mut self, index: u32, now: std::time::Instant) {
        if index != NO_REAL && !self.retiring.iter().any(|(i, _)| *i == index) {
            self.retiring.push((index, now));
        }
    }

    /// Numbers retiring (not yet free).
    pub fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Frees the retiring numbers that nothing can reach any more (see the type's comment);
    /// how many were freed.
    pub fn reclaim(&mut self, dp: &mut Dataplane, now: std::time::Instant) -> Result<usize, Error> {
        let due: Vec<u32> = self
            .retiring
            .iter()
            .filter(|(i, at)| now.duration_since(*at) >= self.grace && !dp.ring_holds(*i))
            .map(|(i, _)| *i)
            .collect();
        if due.is_empty() || self.next_scan.is_some_and(|t| now < t) {
            return Ok(0);
        }
        self.next_scan = Some(now + self.scan_every);
        let in_use = dp.reals_in_use()?;
        let mut freed = 0;
        for index in due.into_iter().filter(|i| !in_use.contains(i)) {
            dp.forget_real(index)?;
            dp.clear_real(index)?;
            self.retiring.retain(|(i, _)| *i != index);
            self.free.push(index);
            freed += 1;
        }
        Ok(freed)
    }
}

/// The `flow_events` ring buffer: new flows reported by the program while ha.sync is on.
pub struct FlowEvents {
    ring: aya::maps::RingBuf<aya::maps::MapData>,
}

impl FlowEvents {
    /// Waits up to `timeout` for events, then takes every one there is (at most `max`).
    pub fn read(&mut self, timeout: std::time::Duration, max: usize) -> Vec<FlowEvent> {
        let mut out = Vec::new();
        self.take(&mut out, max);
        if out.is_empty() {
            use std::os::fd::AsRawFd;
            let mut pfd = libc::pollfd {
                fd: self.ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: `pfd` is one valid pollfd that outlives the call, and nfds is 1.
            unsafe { libc::poll(&mut pfd, 1, ms) };
            self.take(&mut out, max);
        }
        out
    }

    fn take(&mut self, out: &mut Vec<FlowEvent>, max: usize) {
        while out.len() < max {
            let Some(item) = self.ring.next() else { break };
            if let Some(e) = FlowEvent::from_bytes(&item) {
                out.push(e);
            }
        }
    }
}

/// Programs of this object: an attached one with such a name was left by Fulcrum.
const OWN_PROGRAMS: [&str; 3] = [PROGRAM, DECAP_PROGRAM, PASS_PROGRAM];

/// Names of the XDP programs attached to `interface` (any mode), from `ip -d link show`'s
/// `prog/xdp… id N name NAME` lines.
fn attached_xdp_programs(interface: &str) -> Result<Vec<String>, String> {
    let out = std::process::Command::new("ip")
        .args(["-d", "link", "show", "dev", interface])
        .output()
        .map_err(|e| format!("ip link: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(program_names(&String::from_utf8_lossy(&out.stdout)))
}

fn program_names(ip_link: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in ip_link.lines() {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|w| w.starts_with("prog/xdp")) {
            continue;
        }
        let name = words.skip_while(|w| *w != "name").nth(1);
        // A program without a name (loaded without one) is nobody's we know: kept as "?".
        let name = name.unwrap_or("?").to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Removes whatever XDP program is attached to `interface` with netlink (all modes): called
/// only once every attached program is known to be one of ours.
fn remove_legacy_xdp(interface: &str) -> Result<(), String> {
    for mode in ["xdpgeneric", "xdpdrv"] {
        let out = std::process::Command::new("ip")
            .args(["link", "set", "dev", interface, mode, "off"])
            .output()
            .map_err(|e| format!("ip link: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
    }
    Ok(())
}

/// The decapsulator's allowed outer sources from `ADDR/LEN` texts (`fulcrum decap
/// --allow-source`); none given: the tunnel sources of a default `Config`.
pub fn decap_sources(texts: &[String]) -> Result<Vec<(IpAddr, u8)>, String> {
    if texts.is_empty() {
        return Ok(Config::default().tunnel_sources().to_vec());
    }
    texts
        .iter()
        .map(|t| {
            let bad = || format!("{t:?}: expected ADDRESS/LENGTH, e.g. 172.16.0.0/16");
            let (addr, len) = t.split_once('/').ok_or_else(bad)?;
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let len: u8 = len.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            if len > max {
                return Err(format!("{t:?}: a prefix length is at most {max}"));
            }
            Ok((addr, len))
        })
        .collect()
}

/// One entry of a VIP's access list as the `acl` trie holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclEntry {
    pub family: u8,
    /// The prefix's address, host bits cleared.
    pub addr: IpAddr,
    pub len: u8,
    /// ACL_DENY and/or ACL_ALLOW.
    pub verdict: u32,
}

/// Left-aligned bits of an address in its family's width.
fn left_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)) << 96,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    }
}

fn from_left_bits(family: u8, bits: u128) -> IpAddr {
    if family == 4 {
        IpAddr::V4(std::net::Ipv4Addr::from((bits >> 96) as u32))
    } else {
        IpAddr::V6(std::net::Ipv6Addr::from(bits))
    }
}

/// The `acl` trie entries for `allow` and `deny` (prefix address, length). The trie answers
/// with the longest listed prefix holding the source; each entry carries the verdict of the
/// whole list for such addresses: deny when some deny prefix covers the entry, allow when some
/// allow prefix does. Every listed prefix holding an address covers its longest one, so this is
/// exactly "deny wins, then allow" (fulcrum_config::AccessList::permits) whatever the lengths.
/// IPv4 prefixes are also entered as IPv4-mapped IPv6 (::ffff:a.b.c.d), matched as IPv4 like
/// the proxy does. Cost: one set probe per distinct prefix length per entry.
pub fn acl_entries(allow: &[(IpAddr, u8)], deny: &[(IpAddr, u8)]) -> Vec<AclEntry> {
    use std::collections::{BTreeSet, HashSet};
    // (family, len, left-aligned masked bits)
    let norm = |list: &[(IpAddr, u8)]| -> HashSet<(u8, u8, u128)> {
        let mut out = HashSet::new();
        for &(addr, len) in list {
            let (fam, max) = if addr.is_ipv4() {
                (4u8, 32u8)
            } else {
                (6, 128)
            };
            let len = len.min(max);
            let bits = left_bits(addr) & mask128(len);
            out.insert((fam, len, bits));
            if fam == 4 {
                let mapped = ((0xffffu128 << 32) | (bits >> 96)) & mask128(96 + len);
                out.insert((6, 96 + len, mapped));
            }
        }
        out
    };
    let allow = norm(allow);
    let deny = norm(deny);
    let lengths = |s: &HashSet<(u8, u8, u128)>| -> BTreeSet<(u8, u8)> {
        s.iter().map(|&(f, l, _)| (f, l)).collect()
    };
    let (allow_lens, deny_lens) = (lengths(&allow), lengths(&deny));
    let covered =
        |set: &HashSet<(u8, u8, u128)>, lens: &BTreeSet<(u8, u8)>, f: u8, l: u8, b: u128| {
            lens.iter()
                .filter(|&&(lf, ll)| lf == f && ll <= l)
                .any(|&(_, ll)| set.contains(&(f, ll, b & mask128(ll))))
        };
    let all: BTreeSet<(u8, u8, u128)> = allow.iter().chain(deny.iter()).copied().collect();
    all.into_iter()
        .map(|(f, l, b)| {
            let mut verdict = 0;
            if covered(&deny, &deny_lens, f, l, b) {
                verdict |= ACL_DENY;
            }
            if covered(&allow, &allow_lens, f, l, b) {
                verdict |= ACL_ALLOW;
            }
            AclEntry {
                family: f,
                addr: from_left_bits(f, b),
                len: l,
                verdict,
            }
        })
        .collect()
}

/// A VIP's flow limits (`flow_limits` of a nat / dr / tunnel service).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowLimits {
    /// New flows per second (token bucket refill); 0: no rate limit.
    pub new_per_second: u64,
    /// New flows the bucket holds (a burst after a quiet period).
    pub burst: u64,
    /// Concurrent flows; 0: no cap.
    pub max: u64,
}

/// The flow key of a client's packet, for tests and for predicting where a flow goes.
pub fn flow(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, proto: u8) -> FlowKey {
    FlowKey::new(src, sport, dst, dport, proto)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attached_program_names_are_read_from_ip_link() {
        let text = "3: xa@xb: <BROADCAST,MULTICAST> mtu 1500 xdpgeneric qdisc noop\n    \
                    link/ether 6e:50:d1:b9:0c:39 brd ff:ff:ff:ff:ff:ff\n    \
                    prog/xdp id 1341 name other_tool_pass tag 614b434cd8324ecc jited\n    \
                    prog/xdpdrv id 7 tag 00\n";
        assert_eq!(program_names(text), ["other_tool_pass", "?"]);
        assert!(program_names("1: lo: <LOOPBACK> mtu 65536\n").is_empty());
    }

    fn p(s: &str) -> (IpAddr, u8) {
        let (a, l) = s.split_once('/').expect("prefix");
        (a.parse().expect("addr"), l.parse().expect("len"))
    }

    #[test]
    fn acl_entries_carry_the_verdict_of_the_whole_list() {
        let allow = [p("10.0.0.0/24"), p("2001:db8::/32")];
        let deny = [p("10.0.0.0/8"), p("10.0.0.128/25")];
        let e = acl_entries(&allow, &deny);
        let find = |a: &str, l: u8| {
            e.iter()
                .find(|x| x.addr == a.parse::<IpAddr>().expect("a") && x.len == l)
                .map(|x| x.verdict)
        };
        // Deny wins over a longer allow prefix: the /24 sits inside the denied /8.
        assert_eq!(find("10.0.0.0", 24), Some(ACL_DENY | ACL_ALLOW));
        assert_eq!(find("10.0.0.0", 8), Some(ACL_DENY));
        assert_eq!(find("10.0.0.128", 25), Some(ACL_DENY | ACL_ALLOW));
        assert_eq!(find("2001:db8::", 32), Some(ACL_ALLOW));
        // IPv4 prefixes also as IPv4-mapped IPv6.
        assert_eq!(find("::ffff:10.0.0.0", 120), Some(ACL_DENY | ACL_ALLOW));
        assert_eq!(find("::ffff:10.0.0.0", 104), Some(ACL_DENY));
        assert_eq!(e.len(), 7);
        // Host bits are cleared.
        let e = acl_entries(&[p("192.0.2.77/24")], &[]);
        assert_eq!(e[0].addr, "192.0.2.0".parse::<IpAddr>().expect("a"));
    }

    #[test]
    fn decap_sources_parse_strictly_and_default_to_the_tunnel_sources() {
        let texts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            decap_sources(&[]).expect("default"),
            Config::default().tunnel_sources().to_vec()
        );
        assert_eq!(
            decap_sources(&texts(&["192.0.2.7/32", "2001:db8::/64"])).expect("valid"),
            vec![
                ("192.0.2.7".parse().expect("ip"), 32),
                ("2001:db8::".parse().expect("ip"), 64)
            ]
        );
        for bad in [
            "192.0.2.7",
            "192.0.2.7/33",
            "2001:db8::/129",
            "x/8",
            "10.0.0.0/-1",
        ] {
            assert!(decap_sources(&texts(&[bad])).is_err(), "{bad}");
        }
    }
}
