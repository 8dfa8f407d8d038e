//! # weir-thin — thin, copy-on-write volumes
//!
//! A thin volume is a chain of [`Layer`]s: a writable top and the read-only
//! layers below it (its snapshots, or the snapshot it was cloned from). Each layer
//! maps fixed-size grains (64 KiB by default, [`GRAIN_BYTES`]) to slots of its own
//! data file. Reads fall through the chain to the first layer holding a grain; the
//! first write to a grain the top does not hold copies the rest of the grain up
//! into a new slot of the top. A snapshot freezes the top and puts a new empty one
//! above it (constant time); a linked clone is a new empty top over a snapshot's
//! layer; rollback replaces a volume's top with a new empty one over the
//! snapshot's layer; flatten copies what a clone reads from below into its own top.
//!
//! Which layers exist and which is whose parent is the caller's metadata
//! (weir-server keeps it with the volume catalog, so a snapshot is one atomic
//! metadata update). This crate does the data path, crash-safe map commits
//! ([`Layer::commit`]), the clone-aware read cache ([`GrainCache`]) and the
//! consistency check ([`check`]).
//!
//! Why 64 KiB grains: the first write to a grain copies the grain up, so a small
//! grain copies less (4 KiB random first writes move 64 KiB here, 4 MiB with an
//! RBD object as the unit), while a large grain keeps the map small (4 bytes a
//! grain: 64 MiB of map for a fully written 1 TiB volume at 64 KiB, 1 GiB at
//! 4 KiB) and runs long. 64 KiB is qcow2's default cluster and dm-thin's usual
//! block size; measured trade-off in docs/THIN.md.

pub mod cache;
pub mod check;
pub mod commit;
pub mod layer;
pub mod map;
pub mod volume;

pub use cache::GrainCache;
pub use commit::{CommitStats, commit_into};
pub use layer::Layer;
pub use map::{Entry, GrainMap};
pub use volume::{Chain, Extent, ThinVolume, merge_into};

/// Default grain size, bytes.
pub const GRAIN_BYTES: u64 = 64 * 1024;
