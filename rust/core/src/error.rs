//! One error enum for the whole core. The bindings map each variant to exactly one Python
//! exception type (see `rust/python/src/error.rs`), so every message here names the file, field or
//! setting it is about: that text is what a user sees in their traceback.

/// Everything that can go wrong in the core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A source path, directory or glob that names no Parquet file.
    #[error("{what}: {path}")]
    NotFound { path: String, what: String },

    /// An OS-level I/O failure on a file we know exists.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A file that is not readable Parquet: not Parquet at all, truncated, corrupt footer or pages.
    #[error("{path}: {message}")]
    Shard { path: String, message: String },

    /// Shards whose schemas disagree, or a requested column that does not exist.
    #[error("{0}")]
    Schema(String),

    /// A saved state that does not belong to this dataset or is malformed.
    #[error("{0}")]
    State(String),

    /// A state saved over this dataset before some of its shards changed: `added` and
    /// `changed` name shards (relative paths), `removed` counts shards gone (the state does not
    /// store their paths).
    #[error("{message}")]
    ShardsChanged {
        message: String,
        added: Vec<String>,
        changed: Vec<String>,
        removed: u64,
    },

    /// An invalid setting (e.g. zero slots).
    #[error("{0}")]
    Config(String),

    /// A bug in shardstream (e.g. a panic caught at the FFI boundary). Never expected.
    #[error("internal error (please report): {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn shard(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        Error::Shard {
            path: path.display().to_string(),
            message: message.to_string(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            return Error::NotFound {
                path: path.display().to_string(),
                what: "no such file".into(),
            };
        }
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// The message of a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Run `f`, which reads shard `path`, turning a panic into a [`Error::Shard`] naming the file.
/// arrow-rs panics on some corrupt inputs (bit widths, out-of-range indices in page data or
/// headers): that is bad data in one file, and the user must learn which one.
pub(crate) fn shard_guard<T>(path: &std::path::Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(Error::shard(
            path,
            format!(
                "corrupt data: the decoder failed ({})",
                panic_message(&*payload)
            ),
        ))
    })
}
