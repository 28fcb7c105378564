//! Authenticated, replay-protected frames between Fulcrum instances over TCP: the GSLB site
//! state exchange and the HA state sync speak it, each with its own magic and context string
//! (a frame of one can never be taken for the other's).
//!
//! The accepting side opens with a fresh random challenge; every frame carries a sequence number
//! and an HMAC-SHA256 tag over the context, the challenge, the sequence number and the payload,
//! so a frame is accepted once, only on the connection it was made for, and only from someone
//! who knows a key. Several keys may be configured so that one can be rotated an instance at a
//! time: the first signs, any of them verifies.
//!
//! ```text
//! acceptor → dialer:  MAGIC[4] nonce[16]
//! dialer → acceptor:  len:u32 (8 + payload) | seq:u64 | payload | tag[32]
//! tag = HMAC-SHA256(key, context | nonce | seq | payload)
//! ```

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ring::hmac;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use ring::hmac::Key;

pub const NONCE_LEN: usize = 16;
pub const TAG_LEN: usize = 32;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is larger than {1}")]
    TooLarge(usize, usize),
    #[error("frame shorter than its header")]
    Short,
    #[error("authentication failed: the peer does not share a key with us")]
    BadTag,
    #[error("sequence number {got} does not follow {last}: replayed or reordered")]
    Replay { got: u64, last: u64 },
}

/// HMAC keys from the configured secrets.
pub fn keys(secrets: &[String]) -> Vec<Key> {
    secrets
        .iter()
        .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s.as_bytes()))
        .collect()
}

/// One kind of channel: its opening magic, the context its tags cover, its largest frame.
#[derive(Debug, Clone, Copy)]
pub struct Channel {
    pub magic: &'static [u8; 4],
    pub context: &'static [u8],
    pub max_frame: usize,
}

impl Channel {
    fn signed(&self, nonce: &[u8], seq: u64, payload: &[u8]) -> Vec<u8> {
        let mut msg = Vec::with_capacity(self.context.len() + nonce.len() + 8 + payload.len());
        msg.extend_from_slice(self.context);
        msg.extend_from_slice(nonce);
        msg.extend_from_slice(&seq.to_be_bytes());
        msg.extend_from_slice(payload);
        msg
    }

    /// One frame for the connection whose challenge was `nonce`.
    pub fn encode(&self, key: &Key, nonce: &[u8], seq: u64, payload: &[u8]) -> Vec<u8> {
        let t = hmac::sign(key, &self.signed(nonce, seq, payload));
        let mut out = Vec::with_capacity(4 + 8 + payload.len() + TAG_LEN);
        out.extend_from_slice(&((8 + payload.len()) as u32).to_be_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(payload);
        out.extend_from_slice(t.as_ref());
        out
    }

    /// The body length a frame header announces, checked against the limit.
    pub fn frame_len(&self, header: [u8; 4]) -> Result<usize, FrameError> {
        let n = u32::from_be_bytes(header) as usize;
        if n > self.max_frame {
            return Err(FrameError::TooLarge(n, self.max_frame));
        }
        if n < 8 {
            return Err(FrameError::Short);
        }
        Ok(n)
    }

    /// Verifies a frame body (`seq | payload`) and its tag; `last_seq` is the last sequence
    /// number accepted on this connection. Returns the sequence number and the payload.
    pub fn verify<'b>(
        &self,
        keys: &[Key],
        nonce: &[u8],
        last_seq: u64,
        body: &'b [u8],
        tag: &[u8],
    ) -> Result<(u64, &'b [u8]), FrameError> {
        if body.len() < 8 {
            return Err(FrameError::Short);
        }
        if body.len() > self.max_frame {
            return Err(FrameError::TooLarge(body.len(), self.max_frame));
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&body[..8]);
        let seq = u64::from_be_bytes(s);
        let payload = &body[8..];
        let msg = self.signed(nonce, seq, payload);
        if !keys.iter().any(|k| hmac::verify(k, &msg, tag).is_ok()) {
            return Err(FrameError::BadTag);
        }
        if seq <= last_seq {
            return Err(FrameError::Replay {
                got: seq,
                last: last_seq,
            });
        }
        Ok((seq, payload))
    }

