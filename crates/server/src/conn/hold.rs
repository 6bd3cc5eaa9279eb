//! Load restriction (issue 27): a valid request whose payload has arrived goes to the QoS
//! scheduler before the storage. It starts at once, or it is held, still counted in the
//! connection's slot and byte budgets (so intake stops reading at the budget and held
//! requests stay bounded), until the scheduler lets it go through the worker. The
//! scheduler is told when the request's last storage operation is done.

use std::time::Instant;

use sluice_proto::Command;
use sluice_qos::{Op, Verdict};

use super::state::Hold;
use super::{Conn, Env};
use crate::qos::Port;

impl Conn {
    /// Sends this connection's requests through the QoS scheduler from now on.
    pub fn restrict(&mut self, port: Port) {
        self.qos = Some(port);
    }

    /// Starts a validated request whose payload has arrived, or holds it.
    pub(super) fn admit(&mut self, env: &mut Env, slot: u16) {
        let (op, bytes) = cost(self.slot(slot).request.command);
        let Some(port) = &self.qos else { return self.dispatch(env, slot) };
        match port.submit(env.now, slot, op, bytes) {
            Verdict::Start => {
                self.slot_mut(slot).hold = Hold::Started;
                self.dispatch(env, slot);
            }
            Verdict::Held => self.slot_mut(slot).hold = Hold::Held(env.now),
        }
    }

    /// The scheduler let the request of `slot` go. False when no request is held there
    /// (the connection dropped it): the caller tells the scheduler it never started.
    pub fn handle_qos_start(&mut self, env: &mut Env, slot: u16) -> bool {
        let Some(Hold::Held(since)) = self.slots.get(slot as usize).and_then(Option::as_ref).map(|s| s.hold) else {
            return false;
        };
        if let Some(port) = &self.qos {
            port.released(env.now.saturating_duration_since(since).as_nanos() as u64, self.slot(slot).bytes as u64);
        }
        self.slot_mut(slot).hold = Hold::Started;
        if self.is_broken() {
            // Nobody would read the answer.
            self.storage_over(env.now, slot);
            self.release_if_idle(env, slot);
        } else {
            self.dispatch(env, slot);
        }
        self.pump_output(env);
        true
    }

    /// The request of `slot` is done with the storage, or will never reach it.
    pub(super) fn storage_over(&mut self, now: Instant, slot: u16) {
        let s = self.slot_mut(slot);
        if s.hold != Hold::Started {
            return;
        }
        s.hold = Hold::Off;
        if let Some(port) = &self.qos {
            port.finished(now);
        }
    }

    /// After a storage outcome: the request is done with the storage once nothing of it is
    /// there and nothing more will go (a read's last chunk, a command's last step).
    pub(super) fn storage_maybe_over(&mut self, now: Instant, slot: u16) {
        let Some(s) = self.slots[slot as usize].as_ref() else { return };
        let more = if s.is_read() { s.chunks_left > 0 } else { s.exec.is_some() };
        if s.hold == Hold::Started && s.ops == 0 && !more {
            self.storage_over(now, slot);
        }
    }

    /// The connection is going: its held requests are dropped and their budgets given
    /// back, then it leaves its class instance. A request the scheduler let go just now
    /// is on its way to the worker, which finds the connection gone and says so.
    pub fn unrestrict(&mut self, env: &mut Env) {
        let Some(port) = self.qos.take() else { return };
        for slot in 0..self.slots.len() as u16 {
            if let Some(Hold::Held(_)) = self.slots[slot as usize].as_ref().map(|s| s.hold) {
                port.remove(env.now, slot);
                self.slot_mut(slot).hold = Hold::Off;
                self.release(env, slot);
            }
        }
        port.detach(env.now);
    }
}

/// What the scheduler counts of a request: reads and writes their length, the rest one
/// operation without bytes.
fn cost(command: Command) -> (Op, u64) {
    match command {
        Command::Read { range, .. } => (Op::Read, range.length),
        Command::Write { range, .. } => (Op::Write, range.length),
        _ => (Op::Other, 0),
    }
}
