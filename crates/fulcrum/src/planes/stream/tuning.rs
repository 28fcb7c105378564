//! Client-side TCP tuning of virtual services (`tcp = { … }`, a Fulcrum addition): checked
//! against the running kernel when a configuration is loaded, applied to the listening sockets
//! after each apply (reloads update listeners that stay).

use fulcrum_config::{Config, ConfigError};
use fulcrum_net::Listeners;

/// A congestion control the kernel does not offer is a config error naming the key.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for (i, vs) in config.virtual_services.iter().enumerate() {
        let Some(c) = vs.tcp_tuning().and_then(|t| t.congestion.as_deref()) else {
            continue;
        };
        if !fulcrum_net::tuning::congestion_available(c) {
            errors.push(config.locations.error(
                &format!("virtual_service[{i}].tcp.congestion"),
                format!(
                    "congestion control {c:?} is not available in this kernel; available: {} (load its module, e.g. `modprobe tcp_{c}`)",
                    fulcrum_net::tuning::available_congestion().join(", ")
                ),
            ));
        }
    }
    errors
}

/// Sets every stream listener's options to its service's `tcp` (or back to the defaults).
pub fn apply(listeners: &mut Listeners, config: &Config) {
    for vs in config
        .virtual_services
        .iter()
        .filter(|v| !v.protocol().is_datagram())
    {
        for addr in &vs.listen {
            let at = fulcrum_net::ListenAddr::new(*addr, vs.vrf.as_deref());
            if let Err(e) = listeners.tune(&at, vs.tcp_tuning()) {
                tracing::warn!(service = %vs.name, %addr, error = %e, "cannot apply `tcp` tuning to the listener");
            }
        }
    }
}
