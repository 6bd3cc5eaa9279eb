//! The exports `sluice serve` has open, each with what it was opened from, so that a
//! reload opens only what changed and keeps serving the rest from the same backend.

use std::sync::Arc;

use sluice_client::Uri;
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

/// A cached volume's members hold the slots of one cache: a second one opened beside it
/// would overwrite them (never a wrong read, but no hits for either).
fn is_cache(spec: &Spec) -> bool {
    matches!(spec, Spec::Remote(s) if s.starts_with("cache:"))
}

/// A cached volume opened twice, as two exports of one table or under a new name while
/// the old one still serves its connections, is two caches writing the same members'
/// slots: refused, as a served one changed is.
pub fn cache_conflict(served: &[&Wanted], wanted: &[Wanted]) -> Result<(), String> {
    for (i, w) in wanted.iter().enumerate().filter(|(_, w)| is_cache(&w.spec)) {
        if let Some(other) = wanted[..i].iter().find(|o| o.spec == w.spec) {
            return Err(format!("exports {:?} and {:?}: the same cached volume ({}) twice; its members hold one cache's slots", other.name, w.name, w.spec));
        }
        if let Some(old) = served.iter().find(|o| o.spec == w.spec && o.name != w.name) {
            return Err(format!(
                "export {:?}: {} is served as export {:?} (its members hold that cache's slots); restart to rename it",
                w.name, w.spec, old.name
            ));
        }
    }
    Ok(())
}

