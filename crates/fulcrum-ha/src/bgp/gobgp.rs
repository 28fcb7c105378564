//! Scale-out through a local GoBGP (gobgpd 3.x): the VIP prefixes are added to and deleted from
//! gobgpd's global RIB through its gRPC API (AddPath / DeletePath), and the BGP sessions are read
//! with ListPeer, so the operator keeps gobgpd's own configuration (neighbours, policies) and
//! Fulcrum only owns its paths.
//!
//! Why this shape:
//! - gRPC through tonic with prost messages written here by hand (below) rather than generated
//!   from GoBGP's .proto files: the handful of messages needed is small, and generating them
//!   would need `protoc` on every build machine. Each struct names the proto message and the
//!   field numbers it mirrors (GoBGP v3 `api/gobgp.proto` and `api/attribute.proto`, package
//!   `apipb`, as of v3.10). Unknown fields in replies are skipped by prost, so newer 3.x daemons
//!   still decode.
//! - The paths carry next hop 0.0.0.0 / `::`: gobgpd replaces an unspecified next hop with the
//!   session's own address (next-hop-self), as BIRD's `next hop self` does in the BIRD setup.
//! - kill -9: a path added through the API lives in gobgpd until someone deletes it; gobgpd
//!   does not notice that the client that added it died, and nothing in the API ties a path to
//!   a connection or stream. (BIRD's setup points its routes at a TUN interface that dies with
//!   the process; gobgpd does not track next-hop reachability without zebra.) So Fulcrum starts
//!   a small watchdog process (`fulcrum bgp-watchdog`, in its own process group so a terminal's
//!   or a group's signal does not take it along) whose stdin is a pipe from Fulcrum. Fulcrum
//!   writes the prefixes it is about to add before AddPath, and the UUIDs of the paths it has
//!   added after every change; when the pipe closes — the kernel closes it however Fulcrum
//!   ends, kill -9 and OOM included — the watchdog deletes exactly those UUIDs (and, by
//!   prefix, the paths announced as being added whose UUIDs it never heard) and exits. Deleting by UUID (not by prefix) means a watchdog
//!   of a dead Fulcrum cannot withdraw the paths a new Fulcrum has added meanwhile: gobgpd
//!   gives a re-added prefix a new UUID. Without a running watchdog Fulcrum announces nothing
//!   (as BIRD announces nothing without the liveness interface). What the watchdog does not
//!   cover: the watchdog killed together with Fulcrum (a cgroup-wide SIGKILL, `systemctl kill
//!   -s KILL`); the next Fulcrum then removes the stale paths of its configured prefixes at
//!   start (docs/operations.md "Scale-out").
//! - gobgpd forgets API paths when it restarts, and tonic's channel reconnects without telling
//!   anyone: every few seconds the local paths are listed (ListPath) and the missing ones are
//!   added again, the unwanted ones (of the configured prefixes only) deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use http::uri::PathAndQuery;
use ipnet::IpNet;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};

use super::{BgpStatus, Decision, Report, Session, SpeakerOps, SESSIONS_EVERY};

/// How long one gRPC call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the watchdog keeps trying to withdraw after Fulcrum is gone.
const WATCHDOG_PATIENCE: Duration = Duration::from_secs(10);

/// gobgpd's default API address (`--api-hosts`).
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:50051";

// ---- GoBGP v3 API messages (package apipb), mirrored by hand: only the fields used. ----

/// `apipb.Family` (gobgp.proto): afi = 1, safi = 2. AFI_IP = 1, AFI_IP6 = 2, SAFI_UNICAST = 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Family {
    #[prost(int32, tag = "1")]
    pub afi: i32,
    #[prost(int32, tag = "2")]
    pub safi: i32,
}

/// `apipb.Path` (gobgp.proto): nlri = 1 (Any), pattrs = 2 (repeated Any), is_withdraw = 5,
/// family = 9, neighbor_ip = 15, uuid = 16.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Path {
    #[prost(message, optional, tag = "1")]
    pub nlri: Option<prost_types::Any>,
    #[prost(message, repeated, tag = "2")]
    pub pattrs: Vec<prost_types::Any>,
    #[prost(bool, tag = "5")]
    pub is_withdraw: bool,
    #[prost(message, optional, tag = "9")]
    pub family: Option<Family>,
    #[prost(string, tag = "15")]
    pub neighbor_ip: String,
    #[prost(bytes = "vec", tag = "16")]
    pub uuid: Vec<u8>,
}

