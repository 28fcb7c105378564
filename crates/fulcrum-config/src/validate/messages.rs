//! Cross-checks of message services against the pools they use.

use crate::error::ConfigError;
use crate::schema::Config;

/// Message services' checks that need other sections: the pools they use.
pub(crate) fn validate(cfg: &Config) -> Vec<ConfigError> {
    let loc = &cfg.locations;
    let mut errors = Vec::new();
    for vs in &cfg.virtual_services {
        if vs.as_message().is_none() {
            continue;
        }
        // Member connections of a message service are Fulcrum's own long-lived ones, counted in
        // the member's active connections: a per-member connection cap would stop every message
        // once they are open. `member_connections` is the knob for them.
        if let Some(pool_name) = &vs.pool {
            if let Some((p, pool)) = cfg
                .pools
                .iter()
                .enumerate()
                .find(|(_, p)| &p.name == pool_name)
            {
                for (j, m) in pool.members.iter().enumerate() {
                    if m.max_connections > 0 {
                        errors.push(loc.error(
                            &format!("pool[{p}].member[{j}].max_connections"),
                            format!(
                                "message service {:?} uses this pool: its member connections are Fulcrum's own, set by `member_connections` on the service, so a member's max_connections does not apply",
                                vs.name
                            ),
                        ));
                    }
                }
            }
        }
    }
    errors
}
