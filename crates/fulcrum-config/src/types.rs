//! `FromNode` for the value types a config uses: scalars, durations, sizes, addresses, prefixes.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

use ipnet::IpNet;

use crate::reader::{Cx, FromNode, Node, Shape, TableReader};

impl FromNode for String {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Str(s) => Some(s.to_string()),
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

impl FromNode for bool {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Bool(b) => Some(b),
            _ => {
                cx.error(
                    node,
                    format!("expected true or false, found {}", node.type_name()),
                );
                None
            }
        }
    }
}

impl FromNode for f64 {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Float(f) => Some(f),
            Shape::Int(i) => Some(i as f64),
            _ => {
                cx.error(
                    node,
                    format!("expected a number, found {}", node.type_name()),
                );
                None
            }
        }
    }
}

macro_rules! integer_from_node {
    ($($t:ty),*) => {$(
        impl FromNode for $t {
            fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
                match node.shape() {
                    Shape::Int(i) => match <$t>::try_from(i) {
                        Ok(v) => Some(v),
                        Err(_) => {
                            cx.error(node, format!(
                                "{i} is out of range; expected an integer from {} to {}",
                                <$t>::MIN, <$t>::MAX
                            ));
                            None
                        }
                    },
                    _ => {
                        cx.error(node, format!("expected an integer, found {}", node.type_name()));
                        None
                    }
                }
            }
        }
    )*};
}
integer_from_node!(u8, u16, u32, u64, usize, i32, i64);

impl<T: FromNode> FromNode for Vec<T> {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Array(items) => {
                // Keep the elements that were read: the failed ones have their errors recorded, and
                // the rest still get their own checks, so one mistake does not hide the others.
                let read: Vec<T> = items
                    .iter()
                    .filter_map(|item| T::from_node(item, cx))
                    .collect();
                if read.len() < items.len() {
                    cx.failed.insert(node.path.clone());
                }
                Some(read)
            }
            _ => {
                cx.error(
                    node,
                    format!("expected an array, found {}", node.type_name()),
                );
                None
            }
        }
    }
}

/// A key that takes either one value or an array of them (`listen = "a"` or `listen = ["a", "b"]`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OneOrMany<T>(pub Vec<T>);

impl<T: FromNode> FromNode for OneOrMany<T> {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Array(_) => Vec::<T>::from_node(node, cx).map(OneOrMany),
            _ => T::from_node(node, cx).map(|v| OneOrMany(vec![v])),
        }
    }
}

/// An ordered string-keyed map (`header = { "X-Env" = "^canary$" }`); order is the file's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValues<T>(pub Vec<(String, T)>);

impl<T: FromNode> FromNode for KeyValues<T> {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Table(entries) => {
                let mut out = Vec::with_capacity(entries.len());
                let mut ok = true;
                for (k, v) in &entries {
                    match T::from_node(v, cx) {
                        Some(v) => out.push((k.to_string(), v)),
                        None => ok = false,
                    }
                }
                ok.then_some(KeyValues(out))
            }
            _ => {
                cx.error(
                    node,
                    format!("expected a table, found {}", node.type_name()),
                );
                None
            }
        }
    }
}

fn parse_str<T>(
    node: &Node<'_>,
    cx: &mut Cx<'_>,
    what: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Option<T> {
    match node.shape() {
        Shape::Str(s) => match parse(s) {
            Ok(v) => Some(v),
            Err(why) => {
                cx.error(node, format!("invalid {what} {s:?}: {why}"));
                None
            }
        },
        _ => {
            cx.error(
                node,
                format!("expected {what} as a string, found {}", node.type_name()),
            );
            None
        }
    }
}

impl FromNode for Duration {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        parse_str(node, cx, "duration", parse_duration)
    }
}

/// Durations are strings with a unit: "500ms", "2s", "30m", "1h", "1h30m".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim().chars().all(|c| c.is_ascii_digit()) {
        return Err("a unit is required, e.g. \"500ms\", \"2s\", \"30m\"".into());
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}; expected e.g. \"500ms\", \"2s\", \"30m\""))
}

impl FromNode for SocketAddr {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        parse_str(node, cx, "address", |s| {
            s.parse::<SocketAddr>().map_err(|_| {
                if s.parse::<IpAddr>().is_ok() {
                    "a port is required: ip:port, or [ipv6]:port".to_string()
                } else {
                    "expected ip:port, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\"".to_string()
                }
            })
        })
    }
}

