// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
//
// Fulcrum's in-kernel L4 forwarder (XDP). Katran-style: a VIP map, a reals array, one Maglev
// ring per VIP (built in userspace by fulcrum-balance), a per-CPU LRU connection table so a
// ring change never moves an established flow, and per-CPU counters.
//
// Modes (per VIP):
//   dr     - rewrite the destination MAC to the member's, XDP_TX. The member holds the VIP on lo.
//   tunnel - IPIP (IPv4 VIP) / IP6IP6 (IPv6 VIP) to the member; the outer source varies per flow.
//   nat    - DNAT to the member with incremental checksums; replies coming back from the member
//            get the reverse rewrite from a shared (not per-CPU) table, because they arrive on
//            whatever CPU the member side's queue lands on.
//
// Packet policy (also in docs/xdp.md):
//   - Anything that is not IPv4/IPv6 (ARP, LLDP, VLAN-tagged frames, ...) and IP traffic that is
//     neither to a VIP nor a NAT reply: XDP_PASS, untouched.
//   - IPv4 fragments and IPv6 packets with a Fragment header to a VIP address: XDP_DROP, counted
//     (non-first fragments carry no ports, so they cannot be put on the right member).
//   - IPv6 packets with other extension headers to a VIP address: XDP_DROP, counted.
//   - IPv4 options: forwarded like any other packet (the L4 header is found through IHL); counted.
//   - ICMP / ICMPv6 destination-unreachable (incl. fragmentation-needed / packet-too-big) whose
//     quoted packet belongs to a VIP flow: sent to the member that owns the flow so path MTU
//     discovery works; in nat mode with the quote rewritten to the member's own packet.
//   - Truncated/malformed L4 headers to a VIP address: XDP_DROP, counted. Truncated L2/L3 headers:
//     XDP_PASS (the kernel drops them and counts them in its own statistics), counted here too.
//
// VIP lookup: (address, protocol, port), then (address, protocol, port 0) — a tcp / udp service
// listening on port 0 takes every port — then (address, protocol 0, port 0), a `protocol = "ip"`
// service taking every IP protocol. The fallbacks cost nothing on a hit of the first lookup and
// are skipped entirely unless some VIP needs them (SET_F_WILDCARD). Protocols without ports
// (ESP, GRE, SCTP, ICMP echo, ...) go by (client, VIP, protocol) with the ports 0, so every
// packet of one client and protocol takes one member; ip VIPs hash by the client address only,
// so all of a client's protocols take the same member (IPsec's IKE and ESP together).
//
// Keep struct layouts in sync with crates/fulcrum-xdp/src/maps.rs (#[repr(C)] mirrors).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// linux/icmp.h pulls in libc's headers, which do not exist for the BPF target: the two
// definitions needed here instead.
#define ICMP_DEST_UNREACH 3
#define ICMP_ECHO 8
struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__u32 rest;
};

#define MAX_VIPS 64
#define MAX_REALS 4096
#define RING_SIZE 65537
// Sizes of the tables as compiled; the loader sets them (fulcrum_xdp::Limits).
#define MAX_CONNS 262144
#define MAX_NAT 262144

#define MODE_MASK 0x3
#define MODE_DR 1
#define MODE_TUNNEL 2
#define MODE_NAT 3
#define VIP_F_PERSIST_SRC 0x10
// The VIP has an access list (entries in `acl`): look the source up for packets without a flow
// (and every UDP datagram).
#define VIP_F_ACL 0x20
// ... with an `allow` list: a source in no allowed prefix is refused.
#define VIP_F_ALLOW_ONLY 0x40
// The VIP has flow limits (`vip_limits`): checked before a flow is created.
#define VIP_F_LIMITS 0x80
// Which of the VIP's two access lists in `acl` is in force: userspace writes a new list under
// the other generation, then flips this bit with one update of the VIP, then removes the old
// list, so a reload switches a VIP's list whole.
#define VIP_F_ACL_GEN 0x100
#define ACL_GEN_SHIFT 16

#define CONN_F_FIN 0x1
// Written by ha.sync from the peer's table; cleared by the first packet seen here, so that
// this node resends (refreshes) only flows it carries itself and never echoes the peer's.
#define CONN_F_SYNCED 0x2
// conn.seq_next / nat_entry.seq_next holds the sender's next sequence number (learnt from its
// first segment seen here; a synced or restored entry learns it from the next one).
#define CONN_F_SEQ 0x4
#define MAX_CPUS 256

#define SET_F_NAT 0x1
// ha.sync: report every new flow in `flow_events` for the peer node (off: the path costs one
// flag test per new flow, nothing per packet of an established one).
#define SET_F_SYNC 0x2
// Some VIP listens on port 0 or is an ip VIP: a miss of the exact VIP key tries the wildcards.
#define SET_F_WILDCARD 0x4
// Some VIP is an ip VIP: packets of protocols without ports are looked up at all.
#define SET_F_ANY_PROTO 0x8
// vip_key.proto of an ip VIP (every protocol; IPv6 hop-by-hop, also 0, never gets that far).
#define VIP_PROTO_ANY 0

enum drop_reason {
	DROP_NO_REAL = 0,   // the VIP's ring is empty (no member up)
	DROP_FRAGMENT = 1,  // IPv4 fragment / IPv6 Fragment header
	DROP_MALFORMED = 2, // L4 header truncated or bad length
	DROP_IPV6_EXT = 3,  // IPv6 extension header other than Fragment
	DROP_FAMILY = 4,    // tunnel: member's family differs from the VIP's
	DROP_ADJUST = 5,    // bpf_xdp_adjust_head failed (no headroom)
	DROP_NO_FLOW = 6,   // nat: TCP segment other than a SYN, and no flow (a stray ACK/RST/FIN)
	DROP_ACL_DENIED = 7,      // source in a `deny` prefix
	DROP_ACL_NOT_ALLOWED = 8, // `allow` set and the source in none of its prefixes
	DROP_FLOW_RATE = 9,       // new flow past the VIP's token bucket (new_per_second, burst)
	DROP_FLOW_MAX = 10,       // new flow while the VIP has `max` flows
	DROP_REASONS = 12,
};

enum global_counter {
	G_PASS_NON_IP = 0,   // ARP, ND is counted under G_PASS_NON_VIP (it is IPv6)
	G_PASS_NON_VIP = 1,  // IP traffic that is neither to a VIP nor a NAT reply
	G_MALFORMED_L3 = 2,  // truncated Ethernet/IP header, passed
	G_IP_OPTIONS = 3,    // IPv4 packets with options forwarded
	G_ICMP_FORWARDED = 4,
	G_ICMP_NAT_PASSED = 5,
	G_DECAPSULATED = 6,   // fulcrum_decap: tunnel packets stripped on a member
	G_SYNC_LOST = 7,      // new flows not reported to ha.sync: flow_events was full
	// dr/tunnel: TCP segment other than a SYN without a flow, sent where the ring says without
	// creating one (the member's stack, which knows its connections, answers or ignores it)
	G_NO_FLOW_FORWARDED = 8,
	G_RST_IGNORED = 9,      // RST outside the window the flow has seen: state kept, forwarded
	G_NAT_REPLY_RESTORED = 10, // nat reply entry lost (LRU) and rebuilt from the connection entry
	G_DECAP_REFUSED = 11,   // fulcrum_decap: outer source not an allowed balancer, dropped
	// dr/tunnel: a packet of a protocol without ports that cannot open a flow (an ICMP echo
	// reply, ...) without a flow, sent where the ring says without creating one
	G_PORTLESS_NO_FLOW_FORWARDED = 12,
	G_COUNTERS = 16,
};

struct vip_key {
	__u32 addr[4];
	__u16 port; // network order
	__u8 proto;
	__u8 family; // 4 or 6
};

struct vip_meta {
	__u32 index;
	__u32 flags;
};

struct addr_key {
	__u32 addr[4];
	__u32 family;
};

