//! Completions that arrive from other threads. A backend whose work runs elsewhere (a remote
//! export reached through the async client) parks its storage operation in the ring with
//! `Ring::defer` and gets a `Completer`: `Send`, holding plain integers and a handle on this
//! mailbox, never a buffer. The other thread posts the result through it and wakes the
//! worker's eventfd; the ring's next `wait` takes the parked operation back, puts any
//! returned bytes in its buffer on the worker thread (bytes that fill it exactly replace it,
//! uncopied; others are copied in), and hands it out as an ordinary `Completion`. The
//! worker's own buffers never leave it, so no `unsafe` is needed here; the returned bytes'
//! `Vec`s go back to the poster's `spent` once used.
//!
//! Every parked operation is answered exactly once: `complete` consumes the completer, and a
//! completer dropped unanswered (its task cancelled, its runtime shut down) posts ECANCELED.
//! Parked operations belong to the mailbox and are dropped with the ring; posts that arrive
//! after that find the mailbox closed and are dropped by the poster.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use sluice_proto::reply::Extent;

use super::buffer::{Buf, Spent};
use super::op::{Completion, Held, StorageId, Token};

/// A parked operation's place in the mailbox: its slot and the slot's generation when it
/// was parked, so that a ticket outliving its operation can never take another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ticket {
    index: u32,
    generation: u32,
}

/// What a completion brings back besides its result.
pub enum Payload {
    Nothing,
    /// Bytes read, in pieces, in order. A single piece that fills the parked buffer
    /// exactly from its start becomes the buffer; otherwise the pieces are copied into it
    /// one after another, from the offset given to `defer`. Each piece goes to `spent`
    /// once its bytes are used.
    Pieces { pieces: Vec<Vec<u8>>, spent: Spent },
    /// Extents found: they replace what was parked (an empty `Held::Extents`, which an
    /// operation cancelled without an answer still returns).
    Extents(Vec<Extent>),
}

struct Post {
    ticket: Ticket,
    result: i32,
    payload: Payload,
}

/// The part other threads reach: the posts not yet taken (None once the ring is gone) and
/// the eventfd that ends the worker's wait.
struct Shared {
    posts: Mutex<Option<Vec<Post>>>,
    waker: OnceLock<Arc<OwnedFd>>,
    /// The thread whose ring this is, once it waited.
    owner: OnceLock<std::thread::ThreadId>,
}

impl Shared {
    fn posts(&self) -> MutexGuard<'_, Option<Vec<Post>>> {
        // A poster cannot panic while holding the lock (it only pushes), so a poisoned lock
        // still guards a consistent list.
        self.posts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The right, and the duty, to complete one parked operation from any thread.
pub struct Completer {
    ticket: Ticket,
    shared: Arc<Shared>,
    posted: bool,
}

impl Completer {
    /// Completes the operation with `result` (bytes moved, or a negative errno).
    pub fn complete(mut self, result: i32, payload: Payload) {
        self.post(result, payload);
    }

    fn post(&mut self, result: i32, payload: Payload) {
        debug_assert!(!self.posted, "a parked operation is completed once");
        self.posted = true;
        let was_empty = match self.shared.posts().as_mut() {
            // The ring is gone and its parked operations with it.
            None => return,
            Some(posts) => {
                let was_empty = posts.is_empty();
                posts.push(Post { ticket: self.ticket, result, payload });
                was_empty
            }
        };
        // Whoever made the list non-empty wakes the worker; the ring takes the whole list
        // after the wake-up read completes, so later posts to a non-empty list ride along.
        // The worker itself (a request finished by another on its ring) need not: its ring
        // looks at the list before it sleeps.
        if was_empty && self.shared.owner.get() != Some(&std::thread::current().id()) {
            if let Some(fd) = self.shared.waker.get() {
                let _ = rustix::io::write(fd.as_fd(), &1u64.to_ne_bytes());
            }
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if !self.posted {
            self.post(-libc::ECANCELED, Payload::Nothing);
        }
    }
}

/// A storage operation waiting for its completer.
struct Parked {
    id: StorageId,
    held: Held,
    /// Where returned bytes go in a held buffer.
    at: usize,
    /// Another thread holds a raw pointer into `held` until the completion is posted (a C
    /// library reads or writes the buffer itself): if the mailbox goes first, `held` is
    /// leaked rather than freed.
    lent: bool,
}

struct Slot {
    generation: u32,
    parked: Option<Parked>,
}

/// The ring's side: parked operations, and the list other threads post to.
pub(super) struct Mailbox {
    shared: Arc<Shared>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// The list swapped in when posts are taken, so taking them allocates nothing.
    spare: Vec<Post>,
}

impl Mailbox {
    pub(super) fn new() -> Mailbox {
        let shared = Arc::new(Shared { posts: Mutex::new(Some(Vec::new())), waker: OnceLock::new(), owner: OnceLock::new() });
        Mailbox { shared, slots: Vec::new(), free: Vec::new(), spare: Vec::new() }
    }

