//! Page-aligned I/O buffers. A worker's pool maps memory in large slabs as load asks for
//! it, up to its budget, and the ring registers each slab the first time an operation uses
//! it, so reads and writes use fixed buffers. A slab that nothing has used for the quiet
//! period is unregistered and unmapped, so an idle server holds (and pins) nothing. Past
//! the budget a buffer comes from the heap instead, so a stalled client never starves the
//! others.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::buddy::{order_for, Buddy};
use crate::limits::{BUFFER_POOL_GROW_STEP_BYTES, BUFFER_POOL_SLABS_MAX, BUFFER_POOL_SLAB_MAX_BYTES, HUGE_PAGE_BYTES};

/// Alignment and allocation unit of every buffer from the pool or the heap: a page, what
/// O_DIRECT needs on any device. (A buffer made `from_vec` has a Vec's alignment: its bytes
/// are only sent, never read into again.)
pub const BUFFER_ALIGN_BYTES: usize = crate::limits::PAGE_BYTES;

/// One slab: a mapping that a buddy allocator splits into buffers.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    /// The ring's fixed-buffer slot this slab is registered in.
    slot: u16,
    /// Unique among the pool's slabs, past and present: a slot a later slab reuses must be
    /// registered again, and the ring tells the two apart by this.
    id: u64,
    buddy: RefCell<Buddy>,
}

impl Region {
    fn map(len: usize, slot: u16, id: u64) -> std::io::Result<Region> {
        // Slabs of whole huge pages are mapped on a huge-page boundary and asked to be
        // backed by huge pages: a buffer then lies in few physically contiguous runs, so
        // its I/O needs fewer segments and the kernel registers it in fewer pieces.
        let align = if len >= HUGE_PAGE_BYTES { HUGE_PAGE_BYTES } else { BUFFER_ALIGN_BYTES };
        let span = len + align - BUFFER_ALIGN_BYTES;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions; the
        // result is checked before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        // SAFETY: both ranges lie inside the mapping made above and outside [aligned,
        // aligned + len), which is all the region keeps; unmapping them touches nothing else.
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            if start + span > aligned + len {
                libc::munmap((aligned + len) as *mut libc::c_void, start + span - aligned - len);
            }
        }
        if align == HUGE_PAGE_BYTES {
            // SAFETY: advice on a range this region owns; failure (no THP) leaves small pages.
            unsafe { libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        }
        let base = NonNull::new(aligned as *mut u8).expect("mmap never returns null on success");
        let blocks = len / BUFFER_ALIGN_BYTES;
        let buddy = RefCell::new(Buddy::new(blocks, blocks.trailing_zeros() as u8));
        Ok(Region { base, len, slot, id, buddy })
    }

    pub(super) fn slot(&self) -> u16 {
        self.slot
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }

    pub(super) fn iovec(&self) -> libc::iovec {
        libc::iovec { iov_base: self.base.as_ptr().cast(), iov_len: self.len }
    }

