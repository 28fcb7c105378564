//! The `[admin]` table: where the API listens and how it is locked (mutating calls
//! are refused without authentication even when no token is configured).
//!
//! Lives apart from `schema.rs` so the contract's tables stay readable.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::reader::{Cx, FromNode, Node, Shape};
use crate::types::read_table;

/// Where the generated token is kept when neither `token` nor `token_file` is set. Root-only
/// (the directory is created 0700, the file 0600), so only root — and the local CLI run as
/// root — can read it.
pub const DEFAULT_TOKEN_FILE: &str = "/var/lib/fulcrum/admin.token";

/// Shortest bearer token accepted: 16 characters (the generated ones are 43, 256 random bits).
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, Clone)]
pub struct Admin {
    pub listen: SocketAddr,
    /// A bearer token written in the config.
    pub token: Option<String>,
    /// A file holding the token; generated (0600) at first start when it does not exist.
    /// Relative paths are taken from the config file's directory.
    pub token_file: PathBuf,
    /// Whether `token_file` was written in the config (not the default).
    pub token_file_set: bool,
    /// `/metrics` requires the bearer token too.
    pub metrics_auth: bool,
    /// Where member/site states and weights set through the API are kept across restarts.
    pub state_file: Option<PathBuf>,
    /// A Unix socket the API also listens on (Fulcrum addition). Its file permissions
    /// authenticate the caller: every call over it is allowed, without a token; the local CLI
    /// uses it when it exists.
    pub socket: Option<PathBuf>,
    /// The socket file's mode: 0o600 (root only, the default) or 0o660 (and its group).
    pub socket_mode: u32,
    /// TLS on `listen` (Fulcrum addition): a certificate chain and its key, PEM.
    pub tls: Option<crate::TlsCert>,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            listen: SocketAddr::from(([127, 0, 0, 1], 9900)),
            token: None,
            token_file: PathBuf::from(DEFAULT_TOKEN_FILE),
            token_file_set: false,
            metrics_auth: false,
            state_file: None,
            socket: None,
            socket_mode: 0o600,
            tls: None,
        }
    }
}

/// The socket file modes `admin.socket_mode` accepts.
pub const SOCKET_MODES: [(&str, u32); 2] = [("0600", 0o600), ("0660", 0o660)];

impl Admin {
    /// Whether the operator named the token (in the file or as a file); a generated one at the
    /// default path does not count, because nobody off this host knows it.
    pub fn token_configured(&self) -> bool {
        self.token.is_some() || self.token_file_set
    }
}

/// Checks a token's shape: long enough, printable, no spaces (it travels in a header).
pub fn token_problem(token: &str) -> Option<String> {
    token_too_short(token).or_else(|| token_unprintable(token))
}

/// A token under `MIN_TOKEN_LEN` characters: refused in the config and in token files, on
/// any listener (on loopback every local user and process can try tokens at leisure).
pub fn token_too_short(token: &str) -> Option<String> {
    (token.chars().count() < MIN_TOKEN_LEN).then(|| {
        format!(
            "the token is {} characters long; use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 16`)",
            token.chars().count()
        )
    })
}

fn token_unprintable(token: &str) -> Option<String> {
    (!token.chars().all(|c| c.is_ascii_graphic())).then(|| {
        "the token must be printable ASCII without spaces (it is sent in an HTTP header)".into()
    })
}

/// A bearer token as written in the config, checked by `token_problem`.
struct Token(String);

impl FromNode for Token {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Str(s) => match token_problem(s) {
                Some(problem) => {
                    cx.error(node, problem);
                    None
                }
                None => Some(Token(s.to_string())),
            },
            _ => {
                cx.error(
                    node,
                    format!("expected a string, found {}", node.type_name()),
                );
                None
            }
        }
    }
}

impl FromNode for Admin {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Admin::default();
            let token = t.opt::<Token>(cx, "token").map(|t| t.0);
            let listen: SocketAddr = t.opt(cx, "listen").unwrap_or(d.listen);
            let token_file: Option<String> = t.opt(cx, "token_file");
            if t.has("token") && token_file.is_some() {
                if let Some(n) = t.node("token_file") {
                    cx.error(&n, "set either `token` or `token_file`, not both");
                }
            }
            let socket = t.opt::<String>(cx, "socket").map(PathBuf::from);
            let mode: Option<String> = t.opt(cx, "socket_mode");
            let socket_mode = match mode {
                None => d.socket_mode,
                Some(m) => match SOCKET_MODES.iter().find(|(text, _)| *text == m) {
                    Some((_, mode)) => *mode,
                    None => {
                        if let Some(n) = t.node("socket_mode") {
                            cx.error(
                                &n,
                                format!("{m:?}: expected \"0600\" (root only) or \"0660\" (root and the socket's group)"),
                            );
                        }
                        d.socket_mode
                    }
                },
            };
            if t.has("socket_mode") && socket.is_none() {
                if let Some(n) = t.node("socket_mode") {
                    cx.error(&n, "socket_mode needs `socket`");
                }
            }
            let tls: Option<crate::TlsCert> = t.opt(cx, "tls");
            Some(Admin {
                listen,
                token,
                token_file_set: token_file.is_some(),
                token_file: token_file.map_or(d.token_file, PathBuf::from),
                metrics_auth: t.opt(cx, "metrics_auth").unwrap_or(false),
                state_file: t.opt::<String>(cx, "state_file").map(PathBuf::from),
                socket,
                socket_mode,
                tls,
            })
        })
    }
}
