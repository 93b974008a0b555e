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
        prev: *mut MpAutocast,
    ) -> i32;
    fn memprof_autocast_exit(device_type: i32, prev: *const MpAutocast) -> i32;
    fn memprof_rng_get(device_type: i32, index: i32, out: *mut *mut c_void) -> i32;
    fn memprof_rng_set(device_type: i32, index: i32, state: *const c_void) -> i32;
}

/// `MpAutocast`: the native layout of an [`AutocastState`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpAutocast {
    pub(super) enabled: i32,
    pub(super) dtype: i32,
}

/// The autocast state of one device type before [`autocast_enter`], to hand back to
/// [`autocast_exit`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AutocastState(MpAutocast);

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
pub(crate) fn autocast_enter(device: tch::Device, dtype: i32) -> Result<AutocastState> {
    let (dt, _) = device_code(device)?;
    let mut prev = MpAutocast::default();
    // SAFETY: `prev` is a valid, writable MpAutocast.
    check(unsafe { memprof_autocast_enter(dt, 1, dtype, &mut prev) })?;
    Ok(AutocastState(prev))
}

pub(crate) fn autocast_exit(device: tch::Device, prev: &AutocastState) -> Result<()> {
    let (dt, _) = device_code(device)?;
    // SAFETY: `prev.0` is a valid MpAutocast.
    check(unsafe { memprof_autocast_exit(dt, &prev.0) })
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
