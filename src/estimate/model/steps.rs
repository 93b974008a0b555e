//! A user's own steps on the meta device: the model and what the loop keeps, built on
//! meta, and the step run as written ([`Model::estimate_steps`]).

use std::time::Instant;

use tch::{nn, Device, Tensor};

use super::{Analysis, Model, Trace};
use crate::error::{catching, Error, Result};
use crate::estimate::{Estimate, Mode, Options};
use crate::ffi;

/// The model of a user's own steps ([`Model::build_steps_on_meta`]) has no forward
/// pass of its own: its estimates run the user's steps.
fn no_forward(_: &[Tensor], _: bool) -> Tensor {
    panic!(
        "this model was built for its own steps (Model::build_steps_on_meta): estimate it \
         with Model::estimate_steps"
    )
}

impl Model {
    /// A tch model and whatever its training loop keeps (its optimizer, an EMA copy, a
    /// second model), built straight on the meta device for
    /// [`Model::estimate_steps`]: `build` gets the `VarStore`, whose variables are made on
    /// meta (no host memory; `vs.bfloat16()` makes a pure-bf16 model, as on the GPU), and
    /// returns what the steps need. tch's optimizers make
    /// their state at their first step, so an optimizer built here holds nothing yet.
    ///
    /// ```no_run
    /// # use tch::nn::{self, OptimizerConfig};
    /// # use tch_memprof::estimate::Model;
    /// let (model, mut state) = Model::build_steps_on_meta(|vs| {
    ///     let net = nn::linear(vs.root() / "fc", 1024, 1024, Default::default());
    ///     let opt = nn::AdamW::default().build(vs, 1e-4).unwrap();
    ///     (net, opt)
    /// })?;
    /// # Ok::<(), tch_memprof::Error>(())
    /// ```
    pub fn build_steps_on_meta<T, F>(build: F) -> Result<(Model, T)>
    where
        F: FnOnce(&mut nn::VarStore) -> T,
    {
        let trace = Trace::begin()?;
        let mut vs = nn::VarStore::new(Device::Mps);
        let made = catching(|| build(&mut vs)).map_err(|reason| Error::DryRun {
            model: "tch model".into(),
            reason: format!("building the model on the meta device failed: {reason}"),
        })?;
        let weights = trace.finish()?;
        Ok((Model::code(vs, Box::new(no_forward), weights, None), made))
    }

    /// Predicts the CUDA peak of the user's own training (or inference) step, run as
    /// written [`Options::steps`] times on the meta device: `step(state, device)` does
    /// one whole step (makes its batch on `device`, runs the model, its loss, backward,
    /// clipping, the optimizer, whatever the loop does), `state` as
    /// [`Model::build_steps_on_meta`] returned it. `device` is the meta device as tch
    /// sees it (`Device::Mps`; tensors made on it are meta tensors).
    ///
    /// The phases are found as the profiler finds them in a real loop: backward begins
    /// at the autograd engine's first node, the optimizer's phase at the first
    /// allocation after backward outside it, a forward pass again at an allocation under
    /// grad mode. The peak is over all the steps. A step that reads a tensor's value
    /// (`.item()`, `f64::try_from`, tch's `clip_grad_norm`, a data-dependent op) fails in
    /// one line naming the op: a dry run has no values.
    ///
    /// The options that change the loop (`accumulate`, `checkpoint`, `autocast`,
    /// `zero_grad_first`) are refused: write them into the step.
    /// [`Estimate::batch`] is 0 (the step makes its own batch).
    pub fn estimate_steps<T, S>(
        &self,
        options: &Options,
        state: &mut T,
        step: S,
    ) -> Result<Estimate>
    where
        S: FnMut(&mut T, Device),
    {
        let start = Instant::now();
        let run = self.dry_run_steps(options, state, step, self.user_code)?;
        let mut e = self.replayed(&run, &[], Mode::Steps, options, Analysis::StepAndIdle)?;
        e.elapsed = start.elapsed();
        e.host_peak_rss = ffi::process_memory().ok().map(|(_, peak)| peak);
        Ok(e)
    }
}
