//! What a `snat` pool and client-address transparency (`source = "client"`) add to a member
//! connect: CPU time of the connecting thread per connection, against the host's own source,
//! on loopback. A measurement, not a check: run with
//! `cargo test -p fulcrum-net --test snat_cost -- --ignored --nocapture`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fulcrum_net::snat::{self, Snat, Source};
use fulcrum_net::Transparent;

fn thread_cpu() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a complete rusage into the pointer it is given.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// How a measured connect chooses its source.
#[derive(Clone, Copy)]
enum Mode {
    Host,
    Snat,
    Client,
}

#[test]
#[ignore = "a measurement; run by hand"]
fn member_connect_cost() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let member: SocketAddr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    let pool = Snat::for_service(
        "bench",
        &["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()],
    )
    .unwrap()
    .unwrap();
    let transparent = Transparent::for_service("bench");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    const ROUND: u32 = 2000;
    const ROUNDS: u32 = 5;
    let modes = [Mode::Host, Mode::Snat, Mode::Client];
    let mut spent = [Duration::ZERO; 3];
    let started = Instant::now();
    // Client ports walk a range of their own, so each transparent connect takes the client's
    // address and port as they come (no fallback to another port).
    let mut client_port: u16 = 20_000;
    rt.block_on(async {
        for _ in 0..ROUNDS {
            for (i, mode) in modes.iter().enumerate() {
                let cpu = thread_cpu();
                for _ in 0..ROUND {
                    client_port = if client_port >= 60_000 {
                        20_000
                    } else {
                        client_port + 1
                    };
                    let client = SocketAddr::from(([127, 0, 0, 4], client_port));
                    let source = match mode {
                        Mode::Host => Source::Host,
                        Mode::Snat => Source::Snat(&pool),
                        Mode::Client => Source::Client(&transparent, client),
                    };
                    let s = snat::connect_from(source, None, member, Duration::from_secs(2))
                        .await
                        .unwrap();
                    // RST on close: no TIME_WAIT piles up over the run.
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                }
                spent[i] += thread_cpu() - cpu;
            }
        }
    });
    let n = f64::from(ROUND * ROUNDS);
    let us = spent.map(|d| d.as_secs_f64() * 1e6 / n);
    println!(
        "connect CPU per member connection: host {:.2} µs, snat pool {:.2} µs ({:+.2}, {:.2}×), source = client {:.2} µs ({:+.2}, {:.2}×); {} connects in {:?}",
        us[0],
        us[1],
        us[1] - us[0],
        us[1] / us[0],
        us[2],
        us[2] - us[0],
        us[2] / us[0],
        ROUND * ROUNDS * 3,
        started.elapsed()
    );
}
