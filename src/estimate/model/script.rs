//! A model from a TorchScript file: loaded onto the meta device, run through the graph
//! executor as tch runs it (its settings and state between dry runs), and the input its
//! graph suggests.

use std::path::Path;

use tch::{nn, Device};

use super::{live_bytes, Model, Runner, Trace};
use crate::error::{torch_message, Error, Result};
use crate::ffi::{self, InputKind};

impl Model {
    /// A TorchScript file (`torch.jit.trace` / `torch.jit.script`, saved with
    /// `.save()`), loaded straight onto the meta device: the weights' bytes are read from
    /// the file and dropped, in the file's order, which is the order a CUDA load
    /// allocates them.
    pub fn torchscript(path: &Path) -> Result<Model> {
        if let Some(reason) = crate::program::not_torchscript(path) {
            return Err(Error::ModelLoad {
                path: path.to_path_buf(),
                reason,
            });
        }
        let trace = Trace::begin()?;
        let module = ffi::ScriptModule::load(path).map_err(|e| Error::ModelLoad {
            path: path.to_path_buf(),
            reason: format!(
                "cannot load as TorchScript: {}",
                torch_message(&e.to_string())
            ),
        })?;
        let weights = trace.finish()?;
        let weights_bytes = live_bytes(&weights);
        let vs = nn::VarStore::new(Device::Cpu);
        for (name, t) in module.tensors(false)? {
            crate::vars::add_dotted(&vs.root(), &name, t, true);
        }
        Ok(Model {
            runner: Runner::Script {
                module,
                vs,
                optimize: std::cell::Cell::new(true),
            },
            weights,
            weights_bytes,
            label: crate::fs::file_label(path),
            chain: None,
            user_code: false,
            sharded_run: std::cell::Cell::new(None),
            takes: None,
        })
    }

    /// For a TorchScript file, an input to try, in the syntax [`Input::parse`](crate::estimate::Input::parse) takes,
    /// from what its forward pass does with its first input: `1x128:i64` where token
    /// ids index an embedding, `1x3x224x224` where images go into a 2-d convolution.
    /// `None` where the graph does not say, and for other models.
    pub fn suggested_input(&self) -> Option<&'static str> {
        let Runner::Script { module, .. } = &self.runner else {
            return None;
        };
        match module.input_kind().ok()? {
            InputKind::Tokens => Some("1x128:i64"),
            InputKind::Images => Some("1x3x224x224"),
            InputKind::Unknown => None,
        }
    }

    /// For a TorchScript file traced on the CPU, the ops (`aten::arange`) that its
    /// graph tells to make their tensors on the CPU: tracing writes the device it ran
    /// on into the graph as a constant (position ids, attention masks, the noise of
    /// stochastic depth). On a GPU those ops still make their tensors on the CPU, where
    /// the GPU's cannot use them, and the run stops ("Expected all tensors to be on the
    /// same device"); the estimate is of the run the file traced on the GPU makes.
    /// Empty for a file traced on a GPU, one that names no device, and other models.
    pub fn cpu_device_ops(&self) -> Vec<String> {
        match &self.runner {
            Runner::Script { module, .. } => module.cpu_uses().unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Whether this is a TorchScript file, which tch runs through the graph executor.
    pub(crate) fn is_script(&self) -> bool {
        matches!(self.runner, Runner::Script { .. })
    }

    /// A TorchScript file's forward passes from now on: through the graph executor's
    /// optimizations, or as written ([`Options::jit_optimize`](crate::estimate::Options::jit_optimize)).
    pub(super) fn set_jit_optimize(&self, on: bool) {
        if let Runner::Script { optimize, .. } = &self.runner {
            optimize.set(on);
        }
    }

    /// A TorchScript file's graph executor as in a fresh process: what it profiled
    /// and optimized in an earlier dry run (at other shapes, or another setting)
    /// forgotten, so that each dry run's steps run as the user's first steps do.
    pub(super) fn fresh_executor(&self) -> Result<()> {
        if let Runner::Script { module, .. } = &self.runner {
            module.fresh()?;
        }
        Ok(())
    }

    pub(super) fn set_train(&self, on: bool) -> Result<()> {
        if let Runner::Script { module, .. } = &self.runner {
            module.set_train(on)?;
        }
        Ok(())
    }
}
