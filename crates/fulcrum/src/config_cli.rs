//! `fulcrum config get|apply|diff|history|rollback`: the configuration API from the shell, so
//! an operator edits the running configuration as a file and applies it all or nothing, with
//! the version it was based on.

use bytes::Bytes;
use clap::Subcommand;
use serde_json::{json, Value};

use crate::cli::{exit, Client, Failure, RawAnswer, Target};

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Prints the running configuration (TOML; --json for JSON); its version goes to stderr.
    Get,
    /// Applies FILE as the whole configuration: checked as `fulcrum check` does, written and
    /// applied all or nothing. Refused when the configuration changed since version
    /// --if-match (default: the version running when the command starts).
    Apply {
        file: std::path::PathBuf,
        /// Only check FILE against the running instance; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The version FILE was based on (from `fulcrum config get`).
        #[arg(long, value_name = "VERSION")]
        if_match: Option<u64>,
    },
    /// Shows what applying FILE would change: the objects, then the lines.
    Diff { file: std::path::PathBuf },
    /// The kept versions: who changed what, when and from where.
    History,
    /// Applies version N again (as a new version).
    Rollback { version: u64 },
}

fn refused(r: &RawAnswer, what: &str) -> Failure {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let said = v["errors"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n  ")
        })
        .or_else(|| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&r.body).trim().to_string());
    let code = match r.status {
        401 | 403 => exit::UNAUTHORIZED,
        _ => exit::REFUSED,
    };
    Failure::new(code, format!("{what}: HTTP {}:\n  {said}", r.status))
}

fn version_of(r: &RawAnswer) -> Option<u64> {
    r.etag.as_deref()?.trim_matches('"').parse().ok()
}

/// The running configuration's text and version.
fn running(c: &Client) -> Result<(String, u64), Failure> {
    let r = c.block_on(c.exchange(
        "GET",
        "/api/v1/config",
        None,
        &[("accept", "application/toml")],
        Bytes::new(),
    ))?;
    if r.status != 200 {
        return Err(refused(&r, "GET /api/v1/config"));
    }
    let version = version_of(&r).unwrap_or(0);
    Ok((String::from_utf8_lossy(&r.body).into_owned(), version))
}

fn read(file: &std::path::Path) -> Result<String, Failure> {
    std::fs::read_to_string(file).map_err(|e| {
        Failure::new(
            exit::REFUSED,
            format!("cannot read {}: {e}", file.display()),
        )
    })
}

