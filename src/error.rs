//! Errors of the profiler.

use std::path::PathBuf;

/// What can go wrong when building or driving a [`MemoryProfiler`](crate::MemoryProfiler).
///
/// `record_stats` and `epoch_end` never return these: failures there are logged and
/// counted (see [`MemoryProfiler::failures`](crate::MemoryProfiler::failures)) so that
/// a training run never stops because of its profiler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder value is out of range or unusable.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidConfig {
        /// The builder setting.
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// Another `MemoryProfiler` is alive in this process.
    #[error(
        "a MemoryProfiler is already active in this process (one at a time: the allocator \
         hooks are process-wide); drop the other one first"
    )]
    AlreadyActive,
    /// A file or folder could not be created, written or read.
    #[error("{path}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A CSV file could not be written.
    #[error("{path}: {source}")]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: csv::Error,
    },
    /// A plot could not be drawn or written.
    #[error("{path}: plot failed: {reason}")]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The native layer (libtorch) reported an error.
    #[error("native layer: {0}")]
    Native(String),
    /// A run's files could not be found or read back (see [`runs`](crate::runs)).
    #[error("{0}")]
    Run(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
