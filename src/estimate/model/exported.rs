//! A model from an exported program (`.pt2`): its weights made on meta, its graph run
//! by `crate::program`.

use std::path::Path;

use tch::nn;
use tch::Device;

use super::{live_bytes, Model, Runner, Trace};
use crate::error::Result;
use crate::program::Program;

impl Model {
    /// An exported program (`torch.export.export`, saved with `torch.export.save`: a
    /// `.pt2` archive), its weights made on the meta device from their metadata, never
    /// read: a program of any size estimates on a small machine. Its graph runs node by
    /// node through libtorch's dispatcher; for training, with grad enabled over its
    /// parameters, so autograd records it and the backward pass runs as in eager
    /// PyTorch. Both forms torch.export writes are read: the training IR of
    /// `torch.export.export` and the core-ATen IR of `run_decompositions()`.
    pub fn exported(path: &Path) -> Result<Model> {
        let program = Program::open(path)?;
        let trace = Trace::begin()?;
        let weights = program.load_weights(None)?;
        let trace_events = trace.finish()?;
        let weights_bytes = live_bytes(&trace_events);
        let vs = nn::VarStore::new(Device::Cpu);
        crate::program::add_to_var_store(&vs, program.weights(), &weights);
        Ok(Model {
            runner: Runner::Program {
                program: Box::new(program),
                weights,
                vs,
            },
            weights: trace_events,
            weights_bytes,
            label: crate::fs::file_label(path),
            chain: None,
            user_code: false,
            sharded_run: std::cell::Cell::new(None),
            takes: None,
        })
    }

    /// An exported program's parameters saved with `requires_grad=False` (frozen): how
    /// many, and their bytes. None for other models, or where none is.
    pub(crate) fn frozen_parameter_bytes(&self) -> Option<(usize, u64)> {
        let Runner::Program { program, .. } = &self.runner else {
            return None;
        };
        let frozen: Vec<u64> = program
            .weights()
            .iter()
            .filter(|w| w.kind == crate::program::WeightKind::FrozenParameter)
            .map(|w| w.tensor_bytes())
            .collect();
        (!frozen.is_empty()).then(|| (frozen.len(), frozen.iter().sum()))
    }

    /// An exported program whose parameters were all saved with `requires_grad=False`
    /// (exported for inference): a training step trains them all.
    pub(crate) fn all_parameters_frozen(&self) -> bool {
        matches!(&self.runner, Runner::Program { program, .. } if program.all_frozen())
    }

    /// A model file: an exported program (`.pt2`, [`Model::exported`]) or a TorchScript
    /// file ([`Model::torchscript`]), told apart by their contents.
    pub fn from_file(path: &Path) -> Result<Model> {
        if crate::program::is_program(path) {
            Model::exported(path)
        } else {
            Model::torchscript(path)
        }
    }

    /// For an exported program, the inputs it takes, in order: each one's sizes as
    /// exported (`None` for a dynamic dimension) and its dtype. `None` for other models.
    pub fn exported_inputs(&self) -> Option<Vec<(Vec<Option<i64>>, tch::Kind)>> {
        match &self.runner {
            Runner::Program { program, .. } => Some(
                program
                    .exported_sizes()
                    .into_iter()
                    .zip(program.input_kinds())
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The batches the model takes, first and last: an exported program's exported
    /// batch (static) or its batch dimension's range constraint (dynamic). None for
    /// other models (any batch).
    pub fn batch_range(&self) -> Option<(i64, i64)> {
        match &self.runner {
            Runner::Program { program, .. } => program.batch_range(),
            _ => None,
        }
    }
}
