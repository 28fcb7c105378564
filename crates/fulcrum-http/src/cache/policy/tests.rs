use super::*;

fn cc(v: &str) -> Directives {
    Directives::parse(std::iter::once(v.as_bytes()))
}

#[test]
fn qualified_no_cache_and_private_name_fields_to_leave_out() {
    let d = cc("no-cache=\"A, b\", max-age=60, private=\"Set-Cookie\"");
    assert!(!d.no_cache && !d.private);
    assert_eq!(d.no_cache_fields, ["a", "b"]);
    assert_eq!(d.private_fields, ["set-cookie"]);
    assert_eq!(d.max_age, Some(60));
    let bare = cc("no-cache=x");
    assert_eq!(bare.no_cache_fields, ["x"]);
    // An argument naming nothing valid is the unqualified directive.
    assert!(cc("no-cache=\"\"").no_cache);
    assert!(cc("private=\"a b\"").private);
    assert!(cc("no-cache").no_cache && cc("no-cache").no_cache_fields.is_empty());
}

#[test]
fn byte_ranges_against_a_length() {
    use ByteRange::*;
    let r = |v: &str, len| byte_range(v.as_bytes(), len);
    assert_eq!(r("bytes=0-1", 11), Part { first: 0, last: 1 });
    assert_eq!(r("bytes=1-", 11), Part { first: 1, last: 10 });
    assert_eq!(
        r("bytes=-1", 11),
        Part {
            first: 10,
            last: 10
        }
    );
    assert_eq!(r("bytes=-50", 11), Part { first: 0, last: 10 });
    assert_eq!(r("BYTES = 5-500", 11), Part { first: 5, last: 10 });
    assert_eq!(r("bytes=11-", 11), Unsatisfiable);
    assert_eq!(r("bytes=-0", 11), Unsatisfiable);
    assert_eq!(r("bytes=20-30, 40-", 11), Unsatisfiable);
    assert_eq!(r("bytes=0-", 0), Unsatisfiable);
    assert_eq!(r("bytes=0-1,3-4", 11), Parts(vec![(0, 1), (3, 4)]));
    assert_eq!(
        r("bytes=0-1, 20-30, -2", 11),
        Parts(vec![(0, 1), (9, 10)]),
        "the unsatisfiable range is left out"
    );
    assert_eq!(r("bytes=0-1, 40-50", 11), Part { first: 0, last: 1 });
    assert_eq!(r("bytes=3-4,0-1", 11), Whole, "not ascending: the whole");
    assert_eq!(r("bytes=0-5,5-6", 11), Whole, "overlapping: the whole");
    let many = (0..=MAX_RANGES)
        .map(|i| format!("{i}-{i}"))
        .collect::<Vec<_>>();
    assert_eq!(
        r(&format!("bytes={}", many.join(",")), 100),
        Whole,
        "too many"
    );
    assert_eq!(r("bytes=5-2", 11), Whole, "invalid: ignored");
    assert_eq!(r("items=0-1", 11), Whole);
    assert_eq!(r("bytes=a-b", 11), Whole);
    assert_eq!(r("bytes=99999999999999999999-", 11), Whole);
    assert_eq!(r("bytes", 11), Whole);
}

#[test]
fn if_range_is_strong_or_an_exact_date() {
    let lm = http_date(b"Sun, 06 Nov 1994 08:49:37 GMT");
    assert!(if_range_holds(b"\"a\"", Some(b"\"a\""), None));
    assert!(!if_range_holds(b"\"a\"", Some(b"\"b\""), None));
    assert!(!if_range_holds(b"W/\"a\"", Some(b"W/\"a\""), None));
    assert!(!if_range_holds(b"\"a\"", Some(b"W/\"a\""), None));
    assert!(if_range_holds(b"Sun, 06 Nov 1994 08:49:37 GMT", None, lm));
    assert!(!if_range_holds(b"Sun, 06 Nov 1994 08:49:38 GMT", None, lm));
    assert!(!if_range_holds(b"garbage", Some(b"\"a\""), lm));
}

