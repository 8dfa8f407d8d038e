//! Transparent huge pages for the big, randomly indexed tables (the block cache index
//! and slab, the controller cache's tag store).
//!
//! A simulated array cache of 512 GiB in 64 KiB blocks is an 8 M-entry index: a
//! 128 MB slot table and a slab of a few hundred MB, each probed at a random place on
//! every I/O. With 4 KiB pages nearly every probe also misses the TLB and walks the
//! page tables; with 2 MiB pages the walk is one level shorter and mostly cached.
//! Linux distributions commonly ship THP in `madvise` mode, where a region gets huge
//! pages only when asked, which is what this does. It is advice only: memory contents,
//! and so every simulated figure, are unchanged; on other systems it does nothing.

/// Asks for huge pages on the whole 2 MiB-aligned part of `len` bytes at `ptr`
/// (nothing when the range holds no aligned 2 MiB; errors are ignored: advice).
pub(crate) fn advise(ptr: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + len) & !(HUGE - 1);
        if end > start {
            // SAFETY: madvise only advises the kernel about pages of this process's
            // own allocation (the aligned part of [ptr, ptr + len)); it changes no
            // contents and no access rights, and its result is ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

/// [`advise`] for the whole capacity of a vector.
pub(crate) fn advise_vec<T>(v: &Vec<T>) {
    advise(v.as_ptr().cast(), v.capacity() * std::mem::size_of::<T>());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_keeps_contents() {
        let mut v: Vec<u64> = Vec::with_capacity(3 << 20);
        advise_vec(&v);
        v.extend(0..(3 << 20));
        advise_vec(&v);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
        // Ranges without an aligned 2 MiB part are left alone.
        let small = vec![7u8; 100];
        advise_vec(&small);
        assert_eq!(small, vec![7u8; 100]);
    }
}
