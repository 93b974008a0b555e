//! File access that names the path on error.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// `create_dir_all`, naming the folder on error.
pub fn create_dir_all(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates a new file; fails if it exists (reports never overwrite).
pub fn create_new(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Checks that files can be created in `dir` by creating and removing one.
pub fn check_writable(dir: &Path) -> Result<()> {
    let probe: PathBuf = dir.join(format!(".tch-memprof-write-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&probe);
    create_new(&probe)?;
    std::fs::remove_file(&probe).map_err(|source| Error::Io {
        path: probe,
        source,
    })
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename:
/// readers see the old file or the whole new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|source| Error::Io {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A file's name as messages call a model file (`resnet18.pt2`), its whole path when it
/// has no name.
pub(crate) fn file_label(path: &Path) -> String {
    path.file_name()
        .map_or(path.display().to_string(), |f| f.to_string_lossy().into())
}
