//! The settings of a stream, and the one place their defaults and limits live.
//!
//! [`Settings`] shape the stream: a saved state records them and loads only under the same ones.
//! [`Tuning`] knobs change speed and memory, never the stream. [`Layout`] is where one iterator
//! sits among ranks and DataLoader workers. The Python layer reads [`DEFAULTS`] (through the
//! bindings) for its signature, so a default is written once.
//!
//! Limits: every number a user passes is checked here, naming the argument, and nothing is
//! allocated in proportion to one before there are rows to fill it (a `batch_size` of 10^11 is
//! legal and costs nothing until rows arrive; a readahead depth is a channel capacity, allocated
//! up front, so it has a ceiling).

use crate::error::{Error, Result};
use crate::plan::{Even, Slot};

/// Defaults of the arguments, as `(name, value)`; `None` is Python's `None`.
pub struct Defaults {
    /// Decoded (Arrow) bytes a decoded batch aims at when `read_batch_rows` is not set: its
    /// rows are [`auto_batch_rows`] of the catalog's estimated bytes per row.
    pub read_batch_bytes: usize,
    /// Rows per decoded batch when not set and the footers say nothing of row width.
    pub read_batch_rows: usize,
    /// Decoded bytes the current batches of a mixture's sources aim at together when
    /// `read_batch_rows` is not set (see [`Tuning::source_batch_rows`]).
    pub mix_read_batch_bytes: usize,
    /// Fewest rows per decoded batch of a mixture's source when not set: each decoded batch
    /// has a fixed cost (page and column set-up, the hand-off), paid per this many rows at most.
    pub mix_min_batch_rows: usize,
    pub readahead_depth: usize,
    pub piece_rows: u64,
    pub even: Even,
    /// Readahead threads for object-store sources when not set: each holds one piece's
    /// requests in flight, so this many round trips overlap with decoding.
    pub remote_readahead_threads: usize,
    /// Readahead threads for local sources when not set: `min(this, cores / workers)`, >= 1.
    pub max_local_readahead_threads: usize,
    /// Rows per chunk the core hands over in row mode: larger amortizes the FFI call; smaller
    /// bounds the work a mid-chunk `state_dict()` replays on row ids.
    pub row_chunk: usize,
}

/// For `[id, tokens]` (~1.2 KB a row) 2,048-row batches x depth 8 held as many rows in flight
/// as 8192 x 2, in smaller batches that iterated ~14% faster in paired runs
/// (docs/benchmarks.md): 4 MiB a batch, rounded down to a power of two, keeps those 2,048 rows,
/// while a 16-byte `[id, score]` row gets [`MAX_AUTO_BATCH_ROWS`] instead of 32 KiB batches
/// (a thread hand-off per 2,048 rows cost more than it decoded: 16,384 rows iterated
/// 1.2-1.3x faster in wall time and ~1.1x in CPU on a quiet machine). 16k-row pieces iterated
/// 1.25-1.35x faster than 64k (a smaller working set per thread).
pub const DEFAULTS: Defaults = Defaults {
    read_batch_bytes: 4 << 20,
    read_batch_rows: 2048,
    mix_read_batch_bytes: 3 << 19,
    mix_min_batch_rows: 1024,
    readahead_depth: 8,
    piece_rows: 16384,
    even: Even::Drop,
    remote_readahead_threads: 8,
    max_local_readahead_threads: 4,
    row_chunk: 1024,
};

/// Upper limits of the tuning arguments (each is allocated up front somewhere: arrow-rs sizes
/// its decode buffers by the batch, a channel by its depth).
pub const MAX_READ_BATCH_ROWS: u64 = 1 << 20;
pub const MAX_READAHEAD_THREADS: u64 = 256;
pub const MAX_READAHEAD_DEPTH: u64 = 1024;
/// Bounds of the automatic decoded batch: at most a piece's rows ([`Defaults::piece_rows`]):
/// a flat piece is often a whole row group (~100k rows), and a batch of all of it left the
/// consumer waiting for the whole decode (131,072 rows iterated [id, score] slower than 16,384
/// in wall time, the same CPU: docs/benchmarks.md); at least a few rows of the widest.
pub const MAX_AUTO_BATCH_ROWS: usize = 1 << 14;
pub const MIN_AUTO_BATCH_ROWS: usize = 16;

/// Rows per decoded batch for rows of `row_bytes` decoded bytes (`None`: unknown):
/// [`Defaults::read_batch_bytes`] of them, rounded down to a power of two (so that output
/// batches of a power-of-two size are slices of one decoded batch) within
/// [`MIN_AUTO_BATCH_ROWS`]..=[`MAX_AUTO_BATCH_ROWS`]; [`Defaults::read_batch_rows`] if unknown.
pub fn auto_batch_rows(row_bytes: Option<f64>) -> usize {
    batch_rows_for(DEFAULTS.read_batch_bytes, row_bytes)
}