impl FromNode for IpAddr {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        parse_str(node, cx, "IP address", |s| {
            s.parse::<IpAddr>()
                .map_err(|_| "expected an IPv4 or IPv6 address".to_string())
        })
    }
}

impl FromNode for IpNet {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        parse_str(node, cx, "address prefix", parse_prefix)
    }
}

/// A CIDR prefix; a bare address is its own host prefix. Host bits beyond the prefix are cleared.
pub fn parse_prefix(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| "expected a prefix such as \"192.0.2.0/24\" or \"2001:db8::/32\"".to_string())
}

/// A byte size: an integer, or a string with a unit ("256MiB", "8MB", "64k").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl FromNode for ByteSize {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Int(i) if i >= 0 => Some(ByteSize(i as u64)),
            _ => parse_str(node, cx, "size", parse_size).map(ByteSize),
        }
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| "expected a number with an optional unit, e.g. \"256MiB\"".to_string())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?}; use B, KB, KiB, MB, MiB, GB or GiB"
            ))
        }
    };
    n.checked_mul(mult).ok_or_else(|| "too large".to_string())
}

/// Declares a config enum read from a fixed set of strings, with a "did you mean" on a typo.
#[macro_export]
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            pub const ALL: &'static [&'static str] = &[$($s),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),+ }
            }
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl $crate::reader::FromNode for $name {
            fn from_node(node: &$crate::reader::Node<'_>, cx: &mut $crate::reader::Cx<'_>) -> Option<Self> {
                $crate::types::enum_from_node(node, cx, Self::ALL, Self::parse)
            }
        }
    };
}

pub fn enum_from_node<T>(
    node: &Node<'_>,
    cx: &mut Cx<'_>,
    all: &'static [&'static str],
    parse: fn(&str) -> Option<T>,
) -> Option<T> {
    match node.shape() {
        Shape::Str(s) => parse(s).or_else(|| {
            let hint = crate::error::did_you_mean(s, all.iter().copied())
                .map(|m| format!(" (did you mean {m:?}?)"))
                .unwrap_or_default();
            cx.error(
                node,
                format!(
                    "unknown value {s:?}; expected one of: {}{hint}",
                    all.join(", ")
                ),
            );
            None
        }),
        _ => {
            cx.error(
                node,
                format!(
                    "expected one of: {}; found {}",
                    all.join(", "),
                    node.type_name()
                ),
            );
            None
        }
    }
}

/// Reads a table-valued type with a closure over its `TableReader`, then reports unknown keys.
pub fn read_table<T>(
    node: &Node<'_>,
    cx: &mut Cx<'_>,
    body: impl FnOnce(&mut TableReader<'_>, &mut Cx<'_>) -> Option<T>,
) -> Option<T> {
    let mut t = TableReader::new(node, cx)?;
    let out = body(&mut t, cx);
    t.finish(cx);
    out
}

/// Linux's IFNAMSIZ less the terminating NUL.
const IFNAME_MAX: usize = 15;

/// What an interface name may be here: the names reach the nftables ruleset Fulcrum writes
/// (inside quotes), where a quote, a brace or a newline would change the ruleset. Letters,
/// digits, '.', '_' and '-' are what interfaces are named in practice and what nft accepts
/// in a quoted name; `.` and `..` are refused by the kernel.
pub(crate) fn ifname_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= IFNAME_MAX
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// "A-B": a range of ports, 1 <= A <= B <= 65535.
pub(crate) fn parse_port_range(text: &str) -> Result<RangeInclusive<u16>, String> {
    let (low, high) = text
        .split_once('-')
        .ok_or_else(|| "expected \"A-B\" with 1 <= A <= B <= 65535".to_string())?;
    let port = |s: &str| match s.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{s:?} is not a port 1..=65535")),
    };
    let (low, high) = (port(low)?, port(high)?);
    if low > high {
        return Err(format!("the first port {low} is above the last {high}"));
    }
    Ok(low..=high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("8MB"), Ok(8_000_000));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert!(parse_size("5 parsecs").is_err());
    }

    #[test]
    fn prefixes_are_truncated() {
        assert_eq!(
            parse_prefix("192.0.2.7/24").unwrap().to_string(),
            "192.0.2.0/24"
        );
        assert_eq!(
            parse_prefix("2001:db8::1").unwrap().to_string(),
            "2001:db8::1/128"
        );
        assert!(parse_prefix("nope").is_err());
    }
}
