//! Message sequence pairing (`sequence` on an async message service): answers are matched to
//! their messages by the id at `sequence.offset` in the body. A client sends messages whose ids
//! repeat (a repeated id waits until the first is answered: an id is never outstanding twice on
//! one member connection), and a loopback member inside the process answers as the fuzz input
//! says: an echo of a message it received (its id), an answer with any id, a frame too short to
//! hold an id, raw bytes (a bad frame closes the connection and the messages are re-sent), or a
//! close; then it echoes everything it received, so every input ends quickly.
//!
//! Checked: nothing panics; the client gets at most one answer per message, each answer's id is
//! one the client sent and no id is answered more often than it was sent; the client connection
//! ends (every message answered or failed) and the service's counters account for every
//! message (`in_flight` back to 0): no message is lost in the pending or blocked tables.
#![no_main]

#[path = "common/settle.rs"]
mod settle;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fulcrum_net::StreamHandler;
use fulcrum_proxy::message::{Hub, MessageService, MessageStats, Settings};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout, Instant};

/// The body's first two bytes are the id (see the config below); bodies hold at most 16 bytes.
const ID_LEN: usize = 2;
const MAX_BODY: usize = 16;

struct World {
    rt: tokio::runtime::Runtime,
    cfg: fulcrum_config::Config,
    /// The member's script for the next member connection (the first one of an input).
    script: Arc<Mutex<Option<Vec<u8>>>>,
    /// Where the service takes its clients.
    front: TcpListener,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            // Paused clock: the member's and the proxy's timeouts fire as soon as the runtime is
            // idle (loopback bytes are already delivered by then) instead of after real
            // milliseconds, which is most of an input's time otherwise.
            .start_paused(true)
            .build()
            .expect("runtime");
        let script = Arc::new(Mutex::new(None));
        let (member, front) = rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("a member");
            let member = l.local_addr().expect("its address");
            let s = script.clone();
            tokio::spawn(async move {
                while let Ok((c, _)) = l.accept().await {
                    let script = s.lock().expect("script").take();
                    tokio::spawn(member_connection(c, script));
                }
            });
            let front = TcpListener::bind("127.0.0.1:0").await.expect("a front");
            (member, front)
        });
        let config = format!(
            r#"
[[virtual_service]]
name = "m"
listen = "127.0.0.1:1"
protocol = "message"
pool = "p"
message_mode = "async"
framing = {{ length_bytes = 2, max_message = {MAX_BODY} }}
sequence = {{ offset = 0, length = {ID_LEN} }}
member_connections = 1
max_pending = 4
message_timeout = "200ms"
idle_timeout = "2s"
[[pool]]
name = "p"
monitors = []
connect_timeout = "200ms"
[[pool.member]]
address = "{member}"
"#
        );
        let cfg = fulcrum_config::parse(&config, "fuzz.toml", std::path::Path::new("."))
            .expect("the fuzz config is valid");
        World {
            rt,
            cfg,
            script,
            front,
        }
    })
}

/// A frame: the 2-byte big-endian body length, then the body.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// Cuts whole frames off the front of `buf`.
fn frames(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while buf.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
        if buf.len() < 2 + len {
            break;
        }
        out.push(buf.drain(..2 + len).collect());
    }
    out
}

/// Reads what the proxy sent within `wait` into `buf` and the frames in it into `received`.
/// `false` when the connection is over.
async fn take(
    c: &mut TcpStream,
    buf: &mut Vec<u8>,
    received: &mut Vec<Vec<u8>>,
    wait: Duration,
) -> bool {
    let mut chunk = [0u8; 1024];
    match timeout(wait, c.read(&mut chunk)).await {
        Ok(Ok(0)) | Ok(Err(_)) => return false,
        Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        Err(_) => {}
    }
    received.extend(frames(buf));
    true
}