/// [`auto_batch_rows`] for batches of about `bytes` decoded bytes.
pub fn batch_rows_for(bytes: usize, row_bytes: Option<f64>) -> usize {
    let Some(b) = row_bytes.filter(|b| b.is_finite() && *b > 0.0) else {
        return DEFAULTS.read_batch_rows;
    };
    let rows = (bytes as f64 / b).floor();
    if rows >= MAX_AUTO_BATCH_ROWS as f64 {
        return MAX_AUTO_BATCH_ROWS;
    }
    let rows = (rows as usize).max(MIN_AUTO_BATCH_ROWS);
    (1usize << rows.ilog2()).clamp(MIN_AUTO_BATCH_ROWS, MAX_AUTO_BATCH_ROWS)
}

/// What shapes the stream: everything a saved state must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub seed: u64,
    /// 0 = no shuffle at all (shard order); n > 0 = permuted row groups + n-row buffer.
    pub shuffle_buffer: usize,
    /// Rows per output item; `None` = row mode (items are rows, read in chunks).
    pub batch_size: Option<u64>,
    /// Drop each epoch's short last batch (batch mode only).
    pub drop_last: bool,
    /// Epochs per pass; `None` = endless.
    pub epochs: Option<u64>,
    /// The policy asked for; it applies only with more than one rank (see [`Layout`]).
    pub even: Even,
    /// Pack a token column into rows of `seq_len` tokens (`pack/`); items are packed rows.
    pub pack: Option<crate::pack::PackSettings>,
}

/// Knobs that never change the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// `None` = automatic (see [`Tuning::batch_rows`]).
    pub read_batch_rows: Option<usize>,
    /// `None` = automatic (see [`Tuning::threads`]).
    pub readahead_threads: Option<usize>,
    pub readahead_depth: usize,
    pub piece_rows: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            read_batch_rows: None,
            readahead_threads: None,
            readahead_depth: DEFAULTS.readahead_depth,
            piece_rows: DEFAULTS.piece_rows,
        }
    }
}

impl Tuning {
    /// Rows per decoded batch of a stream over `catalog`: the setting, or [`auto_batch_rows`]
    /// of the catalog's decoded bytes per row ([`Catalog::row_bytes`]). For Arrow IPC shards
    /// at least [`Defaults::read_batch_rows`]: a record batch is decoded (or mapped) whole
    /// whatever this says and cut into zero-copy slices of this many rows, and the estimate
    /// counts every column of the file, not only the projected ones, so fewer rows would save
    /// no memory and could make output batches copies gathered from several slices.
    ///
    /// [`Catalog::row_bytes`]: crate::catalog::Catalog::row_bytes
    pub fn batch_rows(&self, catalog: &crate::catalog::Catalog) -> usize {
        match self.read_batch_rows {
            Some(r) => r,
            None if catalog.all_ipc() => {
                auto_batch_rows(catalog.row_bytes()).max(DEFAULTS.read_batch_rows)
            }
            None => auto_batch_rows(catalog.row_bytes()),
        }
    }

    /// Readahead threads for an iterator: the setting, or for object stores
    /// [`Defaults::remote_readahead_threads`] (they wait on the network, not the CPU), or
    /// `min(max_local, cores / workers)`, at least 1.
    pub fn threads(&self, remote: bool, workers: u32) -> usize {
        if let Some(n) = self.readahead_threads {
            return n;
        }
        if remote {
            return DEFAULTS.remote_readahead_threads;
        }
        // available_parallelism honours the CPU affinity mask and cgroup quotas on Linux.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / workers.max(1) as usize).clamp(1, DEFAULTS.max_local_readahead_threads)
    }

    /// Rows per decoded batch of one of a mixture's `sources` sources over `catalog`: the
    /// setting (and for Arrow IPC shards [`Tuning::batch_rows`]), or else [`batch_rows_for`] a
    /// `sources`-th of [`Defaults::mix_read_batch_bytes`], at least
    /// [`Defaults::mix_min_batch_rows`] and at most what one stream would decode
    /// ([`Tuning::batch_rows`]). The mixed batch's copy reads every row of every source's
    /// current batch, so the K current batches should be in the cache together: with one
    /// stream's 4 MiB each, mixtures of K=3 / K=8 sources without readahead threads spent
    /// 1.14x / 1.15x one stream's CPU per row, with 2,048 / 1,024-row batches of ~150-byte
    /// rows (~1 MiB together) 1.04-1.08x / 0.98x (docs/benchmarks.md, "Mixtures").
    pub fn source_batch_rows(&self, catalog: &crate::catalog::Catalog, sources: usize) -> usize {
        if self.read_batch_rows.is_some() || catalog.all_ipc() {
            // Arrow IPC record batches are decoded (or mapped) whole whatever this says:
            // smaller slices would not make the working set smaller.
            return self.batch_rows(catalog);
        }
        let share = batch_rows_for(
            DEFAULTS.mix_read_batch_bytes / sources.max(1),
            catalog.row_bytes(),
        );
        share
            .max(DEFAULTS.mix_min_batch_rows)
            .min(self.batch_rows(catalog))
    }

