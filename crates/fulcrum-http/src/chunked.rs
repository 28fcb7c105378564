//! Chunked transfer coding (RFC 9112 §7.1), decoded strictly and re-encoded.
//!
//! Chunk-size lines are where request smuggling hides (a bare LF in an extension, a size with
//! leading spaces or a `0x` prefix, an overflowing size that one hop reads differently from the
//! next), and `httparse::parse_chunk_size` accepts any byte in an extension. So the decoder here
//! is written out as a state machine that takes only the grammar: hex digits, optional
//! `;`-extensions of visible characters, CRLF. The proxy never forwards chunk framing as it came:
//! it decodes the data and writes its own framing, so the member sees one unambiguous message.

use std::fmt;

/// The longest chunk-size line (digits and extensions) accepted.
const MAX_SIZE_LINE: usize = 4096;
/// The largest trailer section accepted (it is read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ChunkError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size,
    /// Whitespace after the digits: only a `;` may follow.
    SizeSpace,
    Extension,
    /// After the CR of the size line.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    TrailerLine,
    TrailerLf,
    /// After the CR of the final empty line.
    EndLf,
    Done,
}

/// A streaming decoder: feed it bytes as they arrive, it hands out the data.
#[derive(Debug, Clone)]
pub struct Decoder {
    state: State,
    size: u64,
    digits: u8,
    line: usize,
    trailers: usize,
    /// Data bytes seen, for accounting.
    pub data_total: u64,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            state: State::Size,
            size: 0,
            digits: 0,
            line: 0,
            trailers: 0,
            data_total: 0,
        }
    }
}

fn visible_ext(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

impl Decoder {
    /// Whether the last chunk and the trailer section have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes from `input`, calling `data` for every piece of chunk data. Returns how many bytes
    /// were consumed: all of `input`, unless the message ended before its end (the rest belongs
    /// to the next message).
    pub fn feed(&mut self, input: &[u8], mut data: impl FnMut(&[u8])) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if self.digits >= 15 {
                            return Err(ChunkError("chunk size too large"));
                        }
                        let d = (b as char).to_digit(16).unwrap_or(0);
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    }
                    b';' if self.digits > 0 => self.state = State::Extension,
                    b' ' | b'\t' if self.digits > 0 => self.state = State::SizeSpace,
                    b'\r' if self.digits > 0 => self.state = State::SizeLf,
                    _ => return Err(ChunkError("invalid chunk size")),
                },
                State::SizeSpace => match b {
                    b' ' | b'\t' => {}
                    b';' => self.state = State::Extension,
                    _ => return Err(ChunkError("invalid chunk size")),
                },
                State::Extension => match b {
                    b'\r' => self.state = State::SizeLf,
                    b if visible_ext(b) => {}
                    _ => return Err(ChunkError("invalid chunk extension")),
                },
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkError("chunk size line without CRLF"));
                    }
                    self.line = 0;
                    self.digits = 0;
                    self.state = if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data
                    };
                }
                State::Data => {
                    let n = (input.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    data(&input[i..i + n]);
                    self.data_total += n as u64;
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkError("chunk data longer than its size"));
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkError("chunk data without CRLF"));
                    }
                    self.state = State::Size;
                }
                State::TrailerStart => match b {
                    b'\r' => self.state = State::EndLf,
                    b if b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b) => {
                        self.state = State::TrailerLine;
                    }
                    _ => return Err(ChunkError("invalid trailer field")),
                },
                State::TrailerLine => match b {
                    b'\r' => self.state = State::TrailerLf,
                    b if visible_ext(b) => {}
                    _ => return Err(ChunkError("invalid trailer field")),
                },
                State::TrailerLf => {
                    if b != b'\n' {
                        return Err(ChunkError("trailer line without CRLF"));
                    }
                    self.state = State::TrailerStart;
                }
                State::EndLf => {
                    if b != b'\n' {
                        return Err(ChunkError("chunked body without its final CRLF"));
                    }
                    self.state = State::Done;
                    return Ok(i + 1);
                }
                State::Done => return Ok(i),
            }
            match self.state {
                State::Size | State::SizeSpace | State::Extension | State::SizeLf => {
                    self.line += 1;
                    if self.line > MAX_SIZE_LINE {
                        return Err(ChunkError("chunk size line too long"));
                    }
                }
                State::TrailerStart | State::TrailerLine | State::TrailerLf | State::EndLf => {
                    self.trailers += 1;
                    if self.trailers > MAX_TRAILERS {
                        return Err(ChunkError("trailer section too large"));
                    }
                }
                _ => {}
            }
            i += 1;
        }
        Ok(i)
    }
}

/// Appends one chunk (size line, data, CRLF) to `out`.
pub fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    write_hex(out, data.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Moves `data` to the end of `out`, as one chunk when `chunked`; returns the bytes added.
pub fn drain_body(out: &mut Vec<u8>, data: &mut Vec<u8>, chunked: bool) -> usize {
    let before = out.len();
    if chunked {
        encode_chunk(out, data);
    } else {
        out.extend_from_slice(data);
    }
    data.clear();
    out.len() - before
}

/// Appends a chunk's size line only (the data follows separately).
pub fn encode_chunk_head(out: &mut Vec<u8>, len: usize) {
    write_hex(out, len);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk and an empty trailer section.
pub const END: &[u8] = b"0\r\n\r\n";

fn write_hex(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        let n = d.feed(input, |b| out.extend_from_slice(b))?;
        assert!(d.is_done(), "not done");
        Ok((out, n))
    }

    #[test]
    fn decodes_and_stops_at_the_end() {
        let (data, n) =
            decode_all(b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: 1\r\n\r\nNEXT").unwrap();
        assert_eq!(data, b"Wikipedia");
        assert_eq!(
            n,
            b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: 1\r\n\r\n".len()
        );
    }

    #[test]
    fn byte_by_byte() {
        let input = b"A\r\n0123456789\r\n0\r\n\r\n";
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for b in input.chunks(1) {
            assert_eq!(d.feed(b, |x| out.extend_from_slice(x)).unwrap(), 1);
        }
        assert!(d.is_done());
        assert_eq!(out, b"0123456789");
    }

    #[test]
    fn refuses_ambiguous_framing() {
        for bad in [
            &b"4\nWiki\r\n0\r\n\r\n"[..],
            b" 4\r\nWiki\r\n0\r\n\r\n",
            b"0x4\r\nWiki\r\n0\r\n\r\n",
            b"4 \r\nWiki\r\n0\r\n\r\n",
            b"4;a\nb\r\nWiki\r\n0\r\n\r\n",
            b"4\r\nWikiX\r\n0\r\n\r\n",
            b"4\r\nWiki\n0\r\n\r\n",
            b"fffffffffffffffff\r\n",
            b"\r\n",
            b"4\r\nWiki\r\n0\r\n\n",
            b"4\r\nWiki\r\n0\r\nX: 1\n\r\n",
        ] {
            let mut d = Decoder::default();
            assert!(
                d.feed(bad, |_| {}).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn encodes() {
        let mut out = Vec::new();
        encode_chunk(&mut out, b"hello world, this is 30 bytes!");
        out.extend_from_slice(END);
        assert_eq!(out, b"1e\r\nhello world, this is 30 bytes!\r\n0\r\n\r\n");
        let (data, _) = decode_all(&out).unwrap();
        assert_eq!(data, b"hello world, this is 30 bytes!");
    }
}
