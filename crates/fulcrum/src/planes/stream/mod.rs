//! What every stream plane (tcp, http, https, message) puts in front of its own handler.

pub mod access;
pub mod snat;
pub mod transparent;
pub mod tuning;
