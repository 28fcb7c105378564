//! Short, human texts for check details, and the byte search the checks share.

use std::io;
use std::time::Duration;

/// How many bytes of a member's reply a detail quotes: enough to recognise an error banner,
/// short enough for the API's member view and a log line.
pub(crate) const EXCERPT: usize = 40;

/// `bytes` as a quotable string: the first `max` bytes, ASCII-escaped (a member may send
/// anything, and a detail must stay one printable line), with "…" when cut.
pub(crate) fn excerpt(bytes: &[u8], max: usize) -> String {
    let cut = bytes.len() > max;
    let mut s: String = bytes[..bytes.len().min(max)].escape_ascii().to_string();
    if cut {
        s.push('…');
    }
    s
}

/// "1s", "300ms", "1s 500ms".
pub(crate) fn duration(d: Duration) -> String {
    // humantime would print nanoseconds of a timer's rounding; a detail wants milliseconds.
    let ms = Duration::from_millis(d.as_millis().min(u128::from(u64::MAX)) as u64);
    humantime::format_duration(ms).to_string()
}

/// An I/O error as a check detail: "connection refused" rather than
/// "Connection refused (os error 111)".
pub(crate) fn io_error(e: &io::Error) -> String {
    use io::ErrorKind::*;
    let known = match e.kind() {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        TimedOut => "timed out",
        HostUnreachable => "host unreachable",
        NetworkUnreachable => "network unreachable",
        AddrNotAvailable => "address not available",
        BrokenPipe => "broken pipe",
        UnexpectedEof => "connection closed",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "I/O error".to_string(),
    }
}

/// Whether `needle` occurs in `hay` at or after `from`. Callers that search a growing buffer
/// pass where the previous search could not have matched yet, so each byte is looked at a
/// bounded number of times even when a member trickles its reply byte by byte.
pub(crate) fn contains_from(hay: &[u8], needle: &[u8], from: usize) -> bool {
    if needle.is_empty() {
        return true;
    }
    let from = from.min(hay.len());
    hay[from..].windows(needle.len()).any(|w| w == needle)
}

/// Where the next `contains_from` on a buffer of `len` bytes must start so that a match
/// straddling the old end is still found.
pub(crate) fn resume_at(len: usize, needle: &[u8]) -> usize {
    len.saturating_sub(needle.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_escaped_and_cut() {
        assert_eq!(excerpt(b"ERR\r\n", 40), "ERR\\r\\n");
        assert_eq!(excerpt(b"\x00\xffab", 40), "\\x00\\xffab");
        assert_eq!(excerpt(b"abcdef", 3), "abc…");
        assert_eq!(excerpt(b"", 3), "");
    }

    #[test]
    fn durations_read_like_config() {
        assert_eq!(duration(Duration::from_secs(1)), "1s");
        assert_eq!(duration(Duration::from_millis(300)), "300ms");
        assert_eq!(duration(Duration::from_micros(1_500_700)), "1s 500ms");
    }

    #[test]
    fn io_errors_read_like_details() {
        let e = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(io_error(&e), "connection refused");
        let e = io::Error::other("Something odd (os error 99)");
        assert_eq!(io_error(&e), "something odd");
    }

    #[test]
    fn search_resumes_across_the_old_end() {
        let needle = b"PONG";
        let mut buf = b"xxPO".to_vec();
        assert!(!contains_from(&buf, needle, 0));
        let from = resume_at(buf.len(), needle);
        buf.extend_from_slice(b"NGyy");
        assert!(contains_from(&buf, needle, from));
        assert!(contains_from(b"abc", b"", 10));
        assert!(!contains_from(b"abc", b"abcd", 0));
    }
}
