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
//!
//! The frame format and its authentication live in crate fulcrum-frame, which the HA state
//! sync shares; this module adds the report payload.

use fulcrum_frame::{Channel, Key};

use crate::table::Report;

pub const MAGIC: &[u8; 4] = b"FGX1";
pub const NONCE_LEN: usize = fulcrum_frame::NONCE_LEN;
pub const TAG_LEN: usize = fulcrum_frame::TAG_LEN;
/// Largest report accepted (a report is a few hundred bytes per site, plus its learnt services
/// and up to `proximity::MAX_SHARED` RTTs and requests).
pub const MAX_FRAME: usize = 256 * 1024;

/// Virtual services with `gslb` one report may carry.
pub const MAX_SERVICES: usize = 4096;

/// The frame format, shared with the HA state sync (crate fulcrum-frame).
const CHANNEL: Channel = Channel {
    magic: MAGIC,
    context: b"fulcrum-gslb-1",
    max_frame: MAX_FRAME,
};

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
    #[error("no report in time")]
    TimedOut,
    #[error("read: {0}")]
    Io(String),
}

impl From<fulcrum_frame::FrameError> for FrameError {
    fn from(e: fulcrum_frame::FrameError) -> Self {
        match e {
            fulcrum_frame::FrameError::TooLarge(n, _) => FrameError::TooLarge(n),
            fulcrum_frame::FrameError::Short => FrameError::Short,
            fulcrum_frame::FrameError::BadTag => FrameError::BadTag,
            fulcrum_frame::FrameError::Replay { got, last } => FrameError::Replay { got, last },
        }
    }
}

/// HMAC keys from the configured secrets.
pub fn keys(secrets: &[String]) -> Vec<Key> {
    fulcrum_frame::keys(secrets)
}

/// Encodes one report frame for the connection whose challenge was `nonce`.
pub fn encode_frame(key: &Key, nonce: &[u8], seq: u64, report: &Report) -> Vec<u8> {
    let payload = serde_json::to_vec(report).unwrap_or_default();
    CHANNEL.encode(key, nonce, seq, &payload)
}

/// A frame around arbitrary payload bytes, signed with `key` (the fuzz target `gslb_report`
/// reaches the report decoding past the authentication with it).
#[doc(hidden)]
pub fn encode_payload(key: &Key, nonce: &[u8], seq: u64, payload: &[u8]) -> Vec<u8> {
    CHANNEL.encode(key, nonce, seq, payload)
}

/// The body length announced by a frame header, checked against the limit.
pub fn frame_len(header: [u8; 4]) -> Result<usize, FrameError> {
    Ok(CHANNEL.frame_len(header)?)
}

/// Reads, verifies and decodes the next report frame from a peer's connection (`Ok(None)`: it
/// closed between frames), with the shared frame reader: the header within `wait`, the rest
/// within `wait` after it, `buf` growing with the bytes that arrive.
pub async fn read_report<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    keys: &[Key],
    nonce: &[u8],
    last_seq: u64,
    buf: &mut Vec<u8>,
    wait: std::time::Duration,
) -> Result<Option<(u64, Report)>, FrameError> {
    let frame = CHANNEL
        .read_frame(s, keys, nonce, last_seq, buf, wait)
        .await
        .map_err(|e| match e {
            fulcrum_frame::ReadError::Frame(f) => FrameError::from(f),
            fulcrum_frame::ReadError::TimedOut => FrameError::TimedOut,
            fulcrum_frame::ReadError::Io(e) => FrameError::Io(e.to_string()),
        })?;
    let Some((seq, payload)) = frame else {
        return Ok(None);
    };
    decode_report(payload).map(|r| Some((seq, r)))
}

fn decode_report(payload: &[u8]) -> Result<Report, FrameError> {
    let report: Report =
        serde_json::from_slice(payload).map_err(|e| FrameError::BadReport(e.to_string()))?;
    if report.instance.is_empty() || report.sites.len() > 4096 {
        return Err(FrameError::BadReport(
            "no instance, or too many sites".into(),
        ));
    }
    if report.rtt.len() > crate::proximity::MAX_SHARED
        || report.probe.len() > crate::proximity::MAX_SHARED
    {
        return Err(FrameError::BadReport(format!(
            "more than {} RTTs or probe requests",
            crate::proximity::MAX_SHARED
        )));
    }
    if report.services.len() > MAX_SERVICES
        || report
            .services
            .iter()
            .any(|s| s.addresses.len() > crate::learnt::MAX_LEARNT_ADDRESSES)
    {
        return Err(FrameError::BadReport(format!(
            "more than {MAX_SERVICES} services, or more than {} addresses in one",
            crate::learnt::MAX_LEARNT_ADDRESSES
        )));
    }
    Ok(report)
}

/// Verifies and decodes a frame body (`seq | payload`) and its tag. `last_seq` is the last
/// sequence number accepted on this connection.
pub fn decode_frame(
    keys: &[Key],
    nonce: &[u8],
    last_seq: u64,
    body: &[u8],
    tag_bytes: &[u8],
) -> Result<(u64, Report), FrameError> {
    let (seq, payload) = CHANNEL.verify(keys, nonce, last_seq, body, tag_bytes)?;
    Ok((seq, decode_report(payload)?))
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
            services: vec![],
            rtt: vec![],
            probe: vec![],
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