    fn free_bytes(&self) -> usize {
        self.buddy.borrow().free_blocks() * BUFFER_ALIGN_BYTES
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: base/len came from the mmap in `Region::map`; every Buf holds an Rc to the
        // region and the ring holds in-flight Bufs, so no pointer into it survives this drop.
        // The kernel's registration (if any) holds its own references to the pages, and the
        // pool has the ring drop it first (`Pool::tick`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Where a buffer made `from_vec` goes when dropped: back to whoever allocated it.
pub type Spent = fn(Vec<u8>);

enum Origin {
    Pool { region: Rc<Region>, block: u32, order: u8 },
    Heap { layout: Layout },
    /// A `Vec`'s allocation, taken over whole (`from_vec`): `capacity` is the Vec's, to
    /// rebuild it; only the first `init` bytes were ever written. It goes to `spent` when
    /// the buffer is dropped.
    Vec { capacity: usize, init: usize, spent: Spent },
    /// Bytes shared with other threads (`shared`), only ever sent: never written through
    /// this buffer, which keeps them alive.
    Shared { _bytes: std::sync::Arc<Vec<u8>> },
}

/// An owned buffer, page-aligned unless made `from_vec`. Whoever holds it may touch its
/// bytes; while an operation is in flight the ring holds it, so the kernel and Rust code
/// never share it.
pub struct Buf {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
}

#[allow(clippy::len_without_is_empty)]
impl Buf {
    /// A heap buffer of `len` bytes outside any pool, zero-filled.
    pub fn heap(len: usize) -> Buf {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(BUFFER_ALIGN_BYTES), BUFFER_ALIGN_BYTES)
            .expect("buffer sizes are bounded by the request limit");
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else { std::alloc::handle_alloc_error(layout) };
        Buf { ptr, len, origin: Origin::Heap { layout } }
    }

    /// Bytes read elsewhere (a remote export's reply, read on the runtime's thread) as a
    /// buffer, without copying them. Not page-aligned: for sending, never for O_DIRECT.
    /// When dropped, the Vec goes to `spent` (its owner's pool, or `drop`).
    pub fn from_vec(bytes: Vec<u8>, spent: Spent) -> Buf {
        let mut bytes = std::mem::ManuallyDrop::new(bytes);
        let (len, capacity) = (bytes.len(), bytes.capacity());
        let ptr = NonNull::new(bytes.as_mut_ptr()).expect("a Vec's pointer is never null");
        Buf { ptr, len, origin: Origin::Vec { capacity, init: len, spent } }
    }

    /// `bytes[range]` as a buffer to send from, without copying them; writing into it is
    /// a bug (`as_mut_slice` panics).
    pub fn shared(bytes: std::sync::Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Buf {
        assert!(range.start <= range.end && range.end <= bytes.len());
        // The pointer is only ever read through (sends, `as_slice`): see `as_mut_slice`.
        let ptr = NonNull::new(bytes[range.start..].as_ptr().cast_mut()).expect("a slice's pointer is never null");
        Buf { ptr, len: range.len(), origin: Origin::Shared { _bytes: bytes } }
    }

    /// The Vec a buffer made `from_vec` took over, with the bytes it holds now; any other
    /// buffer comes back as it is.
    pub fn into_vec(self) -> Result<Vec<u8>, Buf> {
        let Origin::Vec { capacity, init, .. } = &self.origin else { return Err(self) };
        let (capacity, init) = (*capacity, *init);
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in `drop`: the allocation of the Vec `from_vec` took over, whose first
        // `init` bytes are initialised; `this` is never dropped, so nothing frees it twice.
        let mut v = unsafe { Vec::from_raw_parts(this.ptr.as_ptr(), init, capacity) };
        v.truncate(this.len);
        Ok(v)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes this buffer can hold without reallocation.
    pub fn capacity(&self) -> usize {
        match &self.origin {
            Origin::Pool { order, .. } => BUFFER_ALIGN_BYTES << order,
            Origin::Heap { layout } => layout.size(),
            // Past `init` the bytes were never written: no use may see them.
            Origin::Vec { init, .. } => *init,
            Origin::Shared { .. } => self.len,
        }
    }

    /// Sets the length the buffer presents, within its capacity; the bytes keep their value.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity());
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity() >= len bytes, initialised (zeroed, written by
        // the kernel, or the Vec's bytes), and this Buf is the sole owner of the range.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(!matches!(self.origin, Origin::Shared { .. }), "bytes other threads share are never written");
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The pool slab this buffer lies in; None for a heap buffer.
    pub(super) fn region(&self) -> Option<&Region> {
        match &self.origin {
            Origin::Pool { region, .. } => Some(region),
            Origin::Heap { .. } | Origin::Vec { .. } | Origin::Shared { .. } => None,
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        match &self.origin {
            // SAFETY: ptr and layout are the pair alloc_zeroed returned in `heap`.
            Origin::Heap { layout } => unsafe { dealloc(self.ptr.as_ptr(), *layout) },
            Origin::Pool { region, block, order } => region.buddy.borrow_mut().free(*block, *order),
            Origin::Vec { capacity, init, spent } => {
                // SAFETY: ptr and capacity are the allocation of the Vec `from_vec` took
                // over, which nothing else frees or holds; its first `init` bytes were the
                // Vec's initialised ones, and writes through this Buf kept them so.
                spent(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), *init, *capacity) })
            }
            Origin::Shared { .. } => {}
        }
    }
}

/// What a worker's pool did, for the metrics: shared with the scraper's thread, moved only
/// when the pool maps or releases a slab, or falls back to the heap.
#[derive(Default)]
pub struct BufferStats {
    /// Bytes of slabs mapped now, over all pools.
    pub mapped_bytes: AtomicU64,
    pub grows: AtomicU64,
    pub releases: AtomicU64,
    pub heap_fallbacks: AtomicU64,
}

struct Slab {
    region: Rc<Region>,
    /// Buffers handed out from this slab so far.
    uses: u64,
    /// When the slab was first seen with nothing handed out, and `uses` at that time: if
    /// `uses` moved since, it was not quiet.
    idle: Option<(Instant, u64)>,
}

/// A worker's buffers: slabs mapped as load asks, each split by a buddy allocator, with
/// heap fallback past the budget.
pub struct Pool {
    /// In the order they were mapped: buffers come from the oldest slab with room, so
    /// the newest empty first when load falls and are given back.
    slabs: Vec<Slab>,
    budget_bytes: usize,
    mapped_bytes: usize,
    /// Smallest slab mapped while the budget allows one.
    slab_min_bytes: usize,
    quiet: Duration,
    free_slots: Vec<u16>,
    slot_count: u16,
    next_id: u64,
    stats: Arc<BufferStats>,
}

impl Pool {
    /// A pool that maps nothing until the first buffer is asked for, and at most
    /// `budget_bytes` in all; slabs unused for `quiet` are given back.
    pub fn new(budget_bytes: usize, quiet: Duration, stats: Arc<BufferStats>) -> Pool {
        let budget_pages = prev_power_of_two(budget_bytes / BUFFER_ALIGN_BYTES);
        let slab_min_bytes = BUFFER_POOL_GROW_STEP_BYTES.min(budget_pages * BUFFER_ALIGN_BYTES).max(BUFFER_ALIGN_BYTES);
        // Full-size slabs need budget / minimum slots; as many again for the smaller ones cut
        // where the budget ends.
        let slot_count = (2 * budget_bytes / slab_min_bytes).clamp(1, BUFFER_POOL_SLABS_MAX) as u16;
        Pool {
            slabs: Vec::new(),
            budget_bytes,
            mapped_bytes: 0,
            slab_min_bytes,
            quiet,
            free_slots: (0..slot_count).rev().collect(),
            slot_count,
            next_id: 1,
            stats,
        }
    }

    /// Fixed-buffer slots the ring must set aside for this pool's slabs.
    pub fn slots(&self) -> u32 {
        u32::from(self.slot_count)
    }

    /// A buffer of `len` bytes from a slab, mapping one if the budget allows, or from the
    /// heap. Its contents are whatever the last user left; callers overwrite before sending.
    pub fn get(&mut self, len: usize) -> Buf {
        let order = order_for(len, BUFFER_ALIGN_BYTES);
        let take = |slab: &Slab| slab.region.buddy.borrow_mut().alloc(order);
        let found = self.slabs.iter().enumerate().find_map(|(i, slab)| take(slab).map(|block| (i, block)));
        let found = found.or_else(|| self.grow(order).and_then(|i| take(&self.slabs[i]).map(|block| (i, block))));
        let Some((index, block)) = found else {
            self.stats.heap_fallbacks.fetch_add(1, Ordering::Relaxed);
            return Buf::heap(len);
        };
        let slab = &mut self.slabs[index];
        slab.uses += 1;
        // SAFETY: the buddy allocator only returns runs inside the region.
        let ptr = unsafe { slab.region.base.add(block as usize * BUFFER_ALIGN_BYTES) };
        Buf { ptr, len, origin: Origin::Pool { region: Rc::clone(&slab.region), block, order } }
    }

    /// Maps a slab that holds a run of `order`: as large as all slabs so far (so the pool
    /// doubles and maps few times), at least the minimum step, within the budget. Its index.
    fn grow(&mut self, order: u8) -> Option<usize> {
        let need = BUFFER_ALIGN_BYTES << order;
        if need > BUFFER_POOL_SLAB_MAX_BYTES {
            return None;
        }
        let mut len = need.max(self.slab_min_bytes).max(self.mapped_bytes.next_power_of_two()).min(BUFFER_POOL_SLAB_MAX_BYTES);
        while len > need && self.mapped_bytes + len > self.budget_bytes {
            len /= 2;
        }
        if self.mapped_bytes + len > self.budget_bytes {
            return None;
        }
        let slot = self.free_slots.pop()?;
        match Region::map(len, slot, self.next_id) {
            Ok(region) => {
                self.next_id += 1;
                self.mapped_bytes += len;
                self.stats.mapped_bytes.fetch_add(len as u64, Ordering::Relaxed);
                self.stats.grows.fetch_add(1, Ordering::Relaxed);
                self.slabs.push(Slab { region: Rc::new(region), uses: 0, idle: None });
                Some(self.slabs.len() - 1)
            }
            Err(e) => {
                log::debug!("could not map a {len}-byte buffer slab: {e}");
                self.free_slots.push(slot);
                None
            }
        }
    }

    /// Gives back every slab that nothing has used for the quiet period, after `unfix`
    /// (the ring) let go of its registration. Returns when the next slab will be due, if
    /// any may become due without more traffic: the worker sleeps no longer than that.
    pub fn tick(&mut self, now: Instant, mut unfix: impl FnMut(&Region)) -> Option<Instant> {
        let (quiet, mut next, before) = (self.quiet, None::<Instant>, self.slabs.len());
        let mut released = 0;
        let free_slots = &mut self.free_slots;
        self.slabs.retain_mut(|slab| {
            if Rc::strong_count(&slab.region) > 1 {
                slab.idle = None;
                return true;
            }
            let since = match slab.idle {
                Some((since, uses)) if uses == slab.uses => since,
                _ => slab.idle.insert((now, slab.uses)).0,
            };
            let due = since + quiet;
            if now < due {
                next = Some(next.map_or(due, |n| n.min(due)));
                return true;
            }
            unfix(&slab.region);
            free_slots.push(slab.region.slot);
            released += slab.region.len;
            false
        });
        if self.slabs.len() < before {
            self.mapped_bytes -= released;
            self.stats.mapped_bytes.fetch_sub(released as u64, Ordering::Relaxed);
            self.stats.releases.fetch_add((before - self.slabs.len()) as u64, Ordering::Relaxed);
            if self.slabs.is_empty() {
                release_heap();
            }
        }
        next
    }

    /// Bytes of slabs mapped now.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped_bytes
    }

    /// Bytes handed out and not yet returned (the simulation checks that all come back).
    pub fn bytes_out(&self) -> usize {
        self.slabs.iter().map(|s| s.region.len - s.region.free_bytes()).sum()
    }
}

/// Largest power of two not above `n`; 0 for 0.
fn prev_power_of_two(n: usize) -> usize {
    if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) }
}

