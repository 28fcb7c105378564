//! The admin plane's lock: the bearer token, configured or generated at first start
//! into a root-only file, and the rule that an API bound off loopback needs a configured token.
//!
//! The address the API is bound to changes only at restart, so reloads are checked against
//! the bound address, not the one a new file names.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use fulcrum_admin::Access;
use fulcrum_config::Admin;

/// The API's access rules for `admin`, with the API bound to `bound`.
pub fn access(admin: &Admin, bound: SocketAddr) -> Result<Access, String> {
    if !bound.ip().is_loopback() && !admin.token_configured() {
        return Err(format!(
            "admin.listen: the API is bound to {bound}, which is not a loopback address (it changes only at a restart): \
             set admin.token or admin.token_file so it is not open to the network"
        ));
    }
    let token: Arc<str> = match &admin.token {
        // The config refused a short or unprintable token already.
        Some(t) => Arc::from(t.as_str()),
        None => Arc::from(secret_file(&admin.token_file, "admin.token_file")?),
    };
    Ok(Access {
        token,
        reads_need_token: admin.token.is_some() || !bound.ip().is_loopback(),
        metrics_need_token: admin.metrics_auth,
    })
}

/// 32 random bytes from the kernel, as 64 hex digits.
fn random_hex() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Reads the secret in `path` (its first line), or creates it (64 random hex digits, mode
/// 0600, the directory 0700 when it is made) when it does not exist. A file that others may
/// read is refused, as ssh refuses a readable private key.
pub fn secret_file(path: &Path, key: &str) -> Result<String, String> {
    let mut lines = secret_lines(path, key)?;
    Ok(lines.swap_remove(0))
}

/// As `secret_file`, every line: the newest secret first, then older ones still accepted
/// (rotation: put a new line on top).
pub fn secret_lines(path: &Path, key: &str) -> Result<Vec<String>, String> {
    match std::fs::metadata(path) {
        Ok(meta) => {
            if meta.mode() & 0o077 != 0 {
                return Err(format!(
                    "{key}: {} can be read by others (mode {:o}); chmod 600 it",
                    path.display(),
                    meta.mode() & 0o777
                ));
            }
            read_secret(path, key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_secret(path, key),
        Err(e) => Err(format!("{key}: cannot read {}: {e}", path.display())),
    }
}

fn read_secret(path: &Path, key: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if lines.is_empty() {
        return Err(format!("{key}: {} is empty", path.display()));
    }
    for line in &lines {
        if let Some(problem) = fulcrum_config::token_problem(line) {
            return Err(format!("{key}: {}: {problem}", path.display()));
        }
    }
    Ok(lines)
}

/// The directory `path` goes in, created with `mode` when missing (errors name `key`).
fn parent_dir<'a>(path: &'a Path, mode: u32, key: &str) -> Result<&'a Path, String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| format!("{key}: cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Writes a new secret beside `path` and links it into place, so a concurrent start (or a
/// reader) never sees a half-written file; if another process won the race, its secret is used.
fn create_secret(path: &Path, key: &str) -> Result<Vec<String>, String> {
    let dir = parent_dir(path, 0o700, key)?;
    let secret = random_hex()?;
    let staging = dir.join(format!(
        ".{}.{}.new",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staging)
        .and_then(|mut f| {
            f.write_all(secret.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&staging);
        return Err(format!("{key}: cannot write {}: {e}", staging.display()));
    }
    let linked = std::fs::hard_link(&staging, path);
    let _ = std::fs::remove_file(&staging);
    match linked {
        Ok(()) => {
            tracing::info!(file = %path.display(), "generated a new secret ({key})");
            Ok(vec![secret])
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_secret(path, key),
        Err(e) => Err(format!("{key}: cannot create {}: {e}", path.display())),
    }
}

/// The file beside `admin.token_file` that keeps the cookie secret across restarts.
pub fn cookie_secret_path(admin: &Admin) -> std::path::PathBuf {
    admin
        .token_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("cookie.secret")
}

/// Gives every cookie_insert / cookie_rewrite profile without a `secret` the secrets of
/// `cookie.secret` beside the token file (created at first need): cookies then survive
/// restarts, and two instances sharing the file accept each other's cookies. Its first line
/// signs; the others are still accepted (rotation). With `ha.sync` the signing secret is
/// derived from the sync key instead (the same on both nodes) and the file's lines are only
/// accepted.
pub fn fill_cookie_secrets(config: &mut fulcrum_config::Config) -> Result<(), String> {
    use fulcrum_config::PersistenceKind::{CookieInsert, CookieRewrite};
    let needs = |p: &fulcrum_config::Persistence| {
        matches!(p.kind, CookieInsert | CookieRewrite) && p.secret.is_none()
    };
    if !config.persistence.iter().any(needs) {
        return Ok(());
    }
    let path = cookie_secret_path(&config.admin);
    let (newest, lines) =
        match crate::planes::pair::shared_secret(config, fulcrum_ha::sync::purpose::COOKIE) {
            // An HA pair signs with the secret both nodes derive from ha.sync.key, so a cookie
            // one node issued sticks on the other; cookies signed with this node's own file
            // before are still honoured (and re-issued).
            Some(shared) => {
                let own = if path.exists() {
                    secret_lines(&path, "persistence secret file")?
                } else {
                    Vec::new()
                };
                let hex: String = shared.iter().map(|b| format!("{b:02x}")).collect();
                (hex, own)
            }
            None => {
                let mut lines = secret_lines(&path, "persistence secret file")?;
                let newest = lines.remove(0);
                (newest, lines)
            }
        };
    for p in config.persistence.iter_mut().filter(|p| needs(p)) {
        p.secret = Some(newest.clone());
        p.previous_secrets = lines.clone();
    }
    Ok(())
}

/// Binds the API's listeners: `admin.listen` (TLS with `admin.tls`) and `admin.socket`.
pub async fn listeners(admin: &Admin) -> Result<fulcrum_admin::Listeners, String> {
    let tls = match &admin.tls {
        Some(c) => Some(
            fulcrum_http::tls::single_cert_acceptor(c, "admin.tls")
                .map_err(|(k, m)| format!("{k}: {m}"))?,
        ),
        None => {
            if !admin.listen.ip().is_loopback() {
                tracing::warn!(listen = %admin.listen, "the admin API is off loopback in plain HTTP: its token crosses the network readable; set admin.tls");
            }
            None
        }
    };
    let socket = match &admin.socket {
        Some(path) => Some(bind_socket(path, admin.socket_mode)?),
        None => None,
    };
    let tcp = tokio::net::TcpListener::bind(admin.listen)
        .await
        .map_err(|e| format!("cannot listen on {} (admin.listen): {e}", admin.listen))?;
    Ok(fulcrum_admin::Listeners { tcp, tls, socket })
}

/// Binds the admin socket with `mode` and no moment at a wider one: it is bound in a fresh 0700
/// directory beside `path`, given its mode, then renamed into place. A socket file left by an
/// earlier run (nobody answers on it) is replaced; one a running process answers on is not.
fn bind_socket(path: &Path, mode: u32) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let shown = path.display();
    let dir = parent_dir(path, 0o755, "admin.socket")?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "admin.socket: another process answers on {shown} (is fulcrum running already?)"
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("admin.socket: cannot remove the stale {shown}: {e}"))?;
        }
        Ok(_) => return Err(format!("admin.socket: {shown} exists and is not a socket")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("admin.socket: {shown}: {e}")),
    }
    let staging = dir.join(format!(".fulcrum-admin.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(|e| format!("admin.socket: cannot create {}: {e}", staging.display()))?;
    let placed = (|| {
        let at = staging.join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&at)
            .map_err(|e| format!("admin.socket: cannot bind {shown}: {e}"))?;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("admin.socket: cannot set the mode of {shown}: {e}"))?;
        std::fs::rename(&at, path)
            .map_err(|e| format!("admin.socket: cannot move the socket to {shown}: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("admin.socket: {e}"))?;
        tokio::net::UnixListener::from_std(listener).map_err(|e| format!("admin.socket: {e}"))
    })();
    let _ = std::fs::remove_dir_all(&staging);
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_created_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/admin.token");
        let first = secret_file(&path, "k").unwrap();
        assert_eq!(first.len(), 64);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        assert_eq!(secret_file(&path, "k").unwrap(), first);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert!(secret_file(&path, "k").unwrap_err().contains("chmod 600"));
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        std::fs::set_permissions(&short, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        assert!(secret_file(&short, "k")
            .unwrap_err()
            .contains("at least 16"));
        let rotated = dir.path().join("rotated");
        std::fs::write(&rotated, "new-0123456789abcdef\n\nold-0123456789abcdef\n").unwrap();
        std::fs::set_permissions(
            &rotated,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        assert_eq!(
            secret_lines(&rotated, "k").unwrap(),
            ["new-0123456789abcdef", "old-0123456789abcdef"]
        );
    }

    #[test]
    fn cookie_profiles_without_a_secret_get_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[admin]\ntoken_file = \"{}/admin.token\"\n\
             [[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"http\"\npool = \"p\"\npersistence = \"c\"\n\
             [[pool]]\nname = \"p\"\n\
             [[persistence]]\nname = \"c\"\ntype = \"cookie_insert\"\n\
             [[persistence]]\nname = \"s\"\ntype = \"cookie_insert\"\nsecret = \"configured-0123456789\"\n",
            dir.path().display()
        );
        let mut c = fulcrum_config::parse(&text, "t", dir.path()).unwrap();
        fill_cookie_secrets(&mut c).unwrap();
        let generated = c.persistence[0].secret.clone().unwrap();
        assert_eq!(generated.len(), 64);
        assert_eq!(
            c.persistence[1].secret.as_deref(),
            Some("configured-0123456789")
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cookie.secret"))
                .unwrap()
                .trim(),
            generated
        );
    }

    #[test]
    fn with_ha_sync_both_nodes_sign_with_the_derived_secret_and_accept_their_own_file() {
        let config = |dir: &Path, key: &str| {
            format!(
                "[admin]\ntoken_file = \"{}/admin.token\"\n\
                 [ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"198.18.0.100/24\"]\n\
                 sync = {{ listen = \"127.0.0.1:7500\", key = \"{key}\" }}\n\
                 [[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"http\"\npool = \"p\"\npersistence = \"c\"\n\
                 [[pool]]\nname = \"p\"\n\
                 [[persistence]]\nname = \"c\"\ntype = \"cookie_insert\"\n",
                dir.display()
            )
        };
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Node one had its own file before HA was configured; node two has none.
        std::fs::write(one.path().join("cookie.secret"), "own-secret-0123456789\n").unwrap();
        std::fs::set_permissions(
            one.path().join("cookie.secret"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let filled = |dir: &Path, key: &str| {
            let mut c = fulcrum_config::parse(&config(dir, key), "t", dir).unwrap();
            fill_cookie_secrets(&mut c).unwrap();
            c.persistence.remove(0)
        };
        let a = filled(one.path(), "a-sync-key-0123456789");
        let b = filled(two.path(), "a-sync-key-0123456789");
        assert_eq!(a.secret, b.secret);
        assert_eq!(a.previous_secrets, ["own-secret-0123456789"]);
        assert!(b.previous_secrets.is_empty());
        assert!(!two.path().join("cookie.secret").exists(), "no file made");
        let other = filled(two.path(), "another-sync-key-0123");
        assert_ne!(other.secret, a.secret);
    }
}
