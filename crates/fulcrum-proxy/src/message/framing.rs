//! Cuts a byte stream into messages: a length prefix (binary, ASCII decimal or packed BCD, after
//! an optional fixed header), an end delimiter, or a WebAssembly framing hook (`framing.wasm`)
//! that says where each message ends and where its sequence key lies.
//!
//! The framer is a pure function of the bytes it is shown: no I/O, no allocation, and every
//! frame it accepts is bounded by `max_message`. Bytes that cannot start a valid frame (a length
//! that is not a number, a frame shorter than its own header, a body beyond `max_message`) are an
//! error, and the connection that sent them is closed: a stream that lost its framing cannot be
//! resynchronised safely.

use std::ops::Range;
use std::sync::Arc;

use fulcrum_config::{Framing, LengthEncoding};
use fulcrum_wasm::MessageFrame;

/// One complete frame at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's length in bytes, header and delimiter included.
    pub len: usize,
    /// Where the body lies within the frame (after the length prefix, or before the delimiter).
    pub body: Range<usize>,
    /// Where the sequence key lies within the frame, when a framing hook gave one.
    pub key: Option<Range<usize>>,
    /// The member a framing hook chose for the message (`fulcrum.member`), if it chose one.
    pub member: Option<std::net::SocketAddr>,
}

/// Where a field `length` bytes long at `offset` into a frame's `body` lies within the frame
/// (the sequence id, `member_requests`' client field and marker); `None` when the body is too
/// short to hold it.
pub fn field_in_body(body: &Range<usize>, offset: usize, length: usize) -> Option<Range<usize>> {
    let start = body.start.checked_add(offset)?;
    let end = start.checked_add(length)?;
    (end <= body.end).then_some(start..end)
}

/// Why bytes cannot be a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The body announced (or, with a delimiter, already received) is larger than `max_message`.
    #[error("a message of {len} bytes exceeds max_message ({max} bytes)")]
    TooLarge { len: u64, max: usize },
    /// The length field is not a number in its encoding, or announces less than the header.
    #[error("malformed length field: {0}")]
    Malformed(&'static str),
}

impl FrameError {
    /// A short label for counters: "oversize" or "malformed".
    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::TooLarge { .. } => "oversize",
            FrameError::Malformed(_) => "malformed",
        }
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Length {
        offset: usize,
        bytes: usize,
        encoding: LengthEncoding,
        big_endian: bool,
        includes_header: bool,
        adjust: i64,
    },
    Delimiter(Box<[u8]>),
    Hook(Hook),
}

/// A framing hook: a loaded module exporting `fulcrum_on_message_frame`. Two hooks are the same
/// when their modules are (by digest), so a reload that changes the module's bytes builds a new
/// dispatcher.
#[derive(Clone)]
pub struct Hook(pub Arc<fulcrum_wasm::Filter>);

impl PartialEq for Hook {
    fn eq(&self, other: &Hook) -> bool {
        self.0.info.digest == other.0.info.digest
    }
}

impl Eq for Hook {}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hook({})", self.0.name)
    }
}

/// A framer built from a service's `framing`.
#[derive(Debug, Clone)]
pub struct Framer {
    kind: Kind,
    max_body: usize,
}

impl Framer {
    /// A framer whose frames a hook finds (`framing.wasm`); `max_message` still bounds them.
    pub fn with_hook(f: &Framing, hook: Hook) -> Framer {
        Framer {
            kind: Kind::Hook(hook),
            max_body: f.max_message,
        }
    }

    pub fn new(f: &Framing) -> Framer {
        let kind = match &f.delimiter {
            // An empty delimiter is refused by the config; a framer built by hand with one falls
            // back to a single NUL rather than matching everywhere.
            Some(d) if !d.is_empty() => Kind::Delimiter(d.clone().into_boxed_slice()),
            Some(_) => Kind::Delimiter(Box::new([0])),
            None => Kind::Length {
                offset: f.length_offset,
                bytes: usize::from(f.length_bytes).max(1),
                encoding: f.length_encoding,
                big_endian: f.big_endian,
                includes_header: f.length_includes_header,
                adjust: f.length_adjust,
            },
        };
        Framer {
            kind,
            max_body: f.max_message,
        }
    }

