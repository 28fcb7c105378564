//! HTTP/2 protocol errors a client connection may commit, h2spec-style, through the real
//! binary: a raw client (`http2_conformance/client.py`, Debian's python3-h2 for HPACK) sends
//! frames no library would, and Fulcrum must answer each with the error RFC 9113 names (a
//! GOAWAY for connection errors, a RST_STREAM for stream errors) and go on serving others.
//! A RST_STREAM flood is `http_abuse::rapid_reset_closes_the_connection_within_its_budget`.

mod common;

use common::*;
use fulcrum_testkit::{Origin, Reply};
use serde_json::Value;

const NO_ERROR: u64 = 0x0;
const PROTOCOL_ERROR: u64 = 0x1;
const FLOW_CONTROL_ERROR: u64 = 0x3;
const STREAM_CLOSED: u64 = 0x5;

/// Runs one case of the raw client against `vs`; its findings as JSON.
async fn raw(vs: std::net::SocketAddr, case: &str) -> Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/http2_conformance/client.py"
    );
    // Debian's interpreter: python3-h2 (hpack) is installed for it, not for another python3
    // that may come first on PATH.
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(vs.to_string())
        .arg(case)
        .output()
        .await
        .unwrap_or_else(|e| panic!("/usr/bin/python3 is installed by scripts/test.sh: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{case}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{case}: {e}"));
    eprintln!("{case}: {v}");
    v
}

fn goaway(v: &Value) -> Option<u64> {
    v["goaway"].as_u64()
}

fn reset(v: &Value, stream: u32) -> Option<u64> {
    v["rst"][stream.to_string()].as_u64()
}

fn status(v: &Value, stream: u32) -> Option<u64> {
    v["status"][stream.to_string()].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_get_the_error_code_rfc_9113_names_and_the_server_goes_on() {
    let member = Origin::start(free_addr(), |_, _| Reply::ok("hello", &[]))
        .await
        .unwrap();
    let vs = free_addr();
    let _f = start(&format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = \"{vs}\"\nprotocol = \"http\"\npool = \"p\"\n\n\
         [[pool]]\nname = \"p\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n",
        member.addr
    ))
    .await;
    assert_eq!(status(&raw(vs, "ok").await, 1), Some(200));

    // Frames that belong to a stream, on stream 0, and one that belongs to the connection on a
    // stream (§6.1, §6.2, §6.5): connection errors.
    for case in [
        "data_on_stream_0",
        "headers_on_stream_0",
        "settings_on_stream_1",
    ] {
        assert_eq!(goaway(&raw(vs, case).await), Some(PROTOCOL_ERROR), "{case}");
    }
    // A client opens odd streams only (§5.1.1).
    assert_eq!(
        goaway(&raw(vs, "even_stream_id").await),
        Some(PROTOCOL_ERROR)
    );
    // DATA on a stream both sides closed (§5.1): STREAM_CLOSED, here as a stream error.
    let v = raw(vs, "data_on_closed_stream").await;
    assert_eq!(status(&v, 1), Some(200));
    assert_eq!(reset(&v, 1), Some(STREAM_CLOSED), "{v}");
    assert_eq!(goaway(&v), None);
    // A window past 2^31-1 (§6.9.1): a connection error for the connection's window, a stream
    // error for a stream's.
    assert_eq!(
        goaway(&raw(vs, "window_update_overflows_connection").await),
        Some(FLOW_CONTROL_ERROR)
    );
    let v = raw(vs, "window_update_overflows_stream").await;
    assert_eq!(reset(&v, 1), Some(FLOW_CONTROL_ERROR), "{v}");
    assert_eq!(goaway(&v), None);
    // SETTINGS values out of range (§6.5.2).
    for case in [
        "settings_enable_push_2",
        "settings_max_frame_size_too_small",
    ] {
        assert_eq!(goaway(&raw(vs, case).await), Some(PROTOCOL_ERROR), "{case}");
    }
    // RFC 9113 names FLOW_CONTROL_ERROR for an initial window past 2^31-1; the h2 crate
    // answers PROTOCOL_ERROR. Either way the connection is closed with an error.
    let code = goaway(&raw(vs, "settings_initial_window_too_large").await);
    assert!(
        matches!(code, Some(FLOW_CONTROL_ERROR | PROTOCOL_ERROR)),
        "{code:?}"
    );
    // A header block past max_header_size over CONTINUATION frames: refused with 431 on its
    // stream, the connection goes on.
    let v = raw(vs, "oversized_header_block").await;
    assert_eq!(status(&v, 1), Some(431), "{v}");
    assert_eq!(goaway(&v), None);
    // A header block that never ends (CVE-2024-27316): the connection is closed long before
    // the 20,000 frames are in.
    let v = raw(vs, "continuation_flood").await;
    assert!(
        v["closed"] == true || goaway(&v).is_some_and(|c| c != NO_ERROR),
        "{v}"
    );
    assert!(v["continuations_sent"].as_u64() < Some(20_000), "{v}");

    // Still up and serving.
    assert_eq!(status(&raw(vs, "ok").await, 1), Some(200));
    let r = fulcrum_testkit::http_get(vs, "/").await.unwrap();
    assert_eq!(r.status, 200);
}
