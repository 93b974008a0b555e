//! The dry run against a real run: a small GPT-style decoder written in tch with plain
//! ops (embeddings, linear layers, layer norm, GELU, causal attention written out with
//! matmul and a masked softmax, cross-entropy), run for real on the CPU under the
//! profiler's step timeline, and dry-run on the meta device. The dry run's live bytes,
//! the running sum of its trace's allocations and frees (no caching allocator, no
//! rounding, no workspace), must equal the live bytes the profiler measures on the CPU
//! allocator: at the step's peak, and after every op of the step, in order.
//!
//! The CPU loop is the loop the dry run models (`Model::dry_run`): the batch made at the
//! step's start, the targets inside the loss, forward and loss (under autocast when it
//! is on), `zero_grad`, `backward`, `step`, then the loss, the output and the batch
//! dropped. The model, both runs and the op-by-op comparison are in
//! `tests/common/gpt.rs` (shared with `tests/plan_levers.rs`).

mod common;
#[path = "common/gpt.rs"]
mod gpt;

use gpt::{compare, compare_categories, Run};
use tch::Kind;
use tch_memprof::estimate::Optimizer;

const BATCH: i64 = 2;

/// The AdamW training step at `BATCH` (or the inference), under `autocast`: the CPU's
/// peak, the dry run's, and the op the CPU's peak was reached in.
fn compare_at(train: bool, autocast: Option<Kind>) -> (u64, u64, String) {
    let run = Run {
        autocast,
        ..if train {
            Run::train(Optimizer::AdamW, BATCH)
        } else {
            Run::inference(BATCH)
        }
    };
    let c = compare(&run);
    (c.cpu, c.dry, c.cpu_op)
}

#[test]
fn f32_training_step() {
    let (cpu, dry, _) = compare_at(true, None);
    assert_eq!(cpu, dry);
}

#[test]
fn f32_inference() {
    let (cpu, dry, _) = compare_at(false, None);
    assert_eq!(cpu, dry);
}

/// A layer norm written out as a textbook writes it, with `x.var(-1)` (`aten::var`, which
/// has no meta kernel in libtorch's C++; the dry run registers one): the dry run's live
/// bytes equal the CPU's after every op, training and inference.
#[test]
fn hand_written_layer_norm_training_step() {
    let run = Run {
        hand_norm: true,
        ..Run::train(Optimizer::AdamW, BATCH)
    };
    let c = compare(&run);
    assert_eq!(c.cpu, c.dry);
    compare_categories(&run);
    // Under the lock: the dry run makes CPU scalars (`var + 1e-5`), which another
    // test's profiled CPU step would count.
    let ops: Vec<String> = {
        let _serial = common::serial();
        gpt::dry_run(&run)
            .ops
            .iter()
            .map(|o| o.op.clone())
            .collect()
    };
    assert!(
        ops.iter().any(|o| o == "aten::var"),
        "no aten::var in {ops:?}"
    );
}

#[test]
fn hand_written_layer_norm_inference() {
    let c = compare(&Run {
        hand_norm: true,
        ..Run::inference(BATCH)
    });
    assert_eq!(c.cpu, c.dry);
}

/// Under CPU autocast some CPU kernels take scratch memory inside the op and free it
/// before the op returns, by how much depending on the processor: the bfloat16 `linear`
/// (oneDNN: 5248 B for the training step and 34304 B for inference with this model on
/// the machine these tests were first written on), a mixed-dtype `add` (3968 B for
/// inference, none for the training step, on an AMD EPYC). The meta kernels allocate
/// what CUDA's kernels allocate, and CUDA's matrix products take their scratch from the cuBLAS workspaces,
/// which the estimate adds apart. So the CPU's peak, reached inside such an op, is above
/// the dry run's by that scratch; every op's live bytes when it returns still match
/// (`compare`), and that is what the dry run is held to.
fn assert_peak_within_cpu_scratch(cpu: u64, dry: u64, cpu_peak_op: &str) {
    assert!(
        cpu >= dry,
        "CPU {cpu} B, dry run {dry} B (peak in {cpu_peak_op})"
    );
    // Scratch of one op of this model, never more than 64 KiB.
    assert!(
        cpu - dry <= 64 << 10,
        "CPU {cpu} B, dry run {dry} B (peak in {cpu_peak_op})"
    );
}

#[test]
fn bf16_autocast_training_step() {
    let (cpu, dry, op) = compare_at(true, Some(Kind::BFloat16));
    assert_peak_within_cpu_scratch(cpu, dry, &op);
}

#[test]
fn bf16_autocast_inference() {
    let (cpu, dry, op) = compare_at(false, Some(Kind::BFloat16));
    assert_peak_within_cpu_scratch(cpu, dry, &op);
}

/// The one replay: the dry run's step, replayed as the estimate replays its predicted
/// step (in the bytes a CPU run holds: each block its request, no workspace), reads as
/// the profiler's measurement of the same step on the CPU, category by category after
/// every op: weights, gradients, activations, temporaries, optimizer state, other.
#[test]
fn the_predicted_step_is_the_measured_one_category_by_category_in_training() {
    compare_categories(&Run::train(Optimizer::AdamW, BATCH));
}

#[test]
fn the_predicted_step_is_the_measured_one_category_by_category_in_inference() {
    compare_categories(&Run::inference(BATCH));
}

#[test]
fn the_predicted_step_is_the_measured_one_category_by_category_with_accumulation() {
    compare_categories(&Run {
        accumulate: 2,
        ..Run::train(Optimizer::AdamW, BATCH)
    });
}