struct real {
	__u32 addr[4];
	__u8 mac[6];
	__u16 port; // network order; nat only (0 = the VIP's port)
	__u32 ifindex; // egress interface; 0 = the one the packet came in on (XDP_TX)
	__u8 family;
	__u8 flags;
	__u16 pad;
};

struct flow_key {
	__u32 src[4];
	__u32 dst[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u16 pad;
};

struct conn {
	__u32 real;
	__u32 flags;
	__u64 last;
	__u32 seq_next; // the client's next sequence number (CONN_F_SEQ)
	__u32 pad;
};

struct nat_entry {
	__u32 vip_addr[4];
	__u16 vip_port;
	__u8 client_mac[6];
	__u8 local_mac[6];
	__u16 pad;
	__u32 ifindex;
	__u32 vip_index;
	__u32 flags;
	__u32 seq_next; // the member's next sequence number (CONN_F_SEQ)
	__u64 last;
	// The acknowledgment number an RST refusing the client's SYN carries (its ISN + 1); 0 when
	// the entry was not made from a SYN.
	__u32 syn_ack;
	__u32 pad2;
};

// Times are in jiffies: bpf_jiffies64() is inlined by the JIT, where reading a clock through
// bpf_ktime_get_coarse_ns() cost about 18 ns of the ~105 ns of an LRU hit. Userspace measures
// the kernel's HZ (fulcrum_clock below) and converts the timeouts.
struct settings {
	__u64 tcp_idle;
	__u64 tcp_fin;
	__u64 udp_idle;
	__u64 other_idle; // protocols without ports (ip VIPs)
	__u32 tun_src4; // network order, host bits replaced by the flow hash
	__u32 tun_src4_mask; // network order, the host bits
	__u32 tun_src6[4];
	__u32 tun_src6_mask; // network order, applied to the last word
	__u32 flags;
	__u32 nr_cpus; // possible CPUs, bounds the search of other CPUs' connection entries
	__u32 pad;
};

// One new flow for ha.sync: the flow, the real and VIP it got (this node's indices; userspace
// names them by address), and for nat the hop replies to the client go back through.
struct flow_event {
	struct flow_key k;
	__u32 real;
	__u32 vip_index;
	__u32 ifindex; // where the flow came in
	__u8 client_mac[6]; // the frame's source: the client or its router
	__u16 pad;
	__u32 pad2;
};

struct vip_stats {
	__u64 packets;
	__u64 bytes;
	__u64 new_flows;
	__u64 reply_packets;
	__u64 reply_bytes;
	__u64 drops[DROP_REASONS];
};

// A VIP's access list, one LPM trie for all VIPs: the VIP index and the family lead the data,
// so prefixlen counts them (64 + the address bits) and a lookup only meets the VIP's own
// prefixes. Userspace stores on each prefix the verdict of the whole list for addresses whose
// longest listed prefix it is (ACL_DENY when a deny prefix covers it, ACL_ALLOW when an allow
// prefix does): with deny winning whatever the lengths, the longest match alone decides.
#define ACL_DENY 0x1
#define ACL_ALLOW 0x2

struct acl_key {
	__u32 prefixlen;
	__u32 vip; // index | generation << ACL_GEN_SHIFT
	__u32 family;
	__u32 addr[4];
};

// A VIP's flow limits (userspace writes them; `base` is its correction of the flow count, see
// vip_flows). Token bucket in 1/65536 of a flow: `rate` per jiffy, at most `burst`.
struct flow_limit {
	__u64 rate;
	__u64 burst;
	__u64 max; // 0: no cap on concurrent flows
	__u64 base;
};

// A VIP's flow accounting, written only here. Shared by all CPUs (not per-CPU): a per-CPU
// bucket would split the budget nr_cpus ways and refuse traffic that RSS puts on one queue.
// `created` and `ended` move by atomic adds; the VIP holds created - ended - base flows.
struct flow_state {
	__s64 tokens;
	__u64 last; // jiffies of the last refill
	__u64 created;
	__u64 ended; // flows this program removed (accepted RST); idle and evicted ones are
		     // accounted by userspace's recount (base)
};

#define FLOW_COST 65536

struct real_stats {
	__u64 packets;
	__u64 bytes;
	__u64 new_flows;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, struct vip_key);
	__type(value, struct vip_meta);
} vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, struct addr_key);
	__type(value, __u32);
} vip_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_REALS);
	__type(key, __u32);
	__type(value, struct real);
} reals SEC(".maps");

// Memory-mappable: userspace writes a VIP's 65537 slots with plain stores into the mapping
// instead of 65537 bpf() calls (about 0.2 s per VIP on a busy machine).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MAX_VIPS * RING_SIZE);
	__type(key, __u32);
	__type(value, __u32);
} rings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, MAX_CONNS);
	__type(key, struct flow_key);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_NAT);
	__type(key, struct flow_key);
	__type(value, struct nat_entry);
} nat_replies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings);
} settings SEC(".maps");

// New flows on their way to ha.sync (written only with SET_F_SYNC). 1 MiB: about 14500 events
// (64 bytes and an 8-byte header each), the burst of new flows the drain thread can fall behind.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} flow_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_stats);
} vip_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_REALS);
	__type(key, __u32);
	__type(value, struct real_stats);
} real_stats SEC(".maps");

// Sized by the loader (fulcrum_xdp::Limits::acl_entries).
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct acl_key);
	__type(value, __u32);
} acl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct flow_limit);
} vip_limits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct flow_state);
} vip_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, G_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} global_stats SEC(".maps");

// What the parser learnt about a packet.
struct pkt {
	struct flow_key k;
	__u32 l3_len; // IP total length (v4) / 40 + payload length (v6), from the header
	__u32 l4_off; // from the start of the frame
	__u8 tcp_flags;
	__u8 tos;
	__u8 icmp; // quoted packet of an ICMP error: key is the client->VIP flow
	__u8 opts;
	__u8 portless; // a protocol without ports (not TCP/UDP): key ports are 0
	__u8 opens;    // portless: this packet may start a flow (not an ICMP echo reply, ...)
	// TCP, host order: sequence number, the one after the segment (payload, SYN and FIN
	// counted), acknowledgment number.
	__u32 seq;
	__u32 seq_end;
	__u32 ack;
};

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

// RST acceptance (RFC 5961's concern, from the middle of the path). A sender's RST carries its
// SND.NXT (an abort), or the acknowledgment of a segment it refuses, which lies between its
// SND.UNA and SND.NXT; what the other side has not acknowledged yet is at most a window. So an
// RST is believed when its sequence number is at most RST_WINDOW before the sender's next
// sequence number seen here, and not after it. A blind attacker must hit a 64 KiB range out of
// 4 GiB (the odds an endpoint without RFC 5961 offers); one that does still only reaches what
// the endpoint would have believed anyway. A legitimate RST that misses (the sender's segments
// were lost before reaching this node, more than 64 KiB in flight) leaves the state to age out:
// forgetting a flow early breaks it, keeping one a little longer costs an entry.
#define RST_WINDOW 65535
// How far one segment may move the tracked sequence number forward. Data lost before this node
// makes legitimate jumps; a blind attacker's segment lands in range with odds 2^18 / 2^32, and
// only then could a second (RST) segment match. A legitimate jump beyond this stops tracking
// for the flow, which then ages out instead of ending on its RST.
#define SEQ_ADVANCE_MAX (1 << 18)

static __always_inline void track_seq(__u32 *seq_next, __u32 *flags, const struct pkt *p)
{
	if (p->tcp_flags & TCP_RST)
		return;
	if (!(*flags & CONN_F_SEQ)) {
		*seq_next = p->seq_end;
		*flags |= CONN_F_SEQ;
		return;
	}
	__u32 ahead = p->seq_end - *seq_next;
	if (ahead && ahead <= SEQ_ADVANCE_MAX) // most segments of a bulk receiver: no store
		*seq_next = p->seq_end;
}

static __always_inline int rst_in_window(__u32 seq_next, __u32 flags, const struct pkt *p)
{
	return (flags & CONN_F_SEQ) && seq_next - p->seq <= RST_WINDOW;
}

