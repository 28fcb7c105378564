//! The forwarding engine over real loopback sockets.

use std::time::Duration;

use fulcrum_net::forward::{forward, End, ForwardOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A connected (client side, proxy's client side) pair and a (proxy's member side, member) pair.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

fn opts(splice: bool) -> ForwardOptions {
    ForwardOptions {
        idle_timeout: Duration::from_secs(10),
        splice,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn request_response_with_half_close() {
    let (mut client, mut proxy_client) = pair().await;
    let (mut proxy_member, mut member) = pair().await;
    let fwd = tokio::spawn(async move {
        forward(&mut proxy_client, &mut proxy_member, opts(true), |_, _| {}).await
    });

    client.write_all(b"hello").await.unwrap();
    client.shutdown().await.unwrap();
    // The member sees the request, then the end of it, and only then answers.
    let mut req = Vec::new();
    member.read_to_end(&mut req).await.unwrap();
    assert_eq!(req, b"hello");
    member.write_all(b"world").await.unwrap();
    member.shutdown().await.unwrap();
    let mut resp = Vec::new();
    client.read_to_end(&mut resp).await.unwrap();
    assert_eq!(resp, b"world");

    let out = tokio::time::timeout(Duration::from_secs(5), fwd)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(out.end, End::Closed), "{:?}", out.end);
    assert_eq!((out.upstream, out.downstream), (5, 5));
}

async fn bulk(splice: bool) -> u64 {
    let (mut client, mut proxy_client) = pair().await;
    let (mut proxy_member, mut member) = pair().await;
    let reported = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r = reported.clone();
    let fwd = tokio::spawn(async move {
        forward(
            &mut proxy_client,
            &mut proxy_member,
            opts(splice),
            move |u, d| {
                r.fetch_add(u + d, std::sync::atomic::Ordering::Relaxed);
            },
        )
        .await
    });
    let up = pattern(8 << 20, 1);
    let down = pattern(6 << 20, 7);
    let (up2, down2) = (up.clone(), down.clone());
    let c = tokio::spawn(async move {
        let (mut rd, mut wr) = client.split();
        let w = async {
            wr.write_all(&up2).await.unwrap();
            wr.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let r = rd.read_to_end(&mut got);
        let (_, n) = tokio::join!(w, r);
        n.unwrap();
        got
    });
    let m = tokio::spawn(async move {
        let (mut rd, mut wr) = member.split();
        let w = async {
            wr.write_all(&down2).await.unwrap();
            wr.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let r = rd.read_to_end(&mut got);
        let (_, n) = tokio::join!(w, r);
        n.unwrap();
        got
    });
    let got_by_client = c.await.unwrap();
    let got_by_member = m.await.unwrap();
    assert!(got_by_member == up, "upstream bytes corrupted");
    assert!(got_by_client == down, "downstream bytes corrupted");
    let out = fwd.await.unwrap();
    assert!(matches!(out.end, End::Closed), "{:?}", out.end);
    assert_eq!(out.upstream, up.len() as u64);
    assert_eq!(out.downstream, down.len() as u64);
    assert_eq!(
        reported.load(std::sync::atomic::Ordering::Relaxed),
        out.upstream + out.downstream
    );
    out.spliced
}

#[tokio::test]
async fn bulk_transfer_switches_to_splice_and_keeps_every_byte() {
    let spliced = bulk(true).await;
    assert!(
        spliced > 1 << 20,
        "only {spliced} bytes went through splice"
    );
}

#[tokio::test]
async fn bulk_transfer_without_splice() {
    assert_eq!(bulk(false).await, 0);
}

#[tokio::test]
async fn idle_timeout_ends_a_silent_connection() {
    let (_client, mut proxy_client) = pair().await;
    let (mut proxy_member, _member) = pair().await;
    let o = ForwardOptions {
        idle_timeout: Duration::from_millis(200),
        splice: true,
    };
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(5),
        forward(&mut proxy_client, &mut proxy_member, o, |_, _| {}),
    )
    .await
    .unwrap();
    assert!(matches!(out.end, End::IdleTimeout), "{:?}", out.end);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn activity_postpones_the_idle_timeout() {
    let (mut client, mut proxy_client) = pair().await;
    let (mut proxy_member, mut member) = pair().await;
    let o = ForwardOptions {
        idle_timeout: Duration::from_millis(300),
        splice: false,
    };
    let fwd =
        tokio::spawn(
            async move { forward(&mut proxy_client, &mut proxy_member, o, |_, _| {}).await },
        );
    // A byte every 100 ms for a second: never idle for 300 ms.
    for _ in 0..10 {
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        member.read_exact(&mut b).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!fwd.is_finished(), "timed out while active");
    let out = tokio::time::timeout(Duration::from_secs(5), fwd)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(out.end, End::IdleTimeout));
    assert_eq!(out.upstream, 10);
}

#[tokio::test]
async fn member_reset_is_blamed_on_the_member() {
    let (mut client, mut proxy_client) = pair().await;
    let (mut proxy_member, member) = pair().await;
    let fwd = tokio::spawn(async move {
        forward(&mut proxy_client, &mut proxy_member, opts(true), |_, _| {}).await
    });
    client.write_all(b"ping").await.unwrap();
    // Close with unread data in the receive buffer: the kernel answers with a reset.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sock = socket2::SockRef::from(&member);
    sock.set_linger(Some(Duration::ZERO)).unwrap();
    drop(member);
    let out = tokio::time::timeout(Duration::from_secs(5), fwd)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(out.end, End::Member(_)), "{:?}", out.end);
}
