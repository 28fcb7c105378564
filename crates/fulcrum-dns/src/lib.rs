//! Fulcrum's DNS: an authoritative server (zones from master files and inline records) whose
//! GSLB names are answered by site health, client region and load, IP tables (ISP lists and
//! GeoIP), and the exchange of site state between Fulcrum instances.

pub mod catalog;
pub mod engine;
pub mod gslb;
pub mod iptable;
pub mod rrl;
pub mod table;
pub mod wire;
pub mod zone;

pub use engine::{Action, Counters, Engine, Transport};
pub use gslb::{Client, GslbState};
