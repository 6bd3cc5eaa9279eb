//! What a client of a pool or a cached volume can ask besides I/O: their live state, and a
//! pool's administration (members replaced, spares, scrubs, growing). Anything else
//! answers `None` or is refused.

use super::{Client, Transport};
use crate::error::Error;
use crate::uri::Uri;

impl Client {
    /// For a cached volume: its counters and members now; `None` for anything else (or
    /// once it stopped).
    pub async fn cache_status(&self) -> Option<crate::cache::Status> {
        match &self.inner.transport {
            Transport::Cache(cache) => cache.status().await,
            _ => None,
        }
    }

    /// For a pool: where its members are now, in the pool file's order.
    pub fn pool_members(&self) -> Option<Vec<Uri>> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => None,
            Transport::Pool(pool) => Some(pool.member_uris()),
        }
    }

    /// For a pool: puts the server at `uri` in member `index`'s place. The old member is
    /// dropped; the new one is connected in the background and rebuilt in full from the
    /// other copies of its set. Refused for a stripe, for the only in-sync member of a set,
    /// and for anything but a pool.
    pub fn replace_pool_member(&self, index: usize, uri: &Uri) -> Result<(), Error> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => Err(Error::Refused("not a pool".into())),
            Transport::Pool(pool) => pool.replace(index, uri.clone()),
        }
    }

    /// For a pool: the servers that take the place of a member missing `spare_after_ms`
    /// (in order), as the pool file names them now.
    pub fn set_pool_spares(&self, spares: Vec<String>, spare_after_ms: u64) -> Result<(), Error> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => Err(Error::Refused("not a pool".into())),
            Transport::Pool(pool) => {
                pool.set_spares(spares, spare_after_ms);
                Ok(())
            }
        }
    }

    /// For a pool: whether the members at `indexes` could all be replaced now (each set
    /// keeping an in-sync member that stays): Ok, or why not.
    pub fn check_pool_replacements(&self, indexes: &[usize]) -> Result<(), Error> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => Err(Error::Refused("not a pool".into())),
            Transport::Pool(pool) => pool.can_replace(indexes),
        }
    }

    /// For a pool: starts comparing the copies of every mirror set (`repair`: and
    /// rewriting those that differ from member `from`, or each set's first in-sync copy);
    /// `pool_status().scrub` follows it. Refused for a stripe, while a scrub runs, and for
    /// anything but a pool.
    pub fn start_pool_scrub(&self, repair: bool, from: Option<usize>) -> Result<(), Error> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => Err(Error::Refused("not a pool".into())),
            Transport::Pool(pool) => pool.start_scrub(repair, from),
        }
    }

    /// For a pool: adds the servers at `uris` at the end of its members (`sluice pool
    /// grow`). A stripe or raid10 (whole mirror sets) reshapes the volume onto them while
    /// serving, and grows when that is done (new connections see the new size); a mirror
    /// gets them as copies more. Refused for anything but a pool.
    pub async fn grow_pool(&self, uris: &[Uri]) -> Result<(), Error> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => Err(Error::Refused("not a pool".into())),
            Transport::Pool(pool) => pool.grow(uris.to_vec()).await,
        }
    }

    /// For a pool: whether `count` members could be added now: Ok, or why not.
    pub fn check_pool_grow(&self, count: usize) -> Result<(), Error> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => Err(Error::Refused("not a pool".into())),
            Transport::Pool(pool) => pool.can_grow(count),
        }
    }

    /// The pool or cached volume this client uses, for a caller that carries its member
    /// operations itself; `None` for a plain export.
    pub fn direct(&self) -> Option<crate::carry::Direct> {
        match &self.inner.transport {
            Transport::Conns(_) => None,
            Transport::Cache(cache) => Some(cache.direct()),
            Transport::Pool(pool) => Some(pool.direct()),
        }
    }

    /// The live state of the pool this client uses (members, resync progress, dirty
    /// regions); `None` for a plain export.
    pub fn pool_status(&self) -> Option<sluice_pool::Status> {
        match &self.inner.transport {
            Transport::Conns(_) | Transport::Cache(_) => None,
            Transport::Pool(pool) => Some(pool.status()),
        }
    }
}
