//! Your own training step, estimated for a GPU you do not have: GPT-2 small trained in
//! pure bfloat16 (weights, gradients and AdamW's moments all bf16) with a loss written
//! out in the logits' dtype, gradients clipped to a global norm of 1 as PyTorch's
//! `clip_grad_norm_` does it, at 8 sequences of 1024 tokens, on an H100.
//!
//!     scripts/with-libtorch.sh cargo run --release --example own_step
//!
//! The same model and batch through the built-in loop (`Model::estimate` with AdamW),
//! whose loss is tch's `cross_entropy_for_logits` (it computes `log_softmax` in f32), is
//! printed beside it: the difference is what the loss's dtype costs at the peak.
//! Options: `--batch N` (default 8), `--gpu NAME` (default h100).

#[path = "common/args.rs"]
mod args;

use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::estimate::{Gpu, Input, Mode, Model, Optimizer, Options};
use tch_memprof::models::{Gpt2, Gpt2Config};

const TOKENS: i64 = 1024;

/// What the loop keeps across steps.
struct Train {
    gpt: Gpt2,
    opt: nn::Optimizer,
    params: Vec<Tensor>,
}

/// One training step, as it would run on the GPU (`device` is the dry run's).
fn step(t: &mut Train, device: Device, batch: i64) {
    let vocab = Gpt2Config::SMALL.vocab;
    let xs = Tensor::zeros([batch, TOKENS], (Kind::Int64, device));
    let ys = Tensor::zeros([batch * TOKENS, 1], (Kind::Int64, device));
    // Logits `[batch * tokens, vocab]` in bf16; the loss stays in bf16.
    let logits = t.gpt.forward_t(&xs, true);
    let logp = logits.log_softmax(-1, None::<Kind>);
    let loss = -logp.gather(1, &ys, false).mean(None::<Kind>);
    debug_assert_eq!(logits.size()[1], vocab);
    t.opt.zero_grad();
    loss.backward();
    tch_memprof::clip_grad_norm(&t.params, 1.0);
    t.opt.step();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let batch = args::number("--batch", 8)?;
    let gpu = Gpu::named(&args::arg("--gpu").unwrap_or_else(|| "h100".into()))?;
    let options = Options {
        gpu: gpu.clone(),
        ..Options::default()
    };

    let (model, mut train) = Model::build_steps_on_meta(|vs| {
        let gpt = Gpt2::new(&vs.root(), Gpt2Config::SMALL);
        vs.bfloat16();
        Train {
            gpt,
            opt: nn::AdamW::default().build(vs, 3e-4).unwrap(),
            params: vs.trainable_variables(),
        }
    })?;
    let own = model.estimate_steps(&options, &mut train, |t, device| step(t, device, batch))?;

    let builtin = Model::build_on_meta(|p| Gpt2::new(p, Gpt2Config::SMALL))?;
    let canned = builtin.estimate(
        &[Input::new(&[batch, TOKENS], Kind::Int64)],
        Mode::Train(Optimizer::AdamW),
        &Options {
            autocast: Some(Kind::BFloat16),
            ..options.clone()
        },
    )?;

    println!(
        "GPT-2 small, {batch}x{TOKENS} tokens, AdamW, on {} ({}):",
        gpu.name,
        gpu.usable()
            .map(|b| format!("{:.2} GiB usable", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default()
    );
    println!("\nyour step: pure bf16, the loss in bf16, gradients clipped");
    println!("{own}");
    println!("\nthe built-in loop: f32 weights under bf16 autocast, tch's f32 cross-entropy");
    println!("{canned}");
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "\npeak allocated: your step {:.2} GiB, the built-in loop {:.2} GiB",
        gib(own.peak_allocated),
        gib(canned.peak_allocated)
    );
    Ok(())
}