static __always_inline void count_global(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&global_stats, &which);
	if (c)
		*c += 1;
}

static __always_inline int drop_vip(__u32 vip_index, __u32 reason)
{
	struct vip_stats *s = bpf_map_lookup_elem(&vip_stats, &vip_index);
	if (s && reason < DROP_REASONS)
		s->drops[reason] += 1;
	return XDP_DROP;
}

// Drop a packet that goes to a VIP address but cannot be classified (fragment, extension header,
// truncated L4); pass it when the address is not a VIP's.
static __always_inline int drop_if_vip_addr(struct addr_key *a, __u32 reason)
{
	__u32 *idx = bpf_map_lookup_elem(&vip_addrs, a);
	if (!idx) {
		count_global(G_PASS_NON_VIP);
		return XDP_PASS;
	}
	return drop_vip(*idx, reason);
}

static __always_inline __u32 rotl32(__u32 x, __u32 r)
{
	return (x << r) | (x >> (32 - r));
}

static __always_inline __u32 mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

// MurmurHash3-style over the flow's words exactly as they sit in the packet (network order
// read as little-endian u32). crates/fulcrum-xdp/src/hash.rs mirrors it so userspace can tell
// where a flow goes; a test checks that the two agree.
static __always_inline __u32 flow_hash(const struct flow_key *k, int src_only)
{
	__u32 h = 0x46756c63; // "Fulc"
	h = mix(h, k->src[0]);
	h = mix(h, k->src[1]);
	h = mix(h, k->src[2]);
	h = mix(h, k->src[3]);
	if (!src_only) {
		h = mix(h, ((__u32)k->sport << 16) | k->dport);
		h = mix(h, k->proto);
	}
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u16 csum_fold(__u64 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

// RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), one 32-bit word replaced. One's-complement sums do
// not care about byte order as long as both words are read the same way, so raw loads work.
static __always_inline __u16 csum_replace4(__u16 sum, __u32 from, __u32 to)
{
	__u64 s = (__u16)~sum;
	s += (__u16)~(from & 0xffff);
	s += (__u16)~(from >> 16);
	s += to & 0xffff;
	s += to >> 16;
	return ~csum_fold(s);
}

static __always_inline __u16 csum_replace2(__u16 sum, __u16 from, __u16 to)
{
	__u64 s = (__u16)~sum;
	s += (__u16)~from;
	s += to;
	return ~csum_fold(s);
}

static __always_inline int out(struct xdp_md *ctx, __u32 ifindex)
{
	if (ifindex == 0 || ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(ifindex, 0);
}

static __always_inline int set_macs(struct xdp_md *ctx, const __u8 *dst)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	// The frame came to us, so its destination MAC is ours: it becomes the source.
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, dst, ETH_ALEN);
	return 0;
}

// Where encap_v4 and encap_v6 write their outer header, and the settings they read.
struct outer {
	struct settings *cfg;
	void *hdr;
};

#define GO_ENCAP (-1)

// The encapsulation common to both families: room made for an outer header of `len` bytes
// after the Ethernet header, which is rewritten to go to member `r` (of `family`) from us with
// `proto`. GO_ENCAP with `o` filled in, or the verdict.
static __always_inline int push_outer(struct xdp_md *ctx, const struct real *r, __u32 vip_index,
				      __u8 family, __u32 len, __u16 proto, struct outer *o)
{
	__u32 zero = 0;
	__u8 old_dst[ETH_ALEN];
	void *data, *end;
	struct ethhdr *eth;

	if (r->family != family)
		return drop_vip(vip_index, DROP_FAMILY);
	o->cfg = bpf_map_lookup_elem(&settings, &zero);
	if (!o->cfg)
		return XDP_ABORTED;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_ABORTED;
	__builtin_memcpy(old_dst, eth->h_dest, ETH_ALEN);
	if (bpf_xdp_adjust_head(ctx, 0 - (int)len))
		return drop_vip(vip_index, DROP_ADJUST);
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if (data + sizeof(struct ethhdr) + len > end)
		return XDP_ABORTED;
	__builtin_memcpy(eth->h_dest, r->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, old_dst, ETH_ALEN);
	eth->h_proto = bpf_htons(proto);
	o->hdr = data + sizeof(struct ethhdr);
	return GO_ENCAP;
}

static __always_inline int encap_v4(struct xdp_md *ctx, struct pkt *p, const struct real *r,
				    __u32 hash, __u32 vip_index)
{
	struct outer o;
	int verdict = push_outer(ctx, r, vip_index, 4, sizeof(struct iphdr), ETH_P_IP, &o);
	if (verdict != GO_ENCAP)
		return verdict;
	struct settings *cfg = o.cfg;
	struct iphdr *ip = o.hdr;
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = p->tos;
	ip->tot_len = bpf_htons(p->l3_len + sizeof(struct iphdr));
	ip->id = 0;
	ip->frag_off = 0;
	ip->ttl = 64;
	ip->protocol = IPPROTO_IPIP;
	ip->check = 0;
	ip->saddr = (cfg->tun_src4 & ~cfg->tun_src4_mask) | (bpf_htonl(hash) & cfg->tun_src4_mask);
	ip->daddr = r->addr[0];
	__u16 *w = (__u16 *)ip;
	__u64 s = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		s += w[i];
	ip->check = ~csum_fold(s);
	return out(ctx, r->ifindex);
}

static __always_inline int encap_v6(struct xdp_md *ctx, struct pkt *p, const struct real *r,
				    __u32 hash, __u32 vip_index)
{
	struct outer o;
	int verdict = push_outer(ctx, r, vip_index, 6, sizeof(struct ipv6hdr), ETH_P_IPV6, &o);
	if (verdict != GO_ENCAP)
		return verdict;
	struct settings *cfg = o.cfg;
	struct ipv6hdr *ip6 = o.hdr;
	// Version 6, traffic class from the inner packet, flow label from the flow hash so that
	// ECMP and the member's RSS spread flows even though the outer addresses repeat.
	__u32 label = hash & 0xfffff;
	__u32 first = (6u << 28) | ((__u32)p->tos << 20) | label;
	*(__u32 *)ip6 = bpf_htonl(first);
	ip6->payload_len = bpf_htons(p->l3_len);
	ip6->nexthdr = IPPROTO_IPV6;
	ip6->hop_limit = 64;
	ip6->saddr.in6_u.u6_addr32[0] = cfg->tun_src6[0];
	ip6->saddr.in6_u.u6_addr32[1] = cfg->tun_src6[1];
	ip6->saddr.in6_u.u6_addr32[2] = cfg->tun_src6[2];
	ip6->saddr.in6_u.u6_addr32[3] =
		(cfg->tun_src6[3] & ~cfg->tun_src6_mask) | (bpf_htonl(hash) & cfg->tun_src6_mask);
	ip6->daddr.in6_u.u6_addr32[0] = r->addr[0];
	ip6->daddr.in6_u.u6_addr32[1] = r->addr[1];
	ip6->daddr.in6_u.u6_addr32[2] = r->addr[2];
	ip6->daddr.in6_u.u6_addr32[3] = r->addr[3];
	return out(ctx, r->ifindex);
}

// One end of a TCP or UDP packet (its destination when `dst`, else its source) rewritten to
// `addr` and `port`, with the IPv4 header and L4 checksums. -1: the headers are not where the
// parser found them.
static __always_inline int rewrite_end(struct xdp_md *ctx, const struct pkt *p, int dst,
				       const __u32 *addr, __u16 port)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u16 *l4csum;
	__u16 *portp;
	__u32 l4 = p->l4_off;
	int udp_zero = 0;

	if (l4 > 14 + 60)
		return -1;
	if (p->k.proto == IPPROTO_TCP) {
		struct tcphdr *th = data + l4;
		if ((void *)(th + 1) > end)
			return -1;
		l4csum = &th->check;
		portp = dst ? &th->dest : &th->source;
	} else {
		struct udphdr *uh = data + l4;
		if ((void *)(uh + 1) > end)
			return -1;
		l4csum = &uh->check;
		portp = dst ? &uh->dest : &uh->source;
		udp_zero = p->k.family == 4 && uh->check == 0;
	}
	__u16 sum = csum_replace2(*l4csum, *portp, port);
	*portp = port;
	if (p->k.family == 4) {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		if ((void *)(ip + 1) > end)
			return -1;
		__u32 *a = dst ? &ip->daddr : &ip->saddr;
		ip->check = csum_replace4(ip->check, *a, addr[0]);
		sum = csum_replace4(sum, *a, addr[0]);
		*a = addr[0];
	} else {
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		if ((void *)(ip6 + 1) > end)
			return -1;
		__u32 *a = dst ? ip6->daddr.in6_u.u6_addr32 : ip6->saddr.in6_u.u6_addr32;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			sum = csum_replace4(sum, a[i], addr[i]);
			a[i] = addr[i];
		}
	}
	if (udp_zero)
		sum = 0; // IPv4 UDP without checksum stays without
	else if (p->k.proto == IPPROTO_UDP && sum == 0)
		sum = 0xffff;
	*l4csum = sum;
	return 0;
}

