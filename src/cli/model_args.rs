//! What the commands that take a model share: the model (a file or a built-in) and
//! its inputs, loading it with its inputs' defaults, and the GPU and memory budget.

use std::path::{Path, PathBuf};

use crate::cli::text::estimate_text::cpu_device_line;
use crate::estimate::{gpu_memory, Gpu, Input, Model};
use crate::models;
use clap::Args;

/// The model of `estimate` and `plan`: a file or a built-in, and its inputs.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// A model file: an exported program (.pt2, from torch.export.save) or a TorchScript
    /// file (torch.jit.trace or torch.jit.script, saved with .save()).
    #[arg(required_unless_present = "model", conflicts_with = "model")]
    pub path: Option<PathBuf>,
    /// A built-in model instead of a file (its help lists the names of
    /// `models::BUILTINS`).
    #[arg(long, help = builtin_help())]
    pub model: Option<String>,
    /// An input shape, batch first (1x3x224x224), with an optional dtype after a colon
    /// (8x128:i64); once per input of the model. Built-in models default to 1x3x224x224
    /// (images) or 1x1024:i64 (tokens; BERT 1x512:i64).
    #[arg(long = "input")]
    pub inputs: Vec<String>,
}

impl ModelArgs {
    /// The `--input` values, parsed.
    pub fn inputs(&self) -> Result<Vec<Input>, String> {
        parse_inputs(&self.inputs)
    }

    /// The model, with `inputs` (from [`ModelArgs::inputs`]) completed as
    /// [`load_model`] does.
    pub fn load(&self, inputs: &mut Vec<Input>) -> Result<Model, String> {
        load_model(
            self.path.as_deref(),
            self.model.as_deref(),
            inputs,
            &self.inputs,
        )
    }
}

/// `--model`'s help: the built-in models' names.
fn builtin_help() -> String {
    format!(
        "A built-in model instead of a file: {}",
        models::BUILTIN.join(", ")
    )
}

/// The GPU of `--gpu` (default: a generic one before Hopper) and the budget of
/// `--memory` (a size or a GPU name, which also names the GPU when `--gpu` is not given).
pub(crate) fn gpu_and_memory(
    gpu: Option<&str>,
    memory: Option<&str>,
) -> Result<(Gpu, Option<u64>), String> {
    let mut chosen = gpu
        .map(Gpu::named)
        .transpose()
        .map_err(|e| e.to_string())?
        .unwrap_or_else(Gpu::generic);
    let budget = match memory {
        None => None,
        Some(m) => {
            let (size, named) = gpu_memory(m).map_err(|e| e.to_string())?;
            if let (Some(g), None) = (named, gpu) {
                chosen = g;
            }
            Some(size)
        }
    };
    Ok((chosen, budget))
}

/// What to say when a TorchScript file is given no `--input`: the input to try, from
/// what the model does with its first input.
pub(crate) fn missing_input(path: &Path, m: &Model) -> String {
    let hint = match m.suggested_input() {
        Some(s) if s.contains(":i64") => format!("it takes token ids: --input {s}"),
        Some(s) => format!("it takes images: --input {s}"),
        None => "--input 1x3x224x224 for images, --input 1x128:i64 for token ids".to_string(),
    };
    format!(
        "{}: give the model's input shape with --input, batch first ({hint})",
        path.display()
    )
}

/// The model of a file (an exported program or a TorchScript file) or of `--model
/// NAME`. A built-in's default input is added when `inputs` is empty; a TorchScript file
/// needs one; an exported program takes its exported shape when none is given (if it
/// has no dynamic dimension), and its inputs' dtypes where `specs` (the `--input`
/// values) name none.
pub(crate) fn load_model(
    path: Option<&Path>,
    model: Option<&str>,
    inputs: &mut Vec<Input>,
    specs: &[String],
) -> Result<Model, String> {
    let m = match (path, model) {
        (Some(p), _) => {
            let m = Model::from_file(p).map_err(|e| e.to_string())?;
            // At once, before the dry run: the file will not run on a GPU as it is.
            if let Some(line) = cpu_device_line(&m) {
                eprintln!("{line}");
            }
            if m.exported_inputs().is_none() && inputs.is_empty() {
                return Err(missing_input(p, &m));
            }
            program_inputs(p, &m, inputs, specs)?;
            Ok(m)
        }
        (None, Some(name)) => {
            let default = models::default_input(name);
            if inputs.is_empty() {
                inputs.push(default);
            } else {
                // A shape without a dtype takes the model's own: token ids (int64) for
                // the built-in transformers, float images for the rest.
                for (input, spec) in inputs.iter_mut().zip(specs) {
                    if !spec.contains(':') {
                        input.kind = default.kind;
                    }
                }
            }
            Model::builtin(name)
        }
        (None, None) => {
            return Err("give a model file (.pt2 or TorchScript) or --model NAME".into())
        }
    };
    m.map_err(|e| e.to_string())
}

/// For an exported program: its exported shapes when `inputs` is empty (an error if it
/// has dynamic dimensions), and its inputs' dtypes where `specs` (the `--input` values)
/// name none. Nothing for other models.
pub(crate) fn program_inputs(
    p: &Path,
    m: &Model,
    inputs: &mut Vec<Input>,
    specs: &[String],
) -> Result<(), String> {
    let Some(exported) = m.exported_inputs() else {
        return Ok(());
    };
    if inputs.is_empty() {
        for (sizes, kind) in &exported {
            let shape: Option<Vec<i64>> = sizes.iter().copied().collect();
            let Some(shape) = shape else {
                return Err(format!(
                    "{}: the program has dynamic dimensions: give its input shapes with --input",
                    p.display()
                ));
            };
            inputs.push(Input { shape, kind: *kind });
        }
        return Ok(());
    }
    for ((input, spec), (_, kind)) in inputs.iter_mut().zip(specs).zip(&exported) {
        if !spec.contains(':') {
            input.kind = *kind;
        }
    }
    Ok(())
}

/// `--input` values: a shape, batch first, with an optional dtype after a colon.
pub(crate) fn parse_inputs(specs: &[String]) -> Result<Vec<Input>, String> {
    specs
        .iter()
        .map(|s| {
            let (shape, dtype) = match s.split_once(':') {
                Some((a, b)) => (a, Some(b)),
                None => (s.as_str(), None),
            };
            Input::parse(shape, dtype).map_err(|e| e.to_string())
        })
        .collect()
}
