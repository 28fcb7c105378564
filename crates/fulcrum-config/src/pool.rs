//! Checks of one `[[pool]]` once its keys are read. Which services use a pool, and whether its
//! keys suit their protocols, is checked by `validate`.

use std::collections::HashMap;

use crate::reader::Cx;
use crate::schema::Pool;

/// Checks of the pool at `base` (such as `pool[0]`).
pub(crate) fn check(base: &str, pool: &Pool, cx: &mut Cx<'_>) {
    let at = |k: &str| format!("{base}.{k}");
    let mut seen = HashMap::new();
    for (j, m) in pool.members.iter().enumerate() {
        if let Some(first) = seen.insert(m.address, j) {
            cx.error_path(
                &format!("{base}.member[{j}].address"),
                format!(
                    "duplicate member {}: already {base}.member[{first}]",
                    m.address
                ),
            );
        }
    }
    if pool.name.starts_with("gslb:") || pool.name.starts_with("gslb-site:") {
        cx.error_path(
            &at("name"),
            format!("{:?}: pool names starting with \"gslb:\" or \"gslb-site:\" are reserved for GSLB's own pools", pool.name),
        );
    }
    crate::http::check_pool(base, &pool.http, cx);
    if pool.min_active == 0 {
        cx.error_path(&at("min_active"), "must be at least 1");
    }
    if pool.connect_timeout.is_zero() {
        cx.error_path(&at("connect_timeout"), "must be longer than 0s");
    }
    if pool.zero_window_timeout.is_some_and(|d| d.is_zero()) {
        cx.error_path(
            &at("zero_window_timeout"),
            "must be longer than 0s (leave it out to not watch zero windows)",
        );
    }
}
