//! What a `snat` pool adds to a member connect: CPU time of the connecting thread per
//! connection, pool against no pool, on loopback. A measurement, not a check: run with
//! `cargo test -p fulcrum-net --test snat_cost -- --ignored --nocapture`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fulcrum_net::snat::{self, Snat};

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

#[test]
#[ignore = "a measurement; run by hand"]
fn snat_connect_cost() {
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    const ROUND: u32 = 2000;
    let (mut plain, mut pooled) = (Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    rt.block_on(async {
        for round in 0..10 {
            let with = round % 2 == 1;
            let cpu = thread_cpu();
            for _ in 0..ROUND {
                let s = snat::connect(with.then_some(&*pool), member, Duration::from_secs(2))
                    .await
                    .unwrap();
                // RST on close: no TIME_WAIT piles up over the run.
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
            }
            let spent = thread_cpu() - cpu;
            if with {
                pooled += spent;
            } else {
                plain += spent;
            }
        }
    });
    let n = f64::from(ROUND * 5);
    let (p, s) = (
        plain.as_secs_f64() * 1e6 / n,
        pooled.as_secs_f64() * 1e6 / n,
    );
    println!(
        "connect CPU per member connection: no snat {p:.2} µs, snat pool {s:.2} µs, +{:.2} µs ({:.2}×); {} connects in {:?}",
        s - p,
        s / p,
        ROUND * 10,
        started.elapsed()
    );
}
