//! What this process wrote into the loaded program's maps: the services (VIP index and keys,
//! what their ring was built from, access list, flow limits) and the reals (member number,
//! next hop), beside the `Dataplane` they were written through. The binary's plane fills them
//! from the configuration; `refresh` keeps them current and `flow_sync` reads them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_balance::Pool;

use crate::{Dataplane, FlowLimits, RealSlots, VipKey};

/// One in-kernel service.
pub struct Service {
    pub name: String,
    pub index: u32,
    /// MODE_* and VIP_F_* as written into the vips map.
    pub flags: u32,
    pub pool: Arc<Pool>,
    pub keys: Vec<VipKey>,
    /// Ring weights last written, per pool member.
    pub weights: Vec<u32>,
    /// What the ring was last built from (member names and real numbers): a reload that
    /// replaces members with others of the same weights must still rebuild it.
    pub built_from: (Vec<String>, Vec<u32>),
    /// The access list in force (its Debug text: the lists as configured), its generation in
    /// the `acl` trie and the VIP flags it set.
    pub acl: (String, bool, u32),
    /// `flow_limits` as written into `vip_limits`.
    pub limits: Option<FlowLimits>,
}

/// One member address (a real).
pub struct RealState {
    pub index: u32,
    pub resolved: bool,
    /// The next hop written into the reals map (MAC, egress interface).
    pub hop: Option<([u8; 6], u32)>,
    /// Flows were dropped from the table since the member last accepted traffic.
    pub forgotten: bool,
    pub last_try: Option<Instant>,
    pub nat_port: u16,
}

impl RealState {
    /// A member just numbered: not resolved yet.
    pub fn new(index: u32) -> RealState {
        RealState {
            index,
            resolved: false,
            hop: None,
            forgotten: false,
            last_try: None,
            nat_port: 0,
        }
    }
}

/// The loaded program and what was written into it.
pub struct State {
    pub dp: Dataplane,
    pub services: Vec<Service>,
    pub reals: HashMap<SocketAddr, RealState>,
    /// Real numbers, reused once a member left every pool and its flows are gone.
    pub slots: RealSlots,
    /// The timeouts the program runs with (a flow idle longer is not sent to the peer).
    pub timeouts: (Duration, Duration),
    /// Lives as long as this loaded program: the thread draining its flow events ends with it.
    _alive: Arc<()>,
    /// Flows of the services with `flow_limits.max` at the last recount, by VIP index.
    pub flow_counts: HashMap<u32, u64>,
    pub last_recount: Option<Instant>,
}

impl State {
    /// `dp` freshly loaded, nothing written yet; `alive` is what the flow-event thread watches
    /// (`flow_sync::drain_flow_events`).
    pub fn new(dp: Dataplane, alive: Arc<()>) -> State {
        State {
            dp,
            services: Vec::new(),
            reals: HashMap::new(),
            slots: RealSlots::default(),
            timeouts: (Duration::from_secs(900), Duration::from_secs(300)),
            _alive: alive,
            flow_counts: HashMap::new(),
            last_recount: None,
        }
    }
}