/// `apipb.AddPathRequest` (gobgp.proto): table_type = 1 (GLOBAL = 0), vrf_id = 2, path = 3.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddPathRequest {
    #[prost(int32, tag = "1")]
    pub table_type: i32,
    #[prost(string, tag = "2")]
    pub vrf_id: String,
    #[prost(message, optional, tag = "3")]
    pub path: Option<Path>,
}

/// `apipb.AddPathResponse` (gobgp.proto): uuid = 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddPathResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub uuid: Vec<u8>,
}

/// `apipb.DeletePathRequest` (gobgp.proto): table_type = 1, vrf_id = 2, family = 3, path = 4,
/// uuid = 5. Careful: with neither path nor uuid, gobgpd deletes every local path.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeletePathRequest {
    #[prost(int32, tag = "1")]
    pub table_type: i32,
    #[prost(string, tag = "2")]
    pub vrf_id: String,
    #[prost(message, optional, tag = "3")]
    pub family: Option<Family>,
    #[prost(message, optional, tag = "4")]
    pub path: Option<Path>,
    #[prost(bytes = "vec", tag = "5")]
    pub uuid: Vec<u8>,
}

/// `google.protobuf.Empty`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// `apipb.ListPathRequest` (gobgp.proto): table_type = 1, name = 2, family = 3.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPathRequest {
    #[prost(int32, tag = "1")]
    pub table_type: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, optional, tag = "3")]
    pub family: Option<Family>,
}

/// `apipb.ListPathResponse` (gobgp.proto): destination = 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPathResponse {
    #[prost(message, optional, tag = "1")]
    pub destination: Option<Destination>,
}

/// `apipb.Destination` (gobgp.proto): prefix = 1, paths = 2.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Destination {
    #[prost(string, tag = "1")]
    pub prefix: String,
    #[prost(message, repeated, tag = "2")]
    pub paths: Vec<Path>,
}

/// `apipb.ListPeerRequest` (gobgp.proto): address = 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPeerRequest {
    #[prost(string, tag = "1")]
    pub address: String,
}

/// `apipb.ListPeerResponse` (gobgp.proto): peer = 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPeerResponse {
    #[prost(message, optional, tag = "1")]
    pub peer: Option<Peer>,
}

/// `apipb.Peer` (gobgp.proto): conf = 2, state = 5.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Peer {
    #[prost(message, optional, tag = "2")]
    pub conf: Option<PeerConf>,
    #[prost(message, optional, tag = "5")]
    pub state: Option<PeerState>,
}

/// `apipb.PeerConf` (gobgp.proto): description = 2, neighbor_address = 4, peer_asn = 5.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerConf {
    #[prost(string, tag = "2")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub neighbor_address: String,
    #[prost(uint32, tag = "5")]
    pub peer_asn: u32,
}

/// `apipb.PeerState` (gobgp.proto): neighbor_address = 5, session_state = 13 (UNKNOWN 0, IDLE 1,
/// CONNECT 2, ACTIVE 3, OPENSENT 4, OPENCONFIRM 5, ESTABLISHED 6), admin_state = 15 (UP 0,
/// DOWN 1, PFX_CT 2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerState {
    #[prost(string, tag = "5")]
    pub neighbor_address: String,
    #[prost(int32, tag = "13")]
    pub session_state: i32,
    #[prost(int32, tag = "15")]
    pub admin_state: i32,
}

/// `apipb.IPAddressPrefix` (attribute.proto): prefix_len = 1, prefix = 2.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IpAddressPrefix {
    #[prost(uint32, tag = "1")]
    pub prefix_len: u32,
    #[prost(string, tag = "2")]
    pub prefix: String,
}

/// `apipb.OriginAttribute` (attribute.proto): origin = 1 (0 IGP).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OriginAttribute {
    #[prost(uint32, tag = "1")]
    pub origin: u32,
}

