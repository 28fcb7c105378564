//! Message-based load balancing, end to end through the binary: testkit "switch" members (a
//! length prefix + a 12-byte id, answering after a delay) and clients speaking the same framing.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use fulcrum_testkit::message::{id, Answer, LengthCode, ID_LEN};
use fulcrum_testkit::{MessageClient, MessageSwitch, SwitchOptions, WireFraming};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

async fn switches(n: usize, framing: &WireFraming, options: SwitchOptions) -> Vec<MessageSwitch> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(
            MessageSwitch::start(
                free_addr(),
                &format!("s{i}"),
                framing.clone(),
                options.clone(),
            )
            .await
            .unwrap(),
        );
    }
    v
}

fn member_tables(servers: &[MessageSwitch]) -> String {
    servers
        .iter()
        .map(|s| format!("[[pool.member]]\naddress = \"{}\"\n", s.addr))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A message service `svc` on `vs` over pool `p` of `servers`; `extra` goes into the service.
fn config(vs: SocketAddr, servers: &[MessageSwitch], extra: &str, pool_extra: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"svc\"\nlisten = \"{vs}\"\nprotocol = \"message\"\npool = \"p\"\n{extra}\n\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n{pool_extra}\n{}",
        member_tables(servers)
    )
}

/// ISO 8583-style framing: the body's length in four ASCII digits.
fn ascii_four_digits() -> WireFraming {
    WireFraming::Length {
        prefix: Vec::new(),
        width: 4,
        code: LengthCode::Ascii,
        includes_header: false,
        adjust: 0,
    }
}

const ASYNC_SEQ: &str = "message_mode = \"async\"\nsequence = { offset = 0, length = 12 }";

/// Waits until every member of pool `p` has its member connections up, so the first messages
/// are not scheduled while connections are still being opened.
async fn wait_connected(f: &Fulcrum, servers: &[MessageSwitch], per_member: u64) {
    let ok = wait_until(WAIT, || async {
        servers.iter().all(|s| s.active() >= per_member)
    })
    .await;
    assert!(ok, "member connections not up:\n{}", f.logs());
}

async fn metric(f: &Fulcrum, name: &str, labels: &str) -> f64 {
    let r = fulcrum_testkit::http_get(f.admin, "/metrics")
        .await
        .unwrap();
    let text = r.text();
    let prefix = format!("{name}{{{labels}");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {prefix} in:\n{text}"))
}

/// Sends `ids` pipelined on one connection (up to `window` outstanding) and returns the answers
/// by id. Panics on a duplicate answer.
async fn pipeline(
    vs: SocketAddr,
    framing: &WireFraming,
    ids: Vec<Vec<u8>>,
    payload: &[u8],
    window: usize,
) -> HashMap<Vec<u8>, Answer> {
    let c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    let (mut tx, mut rx) = c.split();
    let total = ids.len();
    let (sem_tx, mut sem_rx) = tokio::sync::mpsc::channel::<()>(window);
    let payload = payload.to_vec();
    let sender = tokio::spawn(async move {
        for i in ids {
            sem_tx.send(()).await.unwrap();
            tx.send(&i, &payload).await.unwrap();
        }
        tx
    });
    let mut answers = HashMap::new();
    for _ in 0..total {
        let a = rx
            .recv(WAIT)
            .await
            .unwrap()
            .expect("connection closed before every answer came");
        sem_rx.recv().await;
        assert!(
            answers.insert(a.id.clone(), a).is_none(),
            "a message was answered twice"
        );
    }
    let _tx = sender.await.unwrap();
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_long_clients_spread_evenly_over_four_members() {
    let framing = WireFraming::two_byte();
    let servers = switches(4, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(vs, &servers, ASYNC_SEQ, "")).await;
    wait_connected(&f, &servers, 2).await;

    // Two long-lived client connections, 400 messages each, pipelined 32 deep.
    let mut clients = Vec::new();
    for c in 0..2u64 {
        let framing = framing.clone();
        clients.push(tokio::spawn(async move {
            let ids: Vec<Vec<u8>> = (0..400).map(|i| id(c * 1000 + i).to_vec()).collect();
            pipeline(vs, &framing, ids, b"hello", 32).await
        }));
    }
    let mut per_client: Vec<BTreeMap<String, usize>> = Vec::new();
    for c in clients {
        let answers = c.await.unwrap();
        assert_eq!(answers.len(), 400);
        let mut shares = BTreeMap::new();
        for a in answers.values() {
            assert_eq!(a.payload, b"hello");
            *shares.entry(a.server.clone()).or_insert(0) += 1;
        }
        per_client.push(shares);
    }
    // Round robin per message: 800 messages, exactly 200 per member, whatever the client.
    let counts: Vec<u64> = servers.iter().map(|s| s.messages()).collect();
    assert_eq!(counts, vec![200, 200, 200, 200], "per-member messages");
    for shares in &per_client {
        assert_eq!(
            shares.len(),
            4,
            "each client reached every member: {shares:?}"
        );
        for n in shares.values() {
            assert!(
                *n >= 60,
                "one client's messages spread over all members: {shares:?}"
            );
        }
    }
    // The API: message counts per member and per service.
    let p = f.get_json("/api/v1/pools/p").await;
    for m in p["members"].as_array().unwrap() {
        assert_eq!(m["requests_total"], 200, "{m}");
        assert_eq!(
            m["active_connections"], 2,
            "two member connections each: {m}"
        );
    }
    let st = f.get_json("/api/v1/status").await;
    assert_eq!(st["virtual_services"][0]["protocol"], "message");
    assert_eq!(st["virtual_services"][0]["requests_total"], 800);
    assert_eq!(st["virtual_services"][0]["connections_total"], 2);
    assert_eq!(
        metric(&f, "fulcrum_message_responses_total", "vs=\"svc\"").await,
        800.0
    );
    assert_eq!(
        metric(&f, "fulcrum_message_in_flight", "vs=\"svc\"").await,
        0.0
    );
    assert_eq!(
        metric(&f, "fulcrum_message_latency_seconds_count", "vs=\"svc\"").await,
        800.0
    );
    // Each member saw exactly its two long connections: no connection per message.
    for s in &servers {
        assert_eq!(s.connections(), 2, "{}", s.name);
    }
}

/// A member killed in the middle of a stream: every message is still answered exactly once to
/// its client (the ones the dead member held are re-sent to the others: at least once to
/// members), and the dead member is taken out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_member_mid_stream_every_message_answered_exactly_once() {
    let framing = WireFraming::two_byte();
    let options = SwitchOptions {
        delay: Duration::from_millis(20),
        ordered: false,
    };
    let servers = switches(4, &framing, options).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        ASYNC_SEQ,
        "connect_timeout = \"500ms\"",
    ))
    .await;
    wait_connected(&f, &servers, 2).await;

    let mut clients = Vec::new();
    for c in 0..2u64 {
        let framing = framing.clone();
        clients.push(tokio::spawn(async move {
            let ids: Vec<Vec<u8>> = (0..600).map(|i| id(c * 10_000 + i).to_vec()).collect();
            pipeline(vs, &framing, ids, b"pay", 24).await
        }));
    }
    assert!(
        wait_until(WAIT, || async { servers[1].messages() >= 60 }).await,
        "traffic reached the member"
    );
    servers[1].kill();
    let killed_at = servers[1].messages();
    let mut all = HashMap::new();
    for c in clients {
        let answers = c.await.unwrap();
        assert_eq!(answers.len(), 600, "every message of the client answered");
        for (k, a) in answers {
            assert_eq!(a.id, k);
            assert!(all.insert(k, a).is_none());
        }
    }
    assert_eq!(all.len(), 1200);
    // Messages the killed member had received but not answered were sent again elsewhere.
    let redispatched = metric(&f, "fulcrum_message_redispatched_total", "vs=\"svc\"").await;
    assert!(redispatched >= 1.0, "some messages were re-sent");
    let seen_by_dead: HashSet<Vec<u8>> = servers[1].ids().into_iter().collect();
    let resent = all
        .values()
        .filter(|a| a.server != "s1" && seen_by_dead.contains(&a.id))
        .count();
    assert!(
        resent >= 1,
        "a message the dead member received was answered by another one"
    );
    assert_eq!(
        servers[1].messages(),
        killed_at,
        "nothing reached the dead member"
    );
    assert_eq!(
        metric(&f, "fulcrum_message_in_flight", "vs=\"svc\"").await,
        0.0
    );
    let dead = servers[1].addr.to_string();
    assert!(
        wait_until(WAIT, || async {
            f.member("p", &dead).await["health"] == "down"
        })
        .await,
        "the dead member is taken down passively"
    );
}

