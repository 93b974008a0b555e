//! Memory optimizations for tch: gradient checkpointing and mixed precision.
//!
//! **Gradient checkpointing** ([`Checkpointed`]). tch has no custom autograd functions,
//! so the helper drives backward itself, segment by segment, with the autograd tch
//! offers:
//!
//! 1. forward: every checkpointed segment (all but the last, unless added with
//!    [`Checkpointed::segment_kept`]) runs under `no_grad`; only its output (the next
//!    segment's input, a *boundary*) is kept, not the activations inside it; a kept
//!    segment runs with its graph from its detached input boundary;
//! 2. the last segment runs with a graph, the loss is computed and `backward()` runs;
//!    the gradient of its input boundary is read from the detached input's `.grad`;
//! 3. for each earlier segment, last to first: a checkpointed segment's input boundary
//!    is detached, marked as requiring a gradient, and the segment is run again with a
//!    graph (the *recomputation*; a kept segment uses the graph of step 1), and
//!    `sum(output * g).backward()` propagates the boundary gradient `g` into it: the gradient of `sum(output * g)` with respect to `output`
//!    is `g` exactly, so every parameter receives what the plain backward would give.
//!
//! Cost: one more forward pass of every checkpointed segment. Savings: the activations
//! each checkpointed segment keeps for backward, minus its output, which stays as the next
//! boundary (see docs/optimizations.md for the measured table).
//!
//! **Mixed precision** ([`autocast`]): tch's own `tch::autocast` enables CUDA autocast
//! only (in float16) and does nothing without CUDA; this one sets libtorch's autocast
//! state of the given device type, CPU or CUDA, in bfloat16 or float16, with the same
//! nesting and cast-cache rules.

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::ffi;

/// Scales the gradients of `params` to a global L2 norm of at most `max`, as PyTorch's
/// `clip_grad_norm_` does: the norm stays on the device (no value is read on the host),
/// so the step does not wait for the GPU, and a dry run ([`crate::estimate::Model::estimate_steps`])
/// can run it. tch's `Optimizer::clip_grad_norm` reads the norm with `f64::try_from`.
/// Parameters without a gradient are skipped.
pub fn clip_grad_norm(params: &[Tensor], max: f64) {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .collect();
        if grads.is_empty() {
            return;
        }
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm()).collect();
        let total = Tensor::stack(&norms, 0).norm();
        let coef = ((total + 1e-6).reciprocal() * max).clamp_max(1.0);
        for mut g in grads {
            let _ = g.g_mul_(&coef);
        }
    });
}

pub(crate) fn scalar_type(kind: Kind) -> Option<i32> {
    match kind {
        Kind::Half => Some(5),
        Kind::BFloat16 => Some(15),
        _ => None,
    }
}

/// Restores the autocast state when dropped (also when the closure panics).
struct AutocastGuard {
    device: Device,
    prev: ffi::AutocastState,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        if let Err(e) = ffi::autocast_exit(self.device, &self.prev) {
            log::warn!("tch-memprof: leaving autocast failed: {e}");
        }
    }
}

/// Runs `f` with libtorch's autocast on for `device`'s type in `dtype`: eligible ops
/// (matrix products, convolutions) run in `dtype`, precision-sensitive ones (softmax,
/// losses, norms) in float32. Weights stay float32; their low-precision copies are
/// cached until the outermost `autocast` returns.
///
/// `dtype`: `Kind::BFloat16` (CPU or CUDA) or `Kind::Half` (CUDA; needs loss scaling,
/// which this crate does not provide). Run the forward pass and the loss inside,
/// `backward()` outside, as in PyTorch.
pub fn autocast<T>(device: Device, dtype: Kind, f: impl FnOnce() -> T) -> Result<T> {
    let code = scalar_type(dtype).ok_or_else(|| Error::InvalidConfig {
        name: "autocast dtype",
        value: format!("{dtype:?}"),
        reason: "autocast computes in BFloat16 or Half".into(),
    })?;
    match device {
        Device::Cpu => {}
        Device::Cuda(_) if tch::Cuda::is_available() => {}
        other => {
            return Err(Error::InvalidConfig {
                name: "autocast device",
                value: format!("{other:?}"),
                reason: match other {
                    Device::Cuda(_) => "CUDA is not available in this process".into(),
                    _ => "autocast here supports the CPU and CUDA".into(),
                },
            })
        }
    }
    let prev = ffi::autocast_enter(device, code)?;
    let _guard = AutocastGuard { device, prev };
    Ok(f())
}

