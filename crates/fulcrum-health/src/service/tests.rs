//! The service end to end: scheduling, reloads, agents, the back-off probe.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fulcrum_balance::{AgentState, Pool, WEIGHT_SCALE};
use fulcrum_config::{AdminState, Algorithm, HashKey, Monitor, MonitorKind, Reuse};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::*;
use crate::check_specs;
use crate::testutil::{monitor, read_head, refused_addr, wait_until, Server};

const SOON: Duration = Duration::from_secs(5);

fn pool_config(name: &str, members: &[SocketAddr], monitors: &[&str]) -> fulcrum_config::Pool {
    fulcrum_config::Pool {
        name: name.into(),
        algorithm: Algorithm::WeightedRoundRobin,
        hash_key: HashKey::SourceIp,
        monitors: monitors.iter().map(|m| m.to_string()).collect(),
        slow_start: None,
        min_active: 1,
        retries: 2,
        connect_timeout: Duration::from_millis(200),
        zero_window_timeout: None,
        members: members
            .iter()
            .map(|&address| fulcrum_config::Member {
                address,
                weight: 1,
                priority: 0,
                max_connections: 0,
                standby: false,
                state: AdminState::Enabled,
            })
            .collect(),
        reuse: Reuse::Safe,
        http: Default::default(),
        kind: fulcrum_config::PoolKind::Server,
        links: vec![],
        gateways: vec![],
        busy: None,
        elastic: None,
        vrf: None,
        tls: None,
    }
}

/// Builds pools as the binary does on a reload: members of `previous` are kept.
fn build(
    configs: &[fulcrum_config::Pool],
    monitors: &[Monitor],
    previous: &[Arc<Pool>],
) -> Vec<Arc<Pool>> {
    configs
        .iter()
        .map(|c| {
            let old = previous.iter().find(|p| *p.name == *c.name);
            Arc::new(Pool::new(c, &check_specs(c, monitors), old.map(|p| &**p)))
        })
        .collect()
}

fn http_ok() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK".to_vec()
}

/// An HTTP server answering the statuses of `script` in turn, then 200.
async fn scripted(script: &[u16]) -> Server {
    let script = Arc::new(Mutex::new(
        script.iter().copied().collect::<VecDeque<u16>>(),
    ));
    Server::start(move |mut s| {
        let script = script.clone();
        async move {
            read_head(&mut s).await;
            let status = script.lock().unwrap().pop_front().unwrap_or(200);
            let response = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
            let _ = s.write_all(response.as_bytes()).await;
        }
    })
    .await
}

#[tokio::test]
async fn rise_and_fall_counts_show_in_the_report() {
    // fall 2, rise 2: a single failure or success between the others must not flip the member.
    let server = scripted(&[200, 500, 200, 500, 500, 200, 500, 200, 200]).await;
    let mut m = monitor("web", MonitorKind::Http);
    m.interval = Duration::from_millis(100);
    m.timeout = Duration::from_millis(100);
    m.rise = 2;
    m.fall = 2;
    let monitors = vec![m];
    let pools = build(
        &[pool_config("p", &[server.addr], &["web"])],
        &monitors,
        &[],
    );
    let member = pools[0].members()[0].clone();
    let service = HealthService::new();
    service.apply(&pools, &monitors);

    wait_until(SOON, "the member went down and came back", || {
        member.health.report().transitions.len() >= 2
    })
    .await;
    wait_until(SOON, "the script ran out", || server.count() >= 11).await;
    let report = member.health.report();
    assert!(report.up);
    let moves: Vec<(bool, &str)> = report
        .transitions
        .iter()
        .map(|t| (t.up, t.reason.as_str()))
        .collect();
    assert_eq!(
        moves,
        [
            (false, "monitor web: HTTP 500"),
            (true, "monitor web: HTTP 200")
        ]
    );
    assert_eq!(report.checks.len(), 1);
    assert_eq!(report.checks[0].monitor, "web");
    assert_eq!(report.checks[0].last, "HTTP 200");
}

#[tokio::test]
async fn failing_members_go_down_and_others_stay_up() {
    let good = Server::http(http_ok).await;
    let refused = refused_addr();
    let mut m = monitor("web", MonitorKind::Http);
    m.expect_body = Some("OK".into());
    let monitors = vec![m];
    let pools = build(
        &[pool_config("p", &[good.addr, refused], &["web"])],
        &monitors,
        &[],
    );
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    let [up, down] = [&pools[0].members()[0], &pools[0].members()[1]];
    wait_until(SOON, "the refused member is down", || !down.health.is_up()).await;
    assert_eq!(
        down.health.report().checks[0].last,
        "connect: connection refused"
    );
    wait_until(SOON, "the good member was checked", || {
        up.health.report().checks[0].last == "HTTP 200"
    })
    .await;
    assert!(up.health.is_up());
}

