//! Assembly of `protocol = "tcp"` virtual services: the full proxy of `fulcrum-proxy` behind
//! the shared stream listeners; `protocol = "ftp"` services are tcp services with the FTP
//! helper of `fulcrum_proxy::ftp` in front.

use std::sync::Arc;

use fulcrum_config::VirtualService;
use fulcrum_net::StreamHandler;
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
        let tcp = TcpService {
            // TLS offload towards the clients, and re-encryption to members with a pool `tls`.
            tls: cx.stream_tls(vs)?,
            member_tls: crate::planes::http::tls::stream_member_tls(&pool)
                .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?,
            snat: cx.snat(vs)?,
            transparent: cx.transparent(vs),
            name: Arc::from(vs.name.as_str()),
            pool,
            persistence: cx.source_persistence(vs),
            proxy_protocol: vs.proxy_protocol(),
            idle_timeout: vs.idle_timeout,
            max_connections: vs.max_connections,
            splice: true,
            stats: cx.stats(vs),
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
