//! The node's side of the wire: raw IPv4 or IPv6 sockets for protocol 112, the VIPs through
//! rtnetlink, gratuitous ARPs on a packet socket (IPv4) and unsolicited neighbour
//! advertisements on an ICMPv6 socket (IPv6).

use std::io::Read;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

use futures_util::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags};
use rtnetlink::packet_route::link::LinkAttribute;
use socket2::{
    Domain, InterfaceIndexOrAddress, MaybeUninitSlice, MsgHdrMut, Protocol, SockAddr, Socket, Type,
};
use tokio::io::unix::AsyncFd;

use crate::packet::{self, Advert, GROUP_V4, GROUP_V6, PROTO_VRRP, TTL};

/// What setting up VRRP's sockets and addresses can fail with.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("netlink: {0}")]
    Netlink(String),
    #[error("{0}: {1}")]
    Socket(&'static str, std::io::Error),
}

/// The interface adverts use: its index, hardware address and the address adverts come from
/// (IPv4: its first own address; IPv6: its link-local address, RFC 5798 §5.1.2.1).
#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub primary: IpAddr,
}

fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// rtnetlink over tokio; the connection task lives as long as the handle is used.
#[derive(Clone)]
pub struct Netlink {
    handle: rtnetlink::Handle,
}

fn nl(what: &str, e: rtnetlink::Error) -> HaError {
    HaError::Netlink(format!("{what}: {e}"))
}

fn errno_of(e: &rtnetlink::Error) -> i32 {
    match e {
        rtnetlink::Error::NetlinkError(m) => -m.raw_code(),
        _ => 0,
    }
}

impl Netlink {
    pub fn open() -> Result<Netlink, HaError> {
        let (conn, handle, _) =
            rtnetlink::new_connection().map_err(|e| HaError::Netlink(e.to_string()))?;
        tokio::spawn(conn);
        Ok(Netlink { handle })
    }

    /// Finds `name`, its MAC and the address adverts of family `v6` come from: the first IPv4
    /// address that is not a VIP, or the IPv6 link-local address.
    pub async fn interface(
        &self,
        name: &str,
        vips: &[IpNet],
        v6: bool,
    ) -> Result<Interface, HaError> {
        let (index, mac) = self.index_and_mac(name).await?;
        let primary = self
            .addresses(index)
            .await?
            .into_iter()
            .find(|a| match a {
                IpAddr::V4(_) => !v6 && !vips.iter().any(|v| v.addr() == *a),
                IpAddr::V6(a6) => v6 && is_link_local(a6),
            })
            .ok_or_else(|| {
                HaError::Netlink(if v6 {
                    format!(
                        "interface {name:?} has no IPv6 link-local address to send adverts from"
                    )
                } else {
                    format!(
                        "interface {name:?} has no IPv4 address of its own to send adverts from"
                    )
                })
            })?;
        Ok(Interface {
            name: name.to_string(),
            index,
            mac,
            primary,
        })
    }

    /// An interface that carries VIPs but no adverts: announcements there need its index and
    /// hardware address; `vip` stands for its address (only the family is used).
    pub async fn link(&self, name: &str, vip: IpAddr) -> Result<Interface, HaError> {
        let (index, mac) = self.index_and_mac(name).await?;
        Ok(Interface {
            name: name.to_string(),
            index,
            mac,
            primary: vip,
        })
    }

    /// Every address of every interface (IPv6 link-local and tentative ones included).
    pub async fn all_addresses(&self) -> Result<Vec<IpAddr>, HaError> {
        self.addresses_of(None).await
    }