/// One member connection: the first of an input plays the script, every one then echoes each
/// frame it received (the same id answers it) until the proxy closes.
async fn member_connection(mut c: TcpStream, script: Option<Vec<u8>>) {
    let mut buf = Vec::new();
    let mut received: Vec<Vec<u8>> = Vec::new();
    let mut ops = script.unwrap_or_default().into_iter();
    let mut next = move || ops.next();
    while let Some(op) = next() {
        let out = match op % 6 {
            // Echo the k-th message received (waiting a moment for it).
            0 => {
                let k = usize::from(next().unwrap_or(0) % 8);
                let deadline = Instant::now() + Duration::from_millis(20);
                while received.len() <= k && Instant::now() < deadline {
                    if !take(&mut c, &mut buf, &mut received, Duration::from_millis(5)).await {
                        return;
                    }
                }
                received.get(k).cloned().unwrap_or_default()
            }
            // An answer with any id (of the client's few, mostly).
            1 => frame(&[b'i', next().unwrap_or(0) % 6, next().unwrap_or(0)]),
            // Too short to hold an id: an orphan.
            2 => frame(&[b'i']),
            // Raw bytes: a frame too long for max_message is a bad frame.
            3 => {
                let n = usize::from(next().unwrap_or(0) % 8);
                (0..n).map(|_| next().unwrap_or(0)).collect()
            }
            4 => return,
            _ => {
                if !take(&mut c, &mut buf, &mut received, Duration::from_millis(1)).await {
                    return;
                }
                continue;
            }
        };
        if c.write_all(&out).await.is_err() {
            return;
        }
    }
    let mut echoed = 0;
    loop {
        for f in &received[echoed..] {
            if c.write_all(f).await.is_err() {
                return;
            }
        }
        echoed = received.len();
        if !take(&mut c, &mut buf, &mut received, Duration::from_secs(5)).await {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(head % 8) + 1;
    if rest.len() < n {
        return;
    }
    let (ids, script) = rest.split_at(n);
    // Few distinct ids, so they repeat and wait for one another.
    let ids: Vec<[u8; ID_LEN]> = ids.iter().map(|b| [b'i', b % 5]).collect();
    let w = world();
    *w.script.lock().expect("script") = Some(script.to_vec());

    let vs = &w.cfg.virtual_services[0];
    let section = vs.as_message().expect("a message service");
    let pool = Arc::new(fulcrum_balance::Pool::new(&w.cfg.pools[0], &[], None));
    let messages = Arc::new(MessageStats::default());
    let hub = Hub::new(
        Arc::from("m"),
        Settings {
            framing: section.framing.clone(),
            mode: section.mode,
            sequence: section.sequence.clone(),
            options: section.options.clone(),
            proxy_protocol: None,
            snat: None,
            member_tls: None,
            framing_hook: None,
            simplex: None,
            member_requests: None,
        },
        Default::default(),
        messages.clone(),
        pool.clone(),
        None,
    );
    let service = Arc::new(MessageService {
        hub: hub.clone(),
        rules: fulcrum_proxy::rules::L4Rules::none(pool),
        hubs: vec![hub.clone()],
        idle_timeout: vs.idle_timeout,
        max_connections: 0,
        tracker: Default::default(),
        tls: None,
    });

    w.rt.block_on(async {
        let before = settle::alive();
        // Opens the member connection: spawns, so inside the runtime.
        hub.start();
        let front: SocketAddr = w.front.local_addr().expect("front address");
        let mut client = TcpStream::connect(front)
            .await
            .expect("connect to the front");
        let (accepted, peer) = w.front.accept().await.expect("accept the client");
        service.clone().handle(accepted, peer, front);

        let mut out = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let mut body = id.to_vec();
            body.push(i as u8);
            out.extend_from_slice(&frame(&body));
        }
        client.write_all(&out).await.expect("send the messages");
        // Sent all: the service answers what it can and closes once none is outstanding.
        client.shutdown().await.expect("half-close");
        let mut buf = Vec::new();
        let read_all = timeout(Duration::from_secs(10), client.read_to_end(&mut buf)).await;
        assert!(
            read_all.is_ok(),
            "the client connection did not end: a message neither answered nor failed"
        );

        let answers = frames(&mut buf);
        assert!(buf.is_empty(), "a partial answer was written");
        assert!(answers.len() <= ids.len(), "more answers than messages");
        let mut sent: HashMap<&[u8], usize> = HashMap::new();
        for id in &ids {
            *sent.entry(&id[..]).or_default() += 1;
        }
        let mut got: HashMap<Vec<u8>, usize> = HashMap::new();
        for a in &answers {
            let id = a
                .get(2..2 + ID_LEN)
                .expect("an answer holds an id")
                .to_vec();
            let count = got.entry(id.clone()).or_default();
            *count += 1;
            assert!(
                *count <= sent.get(&id[..]).copied().unwrap_or(0),
                "id {id:?} answered {count} times, sent {:?}",
                sent.get(&id[..])
            );
        }
        assert_eq!(
            messages.in_flight(),
            0,
            "messages neither answered nor failed after the client connection ended"
        );
        // The service leaves: its member connections close once the client is gone.
        hub.unregister();
        drop(service);
        // The member links and connections end here, not in the next input (see `settle`).
        settle::settle(before).await;
    });
});
