//! [`Recycling`]: a global allocator over the system's that keeps a few large freed blocks and
//! hands them out again, for the extension (`rust/python` installs it; the core itself stays
//! allocator-agnostic).
//!
//! Why: every decoded batch, decompressed page and mixed batch is a fresh buffer of hundreds of
//! KB to a few MB, freed a moment later (when Python drops the batch). glibc serves such sizes
//! with `mmap`, or from the top of its heap, which it trims back to the system whenever more
//! than its trim threshold is free: either way each new buffer lands on pages the kernel must
//! fault in and zero. On `[id, tokens]` without readahead threads that was ~170k page faults a
//! pass of 2M rows; keeping the blocks took its CPU time from 1.30 to 1.02 s (1.35 to 1.10 s
//! with readahead threads; docs/benchmarks.md, "Freed buffers kept for reuse"). glibc could be
//! told to keep its memory instead (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`,
//! `MALLOC_TOP_PAD_`), but those are process-wide settings, the user's to make: this keeps the
//! extension's own large blocks only, as pyarrow keeps its own in its memory pool.
//!
//! What it keeps: blocks of [`MIN_BLOCK`]..=[`MAX_BLOCK`] bytes, their sizes rounded up to one
//! of 8 classes per power of two (so that a batch a little larger than the last still reuses
//! its block), at most [`SLOTS`] blocks and `cap` bytes, the least recently freed given back
//! first. Everything else goes straight to [`System`].
//!
//! Never blocks: the kept blocks sit behind a try-lock; a thread that finds it taken uses the
//! system allocator for that call. So a child forked while another thread held it (a DataLoader
//! worker) cannot hang; it only never reuses the blocks it inherited.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

/// Smaller blocks come from the system allocator's heap (glibc's first mmap threshold).
pub const MIN_BLOCK: usize = 128 << 10;
/// Larger blocks are rare (a shuffle buffer's compaction) and would crowd out the rest.
pub const MAX_BLOCK: usize = 16 << 20;
/// Blocks kept at most.
pub const SLOTS: usize = 32;
/// Alignments kept (arrow's buffers ask for 64 or 128; `Vec`s for their element's).
const MAX_ALIGN: usize = 128;

/// The allocator; `Recycling::new(cap)` keeps at most `cap` bytes of freed blocks.
pub struct Recycling {
    cap: usize,
    lock: AtomicBool,
    kept: UnsafeCell<Kept>,
}

// SAFETY: `kept` is only touched by the thread that holds `lock`.
unsafe impl Sync for Recycling {}

struct Kept {
    slots: [Slot; SLOTS],
    bytes: usize,
    clock: u64,
}

#[derive(Clone, Copy)]
struct Slot {
    /// Null: empty.
    ptr: *mut u8,
    size: usize,
    align: usize,
    freed: u64,
}

const EMPTY: Slot = Slot {
    ptr: ptr::null_mut(),
    size: 0,
    align: 0,
    freed: 0,
};

/// The size a block of `size` bytes aligned to `align` really has, if it is one this allocator
/// keeps: `size` rounded up to the next eighth of its power of two.
fn class(size: usize, align: usize) -> Option<usize> {
    if !(MIN_BLOCK..=MAX_BLOCK).contains(&size) || align > MAX_ALIGN {
        return None;
    }
    let step = 1usize << (size.ilog2() - 3);
    Some((size + step - 1) & !(step - 1))
}

impl Recycling {
    pub const fn new(cap: usize) -> Recycling {
        Recycling {
            cap,
            lock: AtomicBool::new(false),
            kept: UnsafeCell::new(Kept {
                slots: [EMPTY; SLOTS],
                bytes: 0,
                clock: 0,
            }),
        }
    }

    /// `f` on the kept blocks, or `None` if another thread holds them.
    fn with<R>(&self, f: impl FnOnce(&mut Kept) -> R) -> Option<R> {
        if self
            .lock
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        // SAFETY: the lock is held until the store below.
        let r = f(unsafe { &mut *self.kept.get() });
        self.lock.store(false, Ordering::Release);
        Some(r)
    }

    /// A kept block of exactly `size` bytes and `align`.
    fn take(&self, size: usize, align: usize) -> Option<*mut u8> {
        self.with(|k| {
            let slot = k
                .slots
                .iter_mut()
                .find(|s| !s.ptr.is_null() && s.size == size && s.align == align)?;
            k.bytes -= size;
            Some(std::mem::replace(slot, EMPTY).ptr)
        })
        .flatten()
    }

