//! Executing a valid request against the export's backend: READ goes to the read pipeline,
//! BLOCK_STATUS asks for extents, and every other command runs through the backend's
//! emulation layer, one storage operation at a time.

use sluice_proto::Command;

use super::{Conn, Env, Io};
use crate::backend::emulate::{Exec, Failure, Step};
use crate::backend::StorageOp;
use crate::engine::{Held, Tag};
use crate::errors::errno_from_os;

impl Conn {
    /// Starts a validated request whose payload (if any) has arrived.
    pub(super) fn dispatch(&mut self, env: &mut Env, slot: u16) {
        let command = self.slot(slot).request.command;
        match command {
            Command::Read { range, .. } => self.start_read(env, slot, range.offset, range.length as usize),
            Command::BlockStatus { range, one, .. } => {
                let mut out = self.spare_extents.pop().unwrap_or_default();
                out.clear();
                self.submit(env, slot, 0, StorageOp::Extents { offset: range.offset, len: range.length, one, out });
            }
            _ => {
                let buf = self.slot_mut(slot).buf.take();
                let mut exec = Exec::new(command, buf, self.caps, self.direct_align);
                let step = exec.start(env.pool);
                self.slot_mut(slot).exec = Some(exec);
                self.step(env, slot, step);
            }
        }
    }

    /// Hands one storage operation of a slot to the driver.
    pub(super) fn submit(&mut self, env: &mut Env, slot: u16, chunk: usize, op: StorageOp) {
        let s = self.slot_mut(slot);
        s.ops += 1;
        s.times.storage_start.get_or_insert(env.now);
        self.emit(Io::Storage { tag: Tag { slot, chunk: chunk as u16 }, op });
    }

    /// A storage operation of a command other than READ came back.
    pub(super) fn storage_done(&mut self, env: &mut Env, slot: u16, result: i32, held: Held) {
        if let Command::BlockStatus { context_id, .. } = self.slot(slot).request.command {
            return self.extents_done(env, slot, context_id, result, held);
        }
        if self.is_broken() {
            // Nobody will read the answer; the held buffer goes back to the pool here.
            drop(held);
            return self.release_if_idle(env, slot);
        }
        let Some(mut exec) = self.slot_mut(slot).exec.take() else {
            debug_assert!(false, "a storage outcome for a command that is not running");
            return;
        };
        let step = exec.complete(env.pool, result, held);
        self.slot_mut(slot).exec = Some(exec);
        self.step(env, slot, step);
    }

    fn step(&mut self, env: &mut Env, slot: u16, step: Step) {
        if !matches!(step, Step::Submit(_)) {
            // Finished: the write's buffer goes back to the pool now, not when the reply has
            // been sent.
            self.slot_mut(slot).exec = None;
        }
        match step {
            Step::Submit(op) => self.submit(env, slot, 0, op),
            Step::Done => self.reply_ok(env, slot),
            Step::Fail(Failure { errno, message, offset }) => {
                log::debug!("{}: {:?} failed: {message}", self.peer, self.slot(slot).request.command);
                self.reply_error(env, slot, errno, &message, offset);
            }
        }
    }

    fn extents_done(&mut self, env: &mut Env, slot: u16, context_id: u32, result: i32, held: Held) {
        let Held::Extents(extents) = held else {
            debug_assert!(false, "a backend did not return the extents list");
            return self.reply_error(env, slot, sluice_proto::Errno::Io, "block status failed", None);
        };
        if self.is_broken() {
            self.spare_extents.push(extents);
            return self.release_if_idle(env, slot);
        }
        if result < 0 {
            self.reply_error(env, slot, errno_from_os(-result), "block status failed", None);
        } else {
            self.reply_block_status(env, slot, context_id, &extents);
        }
        self.spare_extents.push(extents);
    }
}
