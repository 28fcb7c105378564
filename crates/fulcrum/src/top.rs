//! `fulcrum top`: services and members in the terminal, refreshed every second from the admin
//! API (rates come from the server's one-second samples, so they match the dashboard's).

use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use ratatui::Frame;
use serde_json::Value;

use crate::cli::{Client, Failure, Target};

const REFRESH: Duration = Duration::from_secs(1);

#[derive(Default)]
struct View {
    status: Value,
    pools: Value,
    sample: Value,
    error: Option<String>,
    updated: Option<Instant>,
}

impl View {
    fn refresh(&mut self, c: &Client) {
        let got = (|| -> Result<(Value, Value, Value), Failure> {
            let status = c.call("GET", "/api/v1/status", None)?;
            let pools = c.call("GET", "/api/v1/pools", None)?;
            // The last two samples are enough for the current rates.
            let since = crate::cli::unix_now() - 3.0;
            let history = c.call("GET", &format!("/api/v1/history?since={since}"), None)?;
            let sample = history["samples"]
                .as_array()
                .and_then(|s| s.last().cloned())
                .unwrap_or_default();
            Ok((status, pools, sample))
        })();
        match got {
            Ok((status, pools, sample)) => {
                self.status = status;
                self.pools = pools;
                self.sample = sample;
                self.error = None;
                self.updated = Some(Instant::now());
            }
            Err(f) => self.error = Some(f.message),
        }
    }
}

fn rate(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |r| {
        if r >= 100.0 {
            format!("{r:.0}")
        } else {
            format!("{r:.1}")
        }
    })
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn health_style(h: &str) -> Style {
    match h {
        "up" | "enabled" => Style::default().fg(Color::Green),
        "drain" => Style::default().fg(Color::Yellow),
        "disabled" => Style::default().fg(Color::DarkGray),
        _ => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

fn draw(f: &mut Frame, v: &View, admin: &str) {
    let services = v.status["virtual_services"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let [head, svc, pools, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(services.len() as u16 + 3),
        Constraint::Min(4),
        Constraint::Length(1),
    ])
    .areas(f.area());
    draw_header(f, v, admin, head);
    draw_services(f, v, &services, svc);
    draw_members(f, v, pools);
    let age = v.updated.map_or("never".into(), |u| {
        format!("{:.0} s ago", u.elapsed().as_secs_f64())
    });
    f.render_widget(
        Paragraph::new(format!(" q quit · refreshed every 1 s · last update {age}"))
            .style(Style::default().fg(Color::DarkGray)),
        foot,
    );
}

fn draw_header(f: &mut Frame, v: &View, admin: &str, area: Rect) {
    let mut header = vec![
        Span::styled(
            " fulcrum top ",
            Style::default()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(
            "  {}  v{}  config generation {}",
            admin,
            text(&v.status["version"]),
            text(&v.status["generation"])
        )),
    ];
    if let Some(e) = &v.error {
        header.push(Span::styled(
            format!("  {e}"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(header)), area);
}

fn draw_services(f: &mut Frame, v: &View, services: &[Value], area: Rect) {
    let samples = v.sample["services"].as_array().cloned().unwrap_or_default();
    let rows = services.iter().map(|s| {
        let r = samples
            .iter()
            .find(|x| x["name"] == s["name"])
            .cloned()
            .unwrap_or_default();
        service_row(s, &r)
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(16),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(11),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new([
            "SERVICE", "PROTO", "REQ/S", "CONN/S", "ERR/S", "ACTIVE", "CONNS", "LISTEN",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(" Virtual services "));
    f.render_widget(table, area);
}

/// Service `s` of the status, with its rates from sample `r`.
fn service_row(s: &Value, r: &Value) -> Row<'static> {
    Row::new(vec![
        Cell::from(text(&s["name"])),
        Cell::from(text(&s["protocol"])),
        Cell::from(rate(&r["requests_per_s"])),
        Cell::from(rate(&r["connections_per_s"])),
        Cell::from(rate(&r["errors_per_s"])).style(
            if r["errors_per_s"].as_f64().unwrap_or(0.0) > 0.0 {
                Style::default().fg(Color::Red)
            } else {
                Style::default()
            },
        ),
        Cell::from(text(&s["connections_active"])),
        Cell::from(text(&s["connections_total"])),
        Cell::from(
            s["listen"]
                .as_array()
                .map(|l| l.iter().map(text).collect::<Vec<_>>().join(","))
                .unwrap_or_default(),
        ),
    ])
}

fn draw_members(f: &mut Frame, v: &View, area: Rect) {
    let member_samples = v.sample["members"].as_array().cloned().unwrap_or_default();
    let mut rows = Vec::new();
    for p in v.pools["pools"].as_array().into_iter().flatten() {
        for m in p["members"].as_array().into_iter().flatten() {
            let r = member_samples
                .iter()
                .find(|x| x["pool"] == p["name"] && x["address"] == m["address"])
                .cloned()
                .unwrap_or_default();
            rows.push(member_row(p, m, &r));
        }
    }
    let table = Table::new(
        rows,
        [
            Constraint::Length(12),
            Constraint::Length(22),
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new([
            "POOL",
            "MEMBER",
            "HEALTH",
            "STATE",
            "WEIGHT",
            "EFFECTIVE",
            "ACTIVE",
            "RATE/S",
            "RESP_MS",
            "LAST CHECK",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(" Pools and members "));
    f.render_widget(table, area);
}

/// Member `m` of pool `p`, with its rates from sample `r`.
fn member_row(p: &Value, m: &Value, r: &Value) -> Row<'static> {
    let health = text(&m["health"]);
    let state = text(&m["state"]);
    let check = m["checks"]
        .as_array()
        .and_then(|c| c.first())
        .map(|c| text(&c["last"]))
        .unwrap_or_else(|| "-".into());
    Row::new(vec![
        Cell::from(text(&p["name"])),
        Cell::from(text(&m["address"])),
        Cell::from(health.clone()).style(health_style(&health)),
        Cell::from(state.clone()).style(health_style(&state)),
        Cell::from(text(&m["weight"])),
        Cell::from(
            m["effective_weight"]
                .as_f64()
                .map_or("-".into(), |w| format!("{w:.1}")),
        ),
        Cell::from(text(&m["active_connections"])),
        Cell::from(rate(
            &if r["requests_per_s"].as_f64().unwrap_or(0.0) > 0.0 {
                r["requests_per_s"].clone()
            } else {
                r["connections_per_s"].clone()
            },
        )),
        Cell::from(
            m["response_time_ms"]
                .as_f64()
                .map_or("-".into(), |t| format!("{t:.1}")),
        ),
        Cell::from(check),
    ])
}

pub fn run(t: &Target) -> Result<(), Failure> {
    let client = Client::new(t)?;
    // Fail before taking over the terminal when the API is not there or refuses us.
    client.call("GET", "/api/v1/status", None)?;
    let mut terminal = ratatui::try_init()
        .map_err(|e| Failure::new(1, format!("cannot use the terminal: {e}")))?;
    let mut view = View::default();
    let admin = client.addr().to_string();
    let result = (|| -> std::io::Result<()> {
        loop {
            view.refresh(&client);
            terminal.draw(|f| draw(f, &view, &admin))?;
            let next = Instant::now() + REFRESH;
            while let Some(left) = next.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                            return Ok(());
                        }
                    }
                    Event::Resize(..) => {
                        terminal.draw(|f| draw(f, &view, &admin))?;
                    }
                    _ => {}
                }
            }
        }
    })();
    let _ = ratatui::try_restore();
    result.map_err(|e| Failure::new(1, format!("terminal: {e}")))
}
