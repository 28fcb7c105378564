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

    /// Acceptor: reads and verifies the next frame. `Ok(None)`: the peer closed the connection.
    pub async fn read_frame<S: AsyncRead + Unpin>(
        &self,
        s: &mut S,
        keys: &[Key],
        nonce: &[u8],
        last_seq: u64,
    ) -> Result<Option<(u64, Vec<u8>)>, ReadError> {
        let mut header = [0u8; 4];
        if s.read_exact(&mut header).await.is_err() {
            return Ok(None);
        }
        let n = self.frame_len(header).map_err(ReadError::Frame)?;
        let mut body = vec![0u8; n + TAG_LEN];
        s.read_exact(&mut body).await.map_err(ReadError::Io)?;
        let (seq, payload) = self
            .verify(keys, nonce, last_seq, &body[..n], &body[n..])
            .map_err(ReadError::Frame)?;
        Ok(Some((seq, payload.to_vec())))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Frame(FrameError),
    #[error("read: {0}")]
    Io(std::io::Error),
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
        let f1 = CH.read_frame(&mut a, &k, &nonce, 0).await.expect("frame");
        assert_eq!(f1, Some((1, b"one".to_vec())));
        let f2 = CH.read_frame(&mut a, &k, &nonce, 1).await.expect("frame");
        assert_eq!(f2, Some((2, b"two".to_vec())));
        assert!(CH
            .read_frame(&mut a, &k, &nonce, 2)
            .await
            .expect("eof")
            .is_none());
        let (mut c, mut d) = tokio::io::duplex(64);
        OTHER.challenge(&mut c).await.expect("challenge");
        assert!(CH.read_challenge(&mut d).await.is_err());
    }
}
