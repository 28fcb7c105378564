//! `[bgp]`: scale-out (active-active). Runs fulcrum-ha's announcer (BIRD or GoBGP) with this node's view of
//! which prefixes it can serve: a prefix is announced while one of the virtual services listening
//! in it (on an address inside it, or on the wildcard of its family; XDP services included, they
//! are virtual services with a `listen` too) has a member that takes new clients. Part of the HA
//! plane: `GET /api/v1/ha`, `PUT /api/v1/ha/maintenance` and shutdown go through it.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fulcrum_admin::{Control, MetricFamilies};
use fulcrum_config::{Bgp, BgpSpeaker, Config, ConfigError, HaMode, RuleAction, VirtualService};
use fulcrum_ha::bgp::gobgp::WatchdogCommand;
use fulcrum_ha::bgp::{Announcer, BgpConfig, Desired, SpeakerConfig};
use ipnet::IpNet;
use serde_json::{json, Value};

/// How often the health view is re-evaluated (and a BIRD that is down retried).
const INTERVAL: Duration = Duration::from_millis(200);

/// Whether `service` listens inside `prefix` (or on the wildcard address of its family).
fn listens_in(service: &VirtualService, prefix: &IpNet) -> bool {
    service.listen.iter().any(|a| {
        let ip = a.ip();
        prefix.contains(&ip) || (ip.is_unspecified() && ip.is_ipv6() == prefix.addr().is_ipv6())
    })
}

fn service_pools(service: &VirtualService) -> impl Iterator<Item = &str> {
    service
        .pool
        .as_deref()
        .into_iter()
        .chain(service.rules().iter().filter_map(|r| match &r.action {
            RuleAction::Pool(p) => Some(p.as_str()),
            _ => None,
        }))
}

/// The configuration problems of `[bgp]` and `ha.mode = "active_active"`.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    let mode = config.ha.as_ref().map(|h| h.mode);
    let Some(bgp) = &config.bgp else {
        if mode == Some(HaMode::ActiveActive) {
            errors.push(config.locations.error(
                "ha.mode",
                "active_active announces the VIPs through BGP: add a [bgp] table (speaker, control, announce)",
            ));
        }
        return errors;
    };
    if mode == Some(HaMode::ActiveStandby) {
        errors.push(config.locations.error(
            "ha.mode",
            "[bgp] makes every node serve the VIPs at once: set mode = \"active_active\" (VRRP active_standby and BGP announcement do not combine in this build)",
        ));
    }
    for (i, prefix) in bgp.announce.iter().enumerate() {
        if !config
            .virtual_services
            .iter()
            .any(|s| listens_in(s, prefix))
        {
            errors.push(config.locations.error(
                &format!("bgp.announce[{i}]"),
                format!("{prefix} contains no virtual service's listen address: a prefix is announced while the services listening in it have a healthy member"),
            ));
        }
    }
    errors
}

/// `[bgp]` settings that need a restart (the announced prefixes follow a reload).
pub fn reload_warnings(before: Option<&Bgp>, after: Option<&Bgp>) {
    let key = |b: Option<&Bgp>| {
        b.map(|b| {
            (
                b.speaker,
                b.control.clone(),
                b.include.clone(),
                b.interface.clone(),
                b.ospf.clone(),
            )
        })
    };
    if key(before) != key(after) {
        tracing::warn!("[bgp] speaker, control, include, interface and ospf changes take effect at the next restart (announce follows the reload)");
    }
}

/// Each prefix of the configuration in force and whether a service listening in it can take a
/// new client here.
fn desired<C: Control>(control: Weak<C>) -> Desired {
    Arc::new(move || {
        let Some(c) = control.upgrade() else {
            return Vec::new();
        };
        let Some(config) = c.config() else {
            return Vec::new();
        };
        let Some(bgp) = &config.bgp else {
            return Vec::new();
        };
        let pools = c.pools();
        let pool_ok = |name: &str| {
            pools
                .iter()
                .find(|p| &*p.name == name)
                .is_some_and(|p| p.available() > 0)
        };
        bgp.announce
            .iter()
            .map(|prefix| {
                let healthy = config
                    .virtual_services
                    .iter()
                    .filter(|s| listens_in(s, prefix))
                    .any(|s| {
                        let mut names = service_pools(s).peekable();
                        // A service without a pool (fixed responses, DNS) serves by itself.
                        names.peek().is_none() || names.any(pool_ok)
                    });
                (*prefix, healthy)
            })
            .collect()
    })
}

