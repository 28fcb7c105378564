//! smtp, pop3, imap, ftp and nntp: the server's greeting, then a command it must answer
//! positively (and a login when the monitor has credentials), then a polite goodbye. Each
//! protocol's reply syntax is read as it is specified: SMTP and FTP three-digit codes with
//! multi-line replies (RFC 5321 §4.2, RFC 959 §4.2), POP3 `+OK`/`-ERR` (RFC 1939), IMAP tagged
//! responses after untagged ones (RFC 9051), NNTP one-line status responses (RFC 3977 §3.2).

use fulcrum_config::{Monitor, MonitorKind};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{connect, read_more, Probe, Verdict};
use crate::text::{self, excerpt, EXCERPT};

/// Longest line read; a greeting or reply longer than this is not one of these protocols.
const MAX_LINE: usize = 4096;

#[derive(Debug)]
pub(crate) struct DialogueCheck {
    kind: MonitorKind,
    login: Option<(String, String)>,
    /// nntp: the group `GROUP` selects.
    newsgroup: Option<String>,
}

/// A line-oriented conversation bounded by the probe's deadline.
struct Conversation<'p> {
    stream: TcpStream,
    buf: Vec<u8>,
    probe: &'p Probe,
    proto: &'static str,
}

impl Conversation<'_> {
    /// The next line, without its line ending.
    async fn line(&mut self, waiting_for: &str) -> Result<String, String> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                return Ok(line.trim_end_matches(['\r', '\n']).to_string());
            }
            if self.buf.len() >= MAX_LINE {
                return Err(format!(
                    "{} {waiting_for}: a line longer than {MAX_LINE} bytes",
                    self.proto
                ));
            }
            let read = tokio::time::timeout_at(
                self.probe.deadline,
                read_more(&mut self.stream, &mut self.buf, MAX_LINE),
            )
            .await;
            match read {
                Ok(Ok(0)) if self.buf.is_empty() => {
                    return Err(format!("{} {waiting_for}: connection closed", self.proto))
                }
                Ok(Ok(0)) => {
                    return Err(format!(
                        "{} {waiting_for}: connection closed after \"{}\"",
                        self.proto,
                        excerpt(&self.buf, EXCERPT)
                    ))
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    return Err(format!(
                        "{} {waiting_for}: {}",
                        self.proto,
                        text::io_error(&e)
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "{}: {} {waiting_for}: got \"{}\"",
                        self.probe.timed_out(),
                        self.proto,
                        excerpt(&self.buf, EXCERPT)
                    ))
                }
            }
        }
    }

    async fn send(&mut self, command: &str) -> Result<(), String> {
        let line = format!("{command}\r\n");
        match tokio::time::timeout_at(self.probe.deadline, self.stream.write_all(line.as_bytes()))
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{} send: {}", self.proto, text::io_error(&e))),
            Err(_) => Err(format!("{} send: {}", self.proto, self.probe.timed_out())),
        }
    }

    /// An SMTP/FTP reply: lines up to the one with "NNN " (a "NNN-" line continues it). Returns
    /// the code and the last line.
    async fn coded_reply(&mut self, waiting_for: &str) -> Result<(u16, String), String> {
        loop {
            let line = self.line(waiting_for).await?;
            let code = line
                .get(..3)
                .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|c| c.parse::<u16>().ok());
            let Some(code) = code else {
                return Err(format!(
                    "{} {waiting_for}: not a reply: \"{}\"",
                    self.proto,
                    excerpt(line.as_bytes(), EXCERPT)
                ));
            };
            if line.as_bytes().get(3) != Some(&b'-') {
                return Ok((code, line));
            }
        }
    }

    /// Expects a coded reply in `ok`.
    async fn expect_code(&mut self, waiting_for: &str, ok: &[u16]) -> Result<u16, String> {
        let (code, line) = self.coded_reply(waiting_for).await?;
        if ok.contains(&code) {
            Ok(code)
        } else {
            Err(format!(
                "{} {waiting_for}: \"{}\"",
                self.proto,
                excerpt(line.as_bytes(), EXCERPT)
            ))
        }
    }

    /// An NNTP status line (one line, never continued) whose code is in `ok`.
    async fn expect_status(&mut self, waiting_for: &str, ok: &[u16]) -> Result<String, String> {
        let line = self.line(waiting_for).await?;
        match nntp_status(&line) {
            Some((code, _)) if ok.contains(&code) => Ok(line),
            Some(_) => Err(format!(
                "NNTP {waiting_for}: \"{}\"",
                excerpt(line.as_bytes(), EXCERPT)
            )),
            None => Err(format!(
                "NNTP {waiting_for}: not a status line: \"{}\"",
                excerpt(line.as_bytes(), EXCERPT)
            )),
        }
    }

    /// A POP3 status line: `+OK` passes.
    async fn expect_ok(&mut self, waiting_for: &str) -> Result<(), String> {
        let line = self.line(waiting_for).await?;
        if line.starts_with("+OK") {
            Ok(())
        } else {
            Err(format!(
                "{} {waiting_for}: \"{}\"",
                self.proto,
                excerpt(line.as_bytes(), EXCERPT)
            ))
        }
    }

    /// An IMAP tagged completion after any untagged lines: `TAG OK` passes.
    async fn expect_tagged(&mut self, tag: &str, waiting_for: &str) -> Result<(), String> {
        loop {
            let line = self.line(waiting_for).await?;
            let Some(rest) = line.strip_prefix(tag).and_then(|r| r.strip_prefix(' ')) else {
                if line.starts_with("* ") || line.starts_with("+ ") {
                    continue;
                }
                return Err(format!(
                    "IMAP {waiting_for}: not a response: \"{}\"",
                    excerpt(line.as_bytes(), EXCERPT)
                ));
            };
            return if rest.get(..2).is_some_and(|s| s.eq_ignore_ascii_case("OK")) {
                Ok(())
            } else {
                Err(format!(
                    "IMAP {waiting_for}: \"{}\"",
                    excerpt(line.as_bytes(), EXCERPT)
                ))
            };
        }
    }
}

