//! The distribution table: the share of answers each site gets, per name and client region,
//! computed the same way by every instance from the same set of site state reports.
//!
//! Inputs, per site S, from the fresh reports (this instance's own included):
//! - `poor`: the fraction of reporters that see S down. A site every reporter sees as down
//!   keeps `MIN_FACTOR` of its share, never zero: the local monitors decide whether it is
//!   answered at all, this only decides how much.
//! - `capacity`: the capacity left that S's own instance reports (1 without a report).
//! - `time(S, R)`: how long reaching S takes from region R: the check time to S measured by
//!   the instances whose site serves R, else by every instance, plus the response time S
//!   reports for its own servers.
//!
//! Shares are the site weight multiplied by the factors the algorithm uses, normalised. The
//! best site gets the most but, with every factor floored at `MIN_FACTOR` of the best, never
//! everything.

use std::collections::BTreeMap;

use fulcrum_config::GslbAlgorithm;
use serde::{Deserialize, Serialize};

/// No factor takes a site below this fraction of the best one.
pub const MIN_FACTOR: f64 = 0.05;

/// One instance's view of one site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteView {
    pub name: String,
    pub up: bool,
    pub addresses_up: u32,
    pub addresses: u32,
    /// Mean duration of the passing checks from the reporting instance to the site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_ms: Option<f64>,
}

/// What one instance reports: its view of every site and its own site's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The reporting instance's site.
    pub instance: String,
    /// Increases with every report of one process (informational; the transport orders).
    pub version: u64,
    pub sites: Vec<SiteView>,
    /// Capacity left at the instance's own site, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<f64>,
    /// CPU busy fraction of the instance's host, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// Response time of the instance's own servers (data plane average), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_ms: Option<f64>,
    /// The instance's virtual services with `gslb`: addresses its site answers for those names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<LearntService>,
    /// Proximity: the RTTs this instance measured lately from its site to resolver prefixes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rtt: Vec<crate::proximity::Measured>,
    /// Proximity: prefixes this instance was asked about lately, for the others to measure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe: Vec<crate::proximity::Request>,
}

/// A virtual service of the reporting instance that adds its listen addresses to a GSLB name
/// at the instance's site (`gslb = "app.example.com"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearntService {
    /// The GSLB name, lower case and fully qualified.
    pub name: String,
    /// The virtual service's name (for the API).
    pub service: String,
    pub addresses: Vec<std::net::IpAddr>,
    /// Whether the service's pool has a member that takes new clients.
    pub up: bool,
    /// Capacity left in the service's pools, 0 to 1 (as the site's `capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<f64>,
}

/// A site as the table needs it.
#[derive(Debug, Clone)]
pub struct TableSite {
    pub name: String,
    pub weight: u32,
    /// Indices of the ip_tables (regions) the site serves.
    pub regions: Vec<u16>,
}

/// Per-site factors derived from the reports, shown in the API.
#[derive(Debug, Clone, Serialize)]
pub struct SiteFactors {
    pub site: String,
    /// Reporters that see the site up / that report on it.
    pub seen_up: u32,
    pub seen_by: u32,
    pub capacity: Option<f64>,
    pub cpu: Option<f64>,
    pub response_ms: Option<f64>,
}

/// Computes the factors of every site from `reports` (keyed by instance, so iteration order is
/// the same everywhere).
pub fn factors(sites: &[TableSite], reports: &BTreeMap<String, Report>) -> Vec<SiteFactors> {
    sites
        .iter()
        .map(|s| {
            let mut seen_up = 0;
            let mut seen_by = 0;
            for r in reports.values() {
                if let Some(v) = r.sites.iter().find(|v| v.name == s.name) {
                    seen_by += 1;
                    if v.up {
                        seen_up += 1;
                    }
                }
            }
            let own = reports.get(&s.name);
            SiteFactors {
                site: s.name.clone(),
                seen_up,
                seen_by,
                capacity: own.and_then(|r| r.capacity).map(|c| c.clamp(0.0, 1.0)),
                cpu: own.and_then(|r| r.cpu),
                response_ms: own.and_then(|r| r.response_ms),
            }
        })
        .collect()
}