/// Sync mode: one outstanding message per member connection; many short client connections are
/// carried by a few long member connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_mode_short_clients_ride_long_member_connections() {
    let framing = WireFraming::two_byte();
    let options = SwitchOptions {
        delay: Duration::from_millis(5),
        ordered: false,
    };
    let servers = switches(2, &framing, options).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        "message_mode = \"sync\"\nmember_connections = 3",
        "",
    ))
    .await;
    wait_connected(&f, &servers, 1).await;
    // 120 short client connections, 12 at a time: connect, one message, its answer, close.
    let mut tasks = Vec::new();
    for batch in 0..10u64 {
        let mut batch_tasks = Vec::new();
        for i in 0..12u64 {
            let framing = framing.clone();
            batch_tasks.push(tokio::spawn(async move {
                let n = batch * 100 + i;
                let mut c = MessageClient::connect(vs, framing).await.unwrap();
                c.send(&id(n), format!("atm{n}").as_bytes()).await.unwrap();
                c.finish().await.unwrap();
                let a = c.recv(WAIT).await.unwrap().expect("an answer");
                assert_eq!(a.id, id(n));
                assert_eq!(a.payload, format!("atm{n}").as_bytes());
                assert!(c.closed_within(WAIT).await, "closed after the answer");
            }));
        }
        for t in batch_tasks {
            t.await.unwrap();
        }
        tasks.push(batch);
    }
    let total: u64 = servers.iter().map(|s| s.messages()).sum();
    assert_eq!(total, 120);
    for s in &servers {
        assert_eq!(
            s.max_outstanding(),
            1,
            "{}: one message at a time per connection",
            s.name
        );
        assert!(
            s.connections() <= 3,
            "{}: at most member_connections: {}",
            s.name,
            s.connections()
        );
        assert!(
            s.messages() >= 40,
            "{} took its share: {}",
            s.name,
            s.messages()
        );
    }
    let st = f.get_json("/api/v1/status").await;
    assert_eq!(st["virtual_services"][0]["connections_total"], 120);

    // A client pipelining in sync mode gets its answers in request order, though they are
    // served by different members and connections at different speeds.
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    for i in 0..12u64 {
        let delay = (12 - i) * 10;
        c.send(&id(i), format!("sleep:{delay};").as_bytes())
            .await
            .unwrap();
    }
    for i in 0..12u64 {
        let a = c.recv(WAIT).await.unwrap().unwrap();
        assert_eq!(a.id, id(i), "answers in request order");
    }
    for s in &servers {
        assert_eq!(s.max_outstanding(), 1);
    }
}

/// Async with a sequence id: answers come back out of order and each still reaches the request
/// it belongs to — also when two clients use the same ids on one shared member connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_sequence_matching_with_out_of_order_answers_and_colliding_ids() {
    let framing = WireFraming::two_byte();
    let servers = switches(1, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\nmember_connections = 1"),
        "",
    ))
    .await;
    wait_connected(&f, &servers, 1).await;

    // The switch answers the first message last.
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    for i in 0..8u64 {
        c.send(&id(i), format!("sleep:{};n{i}", (8 - i) * 40).as_bytes())
            .await
            .unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..8 {
        let a = c.recv(WAIT).await.unwrap().unwrap();
        let n: u64 = std::str::from_utf8(&a.id).unwrap().parse().unwrap();
        assert!(
            a.payload.ends_with(format!(";n{n}").as_bytes()),
            "answer paired with its own request"
        );
        order.push(n);
    }
    assert_eq!(
        order,
        (0..8).rev().collect::<Vec<_>>(),
        "answers as they came"
    );
    assert_eq!(
        servers[0].max_outstanding(),
        8,
        "pipelined on one connection"
    );

    // Two clients, the same ids at the same time, one member connection.
    let mut a = MessageClient::connect(vs, framing.clone()).await.unwrap();
    let mut b = MessageClient::connect(vs, framing.clone()).await.unwrap();
    for i in 0..10u64 {
        a.send(&id(i), format!("sleep:{};A", 10 * (i % 3)).as_bytes())
            .await
            .unwrap();
        b.send(&id(i), format!("sleep:{};B", 10 * (i % 2)).as_bytes())
            .await
            .unwrap();
    }
    for (client, tag) in [(&mut a, b"A"), (&mut b, b"B")] {
        let mut got = HashSet::new();
        for _ in 0..10 {
            let ans = client.recv(WAIT).await.unwrap().unwrap();
            assert!(
                ans.payload.ends_with(tag),
                "a client got another client's answer"
            );
            assert!(got.insert(ans.id));
        }
        assert_eq!(got.len(), 10);
    }
    assert_eq!(servers[0].connections(), 1);
    assert_eq!(
        metric(&f, "fulcrum_message_member_orphans_total", "vs=\"svc\"").await,
        0.0
    );
}