    /// Acceptor: sends the magic and a fresh random challenge; returns the challenge.
    pub async fn challenge<S: AsyncWrite + Unpin>(
        &self,
        s: &mut S,
    ) -> std::io::Result<[u8; NONCE_LEN]> {
        let mut nonce = [0u8; NONCE_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
            .map_err(|_| std::io::Error::other("no randomness for the challenge"))?;
        let mut hello = Vec::with_capacity(4 + NONCE_LEN);
        hello.extend_from_slice(self.magic);
        hello.extend_from_slice(&nonce);
        s.write_all(&hello).await?;
        Ok(nonce)
    }

    /// Dialer: reads the acceptor's magic and challenge.
    pub async fn read_challenge<S: AsyncRead + Unpin>(&self, s: &mut S) -> Result<Vec<u8>, String> {
        let mut hello = [0u8; 4 + NONCE_LEN];
        s.read_exact(&mut hello)
            .await
            .map_err(|e| format!("challenge: {e}"))?;
        if &hello[..4] != self.magic {
            return Err("the peer does not speak this protocol".into());
        }
        Ok(hello[4..].to_vec())
    }

    /// Acceptor: reads and verifies the next frame into `buf`, and returns its sequence number
    /// and payload (a slice of `buf`). `Ok(None)`: the peer closed the connection between
    /// frames. The header must come within `wait`, and the rest of the frame within `wait`
    /// after it.
    ///
    /// `buf` grows with the bytes that actually arrive: a header announcing the largest frame
    /// buys no buffer of that size before the key is checked. It is kept for the next frame.
    pub async fn read_frame<'b, S: AsyncRead + Unpin>(
        &self,
        s: &mut S,
        keys: &[Key],
        nonce: &[u8],
        last_seq: u64,
        buf: &'b mut Vec<u8>,
        wait: Duration,
    ) -> Result<Option<(u64, &'b [u8])>, ReadError> {
        let mut header = [0u8; 4];
        match tokio::time::timeout(wait, s.read_exact(&mut header)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Ok(None),
            Err(_) => return Err(ReadError::TimedOut),
        }
        let n = self.frame_len(header).map_err(ReadError::Frame)?;
        buf.clear();
        let want = (n + TAG_LEN) as u64;
        let got = tokio::time::timeout(wait, s.take(want).read_to_end(buf))
            .await
            .map_err(|_| ReadError::TimedOut)?
            .map_err(ReadError::Io)?;
        if got as u64 != want {
            return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let (body, tag) = buf.split_at(n);
        self.verify(keys, nonce, last_seq, body, tag)
            .map(Some)
            .map_err(ReadError::Frame)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Frame(FrameError),
    #[error("read: {0}")]
    Io(std::io::Error),
    #[error("no frame in time")]
    TimedOut,
}

/// Connections waiting to authenticate that an acceptor holds at once, at most: a few peers
/// reconnect together; a flood of strangers must not hold a task and a buffer each.
pub const MAX_UNAUTHENTICATED: usize = 16;

/// Of those, from one source address (one IPv6 /64), at most: a single stranger cannot take
/// every place and keep the real peers out.
pub const MAX_UNAUTHENTICATED_PER_SOURCE: usize = 4;

/// How long a new connection has to send its first (authenticated) frame: a peer dials to send
/// one at once.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// The places for connections that have not yet sent an authenticated frame (see
/// `MAX_UNAUTHENTICATED` and `MAX_UNAUTHENTICATED_PER_SOURCE`).
#[derive(Clone, Default)]
pub struct Admission {
    held: Held,
}

/// Connections waiting to authenticate, by source.
type Held = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// IPv6 sources are counted by /64, what one host is commonly given.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(a) => {
            let mut o = a.octets();
            if a.to_ipv4_mapped().is_some() {
                return ip;
            }
            o[8..].fill(0);
            IpAddr::from(o)
        }
    }
}

impl Admission {
    pub fn new() -> Admission {
        Admission::default()
    }

    /// A place for a new connection from `from`, or `None` when the acceptor should close it.
    pub fn admit(&self, from: IpAddr) -> Option<Pending> {
        let key = source_key(from);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = held.values().sum();
        let mine = held.get(&key).copied().unwrap_or(0);
        if total >= MAX_UNAUTHENTICATED || mine >= MAX_UNAUTHENTICATED_PER_SOURCE {
            return None;
        }
        held.insert(key, mine + 1);
        Some(Pending {
            held: Some((self.held.clone(), key)),
        })
    }

    /// Connections waiting to authenticate now.
    pub fn waiting(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum()
    }
}

/// A connection's place among the unauthenticated ones, given back when it authenticates (or
/// ends).
pub struct Pending {
    held: Option<(Held, IpAddr)>,
}