/// Runs `f` in the estimator's autocast on the meta device, with the op lists `list`,
/// for the dry run of a mixed-precision step.
pub(crate) fn meta_autocast<T>(
    list: ffi::AutocastList,
    dtype: Kind,
    f: impl FnOnce() -> T,
) -> Result<T> {
    struct Region;
    impl Drop for Region {
        fn drop(&mut self) {
            if let Err(e) = ffi::meta_autocast_end() {
                log::error!("tch-memprof: ending the dry run's autocast failed: {e}");
            }
        }
    }
    let code = scalar_type(dtype).ok_or_else(|| Error::InvalidInput {
        name: "autocast",
        value: format!("{dtype:?}"),
        reason: "autocast computes in BFloat16 or Half".into(),
    })?;
    ffi::meta_autocast_begin(list, code)?;
    let _region = Region;
    Ok(f())
}

/// The dry run's hook that marks where backward begins.
type Mark<'a> = Box<dyn Fn() -> Result<()> + 'a>;

type Segment<'a> = Box<dyn Fn(&Tensor, bool) -> Tensor + 'a>;

/// A model run as a chain of segments (each takes one tensor and returns one), trained
/// with gradient checkpointing: every segment added with [`Checkpointed::segment`] but
/// the last keeps only its output during the forward pass and is recomputed during
/// backward; one added with [`Checkpointed::segment_kept`] keeps its activations.
///
/// ```no_run
/// use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let vs = nn::VarStore::new(Device::Cpu);
/// let (a, b) = (vs.root() / "a", vs.root() / "b");
/// let block1 = nn::seq().add(nn::linear(&a / "l1", 64, 256, Default::default())).add_fn(|x| x.relu());
/// let block2 = nn::linear(&b / "l2", 256, 10, Default::default());
/// let model = tch_memprof::Checkpointed::new(&vs)
///     .segment(|x, _train| block1.forward(x))
///     .segment(|x, _train| block2.forward(x));
/// let mut opt = nn::Adam::default().build(&vs, 1e-3)?;
/// let (x, y) = (Tensor::randn([32, 64], (Kind::Float, Device::Cpu)), Tensor::zeros([32], (Kind::Int64, Device::Cpu)));
/// opt.zero_grad();
/// let loss = model.forward_backward(&x, |out| out.cross_entropy_for_logits(&y))?;
/// opt.step();
/// # Ok(()) }
/// ```
///
/// Limits: segments are a chain (one tensor in, one out; a residual connection must
/// stay inside a segment); the loss is a scalar computed by the closure given to
/// [`forward_backward`](Self::forward_backward); batch-norm running statistics, updated
/// again by the recomputation, are put back to their value after the forward pass (the
/// VarStore's buffers are copied once per step for that); random ops (dropout) see the
/// same random numbers in the recomputation: the device's default generator state is
/// saved before each checkpointed segment (a few kilobytes each) and restored for its
/// recomputation, then set to where the plain run would have left it.
pub struct Checkpointed<'a> {
    segments: Vec<Segment<'a>>,
    /// Per segment: kept (run with its graph, not recomputed) rather than checkpointed.
    kept: Vec<bool>,
    buffers: Vec<Tensor>,
    device: Device,
    mixed_precision: Option<Kind>,
    preserve_rng: bool,
    /// In the estimator's dry run on the meta device: autocast's op lists to apply there,
    /// and the hook that marks where backward begins.
    dry_run: Option<(ffi::AutocastList, Mark<'a>)>,
}

