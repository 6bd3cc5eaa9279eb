//! The source tree keeps the layout rules: file and impl sizes, no import cycles
//! (scripts/check-layout, over every crate).

use std::path::Path;
use std::process::Command;

#[test]
fn source_tree_keeps_the_layout_rules() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = repo.join("scripts/check-layout");
    let out = Command::new(&script).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{report}");
    assert!(out.status.success(), "scripts/check-layout found layout problems ({}); its report is above", out.status);
}
