//! Keys of `type = "snmp"` monitors (Fulcrum addition): an SNMP v2c or v3 (USM) GET of one
//! OID, used as a health check and, with `max`, as the source of a member's dynamic weight (the
//! agentless CPU/load feedback of the hardware ADCs).

use crate::reader::{Cx, TableReader};

use crate::string_enum;

string_enum!(
    /// USM authentication (RFC 3414 HMAC-SHA-96, RFC 7860 HMAC-SHA-256-192).
    SnmpAuth {
        Sha1 = "sha1",
        Sha256 = "sha256",
    }
);

string_enum!(
    /// USM privacy (RFC 3826 AES-128-CFB).
    SnmpPriv {
        Aes128 = "aes128",
    }
);

/// SNMPv3 with the User-based Security Model: authNoPriv without `priv_password`, authPriv
/// with it (noAuthNoPriv is not offered: a health signal anyone can forge is no signal).
#[derive(Debug, Clone, PartialEq)]
pub struct SnmpV3 {
    pub user: String,
    pub auth: SnmpAuth,
    pub auth_password: String,
    pub privacy: Option<(SnmpPriv, String)>,
}

/// What an snmp monitor reads and how its value becomes a weight.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnmpOptions {
    /// The v2c community (default "public").
    pub community: String,
    /// `version = "3"`: USM user and keys instead of the community.
    pub v3: Option<SnmpV3>,
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
        let v3 = Self::read_v3(t, cx);
        SnmpOptions {
            community,
            v3,
            oid,
            max: max.filter(|m| m.is_finite() && *m > 0.0),
        }
    }

    fn read_v3(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> Option<SnmpV3> {
        let version = t.opt::<String>(cx, "version");
        let user = t.opt::<String>(cx, "user");
        let auth = t.opt::<SnmpAuth>(cx, "auth_protocol");
        let auth_password = t.opt::<String>(cx, "auth_password");
        let privacy = t.opt::<SnmpPriv>(cx, "priv_protocol");
        let priv_password = t.opt::<String>(cx, "priv_password");
        let v3 = match version.as_deref() {
            None | Some("2c") => false,
            Some("3") => true,
            Some(v) => {
                if let Some(n) = t.node("version") {
                    cx.error(&n, format!("{v:?}: expected \"2c\" or \"3\""));
                }
                return None;
            }
        };
        let mut bad = |key: &'static str, msg: &str| {
            if let Some(n) = t.node(key) {
                cx.error(&n, msg.to_string());
            }
        };
        if !v3 {
            for key in [
                "user",
                "auth_protocol",
                "auth_password",
                "priv_protocol",
                "priv_password",
            ] {
                bad(key, "only with `version = \"3\"`");
            }
            return None;
        }
        // RFC 3414 §11.2: passwords shorter than 8 characters are refused by agents.
        for (key, p) in [
            ("auth_password", &auth_password),
            ("priv_password", &priv_password),
        ] {
            if p.as_ref().is_some_and(|p| p.len() < 8) {
                bad(key, "must be at least 8 characters (RFC 3414)");
            }
        }
        if privacy.is_some() && priv_password.is_none() {
            bad("priv_protocol", "needs `priv_password`");
        }
        match (user, auth_password) {
            (Some(user), Some(auth_password)) if !user.is_empty() => Some(SnmpV3 {
                user,
                auth: auth.unwrap_or(SnmpAuth::Sha256),
                auth_password,
                privacy: priv_password.map(|p| (privacy.unwrap_or(SnmpPriv::Aes128), p)),
            }),
            _ => {
                bad(
                    "version",
                    "`version = \"3\"` needs `user` and `auth_password` (authNoPriv; add `priv_password` for authPriv)",
                );
                None
            }
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
