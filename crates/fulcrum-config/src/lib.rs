//! Fulcrum's configuration: the TOML contract (docs/configuration.md), read into typed structs with every
//! error located by file, line, column and key path.

mod accel;
mod access;
mod admin;
mod alert;
mod bgp;
mod dns;
pub mod edit;
mod elastic;
mod error;
mod filter;
mod forwarding;
mod gslb;
mod ha;
mod http;
mod ip;
mod iptable;
mod link;
mod member;
mod message;
mod monitor;
mod persistence;
mod pool;
mod protocol;
mod reader;
mod rtsp;
mod rule;
mod schema;
mod service;
pub mod shared;
mod snmp;
mod stream;
mod tcp;
mod tls;
mod types;
mod udp;
mod validate;

pub use monitor::{DNS_QUERY_TYPES, DNS_RCODES};

use std::path::{Path, PathBuf};

pub use accel::{CompressionLevels, Keepalive, KeepaliveSetting, TcpTuning, TCP_TUNING_KEYS};
pub use access::AccessList;
pub use admin::{token_problem, token_too_short, Admin, DEFAULT_TOKEN_FILE, MIN_TOKEN_LEN};
pub use alert::{AlertEvent, AlertRule, Smtp};
pub use bgp::{Bgp, BgpOspf, BgpSpeaker, DEFAULT_BGP_INCLUDE, DEFAULT_BGP_INTERFACE};
pub use dns::{Dns, RateLimit, Zone};
pub use elastic::{Elastic, ElasticOn};
pub use error::{did_you_mean, ConfigError, ConfigErrors};
pub use filter::{
    Filter, FilterOnError, DEFAULT_FILTER_BUDGET, DEFAULT_FILTER_DISABLE_AFTER,
    DEFAULT_FILTER_MEMORY,
};
pub use forwarding::{FlowLimits, Forwarding, ForwardingOptions, XdpMode, FORWARDING_KEYS};
pub use gslb::{Gslb, GslbAlgorithm, GslbName, Proximity as GslbProximity, Site};
pub use ha::{ConntrackSync, Ha, HaMode, HaSync, Vip, MAX_ADVERT_INTERVAL, MIN_ADVERT_INTERVAL};
pub use http::{
    AccessLog, Cache, Compression, CompressionAlgorithm, ForwardHeaders, GslbRedirect, HttpOptions,
    HttpPoolOptions, HttpSection, LogFormat, SameSite, StatusMatch, StatusSet, HTTP_POOL_KEYS,
    HTTP_SECTION_KEYS,
};
pub use ip::IpSection;
pub use iptable::{IpTable, CONTINENTS, COUNTRIES};
pub use link::{
    parse_rate, Bandwidth, GatewayHash, GatewayMember, GatewayService, L4Protocol, LinkMember,
    LinkNat, LinkProbe, LinkTarget, Outbound, OutboundPersistence, OutboundRule, PoolKind, Snat6,
    GATEWAY_ALGORITHMS, LINK_ALGORITHMS, MAX_LINKS,
};
pub use member::{AdminState, Algorithm, Member, MAX_WEIGHT};
pub use message::*;
pub use monitor::{Monitor, MonitorKind, MONITOR_KIND_KEYS};
pub use persistence::{
    radius_attribute, Malformed, Persistence, PersistenceKind, RADIUS_ATTRIBUTES,
};
pub use pool::{HashKey, Pool, Reuse, SlowStart, UpstreamTls};
pub use protocol::{Protocol, ProxyProtocol};
pub use reader::{Cx, FromNode, Locations, Node, Shape, TableReader};
pub use rtsp::RTSP_KEYS;
pub use rule::{HeaderEdits, Rewrite, Rule, RuleAction, TimeRange};
pub use schema::*;
pub use service::{ServiceKind, VirtualService};
pub use snmp::{parse_oid, SnmpAuth, SnmpOptions, SnmpPriv, SnmpV3};
pub use stream::{MemberSource, StreamOptions, SOURCE_KEYS, STREAM_KEYS};
pub use tcp::{FtpOptions, RtspOptions, TcpSection, FTP_KEYS};
pub use tls::{
    ClientAuth, TlsCert, TlsOptions, TlsTermination, TlsVersion, ALPN_PROTOCOLS, TLS_KEYS,
};
pub use types::{
    parse_duration, parse_prefix, parse_size, read_table, ByteSize, KeyValues, OneOrMany,
};
pub use udp::{UdpMode, UdpSection, DEFAULT_MAX_SESSIONS, UDP_KEYS};
pub use validate::site_monitor_port;

/// Reads, parses and validates a configuration file.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: file.clone(),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read the file: {e}"),
        }])
    })?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    parse(&text, &file, &base)
}

/// Parses and validates configuration text; `file` names it in errors, relative paths in it are
/// taken from `base_dir`.
pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Config, ConfigErrors> {
    let doc = match toml_edit::Document::parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            let mut cx = Cx::new(file, text);
            let message = e.message().trim().to_string();
            cx.error_at(e.span(), "", format!("TOML syntax error: {message}"));
            return Err(ConfigErrors(cx.errors));
        }
    };
    let mut cx = Cx::new(file, text);
    let root = Node::root(doc.as_table());
    let config = schema::read_config(&root, &mut cx);
    let mut errors = std::mem::take(&mut cx.errors);
    let Some(mut config) = config else {
        return Err(ConfigErrors(errors));
    };
    config.locations = cx.locations;
    // References into a section with an element that could not be read at all (no name, wrong
    // type) are not reported: the missing target may be that element. A section whose elements
    // were read but failed their own checks still has every name.
    errors.extend(validate::validate(&config, &cx.failed));
    if !errors.is_empty() {
        errors.sort_by_key(|e| (e.line, e.column));
        errors.dedup();
        return Err(ConfigErrors(errors));
    }
    resolve_paths(&mut config, base_dir);
    Ok(config)
}

fn resolve_paths(config: &mut Config, base: &Path) {
    let fix = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    };
    fix(&mut config.admin.token_file);
    for vs in &mut config.virtual_services {
        if let ServiceKind::Http(h) = &mut vs.kind {
            if let Some(log) = &mut h.options.access_log {
                fix(&mut log.path);
            }
            for f in &mut h.filters {
                fix(&mut f.module);
            }
        }
        if let ServiceKind::Message(m) = &mut vs.kind {
            if let Some(w) = &mut m.framing.wasm {
                fix(w);
            }
        }
        if let Some(tls) = vs.tls_mut() {
            for t in &mut tls.certs {
                fix(&mut t.cert);
                fix(&mut t.key);
                if let Some(o) = &mut t.ocsp {
                    fix(o);
                }
            }
            if let Some(ca) = &mut tls.options.client_ca {
                fix(ca);
            }
        }
    }
    for pool in &mut config.pools {
        if let Some(ca) = pool.tls.as_mut().and_then(|t| t.ca.as_mut()) {
            fix(ca);
        }
    }
    if let Some(dns) = &mut config.dns {
        for z in &mut dns.zones {
            if let Some(f) = &mut z.file {
                fix(f);
            }
        }
    }
    if let Some(f) = &mut config.admin.state_file {
        fix(f);
    }
    if let Some(f) = &mut config.admin.socket {
        fix(f);
    }
    if let Some(t) = &mut config.admin.tls {
        fix(&mut t.cert);
        fix(&mut t.key);
    }
    for t in &mut config.ip_tables {
        if let Some(f) = &mut t.file {
            fix(f);
        }
        if let Some(f) = &mut t.geoip {
            fix(f);
        }
    }
}

#[cfg(test)]
mod tests;
