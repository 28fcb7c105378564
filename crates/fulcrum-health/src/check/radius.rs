//! radius: a Status-Server request (RFC 5997) with a Message-Authenticator, or, when the monitor
//! has a `username`, an Access-Request with those test credentials (PAP). Any authenticated
//! answer means the server is alive: Access-Accept, Access-Reject or Access-Challenge to an
//! Access-Request; Access-Accept (authentication port) or Accounting-Response (accounting port)
//! to a Status-Server. An answer whose Response Authenticator does not match the secret fails:
//! a member Fulcrum shares the wrong secret with cannot serve Fulcrum's clients either.

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use tokio::net::UdpSocket;

use fulcrum_config::Monitor;

use super::udp::{any_local, udp_exchange, UdpExchange};
use super::{Probe, Verdict};
use crate::text;

const ACCESS_REQUEST: u8 = 1;
const ACCESS_ACCEPT: u8 = 2;
const ACCESS_REJECT: u8 = 3;
const ACCOUNTING_RESPONSE: u8 = 5;
const ACCESS_CHALLENGE: u8 = 11;
const STATUS_SERVER: u8 = 12;
const USER_NAME: u8 = 1;
const USER_PASSWORD: u8 = 2;
const NAS_IDENTIFIER: u8 = 32;
const MESSAGE_AUTHENTICATOR: u8 = 80;

#[derive(Debug)]
pub(crate) struct RadiusCheck {
    secret: Vec<u8>,
    login: Option<(Vec<u8>, Vec<u8>)>,
}

fn code_name(code: u8) -> String {
    match code {
        ACCESS_ACCEPT => "Access-Accept".into(),
        ACCESS_REJECT => "Access-Reject".into(),
        ACCOUNTING_RESPONSE => "Accounting-Response".into(),
        ACCESS_CHALLENGE => "Access-Challenge".into(),
        c => format!("code {c}"),
    }
}

impl RadiusCheck {
    pub fn new(monitor: &Monitor) -> Self {
        RadiusCheck {
            secret: monitor.secret.clone().unwrap_or_default().into_bytes(),
            login: monitor.username.as_ref().map(|u| {
                (
                    u.clone().into_bytes(),
                    monitor.password.clone().unwrap_or_default().into_bytes(),
                )
            }),
        }
    }

    /// The request packet with identifier `id` and request authenticator `auth`.
    fn request(&self, id: u8, auth: &[u8; 16]) -> Vec<u8> {
        let code = if self.login.is_some() {
            ACCESS_REQUEST
        } else {
            STATUS_SERVER
        };
        let mut p = vec![code, id, 0, 0];
        p.extend_from_slice(auth);
        // The Message-Authenticator goes first so its offset is fixed (RFC 5997 recommends it).
        p.extend_from_slice(&[MESSAGE_AUTHENTICATOR, 18]);
        p.extend_from_slice(&[0; 16]);
        if let Some((user, password)) = &self.login {
            push_attr(&mut p, USER_NAME, &user[..user.len().min(253)]);
            push_attr(
                &mut p,
                USER_PASSWORD,
                &hide_password(password, &self.secret, auth),
            );
        }
        push_attr(&mut p, NAS_IDENTIFIER, b"fulcrum-health");
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        let mac = hmac_md5(&self.secret, &p);
        p[22..38].copy_from_slice(&mac);
        p
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        let id = fastrand::u8(..);
        let mut auth = [0u8; 16];
        auth.iter_mut().for_each(|b| *b = fastrand::u8(..));
        let request = self.request(id, &auth);
        let socket = match UdpSocket::bind(any_local(probe.addr)).await {
            Ok(s) => s,
            Err(e) => return Verdict::fail(format!("socket: {}", text::io_error(&e))),
        };
        let mut bad = None;
        // A retransmission keeps identifier and authenticator (RFC 2865 §2.5).
        let exchange = udp_exchange(socket, &request, probe, "RADIUS", |reply| {
            match self.judge(reply, id, &auth) {
                Ok(v) => Some(v),
                // Not ours or not authentic: keep waiting, remember why.
                Err(why) => {
                    bad = Some(why);
                    None
                }
            }
        });
        match exchange.await {
            UdpExchange::Answer(v) | UdpExchange::Failed(v) => v,
            UdpExchange::TimedOut => Verdict::fail(
                bad.unwrap_or_else(|| format!("{}: no RADIUS answer", probe.timed_out())),
            ),
        }
    }

