//! The replay: one home for what turns a source's events into the bytes a device holds
//! and into a step's anatomy, whichever source the events came from (a profiled
//! iteration's step log, the estimator's dry run, a PyTorch snapshot's history).
//!
//! - [`allocator`]: the model of PyTorch's CUDA caching allocator (pools, best fit,
//!   split and merge, `PYTORCH_CUDA_ALLOC_CONF`, expandable segments).
//! - `device`: the allocator stage: a predicted or recorded run's events through that
//!   model (each block charged its size, the cuBLAS workspaces taken, the kernels'
//!   workspaces), the step whose peak is the run's cut out.
//! - `step`: the step passes: one step's events into a [`StepProfile`] (categories,
//!   layers, FLOPs, the blocks idle at the peak). A profiled step's events come here
//!   straight (its bytes are the allocator's own), a predicted or recorded one's after
//!   the device stage.
//!
//! Nothing here runs while the model does, reads a file or prints.
//!
//! [`StepProfile`]: crate::timeline::StepProfile

pub(crate) mod allocator;
mod device;
mod step;

pub(crate) use device::{
    as_requested, peak_step, predicted_step, through_allocator, DeviceModel, ModelVars, Request,
    TRANSIENT_ID, WORKSPACE_ID,
};
pub(crate) use step::replay as replay_step;