// DNAT of a client->VIP packet to the member: addresses, port, IPv4 header and L4 checksums.
static __always_inline int nat_in(struct xdp_md *ctx, struct pkt *p, const struct real *r)
{
	if (rewrite_end(ctx, p, 1, r->addr, r->port ? r->port : p->k.dport))
		return XDP_ABORTED;
	if (set_macs(ctx, r->mac))
		return XDP_ABORTED;
	return out(ctx, r->ifindex);
}

// The address of a packet without ports rewritten to `to` (dst: the destination, else the
// source), with the checksums that cover it: the IPv4 header's, and ICMPv6's, whose
// pseudo-header holds the addresses. ICMPv4, GRE, ESP and SCTP (CRC32c over its own header and
// data) have no checksum over the addresses; neither do the others of `protocol = "ip"`
// (docs/xdp.md names the exceptions). -1: the headers are not where the parser found them.
static __always_inline int portless_rewrite(struct xdp_md *ctx, const struct pkt *p,
					    const __u32 *to, int dst)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (p->k.family == 4) {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		if ((void *)(ip + 1) > end)
			return -1;
		__u32 *a = dst ? &ip->daddr : &ip->saddr;
		ip->check = csum_replace4(ip->check, *a, to[0]);
		*a = to[0];
		return 0;
	}
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	if ((void *)(ip6 + 1) > end)
		return -1;
	__u32 *a = dst ? ip6->daddr.in6_u.u6_addr32 : ip6->saddr.in6_u.u6_addr32;
	if (p->k.proto == IPPROTO_ICMPV6) {
		struct icmp6hdr *ic = (void *)(ip6 + 1);
		if ((void *)(ic + 1) > end)
			return -1;
		__u16 sum = ic->icmp6_cksum;
#pragma unroll
		for (int i = 0; i < 4; i++)
			sum = csum_replace4(sum, a[i], to[i]);
		ic->icmp6_cksum = sum;
	}
#pragma unroll
	for (int i = 0; i < 4; i++)
		a[i] = to[i];
	return 0;
}

// nat mode, a packet without ports to an ip VIP: the destination becomes the member's address.
static __always_inline int nat_in_portless(struct xdp_md *ctx, struct pkt *p, const struct real *r)
{
	if (portless_rewrite(ctx, p, r->addr, 1))
		return XDP_ABORTED;
	if (set_macs(ctx, r->mac))
		return XDP_ABORTED;
	return out(ctx, r->ifindex);
}

// nat mode, an ICMP error about a VIP flow (e.g. fragmentation needed for a reply the member
// sent): the member must find its own packet in the quote, so the outer destination, the quoted
// source address and port, and every checksum that covers them are rewritten (outer IPv4
// header, ICMP / ICMPv6 with its pseudo-header, quoted IPv4 header, quoted TCP/UDP checksum when
// the quote reaches it). Quotes too short to rewrite are passed to the kernel and counted.
static __always_inline int nat_icmp(struct xdp_md *ctx, struct pkt *p, const struct real *r)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 off = p->l4_off;
	if (off > 14 + 60)
		goto pass;
	if (p->k.family == 4) {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		if ((void *)(ip + 1) > end)
			goto pass;
		struct icmphdr *ic = data + off;
		if ((void *)(ic + 1) > end)
			goto pass;
		struct iphdr *in = (void *)(ic + 1);
		if ((void *)(in + 1) > end)
			goto pass;
		__u16 *ports = (void *)(in + 1);
		if ((void *)(ports + 2) > end)
			goto pass;
		__u32 va = in->saddr, ra = r->addr[0];
		__u16 vport = ports[0];
		__u16 rport = r->port ? r->port : vport;
		__u16 icsum = ic->checksum;
		__u16 *l4sum = (void *)ports + (in->protocol == IPPROTO_TCP ? 16 : 6);
		if ((void *)(l4sum + 1) <= end && !(in->protocol == IPPROTO_UDP && *l4sum == 0)) {
			__u16 old = *l4sum;
			__u16 n = csum_replace4(old, va, ra);
			n = csum_replace2(n, vport, rport);
			if (in->protocol == IPPROTO_UDP && n == 0)
				n = 0xffff;
			*l4sum = n;
			icsum = csum_replace2(icsum, old, n);
		}
		__u16 old_check = in->check;
		in->check = csum_replace4(in->check, va, ra);
		icsum = csum_replace2(icsum, old_check, in->check);
		icsum = csum_replace4(icsum, va, ra);
		in->saddr = ra;
		icsum = csum_replace2(icsum, vport, rport);
		ports[0] = rport;
		ic->checksum = icsum;
		ip->check = csum_replace4(ip->check, ip->daddr, ra);
		ip->daddr = ra;
	} else {
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		if ((void *)(ip6 + 1) > end)
			goto pass;
		struct icmp6hdr *ic = data + off;
		if ((void *)(ic + 1) > end)
			goto pass;
		struct ipv6hdr *in = (void *)(ic + 1);
		if ((void *)(in + 1) > end)
			goto pass;
		__u16 *ports = (void *)(in + 1);
		if ((void *)(ports + 2) > end)
			goto pass;
		__u16 vport = ports[0];
		__u16 rport = r->port ? r->port : vport;
		__u16 icsum = ic->icmp6_cksum;
		__u16 *l4sum = (void *)ports + (in->nexthdr == IPPROTO_TCP ? 16 : 6);
		int has_l4sum = (void *)(l4sum + 1) <= end;
		__u16 l4 = has_l4sum ? *l4sum : 0;
		__u16 l4_old = l4;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			__u32 va = in->saddr.in6_u.u6_addr32[i], ra = r->addr[i];
			// The quoted source and the outer destination (in the pseudo-header) both change.
			icsum = csum_replace4(icsum, va, ra);
			icsum = csum_replace4(icsum, ip6->daddr.in6_u.u6_addr32[i], ra);
			l4 = csum_replace4(l4, va, ra);
			in->saddr.in6_u.u6_addr32[i] = ra;
			ip6->daddr.in6_u.u6_addr32[i] = ra;
		}
		if (has_l4sum && (void *)(l4sum + 1) <= end) {
			l4 = csum_replace2(l4, vport, rport);
			if (in->nexthdr == IPPROTO_UDP && l4 == 0)
				l4 = 0xffff;
			*l4sum = l4;
			icsum = csum_replace2(icsum, l4_old, l4);
		}
		icsum = csum_replace2(icsum, vport, rport);
		ports[0] = rport;
		ic->icmp6_cksum = icsum;
	}
	count_global(G_ICMP_FORWARDED);
	if (set_macs(ctx, r->mac))
		return XDP_ABORTED;
	return out(ctx, r->ifindex);
pass:
	count_global(G_ICMP_NAT_PASSED);
	return XDP_PASS;
}

