use std::path::Path;
use std::time::Duration;

use super::*;

fn ok(text: &str) -> Config {
    match parse(text, "t.toml", Path::new("/etc/fulcrum")) {
        Ok(c) => c,
        Err(e) => panic!("unexpected errors:\n{e}"),
    }
}

fn errs(text: &str) -> Vec<String> {
    match parse(text, "t.toml", Path::new("/etc/fulcrum")) {
        Ok(_) => panic!("config was accepted:\n{text}"),
        Err(e) => e.messages(),
    }
}

fn has(errors: &[String], needle: &str) {
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "no error contains {needle:?}; got:\n{}",
        errors.join("\n")
    );
}

const TCP: &str = r#"
[[virtual_service]]
name = "db"
listen = "127.0.0.1:5000"
protocol = "tcp"
pool = "db"
persistence = "src"

[[pool]]
name = "db"
algorithm = "weighted_round_robin"
monitors = ["tcp"]
slow_start = { recovery = "5s", warm = "30s" }

[[pool.member]]
address = "127.0.0.1:9001"
weight = 3

[[pool.member]]
address = "[::1]:9002"
state = "drain"

[[monitor]]
name = "tcp"
type = "tcp"

[[persistence]]
name = "src"
type = "source_ip"
source_mask = 24
"#;

#[test]
fn reads_the_tcp_contract_with_defaults() {
    let c = ok(TCP);
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9900");
    let vs = &c.virtual_services[0];
    assert_eq!(vs.listen.len(), 1);
    assert_eq!(vs.protocol(), Protocol::Tcp);
    assert_eq!(vs.idle_timeout, Duration::from_secs(300));
    let p = &c.pools[0];
    assert_eq!(p.algorithm, Algorithm::WeightedRoundRobin);
    assert_eq!(p.retries, 2);
    assert_eq!(p.slow_start.unwrap().warm, Duration::from_secs(30));
    assert_eq!(p.members[0].weight, 3);
    assert_eq!(p.members[1].weight, 1);
    assert_eq!(p.members[1].state, AdminState::Drain);
    assert_eq!(c.monitors[0].rise, 2);
    assert_eq!(c.monitors[0].fall, 3);
    assert_eq!(c.persistence[0].source_mask, 24);
    assert_eq!(c.persistence[0].table_timeout(), Duration::from_secs(1800));
}

#[test]
fn reads_the_whole_design_example() {
    let c = ok(include_str!("../tests/design_example.toml"));
    assert_eq!(c.virtual_services.len(), 4);
    let vs = &c.virtual_services[0];
    assert_eq!(vs.rules().len(), 1);
    assert_eq!(vs.rules()[0].action, RuleAction::Pool("web".into()));
    assert_eq!(
        vs.rules()[0].header.0[0],
        ("X-Env".to_string(), "^canary$".to_string())
    );
    assert_eq!(c.gslb.names[0].algorithm, GslbAlgorithm::Topology);
    assert_eq!(
        c.dns.as_ref().unwrap().zones[0].file.as_deref(),
        Some(Path::new("/etc/fulcrum/zones/example.com.zone"))
    );
}

#[test]
fn unknown_key_with_suggestion_and_position() {
    let e = errs(&TCP.replace("algorithm =", "algoritm ="));
    has(
        &e,
        "t.toml:11:1: pool[0].algoritm: unknown key `algoritm` (did you mean `algorithm`?)",
    );
}

#[test]
fn unknown_enum_value_lists_choices() {
    let e = errs(&TCP.replace("\"weighted_round_robin\"", "\"wrr\""));
    has(
        &e,
        "pool[0].algorithm: unknown value \"wrr\"; expected one of: round_robin",
    );
    let e = errs(&TCP.replace("\"weighted_round_robin\"", "\"weighted_round_robn\""));
    has(&e, "(did you mean \"weighted_round_robin\"?)");
}

#[test]
fn wrong_types() {
    let e = errs(&TCP.replace("weight = 3", "weight = \"3\""));
    has(
        &e,
        "pool[0].member[0].weight: expected an integer, found a string",
    );
    let e = errs(&TCP.replace("weight = 3", "weight = -3"));
    has(&e, "-3 is out of range");
    let e = errs(&TCP.replace("weight = 3", "weight = 70000"));
    has(&e, "70000 is too large");
}

#[test]
fn bad_addresses_and_durations() {
    let e = errs(&TCP.replace("\"127.0.0.1:9001\"", "\"127.0.0.1\""));
    has(
        &e,
        "pool[0].member[0].address: invalid address \"127.0.0.1\": a port is required",
    );
    let e = errs(&TCP.replace("\"127.0.0.1:5000\"", "\"localhost:5000\""));
    has(&e, "virtual_service[0].listen: invalid address");
    let e = errs(&TCP.replace("\"30s\"", "\"30\""));
    has(
        &e,
        "pool[0].slow_start.warm: invalid duration \"30\": a unit is required",
    );
    let e = errs(&TCP.replace("\"30s\"", "\"soon\""));
    has(&e, "invalid duration \"soon\"");
}

#[test]
fn missing_references_with_suggestions() {
    let e = errs(&TCP.replace("pool = \"db\"", "pool = \"dbb\""));
    has(
        &e,
        "virtual_service[0].pool: no pool named \"dbb\" (did you mean \"db\"?)",
    );
    let e = errs(&TCP.replace("monitors = [\"tcp\"]", "monitors = [\"http\"]"));
    has(&e, "pool[0].monitors[0]: no monitor named \"http\"");
    let e = errs(&TCP.replace("persistence = \"src\"", "persistence = \"source\""));
    has(&e, "no persistence profile named \"source\"");
}

#[test]
fn duplicates() {
    let dup = TCP.replace("address = \"[::1]:9002\"", "address = \"127.0.0.1:9001\"");
    has(&errs(&dup), "duplicate member 127.0.0.1:9001");
    let two = format!("{TCP}\n[[pool]]\nname = \"db\"\n");
    has(
        &errs(&two),
        "pool[1].name: duplicate name \"db\": already used by pool[0]",
    );
    let listen = format!(
        "{TCP}\n[[virtual_service]]\nname = \"db2\"\nlisten = [\"127.0.0.1:5000\"]\nprotocol = \"tcp\"\npool = \"db\"\n"
    );
    has(
        &errs(&listen),
        "127.0.0.1:5000 is already used by virtual_service[0] (db)",
    );
}

#[test]
fn udp_and_tcp_may_share_an_address() {
    let c = format!(
        "{TCP}\n[[virtual_service]]\nname = \"dns\"\nlisten = [\"127.0.0.1:5000\"]\nprotocol = \"udp\"\npool = \"db\"\n"
    );
    ok(&c);
}

#[test]
fn all_errors_at_once_in_file_order() {
    let bad = TCP
        .replace("algorithm =", "algoritm =")
        .replace("weight = 3", "weight = \"x\"")
        .replace("pool = \"db\"", "pool = \"nope\"");
    let e = errs(&bad);
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(e[0].contains("virtual_service[0].pool"));
    assert!(e[1].contains("algoritm"));
    assert!(e[2].contains("weight"));
}

#[test]
fn toml_syntax_errors_are_located() {
    let e = errs("[[pool]]\nname = \"a\nweight = 1\n");
    has(&e, "t.toml:2:");
    has(&e, "TOML syntax error");
}

#[test]
fn protocol_specific_keys() {
    let e = errs(&TCP.replace(
        "protocol = \"tcp\"",
        "protocol = \"tcp\"\nudp_mode = \"per_packet\"",
    ));
    has(
        &e,
        "virtual_service[0].udp_mode: `udp_mode` applies to protocol udp; this service is tcp",
    );
    let e = errs(&TCP.replace("protocol = \"tcp\"", "protocol = \"https\""));
    has(&e, "protocol https needs `tls`");
}

