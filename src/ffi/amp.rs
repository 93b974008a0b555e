//! Autocast and random-generator state, for checkpointing and mixed precision (`amp.cpp`).

use std::ffi::c_void;

use tch::Tensor;

use super::{check, native};
use crate::error::{Error, Result};

extern "C" {
    fn memprof_autocast_enter(
        device_type: i32,
        enabled: i32,
        dtype: i32,
        prev: *mut Autocast,
    ) -> i32;
    fn memprof_autocast_exit(device_type: i32, prev: *const Autocast) -> i32;
    fn memprof_rng_get(device_type: i32, index: i32, out: *mut *mut c_void) -> i32;
    fn memprof_rng_set(device_type: i32, index: i32, state: *const c_void) -> i32;
}

/// `MpAutocast`: autocast state of one device type, to restore on exit.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Autocast {
    pub(super) enabled: i32,
    pub(super) dtype: i32,
}

/// `(device_type, index)` as the native layer numbers devices.
fn device_code(device: tch::Device) -> Result<(i32, i32)> {
    match device {
        tch::Device::Cpu => Ok((native::DEVICE_CPU, 0)),
        tch::Device::Cuda(i) => Ok((native::DEVICE_CUDA, i as i32)),
        other => Err(Error::Native(format!(
            "{other:?}: only the CPU and CUDA are supported"
        ))),
    }
}

/// Enters autocast for `device` in `dtype` (a c10::ScalarType code); returns the state
/// to hand to [`autocast_exit`].
pub(crate) fn autocast_enter(device: tch::Device, dtype: i32) -> Result<Autocast> {
    let (dt, _) = device_code(device)?;
    let mut prev = Autocast::default();
    // SAFETY: `prev` is a valid, writable Autocast.
    check(unsafe { memprof_autocast_enter(dt, 1, dtype, &mut prev) })?;
    Ok(prev)
}

pub(crate) fn autocast_exit(device: tch::Device, prev: &Autocast) -> Result<()> {
    let (dt, _) = device_code(device)?;
    // SAFETY: `prev` is a valid Autocast.
    check(unsafe { memprof_autocast_exit(dt, prev) })
}

/// The default random generator's state of `device`.
pub(crate) fn rng_state(device: tch::Device) -> Result<Tensor> {
    let (dt, index) = device_code(device)?;
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `out` is a valid pointer slot; on success the callee stores a new
    // at::Tensor* that we own, as tch owns the tensors its functions return.
    check(unsafe { memprof_rng_get(dt, index, &mut out) })?;
    if out.is_null() {
        return Err(Error::Native("no generator state returned".into()));
    }
    // SAFETY: `out` is a heap at::Tensor* (tch's C_tensor), owned from here on.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// Restores the default random generator's state of `device`.
pub(crate) fn set_rng_state(device: tch::Device, state: &Tensor) -> Result<()> {
    let (dt, index) = device_code(device)?;
    // SAFETY: `state` is a live tensor handle for the duration of the call.
    check(unsafe { memprof_rng_set(dt, index, state.as_ptr() as *const c_void) })
}