fn facts(status: u16, d: &Directives) -> ResponseFacts<'_> {
    ResponseFacts {
        status,
        cc: d,
        has_expires: false,
        vary_star: false,
    }
}

// §5.2: directive syntax.
#[test]
fn parses_directives_with_arguments_quotes_and_case() {
    let d = cc("Max-Age=60, s-maxage=\"30\", no-cache=\"a, b\", PUBLIC, max-stale");
    assert_eq!(d.max_age, Some(60));
    assert_eq!(d.s_maxage, Some(30));
    assert!(!d.no_cache && d.public, "the qualified form names fields");
    assert_eq!(d.no_cache_fields, ["a", "b"]);
    assert_eq!(d.max_stale, Some(None));
    let d = cc("max-stale=10, min-fresh=5, only-if-cached, no-store");
    assert_eq!(d.max_stale, Some(Some(10)));
    assert_eq!(d.min_fresh, Some(5));
    assert!(d.only_if_cached && d.no_store);
}

// §1.2.2 / §4.2.1: invalid and repeated delta-seconds.
#[test]
fn invalid_max_age_is_stale_first_occurrence_wins_big_values_capped() {
    assert_eq!(cc("max-age=abc").max_age, Some(0));
    assert_eq!(cc("max-age= 60").max_age, Some(0));
    assert_eq!(cc("max-age =60").max_age, None);
    assert_eq!(cc("max-age='60'").max_age, Some(0));
    assert_eq!(cc("max-age=60.5").max_age, Some(60));
    assert_eq!(cc("max-age=0060").max_age, Some(60));
    assert_eq!(cc("max-age=-1").max_age, Some(0));
    assert_eq!(cc("max-age=10, max-age=20").max_age, Some(10));
    assert_eq!(cc("max-age=99999999999999999999").max_age, Some(DELTA_MAX));
    assert!(!cc("").present);
}

// §3: storability.
#[test]
fn storable_by_status_and_directives() {
    let none = Directives::default();
    assert!(storable(true, &none, false, &facts(200, &none)).is_ok());
    assert!(storable(true, &none, false, &facts(404, &none)).is_ok());
    assert_eq!(
        storable(true, &none, false, &facts(302, &none)),
        Err(NotStored::NoFreshness)
    );
    let maxage = cc("max-age=10");
    assert!(storable(true, &none, false, &facts(302, &maxage)).is_ok());
    assert_eq!(
        storable(true, &none, false, &facts(206, &maxage)),
        Err(NotStored::Status)
    );
    assert_eq!(
        storable(false, &none, false, &facts(200, &maxage)),
        Err(NotStored::Method)
    );
    let f = ResponseFacts {
        has_expires: true,
        ..facts(500, &none)
    };
    assert!(storable(true, &none, false, &f).is_ok());
}

// §5.2.2.5, §5.2.1.5, §5.2.2.7: no-store and private.
#[test]
fn no_store_and_private_are_not_stored() {
    let none = Directives::default();
    assert_eq!(
        storable(true, &none, false, &facts(200, &cc("no-store, max-age=10"))),
        Err(NotStored::NoStore)
    );
    assert_eq!(
        storable(true, &cc("no-store"), false, &facts(200, &cc("max-age=10"))),
        Err(NotStored::NoStore)
    );
    assert_eq!(
        storable(true, &none, false, &facts(200, &cc("private, max-age=10"))),
        Err(NotStored::Private)
    );
    // The qualified form: stored, without the named fields.
    assert_eq!(
        storable(true, &none, false, &facts(200, &cc("private=\"x\""))),
        Ok(())
    );
}

// §5.2.2.3: must-understand overrides no-store for understood statuses.
#[test]
fn must_understand() {
    let none = Directives::default();
    let d = cc("must-understand, no-store, max-age=10");
    assert!(storable(true, &none, false, &facts(200, &d)).is_ok());
    assert_eq!(
        storable(true, &none, false, &facts(299, &d)),
        Err(NotStored::NoStore)
    );
}

