//! HTTP session persistence: which member a request sticks to, and what the response must carry
//! so that the next request sticks too.
//!
//! - `cookie_insert`: the proxy sets a cookie naming the member. The value is an opaque member id,
//!   `HMAC-SHA256(secret, pool NUL member-address)` cut to 96 bits: it reveals no address, and a
//!   client cannot make one for a member it was not given, so it cannot steer itself anywhere.
//! - `cookie_rewrite`: the member's own session cookie gets the member id and `~` put in front on
//!   the way out, and taken off on the way in, so the member sees the cookie it set.
//! - `cookie_passive`: the value of the member's cookie, learnt from its Set-Cookie (only there:
//!   a value a client made up is never stored), maps to the member in a table with idle expiry.
//! - `header`: the value of a request header maps to the member (a table).
//!
//! Table keys made of client bytes are keyed 128-bit hashes (`PersistTable::key`), so an entry
//! has a fixed size whatever the client sends.
//! - `source_ip`: the masked client address maps to the member (a table), as in the TCP proxy.
//!
//! The tables are `fulcrum_balance::PersistTable`s; a remembered member that is down, disabled or
//! gone is rescheduled by `Pool::persistent`, and the new choice re-issued.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fulcrum_balance::{PersistKey, PersistTable, Pool};
use fulcrum_config::{PersistenceKind, SameSite};
use ring::hmac;

use crate::head::{FieldKind, RequestHead};

/// Hex digits of a member id in a cookie (96 bits).
pub const ID_LEN: usize = 24;
/// Separates the member id from the member's own value in a rewritten cookie.
pub const REWRITE_SEP: u8 = b'~';

/// A member id as it appears in cookies.
pub type MemberId = [u8; ID_LEN];

/// The key used when a profile has no `secret` and the binary gave it none (the binary fills
/// it from a secret file kept across restarts; this is for library users): drawn once per
/// process, so cookies survive reloads but not a restart.
fn process_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k).is_err() {
            // No system randomness: fall back to std's per-process random hasher seeds, which
            // still differ between processes.
            use std::hash::{BuildHasher, Hasher};
            for chunk in k.chunks_mut(8) {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(std::process::id().into());
                chunk.copy_from_slice(&h.finish().to_le_bytes());
            }
        }
        k
    })
}

/// How a service sticks clients to members.
#[derive(Debug, Clone)]
pub enum Kind {
    SourceIp { mask_v4: u8, mask_v6: u8 },
    CookieInsert,
    CookiePassive,
    CookieRewrite,
    Header(Vec<u8>),
}

/// A service's persistence, compiled.
pub struct Sticky {
    pub kind: Kind,
    pub cookie: Vec<u8>,
    key: hmac::Key,
    table: Option<Arc<PersistTable>>,
    max_age: Option<Duration>,
    same_site: Option<SameSite>,
    secure: bool,
    /// Member ids by target index, then member index (signed with the newest secret).
    ids: Vec<Vec<MemberId>>,
    /// Every id accepted: (target, member, signed with the newest secret).
    by_id: HashMap<MemberId, (usize, usize, bool)>,
}

impl std::fmt::Debug for Sticky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sticky").field("kind", &self.kind).finish()
    }
}

/// Where a request's persistence points.
#[derive(Debug, Default)]
pub struct Lookup {
    /// The member the request carried or the table held.
    pub member: Option<SocketAddr>,
    /// A table key to record the chosen member under (tables only).
    pub key: Option<PersistKey>,
    /// The member index the request's cookie named, for cookie_insert (no new cookie needed
    /// when the request goes there).
    pub cookie_member: Option<usize>,
}

fn hex_id(tag: &[u8]) -> MemberId {
    let mut id = [0u8; ID_LEN];
    for (i, b) in tag.iter().take(ID_LEN / 2).enumerate() {
        id[2 * i] = b"0123456789abcdef"[usize::from(b >> 4)];
        id[2 * i + 1] = b"0123456789abcdef"[usize::from(b & 15)];
    }
    id
}

