//! The simulation's seeds, run by `cargo test -p sluice-qos`: `SLUICE_QOS_SIM_SEEDS=N`
//! runs more, `SLUICE_QOS_SIM_SEED=N` runs one.

use super::{chaos, scenario};

fn seeds(default: u64) -> Vec<u64> {
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match (env("SLUICE_QOS_SIM_SEED"), env("SLUICE_QOS_SIM_SEEDS")) {
        (Some(one), _) => vec![one],
        (None, n) => (0..n.unwrap_or(default)).collect(),
    }
}

#[test]
fn random_runs_keep_every_promise() {
    for seed in seeds(60) {
        if let Err(e) = chaos::run(seed) {
            panic!("{e}");
        }
    }
}

#[test]
fn scenarios_meet_shares_reservations_and_limits() {
    let mut failed = Vec::new();
    for seed in seeds(60) {
        match scenario::run(seed) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failed.push(e),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