impl Catalog {
    /// Opens every export `wanted` names, taking those that did not change from `self`.
    /// An export that cannot be opened fails the whole table, so nothing changes then.
    pub fn reopen(&self, wanted: Vec<Wanted>) -> Result<(Catalog, Exports), String> {
        let served: Vec<&Wanted> = self.open.iter().map(|o| &o.wanted).collect();
        cache_conflict(&served, &wanted)?;
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
                Some(o) if is_cache(&o.wanted.spec) => {
                    return Err(format!(
                        "export {:?}: a cached volume cannot change while it is served (its members hold this cache's slots); restart to change it",
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

/// Members a served pool's file now names in other places, checked against the running
/// pool, and its spares: applied once the rest of a reload has gone through.
pub struct PoolMoves {
    export: Arc<Export>,
    moves: Vec<(usize, Uri)>,
    spares: Spares,
    /// Members appended to the list (`sluice pool grow`).
    grow: Vec<Uri>,
}

impl Catalog {
    /// For every pool export that `next` keeps from `self`: the members its file now names
    /// in other places (`sluice pool replace` edits the file) and the members appended to
    /// it (`sluice pool grow`), each checked against the running pool. A pool file changed
    /// in any other way refuses the reload.
    pub fn pool_moves(&self, next: &Catalog) -> Result<Vec<PoolMoves>, String> {
        let kept = next.open.iter().filter(|o| self.open.iter().any(|x| Arc::ptr_eq(&x.export, &o.export)));
        let mut all = Vec::new();
        for o in kept {
            let Spec::Remote(s) = &o.wanted.spec else { continue };
            let (Some(path), Some(client)) = (s.strip_prefix("pool:"), o.export.backend.pool_client()) else { continue };
            let c = moves(path, client).map_err(|e| format!("export {:?}: {s}: {e}", o.wanted.name))?;
            all.push(PoolMoves { export: Arc::clone(&o.export), moves: c.moves, grow: c.grow, spares: c.spares });
        }
        Ok(all)
    }
}

/// Spares as a pool file names them, with `spare-after` in milliseconds.
type Spares = (Vec<String>, u64);

/// What a reload finds in a served pool's file: members in other places, members appended,
/// and the spares.
struct Changes {
    moves: Vec<(usize, Uri)>,
    grow: Vec<Uri>,
    spares: Spares,
}

/// Where the file at `path` names other members than the running pool has, and the
/// members appended to it, each checked; and the spares it names.
fn moves(path: &str, client: &sluice_client::Client) -> Result<Changes, String> {
    use sluice_client::pool::Layout;
    let spec = sluice_client::pool::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let now = client.pool_members().unwrap_or_default();
    let status = client.pool_status().ok_or("not a pool")?;
    // A grown mirror has a copy more per member added.
    let copies_kept = spec.copies == status.copies || (spec.layout == Layout::Mirror && spec.copies == spec.members.len());
    if spec.placement != status.placement {
        return Err(format!("placement cannot change: the pool was made with placement \"{}\" (it moves every copy)", status.placement.name()));
    }
    let same = spec.layout == status.layout && copies_kept && spec.members.len() >= now.len();
    if !same || (spec.layout != Layout::Mirror && spec.stripe_unit != status.stripe_unit) {
        return Err("only member addresses can change, and members be appended (sluice pool grow), while the pool is served (layout, copies, stripe unit and fewer members take a restart)".into());
    }
    let mut grow = Vec::new();
    for (i, wanted) in spec.members.iter().enumerate().skip(now.len()) {
        grow.push(Uri::parse(wanted).map_err(|e| format!("member {} ({wanted}): {e}", i + 1))?);
    }
    if !grow.is_empty() {
        client.check_pool_grow(grow.len()).map_err(|e| format!("the pool cannot take {} new member(s) now: {e}", grow.len()))?;
    }
    let mut moves = Vec::new();
    for (i, (wanted, current)) in spec.members.iter().zip(&now).enumerate() {
        let uri = Uri::parse(wanted).map_err(|e| format!("member {} ({wanted}): {e}", i + 1))?;
        // A live replacement the file already names is under way.
        let replacing = status.replacing.as_ref().is_some_and(|r| r.member == i && Uri::parse(&r.uri).is_ok_and(|u| u == uri));
        if uri != *current && !replacing {
            moves.push((i, uri));
        }
    }
    // A live member's replacement copies while it serves, and a pool does not grow meanwhile.
    let live = |i: usize| status.members.get(i).is_some_and(|m| m.state == sluice_client::pool::MemberState::InSync);
    if !grow.is_empty() && moves.iter().any(|(i, _)| live(*i)) {
        return Err("the pool file both replaces a member that is in sync and appends members: a pool does not grow while a live member is replaced; replace first, reload, and append the members once the replacement is done".into());
    }
    // All together: two moves in one set may each be possible alone and not both.
    let places: Vec<usize> = moves.iter().map(|(i, _)| *i).collect();
    if !places.is_empty() {
        let named: Vec<String> = places.iter().map(|i| (i + 1).to_string()).collect();
        client.check_pool_replacements(&places).map_err(|e| format!("member(s) {} cannot be replaced now: {e}", named.join(", ")))?;
    }
    Ok(Changes { moves, grow, spares: (spec.spares, spec.spare_after_ms) })
}

/// Puts each new member in its place; a pool that refuses now (its state moved since the
/// check) is logged, and the file and the running pool then differ until the next reload.
pub fn apply_pool_moves(all: Vec<PoolMoves>) {
    for p in all {
        let Some(client) = p.export.backend.pool_client() else { continue };
        let (spares, after) = p.spares;
        if client.pool_status().is_some_and(|s| s.spares != spares) {
            log::info!("export {:?}: pool spares are now [{}], taken after {after} ms missing", p.export.name, spares.join(", "));
        }
        if let Err(e) = client.set_pool_spares(spares, after) {
            log::error!("export {:?}: pool spares not set: {e}", p.export.name);
        }
        for (i, uri) in p.moves {
            match client.replace_pool_member(i, &uri) {
                Ok(()) => log::info!("export {:?}: pool member {} is now {uri}; it is rebuilt once it answers", p.export.name, i + 1),
                Err(e) => log::error!("export {:?}: pool member {} was not replaced by {uri}: {e}", p.export.name, i + 1),
            }
        }
        if !p.grow.is_empty() {
            let named: Vec<String> = p.grow.iter().map(Uri::to_string).collect();
            match p.export.backend.pool_grow(&p.grow) {
                Ok(()) => log::info!("export {:?}: pool grows by {}; clients see the grown volume when they connect after the reshape", p.export.name, named.join(", ")),
                Err(e) => log::error!("export {:?}: pool did not take {}: {e}", p.export.name, named.join(", ")),
            }
        }
    }
}

fn open(w: &Wanted) -> Result<Export, String> {
    let Wanted { name, spec, options } = w;
    Export::open(name, spec, options.clone()).map_err(|e| format!("export {name:?}: cannot open {spec}: {e}"))
}

/// What `--check` does for one export: opens it as a start would and closes it again, but
/// only reads a pool's or a cached volume's file: its members belong to the server that
/// may be serving it.
pub fn check(w: &Wanted) -> Result<String, String> {
    let Wanted { name, spec, .. } = w;
    if let Spec::Remote(s) = spec {
        if let Some(path) = s.strip_prefix("pool:") {
            sluice_client::pool::load(std::path::Path::new(path)).map_err(|e| format!("export {name:?}: {spec}: {e}"))?;
            return Ok(format!("export {name:?}: {spec}: pool file valid (members not contacted)"));
        }
        if let Some(path) = s.strip_prefix("cache:") {
            sluice_client::cache::load(std::path::Path::new(path)).map_err(|e| format!("export {name:?}: {e}"))?;
            return Ok(format!("export {name:?}: {spec}: cache file valid (backing and members not contacted)"));
        }
    }
    let export = open(w)?;
    let ro = if export.read_only { ", read-only" } else { "" };
    let line = format!("export {name:?}: {spec}: {} bytes{ro}", export.backend.size());
    export.backend.close();
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(name: &str, spec: &str) -> Wanted {
        Wanted { name: name.into(), spec: Spec::parse(spec).unwrap(), options: Options::default() }
    }

    #[test]
    fn a_cached_volume_is_opened_once() {
        let v = wanted("v", "cache:/etc/c.toml");
        assert!(cache_conflict(&[], &[v.clone(), wanted("w", "cache:/etc/d.toml"), wanted("m", "memory:1M")]).is_ok());
        assert!(cache_conflict(&[&v], std::slice::from_ref(&v)).is_ok(), "kept as it is");
        let e = cache_conflict(&[], &[v.clone(), wanted("w", "cache:/etc/c.toml")]).unwrap_err();
        assert!(e.contains("\"v\" and \"w\""), "{e}");
        let e = cache_conflict(&[&v], &[wanted("w", "cache:/etc/c.toml")]).unwrap_err();
        assert!(e.contains("served as export \"v\""), "{e}");
        assert!(cache_conflict(&[&wanted("p", "memory:1M")], &[wanted("q", "memory:1M")]).is_ok());
    }
}
