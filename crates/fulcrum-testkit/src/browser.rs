//! Headless Chromium driven over the DevTools protocol, for the dashboard's tests.
//!
//! Chromium's `--remote-debugging-pipe` speaks CDP as NUL-terminated JSON on file descriptors 3
//! (commands in) and 4 (replies and events out): no WebSocket, no port, nothing another process
//! on the machine could attach to. The few commands the tests need (navigate, evaluate, click,
//! screenshot, console errors) are a page of code, where a CDP client crate would bring a
//! WebSocket stack and hundreds of generated types; so it is written here.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Where the tests find Chromium (Debian's `chromium` package); `CHROMIUM` overrides.
pub fn chromium_path() -> PathBuf {
    std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

pub struct Browser {
    child: Child,
    to_browser: File,
    from_browser: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Console errors, uncaught exceptions and failed loads seen so far.
    errors: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pipe() -> Result<(RawFd, RawFd), String> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // Move both ends above 100 so the child's dup2 onto 3 and 4 never meets one of them.
    let mut high = [0; 2];
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: `fd` is an open descriptor we own; F_DUPFD_CLOEXEC returns a new one or -1.
        high[i] = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100) };
        // SAFETY: `fd` is open and ours; it is not used again.
        unsafe { libc::close(*fd) };
        if high[i] < 0 {
            return Err(format!("fcntl: {}", std::io::Error::last_os_error()));
        }
    }
    Ok((high[0], high[1]))
}

impl Browser {
    /// Starts a fresh headless Chromium (its own profile directory) with a window of
    /// `width`×`height` and opens one page.
    pub fn launch(width: u32, height: u32) -> Result<Browser, String> {
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (cmd_read, cmd_write) = pipe()?;
        let (out_read, out_write) = pipe()?;
        let mut command = Command::new(chromium_path());
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--mute-audio",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec only dup2 runs, which is async-signal-safe; the source
        // descriptors are >= 100 (see `pipe`), so they differ from 3 and 4, and dup2 clears
        // FD_CLOEXEC on the copies the browser inherits.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(cmd_read, 3) < 0 || libc::dup2(out_write, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let spawned = command.spawn();
        // SAFETY: the child has its copies; the parent's ends for the child are closed once.
        unsafe {
            libc::close(cmd_read);
            libc::close(out_write);
        }
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: our own ends, open and unused elsewhere.
                unsafe {
                    libc::close(cmd_write);
                    libc::close(out_read);
                }
                return Err(format!("cannot start {}: {e}", chromium_path().display()));
            }
        };
        // SAFETY: each descriptor is open, ours, and owned by exactly one File from here.
        let to_browser = unsafe { File::from_raw_fd(cmd_write) };
        let from = unsafe { File::from_raw_fd(out_read) };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(from);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if buf.last() == Some(&0) {
                            buf.pop();
                        }
                        if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to_browser,
            from_browser: rx,
            next_id: 0,
            session: String::new(),
            errors: Vec::new(),
            _profile: profile,
        };
        let target = b.send(None, "Target.createTarget", json!({ "url": "about:blank" }))?;
        let target_id = target["targetId"]
            .as_str()
            .ok_or("createTarget: no targetId")?
            .to_string();
        let attached = b.send(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        )?;
        b.session = attached["sessionId"]
            .as_str()
            .ok_or("attachToTarget: no sessionId")?
            .to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(domain, json!({}))?;
        }
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )?;
        Ok(b)
    }

    fn note_event(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.consoleAPICalled") if p["type"] == "error" || p["type"] == "assert" => {
                let args: Vec<String> = p["args"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|x| {
                                x["value"]
                                    .as_str()
                                    .map(String::from)
                                    .unwrap_or_else(|| x["description"].to_string())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                self.errors
                    .push(format!("console.error: {}", args.join(" ")));
            }
            Some("Runtime.exceptionThrown") => {
                let d = &p["exceptionDetails"];
                self.errors.push(format!(
                    "exception: {} {}",
                    d["text"].as_str().unwrap_or(""),
                    d["exception"]["description"].as_str().unwrap_or("")
                ));
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                self.errors.push(format!(
                    "log: {} {}",
                    p["entry"]["text"].as_str().unwrap_or(""),
                    p["entry"]["url"].as_str().unwrap_or("")
                ));
            }
            _ => {}
        }
    }

    fn send(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to_browser
            .write_all(&bytes)
            .map_err(|e| format!("{method}: write to chromium: {e}"))?;
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.from_browser.recv_timeout(left) {
                Ok(v) if v["id"] == id => {
                    if let Some(e) = v.get("error") {
                        return Err(format!("{method}: {e}"));
                    }
                    return Ok(v["result"].clone());
                }
                Ok(v) => self.note_event(&v),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("{method}: no reply in 30 s"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("{method}: chromium closed the pipe"))
                }
            }
        }
    }

    /// Sends a command to the page and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let session = self.session.clone();
        self.send(Some(&session), method, params)
    }

    /// Reads pending events (console errors) without sending anything.
    fn drain_events(&mut self) {
        while let Ok(v) = self.from_browser.try_recv() {
            self.note_event(&v);
        }
    }

    pub fn navigate(&mut self, url: &str) -> Result<(), String> {
        let r = self.call("Page.navigate", json!({ "url": url }))?;
        if let Some(e) = r.get("errorText").and_then(Value::as_str) {
            return Err(format!("navigate {url}: {e}"));
        }
        Ok(())
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        )?;
        if let Some(d) = r.get("exceptionDetails") {
            return Err(format!("{expression}: {d}"));
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls `expression` until it is truthy (not false, null, 0 or "") or `timeout` passes.
    pub fn wait_for(&mut self, expression: &str, timeout: Duration) -> Result<Value, String> {
        let end = Instant::now() + timeout;
        loop {
            let v = self.eval(expression).unwrap_or(Value::Null);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return Ok(v);
            }
            if Instant::now() > end {
                return Err(format!("{expression} still false after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the middle of the first element matching `selector` with real mouse events.
    pub fn click(&mut self, selector: &str) -> Result<(), String> {
        let sel = serde_json::to_string(selector).map_err(|e| e.to_string())?;
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        ))?;
        let (x, y) = match (at[0].as_f64(), at[1].as_f64()) {
            (Some(x), Some(y)) => (x, y),
            _ => return Err(format!("no element matches {selector}")),
        };
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            )?;
        }
        Ok(())
    }

    /// Saves a PNG of the whole page (not only the window) to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        // From the top, so sticky headers sit where a reader expects them.
        self.eval("window.scrollTo(0, 0)")?;
        let m = self.call("Page.getLayoutMetrics", json!({}))?;
        let size = &m["cssContentSize"];
        let (w, h) = (
            size["width"].as_f64().unwrap_or(1440.0),
            size["height"].as_f64().unwrap_or(900.0),
        );
        let r = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true,
                    "clip": { "x": 0, "y": 0, "width": w, "height": h, "scale": 1 } }),
        )?;
        let data = r["data"].as_str().ok_or("captureScreenshot: no data")?;
        let png = base64_decode(data).ok_or("captureScreenshot: bad base64")?;
        std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Console errors, uncaught exceptions and failed loads so far.
    pub fn errors(&mut self) -> Vec<String> {
        self.drain_events();
        self.errors.clone()
    }
}

/// Standard base64 (the screenshot's encoding); one function does not justify a dependency.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_round_trip() {
        assert_eq!(super::base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(super::base64_decode("aGVsbG8h").unwrap(), b"hello!");
        assert!(super::base64_decode("a$").is_none());
    }
}
