//! Editing a pool file in place: when a member is replaced or a spare takes a member's
//! place. Each edit reads the file, changes it and writes it back whole through a synced
//! temporary file (a crash leaves the old file or the new one), under a lock on its
//! directory, so that two edits at once (two commands, or a command and a serving
//! coordinator taking a spare) do not lose one another.

use crate::error::Error;
use std::path::Path;

/// Edits the pool file after spare `spare` took member `old`'s place: the members list
/// names it there and the spares no longer do. A file that cannot be edited is logged:
/// until it is fixed by hand, the next start looks for the old member.
pub(crate) fn record_spare(path: &Path, old: &str, spare: &str) {
    match edit(path, |text| sluice_pool::spec::take_spare_in_text(text, old, spare)) {
        Ok(()) => log::info!("pool file {}: {spare} is now a member in {old}'s place", path.display()),
        Err(e) => log::error!("pool file {} could not be edited ({e}): name {spare} in {old}'s place in its members and take it out of its spares by hand before the next start", path.display()),
    }
}

/// Changes the pool file at `path` with `change` (its text in, the new text or why not
/// out), under the lock.
pub(crate) fn edit(path: &Path, change: impl FnOnce(&str) -> Result<String, String>) -> Result<(), Error> {
    let fail = |e: std::io::Error| Error::Pool(format!("cannot edit {}: {e}", path.display()));
    let real = std::fs::canonicalize(path).map_err(fail)?;
    let dir = std::fs::File::open(real.parent().unwrap_or(Path::new("/"))).map_err(fail)?;
    rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive).map_err(|e| fail(e.into()))?;
    let text = std::fs::read_to_string(&real).map_err(fail)?;
    let changed = change(&text).map_err(|e| Error::Pool(format!("{}: {e}", path.display())))?;
    write_in_place(&real, &changed)
    // The lock goes with `dir`.
}

/// Writes `text` to `path` (the file a symbolic link points to, when it is one) through a
/// temporary file beside it, synced, then renamed over it, so that a crash leaves the old
/// file or the new one, never half of one; the file keeps its mode and owner.
fn write_in_place(path: &Path, text: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let fail = |e: std::io::Error| Error::Pool(format!("cannot write {}: {e}", path.display()));
    let path = std::fs::canonicalize(path).map_err(fail)?;
    let meta = std::fs::metadata(&path).map_err(fail)?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.sluice-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(meta.mode() & 0o7777).open(&tmp)?;
        std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_at_once_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.toml");
        std::fs::write(&path, "layout = \"mirror\"  # kept\nmembers = [\"nbd://a/d\", \"nbd://b/d\"]\n").unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || edit(&path, |t| sluice_pool::spec::add_spare_in_text(t, &format!("nbd://s{i}/d"))).unwrap())
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let spec = sluice_pool::PoolSpec::load(&path).unwrap();
        assert_eq!(spec.spares.len(), 8, "{:?}", spec.spares);
        assert!(std::fs::read_to_string(&path).unwrap().contains("# kept"));
        let e = edit(&path, |t| sluice_pool::spec::add_spare_in_text(t, "nbd://s0/d")).unwrap_err().to_string();
        assert!(e.contains("a spare already"), "{e}");
    }
}

#[cfg(test)]
mod review_tests {
    use super::record_spare;

    /// Two members missing since the same moment are replaced by two spares in one tick:
    /// the driver edits the pool file for each on its own blocking thread, at once. Both
    /// edits must land.
    #[test]
    fn two_spares_taken_at_once_are_both_recorded() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("vol.toml");
            let text = "layout = \"raid10\"\ncopies = 2\nmembers = [\"nbd://a/d\", \"nbd://b/d\", \"nbd://c/d\", \"nbd://e/d\"]\nspares = [\"nbd://s1/d\", \"nbd://s2/d\"]\n";
            std::fs::write(&path, text).unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
            let (p1, b1) = (path.clone(), barrier.clone());
            let t1 = std::thread::spawn(move || {
                b1.wait();
                record_spare(&p1, "nbd://a/d", "nbd://s1/d")
            });
            let (p2, b2) = (path.clone(), barrier.clone());
            let t2 = std::thread::spawn(move || {
                b2.wait();
                record_spare(&p2, "nbd://c/d", "nbd://s2/d")
            });
            t1.join().unwrap();
            t2.join().unwrap();
            let spec = sluice_pool::PoolSpec::load(&path).unwrap();
            assert_eq!(
                (spec.members.clone(), spec.spares.clone()),
                (vec!["nbd://s1/d".to_string(), "nbd://b/d".into(), "nbd://s2/d".into(), "nbd://e/d".into()], vec![]),
                "round {round}: an edit was lost"
            );
        }
    }
}
