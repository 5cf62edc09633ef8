//! A model of sluice's exactly-once protocol, checked with stateright.
//!
//! In: the rules under test ([`Rules`]: the product's, or one of the unsafe
//! ones the protocol replaced) and the bounds of the search ([`Bounds`]).
//! Out: every interleaving within the bounds of sink processes, a group
//! coordinator, the register of owners and ClickHouse, checked against the
//! exactly-once properties (the `properties` of [`Sluice`]).
//!
//! The processes decide as the sink does, by calling the same functions of
//! `sluice-protocol`: the resume plan, batch cutting, tokens and query ids, the
//! attempt rule and the rows an attempt holds, the server-side deadline and
//! the fence, the lease and the register's meaning, the durable frontier,
//! key dedup (the window rebuilt from the table, each record's verdict, the
//! conditional rows left out, a rejected copy forgotten). What the model
//! writes itself is the order in which the sink calls them ([`sink`]) and
//! the world around it ([`world`]). The unsafe rules exist only here.
//!
//! - [`world`]: the state: time, the coordinator, the register, ClickHouse
//!   and its in-flight inserts, the processes.
//! - [`sink`]: one step of one process, as the sink takes it.
//! - [`check`]: the model for stateright, its properties and a trace
//!   printer.

pub mod check;
pub mod sink;
pub mod world;

pub use check::{trace, Sluice};
pub use world::World;

use std::time::Duration;

/// How an INSERT whose outcome is unknown is kept from committing late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LateGuard {
    /// The product: the INSERT carries a deadline on the server's clock and
    /// refuses to start after it; the fence waits for the server's clock.
    ServerDeadline,
    /// Unsafe: no deadline on the server; the fence waits `insert_timeout`
    /// and a second on the client's clock (a request held on the way still
    /// runs when it arrives).
    ClientTimeout,
}

/// When a process that wrote itself into the register may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimConfirm {
    /// The product: read the claim back, and fence unless the previous
    /// owner left cleanly.
    ReadBackAndFence,
    /// Unsafe: right after the write.
    TrustWrite,
}

/// Where a partition with no committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnbackedRows {
    /// The product: what ClickHouse holds decides (`resume_plan`): rows
    /// there mean the log is read from its start and checked.
    FromLogStart,
    /// Unsafe: the reset policy, as if ClickHouse held nothing.
    ResetPolicy,
}

/// What a process that wrote itself back into a register that forgot it
/// checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RewriteCheck {
    /// The product: the write must be acknowledged within the lease, or
    /// the partition is claimed again (with a fence).
    AckWithinLease,
    /// Unsafe: the next read that shows it renews the lease.
    None,
}

/// When a batch whose records partly went to the DLQ counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DlqConfirm {
    /// The product: once its rows are durable and the DLQ acknowledged
    /// each of its letters.
    Acknowledged,
    /// Unsafe: once its rows are durable, with its letters only queued.
    Queued,
}

/// When key dedup drops a record whose key the window has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyDrop {
    /// The product ([`KeyWindow::decide`]): only when the copy it saw is
    /// settled (below the durable frontier) or in the table; a copy still
    /// in flight makes the record a conditional row instead.
    ///
    /// [`KeyWindow::decide`]: sluice_protocol::dedup::KeyWindow::decide
    SettledCopy,
    /// Unsafe: as soon as the window has seen the key.
    AnyCopy,
}

/// What the window does with the key of a row ClickHouse rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectedKey {
    /// The product: the batch's completion forgets it
    /// ([`KeyWindow::forget`]), unless a later copy stands for the key.
    ///
    /// [`KeyWindow::forget`]: sluice_protocol::dedup::KeyWindow::forget
    Forget,
    /// Unsafe: it is remembered as written.
    Keep,
}

/// What an insert refused for holding too many table partitions (code
/// 252) means for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusedInsert {
    /// The product ([`Answer::Refused`]): the refusal may come after the
    /// insert's first blocks were stored, so the next attempt asks first.
    ///
    /// [`Answer::Refused`]: sluice_protocol::attempt::Answer::Refused
    MayHaveStored,
    /// Unsafe: it never started ([`Answer::NotSent`]), so its rows are sent
    /// again without asking.
    ///
    /// [`Answer::NotSent`]: sluice_protocol::attempt::Answer::NotSent
    NothingStored,
}

