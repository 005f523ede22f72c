//! shardstream-core: exact, resumable streaming of Parquet shards.
//!
//! The data path, one module per concept:
//! - [`catalog`]: resolve sources, read footers once, check schemas, fingerprint the shard set.
//! - [`store`]: object stores (S3, GCS, Azure, HTTP, file://): listing, ranged reads, counters.
//! - [`index`]: the metadata sidecar that lets large shard sets open without reading footers.
//! - [`plan`]: the order of an epoch (row groups, permuted per epoch) cut into slots.
//! - [`reader`]: read a run of rows of one row group — where resume seeks.
//! - [`prefetch`]: readahead threads decoding the next pieces in order.
//! - [`shuffle`]: the row-level shuffle buffer's decisions, shared by data and coordinate paths.
//! - [`rng`]: the portable PRNG and key derivation (pinned by a golden test).
//! - [`state`]: a slot's position in row coordinates and the checks a loaded state must pass.
//! - [`stream`]: one slot's batches across epochs, tying the above together.
//! - [`elastic`]: continue states saved by one layout of slots in another.
//!
//! No Python here: the bindings crate (`rust/python`) only converts types and errors.

pub mod catalog;
mod decode;
pub mod elastic;
pub mod error;
pub mod index;
pub mod plan;
pub mod prefetch;
pub mod reader;
pub mod rng;
pub mod shuffle;
pub mod state;
pub mod store;
pub mod stream;

pub use catalog::{Catalog, Fingerprint, Shard};
pub use error::{Error, Result};
pub use plan::{Even, Slot, SlotSpec};
pub use state::SlotState;
pub use stream::{Seek, Stream, StreamOptions};
