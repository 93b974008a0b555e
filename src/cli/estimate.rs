//! `tch-memprof estimate`: the CUDA peak of a model predicted without a GPU.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::text::commands::{Budget, EstimateOutput};
use crate::cli::text::estimate_text::csv_to_stdout;
use crate::estimate::recorded::Recording;
use crate::estimate::{
    parse_autocast, parse_mixed_dtype, AllocatorConfig, Attention, Ddp, Fsdp, Input, Mode,
    Optimizer, Options,
};
use clap::Args;

use crate::cli::fail;
use crate::cli::model_args::{gpu_and_memory, ModelArgs};
use crate::cli::text::estimate_text::{describe_options, estimate_row, fit_thin_margin_line};
use crate::cli::text::sharded_text::{rank_row, replicated, sharded};
use crate::report::write_step_files;

/// Arguments of `tch-memprof estimate`.
#[derive(Args, Debug)]
pub struct EstimateArgs {
    #[command(flatten)]
    target: ModelArgs,
    /// Estimate one training step (forward, loss, backward, optimizer step) instead of
    /// inference. The loss is cross-entropy for a 2-D output (per row) or a 3-D one (per
    /// token), the mean otherwise.
    #[arg(long)]
    train: bool,
    /// The optimizer of --train: sgd, sgd-momentum, adam, adamw (the default of plan too).
    #[arg(long, default_value = "adamw")]
    optimizer: String,
    /// Batch sizes to estimate (they replace the first size of every input): 1,8,32.
    #[arg(long, value_delimiter = ',')]
    batch_sizes: Vec<i64>,
    /// The GPU (its cuBLAS workspace, its compute capability, which picks the attention
    /// kernels, its multiprocessors, which size the buffers of CUDA's sums, and its
    /// memory for --memory): h100, a100-80gb, rtx4090, ... Default: the GPU --memory
    /// names (--memory h100), else a GPU before Hopper of unknown memory, compute
    /// capability 8.0, an A100's 108 multiprocessors.
    #[arg(long)]
    gpu: Option<String>,
    /// Find the largest batch whose predicted peak reserved fits: a size (80GiB, 24GB)
    /// or a GPU name (its memory less 1 GiB for the CUDA context).
    #[arg(long)]
    memory: Option<String>,
    /// Training steps replayed (the peak is over all of them).
    #[arg(long, default_value_t = 2)]
    steps: u32,
    /// Micro-batches per training step (gradient accumulation): forward, loss and
    /// backward run this many times at the input's batch before each optimizer step.
    #[arg(long, default_value_t = 1)]
    accumulate: u32,
    /// How scaled_dot_product_attention runs: auto (the kernel PyTorch's CUDA build picks
    /// on --gpu), or forced: flash, efficient, cudnn, math.
    #[arg(long, default_value = "auto")]
    attention: String,
    /// Mixed precision: bf16 or f16. The forward pass and the loss run as under CUDA
    /// autocast in that dtype (backward and the optimizer step outside it); weights,
    /// gradients and optimizer state stay f32.
    #[arg(long)]
    autocast: Option<String>,
    /// Activation checkpointing (with --train): every K-th segment of the model's chain
    /// (embedding or stem, blocks, head) recomputed in backward as
    /// crate::Checkpointed runs it, the others kept; 1 checkpoints every segment
    /// but the last. Built-in transformers and ResNets.
    #[arg(long, value_name = "K")]
    checkpoint: Option<u32>,
    /// Training: the gradients set to none before the forward pass (opt.zero_grad()
    /// first) instead of after it, before backward (tch's backward_step).
    #[arg(long)]
    zero_grad_first: bool,
    /// A TorchScript file run as written, op by op, as a program that calls
    /// tch::jit::set_graph_executor_optimize(false) runs it. By default a file runs as
    /// tch runs it: through the graph executor's optimized graph, which in training keeps
    /// more for backward (a dropout's output and mask, even at p=0; under --autocast
    /// the casts of the JIT's own autocast pass).
    #[arg(long)]
    no_jit_optimize: bool,
    /// Print CSV to standard output: model, batch, mode, weights_bytes,
    /// peak_allocated_bytes, peak_reserved_bytes, largest_batch (true on the row of the
    /// largest batch that fits --memory; no row of a program exported with static sizes,
    /// whose one batch is not searched), attention (the backends that ran), autocast
    /// (bf16, f16 or off), idle_bytes (live at the peak, never read again),
    /// peak_if_dropped_bytes (the peak allocated had those been freed after their last
    /// read).
    #[arg(long)]
    csv: bool,
    /// Also print a batch's idle line where freeing its idle blocks would not lower the
    /// peak by an amount the sizes show (left out by default).
    #[arg(long)]
    all_idle: bool,
    /// Write the predicted step (of the last batch estimated) into DIR as
    /// `tch-memprof profile` writes a measured one: step.png, step.svg, timeline.csv,
    /// layers.csv, idle.csv, summary.txt. The bytes are those the caching allocator
    /// charges.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Hold the prediction (of the last batch estimated) to a recorded CUDA run of the
    /// same step: PyTorch's memory snapshot with its allocator history (device 0), or
    /// the compact CSV `tch-memprof replay` reads. Prints the peaks side by side and
    /// where the requests to the allocator part, with the predicted op there (as many
    /// places as --top).
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "csv")]
    compare: Option<PathBuf>,
    /// Shard the model over N GPUs with PyTorch's FSDP2 (fully_shard on each block of
    /// the model's repeated module lists and on the root) and print rank 0's and rank
    /// N-1's peaks, with what each holds at its peak. The loop as --zero-grad-first
    /// says. Unverified on a GPU as a whole (docs/estimate.md).
    #[arg(long, value_name = "N", conflicts_with_all = ["memory", "compare", "output_dir", "batch_sizes"])]
    fsdp: Option<u32>,
    /// With --fsdp: the modules wrapped as units, a pattern of module paths where `*`
    /// stands for one path component or part of one (transformer.h.*, layer*.*).
    #[arg(
        long,
        value_name = "PATTERN",
        requires = "fsdp",
        conflicts_with = "ddp"
    )]
    fsdp_units: Option<String>,
    /// With --fsdp: reshard_after_forward=False (a unit's parameters stay unsharded
    /// from its forward pass to the end of its backward pass).
    #[arg(long, requires = "fsdp", conflicts_with_all = ["fsdp_reshard_root", "ddp"])]
    fsdp_keep_unsharded: bool,
    /// With --fsdp: the root too is resharded after forward (freed when the model's
    /// forward returns, before the loss, and gathered again for backward), as
    /// fully_shard(model, reshard_after_forward=True) set explicitly does; by default
    /// (the option left unset) FSDP2 keeps the root's parameters through backward.
    #[arg(long, requires = "fsdp", conflicts_with = "ddp")]
    fsdp_reshard_root: bool,
    /// With --fsdp: MixedPrecisionPolicy(param_dtype=...), bf16 or f16: the units
    /// gathered and computed in it, the floating-point inputs cast to it; the shards,
    /// the gradient shards and the optimizer state stay in the parameters' dtype.
    #[arg(long, value_name = "DTYPE", requires = "fsdp", conflicts_with = "ddp")]
    fsdp_param_dtype: Option<String>,
    /// With --fsdp: MixedPrecisionPolicy(reduce_dtype=...), f32, bf16 or f16: the
    /// gradients reduce-scattered in it (by default in --fsdp-param-dtype's).
    #[arg(long, value_name = "DTYPE", requires = "fsdp", conflicts_with = "ddp")]
    fsdp_reduce_dtype: Option<String>,
    /// Replicate the model over N GPUs with PyTorch's DistributedDataParallel (its
    /// defaults: 25 MiB gradient buckets) and print a rank's peaks, with what it holds at
    /// its peak. The loop as --zero-grad-first says.
    #[arg(long, value_name = "N", conflicts_with_all = ["fsdp", "memory", "compare", "output_dir", "batch_sizes"])]
    ddp: Option<u32>,
    /// With --ddp: gradient_as_bucket_view=True (the gradients are views into the
    /// buckets instead of blocks of their own).
    #[arg(long, requires = "ddp", conflicts_with = "fsdp")]
    ddp_bucket_view: bool,
    /// Layers listed in the anatomy of the predicted step (0: none).
    #[arg(long, default_value_t = 5)]
    top: usize,
}

