//! [`Recycling`]: a global allocator over the system's that maps large blocks itself and keeps
//! a few freed ones to hand out again, for the extension (`rust/python` installs it; the core
//! itself stays allocator-agnostic).
//!
//! Why keep: every decoded batch, decompressed page and mixed batch is a fresh buffer of
//! hundreds of KB to a few MB, freed a moment later (when Python drops the batch). A fresh
//! mapping lands on pages the kernel must fault in and zero. On `[id, tokens]` without readahead
//! threads that was ~170k page faults a pass of 2M rows; keeping the blocks took its CPU time from
//! 1.30 to 1.02 s (1.35 to 1.10 s with readahead threads; docs/benchmarks.md, "Freed buffers kept
//! for reuse"). glibc could be told to keep its memory instead (`MALLOC_MMAP_THRESHOLD_`,
//! `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`), but those are process-wide settings, the user's
//! to make: this keeps the extension's own large blocks only, as pyarrow keeps its own in its
//! memory pool.
//!
//! Why map: glibc serves a large block from its heaps once its mmap threshold has risen past
//! it (it does, to up to 32 MiB, after the first large block is freed). Blocks of many sizes
//! freed at different times (a shuffle buffer's retained batches) then leave holes in those heaps
//! that it can neither reuse nor give back: ~95 MiB at the peak of a 100k-row shuffle, a quarter
//! of its RSS. A block mapped on its own is given back whole when it is freed (and not kept).
//!
//! What it keeps: blocks of [`MIN_BLOCK`]..=[`MAX_BLOCK`] bytes, their sizes rounded up to one
//! of 4 classes per power of two (so that a batch a little larger than the last still reuses
//! its block; a request that no kept block of its class serves takes the smallest kept one of
//! up to twice its size, cut down to it in place, rather than fresh pages), at most [`SLOTS`]
//! blocks and `cap` bytes, the least recently freed given back first, and none that
//! [`MAX_AGE`] other frees per stream reading ([`Reading`]) have passed by while more than half
//! the cap is kept (a block of a size no longer asked for only adds to the peak: a 100k-row
//! shuffle's was ~6 MiB lower without such blocks; docs/benchmarks.md).
//! Smaller blocks, and blocks aligned beyond a page, go straight to [`System`].
//!
//! Never blocks: the kept blocks sit behind a try-lock; a thread that finds it taken maps a new
//! block (or unmaps the freed one) for that call. So a child forked while another thread held it
//! (a DataLoader worker) cannot hang; it only never reuses the blocks it inherited.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Smaller blocks come from the system allocator's heap (glibc's first mmap threshold); from
/// this size on they are mapped, and kept up to [`MAX_BLOCK`].
pub const MIN_BLOCK: usize = 128 << 10;
/// Larger blocks are rare (a shuffle buffer's compaction) and would crowd out the rest.
pub const MAX_BLOCK: usize = 16 << 20;
/// Blocks kept at most.
pub const SLOTS: usize = 64;
/// A kept block not taken again while this many others were freed, per stream reading
/// ([`Reading`]), is given back if more than half the cap is kept.
pub const MAX_AGE: u64 = 64;

/// Streams reading data in this process: each holds one [`Reading`] while it decodes.
static READING: AtomicUsize = AtomicUsize::new(0);

/// One stream reading data, for [`Recycling`]'s age limit while it lives: the limit counts
/// frees, and `k` streams read side by side (a mixture's sources) free `k` times as many blocks
/// between one stream's use of a block and its next, so a block one of them will need again
/// after its next batch is `k` times as many frees away. With one stream's limit, a mixture of
/// 8 sources gave back a block and mapped a fresh one about once per 3,500 rows (page faults
/// 2.5x one stream's over the same rows; docs/benchmarks.md, "Mixtures"). A shuffle's peak
/// memory, set by the blocks kept at its compactions, is one stream's, so unchanged.
pub struct Reading(());

