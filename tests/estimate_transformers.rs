//! Transformers in the dry run: a GPT-2-shaped decoder written in tch (its position ids
//! made with `Tensor::arange(t, (Kind::Int64, idx.device()))`, the usual way) built
//! straight on the meta device and estimated for inference and an AdamW training step.
//! Expected values by hand: the weights from the architecture, the baseline (weights and
//! the batch, each block rounded to 512 B), and the floor every AdamW step holds (weights,
//! their gradients and two moment tensors).

mod common;

use tch::Kind;
use tch_memprof::estimate::{Gpu, Input, Mode, Model, Optimizer, Options};
use tch_memprof::models::{Gpt2, Gpt2Config};

const C: Gpt2Config = Gpt2Config {
    vocab: 1000,
    context: 64,
    dim: 64,
    layers: 2,
    heads: 4,
};

/// Parameters by hand: token and position embeddings, per block two layer norms, the
/// fused qkv and output projections and the MLP, the final layer norm (the head is tied).
fn params() -> u64 {
    let d = C.dim as u64;
    let block =
        2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    C.vocab as u64 * d + C.context as u64 * d + C.layers as u64 * block + 2 * d
}

fn round(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

#[test]
fn a_tch_decoder_runs_its_dry_run_on_inputs_device() {
    let _serial = common::serial();
    let model = Model::build_on_meta(|p| Gpt2::new(p, C)).unwrap();
    assert_eq!(model.weights_bytes(), 4 * params());
    let input = Input::new(&[2, 32], Kind::Int64);
    // No cuBLAS workspace, so that the allocations are the model's own.
    let options = Options {
        gpu: Gpu {
            cublas_workspace: 0,
            ..Gpu::generic()
        },
        ..Options::default()
    };
    let e = model
        .estimate(std::slice::from_ref(&input), Mode::Inference, &options)
        .unwrap();
    assert_eq!(e.unknown_frees, 0);
    // The weights, in 512-byte blocks, plus the batch of 2 x 32 int64 ids.
    let d = C.dim as u64;
    let blocks = [C.vocab as u64 * d, C.context as u64 * d]
        .into_iter()
        .chain((0..C.layers).flat_map(|_| {
            [
                d,
                d,
                d * 3 * d,
                3 * d,
                d * d,
                d,
                d,
                d,
                d * 4 * d,
                4 * d,
                4 * d * d,
                d,
            ]
        }))
        .chain([d, d]);
    let weights_rounded: u64 = blocks.map(|n| round(4 * n)).sum();
    assert_eq!(e.baseline_allocated, weights_rounded + round(2 * 32 * 8));
    assert!(e.peak_allocated > e.baseline_allocated);

    let t = model
        .estimate(&[input], Mode::Train(Optimizer::AdamW), &options)
        .unwrap();
    // Weights, gradients and AdamW's two moments are all alive after the first step.
    assert!(t.peak_allocated >= 4 * weights_rounded, "{t:?}");
    assert_eq!(t.unknown_frees, 0);
}

#[test]
fn mps_outside_a_dry_run_fails_with_a_reason() {
    let _serial = common::serial();
    // Make sure the dry run's setup ran (it registers the MPS mapping), then ask for MPS.
    Model::build_on_meta(|p| Gpt2::new(p, C)).unwrap();
    let r = tch::Tensor::f_zeros([2], (Kind::Float, tch::Device::Mps));
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("only during an estimate's dry run"), "{msg}");
}
