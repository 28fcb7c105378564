//! Assembly of `protocol = "tcp"` virtual services: the full proxy of `fulcrum-proxy` behind
//! the shared stream listeners, with the pools its rules choose; `protocol = "ftp"` services are tcp services with the FTP
//! helper of `fulcrum_proxy::ftp` in front, `protocol = "rtsp"` services with the RTSP proxy of
//! `fulcrum_proxy::rtsp` (its rules compiled as http rules).

use std::sync::Arc;

use fulcrum_config::{PersistenceKind, VirtualService};
use fulcrum_net::StreamHandler;
use fulcrum_proxy::tcp::PoolRoute;
use fulcrum_proxy::{FtpService, RtspService, TcpService};

use crate::planes::{BuildCx, DataPlane};

/// The TCP full proxy. Its state lives in the services it builds; nothing is kept here.
pub struct TcpPlane;

impl DataPlane for TcpPlane {
    fn serves(&self, vs: &VirtualService) -> bool {
        vs.as_tcp().is_some() && !vs.in_kernel()
    }

    fn build(
        &self,
        vs: &VirtualService,
        cx: &mut BuildCx,
    ) -> Result<Option<Arc<dyn StreamHandler>>, String> {
        let pool = cx
            .pool(vs)
            .ok_or_else(|| format!("virtual service {:?} has no pool", vs.name))?;
        let stats = cx.stats(vs);
        // `protocol = "rtsp"`: its rules are http rules, matched on the first request.
        let rtsp = vs.as_tcp().and_then(|t| t.rtsp.as_ref());
        let l4_rules = if rtsp.is_some() { &[][..] } else { vs.rules() };
        let mut pools = vec![pool.clone()];
        for r in vs.rules() {
            if let fulcrum_config::RuleAction::Pool(name) = &r.action {
                if let Some(p) = cx.pools.iter().find(|p| *p.name == **name) {
                    if !pools.iter().any(|q| Arc::ptr_eq(q, p)) {
                        pools.push(p.clone());
                    }
                }
            }
        }
        // The rules and the pools they choose, each with its TLS to members (re-encryption).
        let rules = match rtsp {
            // rtsp: every pool a rule names is a route (L4Rules lists them without rules).
            Some(_) => fulcrum_proxy::L4Rules::none_with(pools.clone()),
            None => fulcrum_proxy::L4Rules::compile(l4_rules, pool.clone(), cx.pools, &stats)
                .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?,
        };
        let routes = rules
            .pools()
            .iter()
            .map(|p| {
                let member_tls = crate::planes::http::tls::stream_member_tls(p)
                    .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
                Ok(PoolRoute {
                    pool: p.clone(),
                    member_tls,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let tcp = TcpService {
            // TLS offload towards the clients, and re-encryption to members with a pool `tls`.
            tls: cx.stream_tls(vs)?,
            snat: cx.snat(vs)?,
            transparent: cx.transparent(vs),
            name: Arc::from(vs.name.as_str()),
            pool,
            rules,
            routes,
            persistence: cx.source_persistence(vs),
            proxy_protocol: vs.proxy_protocol(),
            idle_timeout: vs.idle_timeout,
            max_connections: vs.max_connections,
            splice: true,
            stats,
            tracker: cx.tracker.clone(),
        };
        if let Some(options) = rtsp {
            let http_rules = fulcrum_http::rules::RuleSet::compile(vs.rules(), &|name| {
                pools.iter().position(|p| *p.name == *name)
            })
            .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
            let sessions = cx
                .table(vs, &[PersistenceKind::RtspSession])
                .map(|(table, _)| table);
            return Ok(Some(Arc::new(RtspService {
                tcp,
                rules: http_rules,
                sessions,
                rtp_ports: options.rtp_ports.clone(),
                detached: Default::default(),
            })));
        }
        // `protocol = "ftp"`: the same member choice, with the control channel read.
        if let Some(ftp) = vs.as_tcp().and_then(|t| t.ftp.as_ref()) {
            return Ok(Some(Arc::new(FtpService {
                tcp,
                passive_ports: ftp.passive_ports.clone(),
            })));
        }
        Ok(Some(Arc::new(tcp)))
    }
}
