//! One coordinator at a time for a mirrored pool. A coordinator writes its session into the
//! superblocks and moves their heartbeat while it lives, and clears the session when it
//! stops cleanly. A newcomer that finds a session waits out the lease and looks again: a
//! heartbeat that moved means the owner lives, and the newcomer refuses; one that stood
//! still means the owner died, and the newcomer takes over.

use super::found::read_all;
use super::member::Member;
use crate::error::Error;
use crate::uri::Uri;
use sluice_pool::limits::LEASE_MS;
use sluice_pool::{Found, Owner, Superblock};
use std::time::Duration;

/// The owners the superblocks name (damaged or blank ones name none: the coordinator
/// judges those).
fn owners(found: &[Found]) -> Vec<Option<Owner>> {
    found
        .iter()
        .map(|f| match Superblock::decode(&f.meta) {
            Ok(Some(sb)) if sb.owner.session != 0 => Some(sb.owner),
            _ => None,
        })
        .collect()
}

/// The owner that proved alive between two looks a lease apart: on some member, a session
/// that is there now and either is new or has moved its heartbeat.
fn alive(before: &[Option<Owner>], after: &[Option<Owner>]) -> Option<Owner> {
    before.iter().zip(after).find_map(|(b, a)| match (b, a) {
        (_, None) => None,
        (Some(b), Some(a)) if a.session == b.session && a.heartbeat == b.heartbeat => None,
        (_, Some(a)) => Some(a.clone()),
    })
}

/// What the members hold once no live coordinator owns the pool; a refusal naming the
/// owner otherwise. A stripe may have many writers and names no owner, except while a
/// coordinator reshapes it (`pool grow`).
pub(crate) async fn take_over<M: Member>(members: &[M], uris: &[Uri], found: Vec<Found>) -> Result<Vec<Found>, Error> {
    let before = owners(&found);
    if before.iter().all(Option::is_none) {
        return Ok(found);
    }
    if let Some(o) = before.iter().flatten().next() {
        log::info!("pool superblocks name an owner ({} pid {}); waiting {LEASE_MS} ms to see whether it is alive", o.host, o.pid);
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS)).await;
    let after = read_all(members, uris).await?;
    match alive(&before, &owners(&after)) {
        Some(o) => Err(Error::Refused(format!("pool is being served by {} pid {}; stop that first", o.host, o.pid))),
        None => Ok(after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_pool::{Layout, Role};

    fn owner(session: u64, heartbeat: u64) -> Option<Owner> {
        Some(Owner { session, heartbeat, pid: 42, host: "node-a".into() })
    }

    #[test]
    fn a_moving_heartbeat_is_alive() {
        assert_eq!(alive(&[owner(7, 1), owner(7, 1)], &[owner(7, 1), owner(7, 2)]), owner(7, 2));
        // Another coordinator took over meanwhile: alive too.
        assert_eq!(alive(&[owner(7, 1)], &[owner(9, 1)]), owner(9, 1));
        // Found released, or a member that had no owner now has one.
        assert_eq!(alive(&[None], &[owner(3, 0)]), owner(3, 0));
    }

    #[test]
    fn a_still_or_released_owner_is_not() {
        assert_eq!(alive(&[owner(7, 5), None], &[owner(7, 5), None]), None);
        assert_eq!(alive(&[owner(7, 5)], &[None]), None);
    }

    #[test]
    fn owners_come_from_superblocks() {
        let sb = Superblock {
            pool_id: [1; 16],
            layout: Layout::Mirror,
            placement: sluice_pool::Placement::Near,
            copies: 2,
            index: 0,
            stripe_unit: u64::MAX,
            member_bytes: 1 << 30,
            region_bytes: 4 << 20,
            events: 1,
            owner: Owner { session: 5, heartbeat: 9, pid: 42, host: "node-a".into() },
            roles: vec![Role::Active, Role::Active],
            scrub: None,
            devices: vec![1, 2],
            reshape: None,
        };
        let released = Superblock { owner: Owner::default(), ..sb.clone() };
        let found = |b: Vec<u8>| Found { size: 1 << 31, meta: b, read_only: false };
        let got = owners(&[found(sb.encode()), found(released.encode()), found(vec![0; 4096]), found(vec![0xff; 4096])]);
        assert_eq!(got, vec![owner(5, 9), None, None, None]);
    }
}
