//! `admin.state_file`: member states and weights set through the API survive a restart (also a
//! kill -9), and the configuration file's own value wins once it changes, as on reload.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::*;
use serde_json::json;

/// Starts with the `[admin]` table Fulcrum::start writes; the leading `state_file` key lands in it.
fn config(state: &Path, vs: SocketAddr, servers: &[TcpIdServer], m0_state: &str) -> String {
    format!(
        "state_file = \"{}\"\n\n\
         [[virtual_service]]\nname = \"svc\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"p\"\n\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n\
         [[pool.member]]\naddress = \"{}\"\nstate = \"{m0_state}\"\n\
         [[pool.member]]\naddress = \"{}\"\nweight = 2\n",
        state.display(),
        servers[0].addr,
        servers[1].addr,
    )
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

async fn restart(f: Fulcrum, text: &str) -> Fulcrum {
    f.signal(libc::SIGKILL);
    drop(f);
    start(text).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_changes_survive_a_restart_until_the_config_changes() {
    let servers = id_servers(2).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let vs = free_addr();
    let (m0, m1) = (servers[0].addr.to_string(), servers[1].addr.to_string());
    let text = config(&state, vs, &servers, "enabled");

    let f = start(&text).await;
    assert!(!state.exists(), "nothing set through the API yet");
    // No [ha] here: the HA endpoint says so.
    let r = f.api("GET", "/api/v1/ha", None).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let r = f
        .api(
            "PUT",
            &format!("/api/v1/pools/p/members/{m0}/state"),
            Some(json!({"state": "drain"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = f
        .api(
            "PUT",
            &format!("/api/v1/pools/p/members/{m1}/weight"),
            Some(json!({"weight": 7})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let saved = read_json(&state);
    assert_eq!(saved["members"].as_array().unwrap().len(), 2, "{saved}");

    // kill -9 and start again on the same files: still drained, still weight 7, and traffic
    // goes only to m1.
    let f = restart(f, &text).await;
    assert_eq!(f.member("p", &m0).await["state"], "drain", "{}", f.logs());
    assert_eq!(f.member("p", &m1).await["weight"], 7);
    let counts = shares(vs, 6).await;
    assert_eq!(counts.get("m1"), Some(&6), "{counts:?}");
    assert!(f.logs().contains("state file applied"));

    // Setting the config's own value through the API ends the override; the file follows.
    let r = f
        .api(
            "PUT",
            &format!("/api/v1/pools/p/members/{m1}/weight"),
            Some(json!({"weight": 2})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let saved = read_json(&state);
    assert_eq!(saved["members"].as_array().unwrap().len(), 1, "{saved}");

    // The operator edits the file (m0 disabled there) and reloads: the file's changed value
    // wins, and after a restart it still does.
    let edited = config(&state, vs, &servers, "disabled");
    f.write_config(&edited);
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(f.member("p", &m0).await["state"], "disabled");
    let ended = wait_until(std::time::Duration::from_secs(5), || async {
        read_json(&state)["members"]
            .as_array()
            .is_some_and(Vec::is_empty)
    })
    .await;
    assert!(
        ended,
        "the reload ended the override: {}",
        read_json(&state)
    );
    let f = restart(f, &edited).await;
    assert_eq!(f.member("p", &m0).await["state"], "disabled");

    // The config is edited back to enabled while Fulcrum is down (the saved override, if any,
    // was made against "disabled"): the config's value applies.
    let f = restart(f, &text).await;
    assert_eq!(f.member("p", &m0).await["state"], "enabled");
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_state_file_is_reported_and_the_config_applies() {
    let servers = id_servers(2).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, b"{\"version\": 1, \"members\": [").unwrap();
    let vs = free_addr();
    let f = start(&config(&state, vs, &servers, "drain")).await;
    assert_eq!(
        f.member("p", &servers[0].addr.to_string()).await["state"],
        "drain"
    );
    assert!(f.logs().contains("state file ignored"), "{}", f.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gslb_site_taken_out_stays_out_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let text = format!(
        "state_file = \"{}\"\n\n\
         [dns]\nlisten = [\"{}\"]\n\
         [[dns.zone]]\norigin = \"example.com.\"\nrecords = [\"@ 300 IN NS ns.example.com.\", \"ns 300 IN A 192.0.2.53\"]\n\
         [[gslb.site]]\nname = \"east\"\naddresses = [\"192.0.2.10\"]\n\
         [[gslb.site]]\nname = \"west\"\naddresses = [\"192.0.2.20\"]\n\
         [[gslb.name]]\nfqdn = \"app.example.com.\"\nsites = [\"east\", \"west\"]\nalgorithm = \"round_robin\"\n",
        state.display(),
        free_addr()
    );
    let f = start(&text).await;
    let r = f
        .api(
            "PUT",
            "/api/v1/gslb/sites/west/state",
            Some(json!({"state": "disabled"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let saved = read_json(&state);
    assert_eq!(
        saved["gslb_sites"],
        json!([{"name": "west", "state": "disabled"}])
    );
    let f = restart(f, &text).await;
    let west = f.get_json("/api/v1/gslb/sites/west").await;
    assert_eq!(west["state"], "disabled", "{west}\n{}", f.logs());
    assert_eq!(
        f.get_json("/api/v1/gslb/sites/east").await["state"],
        "enabled"
    );
}
