//! Assembly of `protocol = "https"`: the TLS side of http services (fulcrum-http `tls`), what
//! it keeps across reloads (ticket keys, session cache, handshake counters, by service name),
//! the configuration checks that read certificate files, and the `fulcrum_tls_*` metrics.

use std::collections::HashMap;
use std::sync::Arc;

use fulcrum_admin::MetricFamilies;
use fulcrum_config::{Config, ConfigError, VirtualService};
use fulcrum_http::tls::client::MemberTls;
use fulcrum_http::tls::{FailReason, ServerTls, TlsShared, TlsStats};
use parking_lot::Mutex;

/// Loads every certificate, key, OCSP response and CA bundle the configuration names, so that
/// `fulcrum check` and a reload report a bad one (with its key path) before anything runs.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for (i, vs) in config.virtual_services.iter().enumerate() {
        if vs.tls().is_none() {
            continue;
        }
        let mut shared = match TlsShared::new() {
            Ok(s) => s,
            Err(e) => {
                errors.push(config.locations.error(&format!("virtual_service[{i}]"), e));
                continue;
            }
        };
        if let Err(errs) = ServerTls::load(vs, &format!("virtual_service[{i}]"), &mut shared) {
            errors.extend(errs.into_iter().map(|(k, m)| config.locations.error(&k, m)));
        }
    }
    if let Some(tls) = &config.admin.tls {
        if let Err((k, m)) = fulcrum_http::tls::single_cert_acceptor(tls, "admin.tls") {
            errors.push(config.locations.error(&k, m));
        }
    }
    for (i, pool) in config.pools.iter().enumerate() {
        if let Some(tls) = &pool.tls {
            if let Err((k, m)) = MemberTls::load(tls, pool.http.http2, &format!("pool[{i}]")) {
                errors.push(config.locations.error(&k, m));
            }
        }
    }
    errors
}

/// What https services keep across reloads.
#[derive(Default)]
pub struct TlsAssembly {
    shared: Mutex<HashMap<String, TlsShared>>,
}

impl TlsAssembly {
    /// The TLS termination of an https service, reusing the service's ticket keys, session
    /// cache and counters from the running configuration.
    pub fn server(&self, vs: &VirtualService, config: &Config) -> Result<Arc<ServerTls>, String> {
        let i = config
            .virtual_services
            .iter()
            .position(|v| v.name == vs.name)
            .unwrap_or(0);
        let mut map = self.shared.lock();
        let shared = match map.entry(vs.name.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(TlsShared::new()?),
        };
        // With ha.sync, ticket keys both nodes derive: a client resumes on the new master.
        shared.share_tickets(
            crate::planes::pair::shared_secret(config, fulcrum_ha::sync::purpose::TICKETS),
            &vs.name,
        )?;
        ServerTls::load(vs, &format!("virtual_service[{i}]"), shared)
            .map(Arc::new)
            .map_err(|errs| {
                let text: Vec<String> =
                    errs.into_iter().map(|(k, m)| format!("{k}: {m}")).collect();
                text.join("; ")
            })
    }

    /// Forgets the services that no longer exist.
    pub fn retain(&self, names: &dyn Fn(&str) -> bool) {
        self.shared.lock().retain(|n, _| names(n));
    }

    /// `fulcrum_tls_handshakes_total` and `fulcrum_tls_handshake_failures_total`.
    pub fn metrics(&self, w: &mut MetricFamilies) {
        let mut stats: Vec<(String, Arc<TlsStats>)> = self
            .shared
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.stats.clone()))
            .collect();
        if stats.is_empty() {
            return;
        }
        stats.sort_by(|a, b| a.0.cmp(&b.0));
        let mut samples = w.counter(
            "fulcrum_tls_handshakes_total",
            "TLS handshakes completed by https services, by protocol version and whether the session was resumed.",
        );
        for (name, s) in &stats {
            for (version, resumed, n) in s.handshakes() {
                samples.sample(
                    &[
                        ("vs", name),
                        ("version", version),
                        ("resumed", if resumed { "true" } else { "false" }),
                    ],
                    n,
                );
            }
        }
        let mut samples = w.counter(
            "fulcrum_tls_handshake_failures_total",
            "TLS handshakes that failed on https services, by reason.",
        );
        for (name, s) in &stats {
            for r in FailReason::ALL {
                samples.sample(&[("vs", name), ("reason", r.as_str())], s.failures(r));
            }
        }
    }
}

/// TLS to the members of a tcp or message service's pool (its `tls` table), offering no ALPN: such a
/// service does not know what protocol its bytes are.
pub fn stream_member_tls(pool: &fulcrum_balance::Pool) -> Result<Option<Arc<MemberTls>>, String> {
    match &pool.config.tls {
        None => Ok(None),
        Some(tls) => MemberTls::load_with_alpn(tls, Vec::new(), &format!("pool {:?}", pool.name))
            .map(|m| Some(Arc::new(m)))
            .map_err(|(k, m)| format!("{k}: {m}")),
    }
}
