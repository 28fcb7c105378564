//! Site state exchange between Fulcrum instances (Alteon's DSSP, F5's iQuery), over TCP.
//!
//! Each instance dials the `peer` of every other site and pushes its own report there: at
//! every interval, and at once when its view of a site's health changes. It accepts the other
//! instances' connections on its own site's `peer` address (or `gslb.listen`).
//!
//! Authentication is a shared key (HMAC-SHA256). The accepting side opens with a fresh random
//! challenge; every report frame carries a sequence number and a tag over the challenge, the
//! sequence number and the report, so a frame is accepted once, only on the connection it was
//! made for, and only from someone who knows a key. Several keys may be configured so that a
//! key can be rotated one instance at a time: the first signs, any of them verifies.
//!
//! ```text
//! acceptor → dialer:  "FGX1" nonce[16]
//! dialer → acceptor:  len:u32 (8 + payload) | seq:u64 | payload (JSON Report) | tag[32]
//! tag = HMAC-SHA256(key, "fulcrum-gslb-1" | nonce | seq | payload)
//! ```

use ring::hmac;

use crate::table::Report;

pub const MAGIC: &[u8; 4] = b"FGX1";
pub const NONCE_LEN: usize = 16;
pub const TAG_LEN: usize = 32;
/// Largest report accepted (a report is a few hundred bytes per site).
pub const MAX_FRAME: usize = 64 * 1024;
const CONTEXT: &[u8] = b"fulcrum-gslb-1";

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is larger than {MAX_FRAME}")]
    TooLarge(usize),
    #[error("frame shorter than its header")]
    Short,
    #[error("authentication failed: the peer does not share a key with us")]
    BadTag,
    #[error("sequence number {got} does not follow {last}: replayed or reordered")]
    Replay { got: u64, last: u64 },
    #[error("the report is not valid: {0}")]
    BadReport(String),
}

fn tag(key: &hmac::Key, nonce: &[u8], seq: u64, payload: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(CONTEXT);
    ctx.update(nonce);
    ctx.update(&seq.to_be_bytes());
    ctx.update(payload);
    ctx.sign()
}

/// HMAC keys from the configured secrets.
pub fn keys(secrets: &[String]) -> Vec<hmac::Key> {
    secrets
        .iter()
        .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s.as_bytes()))
        .collect()
}

/// Encodes one report frame for the connection whose challenge was `nonce`.
pub fn encode_frame(key: &hmac::Key, nonce: &[u8], seq: u64, report: &Report) -> Vec<u8> {
    let payload = serde_json::to_vec(report).unwrap_or_default();
    let t = tag(key, nonce, seq, &payload);
    let mut out = Vec::with_capacity(4 + 8 + payload.len() + TAG_LEN);
    out.extend_from_slice(&((8 + payload.len()) as u32).to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(t.as_ref());
    out
}

/// The body length announced by a frame header, checked against the limit.
pub fn frame_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let n = u32::from_be_bytes(header) as usize;
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(n));
    }
    if n < 8 {
        return Err(FrameError::Short);
    }
    Ok(n)
}

/// Verifies and decodes a frame body (`seq | payload`) and its tag. `last_seq` is the last
/// sequence number accepted on this connection.
pub fn decode_frame(
    keys: &[hmac::Key],
    nonce: &[u8],
    last_seq: u64,
    body: &[u8],
    tag_bytes: &[u8],
) -> Result<(u64, Report), FrameError> {
    if body.len() < 8 {
        return Err(FrameError::Short);
    }
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&body[..8]);
    let seq = u64::from_be_bytes(s);
    let payload = &body[8..];
    let mut msg = Vec::with_capacity(CONTEXT.len() + nonce.len() + 8 + payload.len());
    msg.extend_from_slice(CONTEXT);
    msg.extend_from_slice(nonce);
    msg.extend_from_slice(&seq.to_be_bytes());
    msg.extend_from_slice(payload);
    if !keys
        .iter()
        .any(|k| hmac::verify(k, &msg, tag_bytes).is_ok())
    {
        return Err(FrameError::BadTag);
    }
    if seq <= last_seq {
        return Err(FrameError::Replay {
            got: seq,
            last: last_seq,
        });
    }
    let report: Report =
        serde_json::from_slice(payload).map_err(|e| FrameError::BadReport(e.to_string()))?;
    if report.instance.is_empty() || report.sites.len() > 4096 {
        return Err(FrameError::BadReport(
            "no instance, or too many sites".into(),
        ));
    }
    Ok((seq, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::SiteView;

    fn report() -> Report {
        Report {
            instance: "east".into(),
            version: 3,
            sites: vec![SiteView {
                name: "east".into(),
                up: true,
                addresses_up: 1,
                addresses: 1,
                check_ms: Some(0.4),
            }],
            capacity: Some(0.5),
            cpu: None,
            response_ms: None,
        }
    }

    fn split(f: &[u8]) -> (&[u8], &[u8]) {
        let n = frame_len([f[0], f[1], f[2], f[3]]).unwrap();
        (&f[4..4 + n], &f[4 + n..])
    }

    #[test]
    fn round_trip_and_rotation() {
        let old = keys(&["old-secret-0123456789".into()]);
        let both = keys(&[
            "new-secret-0123456789".into(),
            "old-secret-0123456789".into(),
        ]);
        let nonce = [7u8; NONCE_LEN];
        let f = encode_frame(&old[0], &nonce, 1, &report());
        let (body, t) = split(&f);
        assert_eq!(
            decode_frame(&both, &nonce, 0, body, t).unwrap(),
            (1, report())
        );
    }

    #[test]
    fn wrong_key_replay_and_other_connection_are_refused() {
        let k = keys(&["a-shared-secret-123".into()]);
        let other = keys(&["not-the-same-secret".into()]);
        let nonce = [1u8; NONCE_LEN];
        let f = encode_frame(&k[0], &nonce, 5, &report());
        let (body, t) = split(&f);
        assert_eq!(
            decode_frame(&other, &nonce, 0, body, t),
            Err(FrameError::BadTag)
        );
        assert_eq!(
            decode_frame(&k, &[2u8; NONCE_LEN], 0, body, t),
            Err(FrameError::BadTag)
        );
        assert!(matches!(
            decode_frame(&k, &nonce, 5, body, t),
            Err(FrameError::Replay { .. })
        ));
        let mut tampered = body.to_vec();
        let last = tampered.len() - 2;
        tampered[last] ^= 1;
        assert_eq!(
            decode_frame(&k, &nonce, 0, &tampered, t),
            Err(FrameError::BadTag)
        );
        assert_eq!(
            frame_len([0xFF, 0, 0, 0]),
            Err(FrameError::TooLarge(0xFF00_0000))
        );
    }
}