/// `apipb.NextHopAttribute` (attribute.proto): next_hop = 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NextHopAttribute {
    #[prost(string, tag = "1")]
    pub next_hop: String,
}

/// `apipb.MpReachNLRIAttribute` (attribute.proto): family = 1, next_hops = 2, nlris = 3 (Any).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MpReachNlriAttribute {
    #[prost(message, optional, tag = "1")]
    pub family: Option<Family>,
    #[prost(string, repeated, tag = "2")]
    pub next_hops: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    pub nlris: Vec<prost_types::Any>,
}

// ---- The client. ----

fn any<M: prost::Message>(name: &str, m: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/apipb.{name}"),
        value: m.encode_to_vec(),
    }
}

fn family_of(v6: bool) -> Family {
    Family {
        afi: if v6 { 2 } else { 1 },
        safi: 1,
    }
}

/// The `apipb.Path` announcing `prefix` with an unspecified next hop (gobgpd puts its own).
pub fn path_for(prefix: &IpNet) -> Path {
    let p = prefix.trunc();
    let v6 = p.addr().is_ipv6();
    let nlri = any(
        "IPAddressPrefix",
        &IpAddressPrefix {
            prefix_len: u32::from(p.prefix_len()),
            prefix: p.addr().to_string(),
        },
    );
    let origin = any("OriginAttribute", &OriginAttribute { origin: 0 });
    // IPv4 unicast takes the classic NEXT_HOP attribute; IPv6 its next hop in MP_REACH_NLRI
    // (RFC 4760), which also carries the NLRI again (gobgpd's api2Path reads the next hop there).
    let next_hop = if v6 {
        any(
            "MpReachNLRIAttribute",
            &MpReachNlriAttribute {
                family: Some(family_of(true)),
                next_hops: vec!["::".into()],
                nlris: vec![nlri.clone()],
            },
        )
    } else {
        any(
            "NextHopAttribute",
            &NextHopAttribute {
                next_hop: "0.0.0.0".into(),
            },
        )
    };
    Path {
        nlri: Some(nlri),
        pattrs: vec![origin, next_hop],
        family: Some(family_of(v6)),
        ..Path::default()
    }
}

/// A gRPC connection to gobgpd's API (reconnects by itself; each call has a deadline).
#[derive(Clone)]
pub struct GobgpClient {
    grpc: tonic::client::Grpc<Channel>,
}

/// `call` within CALL_TIMEOUT.
async fn in_time<T>(
    method: &str,
    call: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| format!("{method}: no answer in time"))?
}

fn status_text(s: tonic::Status) -> String {
    if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        format!("{:?}: {}", s.code(), s.message())
    }
}

