//! The state of the model: a topic's partitions, their readers and the
//! table they are written to.
//!
//! Time is global and every clock reads it (the processes' monotonic
//! clocks and the server's); a process that is frozen or slow simply takes
//! no step while time passes, and messages wait as long as the search
//! likes. What can happen to the world on its own (time passing, an INSERT
//! arriving or committing, a rebalance, a crash, a lost commit) is here;
//! what a process does is in [`crate::sink`].

use crate::{Bounds, KeyDrop, RejectedKey, Settings};
use sluice_protocol::acks::Ticket;
use sluice_protocol::attempt::Answer;
use sluice_protocol::claim::{ClaimTimes, Start};
use sluice_protocol::deadline::{Fence, Millis, ServerClock};
use sluice_protocol::dedup::{KeyHash, KeyWindow, Seen, Verdict, Window};
use sluice_protocol::delivery::Delivery;
use sluice_protocol::lease::{Leases, Owner};
use sluice_protocol::machine::{Held, Machine};
use sluice_protocol::resume::Committed;
use sluice_protocol::{Batch, NextOffset, Offset, Row};
use std::sync::Arc;

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub now: Millis,
    /// Each partition of the topic: its group assignment, its register
    /// entry and its rows in the table.
    pub parts: Vec<Partition>,
    /// A process writing itself back into a partition's register entry,
    /// not yet stored: its id and the partition.
    pub rewrite_in_flight: Option<(u64, usize)>,
    pub inserts: Vec<Insert>,
    /// DLQ writes not yet stored (the producer retries without end; a
    /// crashed process's may still land).
    pub letters: Vec<Letter>,
    pub procs: Vec<Proc>,
    /// Faults left to inject.
    pub left: Faults,
    /// Process ids handed out so far.
    pub ids: u64,
    /// When the last fault happened (only tracked when the search checks
    /// liveness).
    pub last_fault: Millis,
}

/// One partition of the topic, as the world outside the processes sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Partition {
    pub group: Group,
    /// The register of owners' entry for the partition.
    pub register: Owner,
    /// A clean mark sent and not yet stored (the sink does not wait for it).
    pub mark_in_flight: bool,
    /// Copies of each offset in the table (a plain MergeTree: no dedup).
    pub table: Vec<u8>,
    /// Copies of each offset the DLQ acknowledged (it is at-least-once).
    pub dlq: Vec<u8>,
}

/// The group coordinator's view of the partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    pub generation: u64,
    pub member: Option<usize>,
    /// The coordinator also assigns it to every other process, until the
    /// next rebalance: what each process believes when the old owner was
    /// cut off or frozen and has not heard of the move yet.
    pub shared: bool,
    pub committed: Option<NextOffset>,
}

impl Group {
    /// Whether process `p` is assigned the partition.
    pub fn assigned(&self, p: usize) -> bool {
        self.shared || self.member == Some(p)
    }

    pub fn committed(&self) -> Committed {
        self.committed.map_or(Committed::Nothing, Committed::At)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Faults {
    pub rebalances: u8,
    pub crashes: u8,
    pub lost_commits: u8,
    pub resets: u8,
    pub forgets: u8,
    pub refusals: u8,
    /// Seconds that pass while a process or a message could have moved
    /// (a freeze, a slow server, a message held); only counted when the
    /// search checks liveness ([`crate::Bounds::fair`]).
    pub stalls: u8,
}

/// An INSERT on its way to ClickHouse or running there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Insert {
    /// The process id that sent it.
    pub from: u64,
    pub query_id: String,
    pub rows: Vec<Row>,
    /// Refused if it starts after this (server ms), if set.
    pub deadline_ms: Option<i64>,
    /// When it was sent: with `from` and `query_id`, which request it
    /// answers (a process that restarts a partition may send the same
    /// query id again).
    pub sent: Millis,
    /// When it started running; `None` while on the way.
    pub running_since: Option<Millis>,
}

/// A record on its way to the DLQ.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Letter {
    /// The process id that sent it.
    pub from: u64,
    pub row: Row,
    /// When it was queued: with `from`, which batch it belongs to.
    pub sent: Millis,
}

/// One sink process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proc {
    /// Its id in the register; a restart takes a new one.
    pub id: u64,
    /// Per partition: the last generation it heard of.
    pub heard: Vec<u64>,
    /// The partitions it holds, claiming or written, and the times each
    /// was taken from it: the sink's own machine.
    pub parts: Parts,
    /// The batch on its way: rows of one or more of its partitions.
    pub job: Option<Arc<Job>>,
    pub clock: ServerClock<Millis>,
}

/// The partitions a process holds (the sink's own
/// [`sluice_protocol::machine::Machine`]), by partition index.
pub type Parts = Machine<usize, Millis, Keys, Side>;

/// A partition a process holds (claiming, written, or leaving).
pub type Part = Held<Millis, Keys, Side>;

/// A partition being prepared: the group's commit as last read, and the
/// claim ([`sluice_protocol::claim::Claim`], the sink's own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim {
    pub generation: u64,
    pub committed: Committed,
    pub claim: sluice_protocol::claim::Claim<(), Millis>,
}