static __always_inline __u64 idle_limit(const struct settings *cfg, __u8 proto, __u32 flags)
{
	if (proto == IPPROTO_TCP)
		return (flags & CONN_F_FIN) ? cfg->tcp_fin : cfg->tcp_idle;
	if (proto == IPPROTO_UDP)
		return cfg->udp_idle;
	return cfg->other_idle;
}

// ha.sync: the new flow into flow_events; a full buffer loses it (counted), the flow itself is
// forwarded all the same.
static __always_inline void report_new_flow(struct xdp_md *ctx, const struct pkt *p, __u32 ri,
					    __u32 vi)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return;
	struct flow_event *e = bpf_ringbuf_reserve(&flow_events, sizeof(*e), 0);
	if (!e) {
		count_global(G_SYNC_LOST);
		return;
	}
	__builtin_memcpy(&e->k, &p->k, sizeof(e->k));
	e->real = ri;
	e->vip_index = vi;
	e->ifindex = ctx->ingress_ifindex;
	__builtin_memcpy(e->client_mac, eth->h_source, ETH_ALEN);
	e->pad = 0;
	e->pad2 = 0;
	bpf_ringbuf_submit(e, 0);
}

struct other_cpu_search {
	struct flow_key *key;
	struct settings *cfg;
	__u64 now;
	struct conn *found; // this CPU's (empty) slot, filled from the first live entry found
};

static long other_cpu_conn(__u32 cpu, void *arg)
{
	struct other_cpu_search *sr = arg;
	struct conn *o = bpf_map_lookup_percpu_elem(&conns, sr->key, cpu);
	if (!o || !o->real || !sr->found)
		return 0;
	if (sr->now - o->last >= idle_limit(sr->cfg, sr->key->proto, o->flags))
		return 0;
	sr->found->real = o->real;
	sr->found->flags = o->flags;
	sr->found->last = o->last;
	sr->found->seq_next = o->seq_next;
	return 1; // stop
}

// The drop reason for the packet's source under the VIP's access list, 0 when it may pass.
static __always_inline __u32 acl_refuses(__u32 vi, __u32 vflags, const struct pkt *p)
{
	struct acl_key k = {};
	k.prefixlen = 64 + (p->k.family == 4 ? 32 : 128);
	k.vip = vi | ((vflags & VIP_F_ACL_GEN) ? 1u << ACL_GEN_SHIFT : 0);
	k.family = p->k.family;
	__builtin_memcpy(k.addr, p->k.src, sizeof(k.addr));
	__u32 *v = bpf_map_lookup_elem(&acl, &k);
	__u32 verdict = v ? *v : 0;
	if (verdict & ACL_DENY)
		return DROP_ACL_DENIED;
	if ((vflags & VIP_F_ALLOW_ONLY) && !(verdict & ACL_ALLOW))
		return DROP_ACL_NOT_ALLOWED;
	return 0;
}

// A new flow for VIP `vi` under its limits: the drop reason, or 0 with the flow counted.
// The cap is checked first so a refused flow spends no token. The refill runs once per jiffy,
// by whichever CPU sees the tick first; two CPUs refilling in the same instant may lose a take
// made in between (the bucket is approximate by a few flows per tick, in the admitting
// direction), while takes themselves are atomic.
static __always_inline __u32 flow_admit(__u32 vi, __u64 now)
{
	struct flow_limit *l = bpf_map_lookup_elem(&vip_limits, &vi);
	struct flow_state *s = bpf_map_lookup_elem(&vip_flows, &vi);
	if (!l || !s)
		return 0;
	if (l->max && (__s64)(s->created - s->ended - l->base) >= (__s64)l->max)
		return DROP_FLOW_MAX;
	if (l->rate) {
		if (s->last != now) {
			__u64 elapsed = now - s->last;
			if (elapsed > (1 << 24))
				elapsed = 1 << 24;
			__s64 t = s->tokens + (__s64)(elapsed * l->rate);
			if (t > (__s64)l->burst)
				t = l->burst;
			s->tokens = t;
			s->last = now;
		}
		if (s->tokens < FLOW_COST)
			return DROP_FLOW_RATE;
		__sync_fetch_and_add(&s->tokens, -FLOW_COST);
	}
	__sync_fetch_and_add(&s->created, 1);
	return 0;
}

static __always_inline void flow_ended(__u32 vi)
{
	struct flow_state *s = bpf_map_lookup_elem(&vip_flows, &vi);
	if (s)
		__sync_fetch_and_add(&s->ended, 1);
}

