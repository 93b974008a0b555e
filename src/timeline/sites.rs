//! The source line that allocated a block of the detailed step: its call stack, taken
//! as raw return addresses at allocation (native side), symbolised here after the step
//! with the `backtrace` crate, each address once.
//!
//! The line is the first frame, innermost first (inlined frames included), in Rust
//! source that is not the standard library, tch-memprof's own library, torch-sys, or
//! tch's tensor and layer code: the model's code. tch's own models (`tch::vision`) are
//! model code, so a ResNet from `tch::vision::resnet` is located in tch's `resnet.rs`.

use std::collections::HashMap;
use std::path::{Component, Path};

use crate::ffi;

use super::types::UNKNOWN_SITE;

/// Names sites, remembering what each address resolved to.
#[derive(Default)]
pub(crate) struct SiteNames {
    by_address: HashMap<u64, Option<String>>,
    frames: HashMap<u64, Frame>,
    cwd: Option<std::path::PathBuf>,
}

impl SiteNames {
    pub(crate) fn new() -> Self {
        SiteNames {
            by_address: HashMap::new(),
            frames: HashMap::new(),
            cwd: std::env::current_dir().ok(),
        }
    }

    /// The site of an alloc event's `aux` (site id + 1; 0: none was taken).
    pub(crate) fn name(&mut self, aux: i32) -> String {
        if aux <= 0 {
            return UNKNOWN_SITE.to_string();
        }
        let Ok(site) = ffi::site(aux as u64 - 1) else {
            return UNKNOWN_SITE.to_string();
        };
        for &ip in &site {
            if let Some(line) = self.line_at(ip) {
                return line;
            }
        }
        UNKNOWN_SITE.to_string()
    }

    /// The line of the model's code that made a block of the estimator's dry run (an
    /// alloc's site id + 1): the first model-code frame inside the dry run's call of the
    /// model. A frame of this crate's own code first ends the search: the block was made
    /// by the dry run's loop (the loss, backward, the optimizer), not by the model.
    pub(crate) fn name_in_model(&mut self, aux: i32) -> Option<String> {
        if aux <= 0 {
            return None;
        }
        let site = ffi::site(aux as u64 - 1).ok()?;
        for &ip in &site {
            match self.frame_at(ip) {
                Frame::Model(line) => return Some(line),
                Frame::Ours => return None,
                Frame::Other => {}
            }
        }
        None
    }

    /// What the frames at return address `ip` are, innermost first.
    fn frame_at(&mut self, ip: u64) -> Frame {
        if let Some(known) = self.frames.get(&ip) {
            return known.clone();
        }
        let mut found = Frame::Other;
        backtrace::resolve(
            ip.saturating_sub(1) as usize as *mut std::ffi::c_void,
            |sym| {
                if found != Frame::Other {
                    return;
                }
                if let (Some(file), Some(line)) = (sym.filename(), sym.lineno()) {
                    // This crate's Rust code (its native layer, where the allocation
                    // hook runs, is C++: passed over).
                    if file.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
                        && file.extension() == Some(std::ffi::OsStr::new("rs"))
                    {
                        found = Frame::Ours;
                    } else if is_model_code(file) {
                        found = Frame::Model(format!("{}:{line}", self.shown(file)));
                    }
                }
            },
        );
        self.frames.insert(ip, found.clone());
        found
    }

    /// The model's `file:line` among the frames at return address `ip`, if any.
    fn line_at(&mut self, ip: u64) -> Option<String> {
        if let Some(known) = self.by_address.get(&ip) {
            return known.clone();
        }
        let mut found = None;
        // A return address points after the call: resolve the call itself.
        backtrace::resolve(
            ip.saturating_sub(1) as usize as *mut std::ffi::c_void,
            |sym| {
                if found.is_some() {
                    return;
                }
                if let (Some(file), Some(line)) = (sym.filename(), sym.lineno()) {
                    if is_model_code(file) {
                        found = Some(format!("{}:{line}", self.shown(file)));
                    }
                }
            },
        );
        self.by_address.insert(ip, found.clone());
        found
    }

