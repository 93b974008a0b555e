//! `tch-memprof profile`: one real step of a model file (an exported program or a
//! TorchScript file) under the profiler.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tch::Device;

use crate::cli::fail;
use crate::cli::model_args::parse_inputs;
use crate::cli::text::estimate_text::cpu_device_line;

/// Arguments of `tch-memprof profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// An exported program (.pt2, from torch.export.save) or a TorchScript file.
    path: PathBuf,
    /// An input shape, batch first, with an optional dtype after a colon; once per input.
    /// An exported program takes its exported shapes and dtypes when left out.
    #[arg(long = "input")]
    inputs: Vec<String>,
    /// Profile a training step (forward, loss, backward) instead of inference.
    #[arg(long)]
    train: bool,
    /// cpu or cuda (cuda:N).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where the plot, the CSV files and the summary go.
    #[arg(long, default_value = "profile_results")]
    output_dir: PathBuf,
}

fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Ok(Device::Cuda(i)),
            _ => Err(format!("invalid device {other:?}: cpu, cuda or cuda:N")),
        },
    }
}

pub fn run(a: &ProfileArgs) -> ExitCode {
    profile(a).unwrap_or_else(fail)
}

/// The command, its bad input as the error.
fn profile(a: &ProfileArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut inputs = parse_inputs(&a.inputs)?;
    let device = parse_device(&a.device)?;
    if let Device::Cuda(i) = device {
        if !tch::Cuda::is_available() || i >= tch::Cuda::device_count() as usize {
            return Err(format!("device {} is not available here", a.device).into());
        }
    }
    if crate::estimate::is_exported_program(&a.path) {
        // The program's own input shapes and dtypes where --input leaves them out.
        let m = crate::estimate::Model::exported(&a.path)?;
        crate::cli::model_args::program_inputs(&a.path, &m, &mut inputs, &a.inputs)?;
    } else if inputs.is_empty() {
        let m = crate::estimate::Model::from_file(&a.path)?;
        return Err(crate::cli::model_args::missing_input(&a.path, &m).into());
    }
    let step = crate::profile_file(&a.path, &inputs, a.train, device, &a.output_dir).inspect_err(
        |_| {
            // A TorchScript file traced on the CPU stops on a GPU: say why first.
            if matches!(device, Device::Cuda(_)) {
                let m = crate::estimate::Model::from_file(&a.path).ok();
                if let Some(line) = m.and_then(|m| cpu_device_line(&m)) {
                    eprintln!("{line}");
                }
            }
        },
    )?;
    for f in &step.files {
        println!("wrote {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}