impl<'a> Checkpointed<'a> {
    /// An empty chain over the model's VarStore (for its device and buffers).
    pub fn new(vs: &VarStore) -> Self {
        let trainable: Vec<Tensor> = vs.trainable_variables();
        let is_trainable = |t: &Tensor| {
            trainable
                .iter()
                .any(|p| p.data_ptr() == t.data_ptr() && p.size() == t.size())
        };
        let buffers = vs
            .variables()
            .into_values()
            .filter(|t| t.defined() && !is_trainable(t))
            .collect();
        Checkpointed {
            segments: Vec::new(),
            kept: Vec::new(),
            buffers,
            device: vs.device(),
            mixed_precision: None,
            preserve_rng: true,
            dry_run: None,
        }
    }

    /// Appends a segment: `f(input, train)` returns its output. Checkpointed unless it
    /// is the last: its activations are dropped after the forward pass and recomputed
    /// in backward.
    pub fn segment(mut self, f: impl Fn(&Tensor, bool) -> Tensor + 'a) -> Self {
        self.segments.push(Box::new(f));
        self.kept.push(false);
        self
    }

    /// Appends a segment that is not checkpointed: it runs with its graph in the forward
    /// pass and keeps its activations for backward, as without checkpointing (no
    /// recomputation). Mixing kept and checkpointed segments (every second block
    /// checkpointed, say) trades memory for compute between the two extremes.
    pub fn segment_kept(mut self, f: impl Fn(&Tensor, bool) -> Tensor + 'a) -> Self {
        self.segments.push(Box::new(f));
        self.kept.push(true);
        self
    }

    /// The estimator's dry run: the segments run on the meta device, under the meta
    /// trace's autocast with the op lists `list` when mixed precision is on; `mark` is
    /// called once, right before the first backward call; no generator state is saved
    /// (a CUDA run saves it on the host).
    pub(crate) fn for_dry_run(
        mut self,
        list: ffi::AutocastList,
        mark: impl Fn() -> Result<()> + 'a,
    ) -> Self {
        self.dry_run = Some((list, Box::new(mark)));
        self.preserve_rng = false;
        self
    }

    /// Runs the segments and the loss in [`autocast`] with `dtype` (both passes and
    /// the recomputation). Default: float32.
    pub fn mixed_precision(mut self, dtype: Kind) -> Self {
        self.mixed_precision = Some(dtype);
        self
    }

    /// Whether to replay the random generator's state in recomputations (default
    /// true; off saves a few kilobytes per checkpointed segment where no segment is
    /// random).
    pub fn preserve_rng(mut self, on: bool) -> Self {
        self.preserve_rng = on;
        self
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether there is no segment.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    fn amp<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        match (self.mixed_precision, &self.dry_run) {
            (Some(dtype), Some((list, _))) => meta_autocast(*list, dtype, f),
            (Some(dtype), None) => autocast(self.device, dtype, f),
            (None, _) => Ok(f()),
        }
    }

