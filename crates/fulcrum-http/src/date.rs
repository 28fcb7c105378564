//! Dates for the `Date` field (IMF-fixdate) and the access log, formatted once per second per
//! thread rather than per response.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy)]
pub struct Utc {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub millis: u32,
    weekday: usize,
}

impl Utc {
    pub fn now() -> Utc {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Utc::from_unix(d.as_secs() as i64, d.subsec_millis())
    }

    pub fn from_unix(secs: i64, millis: u32) -> Utc {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil(days);
        Utc {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
            millis,
            weekday: days.rem_euclid(7) as usize,
        }
    }

    /// `Sun, 06 Nov 1994 08:49:37 GMT`
    pub fn http_date(&self) -> String {
        let (day, mon, year, h, m, s) = self.parts();
        let wd = DAYS[self.weekday];
        format!("{wd}, {day:02} {mon} {year} {h:02}:{m:02}:{s:02} GMT")
    }

    /// `10/Oct/2000:13:55:36 +0000` (Common Log Format)
    pub fn clf(&self) -> String {
        let (day, mon, year, h, m, s) = self.parts();
        format!("{day:02}/{mon}/{year}:{h:02}:{m:02}:{s:02} +0000")
    }

    fn parts(&self) -> (u32, &'static str, i64, u32, u32, u32) {
        let mon = MONTHS[(self.month - 1) as usize];
        (
            self.day,
            mon,
            self.year,
            self.hour,
            self.minute,
            self.second,
        )
    }

    /// `2000-10-10T13:55:36.123Z`
    pub fn rfc3339(&self) -> String {
        format!(
            "{}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second, self.millis
        )
    }
}

thread_local! {
    static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

thread_local! {
    static CACHED_VALUE: RefCell<(u64, http::HeaderValue)> =
        const { RefCell::new((u64::MAX, http::HeaderValue::from_static(""))) };
}

/// The `date` field's value now, made once a second per thread: HTTP/2 responses take it as
/// a `HeaderValue`, which a clone shares.
pub fn http_date_value() -> http::HeaderValue {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    CACHED_VALUE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            let text = Utc::from_unix(secs as i64, 0).http_date();
            if let Ok(v) = http::HeaderValue::from_str(&text) {
                *c = (secs, v);
            }
        }
        c.1.clone()
    })
}

/// Appends the current IMF-fixdate to `out`.
pub fn append_http_date(out: &mut Vec<u8>) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            *c = (secs, Utc::from_unix(secs as i64, 0).http_date());
        }
        out.extend_from_slice(c.1.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let t = Utc::from_unix(784_111_777, 5);
        assert_eq!(t.http_date(), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(t.clf(), "06/Nov/1994:08:49:37 +0000");
        assert_eq!(t.rfc3339(), "1994-11-06T08:49:37.005Z");
        assert_eq!(
            Utc::from_unix(951_782_400, 0).http_date(),
            "Tue, 29 Feb 2000 00:00:00 GMT"
        );
    }
}