impl GobgpClient {
    /// A client of `address` (host:port); connects at the first call.
    pub fn new(address: &str) -> Result<GobgpClient, String> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("{address}: not a gRPC address: {e}"))?
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT);
        Ok(GobgpClient {
            grpc: tonic::client::Grpc::new(endpoint.connect_lazy()),
        })
    }

    async fn ready(&mut self) -> Result<(), String> {
        self.grpc
            .ready()
            .await
            .map_err(|e| format!("gobgpd unreachable: {e}"))
    }

    async fn unary<Q, R>(&mut self, method: &'static str, request: Q) -> Result<R, String>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        let call = async {
            self.ready().await?;
            self.grpc
                .unary(
                    tonic::Request::new(request),
                    PathAndQuery::from_static(method),
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .map(tonic::Response::into_inner)
                .map_err(status_text)
        };
        in_time(method, call).await
    }

    async fn stream<Q, R>(&mut self, method: &'static str, request: Q) -> Result<Vec<R>, String>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        let call = async {
            self.ready().await?;
            let mut s = self
                .grpc
                .server_streaming(
                    tonic::Request::new(request),
                    PathAndQuery::from_static(method),
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .map_err(status_text)?
                .into_inner();
            let mut out = Vec::new();
            while let Some(m) = s.message().await.map_err(status_text)? {
                out.push(m);
            }
            Ok(out)
        };
        in_time(method, call).await
    }

    /// Adds (or replaces) the path of `prefix` in the global RIB; its UUID.
    pub async fn add(&mut self, prefix: &IpNet) -> Result<Vec<u8>, String> {
        let r: AddPathResponse = self
            .unary(
                "/apipb.GobgpApi/AddPath",
                AddPathRequest {
                    path: Some(path_for(prefix)),
                    ..AddPathRequest::default()
                },
            )
            .await
            .map_err(|e| format!("AddPath {prefix}: {e}"))?;
        Ok(r.uuid)
    }

    /// Deletes this source's (the API's) path of `prefix`.
    pub async fn delete(&mut self, prefix: &IpNet) -> Result<(), String> {
        let mut path = path_for(prefix);
        path.is_withdraw = true;
        let _: Empty = self
            .unary(
                "/apipb.GobgpApi/DeletePath",
                DeletePathRequest {
                    family: path.family.clone(),
                    path: Some(path),
                    ..DeletePathRequest::default()
                },
            )
            .await
            .map_err(|e| format!("DeletePath {prefix}: {e}"))?;
        Ok(())
    }

    /// Deletes the path gobgpd gave `uuid` (an error when it has no such path any more).
    pub async fn delete_uuid(&mut self, uuid: &[u8]) -> Result<(), String> {
        if uuid.is_empty() {
            // An empty UUID would delete every local path.
            return Err("empty UUID".into());
        }
        let _: Empty = self
            .unary(
                "/apipb.GobgpApi/DeletePath",
                DeletePathRequest {
                    uuid: uuid.to_vec(),
                    ..DeletePathRequest::default()
                },
            )
            .await?;
        Ok(())
    }

    /// The prefixes with a locally originated path (API or gobgpd's own config) in the global RIB.
    pub async fn local_prefixes(&mut self) -> Result<BTreeSet<IpNet>, String> {
        let mut out = BTreeSet::new();
        for v6 in [false, true] {
            let list: Vec<ListPathResponse> = self
                .stream(
                    "/apipb.GobgpApi/ListPath",
                    ListPathRequest {
                        family: Some(family_of(v6)),
                        ..ListPathRequest::default()
                    },
                )
                .await
                .map_err(|e| format!("ListPath: {e}"))?;
            for d in list.into_iter().filter_map(|r| r.destination) {
                // A local path has no source address: gobgpd prints a nil net.IP as "<nil>".
                let local = d
                    .paths
                    .iter()
                    .any(|p| p.neighbor_ip.is_empty() || p.neighbor_ip == "<nil>");
                if let (true, Ok(prefix)) = (local, d.prefix.parse::<IpNet>()) {
                    out.insert(prefix);
                }
            }
        }
        Ok(out)
    }

    pub async fn sessions(&mut self) -> Result<Vec<Session>, String> {
        let list: Vec<ListPeerResponse> = self
            .stream("/apipb.GobgpApi/ListPeer", ListPeerRequest::default())
            .await
            .map_err(|e| format!("ListPeer: {e}"))?;
        Ok(list
            .into_iter()
            .filter_map(|r| r.peer)
            .map(|p| session_of(&p))
            .collect())
    }
}

/// A peer as the API and metrics show sessions (BIRD's shape: `state` up/down, `info` the FSM
/// state, "Established" when it is).
pub fn session_of(p: &Peer) -> Session {
    let conf = p.conf.clone().unwrap_or_default();
    let state = p.state.clone().unwrap_or_default();
    let name = if conf.description.is_empty() {
        if conf.neighbor_address.is_empty() {
            state.neighbor_address.clone()
        } else {
            conf.neighbor_address.clone()
        }
    } else {
        conf.description.clone()
    };
    let fsm = match state.session_state {
        1 => "Idle",
        2 => "Connect",
        3 => "Active",
        4 => "OpenSent",
        5 => "OpenConfirm",
        6 => "Established",
        _ => "Unknown",
    };
    let mut info = fsm.to_string();
    if state.admin_state == 1 {
        info.push_str(" (admin down)");
    } else if state.admin_state == 2 {
        info.push_str(" (prefix limit)");
    }
    Session {
        name,
        state: if state.session_state == 6 {
            "up"
        } else {
            "down"
        }
        .into(),
        info,
    }
}

// ---- The watchdog. ----

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

