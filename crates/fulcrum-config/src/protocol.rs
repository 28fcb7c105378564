//! What a virtual service speaks to its clients, and what it tells members about them.

use crate::string_enum;

string_enum!(Protocol {
    Tcp = "tcp",
    Udp = "udp",
    Http = "http",
    Https = "https",
    Message = "message",
    Ftp = "ftp",
    Ip = "ip",
    Rtsp = "rtsp",
});

impl Protocol {
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Https)
    }
    /// Whether the protocol's listeners are UDP sockets (a UDP and a TCP service may share ip:port).
    pub fn is_datagram(self) -> bool {
        matches!(self, Protocol::Udp)
    }
}

string_enum!(ProxyProtocol { V1 = "v1", V2 = "v2" });
