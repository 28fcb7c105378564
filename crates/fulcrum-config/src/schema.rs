//! The typed configuration and how each table is read.
//!
//! Defaults live here, next to the key they belong to; docs/configuration.md mirrors them. A
//! virtual service is read by section: service.rs and the protocol modules (tcp.rs, udp.rs,
//! http.rs, message.rs).

use std::time::Duration;

use crate::admin::Admin;
use crate::dns::Dns;
use crate::gslb::Gslb;
use crate::iptable::IpTable;
use crate::monitor::Monitor;
use crate::persistence::Persistence;
use crate::pool::Pool;
use crate::reader::{Cx, FromNode, Node, Shape};
use crate::service::VirtualService;
use crate::types::read_table;
use crate::Locations;

/// A whole, validated configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub global: Global,
    pub admin: Admin,
    pub virtual_services: Vec<VirtualService>,
    pub pools: Vec<Pool>,
    pub monitors: Vec<Monitor>,
    pub persistence: Vec<Persistence>,
    pub dns: Option<Dns>,
    pub ip_tables: Vec<IpTable>,
    pub gslb: Gslb,
    /// `[ha]`: VRRP active/standby (crate fulcrum-ha).
    pub ha: Option<crate::ha::Ha>,
    /// `[bgp]`: announce the VIPs through a local BGP speaker (active_active).
    pub bgp: Option<crate::bgp::Bgp>,
    /// `[[alert]]` rules (crate::alert).
    pub alerts: Vec<crate::alert::AlertRule>,
    /// Link load balancing of flows leaving the LAN (`[[outbound]]`).
    pub outbound: Vec<crate::link::Outbound>,
    /// Firewall sandwich sides (`[[gateway_service]]`).
    pub gateway_services: Vec<crate::link::GatewayService>,
    /// Where key paths stand in the file, for errors found after parsing (e.g. at bind time).
    pub locations: Locations,
}

impl Config {
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }
    pub fn monitor(&self, name: &str) -> Option<&Monitor> {
        self.monitors.iter().find(|m| m.name == name)
    }
    pub fn persistence(&self, name: &str) -> Option<&Persistence> {
        self.persistence.iter().find(|p| p.name == name)
    }
}

#[derive(Debug, Clone)]
pub struct Global {
    /// Worker threads of the data planes; 0 = one per CPU.
    pub workers: usize,
    /// On SIGTERM, how long established connections may run before they are closed.
    pub shutdown_timeout: Duration,
    /// Client connections of every stream service together; 0 = derived from the descriptor
    /// limit, keeping a reserve for health checks, the API and DNS (see docs/operations.md).
    pub max_connections: u64,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            workers: 0,
            shutdown_timeout: Duration::from_secs(30),
            max_connections: 0,
        }
    }
}

impl FromNode for Global {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Global::default();
            Some(Global {
                workers: t.opt(cx, "workers").unwrap_or(d.workers),
                shutdown_timeout: t.opt(cx, "shutdown_timeout").unwrap_or(d.shutdown_timeout),
                max_connections: t.opt(cx, "max_connections").unwrap_or(d.max_connections),
            })
        })
    }
}

/// Reads the whole document; cross-references are checked afterwards by `validate`.
pub(crate) fn read_config(root: &Node<'_>, cx: &mut Cx<'_>) -> Option<Config> {
    if !matches!(root.shape(), Shape::Table(_)) {
        cx.error(root, "the document must be a table");
        return None;
    }
    read_table(root, cx, |t, cx| {
        Some(Config {
            global: t.opt(cx, "global").unwrap_or_default(),
            admin: t.opt(cx, "admin").unwrap_or_default(),
            virtual_services: t.opt(cx, "virtual_service").unwrap_or_default(),
            pools: t.opt(cx, "pool").unwrap_or_default(),
            monitors: t.opt(cx, "monitor").unwrap_or_default(),
            persistence: t.opt(cx, "persistence").unwrap_or_default(),
            dns: t.opt(cx, "dns"),
            ip_tables: t.opt(cx, "ip_table").unwrap_or_default(),
            gslb: t.opt(cx, "gslb").unwrap_or_default(),
            ha: t.opt(cx, "ha"),
            bgp: t.opt(cx, "bgp"),
            alerts: t.opt(cx, "alert").unwrap_or_default(),
            outbound: t.opt(cx, "outbound").unwrap_or_default(),
            gateway_services: t.opt(cx, "gateway_service").unwrap_or_default(),
            locations: Locations::default(),
        })
    })
}
