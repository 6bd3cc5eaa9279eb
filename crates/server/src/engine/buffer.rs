//! Page-aligned I/O buffers. A worker's pool carves them out of one region that the ring
//! registers once, so reads and writes use fixed buffers; when the region is exhausted a
//! buffer comes from the heap instead, so a stalled client never starves the others.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use super::buddy::{order_for, Buddy};

/// Alignment and allocation unit of every buffer: a page, what O_DIRECT needs on any device.
pub const BUFFER_ALIGN_BYTES: usize = crate::limits::PAGE_BYTES;

struct Region {
    base: NonNull<u8>,
    len: usize,
    buddy: RefCell<Buddy>,
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: base/len came from the mmap in `Pool::new`; every Buf holds an Rc to the
        // region and the ring holds in-flight Bufs, so no pointer into it survives this drop.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

enum Origin {
    Pool { region: Rc<Region>, block: u32, order: u8 },
    Heap { layout: Layout },
}

/// An owned, aligned buffer. Whoever holds it may touch its bytes; while an operation is in
/// flight the ring holds it, so the kernel and Rust code never share it.
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

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes this buffer can hold without reallocation.
    pub fn capacity(&self) -> usize {
        match &self.origin {
            Origin::Pool { order, .. } => BUFFER_ALIGN_BYTES << order,
            Origin::Heap { layout } => layout.size(),
        }
    }

    /// Sets the length the buffer presents, within its capacity; the bytes keep their value.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity());
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity() >= len bytes, initialised (zeroed or written by
        // the kernel), and this Buf is the sole owner of the range.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether this buffer lies inside the pool region the ring registered.
    pub(super) fn is_registered(&self) -> bool {
        matches!(self.origin, Origin::Pool { .. })
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        match &self.origin {
            // SAFETY: ptr and layout are the pair alloc_zeroed returned in `heap`.
            Origin::Heap { layout } => unsafe { dealloc(self.ptr.as_ptr(), *layout) },
            Origin::Pool { region, block, order } => region.buddy.borrow_mut().free(*block, *order),
        }
    }
}

/// A worker's buffers: one region split by a buddy allocator, with heap fallback.
pub struct Pool {
    region: Rc<Region>,
    heap_fallbacks: u64,
}

impl Pool {
    /// `bytes` is rounded down to whole top-level runs of `run_max_bytes`.
    pub fn new(bytes: usize, run_max_bytes: usize) -> std::io::Result<Pool> {
        let max_order = order_for(run_max_bytes, BUFFER_ALIGN_BYTES);
        let run = BUFFER_ALIGN_BYTES << max_order;
        let len = (bytes / run).max(1) * run;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions; the
        // result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).expect("mmap never returns null on success");
        let buddy = RefCell::new(Buddy::new(len / BUFFER_ALIGN_BYTES, max_order));
        Ok(Pool { region: Rc::new(Region { base, len, buddy }), heap_fallbacks: 0 })
    }

    /// A buffer of `len` bytes from the region, or from the heap when the region is full.
    /// Its contents are whatever the last user left; callers overwrite before sending.
    pub fn get(&mut self, len: usize) -> Buf {
        let order = order_for(len, BUFFER_ALIGN_BYTES);
        let block = self.region.buddy.borrow_mut().alloc(order);
        match block {
            Some(block) => {
                // SAFETY: the buddy allocator only returns runs inside the region.
                let ptr = unsafe { self.region.base.add(block as usize * BUFFER_ALIGN_BYTES) };
                Buf { ptr, len, origin: Origin::Pool { region: Rc::clone(&self.region), block, order } }
            }
            None => {
                self.heap_fallbacks += 1;
                Buf::heap(len)
            }
        }
    }

    /// Buffers that had to come from the heap because the region was full.
    pub fn heap_fallbacks(&self) -> u64 {
        self.heap_fallbacks
    }

    /// Bytes of the region not handed out (the simulation checks that all come back).
    #[cfg(any(test, feature = "sim"))]
    pub fn free_bytes(&self) -> usize {
        self.region.buddy.borrow().free_blocks() * BUFFER_ALIGN_BYTES
    }

    pub(super) fn region(&self) -> (*mut u8, usize) {
        (self.region.base.as_ptr(), self.region.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_buffers_are_aligned_disjoint_and_returned_on_drop() {
        let mut pool = Pool::new(1 << 20, 1 << 20).unwrap();
        let full = pool.free_bytes();
        let mut a = pool.get(4096);
        let mut b = pool.get(10_000);
        assert_eq!(a.ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        assert_eq!(b.ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        assert!(a.as_slice().iter().all(|&x| x == 1), "writing b must not touch a");
        assert_eq!(b.capacity(), 16384);
        drop(a);
        drop(b);
        assert_eq!(pool.free_bytes(), full);
    }

    #[test]
    fn exhausted_pool_falls_back_to_heap() {
        let mut pool = Pool::new(1 << 20, 1 << 20).unwrap();
        let whole = pool.get(1 << 20);
        assert!(whole.is_registered());
        let extra = pool.get(4096);
        assert!(!extra.is_registered());
        assert_eq!(pool.heap_fallbacks(), 1);
    }
}
