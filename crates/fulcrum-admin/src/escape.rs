//! Text from callers and receivers made safe to put in a log line: used by the audit log and by
//! the alert deliveries' error messages.

/// `s` with what could end or forge a log line escaped: `\n`, `\r`, other control characters
/// as `\xNN` (`\u{NNNN}` beyond ASCII), and the backslash itself, so an escaped sequence
/// always means an escaped character.
pub fn log_escape(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() || c == '\\') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() && c.is_ascii() => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_escape_leaves_one_line() {
        assert_eq!(log_escape("/api/v1/reload"), "/api/v1/reload");
        assert_eq!(
            log_escape("a\nb\rc\x1bd\\n\u{85}\t"),
            "a\\nb\\rc\\x1bd\\\\n\\u{0085}\\x09"
        );
    }
}
