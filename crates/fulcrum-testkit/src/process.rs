//! Runs the `fulcrum` binary on a config for black-box tests, through the contract only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::{http_request, HttpResponse};

pub struct Fulcrum {
    child: Child,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    /// The bearer token `api` sends: the configured one, or the one Fulcrum generated into
    /// `token_file()` at start.
    pub token: Option<String>,
    /// The lines of the `[admin]` table, written again by `write_config`.
    admin_table: String,
    /// The network namespace Fulcrum runs in (`start_in`); the API is then reached from inside
    /// it.
    netns: Option<String>,
}

impl Drop for Fulcrum {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fulcrum {
    /// Writes `config` (which must not have an `[admin]` table; one is added on `admin`, with
    /// `token_file` in the test's directory, so Fulcrum generates the token there) and starts
    /// `bin run -c` on it, waiting until the API answers (every listener is bound).
    pub async fn start(bin: &str, admin: SocketAddr, config: &str) -> Result<Fulcrum, String> {
        Self::start_with_token(bin, admin, None, config).await
    }

    /// As `start`, with `token` configured as `admin.token` when given.
    pub async fn start_with_token(
        bin: &str,
        admin: SocketAddr,
        token: Option<&str>,
        config: &str,
    ) -> Result<Fulcrum, String> {
        // The admin address is chosen free by the test (`free_addr`) but bound only when
        // Fulcrum starts: a concurrent test may take it in between. Then Fulcrum starts again
        // on another (the test reaches the API through `Fulcrum::admin`); any other refusal is
        // the test's to see.
        let mut admin = admin;
        for _ in 0..3 {
            let table = Self::admin_table(admin, token);
            match Self::start_inner(bin, admin, &table, token, config, None).await {
                Err(e) if e.contains("(admin.listen): Address already in use") => {
                    admin = crate::free_addr_on_ip(admin.ip());
                }
                r => return r,
            }
        }
        let table = Self::admin_table(admin, token);
        Self::start_inner(bin, admin, &table, token, config, None).await
    }

    /// The `[admin]` lines `start` writes: the given token, or a `token_file` in the test's
    /// directory, so Fulcrum generates the token there.
    fn admin_table(admin: SocketAddr, token: Option<&str>) -> String {
        match token {
            Some(t) => format!("listen = \"{admin}\"\ntoken = \"{t}\"\n"),
            None => format!("listen = \"{admin}\"\ntoken_file = \"admin.token\"\n"),
        }
    }

    /// Starts with `admin_table` as the lines of `[admin]` (relative paths in it are in the
    /// test's directory), reaching the API at `connect`, sending `token` (or, when `None`, the
    /// generated `admin.token` of the test's directory, if there is one).
    pub async fn start_with_admin_table(
        bin: &str,
        connect: SocketAddr,
        admin_table: &str,
        token: Option<&str>,
        config: &str,
    ) -> Result<Fulcrum, String> {
        Self::start_inner(bin, connect, admin_table, token, config, None).await
    }

    /// As `start`, inside network namespace `netns` (`ip netns exec`); `api` then talks to the
    /// admin address from inside that namespace (with curl).
    pub async fn start_in(
        netns: &str,
        bin: &str,
        admin: SocketAddr,
        config: &str,
    ) -> Result<Fulcrum, String> {
        let table = Self::admin_table(admin, None);
        Self::start_inner(bin, admin, &table, None, config, Some(netns)).await
    }

