//! Assembly of `protocol = "tcp"` virtual services: the full proxy of `fulcrum-proxy` behind
//! the shared stream listeners, with the pools its rules choose; `protocol = "ftp"` services are tcp services with the FTP
//! helper of `fulcrum_proxy::ftp` in front.

use std::sync::Arc;

use fulcrum_config::VirtualService;
use fulcrum_net::StreamHandler;
use fulcrum_proxy::tcp::PoolRoute;
use fulcrum_proxy::{FtpService, TcpService};

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
        // The rules and the pools they choose, each with its TLS to members (re-encryption).
        let rules = fulcrum_proxy::L4Rules::compile(vs.rules(), pool.clone(), cx.pools, &stats)
            .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
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