impl Pending {
    /// Its first frame verified: the place goes to the next newcomer.
    pub fn authenticated(&mut self) {
        if let Some((held, key)) = self.held.take() {
            let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = held.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&key);
                }
            }
        }
    }

    /// Whether the connection has yet to authenticate.
    pub fn waiting(&self) -> bool {
        self.held.is_some()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.authenticated();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CH: Channel = Channel {
        magic: b"TST1",
        context: b"fulcrum-test-1",
        max_frame: 1024,
    };
    const OTHER: Channel = Channel {
        magic: b"TST2",
        context: b"fulcrum-other-1",
        max_frame: 1024,
    };

    fn split(f: &[u8]) -> (&[u8], &[u8]) {
        let n = CH.frame_len([f[0], f[1], f[2], f[3]]).expect("len");
        (&f[4..4 + n], &f[4 + n..])
    }

    #[test]
    fn round_trip_rotation_replay_and_other_channels() {
        let old = keys(&["old-secret-0123456789".into()]);
        let both = keys(&[
            "new-secret-0123456789".into(),
            "old-secret-0123456789".into(),
        ]);
        let nonce = [7u8; NONCE_LEN];
        let f = CH.encode(&old[0], &nonce, 1, b"hello");
        let (body, t) = split(&f);
        assert_eq!(CH.verify(&both, &nonce, 0, body, t), Ok((1, &b"hello"[..])));
        assert!(matches!(
            CH.verify(&both, &nonce, 1, body, t),
            Err(FrameError::Replay { .. })
        ));
        assert_eq!(
            CH.verify(&both, &[8u8; NONCE_LEN], 0, body, t),
            Err(FrameError::BadTag)
        );
        // The same key on another channel: its context differs, the tag does not verify.
        assert_eq!(
            OTHER.verify(&both, &nonce, 0, body, t),
            Err(FrameError::BadTag)
        );
        assert_eq!(
            CH.frame_len([0xff, 0, 0, 0]),
            Err(FrameError::TooLarge(0xff00_0000, 1024))
        );
        assert_eq!(CH.frame_len([0, 0, 0, 3]), Err(FrameError::Short));
    }

    #[tokio::test]
    async fn challenge_and_frames_over_a_stream() {
        let k = keys(&["a-shared-secret-123".into()]);
        let (mut a, mut b) = tokio::io::duplex(4096);
        let nonce = CH.challenge(&mut a).await.expect("challenge");
        let got = CH.read_challenge(&mut b).await.expect("read challenge");
        assert_eq!(got, nonce);
        b.write_all(&CH.encode(&k[0], &got, 1, b"one"))
            .await
            .expect("write");
        b.write_all(&CH.encode(&k[0], &got, 2, b"two"))
            .await
            .expect("write");
        drop(b);
        let mut buf = Vec::new();
        let wait = Duration::from_secs(1);
        let f1 = CH.read_frame(&mut a, &k, &nonce, 0, &mut buf, wait).await;
        assert_eq!(f1.expect("frame"), Some((1, &b"one"[..])));
        let f2 = CH.read_frame(&mut a, &k, &nonce, 1, &mut buf, wait).await;
        assert_eq!(f2.expect("frame"), Some((2, &b"two"[..])));
        assert!(CH
            .read_frame(&mut a, &k, &nonce, 2, &mut buf, wait)
            .await
            .expect("eof")
            .is_none());
        let (mut c, mut d) = tokio::io::duplex(64);
        OTHER.challenge(&mut c).await.expect("challenge");
        assert!(CH.read_challenge(&mut d).await.is_err());
    }

    #[tokio::test]
    async fn a_large_announced_frame_buys_no_buffer_and_times_out() {
        let big = Channel {
            max_frame: 4 * 1024 * 1024,
            ..CH
        };
        let (mut a, mut b) = tokio::io::duplex(4096);
        let k = keys(&["a-shared-secret-123".into()]);
        let mut announce = (4u32 * 1024 * 1024).to_be_bytes().to_vec();
        announce.extend_from_slice(&[0u8; 100]);
        b.write_all(&announce).await.expect("write");
        let mut buf = Vec::new();
        let r = big
            .read_frame(
                &mut a,
                &k,
                &[0u8; NONCE_LEN],
                0,
                &mut buf,
                Duration::from_millis(50),
            )
            .await;
        assert!(matches!(r, Err(ReadError::TimedOut)), "{r:?}");
        assert!(buf.capacity() < 64 * 1024, "{}", buf.capacity());
    }

    #[test]
    fn admission_bounds_each_source_and_the_total() {
        let adm = Admission::new();
        let one: IpAddr = "192.0.2.1".parse().expect("ip");
        let mut held: Vec<Pending> = (0..MAX_UNAUTHENTICATED_PER_SOURCE)
            .map(|_| adm.admit(one).expect("a place"))
            .collect();
        assert!(
            adm.admit(one).is_none(),
            "one source holds at most its share"
        );
        // Another address of the same IPv6 /64 counts as the same source.
        let v6a: IpAddr = "2001:db8::1".parse().expect("ip");
        let v6b: IpAddr = "2001:db8::ffff:2".parse().expect("ip");
        for _ in 0..MAX_UNAUTHENTICATED_PER_SOURCE {
            held.push(adm.admit(v6a).expect("a place"));
        }
        assert!(adm.admit(v6b).is_none());
        // Authenticating gives the place back.
        held[0].authenticated();
        assert!(!held[0].waiting());
        held.push(adm.admit(one).expect("a place again"));
        // Many sources: the total is bounded.
        let mut n = 3u8;
        while adm.waiting() < MAX_UNAUTHENTICATED {
            held.push(adm.admit(IpAddr::from([198, 51, 100, n])).expect("a place"));
            n += 1;
        }
        assert!(adm.admit(IpAddr::from([203, 0, 113, 1])).is_none());
        held.clear();
        assert_eq!(adm.waiting(), 0);
    }
}