    async fn index_and_mac(&self, name: &str) -> Result<(u32, [u8; 6]), HaError> {
        let link = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute()
            .try_next()
            .await
            .map_err(|e| nl(&format!("interface {name:?}"), e))?
            .ok_or_else(|| HaError::Netlink(format!("no interface named {name:?}")))?;
        let index = link.header.index;
        let mac = link
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::Address(m) if m.len() == 6 => {
                    let mut mac = [0u8; 6];
                    mac.copy_from_slice(m);
                    Some(mac)
                }
                _ => None,
            })
            .ok_or_else(|| {
                HaError::Netlink(format!("interface {name:?} has no Ethernet address"))
            })?;
        Ok((index, mac))
    }

    async fn addresses(&self, index: u32) -> Result<Vec<IpAddr>, HaError> {
        self.addresses_of(Some(index)).await
    }

    /// The addresses of interface `index` that can be bound now (a tentative one, duplicate
    /// address detection running, cannot yet), or of every interface, tentative ones included.
    async fn addresses_of(&self, index: Option<u32>) -> Result<Vec<IpAddr>, HaError> {
        let mut req = self.handle.address().get();
        if let Some(i) = index {
            req = req.set_link_index_filter(i);
        }
        let mut s = req.execute();
        let mut out = Vec::new();
        while let Some(msg) = s.try_next().await.map_err(|e| nl("addresses", e))? {
            if index.is_some() && msg.header.flags.contains(AddressHeaderFlags::Tentative) {
                continue;
            }
            // IPv4 names the interface's own address IFA_LOCAL; IPv6 has IFA_ADDRESS only.
            for a in &msg.attributes {
                match a {
                    AddressAttribute::Local(ip @ IpAddr::V4(_))
                    | AddressAttribute::Address(ip @ IpAddr::V6(_)) => out.push(*ip),
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// Adds `vip` to the interface; already present is fine. An IPv6 VIP skips duplicate
    /// address detection: it is ours the moment we are master, and DAD would hold it tentative
    /// (unusable) for a second or more.
    pub async fn add(&self, index: u32, vip: IpNet) -> Result<(), HaError> {
        let mut req = self
            .handle
            .address()
            .add(index, vip.addr(), vip.prefix_len());
        if vip.addr().is_ipv6() {
            req.message_mut().header.flags |= AddressHeaderFlags::Nodad;
        }
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno_of(&e) == libc::EEXIST => Ok(()),
            Err(e) => Err(nl(&format!("add {vip}"), e)),
        }
    }

    /// Removes `vip` from the interface; already absent is fine. Returns whether it was there.
    pub async fn remove(&self, index: u32, vip: IpNet) -> Result<bool, HaError> {
        let mut s = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(vip.addr())
            .execute();
        let mut removed = false;
        while let Some(msg) = s.try_next().await.map_err(|e| nl("addresses", e))? {
            match self.handle.address().del(msg).execute().await {
                Ok(()) => removed = true,
                Err(e) if errno_of(&e) == libc::EADDRNOTAVAIL => {}
                Err(e) => return Err(nl(&format!("remove {vip}"), e)),
            }
        }
        Ok(removed)
    }
}

/// Sends and receives adverts on one interface.
pub struct VrrpSocket {
    rx: AsyncFd<Socket>,
    tx: Socket,
    local: IpAddr,
    index: u32,
    /// Unicast peers; empty: multicast.
    peers: Vec<IpAddr>,
}

fn setsockopt_int(s: &Socket, level: i32, name: i32, value: i32) -> std::io::Result<()> {
    // SAFETY: setsockopt(2) on a socket we own, with a pointer to an int and its exact size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl VrrpSocket {
    /// Adverts of the family of `iface.primary`.
    pub fn open(iface: &Interface, peers: &[IpAddr]) -> Result<VrrpSocket, HaError> {
        let io = |what: &'static str| move |e: std::io::Error| HaError::Socket(what, e);
        let v6 = iface.primary.is_ipv6();
        let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
        let raw = || {
            Socket::new(
                domain,
                Type::RAW,
                Some(Protocol::from(i32::from(PROTO_VRRP))),
            )
        };
        // Receiving: not bound to an address (that would filter out the multicast group), but to
        // the device, so adverts of other segments never count.
        let rx = raw().map_err(io("raw socket (needs CAP_NET_RAW)"))?;
        rx.bind_device(Some(iface.name.as_bytes()))
            .map_err(io("SO_BINDTODEVICE"))?;
        if v6 {
            if peers.is_empty() {
                rx.join_multicast_v6(&GROUP_V6, iface.index)
                    .map_err(io("join ff02::12"))?;
            }
            // An IPv6 raw socket delivers the payload only: the hop limit and the destination
            // (for the checksum's pseudo-header) come as ancillary data.
            rx.set_recv_hoplimit_v6(true)
                .map_err(io("IPV6_RECVHOPLIMIT"))?;
            setsockopt_int(&rx, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)
                .map_err(io("IPV6_RECVPKTINFO"))?;
        } else if peers.is_empty() {
            rx.join_multicast_v4_n(&GROUP_V4, &InterfaceIndexOrAddress::Index(iface.index))
                .map_err(io("join 224.0.0.18"))?;
        }
        rx.set_nonblocking(true).map_err(io("nonblocking"))?;
        // Sending: bound to the advert source address, which the pseudo-header names.
        let tx = raw().map_err(io("raw socket"))?;
        tx.bind_device(Some(iface.name.as_bytes()))
            .map_err(io("SO_BINDTODEVICE"))?;
        match iface.primary {
            IpAddr::V4(a) => {
                tx.bind(&SocketAddr::V4(SocketAddrV4::new(a, 0)).into())
                    .map_err(io("bind to the primary address"))?;
                tx.set_ttl_v4(u32::from(TTL)).map_err(io("IP_TTL"))?;
                tx.set_multicast_ttl_v4(u32::from(TTL))
                    .map_err(io("IP_MULTICAST_TTL"))?;
                tx.set_multicast_loop_v4(false)
                    .map_err(io("IP_MULTICAST_LOOP"))?;
                tx.set_multicast_if_v4(&a).map_err(io("IP_MULTICAST_IF"))?;
                // Internetwork control, as routers (and keepalived) mark their adverts.
                let _ = tx.set_tos_v4(0xc0);
            }
            IpAddr::V6(a) => {
                tx.bind(&SocketAddr::V6(SocketAddrV6::new(a, 0, 0, iface.index)).into())
                    .map_err(io("bind to the link-local address"))?;
                tx.set_unicast_hops_v6(u32::from(TTL))
                    .map_err(io("IPV6_UNICAST_HOPS"))?;
                tx.set_multicast_hops_v6(u32::from(TTL))
                    .map_err(io("IPV6_MULTICAST_HOPS"))?;
                tx.set_multicast_loop_v6(false)
                    .map_err(io("IPV6_MULTICAST_LOOP"))?;
                tx.set_multicast_if_v6(iface.index)
                    .map_err(io("IPV6_MULTICAST_IF"))?;
                let _ = tx.set_tclass_v6(0xc0);
            }
        }
        tx.set_nonblocking(true).map_err(io("nonblocking"))?;
        // SAFETY: `rx` is an open socket that the AsyncFd owns from here on; a socket2::Socket
        // returns the same fd from as_raw_fd for its whole life and closes it only on drop.
        let rx = unsafe { AsyncFd::register_with_interest(rx, tokio::io::Interest::READABLE) }
            .map_err(|e| HaError::Socket("register with tokio", e.into()))?;
        Ok(VrrpSocket {
            rx,
            tx,
            local: iface.primary,
            index: iface.index,
            peers: peers.to_vec(),
        })
    }

    fn dest(&self, dst: IpAddr) -> SockAddr {
        match dst {
            IpAddr::V4(a) => SocketAddr::V4(SocketAddrV4::new(a, 0)).into(),
            // Multicast and link-local destinations need the interface as their scope.
            IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, 0, 0, self.index)).into(),
        }
    }

    /// Sends `advert` to the group or to every peer; returns how many were sent.
    pub fn send(&self, advert: &Advert) -> usize {
        let group = match self.local {
            IpAddr::V4(_) => IpAddr::V4(GROUP_V4),
            IpAddr::V6(_) => IpAddr::V6(GROUP_V6),
        };
        let targets: Vec<IpAddr> = if self.peers.is_empty() {
            vec![group]
        } else {
            self.peers.clone()
        };
        let mut sent = 0;
        for dst in targets {
            let bytes = advert.encode(self.local, dst);
            match self.tx.send_to(&bytes, &self.dest(dst)) {
                Ok(_) => sent += 1,
                Err(e) => tracing::debug!(to = %dst, error = %e, "advert not sent"),
            }
        }
        sent
    }

    /// The next advert: `None` for this node's own packets, otherwise the parsed advert or why
    /// it was dropped. Errors are the socket's.
    pub async fn recv(
        &self,
        buf: &mut [u8],
    ) -> std::io::Result<Option<Result<packet::Received, packet::Drop>>> {
        loop {
            let mut guard = self.rx.readable().await?;
            let r = match self.local {
                IpAddr::V4(_) => guard.try_io(|fd| {
                    let n = fd.get_ref().read(buf)?;
                    Ok(parse(self.local, &buf[..n]))
                }),
                IpAddr::V6(_) => guard.try_io(|fd| recv_v6(fd.get_ref(), self.local, buf)),
            };
            match r {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    pub fn local(&self) -> IpAddr {
        self.local
    }
}

/// The hop limit and destination an IPv6 raw socket reports in its control messages.
fn ipv6_ancillary(control: &[u8]) -> (Option<i32>, Option<Ipv6Addr>) {
    // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; } then the data, each
    // message aligned to size_t (Linux CMSG_ALIGN).
    const W: usize = std::mem::size_of::<usize>();
    let header = W + 8;
    let (mut hops, mut dst) = (None, None);
    let mut at = 0;
    while at + header <= control.len() {
        let mut len = [0u8; W];
        len.copy_from_slice(&control[at..at + W]);
        let len = usize::from_ne_bytes(len);
        if len < header || at + len > control.len() {
            break;
        }
        let int = |o: usize| {
            i32::from_ne_bytes([control[o], control[o + 1], control[o + 2], control[o + 3]])
        };
        let (level, kind) = (int(at + W), int(at + W + 4));
        let data = &control[at + header..at + len];
        if level == libc::IPPROTO_IPV6 && kind == libc::IPV6_HOPLIMIT && data.len() >= 4 {
            hops = Some(i32::from_ne_bytes([data[0], data[1], data[2], data[3]]));
        }
        if level == libc::IPPROTO_IPV6 && kind == libc::IPV6_PKTINFO && data.len() >= 16 {
            let mut a = [0u8; 16];
            a.copy_from_slice(&data[..16]);
            dst = Some(Ipv6Addr::from(a));
        }
        at += len.div_ceil(W) * W;
    }
    (hops, dst)
}

fn recv_v6(
    sock: &Socket,
    local: IpAddr,
    buf: &mut [u8],
) -> std::io::Result<Option<Result<packet::Received, packet::Drop>>> {
    let mut data = vec![MaybeUninit::new(0u8); buf.len()];
    let mut control = [MaybeUninit::new(0u8); 256];
    let mut from = SockAddr::from(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0));
    let (n, control_len) = {
        let mut bufs = [MaybeUninitSlice::new(&mut data)];
        let mut msg = MsgHdrMut::new()
            .with_addr(&mut from)
            .with_buffers(&mut bufs)
            .with_control(&mut control);
        let n = sock.recvmsg(&mut msg, 0)?;
        (n, msg.control_len())
    };
    // SAFETY: every byte of both buffers was initialised (to 0) before recvmsg, which only
    // writes initialised bytes, so reading them as u8 is sound.
    let (data, control): (Vec<u8>, Vec<u8>) = unsafe {
        (
            data[..n.min(buf.len())]
                .iter()
                .map(|b| b.assume_init())
                .collect(),
            control[..control_len.min(256)]
                .iter()
                .map(|b| b.assume_init())
                .collect(),
        )
    };
    buf[..data.len()].copy_from_slice(&data);
    let Some(src) = from.as_socket_ipv6().map(|a| IpAddr::V6(*a.ip())) else {
        return Ok(Some(Err(packet::Drop::NotVrrp)));
    };
    if src == local {
        return Ok(None);
    }
    let (hops, dst) = ipv6_ancillary(&control);
    if hops != Some(i32::from(TTL)) {
        return Ok(Some(Err(packet::Drop::Ttl)));
    }
    let Some(dst) = dst else {
        return Ok(Some(Err(packet::Drop::NotVrrp)));
    };
    let dst = IpAddr::V6(dst);
    Ok(Some(
        Advert::decode(src, dst, &data).map(|advert| packet::Received { src, dst, advert }),
    ))
}

/// Parses what an IPv4 raw socket returned; packets from this node itself are `None`.
pub fn parse(local: IpAddr, b: &[u8]) -> Option<Result<packet::Received, packet::Drop>> {
    let r = packet::parse_ipv4(b);
    match &r {
        Ok(p) if p.src == local => None,
        _ => Some(r),
    }
}

/// A gratuitous ARP request for `ip` from `mac` (RFC 5227 §3 "ARP Announcement"): sender and
/// target protocol address both `ip`, broadcast.
pub fn garp_frame(mac: [u8; 6], ip: Ipv4Addr) -> [u8; 28] {
    let mut f = [0u8; 28];
    f[0..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    f[2..4].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    f[4] = 6;
    f[5] = 4;
    f[6..8].copy_from_slice(&1u16.to_be_bytes()); // request
    f[8..14].copy_from_slice(&mac);
    f[14..18].copy_from_slice(&ip.octets());
    // target hardware address: zero
    f[24..28].copy_from_slice(&ip.octets());
    f
}

/// A packet socket for ARP on one interface (the kernel builds the Ethernet header).
pub struct ArpSocket {
    sock: Socket,
    index: u32,
}

const ETH_P_ARP: u16 = 0x0806;

impl ArpSocket {
    pub fn open(iface: &Interface) -> Result<ArpSocket, HaError> {
        let sock = Socket::new(
            Domain::PACKET,
            Type::DGRAM,
            Some(Protocol::from(i32::from(ETH_P_ARP.to_be()))),
        )
        .map_err(|e| HaError::Socket("packet socket (needs CAP_NET_RAW)", e))?;
        sock.set_nonblocking(true)
            .map_err(|e| HaError::Socket("nonblocking", e))?;
        Ok(ArpSocket {
            sock,
            index: iface.index,
        })
    }

    /// Broadcasts one ARP frame.
    pub fn send(&self, frame: &[u8]) -> std::io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data, so all-zero is a valid value before the fields
        // are set.
        let mut to: libc::sockaddr_ll = unsafe { MaybeUninit::zeroed().assume_init() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = ETH_P_ARP.to_be();
        to.sll_ifindex = self.index as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        // SAFETY: the fd is a packet socket this struct owns; `frame` is valid for its length,
        // and `to` is a sockaddr_ll passed with its exact size.
        let r = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// An unsolicited neighbour advertisement for `ip` (RFC 4861 §7.2.6): the override flag set, so
/// neighbours replace their cache entry, and the target link-layer address option. The kernel
/// fills in the ICMPv6 checksum.
pub fn unsolicited_na(mac: [u8; 6], ip: Ipv6Addr) -> [u8; 32] {
    let mut f = [0u8; 32];
    f[0] = 136; // neighbour advertisement
    f[4] = 0x20; // override
    f[8..24].copy_from_slice(&ip.octets());
    f[24] = 2; // target link-layer address
    f[25] = 1; // in units of 8 bytes
    f[26..32].copy_from_slice(&mac);
    f
}

/// An ICMPv6 socket for neighbour advertisements on one interface.
pub struct NdSocket {
    sock: Socket,
    index: u32,
}

impl NdSocket {
    pub fn open(iface: &Interface) -> Result<NdSocket, HaError> {
        let io = |what: &'static str| move |e: std::io::Error| HaError::Socket(what, e);
        let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))
            .map_err(io("ICMPv6 socket (needs CAP_NET_RAW)"))?;
        sock.bind_device(Some(iface.name.as_bytes()))
            .map_err(io("SO_BINDTODEVICE"))?;
        // Neighbour discovery messages are only accepted with hop limit 255 (RFC 4861 §7.1.2).
        sock.set_multicast_hops_v6(255)
            .map_err(io("IPV6_MULTICAST_HOPS"))?;
        sock.set_multicast_if_v6(iface.index)
            .map_err(io("IPV6_MULTICAST_IF"))?;
        sock.set_nonblocking(true).map_err(io("nonblocking"))?;
        Ok(NdSocket {
            sock,
            index: iface.index,
        })
    }

    /// Sends one message to all nodes (ff02::1).
    pub fn send(&self, msg: &[u8]) -> std::io::Result<()> {
        let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
        self.sock
            .send_to(
                msg,
                &SocketAddr::V6(SocketAddrV6::new(all_nodes, 0, 0, self.index)).into(),
            )
            .map(drop)
    }
}

/// Tells the segment that the VIPs moved here: gratuitous ARP (IPv4) or unsolicited neighbour
/// advertisements (IPv6).
pub enum Announcer {
    Arp(ArpSocket),
    Nd(NdSocket),
}

impl Announcer {
    pub fn open(iface: &Interface) -> Result<Announcer, HaError> {
        Ok(if iface.primary.is_ipv6() {
            Announcer::Nd(NdSocket::open(iface)?)
        } else {
            Announcer::Arp(ArpSocket::open(iface)?)
        })
    }

    pub fn announce(&self, mac: [u8; 6], ip: IpAddr) -> std::io::Result<()> {
        match (self, ip) {
            (Announcer::Arp(s), IpAddr::V4(a)) => s.send(&garp_frame(mac, a)),
            (Announcer::Nd(s), IpAddr::V6(a)) => s.send(&unsolicited_na(mac, a)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancillary_data_is_read() {
        // Two control messages as Linux lays them out: IPV6_HOPLIMIT (int) then IPV6_PKTINFO
        // (in6_pktinfo: address, interface index).
        const W: usize = std::mem::size_of::<usize>();
        let mut c = Vec::new();
        let mut msg = |kind: i32, data: &[u8]| {
            let len = W + 8 + data.len();
            c.extend_from_slice(&len.to_ne_bytes());
            c.extend_from_slice(&libc::IPPROTO_IPV6.to_ne_bytes());
            c.extend_from_slice(&kind.to_ne_bytes());
            c.extend_from_slice(data);
            while c.len() % W != 0 {
                c.push(0);
            }
        };
        msg(libc::IPV6_HOPLIMIT, &255i32.to_ne_bytes());
        let group = GROUP_V6.octets();
        let mut info = group.to_vec();
        info.extend_from_slice(&7u32.to_ne_bytes());
        msg(libc::IPV6_PKTINFO, &info);
        assert_eq!(ipv6_ancillary(&c), (Some(255), Some(GROUP_V6)));
        // Truncated or garbage control data yields nothing, without a panic.
        assert_eq!(ipv6_ancillary(&c[..5]), (None, None));
        assert_eq!(ipv6_ancillary(&[0xff; 40]), (None, None));
    }

    #[test]
    fn na_layout() {
        let f = unsolicited_na([2, 0, 0, 0, 0, 1], "2001:db8::100".parse().expect("v6"));
        assert_eq!(&f[..8], &[136, 0, 0, 0, 0x20, 0, 0, 0]);
        assert_eq!(f[8], 0x20);
        assert_eq!(&f[24..32], &[2, 1, 2, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn garp_layout() {
        let f = garp_frame([2, 0, 0, 0, 0, 1], Ipv4Addr::new(198, 18, 0, 100));
        assert_eq!(&f[..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&f[8..14], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&f[14..18], &[198, 18, 0, 100]);
        assert_eq!(&f[18..24], &[0; 6]);
        assert_eq!(&f[24..28], &[198, 18, 0, 100]);
    }
}
