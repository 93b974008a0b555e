//! A user's own training step in the dry run ([`Model::estimate_steps`]): a loop a tch
//! user writes that the built-in loop cannot say (a label-smoothed loss written out,
//! gradients clipped by their global norm as PyTorch's `clip_grad_norm_` does it,
//! AdamW), run for real on the CPU under the profiler's step timeline and dry-run on the
//! meta device from the same code. The dry run's step, replayed in the bytes a CPU run
//! holds (each block its request, no caching allocator, no workspace), must equal the
//! profiler's CPU measurement category by category after every op, and at the peak.

mod common;
#[path = "common/gpt.rs"]
mod gpt;

use gpt::{Gpt, CONTEXT};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::estimate::trace::dry_run_own_step;
use tch_memprof::estimate::{Gpu, Mode, Model, Options};
use tch_memprof::{Category, MemoryProfiler, StepProfile};

const BATCH: i64 = 2;
const STEPS: u32 = 2;

/// What the loop keeps across steps: the model, its optimizer, its trainable tensors.
struct State {
    gpt: Gpt,
    opt: nn::Optimizer,
    params: Vec<Tensor>,
}

fn build(vs: &mut nn::VarStore) -> State {
    State {
        gpt: Gpt::new(&vs.root()),
        opt: nn::AdamW::default().build(vs, 1e-3).unwrap(),
        params: vs.trainable_variables(),
    }
}

/// One training step as the user writes it, on `device`.
fn step(s: &mut State, device: Device) {
    let xs = Tensor::zeros([BATCH, CONTEXT], (Kind::Int64, device));
    let ys = Tensor::zeros([BATCH * CONTEXT, 1], (Kind::Int64, device));
    let logits = s.gpt.forward(&xs);
    // Cross-entropy with label smoothing 0.1, written out in the logits' dtype.
    let logp = logits.log_softmax(-1, None::<Kind>);
    let nll = -logp.gather(1, &ys, false).mean(None::<Kind>);
    let smooth = -logp.mean(None::<Kind>);
    let loss = nll * 0.9 + smooth * 0.1;
    s.opt.zero_grad();
    loss.backward();
    tch_memprof::clip_grad_norm(&s.params, 1.0);
    s.opt.step();
}

fn cpu_run() -> StepProfile {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut vs = vs;
    let mut s = build(&mut vs);
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(u64::from(STEPS))
        .build()
        .unwrap();
    for _ in 0..STEPS {
        step(&mut s, Device::Cpu);
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    prof.step_profile().expect("the step was profiled").clone()
}

fn options() -> Options {
    Options {
        steps: STEPS,
        gpu: Gpu {
            cublas_workspace: 0,
            ..Gpu::generic()
        },
        ..Options::default()
    }
}

#[test]
fn the_dry_run_of_a_users_own_step_is_the_cpu_run_category_by_category() {
    let _serial = common::serial();
    let (model, mut state) = Model::build_steps_on_meta(build).unwrap();
    let dry = dry_run_own_step(&model, &options(), &mut state, step, STEPS).unwrap();
    let cpu = cpu_run();
    let cpu_rows: Vec<_> = cpu.rows.iter().collect();
    let dry_rows: Vec<_> = dry.rows.iter().collect();
    gpt::assert_same_rows(&cpu_rows, &dry_rows, true);
    // The peak, reached inside an op: the CPU's may hold the 8-byte wrapped numbers that
    // `tensor * f64` makes for the op's time (on CUDA they are host tensors, which the
    // dry run leaves out as a CUDA run's allocator never sees them).
    assert!(
        cpu.peak.bytes >= dry.peak.bytes && cpu.peak.bytes - dry.peak.bytes <= 16,
        "CPU peak {} B, dry run {} B",
        cpu.peak.bytes,
        dry.peak.bytes
    );
    // Inside every op the dry run holds no more than the CPU: where a residual join sums
    // a second gradient into the first, the engine adds it in place on the CPU (and on
    // CUDA), and gather's backward scatters into a new zero tensor in place; on the meta
    // device libtorch makes another tensor for each (12,416 B at gather's backward here),
    // which the dry run must not. The kernels' own temporaries are CUDA's in the dry run
    // and the CPU's here, a few hundred bytes apart either way (layer norm's backward
    // 512 B less, embedding's 256 B more).
    for (i, (c, d)) in cpu_rows.iter().zip(&dry_rows).enumerate() {
        assert!(
            d.peak_bytes <= c.peak_bytes + 1024,
            "op {i} {}: peak inside it {} B on the CPU, {} B in the dry run",
            c.op,
            c.peak_bytes,
            d.peak_bytes
        );
    }
    // AdamW's two moments per parameter are optimizer state in both.
    let params = 4 * gpt::params();
    assert_eq!(dry.peak.breakdown.get(Category::Param), params);
    assert!(dry
        .rows
        .iter()
        .any(|r| r.bytes.get(Category::Opt) == 2 * params));
}

#[test]
fn a_users_own_step_is_estimated_through_the_allocator_model() {
    let _serial = common::serial();
    let (model, mut state) = Model::build_steps_on_meta(build).unwrap();
    let e = model.estimate_steps(&options(), &mut state, step).unwrap();
    assert_eq!(e.mode, Mode::Steps);
    assert_eq!(e.weights_bytes, 4 * gpt::params());
    // Weights, gradients and two moments are live together in the second step.
    assert!(e.peak_allocated >= 4 * 4 * gpt::params());
    let s = e.step.as_ref().expect("the predicted step");
    assert!(s.peak.breakdown.get(Category::Opt) > 0);
}

#[test]
fn a_step_that_reads_a_value_fails_in_one_line_saying_so() {
    let _serial = common::serial();
    let (model, mut state) = Model::build_steps_on_meta(build).unwrap();
    let err = model
        .estimate_steps(&options(), &mut state, |s, device| {
            step(s, device);
            // tch's clip_grad_norm reads the norm on the host.
            s.opt.clip_grad_norm(1.0);
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("copies a tensor's values to the host"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn options_a_users_step_writes_itself_are_refused() {
    let _serial = common::serial();
    let (model, mut state) = Model::build_steps_on_meta(build).unwrap();
    let options = Options {
        accumulate: 2,
        ..options()
    };
    let err = model
        .estimate_steps(&options, &mut state, step)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("accumulate") && err.contains("write it into the step"),
        "{err}"
    );
}