/// An NNTP status line (RFC 3977 §3.2): three digits, then the end or a space and text.
fn nntp_status(line: &str) -> Option<(u16, &str)> {
    let code = line.get(..3)?;
    if !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rest = line.get(3..)?;
    let text = match rest.strip_prefix(' ') {
        Some(text) => text,
        None if rest.is_empty() => rest,
        None => return None,
    };
    Some((code.parse().ok()?, text))
}

/// The article count of a `211 number low high group` answer to GROUP (RFC 3977 §6.1.1).
fn group_count(line: &str) -> Option<u64> {
    let (211, text) = nntp_status(line)? else {
        return None;
    };
    let mut fields = text.split_ascii_whitespace();
    let count = fields.next()?.parse().ok()?;
    // low and high are article numbers (up to 2^31 - 1, but servers send more digits).
    for _ in 0..2 {
        fields.next()?.parse::<u64>().ok()?;
    }
    fields.next()?;
    Some(count)
}

/// Fuzz entry: an NNTP member's lines as the check reads them.
#[doc(hidden)]
pub fn fuzz_nntp(reply: &[u8]) {
    for line in reply.split(|&b| b == b'\n').take(64) {
        let line = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE)]);
        let line = line.trim_end_matches('\r');
        if let Some((code, text)) = nntp_status(line) {
            assert!(code <= 999 && text.len() < line.len());
        }
        let _ = group_count(line);
    }
}

/// An IMAP quoted string (RFC 9051 §4.3): backslash and quote escaped.
fn imap_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

impl DialogueCheck {
    pub fn new(monitor: &Monitor) -> Self {
        DialogueCheck {
            kind: monitor.kind,
            login: monitor
                .username
                .as_ref()
                .map(|u| (u.clone(), monitor.password.clone().unwrap_or_default())),
            newsgroup: monitor.newsgroup.clone(),
        }
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        let stream = match connect(probe).await {
            Ok(s) => s,
            Err(detail) => return Verdict::fail(detail),
        };
        let proto = match self.kind {
            MonitorKind::Smtp => "SMTP",
            MonitorKind::Pop3 => "POP3",
            MonitorKind::Imap => "IMAP",
            MonitorKind::Nntp => "NNTP",
            _ => "FTP",
        };
        let mut c = Conversation {
            stream,
            buf: Vec::new(),
            probe,
            proto,
        };
        let result = match self.kind {
            MonitorKind::Smtp => self.smtp(&mut c).await,
            MonitorKind::Pop3 => self.pop3(&mut c).await,
            MonitorKind::Imap => self.imap(&mut c).await,
            MonitorKind::Nntp => self.nntp(&mut c).await,
            _ => self.ftp(&mut c).await,
        };
        match result {
            Ok(detail) => Verdict::pass(detail),
            Err(detail) => Verdict::fail(detail),
        }
    }

    async fn smtp(&self, c: &mut Conversation<'_>) -> Result<String, String> {
        c.expect_code("greeting", &[220]).await?;
        c.send("EHLO fulcrum-health").await?;
        let code = match c.coded_reply("EHLO").await? {
            (250, _) => 250,
            // A server without ESMTP: fall back to HELO (RFC 5321 §4.1.4).
            (500..=502, _) => {
                c.send("HELO fulcrum-health").await?;
                c.expect_code("HELO", &[250]).await?
            }
            (_, line) => {
                return Err(format!(
                    "SMTP EHLO: \"{}\"",
                    excerpt(line.as_bytes(), EXCERPT)
                ))
            }
        };
        let _ = c.send("QUIT").await;
        Ok(format!("SMTP {code}"))
    }

