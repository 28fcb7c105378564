//! Keys of `type = "snmp"` monitors (Fulcrum addition): an SNMP v2c GET of one OID, used as a
//! health check and, with `max`, as the source of a member's dynamic weight (the agentless
//! CPU/load feedback of the hardware ADCs).

use crate::reader::{Cx, TableReader};

/// What an snmp monitor reads and how its value becomes a weight.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnmpOptions {
    /// The v2c community (default "public").
    pub community: String,
    /// The OID read, as numbers: "1.3.6.1.4.1.2021.10.1.5.1" (UCD-SNMP-MIB laLoadInt.1).
    pub oid: Option<Vec<u32>>,
    /// With `max`, the value sets the member's weight percentage:
    /// 100 × (max − value) ÷ max, from 1 % to 100 %, as an agent's `NN%` would.
    pub max: Option<f64>,
}

/// "1.3.6.1.2.1.1.3.0" (a leading dot allowed) → numbers; at least two arcs, the first 0–2.
pub fn parse_oid(s: &str) -> Result<Vec<u32>, String> {
    let arcs: Result<Vec<u32>, _> = s
        .trim()
        .trim_start_matches('.')
        .split('.')
        .map(str::parse::<u32>)
        .collect();
    match arcs {
        Ok(a) if a.len() >= 2 && a.len() <= 128 && a[0] <= 2 && (a[0] == 2 || a[1] < 40) => Ok(a),
        _ => Err(format!(
            "{s:?} is not a numeric OID, e.g. \"1.3.6.1.4.1.2021.10.1.5.1\""
        )),
    }
}

impl SnmpOptions {
    pub fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> SnmpOptions {
        let community = t
            .opt::<String>(cx, "community")
            .unwrap_or_else(|| "public".to_string());
        let oid = t
            .opt::<String>(cx, "oid")
            .and_then(|s| match parse_oid(&s) {
                Ok(o) => Some(o),
                Err(e) => {
                    if let Some(n) = t.node("oid") {
                        cx.error(&n, e);
                    }
                    None
                }
            });
        let max = t.opt::<f64>(cx, "max");
        if let Some(m) = max {
            if !(m.is_finite() && m > 0.0) {
                if let Some(n) = t.node("max") {
                    cx.error(&n, format!("must be a number above 0, found {m}"));
                }
            }
        }
        SnmpOptions {
            community,
            oid,
            max: max.filter(|m| m.is_finite() && *m > 0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn oids() {
        assert_eq!(
            super::parse_oid(".1.3.6.1.2.1.1.3.0").unwrap(),
            [1, 3, 6, 1, 2, 1, 1, 3, 0]
        );
        assert!(super::parse_oid("1").is_err());
        assert!(super::parse_oid("1.3.x").is_err());
        assert!(super::parse_oid("3.1").is_err());
        assert!(super::parse_oid("1.40").is_err());
    }
}