// §3.5: Authorization.
#[test]
fn authorization_needs_public_s_maxage_or_must_revalidate() {
    let none = Directives::default();
    assert_eq!(
        storable(true, &none, true, &facts(200, &cc("max-age=10"))),
        Err(NotStored::Authorization)
    );
    for ok in ["public", "s-maxage=10", "must-revalidate, max-age=10"] {
        assert!(
            storable(true, &none, true, &facts(200, &cc(ok))).is_ok(),
            "{ok}"
        );
    }
}

// §4.1: Vary: * never matches.
#[test]
fn vary_star_is_not_stored() {
    let none = Directives::default();
    let f = ResponseFacts {
        vary_star: true,
        ..facts(200, &none)
    };
    assert_eq!(storable(true, &none, false, &f), Err(NotStored::VaryStar));
    assert_eq!(vary_names([&b"Accept, *"[..]].into_iter()), None);
    assert_eq!(
        vary_names([&b"Accept-Encoding, X-Foo"[..], b"accept-encoding"].into_iter()),
        Some(vec!["accept-encoding".to_string(), "x-foo".to_string()])
    );
}

// §4.2.1: the precedence of freshness sources.
#[test]
fn freshness_precedence() {
    let t = Times {
        date: Some(1000),
        expires: Some(Some(1100)),
        last_modified: Some(0),
    };
    assert_eq!(
        freshness_lifetime(200, &cc("s-maxage=5, max-age=50"), &t, 1000),
        5
    );
    assert_eq!(freshness_lifetime(200, &cc("max-age=50"), &t, 1000), 50);
    assert_eq!(
        freshness_lifetime(200, &Directives::default(), &t, 1000),
        100
    );
    // Expires in the past or invalid: already stale.
    let past = Times {
        expires: Some(Some(900)),
        ..t
    };
    assert_eq!(
        freshness_lifetime(200, &Directives::default(), &past, 1000),
        0
    );
    let invalid = Times {
        expires: Some(None),
        ..t
    };
    assert_eq!(
        freshness_lifetime(200, &Directives::default(), &invalid, 1000),
        0
    );
    // Without Date, the response time stands in.
    let nodate = Times { date: None, ..t };
    assert_eq!(
        freshness_lifetime(200, &Directives::default(), &nodate, 1050),
        50
    );
}

// §4.2.2: heuristic freshness only where allowed.
#[test]
fn heuristic_freshness() {
    let t = Times {
        date: Some(10_000),
        expires: None,
        last_modified: Some(0),
    };
    let none = Directives::default();
    assert_eq!(freshness_lifetime(200, &none, &t, 10_000), 1000);
    assert_eq!(freshness_lifetime(302, &none, &t, 10_000), 0);
    assert_eq!(freshness_lifetime(302, &cc("public"), &t, 10_000), 1000);
    let old = Times {
        date: Some(100_000_000),
        ..t
    };
    assert_eq!(freshness_lifetime(200, &none, &old, 0), HEURISTIC_MAX);
    let no_lm = Times {
        last_modified: None,
        ..t
    };
    assert_eq!(freshness_lifetime(200, &none, &no_lm, 10_000), 0);
}

// §4.2.3: age calculation.
#[test]
fn age_calculation() {
    // Age from the member plus the request's round trip.
    let a = AgeInputs {
        age_value: 30,
        date: Some(1000),
        request_time: 998,
        response_time: 1000,
    };
    assert_eq!(corrected_initial_age(&a), 32);
    // A Date in the past makes the apparent age.
    let a = AgeInputs {
        age_value: 0,
        date: Some(900),
        request_time: 1000,
        response_time: 1000,
    };
    assert_eq!(corrected_initial_age(&a), 100);
    // Clock skew (Date in the future) does not make a negative age.
    let a = AgeInputs {
        age_value: 0,
        date: Some(2000),
        request_time: 1000,
        response_time: 1000,
    };
    assert_eq!(corrected_initial_age(&a), 0);
    assert_eq!(current_age(32, 1000, 1010), 42);
}

fn stored(d: &Directives, lifetime: u64, age: u64) -> Stored<'_> {
    Stored {
        cc: d,
        lifetime,
        age,
    }
}