/// The line Fulcrum sends the watchdog: every UUID it has added, hex, space-separated.
pub fn watchdog_line<'a>(uuids: impl Iterator<Item = &'a Vec<u8>>) -> String {
    let mut line = String::from("uuids");
    for u in uuids {
        line.push(' ');
        line.push_str(&hex(u));
    }
    line.push('\n');
    line
}

/// The UUIDs of a watchdog line (`None`: not one).
pub fn parse_watchdog_line(line: &str) -> Option<Vec<Vec<u8>>> {
    let mut words = line.split_whitespace();
    if words.next() != Some("uuids") {
        return None;
    }
    words.map(unhex).collect()
}

/// The line Fulcrum sends the watchdog *before* adding paths: the prefixes about to be added,
/// whose UUIDs gobgpd has not given yet.
pub fn adding_line<'a>(prefixes: impl Iterator<Item = &'a IpNet>) -> String {
    let mut line = String::from("adding");
    for p in prefixes {
        line.push(' ');
        line.push_str(&p.to_string());
    }
    line.push('\n');
    line
}

/// The prefixes of an `adding` line (`None`: not one).
pub fn parse_adding_line(line: &str) -> Option<Vec<IpNet>> {
    let mut words = line.split_whitespace();
    if words.next() != Some("adding") {
        return None;
    }
    words.map(|w| w.parse().ok()).collect()
}

/// `fulcrum bgp-watchdog`: follows the UUID lines on `input` and, when it ends (Fulcrum is gone,
/// however it went), deletes those paths from gobgpd at `address`.
pub async fn watchdog<R: tokio::io::AsyncBufRead + Unpin>(
    address: &str,
    input: R,
) -> Result<(), String> {
    let mut client = GobgpClient::new(address)?;
    let mut lines = input.lines();
    let mut uuids: Vec<Vec<u8>> = Vec::new();
    // Announced as being added, with no `uuids` line since: Fulcrum may have died between
    // gobgpd's answer and telling the UUID.
    let mut adding: Vec<IpNet> = Vec::new();
    // Until EOF, or the pipe broke: either way the writer is gone.
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(u) = parse_watchdog_line(&line) {
            uuids = u;
            adding.clear();
        } else if let Some(p) = parse_adding_line(&line) {
            adding = p;
        }
    }
    // Paths being added are deleted by prefix (their UUID is unknown): this deletes the
    // API's path of that prefix, which can only be a new Fulcrum's if one already runs beside
    // this dead one — and that one re-adds a path it finds missing within seconds (its
    // ListPath check), while a leaked path would stay for good.
    for p in adding {
        match client.delete(&p).await {
            Ok(()) => {}
            Err(e) if e.contains("can't find") => {}
            Err(e) => {
                tracing::warn!(prefix = %p, error = %e, "BGP watchdog: a path being added could not be deleted")
            }
        }
    }
    if uuids.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        paths = uuids.len(),
        "BGP watchdog: Fulcrum is gone without withdrawing; deleting its paths from gobgpd"
    );
    let deadline = tokio::time::Instant::now() + WATCHDOG_PATIENCE;
    let mut last = String::new();
    while !uuids.is_empty() && tokio::time::Instant::now() < deadline {
        let mut left = Vec::new();
        for u in uuids {
            match client.delete_uuid(&u).await {
                Ok(()) => {}
                // Already gone (Fulcrum withdrew it, or a newer path replaced it): done with it.
                Err(e) if e.contains("can't find") => {}
                Err(e) => {
                    last = e;
                    left.push(u);
                }
            }
        }
        uuids = left;
        if !uuids.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if uuids.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} path(s) not withdrawn from gobgpd at {address}: {last}",
            uuids.len()
        ))
    }
}

/// How the GoBGP speaker starts its watchdog: a program and its arguments (the binary passes
/// itself with `bgp-watchdog --address …`).
#[derive(Debug, Clone)]
pub struct WatchdogCommand {
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
}

struct Watchdog {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
}