pub fn run(t: &Target, cmd: &ConfigCommand) -> Result<(), Failure> {
    let c = Client::new(t)?;
    match cmd {
        ConfigCommand::Get => {
            if t.json {
                let r = c.block_on(c.exchange("GET", "/api/v1/config", None, &[], Bytes::new()))?;
                if r.status != 200 {
                    return Err(refused(&r, "GET /api/v1/config"));
                }
                println!("{}", String::from_utf8_lossy(&r.body));
                eprintln!("version {}", version_of(&r).unwrap_or(0));
            } else {
                let (text, version) = running(&c)?;
                print!("{text}");
                eprintln!("version {version}");
            }
        }
        ConfigCommand::Apply {
            file,
            dry_run,
            if_match,
        } => {
            let text = read(file)?;
            let version = match if_match {
                Some(v) => *v,
                None => running(&c)?.1,
            };
            let path = if *dry_run {
                "/api/v1/config?dry_run=true"
            } else {
                "/api/v1/config"
            };
            let tag = format!("\"{version}\"");
            let r = c.block_on(c.exchange(
                "PUT",
                path,
                Some("application/toml"),
                &[("if-match", &tag)],
                Bytes::from(text),
            ))?;
            if r.status != 200 {
                return Err(refused(&r, &format!("apply {}", file.display())));
            }
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if t.json {
                println!("{v}");
            } else if *dry_run {
                println!(
                    "{}: valid (running version {})",
                    file.display(),
                    v["version"]
                );
            } else {
                println!(
                    "applied {}: version {}, config generation {}",
                    file.display(),
                    v["version"],
                    v["generation"]
                );
            }
        }
        ConfigCommand::Diff { file } => {
            let text = read(file)?;
            let (now, version) = running(&c)?;
            let objects = fulcrum_config::edit::changes(&now, &text);
            if now == text {
                println!("no change from the running version {version}");
                return Ok(());
            }
            println!("against the running version {version}:");
            for o in &objects {
                println!("  {o}");
            }
            println!();
            print!("{}", line_diff(&now, &text));
        }
        ConfigCommand::History => {
            let r = c.call("GET", "/api/v1/config/history", None)?;
            if t.json {
                println!("{r}");
                return Ok(());
            }
            for v in r["versions"].as_array().into_iter().flatten() {
                let at = v["at_ms"].as_u64().unwrap_or(0) / 1000;
                let changes: Vec<&str> = v["changes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!(
                    "{:>5}  {}  {} from {}: {}",
                    v["version"],
                    ago(at),
                    v["who"].as_str().unwrap_or("?"),
                    v["from"].as_str().unwrap_or("?"),
                    changes.join("; ")
                );
            }
        }
        ConfigCommand::Rollback { version } => {
            let r = c.call(
                "POST",
                "/api/v1/config/rollback",
                Some(json!({ "version": version })),
            )?;
            if t.json {
                println!("{r}");
            } else {
                println!(
                    "rolled back to version {version}: now version {}, config generation {}",
                    r["version"], r["generation"]
                );
            }
        }
    }
    Ok(())
}

/// How long ago a Unix time was, as an operator reads it in a list.
fn ago(at: u64) -> String {
    let secs = (crate::cli::unix_now() as u64).saturating_sub(at);
    match secs {
        0..=119 => format!("{secs:>3} s ago"),
        120..=7199 => format!("{:>3} min ago", secs / 60),
        7200..=172_799 => format!("{:>3} h ago", secs / 3600),
        _ => format!("{:>3} d ago", secs / 86_400),
    }
}

/// Lines longer files are compared by object only (the LCS table grows with their product).
const DIFF_LINES: usize = 4000;

/// A unified-style diff of two texts (`-` running, `+` the file), with two lines of context.
/// Written here because a configuration diff needs only this; the longest common subsequence
/// of lines is exact for the sizes it accepts.
pub fn line_diff(a: &str, b: &str) -> String {
    let (x, y): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    if x.len() > DIFF_LINES || y.len() > DIFF_LINES {
        return format!("(files over {DIFF_LINES} lines: the object changes above only)\n");
    }
    let (n, m) = (x.len(), y.len());
    // lcs[i][j]: the common subsequence of x[i..] and y[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if x[i] == y[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && x[i] == y[j] {
            ops.push((' ', x[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // Removals first, as `diff -u` shows a changed line.
            ops.push(('-', x[i]));
            i += 1;
        } else {
            ops.push(('+', y[j]));
            j += 1;
        }
    }
    let near = |k: usize| {
        let lo = k.saturating_sub(2);
        let hi = (k + 3).min(ops.len());
        ops[lo..hi].iter().any(|(op, _)| *op != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (op, line)) in ops.iter().enumerate() {
        if *op == ' ' && !near(k) {
            skipped = true;
            continue;
        }
        if skipped {
            out.push_str("...\n");
            skipped = false;
        }
        out.push(*op);
        out.push(' ');
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_shows_changed_lines_with_context() {
        let a = "a\nb\nc\nd\ne\nf\ng\n";
        let b = "a\nb\nc\nD\ne\nf\ng\nh\n";
        assert_eq!(
            line_diff(a, b),
            "  b\n  c\n- d\n+ D\n  e\n  f\n  g\n+ h\n".replace("  b", "...\n  b")
        );
        assert_eq!(line_diff(a, a), "");
    }
}
