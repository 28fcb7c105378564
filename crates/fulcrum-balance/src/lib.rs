//! Members, pools, schedulers, the health state machine and persistence tables — no I/O.
//!
//! One library for every kind of member: the same weighted least connections picks a server, a
//! link or a site. Data planes ask a `Pool` for a member, then report what happened to it.

pub mod attempts;
pub mod clock;
pub mod elastic;
pub mod hash;
pub mod health;
pub mod member;
pub mod persist;
pub mod pool;
pub mod sched;
pub mod shares;

pub use attempts::Attempts;
pub use elastic::{ElasticAction, ElasticEvent, ElasticState};
pub use health::{CheckSpec, CheckState, HealthMachine, HealthReport, Transition};
pub use member::{
    AgentState, ConnectionGuard, LiveBytes, Member, MemberStats, RequestGuard, LIVE_BATCH,
    WEIGHT_SCALE,
};
pub use persist::{Feed, PersistKey, PersistTable, TableSpec};
pub use pool::{Picked, Pool};
pub use sched::{PickContext, Scheduler};
pub use shares::{kernel_slots, link_shares, slot_table, LinkLoad};

#[cfg(test)]
mod tests;
