//! What a run did, for the test's message and its checks that the runs covered the cases.

/// What a run did, for the test's message.
#[derive(Debug, Default)]
pub struct Report {
    pub layout: &'static str,
    pub requests: u64,
    pub faults: u64,
    pub coordinator_crashes: u64,
    /// Coordinators assembled with a member left out (`--degraded`).
    pub degraded_starts: u64,
    /// Members replaced by blank ones.
    pub replacements: u64,
    /// Of those, live ones that took their member's place after a copy.
    pub handovers: u64,
    /// Members replaced by a spare after being missing too long.
    pub spares_taken: u64,
    /// Coordinators stopped cleanly and assembled again mid-run.
    pub clean_restarts: u64,
    pub resynced_bytes: u64,
    /// Pools grown (`pool grow`), and coordinator crashes while one reshaped.
    pub grows: u64,
    pub reshape_crashes: u64,
    /// Faults of any kind (member losses, stalls, failed operations) while a reshape ran.
    pub reshape_faults: u64,
    /// Runs of a raid10 with offset placement, and their faults.
    pub offset_runs: u64,
    pub offset_faults: u64,
}

impl Report {
    /// Adds one run's counts to these totals.
    pub fn add(&mut self, r: &Report) {
        self.requests += r.requests;
        self.faults += r.faults;
        self.coordinator_crashes += r.coordinator_crashes;
        self.degraded_starts += r.degraded_starts;
        self.replacements += r.replacements;
        self.handovers += r.handovers;
        self.spares_taken += r.spares_taken;
        self.clean_restarts += r.clean_restarts;
        self.resynced_bytes += r.resynced_bytes;
        self.grows += r.grows;
        self.reshape_crashes += r.reshape_crashes;
        self.reshape_faults += r.reshape_faults;
        self.offset_runs += r.offset_runs;
        self.offset_faults += r.faults * r.offset_runs;
    }
}