    /// The eventfd a post writes to. Its owner keeps a read of it in flight on the ring, so
    /// that a post ends the ring's wait. Set once; later calls are ignored.
    pub(super) fn set_waker(&self, fd: Arc<OwnedFd>) {
        let _ = self.shared.waker.set(fd);
    }

    /// Whether posts wait to be taken, which a ring must take before it sleeps: its own
    /// thread's posts woke nobody. Notes this thread as the ring's.
    pub(super) fn has_posts(&self) -> bool {
        self.shared.owner.get_or_init(|| std::thread::current().id());
        self.shared.posts().as_ref().is_some_and(|p| !p.is_empty())
    }

    pub(super) fn parked(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub(super) fn park(&mut self, id: StorageId, held: Held, at: usize, lent: bool) -> Completer {
        let parked = Some(Parked { id, held, at, lent });
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize].parked = parked;
                i
            }
            None => {
                self.slots.push(Slot { generation: 0, parked });
                (self.slots.len() - 1) as u32
            }
        };
        let ticket = Ticket { index, generation: self.slots[index as usize].generation };
        Completer { ticket, shared: Arc::clone(&self.shared), posted: false }
    }

    /// Appends a completion for every operation completed since the last call.
    pub(super) fn collect(&mut self, out: &mut Vec<Completion>) {
        let mut posts = std::mem::take(&mut self.spare);
        if let Some(list) = self.shared.posts().as_mut() {
            std::mem::swap(list, &mut posts);
        }
        for post in posts.drain(..) {
            if let Some(c) = self.unpark(post) {
                out.push(c);
            }
        }
        self.spare = posts;
    }

    fn unpark(&mut self, Post { ticket, result, payload }: Post) -> Option<Completion> {
        let Some(Parked { id, mut held, at, .. }) = self.take(ticket) else {
            debug_assert!(false, "a post for {ticket:?}, which is not parked");
            return None;
        };
        let result = match payload {
            Payload::Nothing => result,
            Payload::Extents(extents) => {
                held = Held::Extents(extents);
                result
            }
            Payload::Pieces { pieces, spent } => take_or_land(&mut held, at, pieces, spent, result),
        };
        Some(Completion { token: Token::Storage { id, held }, result })
    }

    /// The operation parked under `ticket`, if that is still the slot's current use.
    fn take(&mut self, ticket: Ticket) -> Option<Parked> {
        let slot = self.slots.get_mut(ticket.index as usize).filter(|s| s.generation == ticket.generation)?;
        let parked = slot.parked.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(ticket.index);
        Some(parked)
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // Later posts are dropped by their posters; parked operations go with the slots,
        // but a buffer another thread may still write into is never freed: its memory (a
        // slab, kept mapped by the buffer's reference to it, or heap) stays valid for the
        // life of the process.
        self.shared.posts().take();
        for slot in &mut self.slots {
            if let Some(parked) = slot.parked.take_if(|p| p.lent) {
                std::mem::forget(parked.held);
            }
        }
    }
}

/// One piece that fills the parked buffer exactly becomes the buffer (the pool's goes back
/// to it): a remote export's read then costs the worker no copy. Others are copied in
/// (`land`) and handed to `spent`.
fn take_or_land(held: &mut Held, at: usize, mut pieces: Vec<Vec<u8>>, spent: Spent, result: i32) -> i32 {
    match (&*held, pieces.as_slice()) {
        (Held::Buf(buf), [one]) if at == 0 && buf.len() == one.len() => {
            *held = Held::Buf(Buf::from_vec(pieces.remove(0), spent));
            result
        }
        // A read into an empty pipe answered in memory: a buffer comes back in its place
        // (the caller sends from whichever it gets), and the unused pipe is dropped.
        (Held::Pipe(_), _) if at == 0 => {
            let data = if pieces.len() == 1 { pieces.remove(0) } else { pieces.concat() };
            pieces.into_iter().for_each(spent);
            *held = Held::Buf(Buf::from_vec(data, spent));
            result
        }
        _ => {
            let result = land(held, at, &pieces, result);
            pieces.into_iter().for_each(spent);
            result
        }
    }
}