    /// Keep `ptr` (a block of `size` bytes, `align`), giving the least recently freed blocks
    /// back to the system to make room; `false`: not kept (the caller frees it).
    fn keep(&self, ptr: *mut u8, size: usize, align: usize) -> bool {
        if size > self.cap {
            return false;
        }
        let cap = self.cap;
        self.with(|k| {
            while k.bytes + size > cap || k.slots.iter().all(|s| !s.ptr.is_null()) {
                let Some(oldest) = k
                    .slots
                    .iter_mut()
                    .filter(|s| !s.ptr.is_null())
                    .min_by_key(|s| s.freed)
                else {
                    return false;
                };
                k.bytes -= oldest.size;
                // (under the lock: other threads meanwhile use the system allocator)
                free(std::mem::replace(oldest, EMPTY));
            }
            let Some(slot) = k.slots.iter_mut().find(|s| s.ptr.is_null()) else {
                return false;
            };
            k.clock += 1;
            *slot = Slot {
                ptr,
                size,
                align,
                freed: k.clock,
            };
            k.bytes += size;
            true
        })
        .unwrap_or(false)
    }

    /// Bytes kept now (for tests and diagnostics).
    pub fn kept_bytes(&self) -> Option<usize> {
        self.with(|k| k.bytes)
    }

    /// Give every kept block back to the system.
    pub fn release(&self) {
        while let Some(Some(s)) = self.with(|k| {
            let s = k.slots.iter_mut().find(|s| !s.ptr.is_null())?;
            k.bytes -= s.size;
            Some(std::mem::replace(s, EMPTY))
        }) {
            free(s);
        }
    }
}

/// Give a block back to the system.
fn free(s: Slot) {
    if !s.ptr.is_null() {
        // SAFETY: every kept or evicted block came from `System` with this size and alignment.
        unsafe { System.dealloc(s.ptr, Layout::from_size_align_unchecked(s.size, s.align)) }
    }
}

