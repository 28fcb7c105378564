//! Checks of one `[[ip_table]]` once its keys are read: where its prefixes come from, the
//! country and continent codes, and the AS numbers. References to tables are checked by
//! `validate`.

use crate::reader::{Cx, FromNode, Node};
use crate::types::read_table;
use ipnet::IpNet;
use std::path::PathBuf;

/// Continent codes of the MaxMind databases.
pub const CONTINENTS: [&str; 7] = ["AF", "AN", "AS", "EU", "NA", "OC", "SA"];

/// ISO 3166-1 alpha-2 codes officially assigned, and XK (Kosovo, user-assigned, used by the
/// registries and the GeoIP databases).
pub const COUNTRIES: [&str; 250] = [
    "AD", "AE", "AF", "AG", "AI", "AL", "AM", "AO", "AQ", "AR", "AS", "AT", "AU", "AW", "AX", "AZ",
    "BA", "BB", "BD", "BE", "BF", "BG", "BH", "BI", "BJ", "BL", "BM", "BN", "BO", "BQ", "BR", "BS",
    "BT", "BV", "BW", "BY", "BZ", "CA", "CC", "CD", "CF", "CG", "CH", "CI", "CK", "CL", "CM", "CN",
    "CO", "CR", "CU", "CV", "CW", "CX", "CY", "CZ", "DE", "DJ", "DK", "DM", "DO", "DZ", "EC", "EE",
    "EG", "EH", "ER", "ES", "ET", "FI", "FJ", "FK", "FM", "FO", "FR", "GA", "GB", "GD", "GE", "GF",
    "GG", "GH", "GI", "GL", "GM", "GN", "GP", "GQ", "GR", "GS", "GT", "GU", "GW", "GY", "HK", "HM",
    "HN", "HR", "HT", "HU", "ID", "IE", "IL", "IM", "IN", "IO", "IQ", "IR", "IS", "IT", "JE", "JM",
    "JO", "JP", "KE", "KG", "KH", "KI", "KM", "KN", "KP", "KR", "KW", "KY", "KZ", "LA", "LB", "LC",
    "LI", "LK", "LR", "LS", "LT", "LU", "LV", "LY", "MA", "MC", "MD", "ME", "MF", "MG", "MH", "MK",
    "ML", "MM", "MN", "MO", "MP", "MQ", "MR", "MS", "MT", "MU", "MV", "MW", "MX", "MY", "MZ", "NA",
    "NC", "NE", "NF", "NG", "NI", "NL", "NO", "NP", "NR", "NU", "NZ", "OM", "PA", "PE", "PF", "PG",
    "PH", "PK", "PL", "PM", "PN", "PR", "PS", "PT", "PW", "PY", "QA", "RE", "RO", "RS", "RU", "RW",
    "SA", "SB", "SC", "SD", "SE", "SG", "SH", "SI", "SJ", "SK", "SL", "SM", "SN", "SO", "SR", "SS",
    "ST", "SV", "SX", "SY", "SZ", "TC", "TD", "TF", "TG", "TH", "TJ", "TK", "TL", "TM", "TN", "TO",
    "TR", "TT", "TV", "TW", "TZ", "UA", "UG", "UM", "US", "UY", "UZ", "VA", "VC", "VE", "VG", "VI",
    "VN", "VU", "WF", "WS", "XK", "YE", "YT", "ZA", "ZM", "ZW",
];

/// Why an AS number can never be found in the shipped table (RFC 7607, 6793, 5398, 6996,
/// 7300), or `None` for a public one.
fn unroutable_asn(asn: u32) -> Option<&'static str> {
    match asn {
        0 => Some("is reserved (RFC 7607)"),
        23456 => Some("is AS_TRANS (RFC 6793), a stand-in for 4-byte AS numbers"),
        64496..=64511 | 65536..=65551 => Some("is reserved for documentation (RFC 5398)"),
        64512..=65534 | 4_200_000_000..=4_294_967_294 => {
            Some("is a private-use AS number (RFC 6996)")
        }
        65535 | 4_294_967_295 => Some("is reserved (RFC 7300)"),
        _ => None,
    }
}

/// Checks of the ip_table at `base` (such as `ip_table[0]`).
pub(crate) fn check(base: &str, t: &IpTable, cx: &mut Cx<'_>) {
    if t.cidrs.is_empty()
        && t.file.is_none()
        && t.asns.is_empty()
        && t.countries.is_empty()
        && t.continents.is_empty()
    {
        cx.error_path(
            base,
            "needs `cidrs`, `file`, `asns`, `countries`, or `geoip` with `continents`",
        );
    }
    if !t.continents.is_empty() && t.geoip.is_none() {
        cx.error_path(
            &format!("{base}.continents"),
            "`continents` need `geoip`: the MaxMind database to look clients up in \
             (`countries` and `asns` work without it, from the table Fulcrum ships)",
        );
    }
    if t.geoip.is_some() && t.countries.is_empty() && t.continents.is_empty() {
        cx.error_path(
            &format!("{base}.geoip"),
            "`geoip` needs `countries` or `continents` to say which clients belong to the table",
        );
    }
    for (j, &asn) in t.asns.iter().enumerate() {
        if let Some(why) = unroutable_asn(asn) {
            cx.error_path(
                &format!("{base}.asns[{j}]"),
                format!("{asn} {why}: no public route carries it; expected a public AS number"),
            );
        }
    }
    for (j, code) in t.countries.iter().enumerate() {
        if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
            cx.error_path(
                &format!("{base}.countries[{j}]"),
                format!("{code:?} is not an ISO 3166-1 country code (two upper-case letters, e.g. \"CN\")"),
            );
        } else if !COUNTRIES.contains(&code.as_str()) {
            cx.error_path(
                &format!("{base}.countries[{j}]"),
                format!("{code:?} is not an ISO 3166-1 country code: no country has it"),
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
    /// ISO 3166-1 alpha-2 country codes whose clients belong to the table: from `geoip` when
    /// it is set, else from the table Fulcrum ships.
    pub countries: Vec<String>,
    /// AS numbers whose announced prefixes belong to the table, from the table Fulcrum ships.
    pub asns: Vec<u32>,
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
                asns: t.opt(cx, "asns").unwrap_or_default(),
                continents: t.opt(cx, "continents").unwrap_or_default(),
                name: name?,
            };
            crate::iptable::check(t.path(), &value, cx);
            Some(value)
        })
    }
}
