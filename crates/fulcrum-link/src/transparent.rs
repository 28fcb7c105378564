//! The return path of client-address transparency (`source = "client"`): member connections
//! leave from the client's address, so the members' replies are addressed to the client. They
//! reach this host because the members route through it, but an address that is not this
//! host's would be forwarded, not delivered. What makes the kernel deliver them to the
//! transparent socket (measured on Linux 6.18 in network namespaces: without any one of the
//! three, the member's SYN-ACK is forwarded towards the client and the connect times out):
//!
//! - nftables, in Fulcrum's own table `inet fulcrum_transparent` (`flags owner`: the kernel
//!   deletes it when this process ends, however it ends): packets that belong to a transparent
//!   socket get the firewall mark `MARK` before routing
//!   (`meta l4proto tcp socket transparent 1 meta mark set MARK`);
//! - `ip rule add fwmark MARK lookup ROUTE_TABLE pref RULE_PREF` (and `-6`);
//! - `ip route add local 0.0.0.0/0 dev lo table ROUTE_TABLE` (and `::/0`).
//!
//! The mark, table and priority are fixed and stay clear of the link plane's (`MARK_BASE`
//! `0x464c_0000` with mask `0xffff_0000`, rules from priority 9000). Rules and routes outlive a
//! killed process: each install removes whatever an earlier run left in `ROUTE_TABLE` first.

use std::future::Future;

use parking_lot::Mutex;
use rtnetlink::Handle;

use crate::{nft, route};

/// Fulcrum's nftables table for transparency (`inet`).
pub const TABLE: &str = "fulcrum_transparent";
/// The firewall mark of packets of transparent sockets: "FT" in the top half, as the link
/// plane's marks carry "FL".
pub const MARK: u32 = 0x4654_0001;
/// The routing table of the local default route (`ip route show table 1179910145`).
pub const ROUTE_TABLE: u32 = 0x4654_0001;
/// The priority of the fwmark rule: before the link plane's (9000 and above) and `main`.
pub const RULE_PREF: u32 = 8900;

// Clear of the link plane: its marks and tables are `MARK_BASE | …` under `MARK_MASK`, its
// rules from `RULE_PREF_BASE` on.
const _: () = {
    assert!(MARK & crate::plan::MARK_MASK != crate::MARK_BASE);
    assert!(ROUTE_TABLE & crate::plan::MARK_MASK != crate::MARK_BASE);
    assert!(RULE_PREF < crate::RULE_PREF_BASE);
};

/// The nftables table text.
pub fn table_text() -> String {
    format!(
        "table inet {TABLE} {{\n  flags owner;\n  chain prerouting {{\n    type filter hook prerouting priority mangle; policy accept;\n    meta l4proto tcp socket transparent 1 meta mark set {MARK:#x}\n  }}\n}}\n"
    )
}

/// The installed return path: the nftables session owning the table, and whether the IPv6
/// rule and route are in.
struct Installed {
    session: nft::Session,
    v6: bool,
}

/// Installs and removes the return path; one per process.
#[derive(Default)]
pub struct ReturnPath {
    installed: Mutex<Option<Installed>>,
}

impl ReturnPath {
    /// Whether the return path is in place.
    pub fn installed(&self) -> bool {
        self.installed.lock().is_some()
    }

    /// Puts the return path in place (IPv4 always, IPv6 with `v6`). Once in place it is only
    /// added to (IPv6 when a service starts listening on it), never rebuilt, so a reload does
    /// not take it away from running connections for a moment. Needs `CAP_NET_ADMIN`.
    pub fn install(&self, v6: bool) -> Result<(), String> {
        let mut installed = self.installed.lock();
        if let Some(i) = installed.as_mut() {
            if v6 && !i.v6 {
                netlink(|h| async move { add_family(&h, true).await })?;
                i.v6 = true;
            }
            return Ok(());
        }
        let routes = netlink(|h| async move {
            // What an earlier run that did not stop cleanly left.
            remove_routes(&h).await?;
            add_family(&h, false).await?;
            if v6 {
                add_family(&h, true).await?;
            }
            Ok(())
        });
        let table = routes.and_then(|()| {
            let mut session = nft::Session::open_for(TABLE)?;
            session.replace_table(&table_text())?;
            Ok(session)
        });
        let session = match table {
            Ok(s) => s,
            Err(e) => {
                let _ = netlink(|h| async move { remove_routes(&h).await });
                return Err(e);
            }
        };
        *installed = Some(Installed { session, v6 });
        tracing::info!(
            mark = format!("{MARK:#x}"),
            table = ROUTE_TABLE,
            v6,
            "client-address transparency: return path installed"
        );
        Ok(())
    }

    /// Takes the return path away (no service has `source = "client"` any more, or shutdown).
    pub fn remove(&self) -> Result<(), String> {
        let mut installed = self.installed.lock();
        let Some(mut i) = installed.take() else {
            return Ok(());
        };
        let table = i.session.remove_table();
        drop(i);
        let routes = netlink(|h| async move { remove_routes(&h).await });
        tracing::info!("client-address transparency: return path removed");
        table.and(routes)
    }
}

/// `ip rule add fwmark MARK lookup ROUTE_TABLE` and the local default route in that table, for
/// IPv4 or (`v6`) IPv6.
async fn add_family(h: &Handle, v6: bool) -> Result<(), String> {
    let (ip, any) = if v6 {
        ("ip -6", "::/0")
    } else {
        ("ip", "0.0.0.0/0")
    };
    route::add_local_default(h, v6, ROUTE_TABLE)
        .await
        .map_err(|e| format!("{ip} route add local {any} dev lo table {ROUTE_TABLE}: {e}"))?;
    route::add_fwmark_rule(h, v6, MARK, ROUTE_TABLE, RULE_PREF)
        .await
        .map_err(|e| format!("{ip} rule add fwmark {MARK:#x} lookup {ROUTE_TABLE}: {e}"))
}

/// Removes the rules pointing at `ROUTE_TABLE` and its routes, IPv4 and IPv6 (a host without
/// IPv6 has none to remove).
async fn remove_routes(h: &Handle) -> Result<(), String> {
    let ours = |t: u32| t == ROUTE_TABLE;
    route::remove_tables(h, false, &ours).await?;
    if let Err(e) = route::remove_tables(h, true, &ours).await {
        tracing::debug!(error = %e, "IPv6 rules and routes of the transparency table not removed");
    }
    Ok(())
}

/// Runs `f` with a netlink handle, on a thread and runtime of its own: the reload path that
/// calls this may run on a runtime worker or outside any runtime.
fn netlink<F, Fut>(f: F) -> Result<(), String>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<(), String>>,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("netlink runtime: {e}"))?;
            rt.block_on(async {
                let handle = route::connect()?;
                f(handle).await
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the netlink thread panicked".to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_marks_packets_of_transparent_sockets() {
        let t = table_text();
        assert!(t.starts_with("table inet fulcrum_transparent {\n  flags owner;\n"));
        assert!(t.contains("socket transparent 1 meta mark set 0x46540001"));
    }
}