/// Each protocol's section takes only its own keys: the others are refused where they are
/// written, with the protocols that take them, and a typo still gets its suggestion.
#[test]
fn sections_refuse_other_protocols_keys_at_their_position() {
    let with = |protocol: &str, extra: &str| {
        TCP.replace(
            "protocol = \"tcp\"",
            &format!("protocol = \"{protocol}\"\n{extra}"),
        )
    };
    // Line 6 is the first line after `protocol`.
    let e = errs(&with(
        "http",
        "tls = [{ cert = \"c.pem\", key = \"k.pem\" }]",
    ));
    has(
        &e,
        "t.toml:6:1: virtual_service[0].tls: `tls` applies to protocol tcp / https / message; this service is http",
    );
    let e = errs(&with("udp", "snat = [\"127.0.0.1\", \"127.0.0.1\"]"));
    has(
        &e,
        "t.toml:6:1: virtual_service[0].snat: `snat` applies to protocol tcp / http / https / message / ftp / rtsp; this service is udp",
    );
    // The refused value is still checked.
    has(&e, "virtual_service[0].snat[1]: 127.0.0.1 is listed twice");
    let e = errs(&with("udp", "framing = { length_bytes = 4 }"));
    has(
        &e,
        "virtual_service[0].framing: `framing` applies to protocol message; this service is udp",
    );
    let e = errs(&with("message", "forwarding = \"dr\""));
    has(
        &e,
        "virtual_service[0].forwarding: `forwarding` applies to protocol tcp / udp / ip; this service is message",
    );
    let e = errs(&with(
        "ftp",
        "rule = [{ source = \"10.0.0.0/8\", pool = \"db\" }]",
    ));
    has(
        &e,
        "virtual_service[0].rule: `rule` applies to protocol tcp / udp / http / https / message / rtsp; this service is ftp",
    );
    // A near miss of another protocol's key is still suggested.
    let e = errs(&with("tcp", "session_timeot = \"5s\""));
    has(
        &e,
        "unknown key `session_timeot` (did you mean `session_timeout`?)",
    );
    // A protocol that fails to read does not turn its keys into unknown ones.
    let e = errs(&with("htp", "max_headers = 10"));
    assert_eq!(e.len(), 1, "{e:?}");
    has(&e, "virtual_service[0].protocol: unknown value \"htp\"");
}

#[test]
fn sections_check_their_own_keys() {
    let with = |protocol: &str, extra: &str| {
        TCP.replace(
            "protocol = \"tcp\"",
            &format!("protocol = \"{protocol}\"\n{extra}"),
        )
        .replace("persistence = \"src\"\n", "")
    };
    let e = errs(&with("http", "gslb_redirect_threshold = 10"));
    has(
        &e,
        "virtual_service[0].gslb_redirect_threshold: `gslb_redirect_threshold` needs `gslb_redirect`",
    );
    let e = errs(&with("tcp", "tls_options = { min_version = \"1.3\" }"));
    has(
        &e,
        "virtual_service[0].tls_options: `tls_options` needs `tls` (the certificates) on a tcp service",
    );
    let e = errs(&with(
        "tcp",
        "snat = [\"127.0.0.2\", \"0.0.0.0\", \"127.0.0.2\"]",
    ));
    has(
        &e,
        "virtual_service[0].snat[1]: 0.0.0.0 cannot be a source address",
    );
    has(&e, "virtual_service[0].snat[2]: 127.0.0.2 is listed twice");
    let e = errs(&with("udp", "session_timeout = \"0s\""));
    has(
        &e,
        "virtual_service[0].session_timeout: must be longer than 0s",
    );
    let e = errs(&with(
        "message",
        "message_mode = \"sync\"\nsequence = { offset = 0, length = 4 }",
    ));
    has(
        &e,
        "virtual_service[0].sequence: `sequence` pairs pipelined responses",
    );
    let e = errs(&with("tcp", "idle_timeout = \"0s\""));
    has(
        &e,
        "virtual_service[0].idle_timeout: must be longer than 0s",
    );

    // The kind carries the protocol: https is the http section with TLS.
    let c = ok(&with(
        "https",
        "tls = [{ cert = \"c.pem\", key = \"k.pem\" }]\nproxy_protocol = \"v2\"",
    ));
    let vs = &c.virtual_services[0];
    assert_eq!(vs.protocol(), Protocol::Https);
    let http = vs.as_http().expect("http section");
    let tls = http.tls.as_ref().expect("tls");
    assert_eq!(tls.certs[0].cert, Path::new("/etc/fulcrum/c.pem"));
    assert_eq!(vs.proxy_protocol(), Some(ProxyProtocol::V2));
    assert!(!vs.in_kernel());
    let c = ok(&with("udp", ""));
    assert!(c.virtual_services[0].stream().is_none());
    assert!(c.virtual_services[0].snat().is_empty());
}

#[test]
fn source_client_is_read_where_member_connections_can_take_it() {
    let with = |protocol: &str, extra: &str| {
        TCP.replace(
            "protocol = \"tcp\"",
            &format!("protocol = \"{protocol}\"\n{extra}"),
        )
        .replace("persistence = \"src\"\n", "")
    };
    for p in ["tcp", "http"] {
        let c = ok(&with(p, "source = \"client\""));
        assert!(c.virtual_services[0].transparent(), "{p}");
        assert_eq!(c.virtual_services[0].member_source(), MemberSource::Client);
        let c = ok(&with(p, "source = \"local\""));
        assert!(!c.virtual_services[0].transparent(), "{p}");
        let c = ok(&with(p, ""));
        assert_eq!(c.virtual_services[0].member_source(), MemberSource::Local);
    }
    let e = errs(&with("tcp", "source = \"transparent\""));
    has(
        &e,
        "virtual_service[0].source: unknown value \"transparent\"; expected one of: local, client",
    );
    let e = errs(&with("tcp", "source = \"client\"\nsnat = \"127.0.0.2\""));
    has(&e, "virtual_service[0].source: `source = \"client\"` connects from the client's own address; it cannot be combined with `snat`");
    let e = errs(&with(
        "tcp",
        "source = \"client\"\nforwarding = \"nat\"\ninterfaces = [\"eth0\"]",
    ));
    has(
        &e,
        "virtual_service[0].source: `source = \"client\"` applies to proxied connections",
    );
    let e = errs(&with("message", "source = \"client\""));
    has(
        &e,
        "virtual_service[0].source: `source = \"client\"` is not available on message services",
    );
    let e = errs(&with("ftp", "source = \"client\""));
    has(&e, "virtual_service[0].source: `source` applies to protocol tcp / http / https / message; this service is ftp");
    let e = errs(&with("udp", "source = \"local\""));
    has(
        &e,
        "virtual_service[0].source: `source` applies to protocol",
    );
}

#[test]
fn admin_needs_token_off_loopback() {
    let e = errs(&format!("[admin]\nlisten = \"0.0.0.0:9900\"\n{TCP}"));
    has(&e, "admin.listen: 0.0.0.0:9900 is not a loopback address");
    ok(&format!(
        "[admin]\nlisten = \"0.0.0.0:9900\"\ntoken = \"0123456789abcdef\"\n{TCP}"
    ));
    ok(&format!(
        "[admin]\nlisten = \"0.0.0.0:9900\"\ntoken_file = \"/etc/fulcrum/api.token\"\n{TCP}"
    ));
}

#[test]
fn admin_tokens_are_long_enough_and_located() {
    // Short tokens are refused on loopback too: every local user can try tokens there.
    for listen in ["127.0.0.1:9900", "0.0.0.0:9900"] {
        let e = errs(&format!(
            "[admin]\nlisten = \"{listen}\"\ntoken = \"s3cret\"\n{TCP}"
        ));
        has(
            &e,
            "t.toml:3:1: admin.token: the token is 6 characters long; use at least 16 (e.g. `openssl rand -hex 16`)",
        );
    }
    ok(&format!("[admin]\ntoken = \"0123456789abcdef\"\n{TCP}"));
    let e = errs(&format!("[admin]\ntoken = \"with a space in it!\"\n{TCP}"));
    has(&e, "admin.token: the token must be printable ASCII");
    let e = errs(&format!(
        "[admin]\ntoken = \"0123456789abcdef\"\ntoken_file = \"x\"\n{TCP}"
    ));
    has(&e, "admin.token_file: set either `token` or `token_file`");
    let e = errs(&format!("[admin]\nmetrics_aut = true\n{TCP}"));
    has(&e, "did you mean `metrics_auth`");
    let c = ok(&format!(
        "[admin]\ntoken_file = \"api.token\"\nmetrics_auth = true\n{TCP}"
    ));
    assert_eq!(c.admin.token_file, Path::new("/etc/fulcrum/api.token"));
    assert!(c.admin.metrics_auth && c.admin.token_configured());
    let c = ok(TCP);
    assert_eq!(c.admin.token_file, Path::new(DEFAULT_TOKEN_FILE));
    assert!(!c.admin.token_configured() && !c.admin.metrics_auth);
}

#[test]
fn monitor_checks() {
    let e = errs(&TCP.replace(
        "type = \"tcp\"",
        "type = \"tcp\"\ninterval = \"1s\"\ntimeout = \"2s\"",
    ));
    has(
        &e,
        "monitor[0].timeout: 2s is longer than the interval (1s)",
    );
    let e = errs(&TCP.replace("type = \"tcp\"", "type = \"send_expect\""));
    has(&e, "type send_expect needs `expect`");
    let e = errs(&TCP.replace("type = \"tcp\"", "type = \"tcp\"\nrise = 0"));
    has(&e, "monitor[0].rise: must be at least 1");
}

#[test]
fn rule_checks() {
    let base = r#"
[[virtual_service]]
name = "web"
listen = "127.0.0.1:8080"
protocol = "http"
pool = "web"
[[virtual_service.rule]]
path_regex = "^/(img"
pool = "web"
[[virtual_service.rule]]
respond = 403
redirect = "https://x/"
[[pool]]
name = "web"
"#;
    let e = errs(base);
    has(
        &e,
        "virtual_service[0].rule[0].path_regex: invalid regular expression \"^/(img\"",
    );
    has(
        &e,
        "virtual_service[0].rule[1]: a rule needs exactly one action",
    );
}

