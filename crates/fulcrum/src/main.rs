//! The `fulcrum` binary: command line, assembly of the data planes, reload, signals, demo mode.

mod admin;
mod app;
mod cli;
mod config_cli;
mod config_store;
mod demo;
mod elastic;
mod limits;
mod planes;
mod state_file;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "fulcrum",
    version,
    long_version = long_version(),
    about = "Fulcrum application delivery controller"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the configuration in FILE until SIGTERM/SIGINT; SIGHUP reloads it.
    Run {
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Checks FILE: exit status 0 when it is valid, otherwise every error and status 1.
    Check {
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Starts built-in demo backends and a load-balanced service in front of them; no file needed.
    Demo {
        /// Address of the demo's HTTP virtual service.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Address of the admin API.
        #[arg(long, default_value = "127.0.0.1:9900")]
        admin: std::net::SocketAddr,
    },
    /// Member side of forwarding = "tunnel" on kernels without IPIP / IP6IP6: strips the outer
    /// header in XDP on each INTERFACE until SIGTERM/SIGINT.
    Decap {
        #[arg(short, long = "interface", value_name = "INTERFACE", required = true)]
        interfaces: Vec<String>,
        /// auto | native | generic
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Outer source prefix the balancers tunnel from (repeatable); tunnel packets from
        /// elsewhere are dropped. Default: 172.16.0.0/16 and 100::/96, Fulcrum's tunnel sources.
        #[arg(long = "allow-source", value_name = "PREFIX")]
        allow_sources: Vec<String>,
    },
    /// Shows the running instance's virtual services and pools (via the admin API).
    Status {
        #[command(flatten)]
        target: cli::Target,
    },
    /// Shows every pool's members, or pool NAME's, with health, state, weights and counters.
    Pools {
        name: Option<String>,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Changes a member: drain, enable, disable, or its weight.
    Member {
        #[command(subcommand)]
        action: cli::MemberCommand,
        #[command(flatten)]
        target: cli::Target,
    },
    /// A live terminal view of services and members, refreshed every second (q quits).
    Top {
        #[command(flatten)]
        target: cli::Target,
    },
    /// Reads, changes and rolls back the running configuration through the admin API.
    Config {
        #[command(subcommand)]
        action: config_cli::ConfigCommand,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Makes the running instance re-read its configuration file.
    Reload {
        #[command(flatten)]
        target: cli::Target,
    },
    /// Started by `fulcrum run` with `[bgp] speaker = "gobgp"`: withdraws the paths named on
    /// stdin from gobgpd when stdin closes (the parent is gone). Not for interactive use.
    #[command(hide = true)]
    BgpWatchdog {
        #[arg(long)]
        address: String,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

/// `fulcrum --version`: the version, and the address table shipped for `[[ip_table]]` `asns`
/// and `countries` (its date and sources), so an operator can tell which data places clients.
fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let data = fulcrum_ipdata::about();
        format!(
            "{}\naddress table {} ({})",
            env!("CARGO_PKG_VERSION"),
            data.date,
            data.source
        )
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match app::check(&config) {
            Ok((summary, notes)) => {
                println!("{}: OK ({summary})", config.display());
                for note in notes {
                    println!("{note}");
                }
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in errors {
                    eprintln!("{e}");
                }
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => {
            init_logging();
            let source = app::Source::File(config);
            match source.load() {
                Ok(cfg) => app::run_blocking(source, cfg, || async { Ok(()) }),
                Err(errors) => {
                    for e in errors {
                        eprintln!("{e}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo { listen, admin } => {
            init_logging();
            demo::run(listen, admin)
        }
        Command::Decap {
            interfaces,
            mode,
            allow_sources,
        } => {
            init_logging();
            planes::xdp::run_decap(&interfaces, &mode, &allow_sources)
        }
        Command::Status { target } => cli::report(cli::status(&target)),
        Command::Pools { name, target } => cli::report(cli::pools(&target, name.as_deref())),
        Command::Member { action, target } => cli::report(cli::member(&target, &action)),
        Command::Reload { target } => cli::report(cli::reload(&target)),
        Command::Config { action, target } => cli::report(config_cli::run(&target, &action)),
        Command::Top { target } => cli::report(top::run(&target)),
        Command::BgpWatchdog { address } => {
            init_logging();
            planes::bgp::run_watchdog(&address)
        }
    }
}