/// What a claim that lost the partition to another process does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimYield {
    /// The product: it yields a fence (then two), or until the register
    /// shows the partition left cleanly.
    Yield,
    /// Unsafe for liveness: it claims again at once (the sink before
    /// 37a07cc): two members given one partition overwrite each other's
    /// claim within each other's fence.
    AtOnce,
}

/// What a batch does with the rows of a partition it lost while they were
/// in it (revoked and its lease run out, or taken by another process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostSlice {
    /// The product ([`Delivery::drop_partition`]): they leave the batch,
    /// which goes on under the leases of the partitions it still holds;
    /// the partition's next owner judges them.
    ///
    /// [`Delivery::drop_partition`]: sluice_protocol::delivery::Delivery::drop_partition
    Drop,
    /// Unsafe: they stay in the batch, sent again under the leases of the
    /// partitions it still holds.
    KeepSending,
}

/// The rules the processes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rules {
    pub late: LateGuard,
    pub claim: ClaimConfirm,
    pub unbacked: UnbackedRows,
    pub rewrite: RewriteCheck,
    pub dlq: DlqConfirm,
    pub key_drop: KeyDrop,
    pub rejected_key: RejectedKey,
    pub claim_yield: ClaimYield,
    pub refused: RefusedInsert,
    pub lost_slice: LostSlice,
}

impl Rules {
    /// The product's rules.
    pub const SAFE: Rules = Rules {
        late: LateGuard::ServerDeadline,
        claim: ClaimConfirm::ReadBackAndFence,
        unbacked: UnbackedRows::FromLogStart,
        rewrite: RewriteCheck::AckWithinLease,
        dlq: DlqConfirm::Acknowledged,
        key_drop: KeyDrop::SettledCopy,
        rejected_key: RejectedKey::Forget,
        claim_yield: ClaimYield::Yield,
        refused: RefusedInsert::MayHaveStored,
        lost_slice: LostSlice::Drop,
    };
}

/// The bounds of one search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Partitions of the topic; a batch may hold rows of several.
    pub partitions: usize,
    /// Which partitions the faults that strike one partition (a
    /// rebalance, a lost commit, a forgotten register entry) strike.
    pub struck: Struck,
    /// Records in each partition's log, produced before the start.
    pub records: i64,
    /// The records that cannot become rows and go to the DLQ (bit `o` for
    /// offset `o`).
    pub bad: u8,
    /// The records whose rows ClickHouse rejects (bit `o` for offset `o`):
    /// an INSERT holding one ends with an error naming the first of them
    /// (`(at row N)`), having stored none of its rows or (a partial insert)
    /// the rows before it; the record goes to the DLQ.
    pub rejected: u8,
    /// The business key of each record, on a route with key dedup (empty:
    /// no key dedup). Every record has one; the window is long enough that
    /// nothing expires.
    pub keys: &'static [u8],
    /// Sink processes.
    pub processes: usize,
    /// Rows per batch at most.
    pub max_rows: usize,
    /// Time stops here.
    pub horizon: Duration,
    /// Group rebalances (each assigns one partition to any process).
    pub rebalances: u8,
    /// Rebalances only move the partition to a process other than its
    /// member. A bound for searches of several processes from
    /// [`Start::Owned`] with one rebalance: one that gives the partition
    /// back to process 0 (a new generation) leaves every other process
    /// idle for good (nothing is assigned to it), so those runs are the
    /// runs of a search of process 0 alone with the same partitions,
    /// faults and horizon, which CI checks on its own.
    pub moves: bool,
    /// Crashes (a crashed process restarts at once, with a new id, and
    /// waits for the next rebalance).
    pub crashes: u8,
    /// Times a partition's committed offset is lost (retention).
    pub lost_commits: u8,
    /// Connections reset while an INSERT is in flight, before its timeout.
    pub resets: u8,
    /// Times the broker forgets a register entry (offset retention).
    pub forgets: u8,
    /// Times ClickHouse refuses a running INSERT of more than one row as
    /// holding too many table partitions (code 252), after storing the
    /// rows of its first blocks or none: the sink splits the batch.
    pub refusals: u8,
    /// Servers behind the one address (1 or 2): server `s`'s clock runs `s`
    /// seconds behind the first's (the assumption: they disagree by at most
    /// 1 s). The fence sees every server's queries and kills on each
    /// (`[clickhouse] cluster`).
    pub servers: u8,
    pub start: Start,
    /// Check liveness too: see [`Fair`]. `None`: safety only, and time may
    /// pass at any moment (any process may freeze, any message wait).
    pub fair: Option<Fair>,
}

