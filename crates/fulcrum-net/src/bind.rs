//! Binding the source of a member connection: what source address pools (`snat`) and
//! client-address transparency (`source = "client"`) share.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use tokio::net::TcpSocket;

/// A TCP socket of `member`'s family for a member connection, bound into `vrf` (the VRF
/// device, SO_BINDTODEVICE: routes and source addresses then come from the VRF's table, as
/// with `ip vrf exec`) when the pool has one.
pub(crate) fn member_socket(member: SocketAddr, vrf: Option<&str>) -> io::Result<TcpSocket> {
    let socket = if member.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(device) = vrf {
        socket2::SockRef::from(&socket).bind_device(Some(device.as_bytes()))?;
    }
    Ok(socket)
}

/// `EADDRNOTAVAIL` (no free port for the 4-tuple, with `IP_BIND_ADDRESS_NO_PORT`) or
/// `EADDRINUSE` (the same, when the kernel had to pick the port at bind time).
pub(crate) fn is_exhausted(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EADDRNOTAVAIL) | Some(libc::EADDRINUSE)
    )
}

/// Defers the choice of the local port from `bind` to `connect`, where the kernel knows the
/// whole 4-tuple: without it every bound socket would hold a port of its own, and one address
/// would give at most one port range of connections over all members together.
pub(crate) fn bind_address_no_port(socket: &TcpSocket) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: the descriptor is a live socket owned by `socket` for the duration of the call;
    // the option value points to a c_int that outlives the call, and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