/// Async without a sequence id: answers are paired by order on each member connection, and a
/// client gets them in its request order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_order_matching_without_sequence() {
    let framing = WireFraming::two_byte();
    let mut servers = Vec::new();
    for (name, delay) in [("fast", 2), ("slow", 15)] {
        let options = SwitchOptions {
            delay: Duration::from_millis(delay),
            ordered: true,
        };
        servers.push(
            MessageSwitch::start(free_addr(), name, framing.clone(), options)
                .await
                .unwrap(),
        );
    }
    let vs = free_addr();
    let f = start(&config(vs, &servers, "message_mode = \"async\"", "")).await;
    wait_connected(&f, &servers, 2).await;
    let mut handles = Vec::new();
    for c in 0..2u64 {
        let framing = framing.clone();
        handles.push(tokio::spawn(async move {
            let mut cl = MessageClient::connect(vs, framing).await.unwrap();
            for i in 0..100u64 {
                cl.send(&id(c * 1000 + i), format!("c{c}m{i}").as_bytes())
                    .await
                    .unwrap();
            }
            let mut servers = HashSet::new();
            for i in 0..100u64 {
                let a = cl.recv(WAIT).await.unwrap().unwrap();
                assert_eq!(a.id, id(c * 1000 + i), "in request order");
                assert_eq!(a.payload, format!("c{c}m{i}").as_bytes());
                servers.insert(a.server);
            }
            servers.len()
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap(), 2, "both members served each client");
    }
    assert!(servers[0].max_outstanding() > 1, "pipelined");
    assert_eq!(
        metric(&f, "fulcrum_message_member_orphans_total", "vs=\"svc\"").await,
        0.0
    );
}

/// Oversize and malformed frames close the client that sent them, with a counter and a log
/// line; other clients of the same service go on undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_the_client_that_sent_them() {
    let framing = WireFraming::two_byte();
    let ascii = ascii_four_digits();
    let bin_servers = switches(2, &framing, SwitchOptions::default()).await;
    let ascii_server =
        MessageSwitch::start(free_addr(), "a0", ascii.clone(), SwitchOptions::default())
            .await
            .unwrap();
    let (vs, vs_ascii) = (free_addr(), free_addr());
    let f = start(&format!(
        "{}\n[[virtual_service]]\nname = \"iso\"\nlisten = \"{vs_ascii}\"\nprotocol = \"message\"\npool = \"a\"\nframing = {}\n\
         [[pool]]\nname = \"a\"\n[[pool.member]]\naddress = \"{}\"\n",
        config(vs, &bin_servers, &format!("{ASYNC_SEQ}\nframing = {}", framing.toml(64)), ""),
        ascii.toml(64),
        ascii_server.addr
    ))
    .await;
    wait_connected(&f, &bin_servers, 2).await;

    let mut good = MessageClient::connect(vs, framing.clone()).await.unwrap();
    good.send(&id(1), b"before").await.unwrap();
    assert_eq!(good.recv(WAIT).await.unwrap().unwrap().payload, b"before");

    // A length beyond max_message (64): closed before the body is even sent.
    let mut big = MessageClient::connect(vs, framing.clone()).await.unwrap();
    big.send_raw(&[0x01, 0x00]).await.unwrap();
    assert!(
        big.closed_within(WAIT).await,
        "oversize frame closes the client"
    );
    // A message too short to hold its 12-byte sequence id.
    let mut short = MessageClient::connect(vs, framing.clone()).await.unwrap();
    short.send_raw(&framing.encode(b"tiny")).await.unwrap();
    assert!(
        short.closed_within(WAIT).await,
        "a message without its id closes the client"
    );
    // An ASCII length that is not a number.
    let mut junk = MessageClient::connect(vs_ascii, ascii.clone())
        .await
        .unwrap();
    junk.send_raw(b"00x5hello").await.unwrap();
    assert!(
        junk.closed_within(WAIT).await,
        "a malformed length closes the client"
    );

    // The good clients never noticed.
    good.send(&id(2), b"after").await.unwrap();
    assert_eq!(good.recv(WAIT).await.unwrap().unwrap().payload, b"after");
    let mut iso = MessageClient::connect(vs_ascii, ascii.clone())
        .await
        .unwrap();
    iso.send(&id(3), b"ok").await.unwrap();
    assert_eq!(iso.recv(WAIT).await.unwrap().unwrap().payload, b"ok");

    let bad = |vs: &'static str, reason: &'static str| {
        let f = &f;
        async move {
            metric(
                f,
                "fulcrum_message_client_bad_frames_total",
                &format!("vs=\"{vs}\",reason=\"{reason}\""),
            )
            .await
        }
    };
    assert_eq!(bad("svc", "oversize").await, 1.0);
    assert_eq!(bad("svc", "malformed").await, 1.0);
    assert_eq!(bad("iso", "malformed").await, 1.0);
    assert_eq!(bad("iso", "oversize").await, 0.0);
    let logs = f.logs();
    assert!(
        logs.contains("closing client connection: bad frame"),
        "a log line: {logs}"
    );
    assert!(logs.contains("exceeds max_message (64 bytes)"), "{logs}");
}

/// Every framing variant, each on its own service with a member speaking it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_framing_variant_round_trips() {
    let length = |prefix: &[u8], width, code, includes_header, adjust| WireFraming::Length {
        prefix: prefix.to_vec(),
        width,
        code,
        includes_header,
        adjust,
    };
    let be = LengthCode::Binary { big_endian: true };
    let le = LengthCode::Binary { big_endian: false };
    let variants = vec![
        ("bin1", WireFraming::binary(1, true), 255),
        ("bin2le", WireFraming::binary(2, false), 1000),
        ("bin4", WireFraming::binary(4, true), 70000),
        ("bin8le", WireFraming::binary(8, false), 1000),
        ("offset_incl", length(b"ISO", 2, be, true, 0), 1000),
        ("le_incl_adjust", length(b"", 4, le, true, -4), 1000),
        ("ascii4", length(b"", 4, LengthCode::Ascii, false, 0), 9999),
        (
            "ascii6_tpdu",
            length(b"\x60\x00\x01\x00\x00", 6, LengthCode::Ascii, true, 0),
            5000,
        ),
        (
            "bcd2_adjust",
            length(b"", 2, LengthCode::Bcd, false, 2),
            9999,
        ),
        ("delim_crlf", WireFraming::Delimiter(b"\r\n".to_vec()), 1000),
        ("delim_etx", WireFraming::Delimiter(vec![3]), 1000),
    ];
    let mut text = String::new();
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for (name, framing, max) in &variants {
        let s = MessageSwitch::start(free_addr(), name, framing.clone(), SwitchOptions::default())
            .await
            .unwrap();
        let vs = free_addr();
        text.push_str(&format!(
            "[[virtual_service]]\nname = \"{name}\"\nlisten = \"{vs}\"\nprotocol = \"message\"\npool = \"{name}\"\n\
             framing = {}\n{ASYNC_SEQ}\n\n[[pool]]\nname = \"{name}\"\n[[pool.member]]\naddress = \"{}\"\n\n",
            framing.toml(*max),
            s.addr
        ));
        servers.push(s);
        addrs.push(vs);
    }
    let f = start(&text).await;
    wait_connected(&f, &servers, 2).await;
    for ((name, framing, max), vs) in variants.iter().zip(&addrs) {
        let mut c = MessageClient::connect(*vs, framing.clone()).await.unwrap();
        // Small and as large as the variant allows (the answer adds the switch's name and '|').
        let room = max - ID_LEN - name.len() - 1;
        let big: Vec<u8> = (0..room).map(|i| b'a' + (i % 26) as u8).collect();
        for (i, payload) in [b"x".to_vec(), big.clone(), b"".to_vec(), b"end".to_vec()]
            .into_iter()
            .enumerate()
        {
            c.send(&id(i as u64), &payload).await.unwrap();
            let a = c
                .recv(WAIT)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}\n{}", f.logs()))
                .unwrap_or_else(|| panic!("{name}: closed\n{}", f.logs()));
            assert_eq!(a.id, id(i as u64), "{name}");
            assert_eq!(a.server, *name);
            assert_eq!(a.payload, payload, "{name}");
        }
    }
    for s in &servers {
        assert_eq!(s.messages(), 4, "{}", s.name);
    }
}