impl Reading {
    pub(crate) fn new() -> Reading {
        READING.fetch_add(1, Ordering::Relaxed);
        Reading(())
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Streams reading data in this process now.
pub fn reading() -> usize {
    READING.load(Ordering::Relaxed)
}

/// The allocator; `Recycling::new(cap)` keeps at most `cap` bytes of freed blocks.
pub struct Recycling {
    cap: usize,
    /// Streams reading ([`READING`]; a test's own counter in tests).
    reading: &'static AtomicUsize,
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
    freed: u64,
}

impl Kept {
    /// Give the least recently freed kept block that `eligible` accepts back to the system;
    /// `false` if there is none. (Under the lock: other threads meanwhile use the system
    /// allocator.)
    fn give_back_oldest(&mut self, eligible: impl Fn(&Slot) -> bool) -> bool {
        let Some(oldest) = self
            .slots
            .iter_mut()
            .filter(|s| !s.ptr.is_null() && eligible(s))
            .min_by_key(|s| s.freed)
        else {
            return false;
        };
        self.bytes -= oldest.size;
        free(std::mem::replace(oldest, EMPTY));
        true
    }
}

const EMPTY: Slot = Slot {
    ptr: ptr::null_mut(),
    size: 0,
    freed: 0,
};

/// The size a block of `size` bytes really has, if it is one this allocator keeps: `size`
/// rounded up to the next quarter of its power of two. (Eighths left more blocks of a class
/// next to the one asked for unused: 118k against 79k page faults on a token pass.)
fn class(size: usize) -> Option<usize> {
    if !(MIN_BLOCK..=MAX_BLOCK).contains(&size) {
        return None;
    }
    let step = 1usize << (size.ilog2() - 2);
    Some((size + step - 1) & !(step - 1))
}

impl Recycling {
    pub const fn new(cap: usize) -> Recycling {
        Recycling::counting(cap, &READING)
    }

    /// An allocator whose age limit follows `reading` streams instead of [`READING`].
    const fn counting(cap: usize, reading: &'static AtomicUsize) -> Recycling {
        Recycling {
            cap,
            reading,
            lock: AtomicBool::new(false),
            kept: UnsafeCell::new(Kept {
                slots: [EMPTY; SLOTS],
                bytes: 0,
                clock: 0,
            }),
        }
    }

    /// [`MAX_AGE`] for the streams reading now (at least one; at most [`SLOTS`] streams' worth,
    /// as no more blocks are kept anyway).
    fn max_age(&self) -> u64 {
        MAX_AGE * self.reading.load(Ordering::Relaxed).clamp(1, SLOTS) as u64
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

    /// A kept block of exactly `size` bytes, or else the smallest kept one of up to twice that,
    /// cut down to it in place (its tail given back).
    fn take(&self, size: usize) -> Option<*mut u8> {
        let s = self
            .with(|k| {
                // The smallest that fits: one of exactly this size if there is one.
                let slot = k
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.ptr.is_null() && (size..=2 * size).contains(&s.size))
                    .min_by_key(|(_, s)| s.size)?
                    .0;
                let s = std::mem::replace(&mut k.slots[slot], EMPTY);
                k.bytes -= s.size;
                Some(s)
            })
            .flatten()?;
        if s.size == size {
            return Some(s.ptr);
        }
        // SAFETY: a kept block of s.size bytes, ours now.
        unsafe { pages::shrink(s.ptr, s.size, size) }
    }

    /// Keep `ptr` (a mapped block of `size` bytes), giving the least recently freed blocks
    /// back to the system to make room; `false`: not kept (the caller frees it).
    fn keep(&self, ptr: *mut u8, size: usize) -> bool {
        if size > self.cap {
            return false;
        }
        let (cap, age) = (self.cap, self.max_age());
        self.with(|k| {
            while k.bytes + size > cap || k.slots.iter().all(|s| !s.ptr.is_null()) {
                if !k.give_back_oldest(|_| true) {
                    return false;
                }
            }
            let Some(slot) = k.slots.iter_mut().find(|s| s.ptr.is_null()) else {
                return false;
            };
            k.clock += 1;
            *slot = Slot {
                ptr,
                size,
                freed: k.clock,
            };
            k.bytes += size;
            let clock = k.clock;
            // Aged blocks go oldest first, and only while more than half the cap is kept: a
            // stream's few blocks of sizes it asks for now and then stay (a pass over strings
            // without readahead threads: 2.3k page faults a pass -> 0.4k), while the bursts a
            // shuffle's compaction frees still go once they age (its peak unchanged).
            while k.bytes > cap / 2 && k.give_back_oldest(|s| clock - s.freed > age) {}
            true
        })
        .unwrap_or(false)
    }

    /// A mapped block for `size` bytes: a kept one ([`Recycling::take`]), else a new mapping
    /// (zero).
    unsafe fn take_or_map(&self, size: usize, zeroed: bool) -> *mut u8 {
        let real = mapped_size(size);
        if real <= MAX_BLOCK {
            if let Some(p) = self.take(real) {
                if zeroed {
                    // Resident pages: cheaper to clear than fresh ones to fault in.
                    ptr::write_bytes(p, 0, size);
                }
                return p;
            }
        }
        pages::map(real)
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

/// Give a kept block back to the system.
fn free(s: Slot) {
    if !s.ptr.is_null() {
        // SAFETY: every kept or evicted block was mapped with this size.
        unsafe { pages::unmap(s.ptr, s.size) }
    }
}

/// Whether a block of this layout is mapped straight from the system (`mmap`) rather than
/// taken from the system allocator's heap: large ones, at most page-aligned.
fn mapped(size: usize, align: usize) -> bool {
    size >= MIN_BLOCK && align <= pages::PAGE
}

/// The bytes a mapped block of `size` really has: its class, or whole pages.
fn mapped_size(size: usize) -> usize {
    class(size).unwrap_or((size + pages::PAGE - 1) & !(pages::PAGE - 1))
}

/// Anonymous mappings: large blocks bypass the system allocator's heap, where blocks of many
/// sizes freed at different times leave holes it cannot give back (a 100k-row shuffle held
/// ~95 MiB free inside glibc's heaps at its peak; docs/benchmarks.md).
#[cfg(unix)]
mod pages {
    /// The smallest page size of the platforms we build for: a mapping is aligned to the real
    /// page size, at least this, and the kernel rounds lengths up to whole real pages in
    /// `mmap`, `munmap` and `mremap` alike, so a block's size need only be the same each time.
    pub const PAGE: usize = 4096;

    pub unsafe fn map(size: usize) -> *mut u8 {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    pub unsafe fn unmap(p: *mut u8, size: usize) {
        libc::munmap(p.cast(), size);
    }

    /// `p` (`old` bytes) cut down to `new` bytes in place (the rest given back), or `None` (and
    /// `p` given back whole) where that can't be done.
    #[cfg(target_os = "linux")]
    pub unsafe fn shrink(p: *mut u8, old: usize, new: usize) -> Option<*mut u8> {
        let q = libc::mremap(p.cast(), old, new, 0);
        if q == libc::MAP_FAILED {
            unmap(p, old);
            None
        } else {
            Some(q.cast())
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub unsafe fn shrink(p: *mut u8, old: usize, _new: usize) -> Option<*mut u8> {
        unmap(p, old);
        None
    }

    /// `p` (`old` bytes) as a block of `new` bytes, moved without copying where it must move.
    #[cfg(target_os = "linux")]
    pub unsafe fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
        let q = libc::mremap(p.cast(), old, new, libc::MREMAP_MAYMOVE);
        if q == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            q.cast()
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub unsafe fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
        let q = map(new);
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p, q, old.min(new));
            unmap(p, old);
        }
        q
    }
}

#[cfg(not(unix))]
mod pages {
    use std::alloc::{GlobalAlloc, Layout, System};
    pub const PAGE: usize = 4096;
    pub unsafe fn map(size: usize) -> *mut u8 {
        System.alloc_zeroed(Layout::from_size_align_unchecked(size, PAGE))
    }
    pub unsafe fn unmap(p: *mut u8, size: usize) {
        System.dealloc(p, Layout::from_size_align_unchecked(size, PAGE))
    }
    pub unsafe fn shrink(p: *mut u8, old: usize, _new: usize) -> Option<*mut u8> {
        unmap(p, old);
        None
    }
    pub unsafe fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
        System.realloc(p, Layout::from_size_align_unchecked(old, PAGE), new)
    }
}

// SAFETY: every block handed out is at least `layout.size()` bytes with `layout.align()`. A
// layout is either mapped (`mapped`) or the system allocator's, by its size and alignment alone,
// whatever path the block took: a mapped block is always `mapped_size` bytes, page-aligned, and
// is unmapped (or kept, if it has a class) with that size.
unsafe impl GlobalAlloc for Recycling {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !mapped(layout.size(), layout.align()) {
            return System.alloc(layout);
        }
        self.take_or_map(layout.size(), false)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !mapped(layout.size(), layout.align()) {
            return System.alloc_zeroed(layout);
        }
        self.take_or_map(layout.size(), true)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let (size, align) = (layout.size(), layout.align());
        if !mapped(size, align) {
            return System.dealloc(ptr, layout);
        }
        let real = mapped_size(size);
        if real > MAX_BLOCK || !self.keep(ptr, real) {
            pages::unmap(ptr, real);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        match (mapped(size, align), mapped(new_size, align)) {
            (false, false) => System.realloc(ptr, layout, new_size),
            (true, true) => {
                let (old, new) = (mapped_size(size), mapped_size(new_size));
                if old == new {
                    ptr // the block already has the room
                } else {
                    pages::remap(ptr, old, new)
                }
            }
            // across the boundary: a new block, the contents copied
            _ => {
                let new_layout = Layout::from_size_align_unchecked(new_size, align);
                let q = self.alloc(new_layout);
                if !q.is_null() {
                    ptr::copy_nonoverlapping(ptr, q, size.min(new_size));
                    self.dealloc(ptr, layout);
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_round_up_to_a_quarter_of_the_power_of_two() {
        assert_eq!(class(MIN_BLOCK - 1), None);
        assert_eq!(class(MIN_BLOCK), Some(MIN_BLOCK));
        assert_eq!(class(MIN_BLOCK + 1), Some(MIN_BLOCK + MIN_BLOCK / 4));
        assert_eq!(class(1 << 21), Some(1 << 21));
        assert_eq!(class((1 << 21) + 5), Some((1 << 21) + (1 << 19)));
        assert_eq!(class((1 << 22) - 1), Some(1 << 22));
        assert_eq!(class(MAX_BLOCK), Some(MAX_BLOCK));
        assert_eq!(class(MAX_BLOCK + 1), None);
        for size in [MIN_BLOCK, 300_001, 2_500_000, 9_999_999, MAX_BLOCK] {
            let c = class(size).unwrap();
            assert!(c >= size && c - size < size / 4 + 1, "{size} -> {c}");
            assert_eq!(c % pages::PAGE, 0, "a class is whole pages");
        }
        // mapped: from MIN_BLOCK, at most page-aligned; beyond the classes, whole pages
        assert!(!mapped(MIN_BLOCK - 1, 8) && mapped(MIN_BLOCK, 8) && mapped(1 << 20, 4096));
        assert!(!mapped(1 << 20, 8192));
        assert_eq!(mapped_size(MAX_BLOCK + 1), MAX_BLOCK + pages::PAGE);
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_its_class() {
        let a = Recycling::new(32 << 20);
        unsafe {
            let p = a.alloc(layout(2_400_000, 4));
            assert!(!p.is_null() && p as usize % 4 == 0);
            p.write_bytes(7, 2_400_000);
            a.dealloc(p, layout(2_400_000, 4));
            assert_eq!(a.kept_bytes(), class(2_400_000));
            // another size of the same class: the same block
            let q = a.alloc(layout(2_450_000, 4));
            assert_eq!(q, p);
            assert_eq!(a.kept_bytes(), Some(0));
            // another alignment (blocks are whole pages): the same block too
            a.dealloc(q, layout(2_450_000, 4));
            let r = a.alloc(layout(2_450_000, 64));
            assert_eq!(r, p);
            assert_eq!(r as usize % 4096, 0);
            a.dealloc(r, layout(2_450_000, 64));
            // zeroed from a kept block: the requested bytes are zero
            let z = a.alloc_zeroed(layout(2_500_000, 4));
            assert_eq!(z, p);
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
    fn a_block_not_taken_again_for_max_age_frees_per_stream_is_given_back() {
        // (Counters of its own: the tests reading streams beside this one count in READING.)
        static NONE: AtomicUsize = AtomicUsize::new(0);
        static THREE: AtomicUsize = AtomicUsize::new(3);
        for (reading, streams) in [(&NONE, 1), (&THREE, 3)] {
            // 4 MiB kept, over half of a 6 MiB cap: ageing applies.
            let a = Recycling::counting(6 << 20, reading);
            let (idle, busy) = (3 << 20, 1 << 20);
            unsafe {
                let p = a.alloc(layout(idle, 8));
                a.dealloc(p, layout(idle, 8));
                for i in 0..MAX_AGE * streams {
                    let q = a.alloc(layout(busy, 8));
                    a.dealloc(q, layout(busy, 8));
                    assert_eq!(
                        a.kept_bytes(),
                        Some(idle + busy),
                        "{streams} streams: after {i} other frees"
                    );
                }
                let q = a.alloc(layout(busy, 8));
                a.dealloc(q, layout(busy, 8));
                assert_eq!(a.kept_bytes(), Some(busy), "{streams} streams: given back");
                a.release();
            }
        }
    }

    #[test]
    fn aged_blocks_stay_while_at_most_half_the_cap_is_kept() {
        static NONE: AtomicUsize = AtomicUsize::new(0);
        let a = Recycling::counting(8 << 20, &NONE);
        let (idle, busy) = (3 << 20, 1 << 20);
        unsafe {
            let p = a.alloc(layout(idle, 8));
            a.dealloc(p, layout(idle, 8));
            for _ in 0..4 * MAX_AGE {
                let q = a.alloc(layout(busy, 8));
                a.dealloc(q, layout(busy, 8));
            }
            // 4 MiB of an 8 MiB cap: the idle block is old, but kept.
            assert_eq!(a.kept_bytes(), Some(idle + busy));
            // Another 1.25 MiB block kept: over half the cap, the oldest aged one goes.
            let r = a.alloc(layout(5 << 18, 8));
            let q = a.alloc(layout(busy, 8));
            a.dealloc(r, layout(5 << 18, 8));
            a.dealloc(q, layout(busy, 8));
            assert_eq!(a.kept_bytes(), Some(busy + (5 << 18)));
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
    fn a_held_lock_leaves_the_kept_blocks_alone() {
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

    /// Whether the page at `p` is mapped in this process (`mincore` fails on unmapped ones).
    #[cfg(target_os = "linux")]
    fn is_mapped(p: *mut u8) -> bool {
        let mut v = [0u8; 1];
        unsafe { libc::mincore(p.cast(), 1, v.as_mut_ptr()) == 0 }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_larger_kept_block_is_cut_down_to_a_request_no_block_of_its_class_serves() {
        let a = Recycling::new(32 << 20);
        let (big, small) = (3 << 20, 2 << 20);
        unsafe {
            let p = a.alloc(layout(big, 8));
            p.write_bytes(3, big);
            a.dealloc(p, layout(big, 8));
            // up to twice the class asked for: the same block, now a block of that class (its
            // tail given back: where the kernel maps the next block is its business, so not
            // checked here; kept again, it counts as the smaller class)
            let q = a.alloc(layout(small, 8));
            assert_eq!(q, p);
            assert_eq!(a.kept_bytes(), Some(0));
            assert!(std::slice::from_raw_parts(q, small).iter().all(|&b| b == 3));
            a.dealloc(q, layout(small, 8));
            assert_eq!(a.kept_bytes(), Some(small));
            // more than twice: a new block
            let r = a.alloc(layout(700_000, 8));
            assert_ne!(r, q);
            a.dealloc(r, layout(700_000, 8));
            a.release();
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn blocks_not_kept_are_given_back_to_the_system() {
        let a = Recycling::new(4 << 20);
        unsafe {
            // beyond the classes: mapped, zero, and unmapped when freed
            let big = a.alloc_zeroed(layout(MAX_BLOCK + 12_345, 64));
            assert!(is_mapped(big));
            assert!(std::slice::from_raw_parts(big, MAX_BLOCK + 12_345)
                .iter()
                .all(|&b| b == 0));
            a.dealloc(big, layout(MAX_BLOCK + 12_345, 64));
            assert!(!is_mapped(big));
            // a class block over the cap: not kept, unmapped
            let p = a.alloc(layout(5 << 20, 8));
            p.write_bytes(3, 5 << 20);
            a.dealloc(p, layout(5 << 20, 8));
            assert_eq!(a.kept_bytes(), Some(0));
            assert!(!is_mapped(p));
            // aligned beyond a page: the system allocator's, not mapped here
            let q = a.alloc(layout(1 << 20, 8192));
            assert_eq!(q as usize % 8192, 0);
            q.write_bytes(1, 1 << 20);
            a.dealloc(q, layout(1 << 20, 8192));
            assert_eq!(a.kept_bytes(), Some(0));
        }
    }
}