// §4.2 / §5.2.1: request directives.
#[test]
fn request_directives() {
    let none = Directives::default();
    let s = stored(&none, 100, 10);
    assert_eq!(usable(&none, false, &s), Usable::Fresh);
    assert_eq!(usable(&none, true, &s), Usable::Validate);
    assert_eq!(usable(&cc("no-cache"), true, &s), Usable::Validate);
    assert_eq!(usable(&cc("max-age=5"), false, &s), Usable::Validate);
    assert_eq!(usable(&cc("max-age=10"), false, &s), Usable::Fresh);
    assert_eq!(
        usable(&cc("max-age=0"), false, &stored(&none, 100, 0)),
        Usable::Validate
    );
    assert_eq!(usable(&cc("min-fresh=95"), false, &s), Usable::Validate);
    assert_eq!(usable(&cc("min-fresh=90"), false, &s), Usable::Fresh);
    let stale = stored(&none, 10, 15);
    assert_eq!(usable(&none, false, &stale), Usable::Validate);
    assert_eq!(
        usable(&cc("max-stale"), false, &stale),
        Usable::StaleAllowed
    );
    assert_eq!(
        usable(&cc("max-stale=5"), false, &stale),
        Usable::StaleAllowed
    );
    assert_eq!(usable(&cc("max-stale=4"), false, &stale), Usable::Validate);
}

// §5.2.2: response directives that restrict reuse.
#[test]
fn response_directives() {
    let none = Directives::default();
    let nc = cc("no-cache, max-age=100");
    assert_eq!(usable(&none, false, &stored(&nc, 100, 1)), Usable::Validate);
    // The qualified form: reused while fresh, without the named fields (`Entry::new`).
    let ncf = cc("no-cache=\"set-cookie\", max-age=100");
    assert_eq!(usable(&none, false, &stored(&ncf, 100, 1)), Usable::Fresh);
    for d in ["must-revalidate", "proxy-revalidate", "s-maxage=1"] {
        let d = cc(d);
        assert_eq!(
            usable(&cc("max-stale"), false, &stored(&d, 1, 5)),
            Usable::Validate
        );
        assert!(!stale_on_error(
            &cc("stale-if-error=100"),
            &stored(&d, 1, 5)
        ));
    }
    assert!(stale_on_error(
        &none,
        &stored(&cc("stale-if-error=10"), 1, 5)
    ));
    assert!(!stale_on_error(
        &none,
        &stored(&cc("stale-if-error=1"), 1, 5)
    ));
    assert!(!stale_on_error(&none, &stored(&none, 1, 5)));
    assert!(stale_when_disconnected(&stored(&none, 1, 5)));
    assert!(!stale_when_disconnected(&stored(
        &cc("must-revalidate"),
        1,
        5
    )));
    assert!(!stale_when_disconnected(&stored(&cc("no-cache"), 1, 5)));
}

// RFC 5861 §3: stale-while-revalidate.
#[test]
fn stale_while_revalidate_window() {
    let none = Directives::default();
    let swr = cc("max-age=1, stale-while-revalidate=10");
    assert!(stale_while_revalidate(&none, false, &stored(&swr, 1, 5)));
    assert!(!stale_while_revalidate(&none, false, &stored(&swr, 1, 12)));
    assert!(!stale_while_revalidate(&none, true, &stored(&swr, 1, 5)));
    assert!(!stale_while_revalidate(
        &cc("max-age=2"),
        false,
        &stored(&swr, 1, 5)
    ));
    let mr = cc("max-age=1, stale-while-revalidate=10, must-revalidate");
    assert!(!stale_while_revalidate(&none, false, &stored(&mr, 1, 5)));
}

