//! Learnt GSLB addresses: a virtual service with `gslb = "app.example.com"` adds its listen
//! addresses to that name at this instance's own site, with the service's health, and the
//! site's reports over the exchange carry them to the other instances, which answer them for
//! that site too. Nobody types the address into the gslb config of any instance.
//!
//! What a name needs on another instance: the name (`[[gslb.name]]`) listing the site, and the
//! site (`[[gslb.site]]`) with its `peer`. The learnt addresses then fill the site's answer for
//! that name next to the site's own `addresses` (which may be left out). Names a report carries
//! that are not configured here, or that do not list the reporting site, are ignored.
//!
//! Health: at the local site a learnt address is up while one of its service's pools has a
//! member that takes new clients. Elsewhere it is what the site's last report said, and down
//! once that report is stale: the address is a listener of the very process that stopped
//! reporting. Down addresses are answered only when every site of the name is down (fail open).

use std::net::IpAddr;
use std::sync::Arc;

use fulcrum_balance::Pool;
use fulcrum_config::RuleAction;

use crate::table::LearntService;

/// Addresses one learnt service may add (a report with more is refused).
pub const MAX_LEARNT_ADDRESSES: usize = 256;

/// One learnt address of a (name, site).
#[derive(Debug, Clone, PartialEq)]
pub struct LearntAddress {
    pub address: IpAddr,
    pub up: bool,
    /// The virtual service that adds it (for the API).
    pub service: Arc<str>,
}

/// Learnt addresses by name (index into `GslbState::names`) and site of the name (index into
/// the name's `sites`).
#[derive(Debug, Default, PartialEq)]
pub struct LearntTable {
    per_name: Vec<Vec<Vec<LearntAddress>>>,
}

impl LearntTable {
    /// The learnt addresses of site `k` of name `ni`.
    pub fn at(&self, ni: usize, k: usize) -> &[LearntAddress] {
        self.per_name
            .get(ni)
            .and_then(|n| n.get(k))
            .map_or(&[], Vec::as_slice)
    }

    /// How many there are in all.
    pub fn len(&self) -> usize {
        self.per_name.iter().flatten().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Builds the table for names `names` (each: its lower-case fqdn and its sites' names) from
    /// the services each site announces: `(site name, services, fresh)`; a stale source's
    /// addresses are all down.
    pub fn build<'a>(
        names: &[(String, Vec<Arc<str>>)],
        sources: impl Iterator<Item = (&'a str, &'a [LearntService], bool)>,
    ) -> LearntTable {
        let mut per_name: Vec<Vec<Vec<LearntAddress>>> = names
            .iter()
            .map(|(_, sites)| vec![Vec::new(); sites.len()])
            .collect();
        for (site, services, fresh) in sources {
            for svc in services {
                let want = svc.name.to_ascii_lowercase();
                let Some(ni) = names.iter().position(|(n, _)| *n == want) else {
                    continue;
                };
                let Some(k) = names[ni].1.iter().position(|s| **s == *site) else {
                    continue;
                };
                let slot = &mut per_name[ni][k];
                let service: Arc<str> = Arc::from(svc.service.as_str());
                for &address in svc.addresses.iter().take(MAX_LEARNT_ADDRESSES) {
                    if slot.len() >= MAX_LEARNT_ADDRESSES {
                        break;
                    }
                    // Two services on one address: up while either is.
                    match slot.iter_mut().find(|a| a.address == address) {
                        Some(a) => a.up |= svc.up && fresh,
                        None => slot.push(LearntAddress {
                            address,
                            up: svc.up && fresh,
                            service: service.clone(),
                        }),
                    }
                }
            }
        }
        LearntTable { per_name }
    }
}

/// A virtual service of this instance with `gslb`, and the pools whose members decide its
/// health.
#[derive(Clone)]
pub struct LocalService {
    pub name: String,
    pub service: String,
    pub addresses: Vec<IpAddr>,
    pub pools: Vec<Arc<Pool>>,
}

impl LocalService {
    /// The services of `config` with `gslb`, with their pools among `pools` (the default pool
    /// and those the service's rules send to).
    pub fn from_config(config: &fulcrum_config::Config, pools: &[Arc<Pool>]) -> Vec<LocalService> {
        config
            .virtual_services
            .iter()
            .filter_map(|vs| {
                let name = vs.gslb.clone()?;
                let mut addresses: Vec<IpAddr> = Vec::new();
                for a in &vs.listen {
                    if !addresses.contains(&a.ip()) {
                        addresses.push(a.ip());
                    }
                }
                let rule_pools = vs.rules().iter().filter_map(|r| match &r.action {
                    RuleAction::Pool(p) => Some(p.as_str()),
                    _ => None,
                });
                let wanted: Vec<&str> = vs.pool.as_deref().into_iter().chain(rule_pools).collect();
                let pools = pools
                    .iter()
                    .filter(|p| wanted.contains(&&*p.name))
                    .cloned()
                    .collect();
                Some(LocalService {
                    name,
                    service: vs.name.clone(),
                    addresses,
                    pools,
                })
            })
            .collect()
    }

    /// What the site's report says of the service now, with `capacity` left in its pools.
    pub fn sample(&self, capacity: Option<f64>) -> LearntService {
        let up = self.pools.iter().any(|p| p.available() > 0);
        LearntService {
            name: self.name.clone(),
            service: self.service.clone(),
            addresses: self.addresses.clone(),
            up,
            capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, addrs: &[&str], up: bool) -> LearntService {
        LearntService {
            name: name.into(),
            service: "vs".into(),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            up,
            capacity: None,
        }
    }

    #[test]
    fn addresses_go_to_the_name_and_site_that_list_them_and_stale_ones_are_down() {
        let names = vec![
            (
                "app.example.com.".to_string(),
                vec![Arc::from("east"), Arc::from("west")],
            ),
            ("other.example.com.".to_string(), vec![Arc::from("west")]),
        ];
        let east = [
            svc("APP.example.com.", &["192.0.2.1", "192.0.2.2"], true),
            svc("other.example.com.", &["192.0.2.9"], true),
            svc("unknown.example.com.", &["192.0.2.8"], true),
        ];
        let west = [svc("app.example.com.", &["192.0.2.3"], true)];
        let t = LearntTable::build(
            &names,
            [("east", &east[..], true), ("west", &west[..], false)].into_iter(),
        );
        assert_eq!(t.at(0, 0).len(), 2);
        assert!(t.at(0, 0).iter().all(|a| a.up));
        assert_eq!(t.at(0, 1).len(), 1);
        assert!(!t.at(0, 1)[0].up, "a stale report's addresses are down");
        assert!(
            t.at(1, 0).is_empty(),
            "other.example.com does not list east: its address is ignored"
        );
        assert_eq!(t.len(), 3);
        assert!(t.at(7, 7).is_empty());
    }
}