impl Watchdog {
    fn spawn(cmd: &WatchdogCommand) -> Result<Watchdog, String> {
        let mut child = tokio::process::Command::new(&cmd.program)
            .args(&cmd.args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            // Its own process group: a signal to Fulcrum's group (a terminal's Ctrl-C) must not
            // kill it before it has withdrawn.
            .process_group(0)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start the BGP watchdog {}: {e}",
                    cmd.program.display()
                )
            })?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| "the BGP watchdog has no stdin".to_string())?;
        Ok(Watchdog { child, stdin })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    async fn tell(&mut self, line: &str) -> Result<(), String> {
        tokio::time::timeout(CALL_TIMEOUT, self.stdin.write_all(line.as_bytes()))
            .await
            .map_err(|_| "the BGP watchdog does not read".to_string())?
            .map_err(|e| format!("BGP watchdog: {e}"))
    }
}

/// The GoBGP speaker.
pub struct Gobgp {
    address: String,
    watchdog_cmd: Option<WatchdogCommand>,
    client: Option<GobgpClient>,
    watchdog: Option<Watchdog>,
    /// Paths this process added and believes present, with gobgpd's UUIDs.
    paths: BTreeMap<IpNet, Vec<u8>>,
    /// `paths` was checked against gobgpd's RIB on this connection.
    known: bool,
    verified_at: Option<tokio::time::Instant>,
    /// The UUID set the watchdog last heard.
    told: Option<String>,
    reachable: bool,
}

impl Gobgp {
    /// `watchdog`: `None` only in tests that do not need kill -9 coverage.
    pub fn new(address: String, watchdog: Option<WatchdogCommand>) -> Gobgp {
        Gobgp {
            address,
            watchdog_cmd: watchdog,
            client: None,
            watchdog: None,
            paths: BTreeMap::new(),
            known: false,
            verified_at: None,
            told: None,
            reachable: false,
        }
    }

    fn lost(&mut self, report: Report<'_>, e: String) {
        report(e);
        self.reachable = false;
        self.known = false;
    }

    /// Keeps the watchdog running; `false` when there is none (nothing may be announced then).
    fn ensure_watchdog(&mut self, report: Report<'_>) -> bool {
        let Some(cmd) = &self.watchdog_cmd else {
            return true;
        };
        if let Some(w) = self.watchdog.as_mut() {
            if w.alive() {
                return true;
            }
            report("the BGP watchdog exited: starting it again".into());
            self.watchdog = None;
            self.told = None;
        }
        match Watchdog::spawn(cmd) {
            Ok(w) => {
                tracing::info!(pid = ?w.child.id(), "BGP: watchdog started (withdraws the paths if this process dies)");
                self.watchdog = Some(w);
                true
            }
            Err(e) => {
                report(e);
                false
            }
        }
    }

    async fn tell_watchdog(&mut self, report: Report<'_>) {
        let line = watchdog_line(self.paths.values());
        if self.told.as_deref() == Some(line.as_str()) {
            return;
        }
        if let Some(w) = self.watchdog.as_mut() {
            match w.tell(&line).await {
                Ok(()) => self.told = Some(line),
                Err(e) => report(e),
            }
        }
    }
}

impl SpeakerOps for Gobgp {
    const NAME: &'static str = "gobgp";

