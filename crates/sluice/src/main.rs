//! The `sluice` binary: parses the command line, sets up logging and runs a
//! subcommand. Exit status: 0 when done (or clean), 1 when an operator tool
//! found something (duplicates, a window too short), 2 on error, with the
//! message on stderr.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use sluice::config::{ConfigArgs, Delivery, Overrides};
use sluice::ops::{self, Outcome};
use std::path::PathBuf;
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
    },
    /// Validate a config file and check that both ends can be reached.
    CheckConfig {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Run the fault lab: each scenario × delivery mode against the real
    /// stack, counted in ClickHouse, printed as a matrix.
    Lab {
        /// A reduced version of every scenario (minutes, not an hour).
        #[arg(long)]
        quick: bool,
        /// Scenarios to run (default: all).
        #[arg(long = "scenario", value_name = "NAME")]
        scenarios: Vec<String>,
        /// Delivery modes to compare (default: all).
        #[arg(long = "mode", value_name = "MODE")]
        modes: Vec<String>,
        /// Also write every count as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write the matrix as Markdown.
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Render a saved run's JSON (with --markdown, to a file) and exit.
        #[arg(long, value_name = "JSON")]
        render: Option<PathBuf>,
        /// Instead of the matrix: a soak run this long (e.g. 30m) with a
        /// random fault every --fault-every; exit 1 on any duplicate or loss.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        soak: Option<std::time::Duration>,
        /// Soak: the mean time between faults.
        #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
        fault_every: std::time::Duration,
        /// Soak: records produced per second.
        #[arg(long, default_value_t = 500)]
        rate: u64,
        /// Soak: the seed of the fault sequence (default: the clock).
        #[arg(long)]
        seed: Option<u64>,
        /// Kafka bootstrap servers.
        #[arg(long, env = "KAFKA_BROKERS")]
        brokers: String,
        /// ClickHouse HTTP URL.
        #[arg(long, env = "CLICKHOUSE_URL")]
        clickhouse_url: String,
    },
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
    Send {
        #[command(flatten)]
        producer: sluice::send::ProducerArgs,
        /// Input files of JSON lines (default: stdin).
        files: Vec<PathBuf>,
    },
    /// Re-send records whose key the table does not hold yet.
    Resend {
        /// The table the records should be in, as DB.TABLE.
        #[arg(long, value_parser = ops::db::TableName::parse)]
        table: ops::db::TableName,
        /// Only list what would be sent and skipped.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        producer: sluice::send::ProducerArgs,
        #[command(flatten)]
        ch: ops::db::ChArgs,
        /// Input files of JSON lines (or a retry file).
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match cli.command {
        // The lab's own clients reconnect through faults it injects on
        // purpose; their librdkafka warnings are noise there.
        Command::Lab { .. } => format!("{},librdkafka=off,rdkafka=off", cli.log),
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
        } => {
            let cfg = config.load(Overrides {
                group_id,
                delivery,
                max_batch_rows,
                metrics_listen,
                ..Overrides::default()
            })?;
            let rt = runtime()?;
            rt.block_on(sluice::sink::run(cfg, shutdown_signal()))?;
            Ok(Outcome::Clean)
        }
        Command::Lab {
            quick,
            scenarios,
            modes,
            json,
            markdown,
            render,
            brokers,
            clickhouse_url,
            soak,
            fault_every,
            rate,
            seed,
        } => {
            let rt = runtime()?;
            let stack = sluice::lab::fixture::Stack {
                brokers: brokers.clone(),
                clickhouse_url: clickhouse_url.clone(),
            };
            if let Some(duration) = soak {
                let o = sluice::lab::soak::SoakOptions {
                    duration,
                    fault_every,
                    rate,
                    seed: seed.unwrap_or_else(|| {
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(1, |d| d.as_secs())
                    }),
                };
                let r = rt.block_on(sluice::lab::soak::run(&stack, o))?;
                let md = sluice::lab::soak::markdown(&r, &o);
                println!("{md}");
                if let Some(p) = markdown {
                    std::fs::write(p, &md)?;
                }
                if let Some(p) = json {
                    std::fs::write(p, serde_json::to_string_pretty(&r)?)?;
                }
                let clean = r.duplicates == 0 && r.missing == 0 && r.settled_after_s.is_some();
                return Ok(if clean {
                    Outcome::Clean
                } else {
                    Outcome::Found
                });
            }
            let opts = sluice::lab::LabOptions {
                stack: sluice::lab::fixture::Stack {
                    brokers,
                    clickhouse_url,
                },
                quick,
                scenarios,
                modes,
                json,
                markdown,
                render,
            };
            rt.block_on(sluice::lab::run(opts))?;
            Ok(Outcome::Clean)
        }
        Command::CheckConfig { config } => {
            let cfg = config.load(Overrides::default())?;
            println!("config {}: valid", config.config.display());
            for line in cfg.endpoints() {
                println!("{line}");
            }
            for ignored in &cfg.origins.ignored {
                println!("warning: {ignored}");
            }
            let checks = runtime()?.block_on(sluice::check::check(&cfg));
            let (text, outcome) = sluice::check::render(&checks);
            print!("{text}");
            Ok(outcome)
        }
        Command::Send { producer, files } => send(producer, files),
        Command::Resend {
            table,
            dry_run,
            producer,
            ch,
            files,
        } => resend(table, dry_run, producer, ch, files),
        Command::Window(a) => tool(&a.ch.clone(), |c| ops::window::run(a, c)),
        Command::Audit(a) => tool(&a.ch.clone(), |c| ops::audit::run(a, c)),
        Command::Repair(a) => tool(&a.ch.clone(), |c| ops::repair::run(a, c)),
        Command::Schema(a) => tool(&a.ch.clone(), |c| ops::schema::run(a, c)),
    }
}