pub fn start<C: Control>(bgp: &Bgp, maintenance: bool, control: Weak<C>) -> Announcer {
    if maintenance {
        tracing::warn!("BGP: starting in maintenance (saved in admin.state_file): nothing is announced; PUT /api/v1/ha/maintenance {{\"maintenance\": false}} ends it");
    }
    let speaker = match bgp.speaker {
        BgpSpeaker::Bird => SpeakerConfig::Bird {
            control: PathBuf::from(&bgp.control),
            include: PathBuf::from(&bgp.include),
            interface: bgp.interface.clone(),
            ospf: bgp.ospf.as_ref().map(|o| fulcrum_ha::bgp::Ospf {
                area: o.area.clone(),
                interfaces: o.interfaces.clone(),
                cost: o.cost,
                drain_cost: o.drain_cost,
                hello: o.hello.as_secs(),
                dead: o.dead.as_secs(),
                network: o.network.clone(),
            }),
        },
        BgpSpeaker::Gobgp => SpeakerConfig::Gobgp {
            address: bgp.control.clone(),
            // This binary again (through /proc/self/exe: still this build after a package
            // upgrade replaced the file), as `fulcrum bgp-watchdog` (main.rs).
            watchdog: Some(WatchdogCommand {
                program: PathBuf::from("/proc/self/exe"),
                args: vec![
                    "bgp-watchdog".into(),
                    "--address".into(),
                    bgp.control.clone(),
                ],
            }),
        },
    };
    let config = BgpConfig {
        speaker,
        interval: INTERVAL,
    };
    Announcer::start(config, desired(control), maintenance)
}