    /// Bytes before the body (0 with a delimiter).
    pub fn header_len(&self) -> usize {
        match &self.kind {
            Kind::Length { offset, bytes, .. } => offset.saturating_add(*bytes),
            Kind::Delimiter(_) | Kind::Hook(_) => 0,
        }
    }

    /// The longest frame this framer accepts: what a connection's read buffer must be able to hold.
    pub fn max_frame(&self) -> usize {
        let trailer = match &self.kind {
            Kind::Length { .. } | Kind::Hook(_) => 0,
            Kind::Delimiter(d) => d.len(),
        };
        self.header_len()
            .saturating_add(self.max_body)
            .saturating_add(trailer)
    }

    /// Looks for one complete frame at the start of `buf`.
    ///
    /// `Ok(None)` means more bytes are needed. `scanned` remembers, between calls on a growing
    /// buffer, how far a delimiter search got, so slow senders do not cost a rescan per read;
    /// start it at 0, and it is reset to 0 whenever a frame is returned.
    pub fn parse(&self, buf: &[u8], scanned: &mut usize) -> Result<Option<Frame>, FrameError> {
        match &self.kind {
            Kind::Length {
                offset,
                bytes,
                encoding,
                big_endian,
                includes_header,
                adjust,
            } => {
                let header = offset.saturating_add(*bytes);
                let Some(field) = buf.get(*offset..header) else {
                    return Ok(None);
                };
                let value = decode_length(field, *encoding, *big_endian)?;
                let value = i128::from(value) + i128::from(*adjust);
                let body_len = if *includes_header {
                    value - header as i128
                } else {
                    value
                };
                if body_len < 0 {
                    return Err(FrameError::Malformed(
                        "the length announces less than the frame's own header",
                    ));
                }
                if body_len > self.max_body as i128 {
                    return Err(FrameError::TooLarge {
                        len: u64::try_from(body_len).unwrap_or(u64::MAX),
                        max: self.max_body,
                    });
                }
                // body_len <= max_body, a usize, so neither conversion nor sum can overflow
                // beyond what max_frame() already allows.
                let len = header.saturating_add(body_len as usize);
                if buf.len() < len {
                    return Ok(None);
                }
                *scanned = 0;
                Ok(Some(Frame {
                    len,
                    body: header..len,
                    key: None,
                    member: None,
                }))
            }
            Kind::Hook(hook) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                match hook.0.message_frame(buf) {
                    MessageFrame::More if buf.len() >= self.max_frame() => {
                        Err(FrameError::TooLarge {
                            len: buf.len() as u64,
                            max: self.max_body,
                        })
                    }
                    MessageFrame::More => Ok(None),
                    MessageFrame::Malformed => Err(FrameError::Malformed(
                        "the framing hook refused the bytes (or failed)",
                    )),
                    MessageFrame::Frame { len, .. } if len > self.max_body => {
                        Err(FrameError::TooLarge {
                            len: len as u64,
                            max: self.max_body,
                        })
                    }
                    MessageFrame::Frame { len, .. } if buf.len() < len => Ok(None),
                    MessageFrame::Frame { len, key, member } => Ok(Some(Frame {
                        len,
                        body: 0..len,
                        key,
                        member,
                    })),
                }
            }
            Kind::Delimiter(delim) => {
                // A delimiter may start at most at max_body: look no further than that.
                let limit = buf.len().min(self.max_body.saturating_add(delim.len()));
                let from = (*scanned).min(limit).saturating_sub(delim.len() - 1);
                match memchr::memmem::find(&buf[from..limit], delim) {
                    Some(at) => {
                        let end = from + at;
                        *scanned = 0;
                        Ok(Some(Frame {
                            len: end + delim.len(),
                            body: 0..end,
                            key: None,
                            member: None,
                        }))
                    }
                    None if limit >= self.max_body.saturating_add(delim.len()) => {
                        Err(FrameError::TooLarge {
                            len: buf.len() as u64,
                            max: self.max_body,
                        })
                    }
                    None => {
                        *scanned = limit;
                        Ok(None)
                    }
                }
            }
        }
    }
}