    async fn announce(&mut self, want: &Decision, configured: &[IpNet], report: Report<'_>) {
        // GoBGP has no cost to raise: a node in maintenance withdraws.
        let want = &want.serving;
        let watched = self.ensure_watchdog(report);
        if self.client.is_none() {
            match GobgpClient::new(&self.address) {
                Ok(c) => self.client = Some(c),
                Err(e) => return self.lost(report, e),
            }
        }
        let Some(mut client) = self.client.clone() else {
            return;
        };
        let due = self
            .verified_at
            .is_none_or(|t| t.elapsed() >= SESSIONS_EVERY);
        if !self.known || due {
            let present = match client.local_prefixes().await {
                Ok(p) => p,
                Err(e) => return self.lost(report, e),
            };
            self.verified_at = Some(tokio::time::Instant::now());
            let missing: Vec<IpNet> = self
                .paths
                .keys()
                .filter(|p| !present.contains(&p.trunc()))
                .copied()
                .collect();
            for p in missing {
                if self.known {
                    report(format!(
                        "gobgpd lost the path of {p} (restarted?): adding it again"
                    ));
                }
                self.paths.remove(&p);
            }
            // Paths of configured prefixes nobody here added: left by an earlier Fulcrum
            // (whose watchdog died with it) or added by hand. Fulcrum owns these prefixes.
            for p in configured {
                if present.contains(&p.trunc()) && !self.paths.contains_key(p) {
                    if let Err(e) = client.delete(p).await {
                        return self.lost(report, e);
                    }
                    tracing::info!(prefix = %p, "BGP: deleted a path of a configured prefix that this process had not added");
                }
            }
            self.known = true;
        }
        self.reachable = true;
        let want: BTreeSet<IpNet> = if watched {
            want.clone()
        } else {
            BTreeSet::new()
        };
        let stale: Vec<IpNet> = self
            .paths
            .keys()
            .filter(|p| !want.contains(p))
            .copied()
            .collect();
        for p in stale {
            if let Err(e) = client.delete(&p).await {
                return self.lost(report, e);
            }
            self.paths.remove(&p);
        }
        // The watchdog hears about removals before additions, and about additions twice:
        // the prefixes before AddPath (gobgpd gives the UUID only in its answer), their
        // UUIDs right after. A crash between AddPath and the UUID line would otherwise leave
        // a path nobody withdraws; at any moment the watchdog knows every path that could
        // outlive this process. Without the first line told, nothing is added (and without a
        // watchdog, `want` is empty above).
        let new: Vec<IpNet> = want
            .iter()
            .filter(|p| !self.paths.contains_key(p))
            .copied()
            .collect();
        if !new.is_empty() {
            if let Some(w) = self.watchdog.as_mut() {
                if let Err(e) = w.tell(&adding_line(new.iter())).await {
                    // What the watchdog heard last is unknown now: tell it everything again.
                    self.told = None;
                    report(e);
                    return;
                }
                self.told = None;
            }
        }
        for p in new {
            match client.add(&p).await {
                Ok(uuid) => {
                    self.paths.insert(p, uuid);
                }
                Err(e) => {
                    self.tell_watchdog(report).await;
                    return self.lost(report, e);
                }
            }
        }
        self.tell_watchdog(report).await;
    }

    async fn sessions(&mut self) -> Result<Vec<Session>, String> {
        let Some(mut client) = self.client.clone() else {
            return Err("gobgpd not connected".to_string());
        };
        let r = client.sessions().await;
        if r.is_err() {
            self.reachable = false;
            self.known = false;
        }
        r
    }

    async fn shutdown(&mut self, report: Report<'_>) {
        if !self.paths.is_empty() {
            if let Some(mut client) = self.client.clone() {
                let all: Vec<IpNet> = self.paths.keys().copied().collect();
                for p in all {
                    match client.delete(&p).await {
                        Ok(()) => {
                            self.paths.remove(&p);
                        }
                        Err(e) => report(e),
                    }
                }
            }
        }
        // What is left the watchdog withdraws once its stdin closes (below).
        if let Some(w) = self.watchdog.as_mut() {
            let line = watchdog_line(self.paths.values());
            let _ = w.tell(&line).await;
        }
        self.watchdog = None;
    }

    fn announced(&self) -> Option<BTreeSet<IpNet>> {
        self.known.then(|| self.paths.keys().copied().collect())
    }

    fn reachable(&self) -> bool {
        self.reachable
    }