    /// Decoded batches each readahead thread of one of a mixture's `sources` sources over
    /// `catalog` may hold ready: a `sources`-th of the bytes one stream's thread holds
    /// (`readahead_depth` of its [`Tuning::batch_rows`] batches), counted in the source's own
    /// [`Tuning::source_batch_rows`] batches, at least 1 and at most `readahead_depth`. A
    /// remote source keeps its own depth, as it keeps its own threads (they wait on the
    /// network). Counting whole batches, K local sources held K times one stream's ready
    /// bytes, which the mixed batch's copy read back long after they were decoded, out of the
    /// cache (7-11% more CPU per row at K=8 with one stream's batches); in batches already cut
    /// to a K-th, one each left the K threads waiting on each other (K=8: ~1.1x the wall time
    /// per row of 4-8 each; docs/benchmarks.md, "Mixtures").
    pub fn source_depth(&self, catalog: &crate::catalog::Catalog, sources: usize) -> usize {
        if catalog.is_remote() {
            return self.readahead_depth;
        }
        let own = self.batch_rows(catalog).max(1);
        let share = self.source_batch_rows(catalog, sources).max(1);
        let depth = self.readahead_depth.saturating_mul(own) / share.saturating_mul(sources.max(1));
        depth.clamp(1, self.readahead_depth.max(1))
    }

    /// Readahead threads of one of a mixture's `sources` sources over `catalog`, in each of
    /// `workers` DataLoader workers: [`Tuning::stream_threads`] with the cores shared among
    /// `workers × sources` iterators (each source's own `readahead_threads` if set; a remote
    /// source keeps its own count, as a stream does).
    pub fn source_threads(
        &self,
        catalog: &crate::catalog::Catalog,
        sources: usize,
        workers: u32,
    ) -> usize {
        let share = workers
            .max(1)
            .saturating_mul(u32::try_from(sources).unwrap_or(u32::MAX));
        self.stream_threads(catalog, share)
    }

    /// Readahead threads for a stream over `catalog`: [`Tuning::threads`], except that when
    /// not set, a catalog whose batches decode in place ([`Catalog::decodes_in_place`]: local,
    /// uncompressed Arrow IPC) is read in the caller. Such a decode is a few thousand
    /// instructions; handing the batch over from a thread costs more (a wake-up per batch).
    pub fn stream_threads(&self, catalog: &crate::catalog::Catalog, workers: u32) -> usize {
        if self.readahead_threads.is_none() && catalog.decodes_in_place() {
            return 0;
        }
        self.threads(catalog.is_remote(), workers)
    }
}

/// User arguments before validation: integers as given (wide enough for anything Python's
/// conversion lets through; `i128::MAX` stands for "larger than that").
#[derive(Debug, Clone, Default)]
pub struct Args {
    pub seed: i128,
    pub shuffle_buffer: i128,
    pub batch_size: Option<i128>,
    pub drop_last: bool,
    pub epochs: Option<i128>,
    pub even: Option<String>,
    pub read_batch_rows: Option<i128>,
    pub readahead_threads: Option<i128>,
    pub readahead_depth: i128,
}

fn int_in(name: &str, v: i128, lo: i128, hi: i128, what: &str) -> Result<u64> {
    if (lo..=hi).contains(&v) {
        Ok(v as u64)
    } else {
        Err(Error::Config(format!("{name} must be {what}, got {v}")))
    }
}

impl Even {
    /// The API's name: `None` (every row once), `"drop"` or `"pad"`; `"off"` is `None`.
    pub fn parse(v: Option<&str>, what: &str) -> Result<Even> {
        match v {
            None | Some("off") => Ok(Even::Off),
            Some("drop") => Ok(Even::Drop),
            Some("pad") => Ok(Even::Pad),
            Some(other) => Err(Error::Config(format!(
                "{what} must be 'drop', 'pad' or None, got {other:?}"
            ))),
        }
    }

    /// The state's name of a layout's policy.
    pub fn name(self) -> &'static str {
        match self {
            Even::Off => "off",
            Even::Drop => "drop",
            Even::Pad => "pad",
        }
    }
}

