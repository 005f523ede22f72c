//! shardstream-core: exact, resumable streaming of Parquet shards.
//!
//! The data path, one module (or folder) per concern:
//! - [`catalog`]: resolve sources, read footers once (local and remote), check schemas,
//!   fingerprint the shard set, the metadata sidecar.
//! - [`store`]: object stores (S3, GCS, Azure, HTTP, file://): listing, ranged reads, counters.
//! - [`plan`]: the order of an epoch (row groups, permuted per epoch) cut into slots.
//! - [`reader`]: read a run of rows of one row group — where resume seeks.
//! - [`prefetch`]: readahead threads decoding the next pieces in order.
//! - [`shuffle`]: the row-level shuffle buffer's decisions, shared by data and coordinate paths.
//! - [`rng`]: the portable PRNG and key derivation (pinned by a golden test).
//! - [`settings`]: what shapes a stream, and the tuning knobs that don't.
//! - [`state`]: a slot's position in row coordinates and the checks a loaded state must pass.
//! - [`stream`]: one slot's batches across epochs: input, retained batches, the stream.
//! - [`elastic`]: continue states saved by one layout of slots in another.
//! - [`resume`]: where a stream starts: loaded states checked once, own / merged / carried over.
//! - [`access`]: random access (rows by id, any order) for map-style datasets; formats plug in.
//! - [`sampler`]: the map-style sampler: a seeded permutation per epoch computed on the fly,
//!   split across ranks, with an O(1), elastic state.
//! - [`mix`]: a weighted mixture of named sources, one stream per source (rule, schedule,
//!   resume, mixed stream).
//! - [`pack`]: token packing into rows of `seq_len` tokens, pending documents as row references.
//! - [`alloc`]: the allocator the extension runs on (large freed buffers kept for reuse).
//!
//! No Python here: the bindings crate (`rust/python`) only converts types and errors.

pub mod access;
pub mod alloc;
pub mod catalog;
mod decode;
pub mod elastic;
pub mod error;
pub mod mix;
pub mod pack;
pub mod plan;
pub mod prefetch;
pub mod reader;
pub mod resume;
pub mod rng;
pub mod sampler;
pub mod settings;
pub mod shuffle;
pub mod state;
pub mod store;
pub mod stream;
#[cfg(test)]
mod test_util;

pub use catalog::{Catalog, Fingerprint, Shard};
pub use error::{Error, Result};
pub use plan::{Even, Slot, SlotSpec};
pub use settings::{Layout, Settings, StreamOptions, Tuning};
pub use state::Seek;
pub use state::SlotState;
pub use stream::Stream;
