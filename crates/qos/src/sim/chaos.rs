//! The simulation's random runs: random classes, caps, clients and storage, with
//! reconfigurations (refused ones too), closed connections and reconnections on the way.

use super::gen::{self, chance, range};
use super::storage::Storage;
use super::{watch, Rng, State, World, SEC};

const MS: u64 = SEC / 1000;

impl World {
    pub(super) fn chaos(&mut self) -> Result<(), String> {
        self.chaos_at = Some(self.now + range(&mut self.rng, 50, 1500) * MS);
        match self.rng.below(10) {
            0..=3 => self.reconfigure_random(),
            4..=6 => {
                let open: Vec<usize> = (0..self.clients.len()).filter(|&c| self.clients[c].open.is_some()).collect();
                match open.len() {
                    0 => Ok(()),
                    n => {
                        let c = open[self.rng.below(n as u64) as usize];
                        self.close(c)
                    }
                }
            }
            _ => Ok(()),
        }
    }

    fn reconfigure_random(&mut self) -> Result<(), String> {
        if chance(&mut self.rng, 20) {
            let mut bad = self.classes.clone();
            bad.values_mut().next().expect("a class").weight = 0;
            if self.sched.reconfigure(self.now, bad, self.limits).is_ok() {
                return Err("a class of weight 0 was taken".into());
            }
        }
        let mut classes = self.classes.clone();
        let mut limits = self.limits;
        let names: Vec<String> = classes.keys().cloned().collect();
        let pick = names[self.rng.below(names.len() as u64) as usize].clone();
        match self.rng.below(4) {
            0 => _ = classes.insert(pick, gen::class(&mut self.rng)),
            1 if names.len() > 1 => _ = classes.remove(&pick),
            2 => _ = classes.insert(format!("c{}", range(&mut self.rng, 0, 6)), gen::class(&mut self.rng)),
            _ => limits = gen::limits(&mut self.rng),
        }
        self.sched.reconfigure(self.now, classes.clone(), limits).map_err(|e| format!("refused a valid configuration: {e}"))?;
        self.log.push(format!("{} reconfigured: {classes:?} {limits:?}", self.now));
        self.classes = classes;
        self.limits = limits;
        // A new epoch for the watches: buckets keep at most a full burst across it.
        self.watches.clear();
        self.node_watches = watch::node_watches(&limits);
        Ok(())
    }

    /// A connection closes: its held requests are removed (and never start), what it has at
    /// the storage finishes there; it reconnects a little later.
    fn close(&mut self, c: usize) -> Result<(), String> {
        let (h, _) = self.clients[c].open.take().expect("an open client");
        let mine: Vec<(u64, State)> = self.reqs.iter().filter(|(_, r)| r.client == c && r.state != State::Removed).map(|(&id, r)| (id, r.state)).collect();
        if chance(&mut self.rng, 50) {
            return self.close_all(c, h, &mine);
        }
        for (id, state) in mine {
            let removed = self.sched.remove(h, id, self.now);
            if removed != (state == State::Held) {
                return Err(format!("remove({id}) of a {state:?} request said {removed}"));
            }
            if removed {
                self.reqs.get_mut(&id).expect("listed").state = State::Removed;
                self.clients[c].outstanding -= 1;
            }
        }
        self.closed(c, h);
        Ok(())
    }

    /// The same with one `remove_all` for the connection's held requests.
    fn close_all(&mut self, c: usize, h: crate::sched::Handle, mine: &[(u64, State)]) -> Result<(), String> {
        let held: std::collections::BTreeSet<u64> = mine.iter().filter(|(_, s)| *s == State::Held).map(|(id, _)| *id).collect();
        let removed = self.sched.remove_all(h, self.now, |id| held.contains(&id));
        if removed != held.len() {
            return Err(format!("remove_all removed {removed} of {} held", held.len()));
        }
        for id in held {
            self.reqs.get_mut(&id).expect("listed").state = State::Removed;
            self.clients[c].outstanding -= 1;
        }
        self.closed(c, h);
        Ok(())
    }

    fn closed(&mut self, c: usize, h: crate::sched::Handle) {
        self.sched.detach(h, self.now);
        self.clients[c].reopen_at = self.now + range(&mut self.rng, 0, 1000) * MS;
        self.log.push(format!("{} client {c} closes", self.now));
    }
}

/// One random run with everything changing on the way.
pub fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::seeded(seed ^ 0x5eed_c4a0);
    let classes = gen::classes(&mut rng);
    let limits = gen::limits(&mut rng);
    let storage = Storage::new(range(&mut rng, 1000, 20_000), range(&mut rng, 100 << 20, 2 << 30));
    let mut w = World::new(seed, classes, limits, storage, range(&mut rng, 2, 6) * SEC);
    w.chaos_at = Some(range(&mut rng, 50, 1000) * MS);
    let names: Vec<String> = w.classes.keys().cloned().collect();
    for _ in 0..range(&mut rng, 1, 6) {
        let class = names[rng.below(names.len() as u64) as usize].clone();
        w.add_client(&class, range(&mut rng, 0, 3), gen::workload(&mut rng));
    }
    w.run().map_err(|e| w.failure(seed, &e))
}