impl Claim {
    pub fn new(
        me: u64,
        generation: u64,
        committed: Committed,
        s: &Settings,
        start: Start<Millis>,
    ) -> Self {
        let times = ClaimTimes {
            fence_wait: s.fence_wait,
            settle_wait: s.settle_wait,
        };
        Claim {
            generation,
            committed,
            claim: sluice_protocol::claim::Claim::new(vec![()], me, times, start),
        }
    }
}

impl Claim {
    /// Whether the claim reads the group's commits again before it next
    /// reads the register: it is about to, or it waits (a backoff, or a
    /// wait after a taking or a yield, which all end in `ReadCommits`).
    /// A fence's wait does not (its read again may activate), nor a
    /// settle's (its read back may).
    pub fn reads_commits_again(&self) -> bool {
        use sluice_protocol::claim::{Do, Why};
        match self.claim.next() {
            Do::ReadCommits | Do::Backoff | Do::Done => true,
            Do::Wait { why, .. } => matches!(why, Why::Taken { .. } | Why::Yield),
            Do::Read | Do::Write => false,
        }
    }
}

/// What the model keeps beside each partition a process holds (the
/// machine's [`Held::core`] is the sink's own
/// [`sluice_protocol::partition::Partition`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Side {
    /// Its claim, while it is being prepared.
    pub claim: Option<Claim>,
    /// Its lease, once active.
    pub leases: Leases<(), Millis>,
    /// Writing this process back into a register that forgot it.
    pub rewrite: Rewrite,
}

/// A partition's key dedup window, under the model's [`crate::Rules`].
///
/// Two windows compare equal when the same copy stands for each key: the
/// records carry no timestamps (the stream time stays where it started) and
/// nothing outlives the window or its cap, so that decides every later
/// answer.
#[derive(Debug, Clone)]
pub struct Keys {
    pub window: KeyWindow,
    /// The key of each record (`Bounds::keys`).
    pub of: &'static [u8],
    pub drop: KeyDrop,
    pub rejected: RejectedKey,
}

impl Keys {
    /// The window of a route with key dedup: a week, and room for every key.
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);
    pub const MAX_KEYS: usize = 1 << 10;

    /// The key of the record at `o`.
    pub fn key(&self, o: Offset) -> KeyHash {
        KeyHash::from(self.of[o.0 as usize])
    }

    fn copies(&self) -> impl Iterator<Item = Option<Offset>> + '_ {
        self.of
            .iter()
            .map(|&k| self.window.copy_of(KeyHash::from(k)))
    }
}

impl Window for Keys {
    fn decide(
        &mut self,
        key: KeyHash,
        ts_ms: Option<i64>,
        offset: Offset,
        settled: NextOffset,
    ) -> Verdict {
        match self.drop {
            KeyDrop::SettledCopy => self.window.decide(key, ts_ms, offset, settled),
            KeyDrop::AnyCopy => match self.window.check(key, ts_ms, offset) {
                Seen::New => Verdict::Write,
                Seen::Duplicate { .. } => Verdict::Drop,
            },
        }
    }

    fn forget(&mut self, key: KeyHash, offset: Offset) {
        if self.rejected == RejectedKey::Forget {
            self.window.forget(key, offset);
        }
    }
}

impl PartialEq for Keys {
    fn eq(&self, other: &Self) -> bool {
        self.of == other.of && self.copies().eq(other.copies())
    }
}

impl Eq for Keys {}

impl std::hash::Hash for Keys {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        for c in self.copies() {
            c.hash(h);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rewrite {
    No,
    /// A renewal read found the entry forgotten while the lease was live.
    Decided,
    /// The write is on its way.
    Sent,
    /// The write is stored; its acknowledgement is on its way.
    Stored,
}

/// One batch on its way (the model keeps one per process): rows of one or
/// more partitions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Job {
    /// The batch's way to the table: the sink's own machine.
    pub delivery: Delivery,
    /// Per partition it still holds rows of: the partition, the
    /// generation that cut them and their ticket in its acks.
    pub tickets: Vec<(usize, u64, Ticket)>,
    pub wait: Wait,
    /// Its records queued for the DLQ and not yet acknowledged.
    pub letters: Vec<Row>,
    /// When they were queued.
    pub letters_sent: Millis,
}

impl Job {
    /// Whether it holds rows of partition `q`.
    pub fn holds(&self, q: usize) -> bool {
        self.tickets.iter().any(|t| t.0 == q)
    }
}

/// What a job waits for besides what its [`Delivery`] decides.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Wait {
    /// Its delivery's next step.
    Ready,
    /// Fencing the last unsettled attempt.
    Fencing(Fence),
    /// Fenced; reconciliation is next.
    Fenced,
    /// Its rows are durable; the DLQ has not acknowledged every letter.
    Letters,
    /// Attempt sent at this time, no answer yet.
    InFlight { sent: Millis },
}

