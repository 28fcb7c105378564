//! Rules of tcp, udp and message services (`[[virtual_service.rule]]`): which pool a new
//! connection (tcp, a message service's client connection) or a new udp flow goes to, by client
//! source prefix, destination port and local time of day. One evaluation for the three
//! protocols; each maps the chosen index to what it keeps per pool (`L4Rules::pools`).
//!
//! Order (H3C's: persistence → policy → algorithm): a client whose `source_ip` persistence
//! entry names a member that may still take it goes to that member's pool, whatever the rules
//! say; otherwise the first rule whose conditions all hold decides (its pool, or `drop`); no
//! match: the service's own pool. The scheduler then picks within the pool.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_balance::Pool;
use fulcrum_config::{Rule, RuleAction, TimeRange};
use fulcrum_net::stats::{RuleHits, ServiceStats};
use ipnet::IpNet;

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// An index into `L4Rules::pools`.
    Pool(usize),
    Drop,
}

#[derive(Debug)]
struct L4Rule {
    source: Vec<IpNet>,
    ports: Vec<RangeInclusive<u16>>,
    time: Vec<TimeRange>,
    action: Action,
    hits: Arc<RuleHits>,
}

/// A service's compiled rules and the pools they can choose; index 0 is the service's own pool.
#[derive(Debug)]
pub struct L4Rules {
    rules: Vec<L4Rule>,
    pools: Vec<Arc<Pool>>,
    /// Whether any rule has a `time` condition: only then is the clock read.
    timed: bool,
}

/// Where a new connection or flow goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// An index into `L4Rules::pools` (0: the service's own pool).
    Pool(usize),
    /// A `drop = true` rule matched: close the connection (udp: drop the datagram).
    Drop,
}

impl L4Rules {
    /// A service without rules: everything goes to `default`.
    pub fn none(default: Arc<Pool>) -> L4Rules {
        L4Rules {
            rules: Vec::new(),
            pools: vec![default],
            timed: false,
        }
    }

    /// A service without rules whose connections other code routes to one of `pools` (the
    /// first is the service's own): rtsp services, whose rules are http rules.
    pub fn none_with(pools: Vec<Arc<Pool>>) -> L4Rules {
        L4Rules {
            rules: Vec::new(),
            pools,
            timed: false,
        }
    }

