//! The `sluice` binary: parses the command line, sets up logging and runs a
//! subcommand. Exit status: 0 when done (or clean), 1 when an operator tool
//! found something (duplicates, a window too short, a stuck partition) or
//! `run --until-caught-up` was stopped first, 2 on error, with the message
//! on stderr.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use sluice::ch::{ChArgs, Conn};
use sluice::config::{ConfigArgs, Delivery, Overrides};
use sluice::ops;
use sluice::report::Outcome;
use std::process::ExitCode;

/// jemalloc for Rust and C alike (librdkafka, OpenSSL): glibc's per-thread
/// arenas kept batch buffers freed on other threads and let the resident
/// size creep past `max_buffered_bytes`; jemalloc reuses them.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Exactly-once Kafka → ClickHouse ingestion"
)]
struct Cli {
    /// Log filter, e.g. `info` or `sluice=debug` (RUST_LOG also works).
    #[arg(long, global = true, default_value = "info", env = "SLUICE_LOG")]
    log: String,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SLUICE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sink: consume the routed topics and write rows exactly once.
    Run {
        #[command(flatten)]
        config: ConfigArgs,
        /// Consumer group id; overrides the file.
        #[arg(long)]
        group_id: Option<String>,
        /// Delivery mode; overrides the file.
        #[arg(long, value_enum)]
        delivery: Option<Delivery>,
        /// Rows per insert at most; overrides the file.
        #[arg(long)]
        max_batch_rows: Option<usize>,
        /// Serve /metrics, /health and /ready on this host:port; overrides the file.
        #[arg(long)]
        metrics_listen: Option<String>,
        /// Stop once every partition of the routes is durable up to the high
        /// watermark seen at start (this process's by its own reckoning, the
        /// others' by the group's commit): flush, commit, hand off cleanly
        /// and exit 0 (backfills, batch jobs). Exit 1 if a signal stops it
        /// first.
        #[arg(long)]
        until_caught_up: bool,
    },
    /// How far behind ClickHouse is, per route and partition: watermarks,
    /// committed offsets, lag in records and time, owners. Reads only.
    Status(sluice::status::StatusArgs),
    /// Validate a config file and check that both ends can be reached.
    CheckConfig {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Run the fault lab: each scenario × delivery mode against the real
    /// stack, counted in ClickHouse, printed as a matrix.
    Lab(sluice_lab::LabArgs),
    /// How long the table's block dedup window lasts, measured from
    /// system.part_log, against the client's re-submit interval.
    Window(ops::window::WindowArgs),
    /// Count duplicate rows by entry point (sink replay, producer side).
    Audit(ops::audit::AuditArgs),
    /// Deduplicate one partition by key with REPLACE PARTITION (dry run by
    /// default), keeping a backup.
    Repair(ops::repair::RepairArgs),
    /// Print the recommended DDL for a target table.
    Schema(ops::schema::SchemaArgs),
    /// Produce JSON lines (files or stdin) with an idempotent producer;
    /// records not confirmed go to a retry file.
    Send(sluice::send::SendArgs),
    /// Re-send records whose key the table does not hold yet.
    Resend(sluice::send::resend::ResendArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match cli.command {
        // The lab's own clients reconnect through faults it injects on
        // purpose; their librdkafka warnings are noise there.
        Command::Lab(_) => format!("{},librdkafka=off,rdkafka=off", cli.log),
        // A broker that cannot describe groups drops the connection; the
        // status says so once, without librdkafka's reports of it.
        Command::Status(_) => format!("{},librdkafka=off,rdkafka=off", cli.log),
        _ => cli.log.clone(),
    };
    init_logging(&filter, cli.log_format);
    match run(cli.command) {
        Ok(Outcome::Clean) => ExitCode::SUCCESS,
        Ok(Outcome::Found) => ExitCode::from(1),
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("sluice: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> anyhow::Result<Outcome> {
    match command {
        Command::Run {
            config,
            group_id,
            delivery,
            max_batch_rows,
            metrics_listen,
            until_caught_up,
        } => {
            let cfg = config.load(Overrides {
                group_id,
                delivery,
                max_batch_rows,
                metrics_listen,
                ..Overrides::default()
            })?;
            let rt = runtime()?;
            let stop = async {
                shutdown_signal().await;
                tracing::info!("shutdown requested: flushing, committing and leaving the group");
            };
            let until = match until_caught_up {
                true => sluice::sink::Until::CaughtUp,
                false => sluice::sink::Until::Stopped,
            };
            let ended = rt.block_on(sluice::sink::run(cfg, until, stop))?;
            match (until, ended) {
                (sluice::sink::Until::CaughtUp, sluice::sink::Ended::Stopped) => {
                    eprintln!(
                        "sluice: stopped before catching up with the high watermarks seen at start"
                    );
                    Ok(Outcome::Found)
                }
                _ => Ok(Outcome::Clean),
            }
        }
        Command::Lab(a) => {
            let rt = runtime()?;
            let r = rt.block_on(sluice_lab::main(a, shutdown_signal()));
            // After a signal, do not wait for a producer still filling a topic.
            rt.shutdown_background();
            r
        }
        Command::CheckConfig { config } => {
            let cfg = config.load(Overrides::default())?;
            println!("config {}: valid", config.config.display());
            Ok(runtime()?.block_on(sluice::check::main(&cfg)))
        }
        Command::Status(a) => runtime()?.block_on(sluice::status::main(a, shutdown_signal())),
        Command::Send(a) => sluice::send::main(a),
        Command::Resend(a) => runtime()?.block_on(sluice::send::resend::main(a)),
        Command::Window(a) => tool(&a.ch.clone(), |c| ops::window::run(a, c)),
        Command::Audit(a) => tool(&a.ch.clone(), |c| ops::audit::run(a, c)),
        Command::Repair(a) => tool(&a.ch.clone(), |c| ops::repair::run(a, c)),
        Command::Schema(a) => tool(&a.ch.clone(), |c| ops::schema::run(a, c)),
    }
}

/// Runs an operator tool on its connection; a failure to reach ClickHouse
/// names the URL.
fn tool<F>(ch: &ChArgs, work: impl FnOnce(Conn) -> F) -> anyhow::Result<Outcome>
where
    F: std::future::Future<Output = Result<Outcome, ops::OpsError>>,
{
    let conn = ch.connect()?;
    let url = sluice::config::secret::redact_url(&conn.url);
    let rt = runtime()?;
    rt.block_on(work(conn))
        .map_err(|e| match e.is_unreachable() {
            true => anyhow::anyhow!("{e} (at {url})"),
            false => e.into(),
        })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    // Colour only on a terminal, and never with NO_COLOR set (no-color.org).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[cfg(test)]
mod tests {
    /// Clap's own consistency checks (one name per flag in each command…).
    #[test]
    fn the_command_line_is_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