pub fn run(a: &EstimateArgs) -> ExitCode {
    estimate(a).unwrap_or_else(fail)
}

/// The command, its bad input as the error.
fn estimate(a: &EstimateArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mode = match a.train {
        true => Mode::Train(Optimizer::parse(&a.optimizer)?),
        false => Mode::Inference,
    };
    let attention = Attention::parse(&a.attention)?;
    if let Some(b) = a.batch_sizes.iter().find(|b| **b <= 0) {
        return Err(format!("invalid batch size {b}: must be positive").into());
    }
    let autocast = a.autocast.as_deref().map(parse_autocast).transpose()?;
    let mut inputs = a.target.inputs()?;
    let allocator = AllocatorConfig::from_env()?;
    let (gpu, memory) = gpu_and_memory(a.gpu.as_deref(), a.memory.as_deref())?;
    let options = Options {
        gpu,
        allocator,
        steps: a.steps,
        accumulate: a.accumulate,
        attention,
        autocast,
        checkpoint: a.checkpoint,
        jit_optimize: !a.no_jit_optimize,
        zero_grad_first: a.zero_grad_first,
    };
    options.validate(mode)?;
    let model = a.target.load(&mut inputs)?;
    if a.train {
        use crate::cli::text::estimate_text::{all_frozen_line, frozen_line};
        if let Some(line) = all_frozen_line(&model).or_else(|| frozen_line(&model)) {
            eprintln!("{line}");
        }
    }
    let label = model.label().to_string();
    let header = || {
        println!(
            "tch-memprof estimate: {label}, {}, batch {}",
            describe_options(&options, mode),
            inputs[0].batch()
        )
    };
    if let Some(world) = a.ddp {
        let ddp = Ddp {
            world,
            gradient_as_bucket_view: a.ddp_bucket_view,
        };
        let rank = model.estimate_replicated(&inputs, mode, &options, &ddp)?;
        if a.csv {
            csv_to_stdout([rank_row(&rank, &label, mode, "ddp", world)])
                .map_err(|e| format!("writing CSV to standard output: {e}"))?;
            return Ok(ExitCode::SUCCESS);
        }
        header();
        print!("{}", replicated(&rank, &ddp));
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(world) = a.fsdp {
        let fsdp = Fsdp {
            world,
            reshard_after_forward: !a.fsdp_keep_unsharded,
            reshard_root: a.fsdp_reshard_root,
            units: a.fsdp_units.clone(),
            param_dtype: a
                .fsdp_param_dtype
                .as_deref()
                .map(|d| parse_mixed_dtype("fsdp-param-dtype", d))
                .transpose()?,
            reduce_dtype: a
                .fsdp_reduce_dtype
                .as_deref()
                .map(|d| parse_mixed_dtype("fsdp-reduce-dtype", d))
                .transpose()?,
        };
        let ranks = model.estimate_sharded(&inputs, mode, &options, &fsdp)?;
        if a.csv {
            csv_to_stdout(
                ranks
                    .iter()
                    .map(|r| rank_row(r, &label, mode, "fsdp", world)),
            )
            .map_err(|e| format!("writing CSV to standard output: {e}"))?;
            return Ok(ExitCode::SUCCESS);
        }
        header();
        print!("{}", sharded(&ranks, &fsdp));
        return Ok(ExitCode::SUCCESS);
    }
    let batches: Vec<i64> = if a.batch_sizes.is_empty() {
        vec![inputs[0].batch()]
    } else {
        a.batch_sizes.clone()
    };
    let at_batch = |b: i64| move |e: crate::Error| format!("at batch {b}: {e}");
    let mut rows = Vec::new();
    for &b in &batches {
        let xs: Vec<Input> = inputs.iter().map(|i| i.with_batch(b)).collect();
        rows.push(model.estimate(&xs, mode, &options).map_err(at_batch(b))?);
    }
    let comparison = match (&a.compare, batches.last()) {
        (Some(path), Some(&b)) => {
            let recording = Recording::read(path, 0)?;
            let xs: Vec<Input> = inputs.iter().map(|i| i.with_batch(b)).collect();
            let c = model
                .compare(&xs, mode, &options, &recording)
                .map_err(at_batch(b))?;
            Some((path, c))
        }
        _ => None,
    };
    let fit = memory
        .map(|m| model.largest_batch(&inputs, mode, &options, Some(m)))
        .transpose()?;
    if let (Some(dir), Some(e)) = (&a.output_dir, rows.last()) {
        let Some(step) = &e.step else {
            return Err(format!("{label}: the dry run made no step to write").into());
        };
        let title = format!("{label} {} (predicted), batch {}", mode.label(), e.batch);
        // Standard output stays CSV with --csv.
        for f in write_step_files(step, dir, &title)? {
            eprintln!("wrote {}", f.display());
        }
    }
    let output = EstimateOutput {
        label: &label,
        options: &options,
        mode,
        rows: &rows,
        budget: memory
            .zip(a.memory.as_deref())
            .map(|(bytes, spec)| Budget { bytes, spec }),
        fit: fit.as_ref(),
        all_idle: a.all_idle,
        top: a.top,
        compared: comparison.as_ref().map(|(p, c)| (p.as_path(), c)),
        pytorch_file: model.from_pytorch(),
    };
    if a.csv {
        // Standard output stays CSV: the warnings go to standard error.
        for line in output.fallback_warnings() {
            eprintln!("{line}");
        }
        // A static program's own batch is not the largest that fits: no row says it is.
        // Where the program bounds the answer, standard error says so.
        if let Some(f) = fit.as_ref().filter(|f| f.program_limited()) {
            eprintln!("warning: {f}");
        }
        if let Some(line) = fit.as_ref().and_then(fit_thin_margin_line) {
            eprintln!("{line}");
        }
        let largest = fit
            .as_ref()
            .filter(|f| !f.fixed_batch())
            .and_then(|f| f.fits.clone());
        let csv_rows = rows
            .iter()
            .map(|e| estimate_row(e, &label, false))
            .chain(largest.iter().map(|e| estimate_row(e, &label, true)));
        csv_to_stdout(csv_rows).map_err(|e| format!("writing CSV to standard output: {e}"))?;
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", output.text());
    Ok(ExitCode::SUCCESS)
}
