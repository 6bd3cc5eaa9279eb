//! `sluice pool check` and `sluice pool repair`: compare every mirror set's copies (and
//! rewrite those that differ), with a progress line on stderr and the report on stdout.
//!
//! Exit status, as fsck-like tools do: 0 when the copies agree (check) or every mismatch
//! was rewritten (repair); 1 when a check found mismatches, a repair could not rewrite
//! them all, or part of the pool could not be compared; 2 for a stripe (nothing to
//! compare), a bad command line or pool file, or a member that cannot be reached.

use crate::client_cli::exit_code;
use crate::exit::EXIT_USAGE;
use indicatif::HumanBytes;
use serde_json::Value;
use sluice_client::pool::{self, ScrubReport};
use sluice_client::Error;
use std::path::Path;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pub pool: String,

    /// Print the report as JSON (the schema is in docs/pool.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct RepairArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pub pool: String,

    /// The copy to rewrite the others from (a member URI as the pool file names it; it
    /// must be in sync). Default: the first in-sync copy of each set.
    #[arg(long, value_name = "URI")]
    pub from: Option<String>,

    /// Print the report as JSON (the schema is in docs/pool.md).
    #[arg(long)]
    pub json: bool,
}

/// Runs a check (`from` None and `repair` false) or a repair, and prints what it found.
pub fn run(cmd: &str, arg: &str, repair: bool, from: Option<&str>, as_json: bool) -> ExitCode {
    let path = Path::new(arg.strip_prefix("pool:").unwrap_or(arg));
    let rt = crate::client_cli::runtime();
    let shown = std::cell::Cell::new(u64::MAX);
    let progress = |r: &ScrubReport| {
        let percent = (r.done_bytes * 100).checked_div(r.total_bytes).unwrap_or(0);
        if shown.replace(percent) != percent {
            eprintln!("{cmd}: {percent}% ({} of {}), {} mismatched region(s)", HumanBytes(r.done_bytes), HumanBytes(r.total_bytes), r.mismatched_regions);
        }
    };
    match rt.block_on(pool::scrub(path, repair, from, progress)) {
        Ok(report) => {
            if as_json {
                println!("{}", serde_json::to_string_pretty(&to_json(&report)).expect("JSON from plain values"));
            } else {
                print!("{}", to_text(&report));
            }
            ExitCode::from(verdict(&report))
        }
        Err(e) => {
            eprintln!("sluice {cmd}: {e}");
            let stripe = matches!(&e, Error::Refused(w) if w.contains("nothing to compare"));
            ExitCode::from(if stripe { EXIT_USAGE } else { exit_code(&e) })
        }
    }
}

/// 0: all is well; 1: mismatches remain or part of the pool was not compared.
fn verdict(r: &ScrubReport) -> u8 {
    let unfixed = if r.repair { r.mismatched_regions > r.repaired_regions } else { r.mismatched_regions > 0 };
    u8::from(unfixed || r.error.is_some() || r.skipped_bytes > 0)
}

pub fn to_text(r: &ScrubReport) -> String {
    let what = if r.repair { "repair" } else { "check" };
    let mut out = format!("{what}: compared {} of {}\n", HumanBytes(r.done_bytes - r.skipped_bytes), HumanBytes(r.total_bytes));
    out += &format!("mismatched regions: {}\n", r.mismatched_regions);
    if r.repair {
        out += &format!("repaired regions: {}\n", r.repaired_regions);
    }
    if r.skipped_bytes > 0 {
        out += &format!("skipped: {} (fewer than two in-sync copies)\n", HumanBytes(r.skipped_bytes));
    }
    for g in &r.ranges {
        out += &format!("  set {} member data bytes {}..{} ({})\n", g.set, g.start, g.end, HumanBytes(g.end - g.start));
    }
    if r.ranges_truncated {
        out += "  (more ranges not listed)\n";
    }
    if let Some(e) = &r.error {
        out += &format!("cut short: {e}\n");
    }
    out
}

pub fn to_json(r: &ScrubReport) -> Value {
    pool::report_to_json(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::pool::ScrubRange;

    #[test]
    fn a_check_that_found_something_fails_and_says_where() {
        let r = ScrubReport { done_bytes: 8 << 20, total_bytes: 8 << 20, mismatched_regions: 1, ranges: vec![ScrubRange { set: 0, start: 4096, end: 4097 }], ..ScrubReport::default() };
        assert_eq!(verdict(&r), 1);
        let text = to_text(&r);
        assert!(text.contains("mismatched regions: 1") && text.contains("set 0 member data bytes 4096..4097"), "{text}");
        assert_eq!(to_json(&r)["ranges"][0]["start"], 4096);
        let fixed = ScrubReport { repair: true, repaired_regions: 1, ..r };
        assert_eq!(verdict(&fixed), 0);
        assert_eq!(verdict(&ScrubReport { skipped_bytes: 1, ..ScrubReport::default() }), 1);
    }
}
