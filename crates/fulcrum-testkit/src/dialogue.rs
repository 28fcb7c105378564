//! A line-dialogue server: greets, then answers each command line by the first rule whose
//! prefix it starts with — enough to stand in for SMTP, POP3, IMAP and FTP servers in tests.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

/// A command prefix (matched case-insensitively) and the reply lines sent for it; a reply of
/// `None` closes the connection.
pub type Rule = (&'static str, Option<&'static str>);

pub struct DialogueServer {
    pub addr: SocketAddr,
    commands: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for DialogueServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DialogueServer {
    /// `greeting` is sent on connect (CRLF added per line); a command no rule matches gets
    /// `fallback`.
    pub async fn start(
        addr: SocketAddr,
        greeting: &'static str,
        rules: Vec<Rule>,
        fallback: &'static str,
    ) -> io::Result<DialogueServer> {
        let listener = crate::bind_tcp(addr).await?;
        let addr = listener.local_addr()?;
        let commands: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = commands.clone();
        let rules = Arc::new(rules);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (log, rules) = (log.clone(), rules.clone());
                tokio::spawn(async move {
                    let (r, mut w) = stream.into_split();
                    if w.write_all(crlf(greeting).as_bytes()).await.is_err() {
                        return;
                    }
                    let mut lines = BufReader::new(r).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        if let Ok(mut l) = log.lock() {
                            l.push(line.clone());
                        }
                        let upper = line.to_ascii_uppercase();
                        let reply = rules
                            .iter()
                            .find(|(p, _)| upper.starts_with(&p.to_ascii_uppercase()))
                            .map_or(Some(fallback), |(_, r)| *r);
                        let Some(reply) = reply else {
                            return;
                        };
                        if w.write_all(crlf(reply).as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(DialogueServer {
            addr,
            commands,
            task,
        })
    }

    /// The command lines received so far, over every connection.
    pub fn commands(&self) -> Vec<String> {
        self.commands.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

fn crlf(text: &str) -> String {
    text.lines().map(|l| format!("{l}\r\n")).collect()
}