/// Drain: a drained member gets no new message, and the ones it holds are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_stops_new_messages_while_outstanding_ones_complete() {
    let framing = WireFraming::two_byte();
    let slow = MessageSwitch::start(
        free_addr(),
        "slow",
        framing.clone(),
        SwitchOptions {
            delay: Duration::from_millis(600),
            ordered: false,
        },
    )
    .await
    .unwrap();
    let fast = MessageSwitch::start(
        free_addr(),
        "fast",
        framing.clone(),
        SwitchOptions::default(),
    )
    .await
    .unwrap();
    let servers = vec![slow, fast];
    let vs = free_addr();
    let f = start(&config(vs, &servers, ASYNC_SEQ, "")).await;
    wait_connected(&f, &servers, 2).await;
    let (mut tx, mut rx) = MessageClient::connect(vs, framing.clone())
        .await
        .unwrap()
        .split();
    for i in 0..10u64 {
        tx.send(&id(i), b"first").await.unwrap();
    }
    assert!(wait_until(WAIT, || async { servers[0].messages() == 5 }).await);
    let slow_addr = servers[0].addr.to_string();
    let r = f
        .api(
            "PUT",
            &format!("/api/v1/pools/p/members/{slow_addr}/state"),
            Some(json!({"state": "drain"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    for i in 10..30u64 {
        tx.send(&id(i), b"second").await.unwrap();
    }
    let mut by_server: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..30 {
        let a = rx.recv(WAIT).await.unwrap().unwrap();
        *by_server.entry(a.server).or_insert(0) += 1;
    }
    assert_eq!(
        by_server,
        BTreeMap::from([("fast".to_string(), 25), ("slow".to_string(), 5)]),
        "the drained member finished its 5 and got nothing new"
    );
    assert_eq!(servers[0].messages(), 5);
    // Its connections stay open for when it is enabled again.
    assert_eq!(servers[0].active(), 2);
    let r = f
        .api(
            "PUT",
            &format!("/api/v1/pools/p/members/{slow_addr}/state"),
            Some(json!({"state": "enabled"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    for i in 30..34u64 {
        tx.send(&id(i), b"third").await.unwrap();
    }
    for _ in 0..4 {
        rx.recv(WAIT).await.unwrap().unwrap();
    }
    assert_eq!(servers[0].messages(), 7, "back in rotation at once");
}

/// A reload keeps the client connection, and its next messages go to the new pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_client_connections_and_retargets_messages() {
    let framing = WireFraming::two_byte();
    let servers = switches(4, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(vs, &servers[..2], ASYNC_SEQ, "")).await;
    wait_connected(&f, &servers[..2], 2).await;
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    for i in 0..10u64 {
        c.send(&id(i), b"old").await.unwrap();
        let a = c.recv(WAIT).await.unwrap().unwrap();
        assert!(a.server == "s0" || a.server == "s1");
    }
    // The pool now holds s1 (stays), s2 and s3 (new); s0 leaves.
    f.write_config(&config(vs, &servers[1..], ASYNC_SEQ, ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let before: Vec<u64> = servers.iter().map(|s| s.messages()).collect();
    assert!(
        wait_until(WAIT, || async { servers[0].active() == 0 }).await,
        "the member that left has its connections closed"
    );
    assert_eq!(
        servers[1].connections(),
        2,
        "the member that stays keeps its connections"
    );
    let mut seen = BTreeMap::new();
    for i in 10..40u64 {
        c.send(&id(i), b"new").await.unwrap();
        let a = c
            .recv(WAIT)
            .await
            .unwrap()
            .expect("the client connection survived the reload");
        assert_eq!(a.id, id(i));
        *seen.entry(a.server).or_insert(0) += 1;
    }
    assert_eq!(
        seen,
        BTreeMap::from([("s1".into(), 10), ("s2".into(), 10), ("s3".into(), 10)])
    );
    assert_eq!(
        servers[0].messages(),
        before[0],
        "nothing to the removed member"
    );
    let st = f.get_json("/api/v1/status").await;
    assert_eq!(st["generation"], 2);
    assert_eq!(st["virtual_services"][0]["connections_total"], 1);
}

/// The seed's pain point: a member that comes back gets messages at once, on client connections
/// that were established long before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_member_receives_messages_at_once() {
    let framing = WireFraming::two_byte();
    let servers = switches(2, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}\n[[monitor]]\nname = \"t\"\ntype = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n",
        config(vs, &servers, ASYNC_SEQ, "monitors = [\"t\"]\nconnect_timeout = \"300ms\"")
    ))
    .await;
    wait_connected(&f, &servers, 2).await;
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    let addr = servers[1].addr;
    servers[1].kill();
    assert!(
        wait_until(WAIT, || async {
            f.member("p", &addr.to_string()).await["health"] == "down"
        })
        .await
    );
    for i in 0..10u64 {
        c.send(&id(i), b"while down").await.unwrap();
        assert_eq!(c.recv(WAIT).await.unwrap().unwrap().server, "s0");
    }
    // The member restarts on the same address.
    let back = MessageSwitch::start(addr, "s1-back", framing.clone(), SwitchOptions::default())
        .await
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            f.member("p", &addr.to_string()).await["health"] == "up"
        })
        .await
    );
    assert!(
        wait_until(WAIT, || async { back.active() >= 1 }).await,
        "Fulcrum reconnected to the recovered member"
    );
    let mut seen = BTreeMap::new();
    for i in 10..30u64 {
        c.send(&id(i), b"after").await.unwrap();
        let a = c.recv(WAIT).await.unwrap().unwrap();
        *seen.entry(a.server).or_insert(0) += 1;
    }
    assert!(
        seen.get("s1-back").copied().unwrap_or(0) >= 8,
        "the recovered member takes its share on the old client connection: {seen:?}"
    );
}

/// at_most_once: messages a dead member held are failed, never re-sent; the client connection
/// and the other messages carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_fails_instead_of_resending() {
    let framing = WireFraming::two_byte();
    let slow = MessageSwitch::start(
        free_addr(),
        "slow",
        framing.clone(),
        SwitchOptions {
            delay: Duration::from_secs(5),
            ordered: false,
        },
    )
    .await
    .unwrap();
    let fast = MessageSwitch::start(
        free_addr(),
        "fast",
        framing.clone(),
        SwitchOptions::default(),
    )
    .await
    .unwrap();
    let servers = vec![slow, fast];
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\ndelivery = \"at_most_once\""),
        "",
    ))
    .await;
    wait_connected(&f, &servers, 2).await;
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    for i in 0..10u64 {
        c.send(&id(i), b"m").await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(c.recv(WAIT).await.unwrap().unwrap());
    }
    assert!(got.iter().all(|a| a.server == "fast"));
    assert!(wait_until(WAIT, || async { servers[0].messages() == 5 }).await);
    servers[0].kill();
    assert!(
        wait_until(WAIT, || async {
            metric(
                &f,
                "fulcrum_message_failed_total",
                "vs=\"svc\",reason=\"member_failed\"",
            )
            .await
                == 5.0
        })
        .await
    );
    assert_eq!(
        metric(&f, "fulcrum_message_redispatched_total", "vs=\"svc\"").await,
        0.0
    );
    assert_eq!(servers[1].messages(), 5, "nothing was re-sent");
    // The client connection carries on.
    c.send(&id(99), b"still here").await.unwrap();
    let a = c.recv(WAIT).await.unwrap().unwrap();
    assert_eq!(a.id, id(99));
    let st = f.get_json("/api/v1/status").await;
    assert_eq!(st["virtual_services"][0]["upstream_failures"], 5);
}