/// Asks the C allocator to return freed heap memory (heap-fallback buffers, buffers of
/// closed connections) to the system: at rest, after the last slab went.
fn release_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    const QUIET: Duration = Duration::from_secs(5);

    fn pool(budget: usize) -> Pool {
        Pool::new(budget, QUIET, Arc::default())
    }

    fn slot_of(buf: &Buf) -> Option<u16> {
        buf.region().map(Region::slot)
    }

    #[test]
    fn pool_buffers_are_aligned_disjoint_and_returned_on_drop() {
        let mut pool = pool(MIB);
        let mut a = pool.get(4096);
        let mut b = pool.get(10_000);
        assert_eq!(a.ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        assert_eq!(b.ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        assert!(a.as_slice().iter().all(|&x| x == 1), "writing b must not touch a");
        assert_eq!(b.capacity(), 16384);
        assert_eq!(pool.bytes_out(), 4096 + 16384);
        drop(a);
        drop(b);
        assert_eq!(pool.bytes_out(), 0);
    }

    #[test]
    fn exhausted_pool_falls_back_to_heap() {
        let mut pool = pool(MIB);
        let whole = pool.get(MIB);
        assert!(whole.region().is_some());
        let extra = pool.get(4096);
        assert!(extra.region().is_none());
        assert_eq!(pool.stats.heap_fallbacks.load(Ordering::Relaxed), 1);
        assert_eq!(pool.mapped_bytes(), MIB);
    }

    #[test]
    fn maps_nothing_until_asked_then_doubles_within_the_budget() {
        let mut pool = pool(64 * MIB);
        assert_eq!(pool.mapped_bytes(), 0);
        let step = BUFFER_POOL_GROW_STEP_BYTES;
        let mut held: Vec<Buf> = (0..step / MIB).map(|_| pool.get(MIB)).collect();
        assert_eq!(pool.mapped_bytes(), step, "one step holds the first buffers");
        let mut sizes = vec![step];
        while pool.mapped_bytes() < 64 * MIB {
            let before = pool.mapped_bytes();
            held.push(pool.get(MIB));
            if pool.mapped_bytes() > before {
                sizes.push(pool.mapped_bytes() - before);
            }
        }
        // Each slab is as large as all before it: few mappings, few registrations.
        assert_eq!(sizes, [4, 4, 8, 16, 32].map(|m| m * MIB));
        while held.len() < 64 {
            held.push(pool.get(MIB));
        }
        assert!(held.iter().all(|b| b.region().is_some()));
        assert!(pool.get(MIB).region().is_none(), "past the budget, the heap");
        assert_eq!(pool.mapped_bytes(), 64 * MIB);
        assert_eq!(pool.stats.grows.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_request_larger_than_the_step_gets_a_slab_that_holds_it() {
        let mut pool = pool(64 * MIB);
        let big = pool.get(32 * MIB);
        assert!(big.region().is_some());
        assert_eq!(pool.mapped_bytes(), 32 * MIB);
    }

    #[test]
    fn a_quiet_slab_is_given_back_once_the_quiet_period_has_passed() {
        let mut pool = pool(64 * MIB);
        let t0 = Instant::now();
        drop(pool.get(MIB));
        let mut unfixed = Vec::new();
        assert_eq!(pool.tick(t0, |r| unfixed.push(r.slot())), Some(t0 + QUIET));
        assert_eq!(pool.tick(t0 + QUIET - Duration::from_nanos(1), |r| unfixed.push(r.slot())), Some(t0 + QUIET));
        assert!(unfixed.is_empty());
        assert_eq!(pool.tick(t0 + QUIET, |r| unfixed.push(r.slot())), None);
        assert_eq!((unfixed.len(), pool.mapped_bytes(), pool.stats.mapped_bytes.load(Ordering::Relaxed)), (1, 0, 0));
        assert_eq!(pool.stats.releases.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_slab_used_or_held_is_kept() {
        let mut pool = pool(64 * MIB);
        let t0 = Instant::now();
        drop(pool.get(MIB));
        pool.tick(t0, |_| panic!("nothing is due"));
        // Used again between two looks: the quiet period starts over at the second look.
        drop(pool.get(MIB));
        assert_eq!(pool.tick(t0 + QUIET, |_| panic!("it was used")), Some(t0 + 2 * QUIET));
        // A buffer out keeps its slab whatever the time, and sets no deadline.
        let held = pool.get(MIB);
        assert_eq!(pool.tick(t0 + 10 * QUIET, |_| panic!("a buffer is out")), None);
        drop(held);
        assert_eq!(pool.tick(t0 + 10 * QUIET, |_| panic!("just freed")), Some(t0 + 11 * QUIET));
    }

    #[test]
    fn the_newest_slabs_empty_first_and_a_reused_slot_gets_a_new_id() {
        let mut pool = pool(64 * MIB);
        let t0 = Instant::now();
        let burst: Vec<Buf> = (0..8).map(|_| pool.get(MIB)).collect();
        assert_eq!(pool.mapped_bytes(), 8 * MIB);
        let (first_slot, first_id) = burst[0].region().map(|r| (r.slot(), r.id())).unwrap();
        drop(burst);
        // Light load afterwards is served from the oldest slab; the other one goes.
        let light = pool.get(MIB);
        assert_eq!(slot_of(&light), Some(first_slot));
        let mut gone = Vec::new();
        pool.tick(t0, |r| gone.push(r.slot()));
        pool.tick(t0 + QUIET, |r| gone.push(r.slot()));
        assert_eq!((gone.len(), pool.mapped_bytes()), (1, 4 * MIB));
        drop(light);
        pool.tick(t0 + 3 * QUIET, |r| gone.push(r.slot()));
        pool.tick(t0 + 4 * QUIET, |r| gone.push(r.slot()));
        assert_eq!(pool.mapped_bytes(), 0);
        let again = pool.get(MIB);
        let (slot, id) = again.region().map(|r| (r.slot(), r.id())).unwrap();
        assert!(gone.contains(&slot) && id != first_id, "slot {slot} id {id}");
    }
}
