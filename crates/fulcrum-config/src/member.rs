//! What every kind of member shares (server, link, gateway): the scheduling algorithms, the
//! operator's state and the weight bound, and a server pool's member.

use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::string_enum;
use crate::types::read_table;
use std::net::SocketAddr;

string_enum!(Algorithm {
    RoundRobin = "round_robin",
    WeightedRoundRobin = "weighted_round_robin",
    LeastConnections = "least_connections",
    WeightedLeastConnections = "weighted_least_connections",
    WeightedLeastTraffic = "weighted_least_traffic",
    FastestResponse = "fastest_response",
    DynamicFeedback = "dynamic_feedback",
    Hash = "hash",
    Priority = "priority",
    FirstAvailable = "first_available",
    LeastRequest = "least_request",
    BandwidthRatio = "bandwidth_ratio",
    Proximity = "proximity",
    Rtt = "rtt",
    Spillover = "spillover",
});

impl Algorithm {
    /// Whether the algorithm counts every member as weight 1 (configured weights and the
    /// monitors' weight readings do not change its choice).
    pub fn ignores_weights(self) -> bool {
        matches!(
            self,
            Algorithm::RoundRobin | Algorithm::LeastConnections | Algorithm::FirstAvailable
        )
    }
}

string_enum!(
    /// Operator-set state of a member.
    AdminState {
        Enabled = "enabled",
        Disabled = "disabled",
        Drain = "drain",
    }
);

#[derive(Debug, Clone)]
pub struct Member {
    pub address: SocketAddr,
    pub weight: u32,
    pub priority: i32,
    pub max_connections: u32,
    pub state: AdminState,
    /// Takes traffic only while its pool's `elastic` utilisation asks for it (Fulcrum addition).
    pub standby: bool,
}

/// The largest weight a member may have (F5's ratio range); big enough for capacity ratios.
pub const MAX_WEIGHT: u32 = 65535;

/// A member's `weight` (default 1); one over MAX_WEIGHT is an error at `node`.
pub(crate) fn read_weight(node: &Node<'_>, t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> u32 {
    let weight = t.opt(cx, "weight").unwrap_or(1);
    if weight > MAX_WEIGHT {
        cx.error_at(
            node.span.clone(),
            &format!("{}.weight", t.path()),
            format!("{weight} is too large; expected 0 to {MAX_WEIGHT}"),
        );
    }
    weight
}

impl FromNode for Member {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let address = t.req(cx, "address");
            let weight = read_weight(node, t, cx);
            Some(Member {
                weight,
                priority: t.opt(cx, "priority").unwrap_or(0),
                max_connections: t.opt(cx, "max_connections").unwrap_or(0),
                state: t.opt(cx, "state").unwrap_or(AdminState::Enabled),
                standby: t.opt(cx, "standby").unwrap_or(false),
                address: address?,
            })
        })
    }
}
