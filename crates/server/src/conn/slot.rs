//! Slot accounting: taking a slot for a request, counting its bytes against the budgets,
//! and releasing it exactly once, when its last operation has returned and its last reply
//! part has left, recording it in the metrics.

use sluice_proto::Command;

use super::state::{Hold, Slot};
use super::{Conn, Env};
use crate::metrics;

fn metrics_op(command: Command) -> metrics::Op {
    match command {
        Command::Read { .. } => metrics::Op::Read,
        Command::Write { .. } => metrics::Op::Write,
        Command::Flush | Command::Disconnect => metrics::Op::Flush,
        Command::Trim { .. } => metrics::Op::Trim,
        Command::WriteZeroes { .. } => metrics::Op::WriteZeroes,
        Command::Cache { .. } => metrics::Op::Cache,
        Command::BlockStatus { .. } => metrics::Op::BlockStatus,
    }
}

impl Conn {
    pub(super) fn slot_mut(&mut self, slot: u16) -> &mut Slot {
        self.slots[slot as usize].as_mut().expect("an operation's slot stays live until it returns")
    }

    pub(super) fn slot(&self, slot: u16) -> &Slot {
        self.slots[slot as usize].as_ref().expect("an operation's slot stays live until it returns")
    }

    /// Takes a free slot for a request; the caller checked that one is free.
    pub(super) fn occupy(&mut self, slot: Slot) -> u16 {
        let index = self.free_slots.pop().expect("admission checks for a free slot");
        self.slots[index as usize] = Some(slot);
        index
    }

    /// Counts a read's or write's payload against the connection's and the worker's budgets.
    pub(super) fn hold_bytes(&mut self, env: &mut Env, slot: u16, bytes: usize) {
        self.slot_mut(slot).bytes = bytes;
        self.inflight_bytes += bytes;
        env.budget.take(bytes);
    }

    pub(super) fn release_if_idle(&mut self, env: &mut Env, slot: u16) {
        let broken = self.is_broken();
        let s = self.slot(slot);
        if s.ops == 0 && s.parts == 0 && (s.final_queued || broken) {
            self.release(env, slot);
        }
    }

    /// Frees a slot: its chunks, its bytes, its place in the reply order; records it.
    pub(super) fn release(&mut self, env: &mut Env, slot: u16) {
        debug_assert!(!matches!(self.slot(slot).hold, Hold::Held(_)), "a held request is dropped through unrestrict");
        self.storage_over(env.now, slot);
        // Chunks never sent (after an error or a failed connection) give back their buffers.
        self.chunks[slot as usize].clear();
        self.stream_waiters.retain(|&w| w != slot);
        if self.streaming == Some(slot) {
            self.streaming = None;
        }
        let s = self.slots[slot as usize].take().expect("a released slot was live");
        if s.storage_read {
            self.reads_in_flight -= 1;
        }
        self.inflight_bytes -= s.bytes;
        env.budget.give(s.bytes);
        self.free_slots.push(slot);
        if s.slow {
            self.slow_request_ended(&s, env.now);
        }
        if s.rejection.is_none() {
            let ok = !s.failed && !self.is_broken();
            let bytes = if ok { s.bytes as u64 } else { 0 };
            let op = metrics_op(s.request.command);
            match op {
                metrics::Op::Read => self.bytes_read += bytes,
                metrics::Op::Write => self.bytes_written += bytes,
                _ => {}
            }
            self.metrics.record(self.metrics_export, op, &s.times.phases(env.now), bytes, ok);
            if let Command::Write { fua: true, .. } | Command::Trim { fua: true, .. } | Command::WriteZeroes { fua: true, .. } =
                s.request.command
            {
                self.metrics.record_fua(self.metrics_export, op);
            }
            self.metrics.request_finished(self.metrics_export);
        }
    }
}
