//! UDP backends: an echo server that says who it is, and a RADIUS responder (RFC 2865/2866,
//! RFC 5997 Status-Server) that real clients such as `radclient` accept.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use tokio::task::JoinHandle;

/// Answers every datagram with `"{name}:"` followed by the datagram, to its sender. Counts the
/// datagrams and remembers which source addresses sent them.
pub struct UdpEchoServer {
    pub addr: SocketAddr,
    pub name: String,
    datagrams: Arc<AtomicU64>,
    sources: Arc<Mutex<BTreeMap<SocketAddr, u64>>>,
    silent: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for UdpEchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UdpEchoServer {
    pub async fn start(addr: SocketAddr, name: &str) -> io::Result<UdpEchoServer> {
        let socket = crate::bind_udp(addr).await?;
        let addr = socket.local_addr()?;
        let datagrams = Arc::new(AtomicU64::new(0));
        let sources: Arc<Mutex<BTreeMap<SocketAddr, u64>>> = Arc::default();
        let silent = Arc::new(AtomicBool::new(false));
        let (d, s, q) = (datagrams.clone(), sources.clone(), silent.clone());
        let prefix = format!("{name}:").into_bytes();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            let mut out = Vec::with_capacity(65536 + prefix.len());
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                d.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut m) = s.lock() {
                    *m.entry(from).or_insert(0) += 1;
                }
                if q.load(Ordering::Relaxed) {
                    continue;
                }
                out.clear();
                out.extend_from_slice(&prefix);
                out.extend_from_slice(&buf[..n]);
                let _ = socket.send_to(&out, from).await;
            }
        });
        Ok(UdpEchoServer {
            addr,
            name: name.to_string(),
            datagrams,
            sources,
            silent,
            task,
        })
    }

    pub fn datagrams(&self) -> u64 {
        self.datagrams.load(Ordering::Relaxed)
    }

    /// Source addresses (Fulcrum's upstream sockets) and how many datagrams each sent.
    pub fn sources(&self) -> BTreeMap<SocketAddr, u64> {
        self.sources.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Keeps receiving but stops answering.
    pub fn set_silent(&self, silent: bool) {
        self.silent.store(silent, Ordering::Relaxed);
    }

    /// Closes the socket: datagrams to it now draw ICMP port unreachable.
    pub fn kill(&self) {
        self.task.abort();
    }
}

/// RADIUS codes.
pub const ACCESS_REQUEST: u8 = 1;
pub const ACCESS_ACCEPT: u8 = 2;
pub const ACCESS_REJECT: u8 = 3;
pub const ACCOUNTING_REQUEST: u8 = 4;
pub const ACCOUNTING_RESPONSE: u8 = 5;
pub const STATUS_SERVER: u8 = 12;
/// Attribute types used here.
pub const USER_NAME: u8 = 1;
pub const REPLY_MESSAGE: u8 = 18;
pub const MESSAGE_AUTHENTICATOR: u8 = 80;

/// One request a `RadiusServer` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadiusSeen {
    pub code: u8,
    pub user: Option<String>,
    pub from: SocketAddr,
}

/// A RADIUS server for tests: Access-Request → Access-Accept (or Access-Reject for users in the
/// reject list), Accounting-Request → Accounting-Response, Status-Server → Access-Accept. Every
/// reply carries a Reply-Message with the server's name (Access replies a Message-Authenticator
/// too), and the
/// Response Authenticator made with `secret`, so real clients accept it. Requests whose
/// authenticator does not match the secret (Accounting-Request, or a Message-Authenticator) are
/// dropped, as a real server does.
pub struct RadiusServer {
    pub addr: SocketAddr,
    pub name: String,
    seen: Arc<Mutex<Vec<RadiusSeen>>>,
    reject: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for RadiusServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RadiusServer {
    pub async fn start(addr: SocketAddr, name: &str, secret: &str) -> io::Result<RadiusServer> {
        let socket = crate::bind_udp(addr).await?;
        let addr = socket.local_addr()?;
        let seen: Arc<Mutex<Vec<RadiusSeen>>> = Arc::default();
        let reject: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, r) = (seen.clone(), reject.clone());
        let (secret, label) = (secret.as_bytes().to_vec(), name.to_string());
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                let rejected = r.lock().map(|v| v.clone()).unwrap_or_default();
                let Some((reply, seen)) = answer(&buf[..n], &secret, &label, &rejected, from)
                else {
                    continue;
                };
                if let Ok(mut v) = s.lock() {
                    v.push(seen);
                }
                let _ = socket.send_to(&reply, from).await;
            }
        });
        Ok(RadiusServer {
            addr,
            name: name.to_string(),
            seen,
            reject,
            task,
        })
    }

    pub fn seen(&self) -> Vec<RadiusSeen> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Users whose Access-Request is answered with Access-Reject.
    pub fn reject_users(&self, users: &[&str]) {
        if let Ok(mut r) = self.reject.lock() {
            *r = users.iter().map(|u| u.to_string()).collect();
        }
    }

    /// Stops answering (the socket closes).
    pub fn kill(&self) {
        self.task.abort();
    }
}

