//! The node's side of the wire: raw IPv4 sockets for protocol 112, the VIPs through rtnetlink,
//! and gratuitous ARPs on a packet socket.

use std::io::Read;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;

use futures_util::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::LinkAttribute;
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::packet::{self, Advert, GROUP_V4, PROTO_VRRP, TTL};
use crate::HaError;

/// The interface adverts use: its index, hardware address and primary IPv4 address.
#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub primary: Ipv4Addr,
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

    /// Finds `name`, its MAC and its primary IPv4 address (the first one that is not a VIP).
    pub async fn interface(&self, name: &str, vips: &[IpNet]) -> Result<Interface, HaError> {
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
        let primary = self
            .ipv4_addresses(index)
            .await?
            .into_iter()
            .find(|a| !vips.iter().any(|v| v.addr() == IpAddr::V4(*a)))
            .ok_or_else(|| {
                HaError::Netlink(format!(
                    "interface {name:?} has no IPv4 address of its own to send adverts from"
                ))
            })?;
        Ok(Interface {
            name: name.to_string(),
            index,
            mac,
            primary,
        })
    }

    async fn ipv4_addresses(&self, index: u32) -> Result<Vec<Ipv4Addr>, HaError> {
        let mut s = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut out = Vec::new();
        while let Some(msg) = s.try_next().await.map_err(|e| nl("addresses", e))? {
            for a in &msg.attributes {
                if let AddressAttribute::Local(IpAddr::V4(ip)) = a {
                    out.push(*ip);
                }
            }
        }
        Ok(out)
    }

    /// Adds `vip` to the interface; already present is fine.
    pub async fn add(&self, index: u32, vip: IpNet) -> Result<(), HaError> {
        match self
            .handle
            .address()
            .add(index, vip.addr(), vip.prefix_len())
            .execute()
            .await
        {
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
    local: Ipv4Addr,
    /// Unicast peers; empty: multicast.
    peers: Vec<Ipv4Addr>,
}

impl VrrpSocket {
    pub fn open(iface: &Interface, peers: &[Ipv4Addr]) -> Result<VrrpSocket, HaError> {
        let io = |what: &'static str| move |e: std::io::Error| HaError::Socket(what, e);
        let raw = || {
            Socket::new(
                Domain::IPV4,
                Type::RAW,
                Some(Protocol::from(i32::from(PROTO_VRRP))),
            )
        };
        // Receiving: not bound to an address (that would filter out the multicast group), but to
        // the device, so adverts of other segments never count.
        let rx = raw().map_err(io("raw socket (needs CAP_NET_RAW)"))?;
        rx.bind_device(Some(iface.name.as_bytes()))
            .map_err(io("SO_BINDTODEVICE"))?;
        if peers.is_empty() {
            rx.join_multicast_v4_n(&GROUP_V4, &InterfaceIndexOrAddress::Index(iface.index))
                .map_err(io("join 224.0.0.18"))?;
        }
        rx.set_nonblocking(true).map_err(io("nonblocking"))?;
        // Sending: bound to the primary address, which the checksum's pseudo-header names.
        let tx = raw().map_err(io("raw socket"))?;
        tx.bind_device(Some(iface.name.as_bytes()))
            .map_err(io("SO_BINDTODEVICE"))?;
        tx.bind(&SocketAddr::V4(SocketAddrV4::new(iface.primary, 0)).into())
            .map_err(io("bind to the primary address"))?;
        tx.set_ttl_v4(u32::from(TTL)).map_err(io("IP_TTL"))?;
        tx.set_multicast_ttl_v4(u32::from(TTL))
            .map_err(io("IP_MULTICAST_TTL"))?;
        tx.set_multicast_loop_v4(false)
            .map_err(io("IP_MULTICAST_LOOP"))?;
        tx.set_multicast_if_v4(&iface.primary)
            .map_err(io("IP_MULTICAST_IF"))?;
        // Internetwork control, as routers (and keepalived) mark their adverts.
        let _ = tx.set_tos_v4(0xc0);
        tx.set_nonblocking(true).map_err(io("nonblocking"))?;
        // SAFETY: `rx` is an open socket that the AsyncFd owns from here on; a socket2::Socket
        // returns the same fd from as_raw_fd for its whole life and closes it only on drop.
        let rx = unsafe { AsyncFd::register_with_interest(rx, tokio::io::Interest::READABLE) }
            .map_err(|e| HaError::Socket("register with tokio", e.into()))?;
        Ok(VrrpSocket {
            rx,
            tx,
            local: iface.primary,
            peers: peers.to_vec(),
        })
    }

    /// Sends `advert` to the group or to every peer; returns how many were sent.
    pub fn send(&self, advert: &Advert) -> usize {
        let mut sent = 0;
        let one = |dst: Ipv4Addr| {
            let bytes = advert.encode(self.local, dst);
            self.tx
                .send_to(&bytes, &SocketAddr::V4(SocketAddrV4::new(dst, 0)).into())
        };
        if self.peers.is_empty() {
            match one(GROUP_V4) {
                Ok(_) => sent += 1,
                Err(e) => tracing::debug!(error = %e, "advert not sent"),
            }
        } else {
            for p in &self.peers {
                match one(*p) {
                    Ok(_) => sent += 1,
                    Err(e) => tracing::debug!(peer = %p, error = %e, "advert not sent"),
                }
            }
        }
        sent
    }

    /// The next datagram of protocol 112 (IP header included), or an error of the socket.
    pub async fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.rx.readable().await?;
            match guard.try_io(|fd| fd.get_ref().read(buf)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    pub fn local(&self) -> Ipv4Addr {
        self.local
    }
}

/// Parses what `VrrpSocket::recv` returned; packets from this node itself are `None`.
pub fn parse(local: Ipv4Addr, b: &[u8]) -> Option<Result<packet::Received, packet::Drop>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