    async fn start_inner(
        bin: &str,
        admin: SocketAddr,
        admin_table: &str,
        token: Option<&str>,
        config: &str,
        netns: Option<&str>,
    ) -> Result<Fulcrum, String> {
        // FULCRUM_TEST_BINARY runs the black-box tests against another build of the same
        // source, e.g. the BOLT-laid-out binary of scripts/release-bolt.sh.
        let other_build = std::env::var("FULCRUM_TEST_BINARY").ok();
        let bin = other_build.as_deref().unwrap_or(bin);
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config_path = dir.path().join("fulcrum.toml");
        let full = Self::with_admin(admin_table, config);
        std::fs::write(&config_path, full).map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(dir.path().join("fulcrum.log")).map_err(|e| e.to_string())?;
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let child = command
            .args(["run", "-c"])
            .arg(&config_path)
            .env(
                "RUST_LOG",
                std::env::var("FULCRUM_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e}"))?;
        let mut f = Fulcrum {
            child,
            admin,
            dir,
            config_path,
            token: token.map(String::from),
            admin_table: admin_table.to_string(),
            netns: netns.map(String::from),
        };
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = f.child.try_wait() {
                return Err(format!(
                    "fulcrum exited with {status} before it was ready:\n{}",
                    f.logs()
                ));
            }
            let read_token = |f: &mut Fulcrum| {
                if f.token.is_none() {
                    f.token = std::fs::read_to_string(f.token_file())
                        .ok()
                        .map(|t| t.trim().to_string())
                        .filter(|t| !t.is_empty());
                }
            };
            read_token(&mut f);
            if let Ok(r) = f.api("GET", "/api/v1/status", None).await {
                if r.status == 200 {
                    // The status answers without a token on loopback: the generated one may have
                    // been written after the read above.
                    read_token(&mut f);
                    return Ok(f);
                }
            }
            if Instant::now() > end {
                return Err(format!("fulcrum not ready after 20s:\n{}", f.logs()));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn with_admin(admin_table: &str, config: &str) -> String {
        format!("[admin]\n{admin_table}\n{config}")
    }

    /// The configuration file Fulcrum runs with.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config_path
    }

    /// The bearer token the API wants (configured or generated).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Where `start` has Fulcrum generate its token.
    pub fn token_file(&self) -> PathBuf {
        self.dir.path().join("admin.token")
    }

    /// Replaces the config file (the admin table is added as at start); apply with `reload`.
    pub fn write_config(&self, config: &str) {
        let full = Self::with_admin(&self.admin_table, config);
        let _ = std::fs::write(&self.config_path, full);
    }

    /// Replaces the config file with `text` as it is (an `[admin]` table included).
    pub fn write_raw_config(&self, text: &str) {
        let _ = std::fs::write(&self.config_path, text);
    }

    pub async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<HttpResponse, String> {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("Authorization", a.as_str()));
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        match &self.netns {
            None => http_request(self.admin, method, path, &headers, body.as_bytes()).await,
            Some(ns) => self.api_in(ns, method, path, &headers, &body).await,
        }
    }

    /// One API request from inside `ns`, with curl (the test process stays in its own
    /// namespace).
    async fn api_in(
        &self,
        ns: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<HttpResponse, String> {
        let url = format!("http://{}{path}", self.admin);
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", ns, "curl", "-s", "-m", "5", "-X", method]);
        for (k, v) in headers {
            cmd.arg("-H").arg(format!("{k}: {v}"));
        }
        if !body.is_empty() {
            cmd.arg("--data-binary").arg(body);
        }
        cmd.args(["-w", "\n%{http_code}", &url]);
        let out = cmd.output().await.map_err(|e| format!("curl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let status: u16 = code.trim().parse().map_err(|_| format!("curl: {text}"))?;
        if status == 0 {
            return Err(format!("curl: no answer from {url}"));
        }
        Ok(HttpResponse {
            status,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        })
    }

    /// GET an API path and return its JSON (Null on any failure).
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        self.api("GET", path, None)
            .await
            .map(|r| r.json())
            .unwrap_or_default()
    }

    /// The member object of `pool` with `address`, from `/api/v1/pools/{pool}`.
    pub async fn member(&self, pool: &str, address: &str) -> serde_json::Value {
        let p = self.get_json(&format!("/api/v1/pools/{pool}")).await;
        p["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["address"] == address).cloned())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) with our own child's pid and a valid signal number touches no memory.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    /// Waits for the process to exit, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fulcrum.log")).unwrap_or_default()
    }
}
