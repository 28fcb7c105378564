//! `type = "nntp"` monitors through the binary, against servers that speak NNTP (testkit's
//! scripted line-dialogue server: Debian's INN fails to configure where the host name does not
//! resolve, so it cannot be a test dependency): a member whose reader serves the monitor's
//! newsgroup is up and takes the clients, one that answers `411 No such group` is down and says
//! why.

mod common;

use std::time::Duration;

use common::*;
use fulcrum_testkit::DialogueServer;
use tokio::io::{AsyncBufReadExt, BufReader};

/// An NNTP reader greeting with `greeting`, with misc.test when `has_group`.
async fn reader(greeting: &'static str, has_group: bool) -> DialogueServer {
    let group = if has_group {
        Some("211 3 1 3 misc.test")
    } else {
        Some("411 No such group")
    };
    DialogueServer::start(
        free_addr(),
        greeting,
        vec![("GROUP misc.test", group), ("QUIT", Some("205 bye"))],
        "500 What?",
    )
    .await
    .unwrap()
}

fn config(vs: std::net::SocketAddr, members: &[&DialogueServer], newsgroup: &str) -> String {
    let members: String = members
        .iter()
        .map(|m| format!("[[pool.member]]\naddress = \"{}\"\n", m.addr))
        .collect();
    format!(
        "[[virtual_service]]\nname = \"news\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"readers\"\n\n\
         [[pool]]\nname = \"readers\"\nmonitors = [\"nntp\"]\n{members}\n\
         [[monitor]]\nname = \"nntp\"\ntype = \"nntp\"\nnewsgroup = \"{newsgroup}\"\n\
         interval = \"200ms\"\ntimeout = \"150ms\"\nrise = 1\nfall = 1\n"
    )
}

/// The first line a client reads through the service.
async fn greeting(vs: std::net::SocketAddr) -> String {
    let s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(vs))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(2),
        BufReader::new(s).read_line(&mut line),
    )
    .await
    .expect("greeting in time")
    .expect("greeting");
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nntp_monitor_takes_down_the_reader_without_the_newsgroup() {
    let with = reader("200 a.test InterNetNews NNRP server ready", true).await;
    let without = reader("201 b.test read-only", false).await;
    let vs = free_addr();
    let (ok, out) = check(&config(vs, &[&with], "misc.*"));
    assert!(!ok, "{out}");
    assert!(
        out.contains("bad.toml:16:1: monitor[0].newsgroup: \"misc.*\" is not a newsgroup name"),
        "{out}"
    );
    let f = start(&config(vs, &[&with, &without], "misc.test")).await;
    let (a, b) = (with.addr.to_string(), without.addr.to_string());
    let last = |m: &serde_json::Value| m["checks"][0]["last"].as_str().unwrap_or("").to_string();
    // Members start up before their first check: wait for a's first answer too.
    let settled = wait_until(Duration::from_secs(10), || async {
        let (ma, mb) = (f.member("readers", &a).await, f.member("readers", &b).await);
        ma["health"] == "up" && last(&ma).starts_with("NNTP") && mb["health"] == "down"
    })
    .await;
    let (ma, mb) = (f.member("readers", &a).await, f.member("readers", &b).await);
    assert!(settled, "{ma}\n{mb}\n{}", f.logs());
    assert!(
        last(&ma).contains("NNTP 200, misc.test: 3 articles"),
        "{ma}"
    );
    assert!(
        last(&mb).contains("NNTP GROUP misc.test: \"411 No such group\""),
        "{mb}"
    );
    // Every client reaches the reader that has the group.
    for _ in 0..6 {
        let line = greeting(vs).await;
        assert!(line.starts_with("200 a.test"), "{line}");
    }
    // The monitor says goodbye rather than dropping the connection.
    assert!(with.commands().iter().any(|c| c == "QUIT"));
    assert!(with.commands().iter().any(|c| c == "GROUP misc.test"));
}