    /// A path as the report shows it: relative to the working folder when under it,
    /// from the crate's folder on when in Cargo's registry.
    fn shown(&self, file: &Path) -> String {
        if let Some(rel) = self.cwd.as_deref().and_then(|c| file.strip_prefix(c).ok()) {
            return rel.display().to_string();
        }
        let parts: Vec<Component<'_>> = file.components().collect();
        if let Some(k) = parts
            .windows(2)
            .position(|w| w[0].as_os_str() == "registry" && w[1].as_os_str() == "src")
        {
            // registry/src/<index>/<crate-version>/...
            if parts.len() > k + 3 {
                return parts[k + 3..]
                    .iter()
                    .collect::<std::path::PathBuf>()
                    .display()
                    .to_string();
            }
        }
        file.display().to_string()
    }
}

/// A resolved return address: in the model's code (its line), in this crate's own code,
/// or elsewhere (std, libtorch, tch).
#[derive(Clone, Debug, PartialEq)]
enum Frame {
    Model(String),
    Ours,
    Other,
}

/// Whether a frame's file is the model's code (see the module's documentation).
pub(crate) fn is_model_code(file: &Path) -> bool {
    if file.extension() != Some(std::ffi::OsStr::new("rs")) {
        return false;
    }
    let s = file.to_string_lossy();
    if s.starts_with("/rustc/") || s.contains("/library/std/") || s.contains("/library/core/") {
        return false;
    }
    if file.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src")) {
        return false;
    }
    match crate_of(file) {
        Some(("tch", within)) => within.starts_with("src/vision/"),
        Some((name, _)) => name != "torch-sys",
        None => true,
    }
}

/// The crate a source file belongs to, by the folder above its last `src` (a version
/// suffix dropped: `torch-sys-0.24.0` is `torch-sys`), and the path from that folder on.
fn crate_of(file: &Path) -> Option<(&str, String)> {
    let parts: Vec<&str> = file
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    let k = parts.iter().rposition(|p| *p == "src")?;
    let folder = parts[k.checked_sub(1)?];
    let end = folder
        .match_indices('-')
        .map(|(i, _)| i)
        .find(|&i| folder[i + 1..].starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or(folder.len());
    Some((&folder[..end], parts[k..].join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_code_is_the_first_frame_outside_std_torch_and_tch_memprof() {
        let reg = "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
        for (file, model) in [
            ("/work/proj/src/main.rs", true),
            ("/work/proj/tests/idle.rs", true),
            (&format!("{reg}/tch-0.24.0/src/vision/resnet.rs"), true),
            (
                &format!("{reg}/tch-0.24.0/src/wrappers/tensor_generated.rs"),
                false,
            ),
            (&format!("{reg}/tch-0.24.0/src/nn/linear.rs"), false),
            (&format!("{reg}/torch-sys-0.24.0/src/lib.rs"), false),
            (
                &format!("{reg}/torch-sys-0.24.0/libtch/torch_api.cpp"),
                false,
            ),
            ("/rustc/abc/library/core/src/ops/function.rs", false),
            (
                concat!(env!("CARGO_MANIFEST_DIR"), "/src/profiler/mod.rs"),
                false,
            ),
            (concat!(env!("CARGO_MANIFEST_DIR"), "/tests/idle.rs"), true),
            ("/usr/include/c++/13/bits/shared_ptr.h", false),
        ] {
            assert_eq!(is_model_code(Path::new(file)), model, "{file}");
        }
    }

    #[test]
    fn registry_paths_are_shown_from_the_crate_folder() {
        let names = SiteNames {
            cwd: Some("/work/proj".into()),
            ..SiteNames::default()
        };
        assert_eq!(
            names.shown(Path::new(
                "/h/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tch-0.24.0/src/vision/resnet.rs"
            )),
            "tch-0.24.0/src/vision/resnet.rs"
        );
        assert_eq!(
            names.shown(Path::new("/work/proj/src/main.rs")),
            "src/main.rs"
        );
        assert_eq!(names.shown(Path::new("/elsewhere/a.rs")), "/elsewhere/a.rs");
    }
}