/// An answer that never comes fails its message at message_timeout; an answer nobody asked for
/// is dropped and counted; neither disturbs the messages around them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_orphan_answers_are_counted() {
    let framing = WireFraming::two_byte();
    let servers = switches(1, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\nmessage_timeout = \"300ms\"\nmember_connections = 1"),
        "",
    ))
    .await;
    wait_connected(&f, &servers, 1).await;
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    c.send(&id(1), b"noreply").await.unwrap();
    c.send(&id(2), b"orphan").await.unwrap();
    c.send(&id(3), b"fine").await.unwrap();
    let a = c.recv(WAIT).await.unwrap().unwrap();
    assert_eq!((a.id, a.payload), (id(3).to_vec(), b"fine".to_vec()));
    assert!(
        wait_until(WAIT, || async {
            metric(
                &f,
                "fulcrum_message_failed_total",
                "vs=\"svc\",reason=\"timeout\"",
            )
            .await
                == 2.0
        })
        .await
    );
    assert_eq!(
        metric(&f, "fulcrum_message_member_orphans_total", "vs=\"svc\"").await,
        1.0
    );
    assert_eq!(
        metric(&f, "fulcrum_message_member_timeouts_total", "vs=\"svc\"").await,
        2.0
    );
    c.send(&id(4), b"later").await.unwrap();
    assert_eq!(c.recv(WAIT).await.unwrap().unwrap().id, id(4));
    // The member answers other messages, so it stays up; the connection stays the same one.
    assert_eq!(servers[0].connections(), 1);
}

#[test]
fn check_reports_message_framing_errors_with_their_place() {
    let (ok, out) = check(
        "[[virtual_service]]\nname = \"m\"\nlisten = \"127.0.0.1:7000\"\nprotocol = \"message\"\npool = \"p\"\n\
         framing = { delimiter = \"\\n\", length_bytes = 2 }\nsequence = { offset = 0, length = 100 }\n\
         [[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"127.0.0.1:9000\"\nmax_connections = 5\n",
    );
    assert!(!ok);
    assert!(
        out.contains("bad.toml:6:13: virtual_service[0].framing.delimiter: a frame ends with `delimiter` or has a length prefix, not both"),
        "{out}"
    );
    assert!(
        out.contains("bad.toml:7:26: virtual_service[0].sequence.length: 100 is out of range"),
        "{out}"
    );
    assert!(
        out.contains("bad.toml:12:1: pool[0].member[0].max_connections: message service \"m\" uses this pool"),
        "{out}"
    );
}

/// proxy_protocol on a message service: every member connection opens with the header for a
/// connection of Fulcrum's own (v2 LOCAL, v1 UNKNOWN), since it carries many clients' messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_announces_fulcrums_own_member_connections() {
    let framing = WireFraming::two_byte();
    for (version, check) in [
        (
            "v2",
            (|h: &[u8]| h.len() == 16 && h[12] == 0x20 && h[13] == 0) as fn(&[u8]) -> bool,
        ),
        ("v1", |h: &[u8]| h == b"PROXY UNKNOWN\r\n"),
    ] {
        let servers = switches(1, &framing, SwitchOptions::default()).await;
        let vs = free_addr();
        let f = start(&config(
            vs,
            &servers,
            &format!("{ASYNC_SEQ}\nproxy_protocol = \"{version}\""),
            "",
        ))
        .await;
        wait_connected(&f, &servers, 2).await;
        let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
        c.send(&id(7), b"hi").await.unwrap();
        assert_eq!(c.recv(WAIT).await.unwrap().unwrap().payload, b"hi");
        assert!(
            wait_until(WAIT, || async { servers[0].proxy_headers().len() == 2 }).await,
            "{version}: one header per member connection: {:?}",
            servers[0].proxy_headers()
        );
        let headers = servers[0].proxy_headers();
        assert!(headers.iter().all(|h| check(h)), "{version}: {headers:?}");
    }
}

/// Back-pressure: with a member that answers nothing, messages from many clients wait in its
/// queue only up to `member_queue`; past it the clients are no longer read (their sends block in
/// TCP) instead of Fulcrum queueing everything they send. (Before `member_queue`, the member's
/// queue took every message every client sent: 4 × 300 here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_queue_bounds_waiting_messages_and_pauses_clients() {
    let framing = WireFraming::two_byte();
    let servers = switches(1, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\nmember_connections = 1\nmax_pending = 4\nmember_queue = 64\nmessage_timeout = \"60s\""),
        "",
    ))
    .await;
    wait_connected(&f, &servers, 1).await;
    let mut senders = Vec::new();
    for c in 0..4u64 {
        let (mut tx, rx) = MessageClient::connect(vs, framing.clone())
            .await
            .unwrap()
            .split();
        senders.push(tokio::spawn(async move {
            let _rx = rx;
            for i in 0..300u64 {
                if tx.send(&id(c * 1000 + i), b"noreply").await.is_err() {
                    break;
                }
            }
            // Hold the connection (a blocked send above never returns: the task is aborted).
            tokio::time::sleep(Duration::from_secs(60)).await;
        }));
    }
    // Wait until Fulcrum stops taking messages.
    let mut last = -1.0;
    let mut settled = false;
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = metric(&f, "fulcrum_message_requests_total", "vs=\"svc\"").await;
        if now == last && now > 0.0 {
            settled = true;
            break;
        }
        last = now;
    }
    assert!(settled, "Fulcrum kept reading");
    let received = metric(&f, "fulcrum_message_requests_total", "vs=\"svc\"").await;
    let queued = metric(&f, "fulcrum_message_queued", "vs=\"svc\"").await;
    let in_flight = metric(&f, "fulcrum_message_in_flight", "vs=\"svc\"").await;
    let paused = metric(&f, "fulcrum_message_paused_total", "vs=\"svc\"").await;
    println!("received {received}, queued {queued}, in flight {in_flight}, paused {paused}");
    // 4 at the member, 64 queued, and at most one message per client taken as the bound was
    // reached.
    assert!(queued <= 64.0 + 4.0, "queued {queued}");
    assert!(in_flight <= 4.0 + 64.0 + 4.0, "in flight {in_flight}");
    assert!(received < 1200.0, "every message was read: {received}");
    assert!(paused >= 1.0);
    for s in senders {
        s.abort();
    }
}

/// SIGTERM drains message services: clients are read no more, the answers to the messages in
/// flight are delivered, then each client connection is closed and the process exits, long
/// before `shutdown_timeout` (before: the connections stayed open, still read, until the
/// timeout cut them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_delivers_answers_in_flight_then_closes() {
    let framing = WireFraming::two_byte();
    let servers = switches(
        1,
        &framing,
        SwitchOptions {
            delay: Duration::from_millis(1000),
            ordered: false,
        },
    )
    .await;
    let vs = free_addr();
    let mut f = start(&format!(
        "[global]\nshutdown_timeout = \"20s\"\n\n{}",
        config(vs, &servers, ASYNC_SEQ, "")
    ))
    .await;
    wait_connected(&f, &servers, 2).await;
    let mut c = MessageClient::connect(vs, framing.clone()).await.unwrap();
    for i in 0..3u64 {
        c.send(&id(i), b"slow").await.unwrap();
    }
    assert!(wait_until(WAIT, || async { servers[0].messages() == 3 }).await);
    let started = std::time::Instant::now();
    f.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Sent after SIGTERM: not read, so never sent to a member.
    let _ = c.send(&id(99), b"late").await;
    let mut got = HashSet::new();
    for _ in 0..3 {
        let a = c.recv(WAIT).await.unwrap().expect("an answer in flight");
        got.insert(a.id);
    }
    assert_eq!(got.len(), 3);
    assert!(
        c.closed_within(Duration::from_secs(3)).await,
        "the client connection is closed once its answers are written"
    );
    let status = f.wait_exit(Duration::from_secs(25)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "exited after {:?}",
        started.elapsed()
    );
    assert_eq!(
        servers[0].messages(),
        3,
        "the late message was not forwarded"
    );
}

