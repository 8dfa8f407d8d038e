//! Software prefetch for the simulator's randomly indexed tables (block cache index
//! and slab, the controller cache's tag store): a hint to start loading a cache line
//! that will be read shortly, so the DRAM miss overlaps other work instead of
//! stalling it. Hints only: no effect on any result; a no-op off x86-64.

/// Starts loading the cache line holding `*p` into all cache levels.
#[inline(always)]
pub(crate) fn read<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch never faults and changes no memory; `p` is a valid
        // reference anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((p as *const T).cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