static __always_inline int forward(struct xdp_md *ctx, struct pkt *p, const struct vip_meta *vip)
{
	__u32 vi = vip->index;
	__u32 zero = 0;
	__u32 ri = 0;
	__u32 len = (__u32)(ctx->data_end - ctx->data);
	int is_new = 0;
	int new_tick = 0; // first packet of this flow in this jiffy (on this CPU)
	int rst_accepted = 0;
	int tcp = p->k.proto == IPPROTO_TCP;
	__u32 mode = vip->flags & MODE_MASK;
	struct settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	struct vip_stats *vs = bpf_map_lookup_elem(&vip_stats, &vi);
	__u64 now;

	if (!cfg || !vs)
		return XDP_ABORTED;
	vs->packets += 1;
	vs->bytes += len;

	now = bpf_jiffies64();
	struct conn *c = bpf_map_lookup_elem(&conns, &p->k);
	if (c && !c->real) {
		// The key exists but this CPU's slot is empty: the flow was seen on another CPU
		// (RSS rehashed, RPS, or on veth the sender moved). Adopt that CPU's member rather
		// than rescheduling an established flow. New flows (no key) never get here.
		// bpf_loop: the verifier checks the callback once instead of every iteration.
		struct other_cpu_search sr = { .key = &p->k, .cfg = cfg, .now = now, .found = c };
		bpf_loop(cfg->nr_cpus < MAX_CPUS ? cfg->nr_cpus : MAX_CPUS, other_cpu_conn, &sr, 0);
	}
	if (c && c->real && now - c->last < idle_limit(cfg, p->k.proto, c->flags)) {
		ri = c->real;
		if (!p->icmp) {
			if (c->last != now) { // most packets of a busy flow share a tick: no store
				c->last = now;
				new_tick = 1;
			}
			if (tcp) {
				// A new connection on the tuple of one that ended: its own sequence space.
				if ((p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN &&
				    (c->flags & CONN_F_FIN))
					c->flags &= ~CONN_F_SEQ;
				if (p->tcp_flags & TCP_RST) {
					rst_accepted = rst_in_window(c->seq_next, c->flags, p);
					if (!rst_accepted)
						count_global(G_RST_IGNORED);
				}
				track_seq(&c->seq_next, &c->flags, p);
			}
			if (p->tcp_flags & TCP_FIN) // the flow winds down, expire it soon
				c->flags |= CONN_F_FIN;
			if (c->flags & CONN_F_SYNCED)
				c->flags &= ~CONN_F_SYNCED;
		}
	}
	// Only a SYN (without ACK) or a UDP datagram starts a flow: anything else without state is
	// not one this node carries (a stray or forged ACK/RST/FIN, or a flow whose state is
	// gone), and must not take a table entry from a real flow. nat has no way to forward it
	// (the reply would not be translated); dr and tunnel send it where the ring says, without
	// state, so that flows still reach their member after a restart that lost the table.
	// Protocols without ports: any packet may start a flow (ESP, GRE have no handshake) but an
	// ICMP echo reply and the like, which answer something.
	int no_flow = !ri && !p->icmp &&
		      ((tcp && (p->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) != TCP_SYN) ||
		       (p->portless && !p->opens));
	// allow / deny: like a proxied service, TCP is checked where a connection starts (any
	// segment without a flow: a flow of a denied source never exists, and one that predates
	// a reload goes on), UDP on every datagram. An ICMP error's quoted client is not its
	// sender: not checked (it creates nothing and reaches only a flow's own member).
	if ((vip->flags & VIP_F_ACL) && !p->icmp && (!ri || !tcp)) {
		__u32 why = acl_refuses(vi, vip->flags, p);
		if (why)
			return drop_vip(vi, why);
	}
	if (no_flow && mode == MODE_NAT)
		return drop_vip(vi, DROP_NO_FLOW);
	if (!ri && !p->icmp && !no_flow && (vip->flags & VIP_F_LIMITS)) {
		__u32 why = flow_admit(vi, now);
		if (why)
			return drop_vip(vi, why);
	}
	// Hashing 36 bytes of key is a good share of the per-packet cost: only a ring pick or a
	// tunnel's outer header needs it, an LRU hit in dr/nat mode does not.
	__u32 hash = 0;
	if (!ri || mode == MODE_TUNNEL)
		hash = flow_hash(&p->k, vip->flags & VIP_F_PERSIST_SRC);
	if (!ri) {
		__u32 slot = vi * RING_SIZE + hash % RING_SIZE;
		__u32 *rp = bpf_map_lookup_elem(&rings, &slot);
		if (!rp || !*rp)
			return drop_vip(vi, DROP_NO_REAL);
		ri = *rp;
		if (no_flow) {
			count_global(p->portless ? G_PORTLESS_NO_FLOW_FORWARDED : G_NO_FLOW_FORWARDED);
		} else if (!p->icmp) {
			struct conn nc = { .real = ri, .flags = 0, .last = now };
			if (tcp) {
				nc.seq_next = p->seq_end;
				nc.flags |= CONN_F_SEQ;
			}
			bpf_map_update_elem(&conns, &p->k, &nc, BPF_ANY);
			vs->new_flows += 1;
			is_new = 1;
			if (cfg->flags & SET_F_SYNC)
				report_new_flow(ctx, p, ri, vi);
		}
	}
	if (rst_accepted) { // the flow ends now
		bpf_map_delete_elem(&conns, &p->k);
		flow_ended(vi);
	}

	struct real *r = bpf_map_lookup_elem(&reals, &ri);
	if (!r || !r->family)
		return drop_vip(vi, DROP_NO_REAL);
	struct real_stats *rs = bpf_map_lookup_elem(&real_stats, &ri);
	if (rs) {
		rs->packets += 1;
		rs->bytes += len;
		rs->new_flows += is_new;
	}

	switch (mode) {
	case MODE_DR:
		if (set_macs(ctx, r->mac))
			return XDP_ABORTED;
		return out(ctx, r->ifindex);
	case MODE_TUNNEL:
		if (p->k.family == 4)
			return encap_v4(ctx, p, r, hash, vi);
		return encap_v6(ctx, p, r, hash, vi);
	case MODE_NAT: {
		if (p->icmp)
			return nat_icmp(ctx, p, r);
		struct flow_key rk = {};
		void *data = (void *)(long)ctx->data;
		void *end = (void *)(long)ctx->data_end;
		struct ethhdr *eth = data;
		if ((void *)(eth + 1) > end)
			return XDP_ABORTED;
		// The reply's key: member -> client.
		__builtin_memcpy(rk.src, r->addr, sizeof(rk.src));
		__builtin_memcpy(rk.dst, p->k.src, sizeof(rk.dst));
		if (!p->portless) {
			rk.sport = r->port ? r->port : p->k.dport;
			rk.dport = p->k.sport;
		}
		rk.proto = p->k.proto;
		rk.family = p->k.family;
		// The reply entry sits in an LRU table of its own and may be evicted while the
		// connection entry lives on: without it the member's replies would leave untranslated
		// for the rest of the flow. Looked for once per tick of a flow (replies in between a
		// loss and the check still pass untranslated), rebuilt from the connection entry and
		// this packet, which carry all it holds.
		int restore = !is_new && !rst_accepted && new_tick &&
			      !bpf_map_lookup_elem(&nat_replies, &rk);
		if (rst_accepted) {
			bpf_map_delete_elem(&nat_replies, &rk);
		} else if (is_new || restore) {
			struct nat_entry ne = {};
			__builtin_memcpy(ne.vip_addr, p->k.dst, sizeof(ne.vip_addr));
			ne.vip_port = p->k.dport;
			__builtin_memcpy(ne.client_mac, eth->h_source, ETH_ALEN);
			__builtin_memcpy(ne.local_mac, eth->h_dest, ETH_ALEN);
			ne.ifindex = ctx->ingress_ifindex;
			ne.vip_index = vi;
			ne.last = now;
			if (is_new && tcp)
				ne.syn_ack = p->seq + 1;
			bpf_map_update_elem(&nat_replies, &rk, &ne, BPF_ANY);
			if (restore)
				count_global(G_NAT_REPLY_RESTORED);
		}
		if (p->portless)
			return nat_in_portless(ctx, p, r);
		return nat_in(ctx, p, r);
	}
	}
	return drop_vip(vi, DROP_NO_REAL);
}

// A member's reply in nat mode: source back to the VIP, towards the client's next hop.
static __always_inline int nat_out(struct xdp_md *ctx, struct pkt *p)
{
	__u32 zero = 0;
	struct nat_entry *ne = bpf_map_lookup_elem(&nat_replies, &p->k);
	if (!ne) {
		count_global(G_PASS_NON_VIP);
		return XDP_PASS;
	}
	struct settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (!cfg)
		return XDP_ABORTED;
	__u64 now = bpf_jiffies64();
	if (now - ne->last > idle_limit(cfg, p->k.proto, ne->flags)) {
		bpf_map_delete_elem(&nat_replies, &p->k);
		count_global(G_PASS_NON_VIP);
		return XDP_PASS;
	}
	ne->last = now;
	int rst_accepted = 0;
	if (p->k.proto == IPPROTO_TCP) {
		if (p->tcp_flags & TCP_RST) {
			if (ne->flags & CONN_F_SEQ)
				rst_accepted = rst_in_window(ne->seq_next, ne->flags, p);
			else // the member refuses the client's SYN: RST+ACK acknowledging the SYN
				rst_accepted = ne->syn_ack && (p->tcp_flags & TCP_ACK) &&
					       p->ack == ne->syn_ack;
			if (!rst_accepted)
				count_global(G_RST_IGNORED);
		}
		track_seq(&ne->seq_next, &ne->flags, p);
	}
	if (p->tcp_flags & TCP_FIN)
		ne->flags |= CONN_F_FIN;
	__u32 vi = ne->vip_index;
	struct vip_stats *vs = bpf_map_lookup_elem(&vip_stats, &vi);
	if (vs) {
		vs->reply_packets += 1;
		vs->reply_bytes += (__u32)(ctx->data_end - ctx->data);
	}

	if (p->portless) {
		__u8 macs[2 * ETH_ALEN];
		__builtin_memcpy(macs, ne->client_mac, ETH_ALEN);
		__builtin_memcpy(macs + ETH_ALEN, ne->local_mac, ETH_ALEN);
		__u32 ifindex = ne->ifindex;
		if (portless_rewrite(ctx, p, ne->vip_addr, 0))
			return XDP_ABORTED;
		void *data = (void *)(long)ctx->data;
		void *end = (void *)(long)ctx->data_end;
		struct ethhdr *eth = data;
		if ((void *)(eth + 1) > end)
			return XDP_ABORTED;
		__builtin_memcpy(eth->h_dest, macs, ETH_ALEN);
		__builtin_memcpy(eth->h_source, macs + ETH_ALEN, ETH_ALEN);
		return out(ctx, ifindex);
	}

	__u16 vip_port = ne->vip_port;
	if (rewrite_end(ctx, p, 0, ne->vip_addr, vip_port))
		return XDP_ABORTED;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_ABORTED;
	__builtin_memcpy(eth->h_dest, ne->client_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, ne->local_mac, ETH_ALEN);
	__u32 ifindex = ne->ifindex;
	if (rst_accepted) {
		bpf_map_delete_elem(&nat_replies, &p->k);
		struct flow_key fk = {};
		// Forward key: client -> VIP. The entry pointer is gone after the delete, so the
		// key is rebuilt from the packet that was just rewritten.
		__builtin_memcpy(fk.src, p->k.dst, sizeof(fk.src));
		fk.dport = vip_port;
		fk.sport = p->k.dport;
		fk.proto = p->k.proto;
		fk.family = p->k.family;
		if (p->k.family == 4) {
			struct iphdr *ip = data + sizeof(struct ethhdr);
			if ((void *)(ip + 1) > end)
				return XDP_ABORTED;
			fk.dst[0] = ip->saddr;
		} else {
			struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
			if ((void *)(ip6 + 1) > end)
				return XDP_ABORTED;
			__builtin_memcpy(fk.dst, &ip6->saddr, sizeof(fk.dst));
		}
		bpf_map_delete_elem(&conns, &fk);
		flow_ended(vi);
	}
	return out(ctx, ifindex);
}

// Ports (and TCP flags) of a TCP/UDP header at `off`; -1 when truncated.
static __always_inline int parse_l4(struct xdp_md *ctx, struct pkt *p, __u32 off)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (off > 14 + 60)
		return -1;
	p->l4_off = off;
	if (p->k.proto == IPPROTO_TCP) {
		struct tcphdr *th = data + off;
		if ((void *)(th + 1) > end || th->doff < 5)
			return -1;
		p->k.sport = th->source;
		p->k.dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
		p->seq = bpf_ntohl(th->seq);
		p->ack = bpf_ntohl(th->ack_seq);
		// l3_len counts from the IP header, off from the frame's start.
		__u32 headers = off - sizeof(struct ethhdr) + th->doff * 4;
		__u32 payload = p->l3_len > headers ? p->l3_len - headers : 0;
		p->seq_end = p->seq + payload + !!(p->tcp_flags & TCP_SYN) + !!(p->tcp_flags & TCP_FIN);
		return 0;
	}
	struct udphdr *uh = data + off;
	if ((void *)(uh + 1) > end)
		return -1;
	p->k.sport = uh->source;
	p->k.dport = uh->dest;
	return 0;
}