/// A WebAssembly framing hook (`framing.wasm`) reading an ISO 8583-style length field (four
/// ASCII digits) and the sequence key: the same client stream is split and paired as the
/// built-in framing with `sequence` does, answers out of order included, and bytes the hook
/// refuses close only their client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wasm_framing_hook_splits_and_pairs_as_the_built_in_framing_does() {
    let ascii = ascii_four_digits();
    let servers = switches(1, &ascii, SwitchOptions::default()).await;
    let (builtin, hooked) = (free_addr(), free_addr());
    let hook = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fulcrum-wasm/filters/iso8583_frame.wat");
    let f = start(&format!(
        "{}\n[[virtual_service]]\nname = \"hooked\"\nlisten = \"{hooked}\"\nprotocol = \"message\"\npool = \"p\"\n\
         message_mode = \"async\"\nmember_connections = 1\nframing = {{ wasm = \"{}\", max_message = 512 }}\n",
        config(
            builtin,
            &servers,
            &format!(
                "{ASYNC_SEQ}\nmember_connections = 1\nframing = {}",
                ascii.toml(512)
            ),
            ""
        ),
        hook.display()
    ))
    .await;
    wait_connected(&f, &servers, 2).await;

    let mut seen = Vec::new();
    for vs in [builtin, hooked] {
        // The switch answers the first message last: pairing is by key, not by order.
        let mut c = MessageClient::connect(vs, ascii.clone()).await.unwrap();
        for i in 0..8u64 {
            c.send(&id(i), format!("sleep:{};n{i}", (8 - i) * 30).as_bytes())
                .await
                .unwrap();
        }
        let mut order = Vec::new();
        for _ in 0..8 {
            let a = c.recv(WAIT).await.unwrap().expect("an answer");
            let n: u64 = std::str::from_utf8(&a.id).unwrap().parse().unwrap();
            assert!(a.payload.ends_with(format!(";n{n}").as_bytes()), "paired");
            order.push(n);
        }
        seen.push(order);
    }
    assert_eq!(seen[0], (0..8).rev().collect::<Vec<_>>());
    assert_eq!(
        seen[0], seen[1],
        "the hook splits and pairs as the built-in framing"
    );

    let mut good = MessageClient::connect(hooked, ascii.clone()).await.unwrap();
    let mut junk = MessageClient::connect(hooked, ascii.clone()).await.unwrap();
    junk.send_raw(b"00x5hello").await.unwrap();
    assert!(
        junk.closed_within(WAIT).await,
        "a malformed length closes the client"
    );
    let mut big = MessageClient::connect(hooked, ascii.clone()).await.unwrap();
    big.send_raw(b"9999").await.unwrap();
    assert!(
        big.closed_within(WAIT).await,
        "beyond max_message closes the client"
    );
    let mut short = MessageClient::connect(hooked, ascii.clone()).await.unwrap();
    short.send_raw(&ascii.encode(b"tiny")).await.unwrap();
    assert!(
        short.closed_within(WAIT).await,
        "no room for the key closes the client"
    );
    good.send(&id(42), b"still here").await.unwrap();
    assert_eq!(
        good.recv(WAIT).await.unwrap().unwrap().payload,
        b"still here"
    );
    for (reason, n) in [("malformed", 2.0), ("oversize", 1.0)] {
        let labels = format!("vs=\"hooked\",reason=\"{reason}\"");
        let got = metric(&f, "fulcrum_message_client_bad_frames_total", &labels).await;
        assert_eq!(got, n, "{reason}");
    }
}

/// Fulcrum's member-choice hook on message services, an iRule's `node` command: the framing
/// hook sets `fulcrum.member` from the message ("@ip:port;" at the start of its payload) and
/// the message goes to that member; messages without a choice, or naming a member that is not
/// in the pool, are scheduled as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wasm_framing_hook_chooses_the_member_of_each_message() {
    let ascii = ascii_four_digits();
    let servers = switches(2, &ascii, SwitchOptions::default()).await;
    let vs = free_addr();
    let hook = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fulcrum-wasm/filters/iso8583_frame.wat");
    let f = start(&config(
        vs,
        &servers,
        &format!(
            "message_mode = \"async\"\nmember_connections = 1\nframing = {{ wasm = \"{}\", max_message = 512 }}",
            hook.display()
        ),
        "",
    ))
    .await;
    wait_connected(&f, &servers, 1).await;
    let mut c = MessageClient::connect(vs, ascii.clone()).await.unwrap();
    let target = servers[1].addr;
    for i in 0..6u64 {
        c.send(&id(i), format!("@{target};to s1").as_bytes())
            .await
            .unwrap();
        c.recv(WAIT).await.unwrap().expect("an answer");
    }
    assert_eq!(
        (servers[0].messages(), servers[1].messages()),
        (0, 6),
        "every chosen message went to s1"
    );
    for i in 6..12u64 {
        let payload: &[u8] = if i % 2 == 0 {
            b"plain"
        } else {
            b"@127.0.0.1:9;gone"
        };
        c.send(&id(i), payload).await.unwrap();
        c.recv(WAIT).await.unwrap().expect("an answer");
    }
    assert_eq!(
        servers[0].messages() + servers[1].messages(),
        12,
        "{} / {}",
        servers[0].messages(),
        servers[1].messages()
    );
    assert!(
        servers[0].messages() >= 2,
        "without a usable choice the scheduler spreads them: {}",
        servers[0].messages()
    );
}

/// `n` simplex switches on 127.0.0.2, 127.0.0.3, …: requests to each one's address, answers on
/// its receive-only port, the same port for all (`simplex.receive_port`).
async fn simplex_switches(
    n: usize,
    framing: &WireFraming,
    options: SwitchOptions,
) -> (Vec<MessageSwitch>, u16) {
    for _ in 0..20 {
        let port = fulcrum_testkit::free_addr_on([127, 0, 0, 2]).port();
        let mut v = Vec::new();
        for i in 0..n {
            let ip = [127, 0, 0, 2 + i as u8];
            let receive = SocketAddr::from((ip, port));
            match MessageSwitch::start_simplex(
                fulcrum_testkit::free_addr_on(ip),
                receive,
                &format!("s{i}"),
                framing.clone(),
                options.clone(),
            )
            .await
            {
                Ok(s) => v.push(s),
                Err(_) => break,
            }
        }
        if v.len() == n {
            return (v, port);
        }
    }
    panic!("no receive port free on every switch address");
}

