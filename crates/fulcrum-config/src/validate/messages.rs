//! Cross-checks of message services against the pools they use.

use crate::error::ConfigError;
use crate::schema::Config;

/// Message services' checks that need other sections: the pools they use.
pub(crate) fn validate(cfg: &Config) -> Vec<ConfigError> {
    let loc = &cfg.locations;
    let mut errors = Vec::new();
    for (v, vs) in cfg.virtual_services.iter().enumerate() {
        let Some(section) = vs.as_message() else {
            continue;
        };
        errors.extend(simplex_and_member_requests(cfg, v, vs, section));
        // Member connections of a message service are Fulcrum's own long-lived ones, counted in
        // the member's active connections: a per-member connection cap would stop every message
        // once they are open. `member_connections` is the knob for them.
        if let Some(pool_name) = &vs.pool {
            if let Some((p, pool)) = cfg
                .pools
                .iter()
                .enumerate()
                .find(|(_, p)| &p.name == pool_name)
            {
                for (j, m) in pool.members.iter().enumerate() {
                    if m.max_connections > 0 {
                        errors.push(loc.error(
                            &format!("pool[{p}].member[{j}].max_connections"),
                            format!(
                                "message service {:?} uses this pool: its member connections are Fulcrum's own, set by `member_connections` on the service, so a member's max_connections does not apply",
                                vs.name
                            ),
                        ));
                    }
                }
            }
        }
    }
    errors
}

