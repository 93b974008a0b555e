//! The profiling session: the process-wide native state (the allocator hooks, the op
//! callback, the CUDA reporter, the logs) is owned by one RAII value. Starting a second
//! session while one is alive fails; dropping it unregisters the out-of-memory hook,
//! then stops the native session.

use crate::error::{Error, Result};
use crate::ffi::{self, OomEvent, OomHook};

/// One profiling session of this process.
pub(crate) struct Session {
    oom: Option<OomHook>,
}

impl Session {
    /// Starts the native session on the calling thread (the training thread).
    pub(crate) fn start(
        want_cuda: bool,
        timeline_slot: Option<usize>,
        leaks: bool,
    ) -> Result<Session> {
        if !ffi::state()?.idle {
            return Err(Error::AlreadyActive);
        }
        ffi::start(want_cuda, timeline_slot, leaks)?;
        Ok(Session { oom: None })
    }

    /// Calls `f` when an allocation fails, before the error reaches the loop (replacing
    /// any earlier hook of this session).
    pub(crate) fn on_oom(&mut self, f: impl Fn(OomEvent) + Send + Sync + 'static) -> Result<()> {
        self.oom = None;
        self.oom = Some(OomHook::install(f)?);
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // First: no report writer may run once the session is gone.
        self.oom = None;
        if let Err(e) = ffi::stop() {
            log::warn!("tch-memprof: stopping the profiler failed: {e}");
        }
    }
}
