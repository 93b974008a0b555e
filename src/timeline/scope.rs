//! Scopes: name the layer of a region of user code.

use crate::ffi;

/// Names the layer of every op run on this thread until the guard drops, overriding
/// the attribution by variables. Scopes nest (the innermost wins, up to 32 deep); the
/// backward nodes of a scope's forward ops belong to the scope too.
///
/// ```no_run
/// # fn attention(x: &tch::Tensor) -> tch::Tensor { x.shallow_clone() }
/// # let x = tch::Tensor::zeros([1], (tch::Kind::Float, tch::Device::Cpu));
/// let y = {
///     let _scope = tch_memprof::scope("attention");
///     attention(&x)
/// };
/// ```
///
/// Without a profiler, or with the timeline off, a scope does nothing. If the native
/// layer refuses it (nested deeper than 32), a warning is logged and the ops keep
/// their usual layer.
#[must_use = "the scope ends when the guard drops"]
pub fn scope(name: &str) -> Scope {
    let pushed = match ffi::intern(name).and_then(ffi::scope_push) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("tch-memprof: scope {name:?} not opened: {e}");
            false
        }
    };
    Scope {
        pushed,
        _not_send: std::marker::PhantomData,
    }
}

/// Guard of a [`scope`]; the scope ends when it drops. Not `Send`: scopes belong to
/// the thread that opened them.
#[derive(Debug)]
pub struct Scope {
    pushed: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.pushed {
            if let Err(e) = ffi::scope_pop() {
                log::warn!("tch-memprof: closing a scope failed: {e}");
            }
        }
    }
}
