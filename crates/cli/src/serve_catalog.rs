//! The exports `sluice serve` has open, each with what it was opened from, so that a
//! reload opens only what changed and keeps serving the rest from the same backend.

use std::sync::Arc;

use sluice_server::export::Options;
use sluice_server::{Export, Exports, Spec};

/// An export as it is to be opened: its name, where its data lives, and its options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub name: String,
    pub spec: Spec,
    pub options: Options,
}

/// An open export and what it was opened from.
struct Opened {
    wanted: Wanted,
    export: Arc<Export>,
}

#[derive(Default)]
pub struct Catalog {
    open: Vec<Opened>,
}

/// A pool's members have one owner, the coordinator that assembled it: a second one for
/// the same pool cannot start while the first still serves.
fn is_pool(spec: &Spec) -> bool {
    matches!(spec, Spec::Remote(s) if s.starts_with("pool:"))
}

impl Catalog {
    /// Opens every export `wanted` names, taking those that did not change from `self`.
    /// An export that cannot be opened fails the whole table, so nothing changes then.
    pub fn reopen(&self, wanted: Vec<Wanted>) -> Result<(Catalog, Exports), String> {
        let mut next = Catalog::default();
        let mut exports = Exports::default();
        for w in wanted {
            let export = match self.open.iter().find(|o| o.wanted.name == w.name) {
                Some(o) if o.wanted == w => Arc::clone(&o.export),
                Some(o) if is_pool(&o.wanted.spec) => {
                    return Err(format!(
                        "export {:?}: a pool export cannot change while it is served (its members have one owner); restart to change it",
                        w.name
                    ))
                }
                Some(o) if matches!(o.wanted.spec, Spec::Memory(_)) && o.wanted.spec == w.spec => {
                    return Err(format!(
                        "export {:?}: a RAM export's options cannot change while it is served (reopening it would empty it); restart, or give it a new spec",
                        w.name
                    ))
                }
                _ => Arc::new(open(&w)?),
            };
            exports.insert_shared(Arc::clone(&export)).map_err(|e| e.to_string())?;
            next.open.push(Opened { wanted: w, export });
        }
        Ok((next, exports))
    }
}

fn open(w: &Wanted) -> Result<Export, String> {
    let Wanted { name, spec, options } = w;
    Export::open(name, spec, options.clone()).map_err(|e| format!("export {name:?}: cannot open {spec}: {e}"))
}

/// What `--check` does for one export: opens it as a start would and closes it again, but
/// only reads a pool's file: its members belong to the server that may be serving it.
pub fn check(w: &Wanted) -> Result<String, String> {
    let Wanted { name, spec, .. } = w;
    if let Spec::Remote(s) = spec {
        if let Some(path) = s.strip_prefix("pool:") {
            sluice_client::pool::load(std::path::Path::new(path)).map_err(|e| format!("export {name:?}: {spec}: {e}"))?;
            return Ok(format!("export {name:?}: {spec}: pool file valid (members not contacted)"));
        }
    }
    let export = open(w)?;
    let ro = if export.read_only { ", read-only" } else { "" };
    let line = format!("export {name:?}: {spec}: {} bytes{ro}", export.backend.size());
    export.backend.close();
    Ok(line)
}