/// The server's clock as a process reads it: the same as the process's own
/// (a reading at 0 that said 0, with no round trip).
pub fn server_clock() -> ServerClock<Millis> {
    let mut c = ServerClock::default();
    c.observe(0, Millis(0), Millis(0), true);
    c
}

impl World {
    /// Forgets what no longer matters (when an expired lease expired, when
    /// a partition never taken went active), so that states that differ
    /// only in it compare equal.
    pub fn normalize(&mut self) {
        for p in &mut self.procs {
            let keys: Vec<usize> = p.parts.iter().map(|(q, _)| *q).collect();
            for q in keys {
                let Some(part) = p.parts.get(&q) else {
                    continue;
                };
                // Shared with the state before until it changes.
                let mut leases = part.extra.leases.clone();
                leases.normalize(self.now);
                let leases = (leases != part.extra.leases).then_some(leases);
                // Never taken: when it went active decides nothing.
                let never_taken = p.parts.takings(&q) == 0;
                let since = part.since.filter(|&s| never_taken && s != Millis(0));
                // The group's commit as last read is read again before the
                // claim's next read of the register: every way to
                // `activate` (`Do::Read`, or `Do::Write` under
                // `ClaimConfirm::TrustWrite`) passes `Do::ReadCommits` from
                // here, so the old value decides nothing.
                let forget =
                    part.extra.claim.as_ref().is_some_and(|c| {
                        c.reads_commits_again() && c.committed != Committed::Nothing
                    });
                if leases.is_none() && since.is_none() && !forget {
                    continue;
                }
                let Some(part) = p.parts.get_mut(&q) else {
                    continue;
                };
                if let Some(leases) = leases {
                    part.extra.leases = leases;
                }
                if since.is_some() {
                    part.since = Some(Millis(0));
                }
                if let Some(c) = part.extra.claim.as_mut().filter(|_| forget) {
                    c.committed = Committed::Nothing;
                }
            }
        }
    }

    pub fn new(b: &Bounds) -> Self {
        let n = b.partitions;
        let procs = (0..b.processes)
            .map(|i| Proc {
                id: i as u64 + 1,
                heard: vec![0; n],
                parts: Parts::new(),
                job: None,
                clock: server_clock(),
            })
            .collect();
        let part = Partition {
            group: Group {
                generation: 1,
                member: Some(0),
                shared: false,
                committed: None,
            },
            register: Owner::Nobody,
            mark_in_flight: false,
            table: vec![0; b.records as usize],
            dlq: vec![0; b.records as usize],
        };
        World {
            now: Millis(0),
            parts: vec![part; n],
            rewrite_in_flight: None,
            inserts: Vec::new(),
            letters: Vec::new(),
            procs,
            left: Faults {
                rebalances: b.rebalances,
                crashes: b.crashes,
                lost_commits: b.lost_commits,
                resets: b.resets,
                forgets: b.forgets,
                refusals: b.refusals,
                stalls: b.fair.map_or(0, |f| f.stalls),
            },
            ids: b.processes as u64,
            last_fault: Millis(0),
        }
    }

    /// Server `s`'s clock (Unix ms): the global time, `s` seconds behind.
    pub fn server_ms(&self, s: u8) -> i64 {
        self.now.0 as i64 - 1000 * i64::from(s)
    }

    /// Stores letter `i` in the DLQ and hands the acknowledgement to its
    /// sender, if it still waits for it.
    pub fn land_letter(&mut self, i: usize) {
        let l = self.letters.remove(i);
        self.parts[l.row.partition as usize].dlq[l.row.offset.0 as usize] += 1;
        if let Some(proc) = self.proc_of(l.from) {
            crate::sink::on_letter(proc, &l);
        }
    }

    /// The process with id `from`, if it still runs.
    pub fn proc_of(&mut self, from: u64) -> Option<&mut Proc> {
        self.procs.iter_mut().find(|p| p.id == from)
    }

    /// The highest offset of partition `q` in the table.
    pub fn watermark(&self, q: usize) -> Option<Offset> {
        let table = &self.parts[q].table;
        (0..table.len())
            .rev()
            .find(|&o| table[o] > 0)
            .map(|o| Offset(o as i64))
    }

    /// Copies of `row` in the table.
    pub fn copies(&self, row: Row) -> u8 {
        self.parts[row.partition as usize].table[row.offset.0 as usize]
    }

    /// The rows of `batch` the table holds.
    pub fn present(&self, batch: &Batch) -> Vec<Row> {
        batch.rows().filter(|&r| self.copies(r) > 0).collect()
    }

    /// Queries with this id running now (`system.processes`).
    pub fn running(&self, query_id: &str) -> u64 {
        self.inserts
            .iter()
            .filter(|i| i.running_since.is_some() && i.query_id == query_id)
            .count() as u64
    }

    /// Hands the answer to insert `i` to its sender, if it still waits for
    /// it, and removes the insert.
    pub fn answer(&mut self, i: usize, answer: Answer) -> Insert {
        let ins = self.inserts.remove(i);
        let now = self.now;
        if let Some(proc) = self.proc_of(ins.from) {
            crate::sink::on_answer(proc, &ins, answer, now);
        }
        ins
    }
}