// A miss of the exact VIP key: the protocol's port-0 VIP on the address, then the address's ip
// VIP. Only when some VIP is a wildcard, and only for addresses that hold a VIP: one lookup
// tells traffic to a VIP from a NAT reply, whose destination is a client.
static __always_inline struct vip_meta *wildcard_vip(struct vip_key *vk)
{
	__u32 zero = 0;
	struct settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (!cfg || !(cfg->flags & SET_F_WILDCARD))
		return 0;
	struct addr_key a = { .family = vk->family };
	__builtin_memcpy(a.addr, vk->addr, sizeof(a.addr));
	if (!bpf_map_lookup_elem(&vip_addrs, &a))
		return 0;
	struct vip_meta *vip;
	if (vk->port) {
		vk->port = 0;
		vip = bpf_map_lookup_elem(&vips, vk);
		if (vip)
			return vip;
	}
	if (vk->proto == VIP_PROTO_ANY)
		return 0;
	vk->proto = VIP_PROTO_ANY;
	return bpf_map_lookup_elem(&vips, vk);
}

static __always_inline int lookup_and_forward(struct xdp_md *ctx, struct pkt *p)
{
	struct vip_key vk = {};
	__builtin_memcpy(vk.addr, p->k.dst, sizeof(vk.addr));
	vk.port = p->k.dport;
	vk.proto = p->portless ? VIP_PROTO_ANY : p->k.proto;
	vk.family = p->k.family;
	struct vip_meta *vip = bpf_map_lookup_elem(&vips, &vk);
	if (!vip && !p->portless)
		vip = wildcard_vip(&vk);
	if (vip) {
		if (p->opts)
			count_global(G_IP_OPTIONS);
		return forward(ctx, p, vip);
	}
	__u32 zero = 0;
	struct settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (cfg && (cfg->flags & SET_F_NAT))
		return nat_out(ctx, p);
	count_global(G_PASS_NON_VIP);
	return XDP_PASS;
}

// The ICMP parsers' answer for a packet that is not an error: it goes on as a packet without
// ports (echo to an ip VIP, ...), with p->opens set.
#define GO_PORTLESS (-1)

// A packet of a protocol without ports (anything but TCP and UDP; ICMP echo too) is looked up
// only when some VIP is an ip VIP: then it may be for one, or in nat mode a member's reply.
// `opens`: it may start a flow. 0: pass it, it is not Fulcrum's.
static __always_inline int portless(struct pkt *p, __u32 off, int opens)
{
	__u32 zero = 0;
	struct settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (!cfg || !(cfg->flags & SET_F_ANY_PROTO)) {
		count_global(G_PASS_NON_VIP);
		return 0;
	}
	p->portless = 1;
	p->opens = opens;
	p->l4_off = off;
	return 1;
}

// An ICMP error quoting a packet of a TCP/UDP flow whose addresses are already in p->k (client
// -> VIP): the key gets the quoted ports, and the flow's VIP, if any, forwards the error as it
// forwards the flow.
static __always_inline int forward_icmp_error(struct xdp_md *ctx, struct pkt *p, __u32 off,
					      const __u16 *ports, __u8 proto, __u8 family)
{
	p->k.sport = ports[1];
	p->k.dport = ports[0];
	p->k.proto = proto;
	p->l4_off = off;
	p->icmp = 1;
	p->tcp_flags = 0;
	struct vip_key vk = { .port = p->k.dport, .proto = p->k.proto, .family = family };
	if (family == 4)
		vk.addr[0] = p->k.dst[0];
	else
		__builtin_memcpy(vk.addr, p->k.dst, 16);
	struct vip_meta *vip = bpf_map_lookup_elem(&vips, &vk);
	if (!vip)
		vip = wildcard_vip(&vk);
	if (!vip) {
		count_global(G_PASS_NON_VIP);
		return XDP_PASS;
	}
	if ((vip->flags & MODE_MASK) != MODE_NAT)
		count_global(G_ICMP_FORWARDED);
	return forward(ctx, p, vip);
}

// ICMP error quoting a VIP->client packet: find the client->VIP flow and send it the same way.
static __always_inline int icmp4_error(struct xdp_md *ctx, struct pkt *p, __u32 off)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (off > 14 + 60)
		return XDP_PASS;
	struct icmphdr *ic = data + off;
	if ((void *)(ic + 1) > end)
		return XDP_PASS;
	if (ic->type != ICMP_DEST_UNREACH) { // echo and the rest: to an ip VIP, if any
		p->opens = ic->type == ICMP_ECHO;
		return GO_PORTLESS;
	}
	struct iphdr *in = (void *)(ic + 1);
	if ((void *)(in + 1) > end || in->ihl != 5)
		return XDP_PASS;
	__u16 *ports = (void *)(in + 1);
	if ((void *)(ports + 2) > end)
		return XDP_PASS;
	if (in->protocol != IPPROTO_TCP && in->protocol != IPPROTO_UDP)
		return XDP_PASS;
	p->k.src[0] = in->daddr;
	p->k.dst[0] = in->saddr;
	return forward_icmp_error(ctx, p, off, ports, in->protocol, 4);
}

static __always_inline int icmp6_error(struct xdp_md *ctx, struct pkt *p, __u32 off)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct icmp6hdr *ic = data + off;
	if ((void *)(ic + 1) > end)
		return XDP_PASS;
	if (ic->icmp6_type == ICMPV6_ECHO_REQUEST || ic->icmp6_type == ICMPV6_ECHO_REPLY) {
		p->opens = ic->icmp6_type == ICMPV6_ECHO_REQUEST;
		return GO_PORTLESS;
	}
	// Neighbour discovery and the rest are this host's business, never a member's.
	if (ic->icmp6_type != ICMPV6_DEST_UNREACH && ic->icmp6_type != ICMPV6_PKT_TOOBIG) {
		count_global(G_PASS_NON_VIP);
		return XDP_PASS;
	}
	struct ipv6hdr *in = (void *)(ic + 1);
	if ((void *)(in + 1) > end)
		return XDP_PASS;
	__u16 *ports = (void *)(in + 1);
	if ((void *)(ports + 2) > end)
		return XDP_PASS;
	if (in->nexthdr != IPPROTO_TCP && in->nexthdr != IPPROTO_UDP)
		return XDP_PASS;
	__builtin_memcpy(p->k.src, &in->daddr, 16);
	__builtin_memcpy(p->k.dst, &in->saddr, 16);
	return forward_icmp_error(ctx, p, off, ports, in->nexthdr, 6);
}

