//! Policy routing per link through rtnetlink (the `rtnetlink` crate, maintained by the
//! rust-netlink project that also keeps netlink-packet-route): one routing table per link with a
//! default route via the link's gateway, and a rule sending the link's firewall mark to it.
//!
//! Fulcrum owns the tables `MARK_BASE | …` and the rules at priorities from `RULE_PREF_BASE`
//! that point at them: it removes every one of them before installing, so a restart or a
//! reload replaces rather than duplicates, and removes them all at shutdown.

use std::net::{Ipv4Addr, Ipv6Addr};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::route::{RouteAttribute, RouteScope, RouteType};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};

use crate::plan::{Plan, MARK_BASE, MARK_MASK};

fn ours(table: u32) -> bool {
    table & MARK_MASK == MARK_BASE
}

/// A netlink handle whose connection runs on the current tokio runtime.
pub fn connect() -> Result<Handle, String> {
    let (conn, handle, _) =
        rtnetlink::new_connection().map_err(|e| format!("netlink socket: {e}"))?;
    tokio::spawn(conn);
    Ok(handle)
}

async fn interface_index(handle: &Handle, name: &str) -> Result<u32, String> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(l)) => Ok(l.header.index),
        Ok(None) => Err(format!("no interface {name:?}")),
        Err(e) => Err(format!("interface {name:?}: {e}")),
    }
}

/// Removes every rule and route Fulcrum installed (its tables, IPv4 and IPv6), whoever's run
/// left them.
pub async fn remove_all(handle: &Handle) -> Result<(), String> {
    remove_tables(handle, false, &ours).await?;
    // A host without IPv6 has no IPv6 rules to list: nothing of ours can be there.
    if let Err(e) = remove_tables(handle, true, &ours).await {
        tracing::debug!(error = %e, "IPv6 link rules and routes not removed");
    }
    Ok(())
}

/// Removes every rule pointing at a table `owned` names, and every route in such a table: the
/// IPv4 ones, or with `v6` the IPv6 ones.
pub async fn remove_tables(
    handle: &Handle,
    v6: bool,
    owned: &(dyn Fn(u32) -> bool + Sync),
) -> Result<(), String> {
    let version = if v6 { IpVersion::V6 } else { IpVersion::V4 };
    let rules: Vec<_> = handle
        .rule()
        .get(version)
        .execute()
        .try_collect()
        .await
        .map_err(|e| format!("listing rules: {e}"))?;
    delete_owned(
        rules,
        |r| {
            let table = r.attributes.iter().find_map(|a| match a {
                RuleAttribute::Table(t) => Some(*t),
                _ => None,
            });
            table.unwrap_or(u32::from(r.header.table))
        },
        owned,
        |r| handle.rule().del(r).execute(),
        "deleting rule",
    )
    .await?;
    let query = if v6 {
        RouteMessageBuilder::<Ipv6Addr>::new().table_id(0).build()
    } else {
        RouteMessageBuilder::<Ipv4Addr>::new().table_id(0).build()
    };
    let routes: Vec<_> = handle
        .route()
        .get(query)
        .execute()
        .try_collect()
        .await
        .map_err(|e| format!("listing routes: {e}"))?;
    delete_owned(
        routes,
        |r| {
            let table = r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            });
            table.unwrap_or(u32::from(r.header.table))
        },
        owned,
        |r| handle.route().del(r).execute(),
        "deleting route",
    )
    .await
}

/// Deletes, one after the other, each of `listed` (rules or routes) whose table, as `table`
/// reads it, `owned` names. `what` starts an error's text.
async fn delete_owned<M, F>(
    listed: Vec<M>,
    table: impl Fn(&M) -> u32,
    owned: &(dyn Fn(u32) -> bool + Sync),
    delete: impl Fn(M) -> F,
    what: &str,
) -> Result<(), String>
where
    F: std::future::Future<Output = Result<(), rtnetlink::Error>>,
{
    for m in listed {
        if owned(table(&m)) {
            delete(m).await.map_err(|e| format!("{what}: {e}"))?;
        }
    }
    Ok(())
}

/// `ip rule add fwmark MARK lookup TABLE pref PREF` (`-6` with `v6`).
pub async fn add_fwmark_rule(
    handle: &Handle,
    v6: bool,
    mark: u32,
    table: u32,
    pref: u32,
) -> Result<(), String> {
    let request = handle
        .rule()
        .add()
        .fw_mark(mark)
        .table_id(table)
        // The crate leaves the action unset, which the kernel takes as "no match".
        .action(RuleAction::ToTable)
        .priority(pref);
    let done = if v6 {
        request.v6().execute().await
    } else {
        request.v4().execute().await
    };
    done.map_err(|e| e.to_string())
}

/// `ip route replace local 0.0.0.0/0 dev lo table TABLE` (`::/0` with `v6`): every destination
/// is this host's for the packets the table's rule sends here.
pub async fn add_local_default(handle: &Handle, v6: bool, table: u32) -> Result<(), String> {
    let lo = interface_index(handle, "lo").await?;
    let route = if v6 {
        RouteMessageBuilder::<Ipv6Addr>::new()
            .table_id(table)
            .kind(RouteType::Local)
            .scope(RouteScope::Host)
            .output_interface(lo)
            .build()
    } else {
        RouteMessageBuilder::<Ipv4Addr>::new()
            .table_id(table)
            .kind(RouteType::Local)
            .scope(RouteScope::Host)
            .output_interface(lo)
            .build()
    };
    handle
        .route()
        .add(route)
        .replace()
        .execute()
        .await
        .map_err(|e| e.to_string())
}

/// Installs the routes and rules of `plan`, after removing Fulcrum's earlier ones: per link,
/// the IPv4 table and rule when it has an IPv4 next hop, the IPv6 ones (same table id and
/// mark) when it has an IPv6 one.
pub async fn install(handle: &Handle, plan: &Plan) -> Result<(), String> {
    remove_all(handle).await?;
    for o in &plan.outbounds {
        for l in &o.links {
            let index = interface_index(handle, &l.interface).await?;
            // onlink: the gateway is on the link's segment; no lookup in another table needed.
            if let Some(gateway) = l.gateway {
                let route = RouteMessageBuilder::<Ipv4Addr>::new()
                    .table_id(l.mark)
                    .gateway(gateway)
                    .output_interface(index)
                    .onlink()
                    .build();
                add_route(handle, route)
                    .await
                    .map_err(|e| format!("link {:?}: default route via {gateway}: {e}", l.name))?;
                add_fwmark_rule(handle, false, l.mark, l.mark, l.rule_pref)
                    .await
                    .map_err(|e| format!("link {:?}: fwmark rule: {e}", l.name))?;
            }
            if let Some(gateway) = l.gateway6 {
                let route = RouteMessageBuilder::<Ipv6Addr>::new()
                    .table_id(l.mark)
                    .gateway(gateway)
                    .output_interface(index)
                    .onlink()
                    .build();
                add_route(handle, route).await.map_err(|e| {
                    format!("link {:?}: IPv6 default route via {gateway}: {e}", l.name)
                })?;
                add_fwmark_rule(handle, true, l.mark, l.mark, l.rule_pref)
                    .await
                    .map_err(|e| format!("link {:?}: IPv6 fwmark rule: {e}", l.name))?;
            }
        }
    }
    Ok(())
}

async fn add_route(
    handle: &Handle,
    route: rtnetlink::packet_route::route::RouteMessage,
) -> Result<(), rtnetlink::Error> {
    handle.route().add(route).replace().execute().await
}