impl Settings {
    /// Validate user arguments; every error names the argument and what it must be.
    pub fn from_args(a: &Args) -> Result<(Settings, Tuning)> {
        const U64: i128 = u64::MAX as i128;
        let settings = Settings {
            seed: int_in("seed", a.seed, 0, U64, "an int in [0, 2**64)")?,
            shuffle_buffer: int_in(
                "shuffle_buffer",
                a.shuffle_buffer,
                0,
                u32::MAX as i128,
                "an int in [0, 2**32)",
            )? as usize,
            batch_size: a
                .batch_size
                .map(|b| {
                    int_in(
                        "batch_size",
                        b,
                        1,
                        U64 >> 1,
                        "a positive int below 2**63 or None",
                    )
                })
                .transpose()?,
            drop_last: a.drop_last,
            epochs: a
                .epochs
                .map(|e| {
                    int_in(
                        "epochs",
                        e,
                        1,
                        U64 >> 1,
                        "a positive int below 2**63 or None",
                    )
                })
                .transpose()?,
            even: Even::parse(a.even.as_deref(), "even")?,
            pack: None,
        };
        let tuning = Tuning {
            read_batch_rows: a
                .read_batch_rows
                .map(|r| {
                    int_in(
                        "read_batch_rows",
                        r,
                        1,
                        MAX_READ_BATCH_ROWS as i128,
                        &format!("an int in [1, {MAX_READ_BATCH_ROWS}] or None"),
                    )
                    .map(|r| r as usize)
                })
                .transpose()?,
            readahead_threads: a
                .readahead_threads
                .map(|t| {
                    int_in(
                        "readahead_threads",
                        t,
                        0,
                        MAX_READAHEAD_THREADS as i128,
                        &format!("an int in [0, {MAX_READAHEAD_THREADS}] or None"),
                    )
                    .map(|t| t as usize)
                })
                .transpose()?,
            readahead_depth: int_in(
                "readahead_depth",
                a.readahead_depth,
                1,
                MAX_READAHEAD_DEPTH as i128,
                &format!("an int in [1, {MAX_READAHEAD_DEPTH}]"),
            )? as usize,
            piece_rows: DEFAULTS.piece_rows,
        };
        Ok((settings, tuning))
    }

    /// Rows per output item (1 in row mode).
    pub fn item_rows(&self) -> u64 {
        self.batch_size.unwrap_or(1)
    }

    /// Whether an epoch's short last batch is dropped (never in row mode).
    pub fn drops_short(&self) -> bool {
        self.drop_last && self.batch_size.is_some()
    }
}

/// Where one iterator sits: rank `rank` of `world`, DataLoader worker `worker` of `workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub slot: Slot,
    /// The `even` policy this layout runs with: the setting with several ranks, `Off` with one
    /// (workers of one rank need no equal lengths; a single rank yields every row once).
    pub even: Even,
}

impl Layout {
    pub fn new(rank: u64, world: u64, worker: u64, workers: u64, even: Even) -> Result<Layout> {
        if world == 0 || rank >= world {
            return Err(Error::Config(format!(
                "rank must be in [0, world_size), got rank={rank} world_size={world}"
            )));
        }
        if workers == 0 || worker >= workers {
            return Err(Error::Config(format!(
                "worker {worker} of {workers} is not a valid DataLoader worker"
            )));
        }
        let count = world.checked_mul(workers).filter(|&c| c <= u32::MAX as u64);
        let Some(count) = count else {
            return Err(Error::Config(format!(
                "world_size x num_workers must be below 2**32, got {world} x {workers}"
            )));
        };
        let slot = Slot::new((rank * workers + worker) as u32, count as u32)?;
        let even = if world == 1 { Even::Off } else { even };
        Ok(Layout { slot, even })
    }
}

/// Everything one slot's stream needs, derived from the settings, the layout and the pass.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    pub seed: u64,
    /// 0 = no shuffle at all (shard order); n > 0 = permuted row groups + n-row buffer.
    pub shuffle_buffer: usize,
    /// First epoch of the pass.
    pub first_epoch: u64,
    /// Number of epochs in the pass; `None` = endless.
    pub epochs: Option<u64>,
    /// Rows per decoded batch (a tuning knob; does not change the stream). [`StreamOptions::new`]
    /// takes the setting or the fallback; [`crate::Stream::resume`] sizes it for its catalog.
    pub read_batch_rows: usize,
    /// Background decoding threads; 0 decodes synchronously in the caller.
    pub readahead_threads: usize,
    /// Decoded batches each readahead thread may hold ready.
    pub readahead_depth: usize,
    /// Largest run of rows one read decodes (splits big row groups).
    pub piece_rows: u64,
    /// How slot lengths are equalized in this layout (see [`Even`]).
    pub even: Even,
}

