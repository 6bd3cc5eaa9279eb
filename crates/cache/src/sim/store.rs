//! The simulated backing and members: byte arrays. A member applies an operation when it
//! completes; the backing at a random time between its start and its completion (so a
//! read may see a write that completes after it, or miss one that completed before it
//! did). Each operation is due at a random time, so completions arrive out of order.

use crate::api::{BackingCmd, MemberCmd, Nanos, OpId, Outcome};

/// Where an operation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Backing,
    /// A member, in the epoch (incarnation) the operation was sent to.
    Member { member: usize, epoch: u64 },
}

#[derive(Clone, Debug)]
pub enum Cmd {
    Backing(BackingCmd),
    Member(MemberCmd),
}

pub struct InFlight {
    pub op: OpId,
    pub target: Target,
    pub cmd: Cmd,
    /// When a backing operation takes effect (a read takes its bytes, a write lands): any
    /// time from its start to its completion, as a real backing may.
    pub lands: Nanos,
    /// What it did when it took effect, until its completion reports it.
    pub landed: Option<Outcome>,
    /// The client write (by model id) a backing write, zero or trim carries out.
    pub write: Option<usize>,
    pub due: Nanos,
}

pub struct Member {
    pub bytes: Vec<u8>,
    pub alive: bool,
    /// Operations never complete while hung (until the core times them out).
    pub hung: bool,
    pub epoch: u64,
}

impl Member {
    /// Comes back with `slots` slots: empty after a restart, or (`keep`: only the
    /// connection was lost) still holding what it held, slots of this gateway's fills that
    /// it has forgotten.
    pub fn restart(&mut self, slots: u64, slot_bytes: u64, keep: bool) {
        if !keep {
            self.bytes.clear();
        }
        self.bytes.resize((slots * slot_bytes) as usize, 0);
        self.alive = true;
        self.hung = false;
        self.epoch += 1;
    }
}

/// Carries out `cmd` on `bytes` and says what the shell would report.
pub fn apply(bytes: &mut [u8], cmd: &Cmd) -> Outcome {
    let range = |offset: u64, len: u64| offset as usize..(offset + len) as usize;
    match cmd {
        Cmd::Backing(BackingCmd::Read { offset, len }) | Cmd::Member(MemberCmd::Read { offset, len }) => {
            bytes.get(range(*offset, *len)).map(<[u8]>::to_vec).ok_or_else(|| "read past the end".into())
        }
        Cmd::Backing(BackingCmd::Write { offset, data, .. }) | Cmd::Member(MemberCmd::Write { offset, data }) => {
            let to = bytes.get_mut(range(*offset, data.len() as u64)).ok_or("write past the end")?;
            to.copy_from_slice(data);
            Ok(Vec::new())
        }
        // A member's trim reads back as zeroes, as a RAM export's does.
        Cmd::Backing(BackingCmd::Zero { offset, len, .. } | BackingCmd::Trim { offset, len, .. })
        | Cmd::Member(MemberCmd::Trim { offset, len }) => {
            bytes.get_mut(range(*offset, *len)).ok_or("zero past the end")?.fill(0);
            Ok(Vec::new())
        }
        Cmd::Backing(BackingCmd::Flush) => Ok(Vec::new()),
    }
}