/// `fulcrum bgp-watchdog` (started by the GoBGP speaker, fulcrum_ha::bgp::gobgp): reads the
/// UUID lines on stdin and withdraws them from gobgpd when stdin ends.
pub fn run_watchdog(address: &str) -> std::process::ExitCode {
    // It ends when its work is done, not on a signal: when Fulcrum dies under systemd, the unit
    // stops and systemd sends SIGTERM to what is left of its cgroup — this process, which must
    // withdraw first (it then exits by itself within WATCHDOG_PATIENCE, well inside the unit's
    // stop timeout). A terminal's SIGINT does not reach it anyway (own process group).
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler; nothing else in
    // this process has touched signal dispositions yet (no runtime exists).
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bgp-watchdog: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    match rt.block_on(fulcrum_ha::bgp::gobgp::watchdog(address, stdin)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "BGP watchdog: Fulcrum is gone but its paths could not be withdrawn");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `/api/v1/ha` of an active-active node.
pub fn api(a: &Announcer, node: &str, method: &str, path: &[&str], body: &[u8]) -> (u16, Value) {
    let status = || {
        json!({
            "mode": "active_active",
            "node": node,
            "maintenance": a.maintenance(),
            "bgp": serde_json::to_value(a.status()).unwrap_or_else(|e| json!({ "error": e.to_string() })),
        })
    };
    match (method, path) {
        ("GET", []) => (200, status()),
        ("PUT", ["maintenance"]) => match crate::planes::pair::maintenance_body(body) {
            Ok(on) => {
                // The announcer wakes and withdraws (or announces again) within a moment.
                a.set_maintenance(on);
                (200, status())
            }
            Err(e) => e,
        },
        _ => crate::planes::pair::other_route(method, path),
    }
}

pub fn metrics(a: &Announcer, w: &mut MetricFamilies) {
    let s = a.status();
    let mut samples = w.gauge(
        "fulcrum_bgp_speaker_up",
        "1 while the BGP speaker answers (BIRD's control socket, gobgpd's gRPC API).",
    );
    samples.sample(&[], s.reachable);
    let mut samples = w.gauge(
        "fulcrum_bgp_maintenance",
        "1 while this node is in maintenance (every prefix withdrawn).",
    );
    samples.sample(&[], a.maintenance());
    let mut samples = w.gauge(
        "fulcrum_bgp_prefix_announced",
        "1 while the prefix is announced (BIRD accepted the configuration, the path is in gobgpd's RIB).",
    );
    for p in &s.prefixes {
        samples.sample(&[("prefix", &p.prefix)], p.announced);
    }
    let mut samples = w.gauge(
        "fulcrum_bgp_prefix_healthy",
        "1 while a service listening in the prefix has a member that takes new clients.",
    );
    for p in &s.prefixes {
        samples.sample(&[("prefix", &p.prefix)], p.healthy);
    }
    let mut samples = w.gauge(
        "fulcrum_bgp_sessions_established",
        "BGP sessions of the local speaker in the Established state.",
    );
    let up = s
        .sessions
        .iter()
        .filter(|x| x.info.starts_with("Established"))
        .count();
    samples.sample(&[], up);
    let mut samples = w.counter(
        "fulcrum_bgp_announce_changes_total",
        "Changes of the announced prefix set that the speaker accepted.",
    );
    samples.sample(&[], s.changes);
    let mut samples = w.counter(
        "fulcrum_bgp_errors_total",
        "Failed exchanges with the speaker (unreachable, refused configuration, file errors).",
    );
    samples.sample(&[], s.errors);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_belong_to_the_prefixes_they_listen_in() {
        let parse = |listen: &str| {
            let text = SERVICE.replace("198.51.100.10:80", listen);
            fulcrum_config::parse(&text, "t.toml", std::path::Path::new("/etc/fulcrum"))
                .expect("parses")
                .virtual_services
                .remove(0)
        };
        let p32: IpNet = "198.51.100.10/32".parse().expect("prefix");
        let other: IpNet = "198.51.100.11/32".parse().expect("prefix");
        let v6: IpNet = "2001:db8::10/128".parse().expect("prefix");
        let s = parse("198.51.100.10:80");
        assert!(listens_in(&s, &p32));
        assert!(!listens_in(&s, &other));
        let s = parse("0.0.0.0:80");
        assert!(listens_in(&s, &other) && !listens_in(&s, &v6));
        assert!(listens_in(&parse("[::]:80"), &v6));
    }

    fn check(text: &str) -> Vec<String> {
        let c = fulcrum_config::parse(text, "t.toml", std::path::Path::new("/etc/fulcrum"))
            .expect("parses");
        checks(&c).iter().map(ToString::to_string).collect()
    }

    const SERVICE: &str = "[[virtual_service]]\nname = \"w\"\nlisten = [\"198.51.100.10:80\"]\nprotocol = \"tcp\"\npool = \"p\"\n[[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"10.0.0.1:80\"\n";

    #[test]
    fn checks_tie_bgp_to_active_active_services_and_a_speaker() {
        let bgp = |speaker: &str, prefix: &str| {
            format!("[bgp]\nspeaker = \"{speaker}\"\ncontrol = \"/run/bird/bird.ctl\"\nannounce = [\"{prefix}\"]\n{SERVICE}")
        };
        assert_eq!(
            check(&bgp("bird", "198.51.100.10/32")),
            Vec::<String>::new()
        );
        let aa = "[ha]\nmode = \"active_active\"\n";
        assert_eq!(
            check(&format!("{aa}{}", bgp("bird", "198.51.100.0/24"))),
            Vec::<String>::new()
        );
        // GoBGP: control defaults to gobgpd's API address.
        assert_eq!(
            check(&format!(
                "[bgp]\nspeaker = \"gobgp\"\nannounce = [\"198.51.100.10/32\"]\n{SERVICE}"
            )),
            Vec::<String>::new()
        );
        let e = check(&bgp("bird", "198.51.100.11/32")).join("\n");
        assert!(
            e.contains(
                "bgp.announce[0]: 198.51.100.11/32 contains no virtual service's listen address"
            ),
            "{e}"
        );
        let e = check(&format!("{aa}{SERVICE}")).join("\n");
        assert!(
            e.contains("ha.mode: active_active announces the VIPs through BGP: add a [bgp] table"),
            "{e}"
        );
        let vrrp = "[ha]\ninterface = \"eth0\"\nvrid = 5\nvips = [\"10.0.0.1/24\"]\n";
        let e = check(&format!("{vrrp}{}", bgp("bird", "198.51.100.10/32"))).join("\n");
        assert!(
            e.contains("ha.mode: [bgp] makes every node serve the VIPs at once"),
            "{e}"
        );
    }
}