/// Time to reach each site from region `region` (None: a client in no table), in ms.
fn times(
    sites: &[TableSite],
    f: &[SiteFactors],
    reports: &BTreeMap<String, Report>,
    region: Option<u16>,
) -> Vec<Option<f64>> {
    let in_region = |r: &Report| {
        region.is_some_and(|reg| {
            sites
                .iter()
                .find(|s| s.name == r.instance)
                .is_some_and(|s| s.regions.contains(&reg))
        })
    };
    sites
        .iter()
        .zip(f)
        .map(|(s, fac)| {
            let mean = |filter: &dyn Fn(&Report) -> bool| {
                let v: Vec<f64> = reports
                    .values()
                    .filter(|r| filter(r))
                    .filter_map(|r| r.sites.iter().find(|v| v.name == s.name)?.check_ms)
                    .collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            };
            let path = mean(&in_region).or_else(|| mean(&|_| true));
            match (path, fac.response_ms) {
                (None, None) => None,
                (p, r) => Some(p.unwrap_or(0.0) + r.unwrap_or(0.0)),
            }
        })
        .collect()
}

/// Relative speed factors: best time / site time, floored; unmeasured sites count as the mean.
fn speed(times: &[Option<f64>]) -> Vec<f64> {
    let known: Vec<f64> = times
        .iter()
        .flatten()
        .copied()
        .filter(|t| *t > 0.0)
        .collect();
    if known.is_empty() {
        return vec![1.0; times.len()];
    }
    let mean = known.iter().sum::<f64>() / known.len() as f64;
    let best = known.iter().copied().fold(f64::INFINITY, f64::min);
    times
        .iter()
        .map(|t| {
            let t = t.filter(|t| *t > 0.0).unwrap_or(mean);
            (best / t).clamp(MIN_FACTOR, 1.0)
        })
        .collect()
}