/// Waits until each switch has its send connection and its receive connection from Fulcrum.
async fn wait_simplex_connected(f: &Fulcrum, servers: &[MessageSwitch]) {
    let ok = wait_until(WAIT, || async {
        servers
            .iter()
            .all(|s| s.active() >= 1 && s.receive_connections() >= 1)
    })
    .await;
    assert!(ok, "simplex member connections not up:\n{}", f.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simplex_members_answer_on_their_receive_connection_to_the_right_clients() {
    let framing = WireFraming::two_byte();
    let options = SwitchOptions {
        delay: Duration::from_millis(2),
        ordered: false,
    };
    let (servers, port) = simplex_switches(3, &framing, options).await;
    // A fourth member whose receive port nobody listens on: its send half connects, but a
    // simplex member is up only with both halves, so it never gets a message.
    let half = MessageSwitch::start(
        fulcrum_testkit::free_addr_on([127, 0, 0, 9]),
        "half",
        framing.clone(),
        SwitchOptions::default(),
    )
    .await
    .unwrap();
    let vs = free_addr();
    let mut members = member_tables(&servers);
    members.push_str(&format!("\n[[pool.member]]\naddress = \"{}\"\n", half.addr));
    let text = format!(
        "[[virtual_service]]\nname = \"svc\"\nlisten = \"{vs}\"\nprotocol = \"message\"\npool = \"p\"\n{ASYNC_SEQ}\nsimplex = {{ receive_port = {port} }}\n\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n{members}"
    );
    let f = start(&text).await;
    wait_simplex_connected(&f, &servers).await;

    // A burst: four clients, 150 messages each, pipelined 32 deep, all at once.
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let framing = framing.clone();
        clients.push(tokio::spawn(async move {
            let ids: Vec<Vec<u8>> = (0..150).map(|i| id(c * 1000 + i).to_vec()).collect();
            let payload = format!("client{c}");
            (c, pipeline(vs, &framing, ids, payload.as_bytes(), 32).await)
        }));
    }
    let mut by_server: BTreeMap<String, usize> = BTreeMap::new();
    for task in clients {
        let (c, answers) = task.await.unwrap();
        assert_eq!(answers.len(), 150, "client {c}:\n{}", f.logs());
        for (key, a) in &answers {
            let n: u64 = std::str::from_utf8(key).unwrap().parse().unwrap();
            assert_eq!(n / 1000, c, "client {c} got another client's answer");
            assert_eq!(a.payload, format!("client{c}").into_bytes());
            *by_server.entry(a.server.clone()).or_default() += 1;
        }
    }
    // Every answer came on the receive-only connections; none on the request connections.
    assert_eq!(
        by_server.keys().cloned().collect::<Vec<_>>(),
        ["s0", "s1", "s2"]
    );
    // (The switch counts a frame once its write returned: the client may have it first.)
    let counted = wait_until(WAIT, || async {
        servers.iter().map(|s| s.receive_frames()).sum::<u64>() == 600
    })
    .await;
    assert!(counted, "answers not all written on receive connections");
    assert!(servers.iter().all(|s| s.duplex_frames() == 0));
    assert_eq!(half.messages(), 0);
    assert_eq!(
        metric(&f, "fulcrum_message_responses_total", "vs=\"svc\"").await,
        600.0
    );
    assert_eq!(
        metric(
            &f,
            "fulcrum_message_simplex_send_dropped_bytes_total",
            "vs=\"svc\""
        )
        .await,
        0.0
    );
}

const NAMED: &str = "member_requests = { client_field = { offset = 12, length = 8 } }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simplex_members_request_reaches_the_named_client_and_its_answer_returns() {
    let framing = WireFraming::two_byte();
    let (servers, port) = simplex_switches(1, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\nsimplex = {{ receive_port = {port} }}\n{NAMED}"),
        "",
    ))
    .await;
    wait_simplex_connected(&f, &servers).await;

    // Two terminals name themselves with their first message.
    let mut a = MessageClient::connect(vs, framing.clone()).await.unwrap();
    let mut b = MessageClient::connect(vs, framing.clone()).await.unwrap();
    a.send(&id(1), b"TERMAAAAhello").await.unwrap();
    b.send(&id(2), b"TERMBBBBhello").await.unwrap();
    assert_eq!(a.recv(WAIT).await.unwrap().unwrap().id, id(1));
    assert_eq!(b.recv(WAIT).await.unwrap().unwrap().id, id(2));

    // The host asks terminal A something (on its receive-only connection to Fulcrum).
    let mut ask = id(900).to_vec();
    ask.extend_from_slice(b"TERMAAAAbalance?");
    assert!(servers[0].originate(&ask));
    let got = a
        .recv_body(WAIT)
        .await
        .unwrap()
        .expect("the host's request");
    assert_eq!(got, ask);
    // A answers with the same sequence id: Fulcrum writes it to the host on the send half.
    a.send(&id(900), b"TERMAAAA42").await.unwrap();
    let answered = wait_until(WAIT, || async { !servers[0].origin_answers().is_empty() }).await;
    assert!(answered, "the answer did not reach the host:\n{}", f.logs());
    let mut want = id(900).to_vec();
    want.extend_from_slice(b"TERMAAAA42");
    assert_eq!(servers[0].origin_answers(), vec![want]);
    assert_eq!(servers[0].duplex_frames(), 0);
    // B saw nothing of it, and still gets its own answers.
    b.send(&id(3), b"TERMBBBBagain").await.unwrap();
    assert_eq!(b.recv(WAIT).await.unwrap().unwrap().id, id(3));

    // A request for a terminal that is not connected, with no fallback pool: dropped, counted.
    let mut lost = id(901).to_vec();
    lost.extend_from_slice(b"TERMZZZZhello?");
    assert!(servers[0].originate(&lost));
    let counted = wait_until(WAIT, || async {
        metric(
            &f,
            "fulcrum_message_originated_undeliverable_total",
            "vs=\"svc\"",
        )
        .await
            == 1.0
    })
    .await;
    assert!(counted, "{}", f.logs());
    for (name, want) in [
        ("fulcrum_message_originated_total", 2.0),
        ("fulcrum_message_originated_delivered_total", 1.0),
        ("fulcrum_message_originated_answered_total", 1.0),
        ("fulcrum_message_member_orphans_total", 0.0),
    ] {
        assert_eq!(metric(&f, name, "vs=\"svc\"").await, want, "{name}");
    }
    // The host's own messages were never taken for client requests.
    assert_eq!(servers[0].messages(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_requests_no_client_takes_go_round_robin_to_the_fallback_pool() {
    let framing = WireFraming::two_byte();
    let bank = switches(1, &framing, SwitchOptions::default()).await;
    let branches = switches(2, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let text = format!(
        "{}\n\n[[pool]]\nname = \"branches\"\nalgorithm = \"round_robin\"\n{}",
        config(
            vs,
            &bank,
            &format!(
                "{ASYNC_SEQ}\nmember_requests = {{ client_field = {{ offset = 12, length = 8 }}, fallback_pool = \"branches\" }}"
            ),
            "",
        ),
        member_tables(&branches)
    );
    let f = start(&text).await;
    wait_connected(&f, &bank, 2).await;
    wait_connected(&f, &branches, 2).await;

    // A named terminal takes what names it; the others go to the branch hosts in turn.
    let mut t = MessageClient::connect(vs, framing.clone()).await.unwrap();
    t.send(&id(1), b"TERMAAAAhello").await.unwrap();
    assert_eq!(t.recv(WAIT).await.unwrap().unwrap().id, id(1));
    for n in 0..4u64 {
        let mut ask = id(500 + n).to_vec();
        ask.extend_from_slice(b"NOBODY00ask");
        assert!(bank[0].originate(&ask));
    }
    let mut ask = id(600).to_vec();
    ask.extend_from_slice(b"TERMAAAAask");
    assert!(bank[0].originate(&ask));
    assert_eq!(t.recv_body(WAIT).await.unwrap().unwrap(), ask);
    t.send(&id(600), b"TERMAAAAfrom-terminal").await.unwrap();

    let all = wait_until(WAIT, || async { bank[0].origin_answers().len() == 5 }).await;
    assert!(all, "{:?}\n{}", bank[0].origin_answers(), f.logs());
    let answers: Vec<Answer> = bank[0]
        .origin_answers()
        .iter()
        .filter_map(|b| Answer::parse(b))
        .collect();
    let mut servers: Vec<String> = answers.iter().map(|a| a.server.clone()).collect();
    servers.sort();
    assert_eq!(servers, ["s0", "s0", "s1", "s1"], "{answers:?}");
    assert!(bank[0]
        .origin_answers()
        .iter()
        .any(|b| b.ends_with(b"TERMAAAAfrom-terminal")));
    for (name, want) in [
        ("fulcrum_message_originated_total", 5.0),
        ("fulcrum_message_originated_delivered_total", 5.0),
        ("fulcrum_message_originated_undeliverable_total", 0.0),
        ("fulcrum_message_originated_answered_total", 5.0),
    ] {
        assert_eq!(metric(&f, name, "vs=\"svc\"").await, want, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simplex_member_without_its_receive_half_takes_no_message() {
    let framing = WireFraming::two_byte();
    let (servers, port) = simplex_switches(2, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\nsimplex = {{ receive_port = {port} }}"),
        "",
    ))
    .await;
    wait_simplex_connected(&f, &servers).await;
    let ids: Vec<Vec<u8>> = (0..20).map(|i| id(i).to_vec()).collect();
    let answers = pipeline(vs, &framing, ids, b"both", 8).await;
    let from: HashSet<String> = answers.values().map(|a| a.server.clone()).collect();
    assert_eq!(from.len(), 2, "both members answer while whole");

    // s0's receive port goes away: its send connection is closed too, and it gets no message
    // (nothing could come back) while s1 answers everything.
    servers[0].kill_receive();
    let down = wait_until(WAIT, || async { servers[0].active() == 0 }).await;
    assert!(
        down,
        "the send half stays open without the receive half:\n{}",
        f.logs()
    );
    let before = servers[0].messages();
    let ids: Vec<Vec<u8>> = (100..140).map(|i| id(i).to_vec()).collect();
    let answers = pipeline(vs, &framing, ids, b"half", 8).await;
    assert_eq!(answers.len(), 40);
    assert!(answers.values().all(|a| a.server == "s1"), "{answers:?}");
    assert_eq!(servers[0].messages(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_makes_a_members_message_a_request_even_when_its_id_is_waiting() {
    let framing = WireFraming::two_byte();
    let servers = switches(1, &framing, SwitchOptions::default()).await;
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!(
            "{ASYNC_SEQ}\nmessage_timeout = \"2s\"\nmember_requests = {{ client_field = {{ offset = 15, length = 8 }}, marker = {{ offset = 12, value = \"REQ\" }} }}"
        ),
        "",
    ))
    .await;
    wait_connected(&f, &servers, 2).await;
    let mut a = MessageClient::connect(vs, framing.clone()).await.unwrap();
    a.send(&id(1), b"ANSTERMAAAA").await.unwrap();
    assert_eq!(a.recv(WAIT).await.unwrap().unwrap().id, id(1));
    // A asks something the host never answers: id 5 is waiting on the member connection...
    a.send(&id(5), b"noreply").await.unwrap();
    let sent = wait_until(WAIT, || async { servers[0].messages() == 2 }).await;
    assert!(sent);
    // ...and the host sends a request of its own with that very id, marked REQ: a request for
    // terminal A, not the answer to A's message.
    let mut ask = id(5).to_vec();
    ask.extend_from_slice(b"REQTERMAAAAping");
    assert!(servers[0].originate(&ask));
    assert_eq!(a.recv_body(WAIT).await.unwrap().unwrap(), ask);
    a.send(&id(5), b"ANSTERMAAAApong").await.unwrap();
    let back = wait_until(WAIT, || async { servers[0].origin_answers().len() == 1 }).await;
    assert!(back, "{}", f.logs());
    assert_eq!(
        metric(&f, "fulcrum_message_originated_total", "vs=\"svc\"").await,
        1.0
    );
    // A's own message with id 5 was not taken as answered: it times out.
    let timed_out = wait_until(WAIT, || async {
        metric(
            &f,
            "fulcrum_message_failed_total",
            "vs=\"svc\",reason=\"timeout\"",
        )
        .await
            == 1.0
    })
    .await;
    assert!(timed_out, "{}", f.logs());
    assert_eq!(
        metric(&f, "fulcrum_message_responses_total", "vs=\"svc\"").await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simplex_members_may_open_their_receive_connection_to_fulcrum() {
    let framing = WireFraming::two_byte();
    let receive = free_addr();
    let mut servers = Vec::new();
    for i in 0..2u8 {
        servers.push(
            MessageSwitch::start_simplex_dialing(
                fulcrum_testkit::free_addr_on([127, 0, 0, 2 + i]),
                receive,
                &format!("s{i}"),
                framing.clone(),
                SwitchOptions {
                    delay: Duration::from_millis(2),
                    ordered: false,
                },
            )
            .await
            .unwrap(),
        );
    }
    let vs = free_addr();
    let f = start(&config(
        vs,
        &servers,
        &format!("{ASYNC_SEQ}\nsimplex = {{ receive_listen = \"{receive}\" }}"),
        "",
    ))
    .await;
    wait_simplex_connected(&f, &servers).await;

    let mut clients = Vec::new();
    for c in 0..3u64 {
        let framing = framing.clone();
        clients.push(tokio::spawn(async move {
            let ids: Vec<Vec<u8>> = (0..100).map(|i| id(c * 1000 + i).to_vec()).collect();
            (c, pipeline(vs, &framing, ids, b"dialed", 16).await)
        }));
    }
    let mut from = HashSet::new();
    for task in clients {
        let (c, answers) = task.await.unwrap();
        assert_eq!(answers.len(), 100, "client {c}:\n{}", f.logs());
        assert!(answers.keys().all(|k| k[..9] == id(c * 1000)[..9]));
        from.extend(answers.values().map(|a| a.server.clone()));
    }
    assert_eq!(from.len(), 2);
    assert!(servers.iter().all(|s| s.duplex_frames() == 0));

    // A reload that keeps the message settings keeps the listener and the members' receive
    // connections (no new one is opened).
    f.write_config(&config(
        vs,
        &servers,
        &format!(
            "{ASYNC_SEQ}\nsimplex = {{ receive_listen = \"{receive}\" }}\nidle_timeout = \"120s\""
        ),
        "",
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<Vec<u8>> = (300..340).map(|i| id(i).to_vec()).collect();
    assert_eq!(pipeline(vs, &framing, ids, b"reloaded", 8).await.len(), 40);
    assert!(servers.iter().all(|s| s.receive_connections() == 1));

    // A connection from an address that is no member's is closed and counted.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from(([127, 0, 0, 9], 0))).unwrap();
    let mut stranger = sock.connect(receive).await.unwrap();
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut stranger, &mut buf))
        .await
        .expect("the stranger's connection is closed");
    assert!(matches!(closed, Ok(0) | Err(_)));
    assert_eq!(
        metric(&f, "fulcrum_message_receive_refused_total", "vs=\"svc\"").await,
        1.0
    );

    // s0 stops opening its receive connection: it takes no message, s1 answers all. (Fulcrum
    // keeps reopening s0's send connection to wait for a receive connection, so the pair, not
    // the send connection, is what goes away.)
    servers[0].kill_receive();
    let labels = format!("vs=\"svc\",pool=\"p\",member=\"{}\"", servers[0].addr);
    let down = wait_until(WAIT, || async {
        metric(&f, "fulcrum_message_member_connections", &labels).await == 0.0
    })
    .await;
    assert!(down, "{}", f.logs());
    let before = servers[0].messages();
    let ids: Vec<Vec<u8>> = (500..540).map(|i| id(i).to_vec()).collect();
    let answers = pipeline(vs, &framing, ids, b"half", 8).await;
    assert!(answers.values().all(|a| a.server == "s1"), "{answers:?}");
    assert_eq!(servers[0].messages(), before);
}