    /// The verdict on an answer, or why it is not an answer to this request.
    fn judge(&self, reply: &[u8], id: u8, auth: &[u8; 16]) -> Result<Verdict, String> {
        if reply.len() < 20 {
            return Err("a short, non-RADIUS answer".into());
        }
        let len = usize::from(u16::from_be_bytes([reply[2], reply[3]]));
        if !(20..=reply.len()).contains(&len) || reply[1] != id {
            return Err("an answer that is not to this request".into());
        }
        let reply = &reply[..len];
        let expected = md5(&[&reply[..4], auth, &reply[20..], &self.secret]);
        if expected[..] != reply[4..20] {
            return Err(format!(
                "{} with a wrong Response Authenticator (is the secret right?)",
                code_name(reply[0])
            ));
        }
        let code = reply[0];
        let ok = if self.login.is_some() {
            matches!(code, ACCESS_ACCEPT | ACCESS_REJECT | ACCESS_CHALLENGE)
        } else {
            matches!(code, ACCESS_ACCEPT | ACCOUNTING_RESPONSE)
        };
        Ok(if ok {
            Verdict::pass(format!("RADIUS {}", code_name(code)))
        } else {
            Verdict::fail(format!("RADIUS {}: unexpected answer", code_name(code)))
        })
    }
}

fn push_attr(p: &mut Vec<u8>, kind: u8, value: &[u8]) {
    p.push(kind);
    p.push(value.len() as u8 + 2);
    p.extend_from_slice(value);
}

fn md5(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn hmac_md5(key: &[u8], data: &[u8]) -> [u8; 16] {
    match <Hmac<Md5> as Mac>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().into()
        }
        // HMAC accepts keys of any length; this arm is never taken.
        Err(_) => [0; 16],
    }
}

/// User-Password hiding (RFC 2865 §5.2): the password, padded with zeros to a multiple of 16
/// (at most 128), XORed block by block with MD5(secret + previous block), starting from the
/// request authenticator.
fn hide_password(password: &[u8], secret: &[u8], auth: &[u8; 16]) -> Vec<u8> {
    let len = password.len().clamp(1, 128).div_ceil(16) * 16;
    let mut out = password[..password.len().min(128)].to_vec();
    out.resize(len, 0);
    let mut prev: Vec<u8> = auth.to_vec();
    for block in out.chunks_mut(16) {
        let key = md5(&[secret, &prev]);
        for (b, k) in block.iter_mut().zip(key) {
            *b ^= k;
        }
        prev = block.to_vec();
    }
    out
}

/// For the fuzz target `health_replies`: `reply` judged as the answer to request `reply[1]`
/// made with a known secret (with a login when `login`). With `sign`, the reply's Response
/// Authenticator is first set to the right value for its bytes, so the fuzzer reaches what
/// follows the authentication. Returns whether the check passes.
#[doc(hidden)]
pub fn fuzz_judge(reply: &mut [u8], login: bool, sign: bool) -> Result<bool, String> {
    let check = RadiusCheck {
        secret: b"fuzzing-secret".to_vec(),
        login: login.then(|| (b"user".to_vec(), b"password".to_vec())),
    };
    let auth = [7u8; 16];
    if sign && reply.len() >= 20 {
        let len = usize::from(u16::from_be_bytes([reply[2], reply[3]]));
        if (20..=reply.len()).contains(&len) {
            let sum = md5(&[&reply[..4], &auth, &reply[20..len], &check.secret]);
            reply[4..20].copy_from_slice(&sum);
        }
    }
    let id = reply.get(1).copied().unwrap_or(0);
    let v = check.judge(reply, id, &auth)?;
    Ok(matches!(v, Verdict::Health { ok: true, .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc2865_password_hiding_round_trips() {
        let auth = [7u8; 16];
        let hidden = hide_password(b"a password longer than sixteen", b"s3cret", &auth);
        assert_eq!(hidden.len(), 32);
        // Un-hide: each block XOR MD5(secret + previous ciphertext block).
        let mut prev = auth.to_vec();
        let mut plain = Vec::new();
        for block in hidden.chunks(16) {
            let key = md5(&[b"s3cret", &prev]);
            plain.extend(block.iter().zip(key).map(|(b, k)| b ^ k));
            prev = block.to_vec();
        }
        assert!(plain.starts_with(b"a password longer than sixteen"));
        assert_eq!(hide_password(b"", b"s", &auth).len(), 16);
    }
}
