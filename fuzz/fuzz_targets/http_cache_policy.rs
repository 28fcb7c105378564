//! The HTTP cache's parsers of member and client fields: Cache-Control (and CDN-Cache-Control,
//! with the field lists of `no-cache="…"` and `private="…"`), HTTP dates, Age, Vary names and
//! values, entity-tag lists and the conditional evaluation, Range and If-Range, with arbitrary
//! bytes. Checks the freshness and age arithmetic never panics or overflows.
#![no_main]

use fulcrum_http::cache::policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parts: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let cc = policy::Directives::parse(parts.iter().copied());
    let _ = policy::targeted(parts.iter().copied());
    let date = parts.first().and_then(|p| policy::http_date(p));
    let lm = parts.get(1).and_then(|p| policy::http_date(p));
    let age = policy::age_value(parts.iter().copied());
    let times = policy::Times {
        date,
        expires: parts.get(2).map(|p| policy::http_date(p)),
        last_modified: lm,
    };
    let status = u16::from(data.first().copied().unwrap_or(0)) + 100;
    let response_time = date.unwrap_or(0).wrapping_add(i64::from(data.len() as u32));
    let lifetime = policy::freshness_lifetime(status, &cc, &times, response_time);
    let initial = policy::corrected_initial_age(&policy::AgeInputs {
        age_value: age,
        date,
        request_time: response_time - 1,
        response_time,
    });
    let now = response_time.saturating_add(5);
    let stored = policy::Stored {
        cc: &cc,
        lifetime,
        age: policy::current_age(initial, response_time, now),
    };
    let _ = policy::usable(&cc, cc.no_cache, &stored);
    let _ = policy::stale_on_error(&cc, &stored);
    let _ = policy::stale_while_revalidate(&cc, false, &stored);
    let _ = policy::vary_names(parts.iter().copied());
    let _ = policy::vary_value("accept-language", parts.iter().copied());
    let inm: Vec<&[u8]> = parts.iter().take(2).copied().collect();
    let _ = policy::not_modified(&inm, lm, parts.last().copied(), lm, date);
    let len = u64::from(data.len() as u32);
    for p in &parts {
        match policy::byte_range(p, len) {
            policy::ByteRange::Part { first, last } => assert!(first <= last && last < len),
            policy::ByteRange::Parts(parts) => {
                assert!((2..=policy::MAX_RANGES).contains(&parts.len()));
                assert!(parts.iter().all(|&(first, last)| first <= last && last < len));
                assert!(parts.windows(2).all(|w| w[1].0 > w[0].1), "ascending, apart");
            }
            policy::ByteRange::Whole | policy::ByteRange::Unsatisfiable => {}
        }
        let _ = policy::if_range_holds(p, parts.first().copied(), lm);
    }
    for name in cc.no_cache_fields.iter().chain(&cc.private_fields) {
        assert!(!name.is_empty() && name.bytes().all(|b| !b.is_ascii_uppercase()));
    }
    let _ = policy::storable(
        true,
        &cc,
        data.len() % 2 == 0,
        &policy::ResponseFacts {
            status,
            cc: &cc,
            has_expires: times.expires.is_some(),
            vary_star: false,
        },
    );
});