static __always_inline int process_v4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct pkt p = {};

	if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl < 5) {
		count_global(G_MALFORMED_L3);
		return XDP_PASS;
	}
	__u32 ihl = ip->ihl * 4;
	__u32 tot = bpf_ntohs(ip->tot_len);
	if (tot < ihl || data + sizeof(struct ethhdr) + tot > end) {
		count_global(G_MALFORMED_L3);
		return XDP_PASS;
	}
	p.k.family = 4;
	p.k.proto = ip->protocol;
	p.k.src[0] = ip->saddr;
	p.k.dst[0] = ip->daddr;
	p.l3_len = tot;
	p.tos = ip->tos;
	p.opts = ihl > 20;
	if (p.k.proto != IPPROTO_TCP && p.k.proto != IPPROTO_UDP) {
		// Fragments go on too: without ports, every fragment carries the whole key.
		p.opens = 1;
		if (p.k.proto == IPPROTO_ICMP && !(ip->frag_off & bpf_htons(0x3fff))) {
			int r = icmp4_error(ctx, &p, sizeof(struct ethhdr) + ihl);
			if (r != GO_PORTLESS)
				return r;
		}
		if (!portless(&p, sizeof(struct ethhdr) + ihl, p.opens))
			return XDP_PASS;
	} else if (ip->frag_off & bpf_htons(0x3fff)) { // MF or a fragment offset
		struct addr_key a = { .family = 4 };
		a.addr[0] = ip->daddr;
		return drop_if_vip_addr(&a, DROP_FRAGMENT);
	} else if (parse_l4(ctx, &p, sizeof(struct ethhdr) + ihl)) {
		struct addr_key a = { .family = 4 };
		a.addr[0] = p.k.dst[0];
		return drop_if_vip_addr(&a, DROP_MALFORMED);
	}
	// One call for both kinds of packet: the forwarder is inlined once per family.
	return lookup_and_forward(ctx, &p);
}

// IPv6 extension headers (RFC 7045's list, ESP aside: what follows ESP is encrypted, so ESP is
// the protocol). Packets with one are not parsed further.
static __always_inline int ipv6_ext(__u8 nexthdr)
{
	switch (nexthdr) {
	case 0:   // hop-by-hop options
	case 43:  // routing
	case 44:  // fragment
	case 51:  // AH
	case 60:  // destination options
	case 135: // mobility
	case 139: // HIP
	case 140: // shim6
	case 253:
	case 254: // experiments
		return 1;
	}
	return 0;
}

static __always_inline int process_v6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	struct pkt p = {};

	if ((void *)(ip6 + 1) > end || ip6->version != 6) {
		count_global(G_MALFORMED_L3);
		return XDP_PASS;
	}
	__u32 plen = bpf_ntohs(ip6->payload_len);
	if (data + sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + plen > end) {
		count_global(G_MALFORMED_L3);
		return XDP_PASS;
	}
	p.k.family = 6;
	p.k.proto = ip6->nexthdr;
	__builtin_memcpy(p.k.src, &ip6->saddr, 16);
	__builtin_memcpy(p.k.dst, &ip6->daddr, 16);
	p.l3_len = plen + sizeof(struct ipv6hdr);
	p.tos = (bpf_ntohl(*(__u32 *)ip6) >> 20) & 0xff;
	__u32 off = sizeof(struct ethhdr) + sizeof(struct ipv6hdr);
	if (p.k.proto != IPPROTO_TCP && p.k.proto != IPPROTO_UDP && !ipv6_ext(p.k.proto)) {
		p.opens = 1;
		if (p.k.proto == IPPROTO_ICMPV6) {
			int r = icmp6_error(ctx, &p, off);
			if (r != GO_PORTLESS)
				return r;
		}
		if (!portless(&p, off, p.opens))
			return XDP_PASS;
	} else if (p.k.proto != IPPROTO_TCP && p.k.proto != IPPROTO_UDP) {
		struct addr_key a = { .family = 6 };
		__builtin_memcpy(a.addr, p.k.dst, 16);
		return drop_if_vip_addr(&a, p.k.proto == IPPROTO_FRAGMENT ? DROP_FRAGMENT
									  : DROP_IPV6_EXT);
	} else if (parse_l4(ctx, &p, off)) {
		struct addr_key a = { .family = 6 };
		__builtin_memcpy(a.addr, p.k.dst, 16);
		return drop_if_vip_addr(&a, DROP_MALFORMED);
	}
	return lookup_and_forward(ctx, &p);
}

SEC("xdp")
int fulcrum_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end) {
		count_global(G_MALFORMED_L3);
		return XDP_PASS;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return process_v4(ctx);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return process_v6(ctx);
	count_global(G_PASS_NON_IP);
	return XDP_PASS;
}

// The outer sources fulcrum_decap accepts: the balancers' tunnel source prefixes. The family
// leads the data, so one trie holds both (prefixlen counts it: 32 + the address bits).
struct decap_source {
	__u32 prefixlen;
	__u32 family;
	__u32 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct decap_source);
	__type(value, __u32);
} decap_sources SEC(".maps");

// Member side of tunnel mode, for hosts without IPIP / IP6IP6 decapsulation in their kernel
// (CONFIG_NET_IPIP / CONFIG_IPV6_TUNNEL unset): strips the outer IPv4 (protocol 4) or IPv6
// (next header 41 or 4) header and passes the inner packet to the stack, which delivers it to
// the VIP held on lo. Packets with IPv4 options or IPv6 extension headers in the outer header
// are not tunnel traffic Fulcrum sends; they pass untouched. A tunnel packet whose outer source
// is not in decap_sources is dropped (counted): stripped, it would reach the VIP on lo from
// anyone able to send IPIP to the member, past whatever filters the member's own address.
SEC("xdp")
int fulcrum_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ethhdr copy;
	int strip;
	__u16 inner_proto;
	struct decap_source src = {};

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_IPIP)
			return XDP_PASS;
		src.prefixlen = 64;
		src.family = 4;
		src.addr[0] = ip->saddr;
		strip = sizeof(struct iphdr);
		inner_proto = bpf_htons(ETH_P_IP);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		if (ip6->nexthdr == IPPROTO_IPV6)
			inner_proto = bpf_htons(ETH_P_IPV6);
		else if (ip6->nexthdr == IPPROTO_IPIP)
			inner_proto = bpf_htons(ETH_P_IP);
		else
			return XDP_PASS;
		src.prefixlen = 160;
		src.family = 6;
		__builtin_memcpy(src.addr, &ip6->saddr, sizeof(src.addr));
		strip = sizeof(struct ipv6hdr);
	} else {
		return XDP_PASS;
	}
	if (!bpf_map_lookup_elem(&decap_sources, &src)) {
		count_global(G_DECAP_REFUSED);
		return XDP_DROP;
	}
	__builtin_memcpy(&copy, eth, sizeof(copy));
	if (bpf_xdp_adjust_head(ctx, strip))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(eth, &copy, sizeof(copy));
	eth->h_proto = inner_proto;
	count_global(G_DECAPSULATED);
	return XDP_PASS;
}

struct clock_sample {
	__u64 jiffies;
	__u64 ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct clock_sample);
} clock SEC(".maps");

// Run by userspace through BPF_PROG_RUN: jiffies and CLOCK_MONOTONIC now, to measure HZ and to
// write connection entries with times the data plane understands.
SEC("xdp")
int fulcrum_clock(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct clock_sample *c = bpf_map_lookup_elem(&clock, &zero);
	if (c) {
		c->jiffies = bpf_jiffies64();
		c->ns = bpf_ktime_get_ns();
	}
	return XDP_PASS;
}

// The baseline the benchmark measures next to fulcrum_xdp in the same run.
SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