    fn describe(&self, status: &mut BgpStatus) {
        status.watchdog_pid = self.watchdog.as_ref().and_then(|w| w.child.id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn paths_carry_the_prefix_origin_and_an_unspecified_next_hop() {
        let p = path_for(&"198.51.100.10/32".parse().expect("prefix"));
        assert_eq!(p.family, Some(Family { afi: 1, safi: 1 }));
        let nlri = p.nlri.expect("nlri");
        assert_eq!(nlri.type_url, "type.googleapis.com/apipb.IPAddressPrefix");
        let prefix = IpAddressPrefix::decode(nlri.value.as_slice()).expect("decodes");
        assert_eq!(prefix.prefix, "198.51.100.10");
        assert_eq!(prefix.prefix_len, 32);
        assert_eq!(p.pattrs.len(), 2);
        assert_eq!(
            p.pattrs[0].type_url,
            "type.googleapis.com/apipb.OriginAttribute"
        );
        let nh = NextHopAttribute::decode(p.pattrs[1].value.as_slice()).expect("next hop");
        assert_eq!(nh.next_hop, "0.0.0.0");
        // The wire bytes: field 1 varint 32, field 2 string.
        assert_eq!(&nlri.value[..2], &[0x08, 32]);

        let p = path_for(&"2001:db8::10:1/64".parse().expect("prefix"));
        assert_eq!(p.family, Some(Family { afi: 2, safi: 1 }));
        let prefix = IpAddressPrefix::decode(p.nlri.as_ref().expect("nlri").value.as_slice())
            .expect("decodes");
        assert_eq!(
            (prefix.prefix.as_str(), prefix.prefix_len),
            ("2001:db8::", 64)
        );
        assert_eq!(
            p.pattrs[1].type_url,
            "type.googleapis.com/apipb.MpReachNLRIAttribute"
        );
        let mp = MpReachNlriAttribute::decode(p.pattrs[1].value.as_slice()).expect("mp");
        assert_eq!(mp.next_hops, vec!["::".to_string()]);
        assert_eq!(mp.nlris.len(), 1);
    }

    #[test]
    fn peers_read_as_sessions() {
        let peer = |desc: &str, state: i32, admin: i32| Peer {
            conf: Some(PeerConf {
                description: desc.into(),
                neighbor_address: "198.18.1.1".into(),
                peer_asn: 65000,
            }),
            state: Some(PeerState {
                neighbor_address: "198.18.1.1".into(),
                session_state: state,
                admin_state: admin,
            }),
        };
        assert_eq!(
            session_of(&peer("", 6, 0)),
            Session {
                name: "198.18.1.1".into(),
                state: "up".into(),
                info: "Established".into()
            }
        );
        let s = session_of(&peer("router", 3, 1));
        assert_eq!(
            (s.name.as_str(), s.state.as_str(), s.info.as_str()),
            ("router", "down", "Active (admin down)")
        );
        // Bytes from the wire decode (unknown fields skipped).
        let bytes = ListPeerResponse {
            peer: Some(peer("", 6, 0)),
        }
        .encode_to_vec();
        let mut with_unknown = bytes.clone();
        with_unknown.extend_from_slice(&[0xa0, 0x01, 0x07]); // field 20, varint 7
        let back = ListPeerResponse::decode(with_unknown.as_slice()).expect("decodes");
        assert_eq!(session_of(&back.peer.expect("peer")).info, "Established");
    }

    #[test]
    fn watchdog_lines_round_trip() {
        let a = vec![0u8, 1, 0xab, 0xff];
        let b = vec![0x10u8; 16];
        let line = watchdog_line([&a, &b].into_iter());
        assert_eq!(line, format!("uuids 0001abff {}\n", "10".repeat(16)));
        assert_eq!(parse_watchdog_line(&line), Some(vec![a, b]));
        assert_eq!(parse_watchdog_line("uuids\n"), Some(vec![]));
        assert_eq!(parse_watchdog_line("uuids 0g"), None);
        assert_eq!(parse_watchdog_line("uuids 123"), None);
        assert_eq!(parse_watchdog_line("hello 00"), None);
        let p: Vec<IpNet> = vec![
            "198.51.100.10/32".parse().expect("prefix"),
            "2001:db8::10/128".parse().expect("prefix"),
        ];
        let line = adding_line(p.iter());
        assert_eq!(line, "adding 198.51.100.10/32 2001:db8::10/128\n");
        assert_eq!(parse_adding_line(&line), Some(p));
        assert_eq!(parse_adding_line("adding x"), None);
        assert_eq!(parse_watchdog_line(&line), None);
        assert_eq!(parse_adding_line("uuids 00"), None);
    }

    #[tokio::test]
    async fn a_watchdog_without_paths_exits_at_once() {
        // Nothing was announced: nothing to delete, no gobgpd needed.
        let input: &[u8] = b"uuids\n";
        let r = watchdog("127.0.0.1:1", tokio::io::BufReader::new(input)).await;
        assert_eq!(r, Ok(()));
    }
}
