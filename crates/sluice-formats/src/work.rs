//! What the decoders did, tallied per thread for the tests' cost bounds,
//! which count work instead of timing it: steps (bytes scanned, messages
//! entered, fields and types looked at) and comparisons (of a sort or a
//! duplicate check).
//!
//! In: [`step`] and [`compared`], called where the work is done. Out, in
//! tests only: [`of`], the tallies of one call. Outside tests both are
//! empty functions, so the production path pays nothing. Tests run on
//! threads of their own, so no other test's work mixes in.

#[cfg(test)]
use std::cell::Cell;

#[cfg(test)]
thread_local! {
    static STEPS: Cell<u64> = const { Cell::new(0) };
    static COMPARED: Cell<u64> = const { Cell::new(0) };
}

/// `n` steps of work.
#[cfg(test)]
pub(crate) fn step(n: usize) {
    STEPS.with(|c| c.set(c.get() + n as u64));
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn step(_: usize) {}

/// `n` comparisons.
#[cfg(test)]
pub(crate) fn compared(n: usize) {
    COMPARED.with(|c| c.set(c.get() + n as u64));
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn compared(_: usize) {}

/// The work of one call on this thread.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    pub steps: u64,
    pub compared: u64,
}

/// What `f` returns, and the work it did.
#[cfg(test)]
pub(crate) fn of<T>(f: impl FnOnce() -> T) -> (T, Work) {
    let (steps, compared) = (STEPS.with(Cell::get), COMPARED.with(Cell::get));
    let out = f();
    let work = Work {
        steps: STEPS.with(Cell::get) - steps,
        compared: COMPARED.with(Cell::get) - compared,
    };
    (out, work)
}