/// Rules of tcp / udp / message services: the same syntax as http rules, with the L4
/// conditions; http conditions and actions are refused at their key, with the reason.
#[test]
fn l4_rules_read_and_checks() {
    let base = |protocol: &str, rules: &str| {
        format!(
            r#"
[[virtual_service]]
name = "svc"
listen = ["127.0.0.1:5000", "127.0.0.1:5001"]
protocol = "{protocol}"
pool = "a"
{rules}
[[pool]]
name = "a"
[[pool]]
name = "b"
"#
        )
    };
    let good = r#"
[[virtual_service.rule]]
name = "office"
source = ["10.0.0.0/8", "2001:db8::/32"]
time = ["08:00-18:00", "22:00-02:00"]
pool = "b"
[[virtual_service.rule]]
destination_port = [5001, "5000-5000"]
drop = true
"#;
    for protocol in ["tcp", "udp", "message"] {
        let cfg = ok(&base(protocol, good));
        let rules = cfg.virtual_services[0].rules();
        assert_eq!(rules.len(), 2, "{protocol}");
        assert_eq!(rules[0].action, RuleAction::Pool("b".into()));
        assert_eq!(
            rules[0].time[1],
            TimeRange {
                start: 1320,
                end: 120
            }
        );
        assert_eq!(rules[1].destination_port, vec![5001..=5001, 5000..=5000]);
        assert_eq!(rules[1].action, RuleAction::Drop);
    }
    let e = errs(&base(
        "tcp",
        "[[virtual_service.rule]]\npath = \"/x\"\nheader = { A = \"b\" }\nredirect = \"https://x/\"\n",
    ));
    has(
        &e,
        "t.toml:8:1: virtual_service[0].rule[0].path: `path` matches HTTP requests; rules of tcp services take the conditions `source`, `destination_port` and `time` and the actions `pool` and `drop = true`",
    );
    has(
        &e,
        "virtual_service[0].rule[0].header: `header` matches HTTP requests",
    );
    has(
        &e,
        "virtual_service[0].rule[0].redirect: `redirect` answers an HTTP request",
    );
    let e = errs(&base(
        "udp",
        "[[virtual_service.rule]]\ntime = \"18:00-08:61\"\npool = \"b\"\n[[virtual_service.rule]]\ntime = \"09:00-09:00\"\npool = \"b\"\n",
    ));
    has(
        &e,
        "t.toml:8:1: virtual_service[0].rule[0].time: \"18:00-08:61\" is not a time range: \"08:61\" is not a time of day",
    );
    has(&e, "virtual_service[0].rule[1].time: \"09:00-09:00\" is not a time range: the range starts and ends at 09:00: it is empty");
    // Cross-checks (run once every section reads): ports and pool names.
    let e = errs(&base(
        "udp",
        "[[virtual_service.rule]]\nsource = \"10.0.0.0/8\"\npool = \"b\"\n[[virtual_service.rule]]\nsource = \"10.0.0.0/8\"\npool = \"b\"\n[[virtual_service.rule]]\ndestination_port = 7000\npool = \"nope\"\n",
    ));
    has(
        &e,
        "virtual_service[0].rule[2].destination_port: matches none of the ports the service listens on (5000, 5001)",
    );
    has(
        &e,
        "virtual_service[0].rule[2].pool: no pool named \"nope\"",
    );
    let e = errs(&base(
        "message",
        "[[virtual_service.rule]]\nname = \"x\"\npool = \"b\"\n[[virtual_service.rule]]\nname = \"x\"\ndrop = true\n",
    ));
    has(
        &e,
        "virtual_service[0].rule[1].name: duplicate rule name \"x\": already used by rule[0]",
    );
    // L4 conditions on an http rule, and rules on in-kernel forwarding.
    let e = errs(&base(
        "http",
        "[[virtual_service.rule]]\ntime = \"08:00-18:00\"\npool = \"b\"\n",
    ));
    has(
        &e,
        "virtual_service[0].rule[0].time: `time` is a condition of tcp / udp / message rules",
    );
    let e = errs(&base(
        "tcp",
        "forwarding = \"nat\"\n[[virtual_service.rule]]\nsource = \"10.0.0.0/8\"\npool = \"b\"\n",
    ));
    has(
        &e,
        "virtual_service[0].rule: rules are evaluated by the proxy",
    );
}

#[test]
fn l7_hash_key_on_tcp_pool() {
    let e = errs(&TCP.replace(
        "algorithm = \"weighted_round_robin\"",
        "algorithm = \"hash\"\nhash_key = \"header:X-Id\"",
    ));
    has(
        &e,
        "hash key header:X-Id needs an HTTP request, but a tcp service uses this pool",
    );
}

#[test]
fn a_failed_element_does_not_cascade() {
    // The pool has no name, so the reference to it must not be reported as a second error.
    let e = errs(&TCP.replace("name = \"db\"\nalgorithm", "algorithm"));
    assert_eq!(e.len(), 1, "{e:#?}");
    has(&e, "pool[0]: missing required key `name`");
}

#[test]
fn nothing_panics_on_odd_documents() {
    for doc in [
        "",
        "virtual_service = 3",
        "[[virtual_service]]",
        "[admin]\nlisten = []",
        "pool = [1, 2]",
        "[[pool]]\nname = \"p\"\nmember = \"x\"",
        "[gslb]\nsite = {}",
        "[[pool]]\nname=\"p\"\n[[pool.member]]\naddress=1979-05-27T07:32:00Z",
    ] {
        let _ = parse(doc, "t.toml", Path::new("."));
    }
}

#[test]
fn http_only_pool_keys_on_a_tcp_pool() {
    let e = errs(&TCP.replace(
        "algorithm = \"weighted_round_robin\"",
        "algorithm = \"weighted_round_robin\"\nreuse = \"always\"",
    ));
    has(
        &e,
        "pool[0].reuse: `reuse` applies to pools of http/https services; this pool serves tcp",
    );
    let e = errs(&TCP.replace(
        "algorithm = \"weighted_round_robin\"",
        "algorithm = \"weighted_round_robin\"\nmin_active = 0",
    ));
    has(&e, "pool[0].min_active: must be at least 1");
}

const UDP: &str = r#"
[[virtual_service]]
name = "radius"
listen = ["127.0.0.1:1812", "[::1]:1812"]
protocol = "udp"
pool = "radius"
persistence = "user"
udp_mode = "per_packet"
session_timeout = "10s"
max_sessions = 1000

[[pool]]
name = "radius"
monitors = ["status", "dns", "ping", "mail"]

[[pool.member]]
address = "127.0.0.1:11812"

[[monitor]]
name = "status"
type = "radius"
secret = "testing123"

[[monitor]]
name = "dns"
type = "dns"
query = "health.example."
query_type = "aaaa"
expect_rcode = "nxdomain"
expect_answer = "::1"

[[monitor]]
name = "ping"
type = "icmp"

[[monitor]]
name = "mail"
type = "imap"
username = "probe"
password = "secret"

[[persistence]]
name = "user"
type = "radius"
attribute = "calling-station-id"
malformed = "drop"
"#;

#[test]
fn reads_udp_service_radius_persistence_and_protocol_monitors() {
    let c = ok(UDP);
    let vs = c.virtual_services[0].as_udp().unwrap();
    assert_eq!(vs.mode, UdpMode::PerPacket);
    assert_eq!(vs.max_sessions, 1000);
    assert_eq!(vs.session_timeout, Duration::from_secs(10));
    let p = &c.persistence[0];
    assert_eq!(p.malformed, Malformed::Drop);
    assert_eq!(radius_attribute(p.attribute.as_deref().unwrap()), Some(31));
    assert_eq!(radius_attribute("26"), Some(26));
    assert_eq!(radius_attribute("0"), None);
    let dns = c.monitor("dns").unwrap();
    assert_eq!(dns.query_type, "AAAA");
    assert_eq!(dns.expect_rcode, "NXDOMAIN");
    assert_eq!(
        c.monitor("status").unwrap().secret.as_deref(),
        Some("testing123")
    );
    let defaults = ok(&UDP
        .replace("udp_mode = \"per_packet\"\n", "")
        .replace("max_sessions = 1000\n", ""));
    assert_eq!(
        defaults.virtual_services[0].as_udp().unwrap().mode,
        UdpMode::Session
    );
    assert_eq!(
        defaults.virtual_services[0].as_udp().unwrap().max_sessions,
        DEFAULT_MAX_SESSIONS
    );
}

const GSLB: &str = r#"
[dns]
listen = "127.0.0.1:5353"
rate_limit = { responses_per_second = 100 }

[[dns.zone]]
origin = "example.com."

[[ip_table]]
name = "tel"
cidrs = ["198.51.100.0/24"]

[[ip_table]]
name = "asia"
geoip = "geo.mmdb"
continents = ["AS"]