    /// The plain forward pass through every segment, with a graph when gradients are
    /// enabled: no checkpointing (evaluation, or the baseline to compare with).
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.amp(|| {
            let mut h = x.shallow_clone();
            for s in &self.segments {
                h = s(&h, train);
            }
            h
        })
    }

    /// The input of segment `i` with a graph: `x` itself for the first, else boundary
    /// `i` detached, requiring a gradient.
    fn boundary(&self, x: &Tensor, bounds: &[Tensor], i: usize) -> Tensor {
        if i == 0 {
            x.shallow_clone()
        } else {
            bounds[i].detach().set_requires_grad(true)
        }
    }

    /// One training step's forward and backward with checkpointing: gradients are
    /// accumulated into the parameters (and into `x` if it requires a gradient) as
    /// `loss.backward()` would. Returns the loss, detached. Call `zero_grad` before and
    /// the optimizer step after, as usual.
    pub fn forward_backward(
        &self,
        x: &Tensor,
        loss_fn: impl FnOnce(&Tensor) -> Tensor,
    ) -> Result<Tensor> {
        let n = self.segments.len();
        if n == 0 {
            return Err(Error::InvalidConfig {
                name: "Checkpointed segments",
                value: "0".into(),
                reason: "add at least one segment".into(),
            });
        }
        // 1. Forward without graphs, keeping the boundaries (and the generator state
        //    each checkpointed segment started from); a kept segment runs with its graph
        //    from a detached input, its input and output held for step 3.
        let mut bounds: Vec<Tensor> = vec![x.shallow_clone()];
        let mut rng: Vec<Option<Tensor>> = Vec::with_capacity(n);
        let mut kept: Vec<Option<(Tensor, Tensor)>> = Vec::with_capacity(n);
        for i in 0..n - 1 {
            if self.kept[i] {
                rng.push(None);
                let input = self.boundary(x, &bounds, i);
                let y = self.amp(|| (self.segments[i])(&input, true))?;
                bounds.push(y.detach());
                kept.push(Some((input, y)));
                continue;
            }
            rng.push(match self.preserve_rng {
                true => Some(ffi::rng_state(self.device)?),
                false => None,
            });
            let y = tch::no_grad(|| self.amp(|| (self.segments[i])(&bounds[i], true)))?;
            bounds.push(y);
            kept.push(None);
        }

        // 2. The last segment and the loss, with a graph.
        let last_in = if n == 1 {
            x.shallow_clone()
        } else {
            bounds[n - 1].detach().set_requires_grad(true)
        };
        let loss = self.amp(|| loss_fn(&(self.segments[n - 1])(&last_in, true)))?;
        if loss.numel() != 1 {
            return Err(Error::InvalidConfig {
                name: "loss",
                value: format!("a tensor of shape {:?}", loss.size()),
                reason: "the loss closure must return a scalar".into(),
            });
        }
        if let Some((_, mark)) = &self.dry_run {
            mark()?;
        }
        loss.f_backward()
            .map_err(|e| Error::Native(format!("backward of the last segment: {e}")))?;
        // Running statistics as the plain step leaves them (every segment ran once).
        let buffers_after: Vec<Tensor> = match n > 1 {
            true => tch::no_grad(|| self.buffers.iter().map(|b| b.copy()).collect()),
            false => Vec::new(),
        };
        let rng_after = match self.preserve_rng && n > 1 {
            true => Some(ffi::rng_state(self.device)?),
            false => None,
        };
        let mut g = last_in.grad();
        drop(last_in);
        bounds.truncate(n - 1);

        // 3. Earlier segments, last to first: recompute with a graph, push g through.
        for i in (0..n - 1).rev() {
            if !g.defined() {
                // Nothing upstream of this boundary depends on a parameter.
                break;
            }
            let (input, out) = match kept[i].take() {
                Some(held) => held,
                None => {
                    if let Some(state) = &rng[i] {
                        ffi::set_rng_state(self.device, state)?;
                    }
                    let input = self.boundary(x, &bounds, i);
                    let out = self.amp(|| (self.segments[i])(&input, true))?;
                    (input, out)
                }
            };
            bounds.truncate(i);
            if out.requires_grad() {
                (out * &g)
                    .f_sum(g.kind())
                    .and_then(|s| s.f_backward())
                    .map_err(|e| Error::Native(format!("backward of segment {i}: {e}")))?;
            }
            g = if i > 0 { input.grad() } else { Tensor::new() };
        }
        if let Some(state) = &rng_after {
            ffi::set_rng_state(self.device, state)?;
        }
        tch::no_grad(|| {
            for (b, saved) in self.buffers.iter().zip(&buffers_after) {
                let mut b = b.shallow_clone();
                b.copy_(saved);
            }
        });
        Ok(loss.detach())
    }
}