/// The value of a length field.
fn decode_length(
    field: &[u8],
    encoding: LengthEncoding,
    big_endian: bool,
) -> Result<u64, FrameError> {
    match encoding {
        LengthEncoding::Binary => {
            if field.len() > 8 {
                return Err(FrameError::Malformed("a binary length wider than 8 bytes"));
            }
            let fold = |acc: u64, &b: &u8| (acc << 8) | u64::from(b);
            Ok(if big_endian {
                field.iter().fold(0, fold)
            } else {
                field.iter().rev().fold(0, fold)
            })
        }
        LengthEncoding::Ascii => field.iter().try_fold(0u64, |acc, &b| {
            if !b.is_ascii_digit() {
                return Err(FrameError::Malformed("a non-digit in an ASCII length"));
            }
            acc.checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(b - b'0')))
                .ok_or(FrameError::Malformed("an ASCII length too large to count"))
        }),
        LengthEncoding::Bcd => field.iter().try_fold(0u64, |acc, &b| {
            let (hi, lo) = (b >> 4, b & 0x0f);
            if hi > 9 || lo > 9 {
                return Err(FrameError::Malformed("a nibble above 9 in a BCD length"));
            }
            acc.checked_mul(100)
                .and_then(|v| v.checked_add(u64::from(hi * 10 + lo)))
                .ok_or(FrameError::Malformed("a BCD length too large to count"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framer(f: impl FnOnce(&mut Framing)) -> Framer {
        let mut cfg = Framing::default();
        f(&mut cfg);
        Framer::new(&cfg)
    }

    fn parse(fr: &Framer, buf: &[u8]) -> Result<Option<Frame>, FrameError> {
        fr.parse(buf, &mut 0)
    }

    fn frame(len: usize, body: Range<usize>) -> Result<Option<Frame>, FrameError> {
        Ok(Some(Frame {
            len,
            body,
            key: None,
            member: None,
        }))
    }

    #[test]
    fn two_byte_big_endian_body_length() {
        let fr = framer(|_| {});
        assert_eq!(parse(&fr, b""), Ok(None));
        assert_eq!(parse(&fr, b"\x00"), Ok(None));
        assert_eq!(parse(&fr, b"\x00\x03ab"), Ok(None));
        assert_eq!(parse(&fr, b"\x00\x03abcXYZ"), frame(5, 2..5));
        assert_eq!(parse(&fr, b"\x00\x00"), frame(2, 2..2));
        assert_eq!(fr.max_frame(), 2 + 65536);
    }

    #[test]
    fn every_binary_width_and_byte_order() {
        for bytes in [1u8, 2, 4, 8] {
            for big_endian in [true, false] {
                let fr = framer(|f| {
                    f.length_bytes = bytes;
                    f.big_endian = big_endian;
                });
                let mut field = vec![0u8; bytes as usize];
                let at = if big_endian { bytes as usize - 1 } else { 0 };
                field[at] = 4;
                let mut buf = field.clone();
                buf.extend_from_slice(b"bodyREST");
                let h = bytes as usize;
                assert_eq!(
                    parse(&fr, &buf),
                    frame(h + 4, h..h + 4),
                    "{bytes} {big_endian}"
                );
            }
        }
        // 8-byte lengths beyond any max_message are refused without overflow.
        let fr = framer(|f| f.length_bytes = 8);
        assert_eq!(
            parse(&fr, &[0xff; 8]),
            Err(FrameError::TooLarge {
                len: u64::MAX,
                max: 65536
            })
        );
    }

    #[test]
    fn offset_header_and_length_including_header() {
        // 3 bytes of header (e.g. a TPDU tag), then a 2-byte length counting the whole frame.
        let fr = framer(|f| {
            f.length_offset = 3;
            f.length_includes_header = true;
        });
        assert_eq!(parse(&fr, b"TPD\x00"), Ok(None));
        assert_eq!(parse(&fr, b"TPD\x00\x07abX"), frame(7, 5..7));
        assert_eq!(parse(&fr, b"TPD\x00\x05"), frame(5, 5..5));
        assert!(matches!(
            parse(&fr, b"TPD\x00\x04"),
            Err(FrameError::Malformed(_))
        ));
        // length_adjust: the field counts two trailing checksum bytes less than the body.
        let fr = framer(|f| f.length_adjust = 2);
        assert_eq!(parse(&fr, b"\x00\x01aCCz"), frame(5, 2..5));
        let fr = framer(|f| f.length_adjust = -3);
        assert!(matches!(
            parse(&fr, b"\x00\x01a"),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn ascii_and_bcd_lengths() {
        let fr = framer(|f| {
            f.length_encoding = LengthEncoding::Ascii;
            f.length_bytes = 4;
        });
        assert_eq!(parse(&fr, b"0005helloX"), frame(9, 4..9));
        assert_eq!(parse(&fr, b"0005hel"), Ok(None));
        assert_eq!(
            parse(&fr, b"00 5hello"),
            Err(FrameError::Malformed("a non-digit in an ASCII length"))
        );
        assert!(matches!(
            parse(&fr, b"9999"),
            Err(FrameError::TooLarge { len: 9999, .. }) | Ok(None)
        ));
        let fr = framer(|f| {
            f.length_encoding = LengthEncoding::Bcd;
            f.length_bytes = 2;
        });
        assert_eq!(parse(&fr, b"\x00\x12abcdefghijklZ"), frame(14, 2..14));
        assert_eq!(
            parse(&fr, b"\x00\x1a"),
            Err(FrameError::Malformed("a nibble above 9 in a BCD length"))
        );
        let fr = framer(|f| {
            f.length_encoding = LengthEncoding::Bcd;
            f.length_bytes = 2;
            f.max_message = 100;
        });
        assert_eq!(
            parse(&fr, b"\x01\x01"),
            Err(FrameError::TooLarge { len: 101, max: 100 })
        );
    }

    #[test]
    fn delimiter_frames_and_incremental_scan() {
        let fr = framer(|f| {
            f.delimiter = Some(b"\r\n".to_vec());
            f.max_message = 10;
        });
        assert_eq!(parse(&fr, b"abc\r\nrest"), frame(5, 0..3));
        assert_eq!(parse(&fr, b"\r\n"), frame(2, 0..0));
        // Fed byte by byte, a delimiter split across reads is still found.
        let msg = b"hello\r\n";
        let mut scanned = 0;
        for end in 1..msg.len() {
            assert_eq!(fr.parse(&msg[..end], &mut scanned), Ok(None), "{end}");
        }
        assert_eq!(fr.parse(msg, &mut scanned), frame(7, 0..5));
        assert_eq!(scanned, 0);
        // A body of max_message bytes is fine; one more byte without a delimiter is not.
        assert_eq!(parse(&fr, b"0123456789\r\n"), frame(12, 0..10));
        assert_eq!(parse(&fr, b"0123456789\r"), Ok(None));
        assert!(matches!(
            parse(&fr, b"0123456789ab"),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(
            parse(&fr, b"0123456789a\r\n"),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn oversize_is_refused_before_the_body_arrives() {
        let fr = framer(|f| f.max_message = 16);
        assert_eq!(parse(&fr, b"\x00\x10"), Ok(None));
        assert_eq!(
            parse(&fr, b"\x00\x11"),
            Err(FrameError::TooLarge { len: 17, max: 16 })
        );
    }
}