/// Which partitions a fault that strikes one partition may strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Struck {
    /// The last: the others stay with their first owner unless it
    /// crashes, which keeps searches of several partitions within reach.
    /// With inserts that store all their rows or none, the model treats
    /// partitions alike but for the order of their rows in a batch, so a
    /// fault on the first partition alone mirrors one on the last.
    Last,
    /// Any of them (faults on several partitions, or on the first while
    /// rows of the last are in the batch after its rows).
    Any,
}

/// Liveness under fair scheduling once faults stop. Time passes only when
/// no process and no message can move (a process that can take a step
/// takes it within the second, a server answers within it), except for
/// `stalls` seconds in all; each of those, and each other fault, restarts
/// the count. Within `recovery` of the last fault, every record is in the
/// table once (or in the DLQ, or dropped as a duplicate of a stored key)
/// and the group's commit passes it. A crashed process rejoins the group
/// (a new generation). Waits that the sink times (a fence, a yield, a
/// settle, a lease) take their time; a backoff after a failed claim takes
/// none (the sink's take 0.5 s to 5 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fair {
    pub stalls: u8,
    pub recovery: Duration,
}

/// Where the search starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Start {
    /// Process 0 has just claimed every partition; nothing is stored.
    Owned,
    /// The last owner left cleanly, and the coordinator assigned every
    /// partition to both processes (a faulty coordinator can); the first
    /// is the member the next generation keeps.
    CleanToBoth,
    /// As `CleanToBoth`, but both keep it until a rebalance (an owner
    /// frozen or cut off from its coordinator can, for a session).
    SharedByBoth,
}

impl Bounds {
    /// The bounds CI checks.
    pub const CI: Bounds = Bounds {
        partitions: 1,
        struck: Struck::Last,
        records: 2,
        bad: 0,
        rejected: 0,
        keys: &[],
        processes: 2,
        max_rows: 2,
        horizon: Duration::from_secs(14),
        rebalances: 2,
        moves: false,
        crashes: 1,
        lost_commits: 1,
        resets: 1,
        forgets: 0,
        refusals: 0,
        servers: 1,
        start: Start::Owned,
        fair: None,
    };
}

/// The sink's settings in the model. `fence_wait` covers a previous
/// owner's lease and two insert timeouts plus one second (one tick of the
/// model's clock), but not the sink's [`FENCE_MARGIN`] for clocks that run
/// at different rates: the model's clocks run at one rate, and the tighter
/// fence reaches the interesting interleavings sooner. The lease term
/// follows from both, as in the sink.
///
/// [`FENCE_MARGIN`]: sluice_protocol::timing::FENCE_MARGIN
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Settings {
    pub insert_timeout: Duration,
    pub fence_wait: Duration,
    pub lease: Duration,
    /// How long a clean claim waits before it is read back.
    pub settle_wait: Duration,
    /// How far past an attempt's deadline the fence waits for servers that
    /// disagree ([`CLOCK_MARGIN_MS`]).
    ///
    /// [`CLOCK_MARGIN_MS`]: sluice_protocol::deadline::CLOCK_MARGIN_MS
    pub clock_margin_ms: i64,
}

impl Settings {
    /// `insert_timeout` 1 s, and a fence `slack` longer than the previous
    /// owner's lease and two insert timeouts (negative: shorter).
    pub fn with_slack(slack_s: i64) -> Self {
        use sluice_protocol::timing::{lease_term, MIN_LEASE, SETTLE_WAIT};
        let insert_timeout = Duration::from_secs(1);
        let covered = (MIN_LEASE + insert_timeout * 2).as_secs() as i64;
        let fence_wait = Duration::from_secs((covered + slack_s).max(0) as u64);
        Settings {
            insert_timeout,
            fence_wait,
            lease: lease_term(fence_wait, insert_timeout),
            settle_wait: SETTLE_WAIT,
            clock_margin_ms: sluice_protocol::deadline::CLOCK_MARGIN_MS,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::with_slack(1)
    }
}