impl StreamOptions {
    pub fn new(
        settings: &Settings,
        tuning: &Tuning,
        first_epoch: u64,
        even: Even,
        threads: usize,
    ) -> Self {
        StreamOptions {
            seed: settings.seed,
            shuffle_buffer: settings.shuffle_buffer,
            first_epoch,
            epochs: settings.epochs,
            read_batch_rows: tuning.read_batch_rows.unwrap_or(DEFAULTS.read_batch_rows),
            readahead_threads: threads,
            readahead_depth: tuning.readahead_depth,
            piece_rows: tuning.piece_rows,
            even,
        }
    }
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            seed: 0,
            shuffle_buffer: 0,
            first_epoch: 0,
            epochs: Some(1),
            read_batch_rows: 8192,
            readahead_threads: 0,
            readahead_depth: 2,
            piece_rows: DEFAULTS.piece_rows,
            even: Even::Off,
        }
    }
}

// --------------------------------------------------------------------- map-style access

/// Defaults of the map-style dataset (`ParquetRows`) and its sampler.
pub struct MapDefaults {
    /// Bytes of decoded pages each process keeps for random access (per DataLoader worker).
    pub page_cache_bytes: u64,
    /// Blocks per window of the locality order.
    pub window: u64,
    /// Indices the sampler computes per call into the core.
    pub sampler_chunk: u64,
}

pub const MAP_DEFAULTS: MapDefaults = MapDefaults {
    page_cache_bytes: 256 << 20,
    window: 16,
    sampler_chunk: 1024,
};

/// Largest page cache: its bytes are a budget, not an allocation, but a budget beyond any
/// machine's memory is a typo.
pub const MAX_PAGE_CACHE_BYTES: u64 = 1 << 44;
/// Largest row count a sampler orders (positions, paddings and block rounding stay far from
/// u64 overflow).
pub const MAX_SAMPLER_ROWS: u64 = 1 << 62;
/// Largest block (rows) and window (blocks) of the locality order.
pub const MAX_BLOCK: u64 = 1 << 32;

/// What defines a sampler's order (all of it is in its state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplerSettings {
    pub rows: u64,
    pub seed: u64,
    pub shuffle: bool,
    /// The locality order: `(block rows, window blocks)`; `None`: a global shuffle.
    pub block: Option<(u64, u64)>,
}

/// Where one sampler sits: rank `rank` of `world`, and the `even` policy (`Off` with one rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerLayout {
    pub rank: u64,
    pub world: u64,
    pub even: Even,
}

/// A sampler's arguments before validation (ints as given; see [`Args`]).
#[derive(Debug, Clone, Default)]
pub struct SamplerArgs {
    pub rows: i128,
    pub seed: i128,
    pub shuffle: bool,
    pub block_size: Option<i128>,
    pub window: i128,
    pub rank: i128,
    pub world_size: i128,
    pub even: Option<String>,
}

impl SamplerArgs {
    /// Validate; every error names the argument and what it must be.
    pub fn validate(&self) -> Result<(SamplerSettings, SamplerLayout)> {
        let rows = int_in(
            "the dataset's length",
            self.rows,
            0,
            MAX_SAMPLER_ROWS as i128,
            "an int in [0, 2**62]",
        )?;
        let seed = int_in(
            "seed",
            self.seed,
            0,
            u64::MAX as i128,
            "an int in [0, 2**64)",
        )?;
        let block = match self.block_size {
            None => None,
            Some(_) if !self.shuffle => {
                return Err(Error::Config(
                    "block_size needs shuffle=True (it shapes the shuffled order)".into(),
                ))
            }
            Some(b) => {
                let what = "a positive int up to 2**32 or None";
                let b = int_in("block_size", b, 1, MAX_BLOCK as i128, what)?;
                let w = int_in(
                    "window",
                    self.window,
                    1,
                    MAX_BLOCK as i128,
                    "a positive int up to 2**32",
                )?;
                Some((b, w))
            }
        };
        let world = int_in(
            "world_size",
            self.world_size,
            1,
            u32::MAX as i128,
            "an int in [1, 2**32)",
        )?;
        if !(0..world as i128).contains(&self.rank) {
            return Err(Error::Config(format!(
                "rank must be in [0, world_size), got rank={} world_size={world}",
                self.rank
            )));
        }
        let even = Even::parse(self.even.as_deref(), "even")?;
        let layout = SamplerLayout {
            rank: self.rank as u64,
            world,
            even: if world == 1 { Even::Off } else { even },
        };
        Ok((
            SamplerSettings {
                rows,
                seed,
                shuffle: self.shuffle,
                block,
            },
            layout,
        ))
    }
}

/// Validate the threads of random access (pieces read at once by one call).
pub fn access_threads(v: i128) -> Result<usize> {
    int_in(
        "threads",
        v,
        1,
        MAX_READAHEAD_THREADS as i128,
        &format!("an int in [1, {MAX_READAHEAD_THREADS}] or None"),
    )
    .map(|t| t as usize)
}

