//! Session-ticket keys shared by the nodes of an HA pair, so that a client resumes its TLS
//! session on whichever node holds the VIP after a failover.
//!
//! rustls's own ticketer draws random keys per process; a peer cannot open its tickets. Here
//! each rotation period (`ROTATE`, wall-clock aligned) has a key derived from a secret both
//! nodes hold (the binary derives it from `ha.sync.key`) and the service name:
//! `HMAC-SHA256(secret, "fulcrum-tls-ticket" NUL service NUL period)`. Nodes agree on the
//! period through their clocks (NTP), so nothing travels; tickets of the previous and the next
//! period are accepted too (a ticket issued just before a rotation, clocks a little apart).
//!
//! A ticket is `period (4 bytes) ‖ nonce (12) ‖ AES-256-GCM(state) ‖ tag (16)`, the period
//! authenticated as associated data. Forward secrecy of resumed sessions is bounded by the
//! secret's, not by the rotation: whoever learns `ha.sync.key` can open recorded tickets — the
//! same trade as sharing nginx's `ssl_session_ticket_key` files between nodes.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// A key signs new tickets for this long (and opens them for this long again after).
pub const ROTATE: u64 = 6 * 3600;
const HEADER: usize = 4 + NONCE_LEN;

pub struct SharedTicketer {
    secret: hmac::Key,
    service: String,
    /// Keys of recent periods, derived on first use (a handful at most).
    keys: Mutex<Vec<(u32, std::sync::Arc<LessSafeKey>)>>,
    rng: SystemRandom,
}

impl std::fmt::Debug for SharedTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTicketer")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

fn period_now() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(secs / ROTATE).unwrap_or(u32::MAX)
}

impl SharedTicketer {
    pub fn new(secret: &[u8; 32], service: &str) -> SharedTicketer {
        SharedTicketer {
            secret: hmac::Key::new(hmac::HMAC_SHA256, secret),
            service: service.to_string(),
            keys: Mutex::new(Vec::new()),
            rng: SystemRandom::new(),
        }
    }

    fn key(&self, period: u32) -> Option<std::sync::Arc<LessSafeKey>> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, k)) = keys.iter().find(|(p, _)| *p == period) {
            return Some(k.clone());
        }
        let mut label = Vec::with_capacity(32 + self.service.len());
        label.extend_from_slice(b"fulcrum-tls-ticket\0");
        label.extend_from_slice(self.service.as_bytes());
        label.push(0);
        label.extend_from_slice(&period.to_be_bytes());
        let material = hmac::sign(&self.secret, &label);
        let key = std::sync::Arc::new(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, material.as_ref()).ok()?,
        ));
        // Old periods' keys go: a ticket can only be opened while its period is recent.
        keys.retain(|(p, _)| p.abs_diff(period) <= 2);
        keys.push((period, key.clone()));
        Some(key)
    }

    /// A ticket for `plain` under `period`'s key (`encrypt` at a given period).
    pub fn seal(&self, period: u32, plain: &[u8]) -> Option<Vec<u8>> {
        let key = self.key(period)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let p = period.to_be_bytes();
        let mut out = Vec::with_capacity(HEADER + plain.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(&p);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(p), &mut body)
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    /// What a ticket holds, if it is authentic and of a period next to `now` (`decrypt` at a
    /// given period). `cipher` comes from the client: any bytes are refused without a panic.
    pub fn open(&self, now: u32, cipher: &[u8]) -> Option<Vec<u8>> {
        if cipher.len() < HEADER + AES_256_GCM.tag_len() {
            return None;
        }
        let p: [u8; 4] = cipher[..4].try_into().ok()?;
        let period = u32::from_be_bytes(p);
        if period.abs_diff(now) > 1 {
            return None;
        }
        let nonce = Nonce::try_assume_unique_for_key(&cipher[4..HEADER]).ok()?;
        let key = self.key(period)?;
        let mut body = cipher[HEADER..].to_vec();
        let plain = key.open_in_place(nonce, Aad::from(p), &mut body).ok()?;
        Some(plain.to_vec())
    }
}

impl ProducesTickets for SharedTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        ROTATE as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal(period_now(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open(period_now(), cipher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_with_one_secret_open_each_others_tickets_within_the_window() {
        let a = SharedTicketer::new(&[1; 32], "web");
        let b = SharedTicketer::new(&[1; 32], "web");
        let t = a.seal(100, b"session state").expect("seal");
        assert_eq!(b.open(100, &t).as_deref(), Some(&b"session state"[..]));
        // The previous and next periods still open it; older ones do not.
        assert!(b.open(101, &t).is_some());
        assert!(b.open(99, &t).is_some());
        assert!(b.open(102, &t).is_none());
        // Another secret, another service, or a changed byte: refused.
        assert!(SharedTicketer::new(&[2; 32], "web").open(100, &t).is_none());
        assert!(SharedTicketer::new(&[1; 32], "api").open(100, &t).is_none());
        for i in 0..t.len() {
            let mut bad = t.clone();
            bad[i] ^= 1;
            assert!(b.open(100, &bad).is_none(), "byte {i}");
        }
        // Garbage of every short length is refused, not a panic.
        for n in 0..40 {
            assert!(b.open(100, &vec![0u8; n]).is_none());
        }
        // Each ticket has its own nonce.
        assert_ne!(a.seal(100, b"x"), a.seal(100, b"x"));
        assert!(a.enabled() && a.decrypt(&a.encrypt(b"now").expect("now")).is_some());
    }
}
