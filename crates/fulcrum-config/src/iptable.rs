//! Checks of one `[[ip_table]]` once its keys are read: where its prefixes come from, and the
//! country and continent codes of a GeoIP table. References to tables are checked by
//! `validate`.

use crate::reader::{Cx, FromNode, Node};
use crate::types::read_table;
use ipnet::IpNet;
use std::path::PathBuf;

/// Continent codes of the MaxMind databases.
pub const CONTINENTS: [&str; 7] = ["AF", "AN", "AS", "EU", "NA", "OC", "SA"];

/// Checks of the ip_table at `base` (such as `ip_table[0]`).
pub(crate) fn check(base: &str, t: &IpTable, cx: &mut Cx<'_>) {
    let geo = !t.countries.is_empty() || !t.continents.is_empty();
    if t.cidrs.is_empty() && t.file.is_none() && !geo {
        cx.error_path(
            base,
            "needs `cidrs`, `file`, or `geoip` with `countries`/`continents`",
        );
    }
    if geo && t.geoip.is_none() {
        cx.error_path(
            base,
            "`countries` and `continents` need `geoip`: the MaxMind database to look clients up in",
        );
    }
    if t.geoip.is_some() && !geo {
        cx.error_path(
            &format!("{base}.geoip"),
            "`geoip` needs `countries` or `continents` to say which clients belong to the table",
        );
    }
    for (j, code) in t.countries.iter().enumerate() {
        if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
            cx.error_path(
                &format!("{base}.countries[{j}]"),
                format!("{code:?} is not an ISO 3166-1 country code (two upper-case letters, e.g. \"CN\")"),
            );
        }
    }
    for (j, code) in t.continents.iter().enumerate() {
        if !CONTINENTS.contains(&code.as_str()) {
            cx.error_path(
                &format!("{base}.continents[{j}]"),
                format!(
                    "{code:?} is not a continent code; expected one of: {}",
                    CONTINENTS.join(", ")
                ),
            );
        }
    }
}

#[derive(Debug, Clone)]
pub struct IpTable {
    pub name: String,
    pub cidrs: Vec<IpNet>,
    pub file: Option<PathBuf>,
    /// A MaxMind DB (GeoIP2 / GeoLite2 Country or City) for `countries` and `continents`.
    pub geoip: Option<PathBuf>,
    /// ISO 3166-1 alpha-2 country codes whose clients belong to the table.
    pub countries: Vec<String>,
    /// Continent codes (AF, AN, AS, EU, NA, OC, SA) whose clients belong to the table.
    pub continents: Vec<String>,
}

impl FromNode for IpTable {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let value = IpTable {
                cidrs: t.opt(cx, "cidrs").unwrap_or_default(),
                file: t.opt::<String>(cx, "file").map(PathBuf::from),
                geoip: t.opt::<String>(cx, "geoip").map(PathBuf::from),
                countries: t.opt(cx, "countries").unwrap_or_default(),
                continents: t.opt(cx, "continents").unwrap_or_default(),
                name: name?,
            };
            crate::iptable::check(t.path(), &value, cx);
            Some(value)
        })
    }
}