// §3.2 / §4.3.4: 304 header update.
#[test]
fn header_update_replaces_fields_but_not_content_length() {
    let mut stored = HeaderMap::new();
    stored.insert("etag", "\"a\"".parse().unwrap());
    stored.insert("x-old", "1".parse().unwrap());
    stored.insert("content-length", "10".parse().unwrap());
    stored.append("x-multi", "a".parse().unwrap());
    stored.append("x-multi", "b".parse().unwrap());
    let mut upd = HeaderMap::new();
    upd.insert("x-old", "2".parse().unwrap());
    upd.insert("x-new", "3".parse().unwrap());
    upd.insert("content-length", "0".parse().unwrap());
    upd.append("x-multi", "c".parse().unwrap());
    update_headers(&mut stored, &upd);
    assert_eq!(stored["x-old"], "2");
    assert_eq!(stored["x-new"], "3");
    assert_eq!(stored["content-length"], "10");
    assert_eq!(stored["etag"], "\"a\"");
    assert_eq!(stored.get_all("x-multi").iter().count(), 1);
}

// RFC 9110 §13.1.2, §13.2.2, §8.8.3.2: conditional requests.
#[test]
fn conditionals() {
    assert!(weak_match(b"W/\"a\"", b"\"a\""));
    assert!(!weak_match(b"\"a\"", b"\"b\""));
    assert_eq!(
        etag_list(b"\"a,b\", W/\"c\""),
        vec![&b"\"a,b\""[..], b"W/\"c\""]
    );
    let etag = Some(&b"\"x\""[..]);
    assert!(not_modified(&[b"\"y\", W/\"x\""], None, etag, None, None));
    assert!(not_modified(&[b"*"], None, etag, None, None));
    assert!(!not_modified(&[b"\"y\""], Some(100), etag, Some(50), None));
    assert!(not_modified(&[], Some(100), None, Some(100), None));
    assert!(!not_modified(&[], Some(100), None, Some(101), None));
    assert!(not_modified(&[], Some(100), None, None, Some(90)));
    assert!(!not_modified(&[], None, etag, Some(1), None));
}

// §4.1: Vary normalisation.
#[test]
fn vary_values_normalised() {
    let a = vary_value("accept-encoding", [&b"gzip,  BR"[..]].into_iter());
    let b = vary_value("accept-encoding", [&b"gzip"[..], b"br"].into_iter());
    assert_eq!(a, b);
    assert_eq!(vary_value("x-foo", std::iter::empty()), None);
    assert_ne!(
        vary_value("x-foo", [&b"A"[..]].into_iter()),
        vary_value("x-foo", [&b"a"[..]].into_iter())
    );
}

// RFC 9213: CDN-Cache-Control.
#[test]
fn targeted_directives() {
    let t = |v: &str| targeted(std::iter::once(v.as_bytes()));
    assert_eq!(t("max-age=60").unwrap().max_age, Some(60));
    assert!(t("no-store").unwrap().no_store);
    assert_eq!(t("foobar, MaX-aGe=60").unwrap().max_age, Some(60));
    assert!(t("max-age=60, &&&&&").is_none());
    assert!(t("max-age=\"60\"").is_none());
    assert!(targeted(std::iter::empty()).is_none());
}

#[test]
fn dates() {
    assert_eq!(http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
    assert_eq!(
        http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"),
        Some(784111777)
    );
    assert_eq!(http_date(b"Sun Nov  6 08:49:37 1994"), Some(784111777));
    assert_eq!(http_date(b"0"), None);
    assert_eq!(http_date(b"SUN, 06 NOV 1994 08:49:37 gmt"), Some(784111777));
    assert_eq!(http_date(b"Mon Aug  8 02:01:18 2050"), Some(2543536878));
    assert_eq!(http_date(b"Thu Aug  8 02:01:18 2050"), Some(2543536878));
}

// §5.1: Age.
#[test]
fn age_values() {
    let age = |v: &[&str]| age_value(v.iter().map(|s| s.as_bytes()));
    assert_eq!(age(&["7200"]), 7200);
    assert_eq!(age(&["7200, 0"]), 7200);
    assert_eq!(age(&["0", "7200"]), 0);
    assert_eq!(age(&["7200;foo=bar"]), 7200);
    assert_eq!(age(&["7200.0"]), 0);
    assert_eq!(age(&["-7200"]), 0);
    assert_eq!(age(&["abc"]), 0);
    assert_eq!(age(&["99999999999"]), DELTA_MAX);
    assert_eq!(age(&[]), 0);
}
