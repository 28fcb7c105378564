use super::*;

/// Bytes the fills of `bodies` hold now (counted from the fills themselves).
fn held(bodies: &[CacheBody]) -> u64 {
    bodies
        .iter()
        .map(|b| match b {
            CacheBody::Tee { fill: Some(f), .. } => f.chunks.iter().map(|c| c.len() as u64).sum(),
            _ => 0,
        })
        .sum()
}

/// Eight responses of 600 KiB stored at once into a 1 MiB cache: the fills never hold more
/// than 1 MiB together (before, each kept up to max_object: 4.8 MB here), every client still
/// gets its whole body, and what could not be stored is counted.
#[test]
fn concurrent_fills_hold_at_most_the_cache_size() {
    const SIZE: u64 = 1 << 20;
    let cache = HttpCache::new(SIZE, SIZE);
    let piece = Bytes::from(vec![b'x'; 100 * 1024]);
    let mut bodies: Vec<CacheBody> = (0..8)
        .map(|i| CacheBody::Tee {
            inner: DownBody::filtered(CacheBody::Stored {
                chunks: vec![piece.clone(); 6],
                next: 0,
            }),
            fill: Some(Box::new(Fill {
                cache: cache.clone(),
                key: Arc::from(format!("http://h/k{i}").as_str()),
                status: 200,
                headers: HeaderMap::new(),
                vary: Vec::new(),
                request_time: 0,
                age_value: 0,
                chunks: Vec::new(),
                len: 0,
                max: cache.max_object(),
                _leader: None,
            })),
        })
        .collect();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut delivered = [0usize; 8];
    let mut most = 0;
    for _ in 0..7 {
        for (i, b) in bodies.iter_mut().enumerate() {
            if let Poll::Ready(Some(Ok(f))) = Pin::new(b).poll_frame(&mut cx) {
                delivered[i] += f.into_data().map_or(0, |d| d.len());
            }
        }
        most = most.max(held(&bodies));
        assert!(most <= SIZE, "fills hold {most} bytes, the cache is {SIZE}");
        assert_eq!(cache.filling(), held(&bodies));
    }
    assert_eq!(
        delivered,
        [600 * 1024; 8],
        "every client got its whole body"
    );
    let (_, stored, _) = cache.usage();
    assert!(stored >= 1, "a fill that had room was stored");
    assert_eq!(
        cache.stats.abandoned.load(Ordering::Relaxed) + stored,
        8,
        "each response stored or given up"
    );
    drop(bodies);
    assert_eq!(cache.filling(), 0);
}

#[test]
fn same_origin_targets() {
    assert_eq!(
        same_origin_target("http", "a.test", b"/x?y").as_deref(),
        Some("/x?y")
    );
    assert_eq!(
        same_origin_target("http", "a.test", b"http://A.test:80/z").as_deref(),
        Some("/z")
    );
    assert_eq!(
        same_origin_target("http", "a.test", b"http://b.test/z"),
        None
    );
    assert_eq!(
        same_origin_target("http", "a.test", b"https://a.test/z"),
        None
    );
    assert_eq!(same_origin_target("http", "a.test", b"//a.test/z"), None);
}

#[test]
fn ranges_slice_the_stored_pieces() {
    let body = [
        Bytes::from_static(b"0123"),
        Bytes::from_static(b"4567"),
        Bytes::from_static(b"89"),
    ];
    let join = |v: Vec<Bytes>| v.iter().flat_map(|b| b.to_vec()).collect::<Vec<u8>>();
    assert_eq!(join(slice(&body, 0, 9)), b"0123456789");
    assert_eq!(join(slice(&body, 3, 4)), b"34");
    assert_eq!(join(slice(&body, 4, 7)), b"4567");
    assert_eq!(join(slice(&body, 9, 9)), b"9");
    assert_eq!(slice(&body, 5, 6).len(), 1, "within one piece: one slice");
}

#[test]
fn keys_split() {
    assert_eq!(split_key("http://a.test/x?y"), ("a.test", "/x?y"));
}
