//! Editing a pool file in place: when a member is replaced or a spare takes a member's
//! place. Written whole through a synced temporary file, so a crash leaves the old file or
//! the new one.

use crate::error::Error;
use std::path::Path;

/// Edits the pool file after spare `spare` took member `old`'s place: the members list
/// names it there and the spares no longer do. A file that cannot be edited is logged:
/// until it is fixed by hand, the next start looks for the old member.
pub(crate) fn record_spare(path: &Path, old: &str, spare: &str) {
    let edited = std::fs::read_to_string(path)
        .map_err(|e| Error::Pool(format!("cannot read {}: {e}", path.display())))
        .and_then(|text| sluice_pool::spec::take_spare_in_text(&text, old, spare).map_err(Error::Pool))
        .and_then(|text| write_in_place(path, &text));
    match edited {
        Ok(()) => log::info!("pool file {}: {spare} is now a member in {old}'s place", path.display()),
        Err(e) => log::error!("pool file {} could not be edited ({e}): name {spare} in {old}'s place in its members and take it out of its spares by hand before the next start", path.display()),
    }
}

/// Writes `text` to `path` (the file a symbolic link points to, when it is one) through a
/// temporary file beside it, synced, then renamed over it, so that a crash leaves the old
/// file or the new one, never half of one; the file keeps its mode and owner.
pub(crate) fn write_in_place(path: &Path, text: &str) -> Result<(), Error> {
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
