//! The estimate's blocks idle at the predicted peak (`Estimate::idle`, the predicted
//! step's `IdleAtPeak`, the type a profiled step's idle blocks have). The loop the dry
//! run runs holds its output through the optimizer step, as a tch loop that binds it
//! does; no op reads the output after the loss's `log_softmax`. A classifier with a wide
//! head (256 rows of 4096 logits: 4 MiB) peaks in backward, where those logits are dead
//! weight: the estimate names them and the line of the model's code that made them, and
//! the same loop run for real on the CPU, dropping
//! the output right after `log_softmax`, measures the saving the estimate predicted.

mod common;

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::estimate::{Input, Mode, Model, Optimizer, Options};
use tch_memprof::MemoryProfiler;

const BATCH: i64 = 256;
const IN: i64 = 64;
const HIDDEN: i64 = 256;
const CLASSES: i64 = 4096;

#[derive(Debug)]
struct Net {
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.fc1.forward(x).relu();
        self.fc2.forward(&h) // the logits' line
    }
}

fn net(p: &nn::Path) -> Net {
    Net {
        fc1: nn::linear(p / "fc1", IN, HIDDEN, Default::default()),
        fc2: nn::linear(p / "fc2", HIDDEN, CLASSES, Default::default()),
    }
}

/// `tests/idle_estimate.rs:N`, N the line of this file that makes the logits.
fn logits_line() -> String {
    let n = include_str!("idle_estimate.rs")
        .lines()
        .position(|l| l.ends_with("// the logits' line"))
        .expect("the marked line")
        + 1;
    format!("tests/idle_estimate.rs:{n}")
}

/// The CPU loop of the dry run (`Model::estimate`, training): 2 AdamW steps, the batch,
/// the output and the loss held through the optimizer step, gradients set to none after
/// the forward pass; the second step profiled. `drop_output`: the output dropped right
/// after its last read instead. Returns the step's peak allocated bytes.
fn cpu_peak(drop_output: bool) -> u64 {
    let _serial = common::serial();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = net(&vs.root());
    let mut opt = nn::AdamW::default().build(&vs, 1e-3).unwrap();
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(2)
        .build()
        .unwrap();
    for _ in 0..2 {
        let xs = Tensor::randn([BATCH, IN], (Kind::Float, Device::Cpu));
        let out = model.forward(&xs);
        let target = Tensor::zeros([BATCH], (Kind::Int64, Device::Cpu));
        let (loss, out) = if drop_output {
            let logp = out.log_softmax(-1, Kind::Float);
            drop(out);
            (logp.nll_loss(&target), None)
        } else {
            (out.cross_entropy_for_logits(&target), Some(out))
        };
        drop(target);
        opt.zero_grad();
        loss.backward();
        opt.step();
        drop((loss, out, xs));
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    prof.step_profile()
        .expect("the step was profiled")
        .peak
        .bytes
}

#[test]
fn the_held_output_is_idle_and_dropping_it_measures_the_predicted_saving() {
    let estimate = {
        let _serial = common::serial();
        let model = Model::build_on_meta(net).unwrap();
        // No cuBLAS workspace: the CPU run has none.
        let mut options = Options::default();
        options.gpu.cublas_workspace = 0;
        model
            .estimate(
                &[Input::new(&[BATCH, IN], Kind::Float)],
                Mode::Train(Optimizer::AdamW),
                &options,
            )
            .unwrap()
    };
    let idle = estimate
        .idle()
        .cloned()
        .expect("the estimate looks for idle blocks");
    let groups = idle.groups();
    for g in &groups {
        eprintln!(
            "{} B in {} block(s) made by {} at {}, last read by {}: peak {} B if dropped",
            g.bytes, g.blocks, g.op, g.site, g.last_read_op, g.peak_if_dropped
        );
    }
    // The logits, [256, 4096] f32, made by the head's linear layer, last read by the
    // loss's log_softmax; the peak in backward.
    let logits = (BATCH * CLASSES * 4) as u64;
    let top = &groups[0];
    assert_eq!((top.bytes, top.blocks), (logits, 1));
    assert_eq!(top.op, "aten::linear");
    assert_eq!(top.last_read_op, "aten::log_softmax");
    // The line of this file that made them: the model is the user's tch code.
    assert_eq!(top.site, logits_line());
    // The layer of the op that made them: the head, by the variable it read.
    assert_eq!(top.layer, "fc2");
    assert_eq!(estimate.peak_phase.name(), "backward");
    let predicted = estimate.peak_allocated - idle.peak_if_dropped;
    assert!(predicted > 0 && predicted <= logits);

    let (held, dropped) = (cpu_peak(false), cpu_peak(true));
    let measured = held - dropped;
    eprintln!(
        "dropping the output after log_softmax: CPU {held} -> {dropped} B (-{measured} B); \
         predicted {} -> {} B (-{predicted} B)",
        estimate.peak_allocated, idle.peak_if_dropped
    );
    let err = (measured as f64 - predicted as f64).abs() / predicted as f64;
    assert!(
        err <= 0.05,
        "measured -{measured} B, predicted -{predicted} B"
    );
}