#[tokio::test]
async fn first_checks_spread_over_the_interval() {
    let mut servers = Vec::new();
    for _ in 0..20 {
        servers.push(Server::accept_only().await);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let mut m = monitor("tcp", MonitorKind::Tcp);
    m.interval = Duration::from_secs(1);
    m.timeout = Duration::from_millis(500);
    let monitors = vec![m];
    let pools = build(&[pool_config("p", &addrs, &["tcp"])], &monitors, &[]);
    let service = HealthService::new();
    let applied = Instant::now();
    service.apply(&pools, &monitors);
    wait_until(SOON, "every member was checked", || {
        servers.iter().all(|s| s.count() >= 1)
    })
    .await;
    let mut firsts: Vec<Duration> = servers
        .iter()
        .map(|s| s.accept_times()[0] - applied)
        .collect();
    firsts.sort();
    let spread = firsts[19] - firsts[0];
    assert!(
        spread > Duration::from_millis(300),
        "first checks within {spread:?}: {firsts:?}"
    );
    // Uniform over one interval: no crowd in any 100 ms (20 in 1 s average 2 per 100 ms).
    let crowd = firsts
        .iter()
        .map(|&t| {
            firsts
                .iter()
                .filter(|&&u| u >= t && u < t + Duration::from_millis(100))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        crowd <= 12,
        "{crowd} first checks within 100 ms: {firsts:?}"
    );
    assert!(
        firsts[19] < Duration::from_millis(1500),
        "all first checks within the interval: {firsts:?}"
    );
}

#[tokio::test]
async fn reapplying_the_same_config_keeps_checks_on_schedule() {
    let server = Server::accept_only().await;
    let mut m = monitor("tcp", MonitorKind::Tcp);
    m.interval = Duration::from_millis(600);
    m.timeout = Duration::from_millis(300);
    let monitors = vec![m];
    let configs = [pool_config("p", &[server.addr], &["tcp"])];
    let pools = build(&configs, &monitors, &[]);
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    let ids = service.task_ids();
    assert_eq!(ids.len(), 1);

    wait_until(SOON, "the first check", || server.count() == 1).await;
    let first = server.accept_times()[0];
    // Reloads, each rebuilding the pools from the previous ones as the binary does.
    let mut current = pools;
    for _ in 0..3 {
        current = build(&configs, &monitors, &current);
        service.apply(&current, &monitors);
    }
    assert_eq!(service.task_ids(), ids, "no check was restarted");
    // The next check is due 540–660 ms after the first. A restarted check would have drawn a
    // new delay in [0, 600 ms) from the reloads, right after the first: most likely another
    // connection well within 400 ms.
    wait_until(SOON, "the second check", || server.count() >= 2).await;
    let gap = server.accept_times()[1] - first;
    assert!(
        gap >= Duration::from_millis(400),
        "a second connection {gap:?} after the first"
    );

    // A changed monitor config restarts its checks.
    let mut changed = monitors.clone();
    changed[0].timeout = Duration::from_millis(200);
    let rebuilt = build(&configs, &changed, &current);
    service.apply(&rebuilt, &changed);
    let after = service.task_ids();
    assert_eq!(after.len(), 1);
    assert_ne!(after, ids);
}

#[tokio::test]
async fn removing_a_monitor_stops_its_checks() {
    let a = Server::accept_only().await;
    let b = Server::accept_only().await;
    let member = refused_addr();
    let mut ma = monitor("a", MonitorKind::Tcp);
    ma.port = Some(a.addr.port());
    ma.interval = Duration::from_millis(100);
    ma.timeout = Duration::from_millis(100);
    let mut mb = ma.clone();
    mb.name = "b".into();
    mb.port = Some(b.addr.port());
    let monitors = vec![ma, mb];
    let pools = build(&[pool_config("p", &[member], &["a", "b"])], &monitors, &[]);
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    wait_until(SOON, "both monitors checked", || {
        a.count() >= 1 && b.count() >= 1
    })
    .await;

    let configs = [pool_config("p", &[member], &["a"])];
    let pools = build(&configs, &monitors, &pools);
    service.apply(&pools, &monitors);
    assert_eq!(service.task_ids().len(), 1);
    let b_count = b.count();
    let a_count = a.count();
    wait_until(SOON, "a checked three more times", || {
        a.count() >= a_count + 3
    })
    .await;
    // One connect may have been under way when b's task was aborted.
    assert!(b.count() <= b_count + 1, "b is no longer checked");
    let report = pools[0].members()[0].health.report();
    let names: Vec<&str> = report.checks.iter().map(|c| c.monitor.as_str()).collect();
    assert_eq!(names, ["a"]);

    // Removing the pool stops the rest.
    service.apply(&[], &monitors);
    assert!(service.task_ids().is_empty());
}

#[tokio::test]
async fn shutdown_stops_everything() {
    let server = Server::accept_only().await;
    let mut m = monitor("tcp", MonitorKind::Tcp);
    m.interval = Duration::from_millis(100);
    m.timeout = Duration::from_millis(100);
    let monitors = vec![m];
    let pools = build(
        &[pool_config("p", &[server.addr], &["tcp"])],
        &monitors,
        &[],
    );
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    wait_until(SOON, "a check", || server.count() >= 1).await;
    service.shutdown();
    service.apply(&pools, &monitors);
    assert!(
        service.task_ids().is_empty(),
        "apply after shutdown does nothing"
    );
    let count = server.count();
    // Three intervals without checks (one connect may have been under way at shutdown).
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(server.count() <= count + 1);
}

/// An agent whose reply the test sets.
async fn agent_server() -> (Server, Arc<Mutex<&'static str>>) {
    let reply: Arc<Mutex<&'static str>> = Arc::new(Mutex::new("up\n"));
    let current = reply.clone();
    let server = Server::start(move |mut s| {
        let current = current.clone();
        async move {
            let reply = *current.lock().unwrap();
            let _ = s.write_all(reply.as_bytes()).await;
        }
    })
    .await;
    (server, reply)
}

#[tokio::test]
async fn agent_replies_take_effect() {
    let (agent, reply) = agent_server().await;
    let mut m = monitor("agent", MonitorKind::Agent);
    m.interval = Duration::from_millis(100);
    m.timeout = Duration::from_millis(100);
    let monitors = vec![m];
    let pools = build(
        &[pool_config("p", &[agent.addr], &["agent"])],
        &monitors,
        &[],
    );
    let member = pools[0].members()[0].clone();
    let service = HealthService::new();
    service.apply(&pools, &monitors);

    let set = |r: &'static str| *reply.lock().unwrap() = r;
    set("drain\n");
    wait_until(SOON, "drain", || member.agent_state() == AgentState::Drain).await;
    assert_eq!(member.effective_state(), AdminState::Drain);
    set("maint\n");
    wait_until(SOON, "maint", || member.agent_state() == AgentState::Maint).await;
    assert_eq!(member.effective_state(), AdminState::Disabled);
    set("ready\n");
    wait_until(SOON, "ready", || member.agent_state() == AgentState::None).await;
    assert_eq!(member.effective_state(), AdminState::Enabled);

    set("50%\n");
    wait_until(SOON, "the weight halved and the pool refreshed", || {
        member.agent_weight_pct() == 50 && member.effective_weight() == WEIGHT_SCALE / 2
    })
    .await;
    assert!(member.health.is_up(), "a reply with only a weight passes");

    set("down # maintenance window\n");
    wait_until(SOON, "down", || !member.health.is_up()).await;
    assert_eq!(
        member.health.report().checks[0].last,
        "agent: down # maintenance window"
    );
    set("up 100%\n");
    wait_until(SOON, "up at full weight", || {
        member.health.is_up() && member.effective_weight() == WEIGHT_SCALE
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_agent_records_nothing() {
    let web = Server::http(http_ok).await;
    let mut http = monitor("web", MonitorKind::Http);
    http.interval = Duration::from_millis(100);
    http.timeout = Duration::from_millis(100);
    let mut agent = http.clone();
    agent.name = "agent".into();
    agent.kind = MonitorKind::Agent;
    agent.port = Some(refused_addr().port());
    let monitors = vec![http, agent];
    let pools = build(
        &[pool_config("p", &[web.addr], &["web", "agent"])],
        &monitors,
        &[],
    );
    let member = pools[0].members()[0].clone();
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    // The agent runs on the same interval as the web check.
    wait_until(SOON, "several web checks", || web.count() >= 4).await;
    let report = member.health.report();
    assert!(report.up);
    let agent = report.checks.iter().find(|c| c.monitor == "agent").unwrap();
    assert_eq!(agent.last, "not checked yet");
}

#[tokio::test]
async fn removing_the_agent_lifts_its_overrides() {
    let (agent, reply) = agent_server().await;
    *reply.lock().unwrap() = "maint 10%\n";
    let mut m = monitor("agent", MonitorKind::Agent);
    m.interval = Duration::from_millis(100);
    m.timeout = Duration::from_millis(100);
    let monitors = vec![m];
    let pools = build(
        &[pool_config("p", &[agent.addr], &["agent"])],
        &monitors,
        &[],
    );
    let member = pools[0].members()[0].clone();
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    wait_until(SOON, "maint", || member.agent_state() == AgentState::Maint).await;

    let pools = build(&[pool_config("p", &[agent.addr], &[])], &monitors, &pools);
    service.apply(&pools, &monitors);
    assert_eq!(member.agent_state(), AgentState::None);
    assert_eq!(member.agent_weight_pct(), 100);
    assert_eq!(member.effective_weight(), WEIGHT_SCALE);
}

/// A protocol monitor goes through the same rise/fall machine: a dns monitor whose member
/// refuses (ICMP port unreachable) takes it down after `fall` checks.
#[tokio::test]
async fn protocol_monitors_take_members_down_like_the_others() {
    let mut m = monitor("dns", MonitorKind::Dns);
    m.interval = Duration::from_millis(100);
    m.timeout = Duration::from_millis(100);
    m.query = Some("health.test.".into());
    m.fall = 2;
    let monitors = vec![m];
    let closed = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let pools = build(&[pool_config("p", &[closed], &["dns"])], &monitors, &[]);
    let member = pools[0].members()[0].clone();
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    wait_until(SOON, "the member is down", || !member.health.is_up()).await;
    let last = member.health.report().checks[0].last.clone();
    assert!(last.contains("connection refused"), "{last}");
}

fn passively_down(pool: &Pool) -> Arc<fulcrum_balance::Member> {
    let member = pool.members()[0].clone();
    for _ in 0..3 {
        member.record_connect_failure("connection refused");
    }
    assert!(!member.health.is_up());
    assert!(member.health.needs_probe());
    member
}

#[tokio::test]
async fn the_back_off_probe_brings_a_member_back() {
    let addr = refused_addr();
    let pools = build(&[pool_config("p", &[addr], &[])], &[], &[]);
    let member = passively_down(&pools[0]);
    let service = HealthService::with_timing(ProbeTiming {
        scan: Duration::from_millis(50),
        first: Duration::from_millis(50),
        max: Duration::from_millis(200),
    });
    service.apply(&pools, &[]);
    // Several probes fail and back off (50, 100, 200, 200 ms …) while nothing listens.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!member.health.is_up());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let _server = Server::on(listener, |_s| async {});
    wait_until(SOON, "the probe brought the member back", || {
        member.health.is_up()
    })
    .await;
    let report = member.health.report();
    assert!(!report.passive_down);
    assert_eq!(
        report.transitions.last().map(|t| t.reason.as_str()),
        Some("probe: connected")
    );
    assert!(!member.health.needs_probe());
}

#[tokio::test]
async fn the_back_off_probe_runs_with_default_timing() {
    let server = Server::accept_only().await;
    let pools = build(&[pool_config("p", &[server.addr], &[])], &[], &[]);
    let member = passively_down(&pools[0]);
    let service = HealthService::new();
    service.apply(&pools, &[]);
    // The supervisor scans every second; the first probe waits one more.
    wait_until(SOON, "the probe brought the member back", || {
        member.health.is_up()
    })
    .await;
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn extreme_durations_neither_panic_nor_spin() {
    let server = Server::accept_only().await;
    let mut forever = monitor("forever", MonitorKind::Tcp);
    forever.interval = Duration::MAX;
    forever.timeout = Duration::MAX;
    let mut zero = monitor("zero", MonitorKind::Tcp);
    zero.interval = Duration::ZERO;
    zero.timeout = Duration::ZERO;
    let monitors = vec![forever, zero];
    let pools = build(
        &[pool_config("p", &[server.addr], &["forever", "zero"])],
        &monitors,
        &[],
    );
    let service = HealthService::new();
    service.apply(&pools, &monitors);
    // The zero interval is floored at 10 ms rather than spinning.
    wait_until(SOON, "a few checks", || server.count() >= 3).await;
    assert!(service.all_running());
    assert!(
        server.count() < 100,
        "{} checks: the floor did not hold",
        server.count()
    );
}