    async fn pop3(&self, c: &mut Conversation<'_>) -> Result<String, String> {
        c.expect_ok("greeting").await?;
        if let Some((user, password)) = &self.login {
            c.send(&format!("USER {user}")).await?;
            c.expect_ok("USER").await?;
            c.send(&format!("PASS {password}")).await?;
            c.expect_ok("PASS").await?;
        } else {
            c.send("NOOP").await?;
            // NOOP is only valid once logged in; an -ERR still shows a live server.
            let line = c.line("NOOP").await?;
            if !(line.starts_with("+OK") || line.starts_with("-ERR")) {
                return Err(format!(
                    "POP3 NOOP: \"{}\"",
                    excerpt(line.as_bytes(), EXCERPT)
                ));
            }
        }
        let _ = c.send("QUIT").await;
        Ok(if self.login.is_some() {
            "POP3 +OK, logged in".into()
        } else {
            "POP3 +OK".into()
        })
    }

    async fn imap(&self, c: &mut Conversation<'_>) -> Result<String, String> {
        let greeting = c.line("greeting").await?;
        if !(greeting.starts_with("* OK") || greeting.starts_with("* PREAUTH")) {
            return Err(format!(
                "IMAP greeting: \"{}\"",
                excerpt(greeting.as_bytes(), EXCERPT)
            ));
        }
        c.send("f1 CAPABILITY").await?;
        c.expect_tagged("f1", "CAPABILITY").await?;
        if let Some((user, password)) = &self.login {
            c.send(&format!(
                "f2 LOGIN {} {}",
                imap_quote(user),
                imap_quote(password)
            ))
            .await?;
            c.expect_tagged("f2", "LOGIN").await?;
        }
        let _ = c.send("f3 LOGOUT").await;
        Ok(if self.login.is_some() {
            "IMAP OK, logged in".into()
        } else {
            "IMAP OK".into()
        })
    }

    async fn ftp(&self, c: &mut Conversation<'_>) -> Result<String, String> {
        c.expect_code("greeting", &[220]).await?;
        let detail = if let Some((user, password)) = &self.login {
            c.send(&format!("USER {user}")).await?;
            if c.expect_code("USER", &[230, 331]).await? == 331 {
                c.send(&format!("PASS {password}")).await?;
                c.expect_code("PASS", &[230, 202]).await?;
            }
            "FTP 230, logged in".to_string()
        } else {
            c.send("NOOP").await?;
            let code = c.expect_code("NOOP", &[200]).await?;
            format!("FTP {code}")
        };
        let _ = c.send("QUIT").await;
        Ok(detail)
    }

    /// Greeting 200 (posting allowed) or 201 (not); AUTHINFO USER/PASS (RFC 4643) with
    /// credentials; GROUP with a newsgroup, which must be selected (211); QUIT.
    async fn nntp(&self, c: &mut Conversation<'_>) -> Result<String, String> {
        let greeting = c.expect_status("greeting", &[200, 201]).await?;
        let mut detail = format!("NNTP {}", &greeting[..3]);
        if let Some((user, password)) = &self.login {
            c.send(&format!("AUTHINFO USER {user}")).await?;
            let line = c.expect_status("AUTHINFO USER", &[281, 381]).await?;
            if line.starts_with("381") {
                c.send(&format!("AUTHINFO PASS {password}")).await?;
                c.expect_status("AUTHINFO PASS", &[281]).await?;
            }
            detail.push_str(", logged in");
        }
        if let Some(group) = &self.newsgroup {
            c.send(&format!("GROUP {group}")).await?;
            let line = c.expect_status(&format!("GROUP {group}"), &[211]).await?;
            let Some(count) = group_count(&line) else {
                return Err(format!(
                    "NNTP GROUP {group}: not a 211 number low high group: \"{}\"",
                    excerpt(line.as_bytes(), EXCERPT)
                ));
            };
            detail.push_str(&format!(", {group}: {count} articles"));
        }
        let _ = c.send("QUIT").await;
        Ok(detail)
    }
}

#[cfg(test)]
mod nntp_tests {
    use super::*;

    #[test]
    fn status_lines_and_group_answers() {
        assert_eq!(nntp_status("200 ready"), Some((200, "ready")));
        assert_eq!(nntp_status("211"), Some((211, "")));
        assert_eq!(nntp_status("200-ready"), None);
        assert_eq!(nntp_status("20"), None);
        assert_eq!(nntp_status("2x0 ready"), None);
        assert_eq!(nntp_status("é00 x"), None);
        assert_eq!(group_count("211 3 1 3 misc.test"), Some(3));
        assert_eq!(group_count("211 0 0 0 misc.empty group selected"), Some(0));
        assert_eq!(group_count("211 3 1 misc.test"), None);
        assert_eq!(group_count("411 no such group"), None);
        assert_eq!(group_count("211 x 1 3 misc.test"), None);
        fuzz_nntp(b"200 a\r\n211 1 2 3 g\r\n\xff\xfe\n");
    }
}