/// `simplex` and `member_requests` against the pools: the fallback pool exists, and a simplex
/// pool does not re-encrypt (the send and receive connections are plain TCP).
fn simplex_and_member_requests(
    cfg: &Config,
    v: usize,
    vs: &crate::VirtualService,
    section: &crate::MessageSection,
) -> Vec<ConfigError> {
    let loc = &cfg.locations;
    let mut errors = Vec::new();
    if let Some(name) = section
        .member_requests
        .as_ref()
        .and_then(|r| r.fallback_pool.as_ref())
    {
        if !cfg.pools.iter().any(|p| &p.name == name) {
            errors.push(loc.error(
                &format!("virtual_service[{v}].member_requests.fallback_pool"),
                format!("no pool is named {name:?}"),
            ));
        }
    }
    let pools = || {
        vs.pool
            .iter()
            .chain(section.rules.iter().filter_map(|r| match &r.action {
                crate::RuleAction::Pool(p) => Some(p),
                _ => None,
            }))
    };
    if let Some(crate::Simplex::ReceiveListen(_)) = &section.simplex {
        // A member's receive connection is known by its source IP alone.
        for name in pools() {
            let Some((p, pool)) = cfg.pools.iter().enumerate().find(|(_, p)| &p.name == name)
            else {
                continue;
            };
            for (j, m) in pool.members.iter().enumerate() {
                if pool.members[..j]
                    .iter()
                    .any(|o| o.address.ip() == m.address.ip())
                {
                    errors.push(loc.error(
                        &format!("pool[{p}].member[{j}].address"),
                        format!(
                            "message service {:?} has `simplex.receive_listen`: a member's receive connection is known by its source IP, so the members of pool {name:?} need IPs of their own ({} is taken by another member)",
                            vs.name,
                            m.address.ip()
                        ),
                    ));
                }
            }
        }
    }
    if section.simplex.is_some() {
        for name in pools() {
            if cfg.pools.iter().any(|p| &p.name == name && p.tls.is_some()) {
                errors.push(loc.error(
                    &format!("virtual_service[{v}].simplex"),
                    format!(
                        "pool {name:?} re-encrypts (`tls`): simplex member connections are plain TCP; remove the pool's `tls` or `simplex`"
                    ),
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    const BASE: &str = r#"
[[virtual_service]]
name = "m"
listen = "127.0.0.1:7000"
protocol = "message"
pool = "p"
message_mode = "async"
sequence = { offset = 0, length = 12 }
EXTRA

[[pool]]
name = "p"
POOL
[[pool.member]]
address = "127.0.0.1:9001"

[[pool]]
name = "branches"
[[pool.member]]
address = "127.0.0.1:9101"
"#;

    fn config(extra: &str, pool: &str) -> String {
        BASE.replace("EXTRA", extra).replace("POOL", pool)
    }

    fn errors(text: &str) -> Vec<String> {
        match crate::parse(text, "t.toml", std::path::Path::new(".")) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.iter()
                    .map(|e| format!("{}: {}", e.key, e.message))
                    .collect()
            }
        }
    }

    fn has(errors: &[String], want: &str) {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "no error containing {want:?} in {errors:#?}"
        );
    }

    #[test]
    fn simplex_and_member_requests_are_read() {
        let text = config(
            "simplex = { receive_port = 7001 }\nmember_requests = { client_field = { offset = 12, length = 8 }, fallback_pool = \"branches\", marker = { offset = 20, value = \"REQ\" } }",
            "",
        );
        let cfg = crate::parse(&text, "t.toml", std::path::Path::new(".")).expect("valid");
        let m = cfg.virtual_services[0]
            .as_message()
            .expect("a message service");
        assert_eq!(m.simplex, Some(crate::Simplex::ReceivePort(7001)));
        assert_eq!(m.options.member_connections, 1);
        let r = m.member_requests.as_ref().expect("member_requests");
        assert_eq!(
            r.client_field,
            Some(crate::Sequence {
                offset: 12,
                length: 8
            })
        );
        assert_eq!(r.fallback_pool.as_deref(), Some("branches"));
        assert_eq!(
            r.marker.as_ref().map(|m| m.value.as_slice()),
            Some(&b"REQ"[..])
        );
    }

    #[test]
    fn simplex_refuses_what_it_cannot_pair() {
        let e = errors(
            &config("simplex = { receive_port = 7001 }", "")
                .replace("sequence = { offset = 0, length = 12 }", ""),
        );
        has(
            &e,
            "virtual_service[0].simplex: a simplex member answers on another connection",
        );
        let e = errors(&config(
            "simplex = { receive_port = 7001 }\nmember_connections = 4",
            "",
        ));
        has(&e, "virtual_service[0].member_connections: a simplex member has one send and one receive connection; member_connections = 4");
        let e = errors(&config("simplex = { receive_port = 0 }", ""));
        has(&e, "simplex.receive_port: 0 is not a port");
        let e = errors(&config("simplex = { }", ""));
        has(
            &e,
            "simplex: a simplex member answers on a receive connection: write `receive_port`",
        );
        let e = errors(&config(
            "simplex = { receive_port = 7001, receive_listen = \"127.0.0.1:7001\" }",
            "",
        ));
        has(&e, "simplex: the receive connection is opened by Fulcrum (`receive_port`) or by the member (`receive_listen`), not both");
        let text = config("simplex = { receive_listen = \"127.0.0.1:7001\" }", "");
        let cfg = crate::parse(&text, "t.toml", std::path::Path::new(".")).expect("valid");
        assert_eq!(
            cfg.virtual_services[0]
                .as_message()
                .and_then(|m| m.simplex.clone()),
            Some(crate::Simplex::ReceiveListen(
                "127.0.0.1:7001".parse().unwrap()
            ))
        );
        let e = errors(&config(
            "simplex = { receive_port = 7001 }",
            "tls = { verify = false }",
        ));
        has(&e, "virtual_service[0].simplex: pool \"p\" re-encrypts");
        let e = errors(&config(
            "simplex = { receive_listen = \"127.0.0.1:7001\" }",
            "[[pool.member]]\naddress = \"127.0.0.1:9002\"",
        ));
        has(&e, "pool[0].member[1].address: message service \"m\" has `simplex.receive_listen`: a member's receive connection is known by its source IP");
    }

    #[test]
    fn member_requests_refuse_wrong_combinations() {
        let e = errors(&config("member_requests = { }", ""));
        has(
            &e,
            "member_requests: a member's request needs somewhere to go",
        );
        let e = errors(&config(
            "member_requests = { client_field = { offset = 12 } }",
            "",
        ));
        has(
            &e,
            "member_requests.client_field: missing required key `length`",
        );
        let e = errors(&config(
            "member_requests = { fallback_pool = \"nowhere\" }",
            "",
        ));
        has(
            &e,
            "virtual_service[0].member_requests.fallback_pool: no pool is named \"nowhere\"",
        );
        let sync = config("member_requests = { fallback_pool = \"branches\" }", "").replace(
            "message_mode = \"async\"\nsequence = { offset = 0, length = 12 }",
            "message_mode = \"sync\"",
        );
        has(&errors(&sync), "virtual_service[0].member_requests: a member's own requests share its connections with the answers Fulcrum waits for; sync mode");
        let unpaired = config("member_requests = { fallback_pool = \"branches\" }", "")
            .replace("sequence = { offset = 0, length = 12 }", "");
        has(
            &errors(&unpaired),
            "virtual_service[0].member_requests: a member's own request is told from an answer",
        );
        let e = errors(&config(
            "framing = { max_message = 16 }\nmember_requests = { client_field = { offset = 12, length = 8 } }",
            "",
        ));
        has(&e, "member_requests.client_field: the field at bytes 12..20 of the body lies beyond max_message (16 bytes)");
        let e = errors(&config(
            "member_requests = { fallback_pool = \"branches\", marker = { offset = 0, value = \"\" } }",
            "",
        ));
        has(
            &e,
            "member_requests.marker.value: a marker of 0 bytes is not supported",
        );
    }
}