[[monitor]]
name = "http"
type = "http"

[gslb]
local_site = "east"
key = "0123456789abcdef0123"

[[gslb.site]]
name = "east"
addresses = ["192.0.2.10"]
regions = ["tel"]
monitor = "http"
peer = "127.0.0.2:7400"

[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
regions = ["asia"]
peer = "127.0.0.3:7400"

[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
"#;

#[test]
fn reads_gslb_additions_with_defaults() {
    let c = ok(GSLB);
    let dns = c.dns.as_ref().unwrap();
    assert_eq!(dns.udp_payload, 1232);
    assert_eq!(dns.rate_limit.as_ref().unwrap().slip, 2);
    assert_eq!(dns.tcp_idle_timeout, Duration::from_secs(10));
    assert_eq!(c.gslb.local_site.as_deref(), Some("east"));
    assert_eq!(c.gslb.interval, Duration::from_secs(1));
    assert_eq!(c.gslb.stale_after, Duration::from_secs(5));
    assert_eq!(
        c.ip_tables[1].geoip.as_deref(),
        Some(Path::new("/etc/fulcrum/geo.mmdb"))
    );
}

#[test]
fn protocol_monitor_and_radius_checks() {
    let e = errs(
        &UDP.replace("secret = \"testing123\"\n", "")
            .replace("query = \"health.example.\"\n", "query = \"bad name.\"\n")
            .replace("query_type = \"aaaa\"", "query_type = \"AAAAA\"")
            .replace("expect_rcode = \"nxdomain\"", "expect_rcode = \"OK\"")
            .replace("password = \"secret\"\n", "")
            .replace("type = \"icmp\"", "type = \"icmp\"\nquery = \"x.\"")
            .replace("calling-station-id", "Calling-Station")
            .replace("max_sessions = 1000", "max_sessions = 0"),
    );
    has(&e, "monitor[0]: type radius needs `secret`");
    has(&e, "monitor[1].query: \"bad name.\" is not a DNS name");
    has(&e, "monitor[1].query_type: unknown record type \"AAAAA\"");
    has(&e, "monitor[1].expect_rcode: unknown response code \"OK\"");
    has(
        &e,
        "monitor[2].query: `query` applies to monitor type dns; this monitor is icmp",
    );
    has(
        &e,
        "monitor[3]: give both `username` and `password`, or neither",
    );
    has(&e, "persistence[0].attribute: unknown RADIUS attribute \"Calling-Station\" (did you mean \"Calling-Station-Id\"?)");
    has(&e, "virtual_service[0].max_sessions: must be at least 1");
    let e = errs(&UDP.replace("query = \"health.example.\"\n", ""));
    has(&e, "monitor[1]: type dns needs `query`");
    let e = errs(&TCP.replace("source_mask = 24", "source_mask = 24\nmalformed = \"drop\""));
    has(
        &e,
        "`malformed` applies to type radius; this profile is source_ip",
    );
    let e = errs(&TCP.replace(
        "pool = \"db\"\npersistence",
        "pool = \"db\"\nmax_sessions = 5\npersistence",
    ));
    has(
        &e,
        "`max_sessions` applies to protocol udp; this service is tcp",
    );
}

#[test]
fn gslb_checks() {
    let e = errs(&GSLB.replace("key = \"0123456789abcdef0123\"\n", ""));
    has(&e, "gslb: site state exchange with peers needs `key`");
    let e = errs(&GSLB.replace("local_site = \"east\"", "local_site = \"eats\""));
    has(
        &e,
        "gslb.local_site: no gslb.site named \"eats\" (did you mean \"east\"?)",
    );
    let e = errs(&GSLB.replace("0123456789abcdef0123", "short"));
    has(&e, "gslb.key[0]: a key must be at least 16 characters long");
    let e = errs(&GSLB.replace(
        "continents = [\"AS\"]",
        "continents = [\"XX\"]\ncountries = [\"cn\"]",
    ));
    has(
        &e,
        "ip_table[1].continents[0]: \"XX\" is not a continent code",
    );
    has(
        &e,
        "ip_table[1].countries[0]: \"cn\" is not an ISO 3166-1 country code",
    );
    let e = errs(&GSLB.replace("geoip = \"geo.mmdb\"\n", ""));
    has(&e, "ip_table[1].continents: `continents` need `geoip`");
    let e = errs(&GSLB.replace("type = \"http\"", "type = \"tcp\""));
    has(
        &e,
        "gslb.site[0].monitor: monitor \"http\" (type tcp) has no `port`",
    );
    let e = errs(&GSLB.replace("key = ", "stale_after = \"1s\"\nkey = "));
    has(
        &e,
        "gslb.stale_after: 1s must be longer than the report interval (1s)",
    );
    let e = errs(&GSLB.replace("peer = \"127.0.0.2:7400\"", "peer = \"127.0.0.1:5353\""));
    has(&e, "127.0.0.1:5353 is already used by dns");
    let e = errs(&GSLB.replace(
        "rate_limit = { responses_per_second = 100 }",
        "udp_payload = 100",
    ));
    has(&e, "dns.udp_payload: 100 is below 512");
}

/// A tcp service at `listen` with `gslb = name`, and its pool, after `GSLB`.
fn gslb_service(listen: &str, name: &str) -> String {
    format!(
        "{GSLB}\n[[virtual_service]]\nname = \"t\"\nlisten = \"{listen}\"\nprotocol = \"tcp\"\npool = \"p\"\ngslb = \"{name}\"\n[[pool]]\nname = \"p\"\n"
    )
}

#[test]
fn learnt_gslb_addresses_need_a_name_listing_the_local_site() {
    let c = ok(&gslb_service("192.0.2.30:80", "App.Example.com"));
    assert_eq!(
        c.virtual_services[0].gslb.as_deref(),
        Some("app.example.com."),
        "lower case, fully qualified"
    );
    let e = errs(&gslb_service("192.0.2.30:80", "ap.example.com"));
    has(
        &e,
        "virtual_service[0].gslb: no gslb.name named \"ap.example.com.\" (did you mean \"app.example.com.\"?)",
    );
    let e = errs(&gslb_service("0.0.0.0:80", "app.example.com"));
    has(
        &e,
        "virtual_service[0].listen: 0.0.0.0:80 is a wildcard address, and `gslb` answers clients",
    );
    let e = errs(
        &gslb_service("192.0.2.30:80", "app.example.com")
            .replace("sites = [\"east\", \"west\"]", "sites = [\"west\"]"),
    );
    has(
        &e,
        "virtual_service[0].gslb: gslb.name \"app.example.com.\" does not list the local site \"east\"",
    );
    let e = errs(
        &gslb_service("192.0.2.30:80", "app.example.com")
            .replace("local_site = \"east\"\n", "")
            .replace("peer = \"127.0.0.2:7400\"\n", "")
            .replace("peer = \"127.0.0.3:7400\"\n", "")
            .replace("key = \"0123456789abcdef0123\"\n", ""),
    );
    has(&e, "virtual_service[0].gslb: \"app.example.com.\": the service's addresses are added to the name at this instance's own site, and gslb.local_site is not set");
    // Sites without addresses of their own: the local one learns from its services, another
    // from its instance's reports.
    ok(&GSLB.replace("addresses = [\"192.0.2.10\"]\n", ""));
    ok(&GSLB.replace("addresses = [\"192.0.2.20\"]\n", ""));
    let e = errs(
        &GSLB
            .replace("addresses = [\"192.0.2.20\"]\n", "")
            .replace("peer = \"127.0.0.3:7400\"\n", ""),
    );
    has(&e, "gslb.site[1].addresses: site \"west\" has no addresses, and another site's addresses can only be learnt from its own instance's reports: it needs `peer`");
}

#[test]
fn ip_table_asns_and_countries_without_geoip() {
    let table = |keys: &str| GSLB.replace("geoip = \"geo.mmdb\"\ncontinents = [\"AS\"]", keys);
    // Without `geoip`, `asns` and `countries` come from the shipped table.
    let c = ok(&table("asns = [4134, 4812]\ncountries = [\"CN\"]"));
    assert_eq!(c.ip_tables[1].asns, [4134, 4812]);
    assert_eq!(c.ip_tables[1].countries, ["CN"]);
    assert!(c.ip_tables[1].geoip.is_none());
    let e = errs(&table(
        "asns = [0, 23456, 64512, 64500, 4294967295, 4200000001, 4134]\ncountries = [\"XX\", \"CN\", \"UK\"]",
    ));
    has(&e, "ip_table[1].asns[0]: 0 is reserved (RFC 7607)");
    has(&e, "ip_table[1].asns[1]: 23456 is AS_TRANS");
    has(&e, "ip_table[1].asns[2]: 64512 is a private-use AS number");
    has(
        &e,
        "ip_table[1].asns[3]: 64500 is reserved for documentation",
    );
    has(&e, "ip_table[1].asns[4]: 4294967295 is reserved");
    has(
        &e,
        "ip_table[1].asns[5]: 4200000001 is a private-use AS number",
    );
    has(
        &e,
        "ip_table[1].countries[0]: \"XX\" is not an ISO 3166-1 country code: no country has it",
    );
    has(
        &e,
        "ip_table[1].countries[2]: \"UK\" is not an ISO 3166-1 country code",
    );
    assert_eq!(
        e.iter().filter(|m| m.contains("ip_table[1]")).count(),
        8,
        "{e:#?}"
    );
    let e = errs(&table("asns = [-1, 4294967296]"));
    has(
        &e,
        "ip_table[1].asns[0]: -1 is out of range; expected an integer from 0 to 4294967295",
    );
    has(&e, "ip_table[1].asns[1]: 4294967296 is out of range");
    let e = errs(&table("asns = \"4134\""));
    has(&e, "ip_table[1].asns");
    let e = errs(&table(""));
    has(
        &e,
        "ip_table[1]: needs `cidrs`, `file`, `asns`, `countries`, or `geoip` with `continents`",
    );
    let e = errs(&table("geoip = \"geo.mmdb\"\nasns = [4134]"));
    has(
        &e,
        "ip_table[1].geoip: `geoip` needs `countries` or `continents`",
    );
}

#[test]
fn proximity_names_and_probe_settings() {
    let prox = GSLB.replace(
        "sites = [\"east\", \"west\"]",
        "sites = [\"east\", \"west\"]\nalgorithm = \"proximity\"",
    );
    let c = ok(&prox);
    assert_eq!(c.gslb.names[0].algorithm, GslbAlgorithm::Proximity);
    assert_eq!(c.gslb.proximity.port, 53);
    assert_eq!(c.gslb.proximity.max_prefixes, 10_000);
    let c = ok(&prox.replace(
        "[gslb]\n",
        "[gslb]\nproximity = { port = 5300, source = \"127.0.0.2\", max_age = \"10s\", load_weight = 0.5 }\n",
    ));
    assert_eq!(c.gslb.proximity.port, 5300);
    assert_eq!(c.gslb.proximity.load_weight, 0.5);
    let e = errs(&prox.replace(
        "[gslb]\n",
        "[gslb]\nproximity = { max_age = \"500ms\", max_in_flight = 0, load_weight = -1 }\n",
    ));
    has(
        &e,
        "gslb.proximity.max_age: 500ms must be longer than the probe timeout (1s)",
    );
    has(
        &e,
        "gslb.proximity.max_in_flight: 0 is out of range; expected 1 to 10000",
    );
    has(
        &e,
        "gslb.proximity.load_weight: -1 is out of range; expected 0 to 100",
    );
    let e = errs(&prox.replace("algorithm = \"proximity\"", "fallback = \"proximity\""));
    has(&e, "gslb.name[0].fallback: proximity cannot be a fallback");
    let e = errs(
        &prox
            .replace("local_site = \"east\"\n", "")
            .replace("peer = \"127.0.0.2:7400\"\n", "")
            .replace("peer = \"127.0.0.3:7400\"\n", ""),
    );
    has(
        &e,
        "gslb.name[0].algorithm: proximity needs gslb.local_site",
    );
}

#[test]
fn gslb_redirect_needs_an_http_service_and_a_name() {
    let e = errs(&format!(
        "{GSLB}\n[[virtual_service]]\nname = \"t\"\nlisten = \"127.0.0.1:81\"\nprotocol = \"tcp\"\npool = \"p\"\ngslb_redirect = \"ap.example.com.\"\n[[pool]]\nname = \"p\"\n"
    ));
    has(
        &e,
        "`gslb_redirect` applies to protocol http / https; this service is tcp",
    );
    // A tcp service has no redirect to check the name of; an http service does.
    let e = errs(&format!(
        "{GSLB}\n[[virtual_service]]\nname = \"t\"\nlisten = \"127.0.0.1:81\"\nprotocol = \"http\"\npool = \"p\"\ngslb_redirect = \"ap.example.com.\"\ngslb_redirect_threshold = 5\n[[pool]]\nname = \"p\"\n"
    ));
    has(
        &e,
        "no gslb.name named \"ap.example.com.\" (did you mean \"app.example.com.\"?)",
    );
    let c = ok(&format!(
        "{GSLB}\n[[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:80\"\nprotocol = \"http\"\npool = \"p\"\ngslb_redirect = \"app.example.com.\"\ngslb_redirect_threshold = 5000\n[[pool]]\nname = \"p\"\n"
    ));
    let r = c.virtual_services[0]
        .as_http()
        .unwrap()
        .gslb_redirect
        .clone();
    assert_eq!(
        r,
        Some(crate::GslbRedirect {
            name: "app.example.com.".into(),
            threshold: Some(5000)
        })
    );
}
const MESSAGE: &str = r#"
[[virtual_service]]
name = "pos"
listen = "127.0.0.1:7000"
protocol = "message"
pool = "hosts"
message_mode = "async"

[[pool]]
name = "hosts"
algorithm = "least_request"

[[pool.member]]
address = "127.0.0.1:9001"
"#;

fn message_with(extra: &str) -> String {
    MESSAGE.replace(
        "message_mode = \"async\"",
        &format!("message_mode = \"async\"\n{extra}"),
    )
}

#[test]
fn message_defaults() {
    let c = ok(MESSAGE);
    let vs = c.virtual_services[0].as_message().unwrap();
    assert_eq!(vs.framing, Framing::default());
    let f = vs.framing.clone();
    assert_eq!(f.length_bytes, 2);
    assert!(f.big_endian);
    assert_eq!(f.max_message, 65536);
    assert_eq!(f.length_encoding, LengthEncoding::Binary);
    assert_eq!(f.header_len(), 2);
    assert_eq!(vs.options.member_connections, 2);
    assert_eq!(vs.options.max_pending, 256);
    assert_eq!(vs.options.delivery, Delivery::AtLeastOnce);
    assert_eq!(vs.options.max_attempts, 3);
    assert_eq!(vs.options.message_timeout, Duration::from_secs(30));
    let c = ok(&MESSAGE.replace("\"async\"", "\"sync\""));
    assert_eq!(
        c.virtual_services[0]
            .as_message()
            .unwrap()
            .options
            .member_connections,
        8
    );
}

#[test]
fn message_framing_variants() {
    let c = ok(&message_with(
        "framing = { length_encoding = \"ascii\", length_bytes = 4, length_offset = 3, max_message = \"8KiB\" }",
    ));
    let f = c.virtual_services[0].as_message().unwrap().framing.clone();
    assert_eq!(f.length_encoding, LengthEncoding::Ascii);
    assert_eq!(f.header_len(), 7);
    assert_eq!(f.max_message, 8192);
    let c = ok(&message_with("framing = { delimiter = \"\\r\\n\" }"));
    let f = c.virtual_services[0].as_message().unwrap().framing.clone();
    assert_eq!(f.delimiter.as_deref(), Some(&b"\r\n"[..]));
    assert_eq!(f.header_len(), 0);
    let c = ok(&message_with("framing = { delimiter = [0x03, 255] }"));
    assert_eq!(
        c.virtual_services[0]
            .as_message()
            .unwrap()
            .framing
            .clone()
            .delimiter,
        Some(vec![3, 255])
    );
    ok(&message_with(
        "framing = { length_encoding = \"bcd\", length_bytes = 2, length_includes_header = true, length_adjust = -2 }",
    ));
}

#[test]
fn message_framing_errors_are_located() {
    let e = errs(&message_with("framing = { length_bytes = 3 }"));
    has(
        &e,
        "t.toml:8:13: virtual_service[0].framing.length_bytes: 3 is not supported for a binary length; expected 1, 2, 4 or 8",
    );
    let e = errs(&message_with(
        "framing = { length_encoding = \"bcd\", length_bytes = 5 }",
    ));
    has(
        &e,
        "framing.length_bytes: 5 is not supported for a bcd length",
    );
    let e = errs(&message_with(
        "framing = { length_encoding = \"ascii\", big_endian = false }",
    ));
    has(
        &e,
        "framing.big_endian: `big_endian` applies to binary lengths",
    );
    let e = errs(&message_with(
        "framing = { delimiter = \"\\n\", length_bytes = 2 }",
    ));
    has(
        &e,
        "framing.delimiter: a frame ends with `delimiter` or has a length prefix, not both; remove `delimiter` or `length_bytes`",
    );
    let e = errs(&message_with("framing = { delimiter = \"\" }"));
    has(
        &e,
        "framing.delimiter: a delimiter of 0 bytes is not supported",
    );
    let e = errs(&message_with("framing = { delimiter = [300] }"));
    has(
        &e,
        "framing.delimiter[0]: expected a byte value from 0 to 255",
    );
    let e = errs(&message_with("framing = { max_message = 0 }"));
    has(&e, "framing.max_message: 0 is out of range");
    let e = errs(&message_with("framing = { max_message = \"1GiB\" }"));
    has(&e, "framing.max_message: 1073741824 is out of range");
}

#[test]
fn message_sequence_and_delivery_errors() {
    let e = errs(&message_with(
        "framing = { max_message = 100 }\nsequence = { offset = 95, length = 12 }",
    ));
    has(
        &e,
        "virtual_service[0].sequence: the id at bytes 95..107 of the body lies beyond max_message (100 bytes)",
    );
    let e = errs(&message_with("sequence = { offset = 0, length = 0 }"));
    has(
        &e,
        "sequence.length: 0 is out of range; expected 1 to 64 bytes",
    );
    let e = errs(&message_with(
        "delivery = \"at_most_once\"\nmax_attempts = 3",
    ));
    has(
        &e,
        "virtual_service[0].max_attempts: delivery = \"at_most_once\" never sends a message twice",
    );
    let c = ok(&message_with("delivery = \"at_most_once\""));
    assert_eq!(
        c.virtual_services[0]
            .as_message()
            .unwrap()
            .options
            .max_attempts,
        1
    );
    let e = errs(&message_with(
        "member_connections = 0\nmessage_timeout = \"0s\"",
    ));
    has(
        &e,
        "virtual_service[0].member_connections: 0 is out of range; expected 1 to 1024",
    );
    has(
        &e,
        "virtual_service[0].message_timeout: must be longer than 0s",
    );
    let e = errs(&TCP.replace(
        "persistence = \"src\"",
        "persistence = \"src\"\nmax_pending = 5",
    ));
    has(
        &e,
        "virtual_service[0].max_pending: `max_pending` applies to protocol message; this service is tcp",
    );
    let e = errs(&MESSAGE.replace(
        "address = \"127.0.0.1:9001\"",
        "address = \"127.0.0.1:9001\"\nmax_connections = 10",
    ));
    has(
        &e,
        "pool[0].member[0].max_connections: message service \"pos\" uses this pool",
    );
}

#[test]
fn access_lists_on_virtual_services() {
    let c = ok(&TCP.replace(
        "protocol = \"tcp\"",
        "protocol = \"tcp\"\nallow = [\"198.51.100.0/24\", \"2001:db8::/32\"]\ndeny = \"198.51.100.7\"",
    ));
    let a = &c.virtual_services[0].access;
    assert_eq!(a.allow.len(), 2);
    assert!(!a.permits("198.51.100.7".parse().unwrap()));
    assert!(a.permits("198.51.100.8".parse().unwrap()));
    assert!(!a.permits("192.0.2.1".parse().unwrap()));
    let e = errs(&TCP.replace(
        "protocol = \"tcp\"",
        "protocol = \"tcp\"\ndeny = [\"198.51.100.0/33\"]",
    ));
    has(&e, "virtual_service[0].deny[0]");
}

const HA: &str = r#"
[admin]
state_file = "state/fulcrum.json"

[ha]
mode = "active_standby"
node = "lb1"
interface = "eth0"
vrid = 51
priority = 150
advert_interval = "100ms"
preempt = true
preempt_delay = "2s"
peers = ["10.0.0.2"]
vips = ["10.0.0.100/24", "10.0.0.101"]
track = ["db"]
track_weight = 60
sync = { listen = "10.0.0.1:7500", peers = ["10.0.0.2:7500"], key = "0123456789abcdef0123" }
"#;

#[test]
fn ha_and_state_file_are_read() {
    let c = ok(&format!("{TCP}{HA}"));
    assert_eq!(
        c.admin.state_file.as_deref(),
        Some(Path::new("/etc/fulcrum/state/fulcrum.json"))
    );
    let ha = c.ha.expect("[ha]");
    assert_eq!(ha.mode, HaMode::ActiveStandby);
    assert_eq!((ha.vrid, ha.priority), (51, 150));
    assert_eq!(ha.advert_interval, Duration::from_millis(100));
    assert_eq!(ha.preempt_delay, Duration::from_secs(2));
    // The host bits of a VIP are kept (a prefix elsewhere is truncated to its network).
    assert_eq!(ha.vips[0].to_string(), "10.0.0.100/24");
    assert_eq!(ha.vips[1].to_string(), "10.0.0.101/32");
    assert_eq!(ha.track, vec!["db".to_string()]);
    assert_eq!(ha.track_weight, Some(60));
    assert_eq!(ha.garp_repeat, 3);
    assert_eq!(ha.sync.expect("sync").peers.len(), 1);
}

#[test]
fn ha_over_ipv6() {
    let c = ok("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"2001:db8::100/64\"]\npeers = [\"fe80::2\"]\n");
    let ha = c.ha.expect("[ha]");
    assert_eq!(ha.vips[0].to_string(), "2001:db8::100/64");
}

#[test]
fn ha_vips_on_other_interfaces_and_conntrack_sync() {
    let c = ok("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.1/24\", \"203.0.113.10/24 dev wan0\"]\nconntrack_sync = { interface = \"sync0\", peer = \"198.18.254.2\" }\n");
    let ha = c.ha.expect("[ha]");
    assert_eq!(ha.vips[0].interface, None);
    assert_eq!(ha.vips[1].interface.as_deref(), Some("wan0"));
    assert_eq!(ha.vips[1].to_string(), "203.0.113.10/24 dev wan0");
    let ct = ha.conntrack_sync.expect("conntrack_sync");
    assert_eq!(ct.interface, "sync0");
    assert_eq!(ct.peer, Some("198.18.254.2".parse().unwrap()));
    assert_eq!(ct.port, 3780);

    let e = errs("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.1/24 dev wan\\\"0\", \"10.0.0.2/24 on wan0\"]\nconntrack_sync = { interface = \"sync 0\", peer = \"fe80::2\", port = 0 }\n");
    has(&e, "ha.vips[0]: \"wan\\\"0\" is not an interface name");
    has(&e, "ha.vips[1]: expected an address with its prefix length");
    has(
        &e,
        "ha.conntrack_sync.interface: \"sync 0\" is not an interface name",
    );
    has(
        &e,
        "ha.conntrack_sync.peer: the conntrack_sync link is IPv4",
    );
    has(&e, "ha.conntrack_sync.port: port must be from 1 to 65535");
    let e = errs("[ha]\nmode = \"active_active\"\nconntrack_sync = { interface = \"sync0\" }\n");
    has(&e, "ha.conntrack_sync: `conntrack_sync` is a VRRP key");
}

#[test]
fn ha_defaults() {
    let c = ok("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.100/24\"]\n");
    let ha = c.ha.expect("[ha]");
    assert_eq!(ha.priority, 100);
    assert_eq!(ha.advert_interval, Duration::from_secs(1));
    assert!(ha.preempt);
    assert!(ha.peers.is_empty());
    assert_eq!(ha.track_weight, None);
}

#[test]
fn ha_errors_are_located() {
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 0\npriority = 0\nadvert_interval = \"5ms\"\n\
         vips = [\"10.0.0.0/24\", \"2001:db8::1/64\"]\npeers = [\"2001:db8::2\"]\ntrack = [\"nope\"]\n\
         preemt = true\n",
    );
    has(&e, "t.toml:3:1: ha.vrid: vrid must be from 1 to 255");
    has(&e, "ha.priority: priority must be from 1 to 255");
    has(
        &e,
        "ha.advert_interval: advert_interval must be a multiple of 10ms",
    );
    has(&e, "10.0.0.0/24 is a network address");
    has(&e, "ha.track[0]: no pool named \"nope\"");
    has(&e, "unknown key `preemt` (did you mean `preempt`?)");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"10.0.0.1/24\", \"2001:db8::1/64\"]\n",
    );
    has(&e, "IPv4 and IPv6 VIPs cannot share one virtual router");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"10.0.0.1/24\"]\npeers = [\"fe80::1\"]\n",
    );
    has(&e, "peers must be of the VIPs' address family");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"2001:db8::100/64\"]\npeers = [\"2001:db8::2\"]\n",
    );
    has(
        &e,
        "ha.peers: IPv6 peers must be link-local addresses (fe80::/10)",
    );
    ok("[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"2001:db8::100/64\"]\npeers = [\"fe80::2\"]\n");
    let e = errs("[ha]\nvrid = 5\n");
    has(&e, "missing required key `interface`");
    has(&e, "missing required key `vips`");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"10.0.0.1/24\"]\nsync = { listen = \"10.0.0.1:7500\", key = \"short\" }\n",
    );
    has(&e, "the sync key must be at least 16 characters");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"10.0.0.1/24\"]\nconfig_sync = true\n",
    );
    has(&e, "ha.config_sync: config_sync needs `sync`");
    let c = ok("[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"10.0.0.1/24\"]\nconfig_sync = true\nsync = { listen = \"10.0.0.1:7500\", peers = [\"10.0.0.2:7500\"], key = \"a-sync-key-0123456789\" }\n");
    assert!(c.ha.is_some_and(|h| h.config_sync));
}