/// The attributes of a RADIUS packet, if its lengths hold together.
pub fn radius_attributes(packet: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    if packet.len() < 20 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    if !(20..=packet.len()).contains(&len) {
        return None;
    }
    let mut out = Vec::new();
    let mut rest = &packet[20..len];
    while rest.len() >= 2 {
        let l = usize::from(rest[1]);
        if l < 2 || l > rest.len() {
            return None;
        }
        out.push((rest[0], &rest[2..l]));
        rest = &rest[l..];
    }
    rest.is_empty().then_some(out)
}

/// HMAC-MD5 of `packet` keyed with `secret` (the Message-Authenticator, RFC 3579 §3.2).
pub fn message_authenticator(packet: &[u8], secret: &[u8]) -> [u8; 16] {
    let mut mac = <Hmac<Md5> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(packet);
    mac.finalize().into_bytes().into()
}

/// MD5 over the parts, as RADIUS authenticators are made.
pub fn md5(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// Builds a RADIUS packet: header, then the attributes; a `MESSAGE_AUTHENTICATOR` attribute
/// given with an empty value is filled in (HMAC over the packet with `authenticator` in place).
/// The authenticator field is left as given.
pub fn radius_packet(
    code: u8,
    id: u8,
    authenticator: &[u8; 16],
    attributes: &[(u8, &[u8])],
    secret: &[u8],
) -> Vec<u8> {
    let mut p = vec![code, id, 0, 0];
    p.extend_from_slice(authenticator);
    let mut ma_at = None;
    for (t, v) in attributes {
        if *t == MESSAGE_AUTHENTICATOR && v.is_empty() {
            ma_at = Some(p.len() + 2);
            p.extend_from_slice(&[MESSAGE_AUTHENTICATOR, 18]);
            p.extend_from_slice(&[0; 16]);
            continue;
        }
        let v = &v[..v.len().min(253)];
        p.push(*t);
        p.push(v.len() as u8 + 2);
        p.extend_from_slice(v);
    }
    let len = p.len() as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    if let Some(at) = ma_at {
        let mac = message_authenticator(&p, secret);
        p[at..at + 16].copy_from_slice(&mac);
    }
    p
}

fn answer(
    request: &[u8],
    secret: &[u8],
    name: &str,
    rejected: &[String],
    from: SocketAddr,
) -> Option<(Vec<u8>, RadiusSeen)> {
    let attrs = radius_attributes(request)?;
    let (code, id) = (request[0], request[1]);
    let mut req_auth = [0u8; 16];
    req_auth.copy_from_slice(&request[4..20]);
    // A Message-Authenticator, when present, must check out with the secret.
    if let Some((_, ma)) = attrs.iter().find(|(t, _)| *t == MESSAGE_AUTHENTICATOR) {
        let mut zeroed =
            request[..usize::from(u16::from_be_bytes([request[2], request[3]]))].to_vec();
        let at = find_attr_offset(&zeroed, MESSAGE_AUTHENTICATOR)?;
        zeroed[at..at + 16].fill(0);
        if message_authenticator(&zeroed, secret)[..] != ma[..] {
            return None;
        }
    }
    let user = attrs
        .iter()
        .find(|(t, _)| *t == USER_NAME)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    let reply_code = match code {
        ACCESS_REQUEST => {
            if user.as_ref().is_some_and(|u| rejected.contains(u)) {
                ACCESS_REJECT
            } else {
                ACCESS_ACCEPT
            }
        }
        ACCOUNTING_REQUEST => {
            // The request authenticator is MD5(packet with zeros in its place + secret).
            let len = usize::from(u16::from_be_bytes([request[2], request[3]]));
            let mut zeroed = request[..len].to_vec();
            zeroed[4..20].fill(0);
            if md5(&[&zeroed, secret]) != req_auth {
                return None;
            }
            ACCOUNTING_RESPONSE
        }
        STATUS_SERVER => ACCESS_ACCEPT,
        _ => return None,
    };
    let message = name.as_bytes();
    // Access replies carry a Message-Authenticator (made over the request's authenticator);
    // FreeRADIUS makes an Accounting-Response's differently, and none is needed there.
    let attributes: &[(u8, &[u8])] = if reply_code == ACCOUNTING_RESPONSE {
        &[(REPLY_MESSAGE, message)]
    } else {
        &[(MESSAGE_AUTHENTICATOR, &[]), (REPLY_MESSAGE, message)]
    };
    let mut reply = radius_packet(reply_code, id, &req_auth, attributes, secret);
    let auth = md5(&[&reply, secret]);
    reply[4..20].copy_from_slice(&auth);
    Some((reply, RadiusSeen { code, user, from }))
}

/// Offset of the value of the first attribute of type `kind`.
fn find_attr_offset(packet: &[u8], kind: u8) -> Option<usize> {
    let mut at = 20;
    while at + 2 <= packet.len() {
        let l = usize::from(packet[at + 1]);
        if l < 2 {
            return None;
        }
        if packet[at] == kind {
            return Some(at + 2);
        }
        at += l;
    }
    None
}