    /// Compiles a service's rules against the pools of the configuration being applied, and
    /// installs their hit counters in `stats` (kept across reloads by label and action).
    pub fn compile(
        rules: &[Rule],
        default: Arc<Pool>,
        pools: &[Arc<Pool>],
        stats: &ServiceStats,
    ) -> Result<L4Rules, String> {
        let mut out = L4Rules::none(default);
        let mut labels = Vec::with_capacity(rules.len());
        let mut actions = Vec::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            let (action, what) = match &r.action {
                RuleAction::Pool(name) => {
                    let index = match out.pools.iter().position(|p| *p.name == **name) {
                        Some(i) => i,
                        None => {
                            let pool = pools
                                .iter()
                                .find(|p| *p.name == **name)
                                .ok_or_else(|| format!("rule[{i}]: no pool named {name:?}"))?;
                            out.pools.push(pool.clone());
                            out.pools.len() - 1
                        }
                    };
                    (Action::Pool(index), format!("pool:{name}"))
                }
                RuleAction::Drop => (Action::Drop, "drop".to_string()),
                // Refused by the configuration's checks for these protocols.
                other => return Err(format!("rule[{i}]: {other:?} is not an L4 action")),
            };
            labels.push((r.name.clone().unwrap_or_else(|| format!("rule[{i}]")), what));
            actions.push(action);
        }
        let counters = stats.set_rules(labels);
        for ((r, action), hits) in rules.iter().zip(actions).zip(counters) {
            out.timed |= !r.time.is_empty();
            out.rules.push(L4Rule {
                source: r.source.clone(),
                ports: r.destination_port.clone(),
                time: r.time.clone(),
                action,
                hits,
            });
        }
        Ok(out)
    }

    /// The pools a choice can name: the service's own first, then each pool the rules name,
    /// once, in the order of their first rule.
    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// The service's own pool.
    pub fn default_pool(&self) -> &Arc<Pool> {
        &self.pools[0]
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Where a new connection (flow) from `client` to local port `port` goes. `remembered` is
    /// the member the client's persistence entry names, if any: when a pool of the service
    /// holds it and it may still take the client, that pool is chosen first (persistence comes
    /// before the rules). A rule that decides counts a hit.
    pub fn choose(&self, client: IpAddr, port: u16, remembered: Option<SocketAddr>) -> Choice {
        if self.rules.is_empty() {
            return Choice::Pool(0);
        }
        let ruled = self.find(client, port, self.timed.then(local_minute));
        if let Some(addr) = remembered {
            // The rules' own pool first, when it holds the member too.
            let first = match ruled {
                Some(r) => match self.rules[r].action {
                    Action::Pool(i) => i,
                    Action::Drop => 0,
                },
                None => 0,
            };
            let holds = |i: usize| self.pools[i].persistent(addr, &[]).is_some();
            let persisted = if holds(first) {
                Some(first)
            } else {
                (0..self.pools.len()).find(|&i| i != first && holds(i))
            };
            if let Some(i) = persisted {
                if ruled.is_some_and(|r| self.rules[r].action == Action::Pool(i)) {
                    self.count(ruled);
                }
                return Choice::Pool(i);
            }
        }
        self.count(ruled);
        match ruled.map(|r| self.rules[r].action) {
            Some(Action::Pool(i)) => Choice::Pool(i),
            Some(Action::Drop) => Choice::Drop,
            None => Choice::Pool(0),
        }
    }

    fn count(&self, rule: Option<usize>) {
        if let Some(r) = rule {
            self.rules[r].hits.hits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The first rule whose conditions all hold; `minute`: the local minute of the day, when a
    /// rule has a `time` condition.
    fn find(&self, client: IpAddr, port: u16, minute: Option<u16>) -> Option<usize> {
        // IPv4 clients on an IPv6 socket are matched as IPv4.
        let ip = client.to_canonical();
        self.rules.iter().position(|r| {
            (r.source.is_empty() || r.source.iter().any(|n| n.contains(&ip)))
                && (r.ports.is_empty() || r.ports.iter().any(|p| p.contains(&port)))
                && (r.time.is_empty()
                    || minute.is_some_and(|m| r.time.iter().any(|t| t.contains(m))))
        })
    }
}

/// The minute of the day (0..1440) in the host's local time zone (`TZ`, else
/// /etc/localtime, as read by the C library once per process); UTC if it cannot be had.
pub fn local_minute() -> u16 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let t = libc::time_t::try_from(secs).unwrap_or(0);
    // SAFETY: `tm` is plain data written by localtime_r, which reads only `t`; a null return
    // leaves it unused.
    let local = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        (!libc::localtime_r(&t, &mut tm).is_null()).then_some((tm.tm_hour, tm.tm_min))
    };
    match local {
        Some((h, m)) => u16::try_from(h * 60 + m).unwrap_or(0) % 1440,
        None => ((secs % 86_400) / 60) as u16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pools a, b, c with one member each, on ports 1, 2, 3.
    fn pools() -> Vec<Arc<Pool>> {
        let text: String = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "[[pool]]\nname = \"{n}\"\n[[pool.member]]\naddress = \"127.0.0.1:{}\"\n",
                    i + 1
                )
            })
            .collect();
        let cfg = fulcrum_config::parse(&text, "t.toml", std::path::Path::new("."))
            .expect("a valid config");
        cfg.pools
            .iter()
            .map(|p| Arc::new(Pool::new(p, &[], None)))
            .collect()
    }

    fn rule(f: impl FnOnce(&mut Rule)) -> Rule {
        let mut r = Rule::default();
        f(&mut r);
        r
    }

    #[test]
    fn first_match_in_order_then_the_default_pool() {
        let all = pools();
        let stats = ServiceStats::default();
        let rules = vec![
            rule(|r| {
                r.source = vec!["10.0.0.0/8".parse().unwrap()];
                r.destination_port = vec![443..=443];
                r.action = RuleAction::Pool("b".into());
            }),
            rule(|r| {
                r.source = vec!["10.1.0.0/16".parse().unwrap()];
                r.action = RuleAction::Drop;
            }),
            rule(|r| {
                r.name = Some("tens".into());
                r.source = vec!["10.0.0.0/8".parse().unwrap()];
                r.action = RuleAction::Pool("c".into());
            }),
            rule(|r| {
                r.time = vec![TimeRange {
                    start: 0,
                    end: 1440,
                }];
                r.destination_port = vec![8000..=8099];
                r.action = RuleAction::Pool("b".into());
            }),
        ];
        let l4 = L4Rules::compile(&rules, all[0].clone(), &all, &stats).unwrap();
        let names: Vec<&str> = l4.pools().iter().map(|p| &*p.name).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(l4.choose(ip("10.1.2.3"), 443, None), Choice::Pool(1));
        assert_eq!(l4.choose(ip("10.1.2.3"), 80, None), Choice::Drop);
        assert_eq!(l4.choose(ip("10.2.2.3"), 80, None), Choice::Pool(2));
        assert_eq!(l4.choose(ip("::ffff:10.2.2.3"), 80, None), Choice::Pool(2));
        assert_eq!(l4.choose(ip("192.0.2.1"), 8050, None), Choice::Pool(1));
        assert_eq!(l4.choose(ip("192.0.2.1"), 80, None), Choice::Pool(0));
        let hits: Vec<(String, u64)> = stats
            .rules
            .load()
            .iter()
            .map(|h| (h.label.clone(), h.hits.load(Ordering::Relaxed)))
            .collect();
        assert_eq!(
            hits,
            [
                ("rule[0]".to_string(), 1),
                ("rule[1]".to_string(), 1),
                ("tens".to_string(), 2),
                ("rule[3]".to_string(), 1)
            ]
        );
        // Persistence first: a client remembered on a member of pool c stays there, even on
        // a port whose rule says b, or drop.
        let remembered = Some("127.0.0.1:3".parse().unwrap());
        assert_eq!(l4.choose(ip("10.1.2.3"), 443, remembered), Choice::Pool(2));
        assert_eq!(l4.choose(ip("10.1.2.3"), 80, remembered), Choice::Pool(2));
        // A member no pool of the service has: the rules decide.
        let gone = Some("127.0.0.1:9".parse().unwrap());
        assert_eq!(l4.choose(ip("10.1.2.3"), 443, gone), Choice::Pool(1));
    }

    #[test]
    fn the_local_minute_is_of_the_day() {
        assert!(local_minute() < 1440);
    }
}