#[test]
fn ha_vrrp_version_2_for_vrrpv2_peers() {
    let c = ok("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.100/24\"]\nvrrp_version = 2\nadvert_interval = \"2s\"\n");
    let ha = c.ha.expect("[ha]");
    assert_eq!(
        (ha.vrrp_version, ha.advert_interval),
        (2, Duration::from_secs(2))
    );
    assert_eq!(
        ok("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.100/24\"]\n")
            .ha
            .expect("[ha]")
            .vrrp_version,
        3
    );
    let e = errs("[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.100/24\"]\nvrrp_version = 2\nadvert_interval = \"100ms\"\n");
    has(&e, "t.toml:6:1: ha.advert_interval: with vrrp_version = 2, advert_interval must be whole seconds");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"2001:db8::1/64\"]\nvrrp_version = 2\n",
    );
    has(&e, "ha.vrrp_version: VRRPv2 runs over IPv4 only");
    let e = errs(
        "[ha]\ninterface = \"eth0\"\nvrid = 1\nvips = [\"10.0.0.100/24\"]\nvrrp_version = 4\n",
    );
    has(
        &e,
        "ha.vrrp_version: vrrp_version must be 3 (RFC 5798) or 2",
    );
}

#[test]
fn bgp_is_read_and_checked() {
    let c = ok("[bgp]\nspeaker = \"bird\"\ncontrol = \"/run/bird/bird.ctl\"\nannounce = [\"10.0.0.100/32\"]\n");
    let b = c.bgp.expect("[bgp]");
    assert_eq!(b.speaker, BgpSpeaker::Bird);
    assert_eq!(b.announce.len(), 1);
    let e = errs("[bgp]\nspeaker = \"quagga\"\ncontrl = \"x\"\n");
    has(&e, "bgp.speaker");
    has(&e, "unknown key `contrl` (did you mean `control`?)");
    assert_eq!(b.include, crate::DEFAULT_BGP_INCLUDE);
    assert_eq!(b.interface, crate::DEFAULT_BGP_INTERFACE);
    let e = errs("[bgp]\nspeaker = \"bird\"\ncontrol = \"\"\nannounce = []\ninclude = \"rel.conf\"\ninterface = \"much-too-long-name\"\n");
    has(&e, "bgp.announce: list at least one prefix");
    has(
        &e,
        "bgp.control: expected the path of BIRD's control socket",
    );
    has(&e, "bgp.include: expected an absolute path");
    has(&e, "bgp.interface: expected an interface name of 1 to 15");
    // active_active: no VRRP, so its keys are errors; `node` and `sync` stay.
    let c = ok("[ha]\nmode = \"active_active\"\nnode = \"lb1\"\n");
    let ha = c.ha.expect("[ha]");
    assert_eq!(
        (ha.mode, ha.node.as_deref()),
        (HaMode::ActiveActive, Some("lb1"))
    );
    let e = errs("[ha]\nmode = \"active_active\"\nvrid = 5\nvips = [\"10.0.0.1/24\"]\n");
    has(
        &e,
        "ha.vrid: `vrid` is a VRRP key; with mode = \"active_active\" there is no VRRP",
    );
    has(&e, "ha.vips: `vips` is a VRRP key");
}