impl Sticky {
    /// Compiles a profile for a service whose targets are `pools` (by target index). `table` is
    /// the service's table (kept across reloads) for the kinds that need one.
    pub fn new(
        profile: &fulcrum_config::Persistence,
        pools: &[Arc<Pool>],
        table: Option<Arc<PersistTable>>,
        https: bool,
    ) -> Result<Sticky, String> {
        let kind = match profile.kind {
            PersistenceKind::SourceIp => Kind::SourceIp {
                mask_v4: profile.source_mask,
                mask_v6: profile.source_mask_v6,
            },
            PersistenceKind::CookieInsert => Kind::CookieInsert,
            PersistenceKind::CookiePassive => Kind::CookiePassive,
            PersistenceKind::CookieRewrite => Kind::CookieRewrite,
            PersistenceKind::Header => Kind::Header(
                profile
                    .header
                    .as_deref()
                    .unwrap_or_default()
                    .to_ascii_lowercase()
                    .into_bytes(),
            ),
            PersistenceKind::Radius => {
                return Err("radius persistence applies to udp services".into());
            }
            PersistenceKind::RtspSession => {
                return Err("rtsp_session persistence applies to rtsp services".into());
            }
        };
        let secret: &[u8] = match &profile.secret {
            Some(s) => s.as_bytes(),
            None => process_key(),
        };
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        // Older secrets (rotation): their ids are still honoured, and replaced by new ones.
        let previous: Vec<hmac::Key> = profile
            .previous_secrets
            .iter()
            .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s.as_bytes()))
            .collect();
        let mut ids = Vec::with_capacity(pools.len());
        let mut by_id = HashMap::new();
        for (t, pool) in pools.iter().enumerate() {
            let mut v = Vec::with_capacity(pool.members().len());
            for (m, member) in pool.members().iter().enumerate() {
                let mut data = Vec::with_capacity(64);
                data.extend_from_slice(pool.name.as_bytes());
                data.push(0);
                data.extend_from_slice(member.address.to_string().as_bytes());
                for old in &previous {
                    by_id.insert(hex_id(hmac::sign(old, &data).as_ref()), (t, m, false));
                }
                let id = hex_id(hmac::sign(&key, &data).as_ref());
                by_id.insert(id, (t, m, true));
                v.push(id);
            }
            ids.push(v);
        }
        let needs_table = matches!(
            kind,
            Kind::SourceIp { .. } | Kind::CookiePassive | Kind::Header(_)
        );
        Ok(Sticky {
            kind,
            cookie: profile.cookie.as_bytes().to_vec(),
            key,
            table: if needs_table { table } else { None },
            max_age: profile.timeout,
            same_site: profile.same_site,
            secure: https,
            ids,
            by_id,
        })
    }

    /// The member id of a target's member.
    pub fn id(&self, target: usize, member: usize) -> Option<&MemberId> {
        self.ids.get(target)?.get(member)
    }

    /// The member an id names on `target`, and whether it was signed with the newest secret.
    fn member_of_id(&self, target: usize, id: &[u8]) -> Option<(usize, bool)> {
        let id: &MemberId = id.try_into().ok()?;
        match self.by_id.get(id) {
            Some(&(t, m, current)) if t == target => Some((m, current)),
            _ => None,
        }
    }

    /// Where the request sticks to, for a request routed to `target`.
    pub fn lookup(&self, req: &RequestHead, client: IpAddr, target: usize, pool: &Pool) -> Lookup {
        let table_get = |key: PersistKey| {
            let member = self.table.as_ref().and_then(|t| t.get(&key));
            Lookup {
                member,
                key: Some(key),
                cookie_member: None,
            }
        };
        match &self.kind {
            Kind::SourceIp { mask_v4, mask_v6 } => {
                table_get(PersistKey::source(client, *mask_v4, *mask_v6))
            }
            Kind::Header(name) => match (req.first_value_named(name), &self.table) {
                (Some(v), Some(t)) if !v.is_empty() => table_get(t.key(v)),
                _ => Lookup::default(),
            },
            Kind::CookiePassive => match (req.cookie(&self.cookie), &self.table) {
                (Some(v), Some(t)) if !v.is_empty() => table_get(t.key(v)),
                _ => Lookup::default(),
            },
            Kind::CookieInsert => {
                let m = req
                    .cookie(&self.cookie)
                    .and_then(|v| self.member_of_id(target, v));
                Lookup {
                    member: m
                        .and_then(|(m, _)| pool.members().get(m))
                        .map(|m| m.address),
                    key: None,
                    // An id signed with an older secret is honoured but re-issued.
                    cookie_member: m.filter(|(_, current)| *current).map(|(m, _)| m),
                }
            }
            Kind::CookieRewrite => {
                let m = req.cookie(&self.cookie).and_then(|v| {
                    let sep = memchr::memchr(REWRITE_SEP, v)?;
                    self.member_of_id(target, &v[..sep]).map(|(m, _)| m)
                });
                Lookup {
                    member: m.and_then(|m| pool.members().get(m)).map(|m| m.address),
                    key: None,
                    cookie_member: m,
                }
            }
        }
    }

    /// Records the member a request went to, in the table kinds (a fresh choice, or a remembered
    /// member that was replaced). `cookie_passive` learns only from the member's Set-Cookie
    /// (`learn`): a cookie value a client made up is never stored.
    pub fn remember(&self, lookup: &mut Lookup, member: SocketAddr) {
        if lookup.member == Some(member) || matches!(self.kind, Kind::CookiePassive) {
            return;
        }
        if let (Some(t), Some(k)) = (&self.table, lookup.key.take()) {
            t.insert(k, member);
        }
    }

    /// Learns a member's own cookie from its Set-Cookie value (cookie_passive).
    pub fn learn(&self, set_cookie: &[u8], member: SocketAddr) {
        if let (Kind::CookiePassive, Some(t)) = (&self.kind, &self.table) {
            if let Some((name, value)) = crate::cookie::set_cookie_pair(set_cookie) {
                if name == self.cookie.as_slice() && !value.is_empty() {
                    t.insert(t.key(value), member);
                }
            }
        }
    }

    /// The Set-Cookie value naming member `id` (cookie_insert).
    pub fn insert_cookie(&self, id: &MemberId, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.cookie);
        out.push(b'=');
        out.extend_from_slice(id);
        out.extend_from_slice(b"; Path=/; HttpOnly");
        if let Some(age) = self.max_age {
            out.extend_from_slice(b"; Max-Age=");
            out.extend_from_slice(itoa::Buffer::new().format(age.as_secs().max(1)).as_bytes());
        }
        if self.secure {
            out.extend_from_slice(b"; Secure");
        }
        match self.same_site {
            Some(SameSite::Strict) => out.extend_from_slice(b"; SameSite=Strict"),
            Some(SameSite::Lax) => out.extend_from_slice(b"; SameSite=Lax"),
            Some(SameSite::None) => out.extend_from_slice(b"; SameSite=None"),
            None => {}
        }
    }

    /// Whether a Set-Cookie value sets the cookie this profile rewrites.
    pub fn rewrites(&self, set_cookie: &[u8]) -> bool {
        matches!(self.kind, Kind::CookieRewrite)
            && crate::cookie::set_cookie_pair(set_cookie)
                .is_some_and(|(n, _)| n == &self.cookie[..])
    }

    /// A member's Set-Cookie with the member id put before its value (cookie_rewrite).
    pub fn rewrite_set_cookie(&self, set_cookie: &[u8], id: &MemberId, out: &mut Vec<u8>) {
        let Some(eq) = memchr::memchr(b'=', set_cookie) else {
            out.extend_from_slice(set_cookie);
            return;
        };
        let mut v = eq + 1;
        while set_cookie.get(v) == Some(&b' ') {
            v += 1;
        }
        out.extend_from_slice(&set_cookie[..v]);
        out.extend_from_slice(id);
        out.push(REWRITE_SEP);
        out.extend_from_slice(&set_cookie[v..]);
    }

    /// Whether forwarded Cookie fields must be rewritten (the marker taken off).
    pub fn strips_request_cookie(&self) -> bool {
        matches!(self.kind, Kind::CookieRewrite)
    }

    /// The value to forward for a request cookie `name=value`: the member's own value.
    pub fn forwarded_cookie_value<'a>(&self, name: &[u8], value: &'a [u8]) -> &'a [u8] {
        if name == self.cookie.as_slice() && value.len() > ID_LEN && value[ID_LEN] == REWRITE_SEP {
            return &value[ID_LEN + 1..];
        }
        value
    }

    /// Signs arbitrary data with the profile's key (tests and diagnostics).
    pub fn sign(&self, data: &[u8]) -> MemberId {
        hex_id(hmac::sign(&self.key, data).as_ref())
    }
}

/// Whether the request has Cookie fields that must be joined (several) for an HTTP/1.1 member.
pub fn cookie_fields(req: &RequestHead) -> usize {
    req.fields
        .iter()
        .filter(|f| f.kind == FieldKind::Cookie)
        .count()
}

/// The member ids a response carries for persistence: `(cookie to insert, id for the rewritten
/// member cookie)`. cookie_insert sets its cookie only when the request did not already carry
/// the cookie of the member that answered; cookie_rewrite always marks the member's cookie.
pub(crate) fn response_ids<'a>(
    sticky: Option<&'a Sticky>,
    ti: usize,
    member: usize,
    lookup: &Lookup,
) -> (Option<&'a MemberId>, Option<&'a MemberId>) {
    match sticky {
        Some(s) => {
            let id = s.id(ti, member);
            match s.kind {
                Kind::CookieInsert => (id.filter(|_| lookup.cookie_member != Some(member)), None),
                Kind::CookieRewrite => (None, id),
                _ => (None, None),
            }
        }
        None => (None, None),
    }
}
