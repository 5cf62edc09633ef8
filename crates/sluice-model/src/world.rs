//! The state of the model: one partition, its readers and its table.
//!
//! Time is global and every clock reads it (the processes' monotonic
//! clocks and the server's); a process that is frozen or slow simply takes
//! no step while time passes, and messages wait as long as the search
//! likes. What can happen to the world on its own (time passing, an INSERT
//! arriving or committing, a rebalance, a crash, a lost commit) is here;
//! what a process does is in [`crate::sink`].

use crate::{Bounds, Rules, Settings};
use sluice_protocol::acks::Ticket;
use sluice_protocol::attempt::Answer;
use sluice_protocol::claim::{ClaimTimes, Start};
use sluice_protocol::deadline::{Fence, Millis, ServerClock};
use sluice_protocol::dedup::{KeyHash, KeyWindow};
use sluice_protocol::delivery::Delivery;
use sluice_protocol::lease::{Leases, Owner};
use sluice_protocol::resume::Committed;
use sluice_protocol::{AckTracker, Batch, BatchBuilder, NextOffset, Offset, Row};

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub now: Millis,
    pub group: Group,
    /// The register of owners' entry for the partition.
    pub register: Owner,
    /// A clean mark sent and not yet stored (the sink does not wait for it).
    pub mark_in_flight: bool,
    /// A process writing itself back into the register, not yet stored.
    pub rewrite_in_flight: Option<u64>,
    /// Copies of each offset in the table (a plain MergeTree: no dedup).
    pub table: Vec<u8>,
    pub inserts: Vec<Insert>,
    /// Copies of each offset the DLQ acknowledged (it is at-least-once).
    pub dlq: Vec<u8>,
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
    pub rows: Vec<Offset>,
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
    pub offset: Offset,
    /// When it was queued: with `from`, which batch it belongs to.
    pub sent: Millis,
}

/// One sink process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proc {
    /// Its id in the register; a restart takes a new one.
    pub id: u64,
    /// The last generation it heard of.
    pub heard: u64,
    /// Times the partition was taken from it since the group assigned it
    /// (`claim::taken_wait`).
    pub taken: u32,
    pub phase: Phase,
    pub clock: ServerClock<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    Claiming(Claim),
    Active(Box<Part>),
}

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

/// A partition this process writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Part {
    pub generation: u64,
    /// When it went active.
    pub since: Millis,
    pub leases: Leases<(), Millis>,
    /// Revoked; its insert finishes, then it hands off.
    pub leaving: bool,
    pub next: NextOffset,
    pub check_through: Option<Offset>,
    pub builder: BatchBuilder<Millis>,
    pub builder_uncertain: bool,
    pub acks: AckTracker,
    pub committed: Option<NextOffset>,
    pub job: Option<Job>,
    /// Writing this process back into a register that forgot it.
    pub rewrite: Rewrite,
    /// The key dedup window, on a route with key dedup.
    pub keys: Option<Keys>,
}

/// A partition's key dedup window, and the key of each record.
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

/// One batch on its way (the model keeps one per partition).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Job {
    /// The batch's way to the table: the sink's own machine.
    pub delivery: Delivery,
    pub ticket: Ticket,
    pub wait: Wait,
    /// Its records queued for the DLQ and not yet acknowledged.
    pub letters: Vec<Offset>,
    /// When they were queued.
    pub letters_sent: Millis,
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
            if let Phase::Active(part) = &mut p.phase {
                part.leases.normalize(self.now);
                // Never taken: when it went active decides nothing.
                if p.taken == 0 {
                    part.since = Millis(0);
                }
            }
        }
    }

    pub fn new(b: &Bounds) -> Self {
        let procs = (0..b.processes)
            .map(|i| Proc {
                id: i as u64 + 1,
                heard: 0,
                taken: 0,
                phase: Phase::Idle,
                clock: server_clock(),
            })
            .collect();
        World {
            now: Millis(0),
            group: Group {
                generation: 1,
                member: Some(0),
                shared: false,
                committed: None,
            },
            register: Owner::Nobody,
            mark_in_flight: false,
            rewrite_in_flight: None,
            table: vec![0; b.records as usize],
            inserts: Vec::new(),
            dlq: vec![0; b.records as usize],
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
    pub fn land_letter(&mut self, i: usize, rules: &Rules) {
        let l = self.letters.remove(i);
        self.dlq[l.offset.0 as usize] += 1;
        if let Some(part) = self.part_of(l.from) {
            crate::sink::on_letter(part, &l, rules);
        }
    }

    /// The partition of the process with id `from`, if it is active.
    pub fn part_of(&mut self, from: u64) -> Option<&mut Part> {
        self.procs.iter_mut().find_map(|p| match &mut p.phase {
            Phase::Active(part) if p.id == from => Some(&mut **part),
            _ => None,
        })
    }

    /// The highest offset in the table.
    pub fn watermark(&self) -> Option<Offset> {
        (0..self.table.len())
            .rev()
            .find(|&o| self.table[o] > 0)
            .map(|o| Offset(o as i64))
    }

    /// The offsets of `batch` the table holds.
    pub fn present(&self, batch: &Batch) -> Vec<Row> {
        batch
            .rows()
            .filter(|r| self.table[r.offset.0 as usize] > 0)
            .collect()
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
    pub fn answer(&mut self, i: usize, answer: Answer, rules: &Rules) -> Insert {
        let ins = self.inserts.remove(i);
        let now = self.now;
        if let Some(part) = self.part_of(ins.from) {
            crate::sink::on_answer(part, &ins, answer, now, rules);
        }
        ins
    }
}