#[test]
fn alert_rules_read_with_defaults() {
    let c = ok(r#"
[[alert]]
name = "ops"
on = ["member_down", "pool_below_min", "site_down", "link_down", "failover", "cert_expiry"]
webhook = "http://127.0.0.1:9093/api/v2/alerts"
syslog = "127.0.0.1:514"
smtp = { server = "127.0.0.1:25", from = "fulcrum@lb1.example.org", to = ["oncall@example.org"] }
repeat = "1h"

[[alert]]
name = "certs"
on = ["cert_expiry"]
syslog = "[::1]:514"
cert_expiry = "14d"
hold = "0s"
"#);
    assert_eq!(c.alerts.len(), 2);
    let a = &c.alerts[0];
    assert_eq!(a.on.len(), 6);
    assert_eq!(a.repeat, Duration::from_secs(3600));
    assert_eq!(a.hold, Duration::from_secs(5));
    assert_eq!(a.cert_expiry, Duration::from_secs(30 * 86400));
    assert_eq!(a.smtp.as_ref().unwrap().to, vec!["oncall@example.org"]);
    assert_eq!(c.alerts[1].cert_expiry, Duration::from_secs(14 * 86400));
    assert_eq!(c.alerts[1].hold, Duration::ZERO);
}

#[test]
fn alert_rule_errors_name_the_key() {
    let e = errs("[[alert]]\nname = \"x\"\non = [\"member_dwn\"]\nsyslog = \"127.0.0.1:514\"\n");
    has(&e, "t.toml:3:");
    has(&e, "member_down");
    let e = errs("[[alert]]\nname = \"x\"\non = [\"member_down\"]\n");
    has(&e, "webhook, syslog or smtp");
    let e = errs("[[alert]]\nname = \"x\"\non = [\"member_down\"]\nwebhook = \"ftp://am/\"\n");
    has(&e, "alert[0].webhook");
    has(&e, "http:// or https:// URL");
    let c = ok("[[alert]]\nname = \"x\"\non = [\"member_down\"]\nwebhook = \"https://am.example/hook\"\nwebhook_verify = false\n");
    assert!(!c.alerts[0].webhook_verify);
    let e = errs("[[alert]]\nname = \"x\"\non = [\"member_down\"]\nwebhook = \"http://am/\"\nwebhook_ca = \"/nonexistent.pem\"\n");
    has(&e, "alert[0].webhook_ca");
    has(&e, "only with an https:// `webhook`");
    has(&e, "/nonexistent.pem");
    let e = errs(
        "[[alert]]\nname = \"x\"\non = [\"member_down\"]\nsmtp = { server = \"127.0.0.1:25\", from = \"a@b.c\", to = [\"nobody\"] }\n",
    );
    has(&e, "alert[0].smtp.to");
    let e = errs("[[alert]]\nname = \"x\"\non = []\nsyslog = \"127.0.0.1:514\"\n");
    has(&e, "one or more of");
    let e = errs("[[alert]]\nname = \"x\"\non = [\"member_down\"]\nsyslog = \"127.0.0.1:514\"\nrepaet = \"1h\"\n");
    has(&e, "did you mean `repeat`");
}

#[test]
fn snmp_monitor_keys() {
    let c = ok("[[monitor]]\nname = \"load\"\ntype = \"snmp\"\noid = \".1.3.6.1.4.1.2021.10.1.5.1\"\nmax = 400\n");
    assert_eq!(c.monitors[0].snmp.community, "public");
    assert_eq!(c.monitors[0].snmp.oid.as_ref().unwrap().len(), 11);
    assert_eq!(c.monitors[0].snmp.max, Some(400.0));
    let e = errs("[[monitor]]\nname = \"load\"\ntype = \"snmp\"\n");
    has(&e, "type snmp needs `oid`");
    let c = ok("[[monitor]]\nname = \"v3\"\ntype = \"snmp\"\nversion = \"3\"\nuser = \"u\"\nauth_password = \"12345678\"\npriv_password = \"abcdefgh\"\noid = \"1.3.6.1.2.1.1.3.0\"\n");
    let v3 = c.monitors[0].snmp.v3.as_ref().expect("v3");
    assert_eq!(v3.auth, crate::SnmpAuth::Sha256);
    assert_eq!(
        v3.privacy.as_ref().map(|p| p.0),
        Some(crate::SnmpPriv::Aes128)
    );
    let e = errs("[[monitor]]\nname = \"v3\"\ntype = \"snmp\"\nversion = \"3\"\nauth_password = \"short\"\npriv_protocol = \"aes128\"\noid = \"1.3.6.1.2.1.1.3.0\"\n");
    has(
        &e,
        "monitor[0].auth_password: must be at least 8 characters",
    );
    has(&e, "monitor[0].priv_protocol: needs `priv_password`");
    has(&e, "needs `user` and `auth_password`");
    let e = errs(
        "[[monitor]]\nname = \"v2\"\ntype = \"snmp\"\nuser = \"u\"\noid = \"1.3.6.1.2.1.1.3.0\"\n",
    );
    has(&e, "monitor[0].user: only with `version = \"3\"`");
    let e = errs("[[monitor]]\nname = \"v\"\ntype = \"snmp\"\nversion = \"1\"\noid = \"1.3.6.1.2.1.1.3.0\"\n");
    has(&e, "expected \"2c\" or \"3\"");
    let e = errs("[[monitor]]\nname = \"load\"\ntype = \"snmp\"\noid = \"laLoadInt.1\"\n");
    has(&e, "monitor[0].oid");
    has(&e, "not a numeric OID");
    let e = errs("[[monitor]]\nname = \"load\"\ntype = \"snmp\"\noid = \"1.3.6\"\nmax = 0\n");
    has(&e, "monitor[0].max");
    let e = errs("[[monitor]]\nname = \"web\"\ntype = \"http\"\ncommunity = \"x\"\n");
    has(&e, "`community` applies to monitor type snmp");
}

#[test]
fn pool_tls_reencrypts_for_message_services_but_not_udp() {
    let c = ok(&MESSAGE.replace(
        "algorithm = \"least_request\"",
        "algorithm = \"least_request\"\ntls = { sni = \"host.internal\" }",
    ));
    let tls = c.pools[0].tls.as_ref().expect("pool tls");
    assert!(tls.verify);
    assert_eq!(tls.sni.as_deref(), Some("host.internal"));
    let e = errs(&UDP.replace(
        "name = \"radius\"\nmonitors",
        "name = \"radius\"\ntls = {}\nmonitors",
    ));
    has(
        &e,
        "pool[0].tls: `tls` applies to pools of http, https, tcp and message services; this pool serves udp",
    );
}

/// A section whose elements were read but failed their own checks still has every name, so
/// references into it are still checked; one whose element could not be read at all does not.
#[test]
fn references_into_sections_with_errors() {
    let monitors = "[[monitor]]\nname = \"d\"\ntype = \"dns\"\n";
    let e = errs(&format!(
        "{}\n{monitors}",
        TCP.replace("monitors = [\"tcp\"]", "monitors = [\"dnss\"]")
    ));
    has(&e, "monitor[1]: type dns needs `query`");
    has(&e, "pool[0].monitors[0]: no monitor named \"dnss\"");
    let e = errs(&format!(
        "{}\n[[monitor]]\nname = 7\ntype = \"tcp\"\n",
        TCP.replace("monitors = [\"tcp\"]", "monitors = [\"seven\"]")
    ));
    has(&e, "monitor[1].name: expected a string");
    assert!(!e.iter().any(|m| m.contains("no monitor named")), "{e:?}");
}

#[test]
fn weight_share_is_for_monitors_that_report_a_weight() {
    let e = errs("[[monitor]]\nname = \"m\"\ntype = \"snmp\"\noid = \"1.3.6.1.2.1.1.3.0\"\nmax = 10\nweight_share = 0\n");
    has(&e, "must be from 1 to 100");
    let e = errs("[[monitor]]\nname = \"m\"\ntype = \"http\"\nweight_share = 2\n");
    has(&e, "weight_share");
    let e = errs("[[monitor]]\nname = \"m\"\ntype = \"snmp\"\noid = \"1.3.6.1.2.1.1.3.0\"\nweight_share = 2\n");
    has(&e, "reports a weight only with `max`");
    let c = ok("[[monitor]]\nname = \"m\"\ntype = \"snmp\"\noid = \"1.3.6.1.2.1.1.3.0\"\nmax = 10\nweight_share = 3\n");
    assert_eq!(c.monitors[0].weight_share, 3);
}

#[test]
fn combined_weight_readings_need_an_algorithm_that_uses_weights() {
    let snmp = |name: &str| {
        format!("[[monitor]]\nname = \"{name}\"\ntype = \"snmp\"\noid = \"1.3.6.1.2.1.1.3.0\"\nmax = 100\n")
    };
    let two = format!(
        "{}\n{}\n[[monitor]]\nname = \"agent\"\ntype = \"agent\"\nport = 9999\n",
        snmp("cpu"),
        snmp("mem")
    );
    let pool = |algorithm: &str, monitors: &str| {
        TCP.replace("algorithm = \"weighted_round_robin\"", algorithm)
            .replace("monitors = [\"tcp\"]", monitors)
    };
    let e = errs(&format!(
        "{}\n{two}",
        pool(
            "algorithm = \"first_available\"",
            "monitors = [\"tcp\", \"cpu\", \"agent\"]"
        )
    ));
    has(&e, "t.toml:11:1: pool[0].algorithm: first_available counts every member as weight 1, so the weight readings of monitors \"cpu\" and \"agent\"");
    // Unwritten, the algorithm is round_robin: the error still names the pool's key.
    let e = errs(&format!(
        "{}\n{two}",
        pool("", "monitors = [\"cpu\", \"mem\"]")
    ));
    has(
        &e,
        "pool[0].algorithm: round_robin counts every member as weight 1",
    );
    // One reading combines with nothing (an agent is often there for its drain and down words).
    ok(&format!("{}\n{two}", pool("", "monitors = [\"agent\"]")));
    for algorithm in [
        "dynamic_feedback",
        "weighted_least_connections",
        "least_request",
    ] {
        ok(&format!(
            "{}\n{two}",
            pool(
                &format!("algorithm = \"{algorithm}\""),
                "monitors = [\"cpu\", \"mem\", \"agent\"]"
            )
        ));
    }
}

#[test]
fn nntp_monitor_keys() {
    let c = ok("[[monitor]]\nname = \"news\"\ntype = \"nntp\"\nnewsgroup = \"comp.lang.rust\"\nusername = \"probe\"\npassword = \"p\"\n");
    assert_eq!(c.monitors[0].kind, MonitorKind::Nntp);
    assert_eq!(c.monitors[0].newsgroup.as_deref(), Some("comp.lang.rust"));
    ok("[[monitor]]\nname = \"news\"\ntype = \"nntp\"\n");
    let e = errs("[[monitor]]\nname = \"news\"\ntype = \"nntp\"\nnewsgroup = \"comp.*\"\n");
    has(
        &e,
        "t.toml:4:1: monitor[0].newsgroup: \"comp.*\" is not a newsgroup name",
    );
    let e = errs("[[monitor]]\nname = \"news\"\ntype = \"nntp\"\nnewsgroup = \"a b\"\n");
    has(&e, "is not a newsgroup name");
    let e = errs("[[monitor]]\nname = \"news\"\ntype = \"nntp\"\nusername = \"probe\"\n");
    has(&e, "give both `username` and `password`, or neither");
    let e = errs("[[monitor]]\nname = \"m\"\ntype = \"smtp\"\nnewsgroup = \"misc.test\"\n");
    has(
        &e,
        "`newsgroup` applies to monitor type nntp; this monitor is smtp",
    );
    assert_eq!(site_monitor_port(MonitorKind::Nntp), Some(119));
}

#[test]
fn weight_reading_refusal_lists_every_monitor() {
    let snmp = |name: &str| {
        format!("[[monitor]]\nname = \"{name}\"\ntype = \"snmp\"\noid = \"1.3.6.1.2.1.1.3.0\"\nmax = 100\n")
    };
    let e = errs(&format!(
        "{}\n{}\n{}\n{}",
        TCP.replace("algorithm = \"weighted_round_robin\"\n", "")
            .replace(
                "monitors = [\"tcp\"]",
                "monitors = [\"cpu\", \"mem\", \"disk\"]"
            ),
        snmp("cpu"),
        snmp("mem"),
        snmp("disk")
    ));
    has(
        &e,
        "weight readings of monitors \"cpu\", \"mem\" and \"disk\" (combined",
    );
}

/// `vrf`: a device name; the same address and port in two VRFs are two listeners, twice in one
/// VRF a conflict; not on in-kernel forwarding nor on link pools.
#[test]
fn vrf_is_part_of_a_listeners_identity() {
    let vs = |name: &str, vrf: &str| {
        format!("[[virtual_service]]\nname = \"{name}\"\nlisten = \"10.0.0.1:80\"\nprotocol = \"tcp\"\npool = \"p\"\n{vrf}\n")
    };
    let pool = "[[pool]]\nname = \"p\"\nvrf = \"blue\"\n";
    let c = ok(&format!(
        "{}{}{pool}",
        vs("a", "vrf = \"blue\""),
        vs("b", "vrf = \"red\"")
    ));
    assert_eq!(c.virtual_services[0].vrf.as_deref(), Some("blue"));
    assert_eq!(c.pools[0].vrf.as_deref(), Some("blue"));
    ok(&format!(
        "{}{}{pool}",
        vs("a", "vrf = \"blue\""),
        vs("b", "")
    ));
    let e = errs(&format!(
        "{}{}{pool}",
        vs("a", "vrf = \"blue\""),
        vs("b", "vrf = \"blue\"")
    ));
    has(
        &e,
        "virtual_service[1].listen[0]: 10.0.0.1:80 in vrf \"blue\" is already used by virtual_service[0] (a)",
    );
    let e = errs(&format!("{}{pool}", vs("a", "vrf = \"bl ue\"")));
    has(
        &e,
        "virtual_service[0].vrf: \"bl ue\" is not a VRF device name",
    );
    let e = errs(&format!(
        "{}{pool}",
        vs(
            "a",
            "vrf = \"blue\"\nforwarding = \"nat\"\ninterfaces = [\"eth0\"]"
        )
    ));
    has(
        &e,
        "virtual_service[0].vrf: `vrf` applies to proxied services",
    );
    let e = errs(&format!(
        "{}{pool}[[pool]]\nname = \"l\"\nkind = \"link\"\nvrf = \"blue\"\n",
        vs("a", "")
    ));
    has(&e, "pool[1].vrf: `vrf` applies to server pools");
}
