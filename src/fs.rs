//! File access that names the path on error.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Why a file could not be read or written, in plain words: "no such file",
/// "permission denied", "a folder, not a file"; else the system's own words.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::IsADirectory => "a folder, not a file".into(),
        _ => {
            // "Broken pipe (os error 32)" -> "broken pipe".
            let s = e.to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            c.next().map_or(String::new(), |f| {
                f.to_lowercase().collect::<String>() + c.as_str()
            })
        }
    }
}

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
    let written = std::fs::write(&tmp, bytes)
        .map_err(|source| Error::Io {
            path: tmp.clone(),
            source,
        })
        .and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })
        });
    if written.is_err() {
        // Nothing of a failed write is left beside the file.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A file's name as messages call a model file (`resnet18.pt2`), its whole path when it
/// has no name.
pub(crate) fn file_label(path: &Path) -> String {
    path.file_name()
        .map_or(path.display().to_string(), |f| f.to_string_lossy().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_a_failed_one_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("report.html");
        write_atomic(&page, b"first").unwrap();
        write_atomic(&page, b"second").unwrap();
        assert_eq!(std::fs::read(&page).unwrap(), b"second");
        // A folder where the file should go: the rename fails.
        let taken = dir.path().join("taken.html");
        std::fs::create_dir(&taken).unwrap();
        let e = write_atomic(&taken, b"x").unwrap_err();
        assert!(
            e.to_string().starts_with(&taken.display().to_string()),
            "{e}"
        );
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["report.html", "taken.html"]);
    }
}
