//! The section of a `protocol = "rtsp"` virtual service (RTSP/1.0, RFC 2326): a tcp service
//! whose messages are read. It shares the stream keys with tcp, neither TLS termination (the
//! messages must stay readable) nor in-kernel forwarding (Fulcrum rewrites `Transport` and
//! relays the media). Its rules are http rules matching the RTSP URL and headers of a
//! connection's first request: the same keys, read by the same code, less the conditions and
//! actions only HTTP has (cookies, redirects, local answers, header edits).

use crate::forwarding::ForwardingOptions;
use crate::reader::{Cx, TableReader};
use crate::rule::Rule;
use crate::stream::StreamOptions;
use crate::tcp::{PortRange, RtspOptions, TcpSection};

/// The keys only `protocol = "rtsp"` takes.
pub const RTSP_KEYS: &[&str] = &["rtsp_rtp_ports"];

/// Conditions and actions of http rules that an RTSP request cannot use.
const NOT_RTSP: &[(&str, &str)] = &[
    (
        "cookie",
        "RTSP requests carry no cookies; match a `header` instead",
    ),
    ("redirect", "answers an HTTP request"),
    ("redirect_status", "answers an HTTP request"),
    ("respond", "answers an HTTP request"),
    ("body", "answers an HTTP request"),
    ("request_headers", "edits an HTTP request"),
    ("response_headers", "edits an HTTP request"),
    ("rewrite_path", "edits an HTTP request"),
    (
        "destination_port",
        "is a condition of tcp / udp / message rules",
    ),
    ("time", "is a condition of tcp / udp / message rules"),
];

pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> TcpSection {
    let stream = StreamOptions::read(t, cx);
    let rtp_ports = t.opt::<PortRange>(cx, "rtsp_rtp_ports").map(|r| r.0);
    let at = t.path().to_string();
    if let Some(r) = &rtp_ports {
        // A pair is an even port and the next one (RFC 3550 §11).
        let first_even = r.start() + r.start() % 2;
        if first_even >= *r.end() {
            cx.error_path(
                &format!("{at}.rtsp_rtp_ports"),
                format!(
                    "\"{}-{}\" holds no pair of ports (an even port for RTP and the next one for RTCP): give at least two ports starting at an even one",
                    r.start(),
                    r.end()
                ),
            );
        }
    }
    let rules: Vec<Rule> = t.opt(cx, "rule").unwrap_or_default();
    for (r, rule) in rules.iter().enumerate() {
        let rule_at = format!("{at}.rule[{r}]");
        for (key, why) in NOT_RTSP {
            let path = format!("{rule_at}.{key}");
            if cx.written(&path) {
                cx.error_path(
                    &path,
                    format!(
                        "`{key}` {why}; rules of rtsp services take the conditions `host`, `path`, `path_prefix`, `path_regex`, `method`, `header`, `query`, `user_agent` and `source` and the actions `pool` and `drop = true`"
                    ),
                );
            }
        }
        crate::http::check_rule(&rule_at, rule, cx);
    }
    TcpSection {
        stream,
        tls: None,
        forwarding: ForwardingOptions::default(),
        ftp: None,
        rtsp: Some(RtspOptions { rtp_ports }),
        rules,
    }
}

#[cfg(test)]
mod tests {
    use crate::Protocol;

    fn errs(text: &str) -> Vec<String> {
        match crate::parse(text, "t.toml", std::path::Path::new(".")) {
            Ok(_) => Vec::new(),
            Err(e) => e.messages(),
        }
    }

    fn service(extra: &str) -> String {
        format!(
            "[[virtual_service]]\nname = \"cam\"\nlisten = \"127.0.0.1:554\"\nprotocol = \"rtsp\"\npool = \"a\"\n{extra}\n[[pool]]\nname = \"a\"\n[[pool]]\nname = \"b\"\n"
        )
    }

    fn has(errors: &[String], wanted: &str) {
        assert!(
            errors.iter().any(|e| e.contains(wanted)),
            "no error containing {wanted:?} in {errors:#?}"
        );
    }

    #[test]
    fn an_rtsp_service_with_url_rules_and_session_persistence() {
        let text = service(
            "persistence = \"sess\"\nrtsp_rtp_ports = \"40000-40099\"\n[[virtual_service.rule]]\npath_prefix = \"/b\"\nheader = { user-agent = \"^Lavf\" }\npool = \"b\"\n[[persistence]]\nname = \"sess\"\ntype = \"rtsp_session\"\ntimeout = \"2m\"",
        );
        let cfg = crate::parse(&text, "t.toml", std::path::Path::new(".")).expect("valid");
        let vs = &cfg.virtual_services[0];
        assert_eq!(vs.protocol(), Protocol::Rtsp);
        let rtsp = vs.as_tcp().and_then(|t| t.rtsp.as_ref()).expect("rtsp");
        assert_eq!(rtsp.rtp_ports, Some(40000..=40099));
        assert_eq!(vs.rules().len(), 1);
        assert!(!vs.in_kernel());
    }

    #[test]
    fn wrong_combinations_are_refused_with_their_keys() {
        has(
            &errs(&service("forwarding = \"nat\"")),
            "virtual_service[0].forwarding: `forwarding` applies to protocol tcp / udp",
        );
        has(
            &errs(&service("tls = [{ cert = \"c.pem\", key = \"k.pem\" }]")),
            "virtual_service[0].tls: `tls` applies to protocol tcp / https / message; this service is rtsp",
        );
        has(
            &errs(&service("rtsp_rtp_ports = \"40001-40002\"")),
            "virtual_service[0].rtsp_rtp_ports: \"40001-40002\" holds no pair of ports",
        );
        let e = errs(&service(
            "[[virtual_service.rule]]\ncookie = { a = \"b\" }\ndestination_port = 554\nrespond = 403",
        ));
        has(
            &e,
            "virtual_service[0].rule[0].cookie: `cookie` RTSP requests carry no cookies",
        );
        has(&e, "virtual_service[0].rule[0].destination_port: `destination_port` is a condition of tcp / udp / message rules");
        has(
            &e,
            "virtual_service[0].rule[0].respond: `respond` answers an HTTP request",
        );
        has(
            &errs(&service(
                "[[virtual_service.rule]]\npath_regex = \"(\"\npool = \"b\"",
            )),
            "virtual_service[0].rule[0].path_regex",
        );
        // rtsp_session persistence belongs to rtsp services, and rtsp keys to rtsp.
        let text = "[[virtual_service]]\nname = \"t\"\nlisten = \"127.0.0.1:80\"\nprotocol = \"tcp\"\npool = \"a\"\npersistence = \"sess\"\nrtsp_rtp_ports = \"40000-40099\"\n[[pool]]\nname = \"a\"\n[[persistence]]\nname = \"sess\"\ntype = \"rtsp_session\"\n";
        let e = errs(text);
        has(&e, "virtual_service[0].persistence: persistence \"sess\" is of type rtsp_session, which does not apply to protocol tcp");
        has(&e, "virtual_service[0].rtsp_rtp_ports: `rtsp_rtp_ports` applies to protocol rtsp; this service is tcp");
        // Cookie persistence needs HTTP.
        let e = errs(&service(
            "persistence = \"c\"\n[[persistence]]\nname = \"c\"\ntype = \"cookie_insert\"",
        ));
        has(
            &e,
            "persistence \"c\" is of type cookie_insert, which does not apply to protocol rtsp",
        );
    }
}