/// The share of each site (in `sites` order) for one name's algorithm and one client region.
pub fn shares(
    algorithm: GslbAlgorithm,
    sites: &[TableSite],
    f: &[SiteFactors],
    reports: &BTreeMap<String, Report>,
    region: Option<u16>,
) -> Vec<f64> {
    let poor: Vec<f64> = f
        .iter()
        .map(|x| {
            if x.seen_by == 0 {
                1.0
            } else {
                (f64::from(x.seen_up) / f64::from(x.seen_by)).max(MIN_FACTOR)
            }
        })
        .collect();
    let load: Vec<f64> = f
        .iter()
        .map(|x| x.capacity.unwrap_or(1.0).max(MIN_FACTOR))
        .collect();
    let sp = speed(&times(sites, f, reports, region));
    let raw: Vec<f64> = sites
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let w = f64::from(s.weight);
            match algorithm {
                GslbAlgorithm::RoundRobin | GslbAlgorithm::Hash => 1.0,
                GslbAlgorithm::FirstAvailable => {
                    if i == 0 {
                        1.0
                    } else {
                        0.0
                    }
                }
                GslbAlgorithm::Weighted => w * poor[i],
                // Proximity chooses per client prefix by RTT; its table shares are the load's.
                GslbAlgorithm::LeastLoad | GslbAlgorithm::Proximity => w * poor[i] * load[i],
                GslbAlgorithm::FastestResponse => w * poor[i] * sp[i],
                GslbAlgorithm::Topology => {
                    let home = region.is_some_and(|r| s.regions.contains(&r));
                    if region.is_some()
                        && !home
                        && sites
                            .iter()
                            .any(|o| region.is_some_and(|r| o.regions.contains(&r)))
                    {
                        0.0
                    } else {
                        w * poor[i] * load[i]
                    }
                }
            }
        })
        .collect();
    let total: f64 = raw.iter().sum();
    if total <= 0.0 {
        return vec![0.0; raw.len()];
    }
    raw.iter().map(|r| r / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sites() -> Vec<TableSite> {
        vec![
            TableSite {
                name: "east".into(),
                weight: 1,
                regions: vec![0],
            },
            TableSite {
                name: "west".into(),
                weight: 1,
                regions: vec![1],
            },
        ]
    }

    fn view(name: &str, up: bool, ms: f64) -> SiteView {
        SiteView {
            name: name.into(),
            up,
            addresses_up: u32::from(up),
            addresses: 1,
            check_ms: Some(ms),
        }
    }

    fn report(instance: &str, views: Vec<SiteView>, capacity: f64) -> Report {
        Report {
            instance: instance.into(),
            version: 1,
            sites: views,
            capacity: Some(capacity),
            cpu: None,
            response_ms: None,
            services: vec![],
            rtt: vec![],
            probe: vec![],
        }
    }

    #[test]
    fn fastest_gets_more_but_not_all_and_depends_on_region() {
        let mut reports = BTreeMap::new();
        // East's instance reaches east in 1 ms and west in 40; west's the other way round.
        reports.insert(
            "east".into(),
            report(
                "east",
                vec![view("east", true, 1.0), view("west", true, 40.0)],
                1.0,
            ),
        );
        reports.insert(
            "west".into(),
            report(
                "west",
                vec![view("east", true, 40.0), view("west", true, 1.0)],
                1.0,
            ),
        );
        let s = sites();
        let f = factors(&s, &reports);
        let east_clients = shares(GslbAlgorithm::FastestResponse, &s, &f, &reports, Some(0));
        assert!(
            east_clients[0] > 0.9 && east_clients[1] > 0.0,
            "{east_clients:?}"
        );
        let west_clients = shares(GslbAlgorithm::FastestResponse, &s, &f, &reports, Some(1));
        assert!(
            west_clients[1] > 0.9 && west_clients[0] > 0.0,
            "{west_clients:?}"
        );
        let nowhere = shares(GslbAlgorithm::FastestResponse, &s, &f, &reports, None);
        assert!((nowhere[0] - 0.5).abs() < 1e-9, "{nowhere:?}");
    }

    #[test]
    fn a_site_every_peer_sees_down_gets_little_and_load_moves_shares() {
        let mut reports = BTreeMap::new();
        reports.insert(
            "east".into(),
            report(
                "east",
                vec![view("east", true, 1.0), view("west", false, 1.0)],
                0.25,
            ),
        );
        reports.insert(
            "west".into(),
            report(
                "west",
                vec![view("east", true, 1.0), view("west", false, 1.0)],
                1.0,
            ),
        );
        let s = sites();
        let f = factors(&s, &reports);
        let w = shares(GslbAlgorithm::Weighted, &s, &f, &reports, None);
        assert!(w[1] < 0.06 && w[1] > 0.0, "{w:?}");
        let l = shares(GslbAlgorithm::LeastLoad, &s, &f, &reports, None);
        // east: capacity 0.25; west: capacity 1 but poor 0.05.
        assert!((l[0] - 0.25 / 0.30).abs() < 1e-9, "{l:?}");
    }

    #[test]
    fn same_reports_same_table_whatever_the_insertion_order() {
        let a = report(
            "east",
            vec![view("east", true, 3.0), view("west", true, 9.0)],
            0.5,
        );
        let b = report(
            "west",
            vec![view("east", true, 7.0), view("west", true, 2.0)],
            0.9,
        );
        let mut r1 = BTreeMap::new();
        r1.insert("east".to_string(), a.clone());
        r1.insert("west".to_string(), b.clone());
        let mut r2 = BTreeMap::new();
        r2.insert("west".to_string(), b);
        r2.insert("east".to_string(), a);
        let s = sites();
        for alg in [
            GslbAlgorithm::FastestResponse,
            GslbAlgorithm::LeastLoad,
            GslbAlgorithm::Topology,
        ] {
            for region in [None, Some(0), Some(1)] {
                assert_eq!(
                    shares(alg, &s, &factors(&s, &r1), &r1, region),
                    shares(alg, &s, &factors(&s, &r2), &r2, region)
                );
            }
        }
    }
}