/// Copies `pieces`, in order, into a parked buffer from byte `at` on; the operation's
/// `result` stands if they fit, and EIO replaces it if not (a bug in the poster).
fn land(held: &mut Held, at: usize, pieces: &[Vec<u8>], result: i32) -> i32 {
    let total: usize = pieces.iter().map(Vec::len).sum();
    let Held::Buf(buf) = held else {
        debug_assert!(false, "{total} bytes for an operation parked without a buffer");
        return -libc::EIO;
    };
    if at + total > buf.len() {
        debug_assert!(false, "{total} bytes do not fit the buffer parked at {at}");
        return -libc::EIO;
    }
    let mut to = &mut buf.as_mut_slice()[at..at + total];
    for piece in pieces {
        let (here, rest) = to.split_at_mut(piece.len());
        here.copy_from_slice(piece);
        to = rest;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::op::{ConnId, Tag};

    fn id() -> StorageId {
        StorageId { conn: ConnId(1), tag: Tag { slot: 2, chunk: 0 } }
    }

    #[test]
    fn a_ticket_takes_its_operation_once_and_never_the_slots_next_use() {
        let mut mailbox = Mailbox::new();
        let done = mailbox.park(id(), Held::Nothing, 0, false);
        let stale = done.ticket;
        done.complete(0, Payload::Nothing);
        let mut out = Vec::new();
        mailbox.collect(&mut out);
        assert_eq!((out.len(), mailbox.parked()), (1, 0));
        let next = mailbox.park(id(), Held::Nothing, 0, false);
        assert_eq!(next.ticket.index, stale.index, "the slot is reused");
        assert!(mailbox.take(stale).is_none(), "an old ticket does not take the new operation");
        assert!(mailbox.take(next.ticket).is_some());
        // Its completer's post now names nothing parked; release builds drop it.
        std::mem::forget(next);
    }

    #[test]
    fn bytes_that_fill_the_parked_buffer_become_it_and_others_are_copied_in() {
        let mut mailbox = Mailbox::new();
        let whole = mailbox.park(id(), Held::Buf(Buf::heap(8)), 0, false);
        let part = mailbox.park(id(), Held::Buf(Buf::heap(8)), 2, false);
        let short = mailbox.park(id(), Held::Buf(Buf::heap(8)), 0, false);
        // Every piece goes back through `spent` once: at once when copied, with its
        // buffer when taken.
        static SPENT: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
        fn spent(v: Vec<u8>) {
            SPENT.lock().unwrap().push((v.as_ptr() as usize, v.len()));
        }
        let data = vec![7u8; 8];
        let read_into = data.as_ptr();
        whole.complete(8, Payload::Pieces { pieces: vec![data], spent });
        part.complete(4, Payload::Pieces { pieces: vec![vec![5; 4]], spent });
        short.complete(4, Payload::Pieces { pieces: vec![vec![3; 2], vec![4; 2]], spent });
        let mut out = Vec::new();
        mailbox.collect(&mut out);
        let bufs: Vec<Buf> = out
            .into_iter()
            .map(|c| match c.token {
                Token::Storage { held: Held::Buf(buf), .. } => buf,
                _ => panic!("a read's buffer comes back"),
            })
            .collect();
        assert_eq!(bufs.len(), 3);
        let whole = bufs.iter().find(|b| b.as_slice() == [7; 8]).expect("the whole read");
        assert_eq!(whole.ptr().cast_const(), read_into, "the bytes were taken, not copied");
        assert_eq!(whole.capacity(), 8, "nothing past the bytes read can be exposed");
        assert!(bufs.iter().any(|b| b.as_slice() == [0, 0, 5, 5, 5, 5, 0, 0]), "bytes at an offset are copied in");
        assert!(bufs.iter().any(|b| b.as_slice() == [3, 3, 4, 4, 0, 0, 0, 0]), "pieces are copied in order");
        assert_eq!(SPENT.lock().unwrap().len(), 3, "the copied pieces went back");
        drop(bufs);
        let spent = SPENT.lock().unwrap();
        assert_eq!(spent.len(), 4);
        assert!(spent.contains(&(read_into as usize, 8)), "the taken buffer goes back whole when dropped");
    }

    #[test]
    fn a_read_into_a_pipe_answered_in_memory_comes_back_as_a_buffer_of_its_bytes() {
        let mut pipes = crate::engine::Pipes::new(1, 4096);
        let Some(pipe) = pipes.get() else {
            eprintln!("SKIP: no pipe");
            return;
        };
        let mut mailbox = Mailbox::new();
        let done = mailbox.park(id(), Held::Pipe(pipe), 0, false);
        done.complete(6, Payload::Pieces { pieces: vec![vec![1, 2], vec![3, 4, 5, 6]], spent: drop });
        let mut out = Vec::new();
        mailbox.collect(&mut out);
        match &out[..] {
            [Completion { token: Token::Storage { held: Held::Buf(buf), .. }, result: 6 }] => assert_eq!(buf.as_slice(), &[1, 2, 3, 4, 5, 6]),
            _ => panic!("a buffer of the bytes comes back in place of the pipe"),
        }
        assert_eq!(pipes.in_use(), 0, "the unused pipe was let go");
    }

    #[test]
    fn posts_after_the_mailbox_closed_are_dropped_by_the_poster() {
        let mut mailbox = Mailbox::new();
        let done = mailbox.park(id(), Held::Nothing, 0, false);
        let shared = Arc::clone(&mailbox.shared);
        drop(mailbox);
        done.complete(0, Payload::Pieces { pieces: vec![vec![1; 64]], spent: drop });
        assert!(shared.posts().is_none());
    }
}