fn send(producer: sluice::send::ProducerArgs, files: Vec<PathBuf>) -> anyhow::Result<Outcome> {
    let opts = producer.options()?;
    let report = sluice::send::send_stream(&opts, sluice::send::input::lines(&files))?;
    eprintln!(
        "sluice send: {} read, {} confirmed, {} in the retry file{}{}",
        report.read,
        report.sent,
        report.failed,
        if report.failed > 0 {
            format!(" ({})", opts.retry_file.display())
        } else {
            String::new()
        },
        report
            .stopped
            .as_ref()
            .map(|s| format!("; {s}"))
            .unwrap_or_default()
    );
    Ok(if report.failed == 0 {
        Outcome::Clean
    } else {
        Outcome::Found
    })
}

fn resend(
    table: ops::db::TableName,
    dry_run: bool,
    producer: sluice::send::ProducerArgs,
    ch: ops::db::ChArgs,
    files: Vec<PathBuf>,
) -> anyhow::Result<Outcome> {
    let key = producer
        .key_field
        .clone()
        .context("--key-field is required: resend looks records up by their key")?;
    let lines = sluice::send::input::read_all(&files)?;
    let opts = producer.options()?;
    let r = runtime()?.block_on(sluice::send::resend::resend(
        &ch.connect()?.client,
        &table,
        &key,
        &opts,
        lines,
        dry_run,
    ))?;
    if dry_run {
        for s in &r.missing {
            println!("send {s}");
        }
    }
    let failed = r.send.as_ref().map_or(0, |s| s.failed);
    eprintln!(
        "sluice resend: {} read, {} already in {table} (skipped), {} {}{}",
        r.read,
        r.skipped,
        r.missing.len(),
        if dry_run { "to send (dry run)" } else { "sent" },
        if failed > 0 {
            format!(
                ", {failed} of them in the retry file ({})",
                opts.retry_file.display()
            )
        } else {
            String::new()
        }
    );
    Ok(if failed == 0 {
        Outcome::Clean
    } else {
        Outcome::Found
    })
}

/// Runs an operator tool on its connection; a failure to reach ClickHouse
/// names the URL.
fn tool<F>(ch: &ops::db::ChArgs, work: impl FnOnce(ops::db::Conn) -> F) -> anyhow::Result<Outcome>
where
    F: std::future::Future<Output = Result<Outcome, ops::OpsError>>,
{
    let conn = ch.connect()?;
    let url = conn.url.clone();
    let rt = runtime()?;
    rt.block_on(work(conn)).map_err(|e| match e {
        ops::OpsError::ClickHouse(c) if c.kind == sluice::ch::ChErrorKind::Connect => {
            anyhow::anyhow!("{c} (at {url})")
        }
        e => e.into(),
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
    tracing::info!("shutdown requested: flushing, committing and leaving the group");
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
