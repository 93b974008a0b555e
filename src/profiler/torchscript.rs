//! One real step of a model file (TorchScript or an exported program) under the profiler, as `tch-memprof profile` runs
//! it: the step timeline by category, the layers and FLOPs, the plot and a summary.

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use crate::error::{catching, torch_message, Error, Result};
use crate::report::write_step_files;
use crate::timeline::StepProfile;
use crate::workload::{loss, Input};

/// What [`profile_file`] measured and wrote.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProfiledStep {
    /// The step, op by op.
    pub profile: StepProfile,
    /// The files written, in the output folder: `step.png`, `step.svg`, `timeline.csv`,
    /// `layers.csv`, `idle.csv`, `summary.txt` (the profiler's own run files are beside
    /// them).
    pub files: Vec<PathBuf>,
}

/// Loads the TorchScript file `path` on `device`, runs one step (inference, or for
/// `train` a forward pass, the loss the estimate uses and a backward pass) on random
/// inputs of these shapes under a profiler with the step timeline and the blocks idle at
/// its peak, and writes the plot, the CSV files and a summary into `output_dir`.
pub(crate) fn profile_torchscript(
    path: &Path,
    inputs: &[Input],
    train: bool,
    device: Device,
    output_dir: &Path,
) -> Result<ProfiledStep> {
    if let Some(reason) = crate::program::not_torchscript(path) {
        return Err(Error::ModelLoad {
            path: path.to_path_buf(),
            reason,
        });
    }
    check_inputs(inputs)?;
    let load_failed = |e: tch::TchError| Error::ModelLoad {
        path: path.to_path_buf(),
        reason: format!(
            "cannot load as TorchScript: {}",
            torch_message(&e.to_string())
        ),
    };
    let mut module = tch::CModule::load_on_device(path, device).map_err(load_failed)?;
    // The parameters under their names in the file (`layer4.0.conv2.weight`), so that
    // each one's layer is its module, as the interpreter names the modules' ops.
    let vs = tch::nn::VarStore::new(device);
    for (name, tensor) in module.named_parameters().map_err(load_failed)? {
        let trainable = tensor.requires_grad();
        crate::vars::add_dotted(&vs.root(), &name, tensor, trainable);
    }
    if train {
        module.set_train();
    } else {
        module.set_eval();
    }
    profile_step(path, &vs, inputs, train, device, output_dir, |xs| {
        module
            .forward_ts(xs)
            .map_err(|e| torch_message(&e.to_string()))
    })
}

/// A model file, as `tch-memprof profile` takes it: an exported program (`.pt2`, from
/// `torch.export.save`) or a TorchScript file, told apart by their contents; one real
/// step of it (a TorchScript file's graph run by libtorch's executor). A program's weights are read from
/// the archive onto `device`, its parameters require grad, and its graph runs node by
/// node through libtorch's dispatcher, so autograd records it for the backward pass.
pub fn profile_file(
    path: &Path,
    inputs: &[Input],
    train: bool,
    device: Device,
    output_dir: &Path,
) -> Result<ProfiledStep> {
    if !crate::program::is_program(path) {
        return profile_torchscript(path, inputs, train, device, output_dir);
    }
    check_inputs(inputs)?;
    let program = crate::program::Program::open(path)?;
    let shapes: Vec<Vec<i64>> = inputs.iter().map(|i| i.shape.clone()).collect();
    program.check_inputs(&shapes)?;
    let vs = tch::nn::VarStore::new(device);
    let weights = program.load_weights(Some(device))?;
    crate::program::add_to_var_store(&vs, program.weights(), &weights);
    let on = match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    };
    profile_step(path, &vs, inputs, train, device, output_dir, |xs| {
        program.forward(&weights, xs, &on).map_err(|e| match e {
            Error::Native(m) => m,
            other => other.to_string(),
        })
    })
}

fn check_inputs(inputs: &[Input]) -> Result<()> {
    if inputs.is_empty() {
        return Err(Error::InvalidInput {
            name: "input",
            value: "(none)".into(),
            reason: "the model needs at least one input shape".into(),
        });
    }
    Ok(())
}

/// One step of `forward` over `vs` under the profiler, its files written.
fn profile_step(
    path: &Path,
    vs: &tch::nn::VarStore,
    inputs: &[Input],
    train: bool,
    device: Device,
    output_dir: &Path,
    forward: impl Fn(&[Tensor]) -> std::result::Result<Tensor, String>,
) -> Result<ProfiledStep> {
    let label = crate::fs::file_label(path);
    let failed = |what: &str, reason: String| Error::DryRun {
        model: label.clone(),
        reason: format!("{what}: {reason}"),
    };
    crate::fs::create_dir_all(output_dir)?;
    let mut profiler = super::MemoryProfiler::builder(vs)
        .timeline_step(1)
        .idle_at_peak(true)
        .csv(true)
        .csv_dir(output_dir)
        // The step's files are the six this function writes below, once.
        .plain_step_files(true)
        .build()?;
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|i| match i.kind {
            Kind::Float | Kind::Half | Kind::BFloat16 | Kind::Double => {
                Tensor::randn(i.shape.as_slice(), (i.kind, device))
            }
            k => Tensor::zeros(i.shape.as_slice(), (k, device)),
        })
        .collect();
    let step = || -> Result<()> {
        let out = forward(&xs).map_err(|e| failed("the model's forward pass failed", e))?;
        if train {
            let loss = loss(&out, |n| Ok(Tensor::zeros([n], (Kind::Int64, device))))
                .map_err(|e| failed("the loss failed", e))?;
            catching(|| loss.backward()).map_err(|e| failed("the backward pass failed", e))?;
        }
        Ok(())
    };
    if train {
        step()?;
    } else {
        tch::no_grad(step)?;
    }
    profiler.record_stats();
    let p = profiler.step_profile().cloned().ok_or_else(|| {
        failed(
            "profiling",
            "the step was not profiled (see the warnings above)".into(),
        )
    })?;
    let title = format!(
        "{label} {}",
        if train { "training step" } else { "inference" }
    );
    let files = write_step_files(&p, output_dir, &title)?;
    Ok(ProfiledStep { profile: p, files })
}
