//! What the scheduler is told about one request, and what it answers.

/// The caller's name for a request. The scheduler only hands it back (from `poll`, which
/// does not say whose it is), so it must be unique across all connections among the
/// requests held at once: a connection's number and its slot, say.
pub type Id = u64;

/// Time as the caller passes it in: nanoseconds since an origin of its choosing (the
/// server's start, say), never going backwards.
pub type Nanos = u64;

/// What kind of request it is, for the read and write limits. `Other` (flush, trim, zero,
/// cache, block status) counts against `iops` and, for the bytes given, `bps` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Other,
}

/// The answer to a submitted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Start it now: its cost is already counted.
    Start,
    /// It waits in its class's queue; `poll` hands its id out when it may start.
    Held,
}

/// What a limit or reservation counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Ops,
    Bytes,
}

/// Which requests a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    All,
    Reads,
    Writes,
}

impl Applies {
    pub fn covers(self, op: Op) -> bool {
        match self {
            Applies::All => true,
            Applies::Reads => op == Op::Read,
            Applies::Writes => op == Op::Write,
        }
    }
}

impl Dim {
    /// How many of this dimension's units a request of `bytes` uses.
    pub fn units(self, bytes: u64) -> u64 {
        match self {
            Dim::Ops => 1,
            Dim::Bytes => bytes,
        }
    }
}