/// Validate a page cache budget.
pub fn page_cache_bytes(v: i128) -> Result<u64> {
    int_in(
        "page_cache_bytes",
        v,
        0,
        MAX_PAGE_CACHE_BYTES as i128,
        "an int in [0, 2**44]",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args {
            readahead_depth: 8,
            ..Default::default()
        }
    }

    #[test]
    fn out_of_range_arguments_name_the_argument() {
        let cases: Vec<(&str, Args)> = vec![
            ("seed", Args { seed: -1, ..args() }),
            (
                "seed",
                Args {
                    seed: 1 << 64,
                    ..args()
                },
            ),
            (
                "batch_size",
                Args {
                    batch_size: Some(0),
                    ..args()
                },
            ),
            (
                "batch_size",
                Args {
                    batch_size: Some(i128::MAX),
                    ..args()
                },
            ),
            (
                "epochs",
                Args {
                    epochs: Some(0),
                    ..args()
                },
            ),
            (
                "shuffle_buffer",
                Args {
                    shuffle_buffer: 1 << 40,
                    ..args()
                },
            ),
            (
                "read_batch_rows",
                Args {
                    read_batch_rows: Some(0),
                    ..args()
                },
            ),
            (
                "readahead_threads",
                Args {
                    readahead_threads: Some(-1),
                    ..args()
                },
            ),
            (
                "readahead_depth",
                Args {
                    readahead_depth: 1_000_000_000,
                    ..args()
                },
            ),
            (
                "even",
                Args {
                    even: Some("maybe".into()),
                    ..args()
                },
            ),
        ];
        for (name, a) in cases {
            let err = Settings::from_args(&a).unwrap_err().to_string();
            assert!(err.starts_with(name), "{name}: {err}");
        }
        assert!(Settings::from_args(&Args {
            batch_size: Some(100_000_000_000),
            ..args()
        })
        .is_ok());
    }

    #[test]
    fn layouts_check_their_size_and_one_rank_never_drops() {
        assert!(Layout::new(0, 1 << 40, 0, 1, Even::Drop).is_err());
        assert!(Layout::new(2, 2, 0, 1, Even::Drop).is_err());
        assert!(Layout::new(0, 1 << 16, 0, 1 << 16, Even::Drop).is_err());
        let l = Layout::new(1, 2, 1, 3, Even::Pad).unwrap();
        assert_eq!((l.slot.index, l.slot.count, l.even), (4, 6, Even::Pad));
        assert_eq!(Layout::new(0, 1, 1, 2, Even::Pad).unwrap().even, Even::Off);
    }

    /// One Parquet shard of `rows` rows: `id` int64 and `width` float64 columns of `list_len`
    /// items each (0: plain float64 columns).
    fn shard(dir: &std::path::Path, rows: usize, width: usize, list_len: usize) -> String {
        use arrow_array::{ArrayRef, Float64Array, Int64Array, ListArray, RecordBatch};
        use std::sync::Arc;
        let mut cols: Vec<(String, ArrayRef)> = vec![(
            "id".into(),
            Arc::new(Int64Array::from_iter_values(0..rows as i64)),
        )];
        for c in 0..width {
            let n = rows * list_len.max(1);
            let values = Float64Array::from_iter_values((0..n).map(|i| (i % 97) as f64));
            let col: ArrayRef = if list_len == 0 {
                Arc::new(values)
            } else {
                let item = Arc::new(arrow_schema::Field::new(
                    "item",
                    arrow_schema::DataType::Float64,
                    false,
                ));
                let offsets =
                    arrow_buffer::OffsetBuffer::from_lengths(std::iter::repeat_n(list_len, rows));
                Arc::new(ListArray::new(item, offsets, Arc::new(values), None))
            };
            cols.push((format!("c{c}"), col));
        }
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let path = dir.join(format!("w{width}x{list_len}.parquet"));
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path.display().to_string()
    }

    /// A local uncompressed Arrow IPC file of `rows` int64 ids, opened as a catalog.
    fn ipc_catalog(dir: &std::path::Path, rows: i64) -> crate::catalog::Catalog {
        use arrow_array::{ArrayRef, Int64Array, RecordBatch};
        let path = dir.join("ids.arrow");
        let ids: ArrayRef = std::sync::Arc::new(Int64Array::from_iter_values(0..rows));
        let b = RecordBatch::try_from_iter([("id", ids)]).unwrap();
        let f = std::fs::File::create(&path).unwrap();
        let mut w = arrow_ipc::writer::FileWriter::try_new(f, &b.schema()).unwrap();
        w.write(&b).unwrap();
        w.finish().unwrap();
        crate::catalog::Catalog::open(&[path.to_string_lossy().into_owned()], None).unwrap()
    }

    #[test]
    fn mixture_sources_share_one_streams_readahead_depth() {
        use crate::catalog::Catalog;
        let dir = tempfile::tempdir().unwrap();
        let narrow = Catalog::open(&[shard(dir.path(), 5000, 1, 0)], None).unwrap(); // ~16 B a row
        let wide = Catalog::open(&[shard(dir.path(), 300, 2, 64)], None).unwrap(); // ~1 KB a row
        let t = Tuning::default();
        assert_eq!(t.readahead_depth, 8);
        // one source: one stream's depth
        assert_eq!(t.source_depth(&narrow, 1), 8);
        // eight: an eighth of one stream's ready bytes, in the source's smaller batches
        let (own, src) = (t.batch_rows(&narrow), t.source_batch_rows(&narrow, 8));
        assert!(src < own);
        let d = t.source_depth(&narrow, 8);
        assert_eq!(d, 8 * own / (8 * src));
        assert!(d > 1 && d * src * 8 <= 8 * own, "{d} x {src} rows");
        // never 0 (a thread must hold its batch), never more batches than one stream's
        assert_eq!(t.source_depth(&narrow, 100_000), 1);
        // wide rows: the 1,024-row floor is half of one stream's batch, 8 x 2 / 3 batches each
        assert_eq!(
            (t.batch_rows(&wide), t.source_batch_rows(&wide, 3)),
            (2048, 1024)
        );
        assert_eq!(t.source_depth(&wide, 3), 5);
        // ~140-byte rows cut to a sixteenth: a K-th of the bytes would be 16 batches, capped at 8
        let mid = Catalog::open(&[shard(dir.path(), 2000, 1, 16)], None).unwrap();
        assert_eq!(
            (t.batch_rows(&mid), t.source_batch_rows(&mid, 8)),
            (16384, 1024)
        );
        assert_eq!(t.source_depth(&mid, 8), 8);
        // batches of a set size are not cut: the depth is divided instead
        let fixed = Tuning {
            read_batch_rows: Some(4096),
            ..Tuning::default()
        };
        assert_eq!(fixed.source_depth(&narrow, 3), 2);
        assert_eq!(fixed.source_depth(&narrow, 8), 1);
        let deep = Tuning {
            readahead_depth: 64,
            ..fixed
        };
        assert_eq!(deep.source_depth(&narrow, 8), 8);
    }

    #[test]
    fn mixture_sources_share_the_cores() {
        use crate::catalog::Catalog;
        let dir = tempfile::tempdir().unwrap();
        let local = Catalog::open(&[shard(dir.path(), 500, 1, 0)], None).unwrap();
        let t = Tuning::default();
        for (k, w) in [(1, 1), (3, 1), (8, 2), (2, u32::MAX)] {
            assert_eq!(
                t.source_threads(&local, k, w),
                t.threads(false, w.saturating_mul(k as u32)),
                "{k} sources x {w} workers"
            );
        }
        assert_eq!(t.source_threads(&local, 1000, 1), 1);
        let own = Tuning {
            readahead_threads: Some(3),
            ..Tuning::default()
        };
        assert_eq!(own.source_threads(&local, 8, 4), 3);
        // local uncompressed Arrow IPC decodes in the caller, as one stream over it does
        let ipc = ipc_catalog(dir.path(), 100);
        assert!(ipc.decodes_in_place());
        assert_eq!(t.source_threads(&ipc, 3, 1), 0);
        assert_eq!(own.source_threads(&ipc, 3, 1), 3);
    }

    #[test]
    fn automatic_batch_rows_hold_about_the_same_bytes_within_the_limits() {
        let target = DEFAULTS.read_batch_bytes as f64;
        assert_eq!(auto_batch_rows(None), DEFAULTS.read_batch_rows);
        assert_eq!(auto_batch_rows(Some(f64::NAN)), DEFAULTS.read_batch_rows);
        assert_eq!(auto_batch_rows(Some(0.0)), DEFAULTS.read_batch_rows);
        assert_eq!(auto_batch_rows(Some(0.01)), MAX_AUTO_BATCH_ROWS);
        assert_eq!(auto_batch_rows(Some(16.0)), MAX_AUTO_BATCH_ROWS);
        assert_eq!(auto_batch_rows(Some(1e12)), MIN_AUTO_BATCH_ROWS);
        // ~1.2 KB [id, tokens] rows keep the 2,048 rows they were tuned with
        assert_eq!(auto_batch_rows(Some(1160.0)), 2048);
        assert_eq!(auto_batch_rows(Some(100.0)), MAX_AUTO_BATCH_ROWS);
        for b in [333.0, 1e3, 4096.0, 5e4, 1e5] {
            let r = auto_batch_rows(Some(b));
            assert!(r.is_power_of_two(), "{b}: {r}");
            assert!(
                r as f64 * b <= target && 2.0 * r as f64 * b > target,
                "{b}: {r}"
            );
            assert!((MIN_AUTO_BATCH_ROWS..=MAX_AUTO_BATCH_ROWS).contains(&r));
        }
        assert!(MAX_AUTO_BATCH_ROWS as u64 <= MAX_READ_BATCH_ROWS);
    }

    /// The footers size a stream's decoded batches: many narrow rows, few wide ones, the
    /// projection counted (not the file), list items counted at their decoded width; an
    /// explicit `read_batch_rows` wins.
    #[test]
    fn decoded_batches_are_sized_from_the_footer() {
        use crate::catalog::Catalog;
        let dir = tempfile::tempdir().unwrap();
        let narrow = shard(dir.path(), 5000, 1, 0); // [id, c0]: 16 B a row
        let wide = shard(dir.path(), 300, 2, 64); // [id, c0, c1]: lists of 64 f64
        let open = |f: &str, cols: Option<&[&str]>| {
            let cols: Option<Vec<String>> = cols.map(|c| c.iter().map(|s| s.to_string()).collect());
            Catalog::open(&[f.to_string()], cols.as_deref()).unwrap()
        };
        let auto = Tuning::default();
        let cat = open(&narrow, None);
        let b = cat.row_bytes().unwrap();
        assert!((16.0..20.0).contains(&b), "{b}");
        assert_eq!(auto.batch_rows(&cat), MAX_AUTO_BATCH_ROWS);
        // ... and a stream reads with that size
        let (settings, tuning) = Settings::from_args(&args()).unwrap();
        assert_eq!(tuning.read_batch_rows, None);
        let layout = Layout::new(0, 1, 0, 1, Even::Off).unwrap();
        let start = crate::resume::Resume::start(0);
        let stream = crate::stream::Stream::resume(
            std::sync::Arc::new(cat),
            &settings,
            &tuning,
            layout,
            0,
            &start,
        )
        .unwrap();
        assert_eq!(stream.options().read_batch_rows, MAX_AUTO_BATCH_ROWS);
        let cat = open(&wide, None);
        // 8 + 2 x (64 x 8 + 4 offsets) = 1,040 B a row at least
        let b = cat.row_bytes().unwrap();
        assert!((1040.0..1200.0).contains(&b), "{b}");
        assert_eq!(auto.batch_rows(&cat), 2048);
        // one list column of the two: half the bytes, twice the rows
        let cat = open(&wide, Some(&["id", "c1"]));
        assert_eq!(auto.batch_rows(&cat), 4096);
        let set = Tuning {
            read_batch_rows: Some(7),
            ..Tuning::default()
        };
        assert_eq!(set.batch_rows(&cat), 7);
        assert_eq!(set.source_batch_rows(&cat, 8), 7);
    }

    #[test]
    fn mixture_sources_share_a_cache_sized_batch() {
        use crate::catalog::Catalog;
        let dir = tempfile::tempdir().unwrap();
        let narrow = Catalog::open(&[shard(dir.path(), 5000, 1, 0)], None).unwrap(); // ~16 B a row
        let wide = Catalog::open(&[shard(dir.path(), 300, 2, 64)], None).unwrap(); // ~1 KB a row
        let auto = Tuning::default();
        let b = narrow.row_bytes().unwrap();
        // one source: as much as one stream, capped by one stream's own size
        assert_eq!(auto.source_batch_rows(&narrow, 1), auto.batch_rows(&narrow));
        // eight: an eighth of the bytes, rounded down to a power of two
        let eighth = (DEFAULTS.mix_read_batch_bytes as f64 / 8.0 / b) as usize;
        assert_eq!(auto.source_batch_rows(&narrow, 8), 1 << eighth.ilog2());
        assert!(auto.source_batch_rows(&narrow, 8) < auto.batch_rows(&narrow));
        // many sources, or wide rows: never below the floor
        assert_eq!(
            auto.source_batch_rows(&narrow, 1000),
            DEFAULTS.mix_min_batch_rows
        );
        assert_eq!(
            auto.source_batch_rows(&wide, 3),
            DEFAULTS.mix_min_batch_rows
        );
        assert!(auto.batch_rows(&wide) >= DEFAULTS.mix_min_batch_rows);
        // Arrow IPC: a record batch is decoded whole, so a source keeps one stream's size
        let ipc = ipc_catalog(dir.path(), 5000);
        assert!(ipc.all_ipc());
        assert_eq!(auto.source_batch_rows(&ipc, 1000), auto.batch_rows(&ipc));
        assert!(auto.batch_rows(&ipc) > DEFAULTS.mix_min_batch_rows);
    }
}
