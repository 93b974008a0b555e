//! The out-of-memory hook (`oom.cpp`).

use std::ffi::c_void;

use super::check;
use crate::error::Result;

extern "C" {
    fn memprof_set_oom_callback(cb: Option<OomCallback>, ctx: *mut c_void) -> i32;
}

type OomCallback = extern "C" fn(*mut c_void, i32, i64, i64, i64);

/// What the native layer passes when an allocation fails, before the error is raised.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OomEvent {
    /// Device slot.
    pub slot: usize,
    /// Bytes asked for (CUDA: the rounded block size).
    pub requested: i64,
    /// Bytes allocated when it failed.
    pub allocated: i64,
    /// CUDA: bytes reserved by the caching allocator; 0 on the CPU.
    pub reserved: i64,
}

type OomFn = Box<dyn Fn(OomEvent) + Send + Sync>;

/// The out-of-memory hook of a session: calls `f` from the failing allocation (on the
/// thread that allocated; on CUDA inside the caching allocator's OOM path). Dropping it
/// unregisters `f` and returns once no call of it is running.
pub(crate) struct OomHook {
    ctx: *mut OomFn,
}

extern "C" fn oom_trampoline(
    ctx: *mut c_void,
    slot: i32,
    requested: i64,
    allocated: i64,
    reserved: i64,
) {
    if ctx.is_null() || slot < 0 {
        return;
    }
    // SAFETY: `ctx` is the `OomFn` box registered by `OomHook::install`, alive until the
    // hook's drop, which waits for running calls before freeing it.
    let f = unsafe { &*(ctx as *const OomFn) };
    let event = OomEvent {
        slot: slot as usize,
        requested,
        allocated,
        reserved,
    };
    // A panic must not unwind into C++.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(event)));
}

impl OomHook {
    pub(crate) fn install(f: impl Fn(OomEvent) + Send + Sync + 'static) -> Result<OomHook> {
        let ctx: *mut OomFn = Box::into_raw(Box::new(Box::new(f)));
        // SAFETY: the trampoline matches MpOomCallback; `ctx` stays valid until drop.
        if let Err(e) = check(unsafe { memprof_set_oom_callback(Some(oom_trampoline), ctx.cast()) })
        {
            // SAFETY: not registered: we still own the box.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(e);
        }
        Ok(OomHook { ctx })
    }
}

impl Drop for OomHook {
    fn drop(&mut self) {
        // SAFETY: unregisters; returns once no call is running, so the box is free after.
        let status = unsafe { memprof_set_oom_callback(None, std::ptr::null_mut()) };
        if status == 0 {
            // SAFETY: `ctx` came from Box::into_raw in install and is no longer used.
            drop(unsafe { Box::from_raw(self.ctx) });
        } else {
            log::warn!("tch-memprof: unregistering the OOM hook failed; its state is leaked");
        }
    }
}
