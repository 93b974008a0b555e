//! Interned names, parameter table and scopes (`names.cpp`).

use std::ffi::c_char;

use super::{check, native};
use crate::error::{Error, Result};

extern "C" {
    fn memprof_name(id: i32, buf: *mut c_char, len: usize, name_len: *mut i64) -> i32;
    fn memprof_intern(name: *const c_char, id: *mut i32) -> i32;
    fn memprof_set_params(
        target: i32,
        ptrs: *const u64,
        ids: *const i32,
        layers: *const i32,
        n: usize,
    ) -> i32;
    fn memprof_scope_push(id: i32) -> i32;
    fn memprof_scope_pop() -> i32;
}

/// The interned name `id` (op, layer or scope), if known.
pub(crate) fn name(id: i32) -> Result<Option<String>> {
    let mut buf = [0u8; 128];
    let mut len = 0i64;
    // SAFETY: the buffer is valid for its length; the callee writes at most len-1 bytes
    // plus a NUL.
    check(unsafe { memprof_name(id, buf.as_mut_ptr().cast(), buf.len(), &mut len) })?;
    if len < 0 {
        return Ok(None);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(Some(String::from_utf8_lossy(&buf[..end]).into_owned()))
}

/// Interns `name` and returns its id.
pub(crate) fn intern(name: &str) -> Result<i32> {
    let c = std::ffi::CString::new(name.replace('\0', " "))
        .map_err(|e| Error::Native(e.to_string()))?;
    let mut id = -1;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    check(unsafe { memprof_intern(c.as_ptr(), &mut id) })?;
    Ok(id)
}

/// Where the op recorder's events go: the profiled step, or the dry run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The step log of the profiled loop.
    Step,
    /// The meta trace of the estimator's dry run.
    DryRun,
}

/// Replaces the table of model variables (storage pointer -> variable index and the
/// name id of its layer) that the op recorder of `target` finds among op inputs.
pub(crate) fn set_params(target: Target, ptrs: &[u64], ids: &[i32], layers: &[i32]) -> Result<()> {
    let target = match target {
        Target::Step => native::TARGET_STEP,
        Target::DryRun => native::TARGET_DRY_RUN,
    };
    if ptrs.len() != ids.len() || ptrs.len() != layers.len() {
        return Err(Error::Native(format!(
            "set_params: {} pointers, {} ids, {} layers",
            ptrs.len(),
            ids.len(),
            layers.len()
        )));
    }
    // SAFETY: the three slices are valid for `len` elements for the duration of the call.
    check(unsafe {
        memprof_set_params(
            target,
            ptrs.as_ptr(),
            ids.as_ptr(),
            layers.as_ptr(),
            ptrs.len(),
        )
    })
}

pub(crate) fn scope_push(id: i32) -> Result<()> {
    // SAFETY: plain call on the calling thread's scope stack.
    check(unsafe { memprof_scope_push(id) })
}

pub(crate) fn scope_pop() -> Result<()> {
    // SAFETY: plain call on the calling thread's scope stack.
    check(unsafe { memprof_scope_pop() })
}
