//! Applies nftables text in one transaction.
//!
//! nftables is programmed through `nft -f -`, the tool nftables ships, with the native syntax.
//! Why not a crate: the kernel's interface is nf_tables netlink, whose message format is private
//! to libnftnl (a C library) and changes with kernel features; no maintained Rust crate speaks
//! it. The `nftables` crate on crates.io drives this same `nft` binary through its JSON mode,
//! which adds a schema layer but no capability, and whose typed expressions lag the ones used
//! here (`numgen`, `jhash … map`, interval maps). One `nft -f` run is one atomic transaction:
//! the table is replaced whole or not at all, and a failure leaves the previous one working.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `nft -f -` with `script`; the error carries nft's message.
pub fn apply(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e} (is the nftables package installed?)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let msg = String::from_utf8_lossy(&out.stderr);
        Err(format!("nft refused the ruleset: {}", msg.trim()))
    }
}

/// Reads the packet counters of the named counters in Fulcrum's table: `(name, packets)`.
pub fn counters(table: &str) -> Vec<(String, u64)> {
    let Ok(out) = Command::new("nft")
        .args(["-j", "list", "counters", "table", "inet", table])
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return Vec::new();
    };
    v["nftables"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|it| {
                    let c = it.get("counter")?;
                    Some((c["name"].as_str()?.to_string(), c["packets"].as_u64()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Flows in the connection table per connection mark, from `conntrack -L` (conntrack-tools).
/// Only least-connections link pools need it: a dump per second costs about a microsecond per
/// tracked flow.
pub fn flows_by_mark() -> std::collections::HashMap<u32, u64> {
    let mut out = std::collections::HashMap::new();
    let Ok(o) = Command::new("conntrack")
        .args(["-L", "-f", "ipv4"])
        .stderr(Stdio::null())
        .output()
    else {
        return out;
    };
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if let Some(mark) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("mark="))
            .and_then(|m| m.parse::<u32>().ok())
        {
            *out.entry(mark).or_insert(0) += 1;
        }
    }
    out
}

/// Destinations of the flows in the connection table, per connection mark (original
/// direction), from `conntrack -L`; for `rtt` pools, which measure the prefixes the LAN uses.
pub fn destinations_by_mark() -> std::collections::HashMap<u32, Vec<std::net::Ipv4Addr>> {
    let mut out: std::collections::HashMap<u32, Vec<std::net::Ipv4Addr>> = Default::default();
    let Ok(o) = Command::new("conntrack")
        .args(["-L", "-f", "ipv4"])
        .stderr(Stdio::null())
        .output()
    else {
        return out;
    };
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let mut words = line.split_whitespace();
        let dst = words
            .clone()
            .find_map(|w| w.strip_prefix("dst="))
            .and_then(|d| d.parse().ok());
        let mark = words
            .find_map(|w| w.strip_prefix("mark="))
            .and_then(|m| m.parse::<u32>().ok());
        if let (Some(dst), Some(mark)) = (dst, mark) {
            let v = out.entry(mark).or_default();
            if !v.contains(&dst) && v.len() < 1024 {
                v.push(dst);
            }
        }
    }
    out
}