// SAFETY: every block handed out is at least `layout.size()` bytes with `layout.align()`; a
// block of a class is always `class` bytes from `System` with the caller's alignment, and is
// given back to `System` (or kept) with that same layout, whatever path it took.
unsafe impl GlobalAlloc for Recycling {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class(layout.size(), layout.align()) {
            Some(c) => self.take(c, layout.align()).unwrap_or_else(|| {
                System.alloc(Layout::from_size_align_unchecked(c, layout.align()))
            }),
            None => System.alloc(layout),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match class(layout.size(), layout.align()) {
            Some(c) => match self.take(c, layout.align()) {
                Some(p) => {
                    // Resident pages: cheaper to clear than fresh ones to fault in.
                    ptr::write_bytes(p, 0, layout.size());
                    p
                }
                None => System.alloc_zeroed(Layout::from_size_align_unchecked(c, layout.align())),
            },
            None => System.alloc_zeroed(layout),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match class(layout.size(), layout.align()) {
            Some(c) => {
                if !self.keep(ptr, c, layout.align()) {
                    System.dealloc(ptr, Layout::from_size_align_unchecked(c, layout.align()));
                }
            }
            None => System.dealloc(ptr, layout),
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        let old = class(layout.size(), align);
        let new = class(new_size, align);
        if old.is_some() && old == new {
            return ptr; // the block already has the room
        }
        // The system's realloc (glibc moves a mapped block with `mremap`, without copying),
        // from the block's real size to the new one's.
        let from = Layout::from_size_align_unchecked(old.unwrap_or(layout.size()), align);
        System.realloc(ptr, from, new.unwrap_or(new_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_round_up_to_an_eighth_of_the_power_of_two() {
        assert_eq!(class(MIN_BLOCK - 1, 8), None);
        assert_eq!(class(MIN_BLOCK, 8), Some(MIN_BLOCK));
        assert_eq!(class(MIN_BLOCK + 1, 8), Some(MIN_BLOCK + MIN_BLOCK / 8));
        assert_eq!(class(1 << 21, 1), Some(1 << 21));
        assert_eq!(class((1 << 21) + 5, 1), Some((1 << 21) + (1 << 18)));
        assert_eq!(class((1 << 22) - 1, 64), Some(1 << 22));
        assert_eq!(class(MAX_BLOCK, 8), Some(MAX_BLOCK));
        assert_eq!(class(MAX_BLOCK + 1, 8), None);
        assert_eq!(class(1 << 20, 256), None);
        for size in [MIN_BLOCK, 300_001, 2_500_000, 9_999_999, MAX_BLOCK] {
            let c = class(size, 8).unwrap();
            assert!(c >= size && c - size < size / 8 + 1, "{size} -> {c}");
        }
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_its_class() {
        let a = Recycling::new(32 << 20);
        unsafe {
            let p = a.alloc(layout(2_400_000, 4));
            assert!(!p.is_null() && p as usize % 4 == 0);
            p.write_bytes(7, 2_400_000);
            a.dealloc(p, layout(2_400_000, 4));
            assert_eq!(a.kept_bytes(), class(2_400_000, 4));
            // another size of the same class, same alignment: the same block
            let q = a.alloc(layout(2_450_000, 4));
            assert_eq!(q, p);
            assert_eq!(a.kept_bytes(), Some(0));
            // another alignment: not that block (none kept: a new one)
            a.dealloc(q, layout(2_450_000, 4));
            let r = a.alloc(layout(2_450_000, 64));
            assert_ne!(r, p);
            assert_eq!(r as usize % 64, 0);
            a.dealloc(r, layout(2_450_000, 64));
            // zeroed from a kept block: the requested bytes are zero
            let z = a.alloc_zeroed(layout(2_500_000, 4));
            assert!(z == p || z == r);
            assert!(std::slice::from_raw_parts(z, 2_500_000)
                .iter()
                .all(|&b| b == 0));
            a.dealloc(z, layout(2_500_000, 4));
            a.release();
            assert_eq!(a.kept_bytes(), Some(0));
        }
    }

    #[test]
    fn small_and_huge_blocks_are_not_kept() {
        let a = Recycling::new(64 << 20);
        unsafe {
            for size in [16, MIN_BLOCK - 1, MAX_BLOCK + 1] {
                let p = a.alloc(layout(size, 8));
                p.write_bytes(1, size);
                a.dealloc(p, layout(size, 8));
                assert_eq!(a.kept_bytes(), Some(0), "{size}");
            }
        }
    }

    #[test]
    fn the_cap_and_the_slots_bound_what_is_kept() {
        let a = Recycling::new(8 << 20);
        unsafe {
            // five 2 MiB blocks freed: four fit the cap, the oldest is given back
            let ps: Vec<*mut u8> = (0..5).map(|_| a.alloc(layout(2 << 20, 8))).collect();
            for &p in &ps {
                a.dealloc(p, layout(2 << 20, 8));
            }
            assert_eq!(a.kept_bytes(), Some(8 << 20));
            let again: Vec<*mut u8> = (0..4).map(|_| a.alloc(layout(2 << 20, 8))).collect();
            let mut kept: Vec<_> = again.clone();
            kept.sort();
            let mut newest: Vec<_> = ps[1..].to_vec();
            newest.sort();
            assert_eq!(kept, newest, "the four most recently freed come back");
            for p in again {
                a.dealloc(p, layout(2 << 20, 8));
            }
            // a block larger than the cap is never kept
            let big = a.alloc(layout(9 << 20, 8));
            a.dealloc(big, layout(9 << 20, 8));
            assert_eq!(a.kept_bytes(), Some(8 << 20));
            a.release();
        }
        let a = Recycling::new(1 << 30);
        unsafe {
            let ps: Vec<*mut u8> = (0..SLOTS + 3)
                .map(|_| a.alloc(layout(MIN_BLOCK, 8)))
                .collect();
            for &p in &ps {
                a.dealloc(p, layout(MIN_BLOCK, 8));
            }
            assert_eq!(a.kept_bytes(), Some(SLOTS * MIN_BLOCK));
            a.release();
        }
    }

    #[test]
    fn realloc_keeps_contents_across_classes_and_sizes() {
        let a = Recycling::new(32 << 20);
        unsafe {
            let mut size = 1000;
            let mut p = a.alloc(layout(size, 8));
            for i in 0..size {
                *p.add(i) = i as u8;
            }
            // grow through small, kept and huge sizes, then shrink back
            for next in [200_000, 210_000, 3_000_000, 20 << 20, 5_000_000, 100] {
                p = a.realloc(p, layout(size, 8), next);
                assert!(!p.is_null());
                for i in 0..size.min(next).min(1000) {
                    assert_eq!(*p.add(i), i as u8, "{size} -> {next} at {i}");
                }
                size = next;
            }
            a.dealloc(p, layout(size, 8));
            a.release();
        }
    }

    #[test]
    fn a_held_lock_sends_every_call_to_the_system() {
        let a = Recycling::new(32 << 20);
        unsafe {
            let p = a.alloc(layout(1 << 20, 8));
            a.dealloc(p, layout(1 << 20, 8));
            assert_eq!(a.kept_bytes(), Some(1 << 20));
            a.lock.store(true, Ordering::SeqCst); // as in a child forked mid-call
            let q = a.alloc(layout(1 << 20, 8));
            assert_ne!(q, p, "the kept block is out of reach");
            a.dealloc(q, layout(1 << 20, 8));
            assert_eq!(a.kept_bytes(), None);
            a.lock.store(false, Ordering::SeqCst);
            assert_eq!(a.kept_bytes(), Some(1 << 20));
            a.release();
        }
    }
}
