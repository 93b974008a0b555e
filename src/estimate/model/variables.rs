//! The model's variables as the dry run and its analyses see them: by name with their
//! blocks (the op recorder's and the replay's order), and in the order tch created them.

use std::collections::{HashMap, HashSet};

use tch::{nn, Kind, Tensor};

use super::Model;
use crate::error::{torch_message, Error, Result};
use crate::estimate::parallel::Var;
use crate::ffi::{self, TensorBlock};
use crate::names::layer_of;
use crate::replay::ModelVars;
use crate::timeline::VarEntry;

/// A variable's name, its tensor and its block.
type Named = (String, Tensor, TensorBlock);

impl Model {
    /// The defined variables by name (the dry run's variable indices), each with its
    /// block, and the blocks of the trainable ones.
    fn named_blocks(&self) -> Result<(Vec<Named>, HashSet<u64>)> {
        let vs = self.var_store();
        let trainable = vs
            .trainable_variables()
            .iter()
            .map(|t| ffi::tensor_block(t, false).map(|b| b.base))
            .collect::<Result<HashSet<u64>>>()?;
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(named.len());
        for (name, t) in named {
            let b = ffi::tensor_block(&t, false)?;
            if b.defined {
                out.push((name, t, b));
            }
        }
        Ok((out, trainable))
    }

    /// The model's variables as the dry run's op recorder and its replay see them: each
    /// named variable's layer, bytes and block, and which blocks are trainable.
    pub(super) fn vars(&self) -> Result<ModelVars> {
        let (named, trainable) = self.named_blocks()?;
        let mut vars = ModelVars {
            trainable,
            ..ModelVars::default()
        };
        for (name, _, b) in &named {
            vars.entries.push(VarEntry {
                layer: layer_of(name),
                bytes: b.bytes,
            });
            vars.ptrs.push(b.base);
        }
        Ok(vars)
    }

    /// The variables in the dry run's order (by name, defined ones), with their shapes.
    pub(super) fn fsdp_vars(&self) -> Result<Vec<Var>> {
        let (named, trainable) = self.named_blocks()?;
        let frozen = self.frozen_parameters();
        Ok(named
            .into_iter()
            .map(|(name, t, b)| Var {
                frozen: frozen.contains(&name),
                name,
                ptr: b.base,
                shape: t.size(),
                kind: t.kind(),
                trainable: trainable.contains(&b.base),
            })
            .collect())
    }

    /// The names of an exported program's parameters saved without `requires_grad` (in
    /// the VarStore as variables without gradients, as buffers are): FSDP2 shards them
    /// all the same. None for other models (tch's own have no such parameters).
    pub(super) fn frozen_parameters(&self) -> HashSet<String> {
        match &self.runner {
            super::Runner::Program { program, .. } => program
                .weights()
                .iter()
                .filter(|w| w.kind == crate::program::WeightKind::FrozenParameter)
                .map(|w| w.name.clone())
                .collect(),
            _ => HashSet::new(),
        }
    }
}

/// The model's trainable variables in another dtype until dropped: a sharded dry run
/// under FSDP2's mixed precision computes with its parameters cast to `param_dtype`.
/// Each keeps its own block aside and gets it back (its address, which the weights'
/// trace names, unchanged).
pub(super) struct CastParameters {
    kept: Vec<(Tensor, Tensor)>,
}

impl Model {
    /// The parameters (trainable, and an exported program's frozen ones: FSDP2
    /// all-gathers every parameter in `param_dtype`) of a floating-point dtype cast to
    /// `kind` until the value returned is dropped (none cast without a `kind`, or of it
    /// already).
    pub(super) fn cast_parameters(&self, kind: Option<Kind>) -> Result<CastParameters> {
        let mut cast = CastParameters { kept: Vec::new() };
        let Some(kind) = kind else {
            return Ok(cast);
        };
        let frozen = self.frozen_parameters();
        let vs = self.var_store();
        let mut parameters = vs.trainable_variables();
        parameters.extend(
            vs.variables()
                .into_iter()
                .filter(|(name, _)| frozen.contains(name))
                .map(|(_, t)| t),
        );
        tch::no_grad(|| {
            for mut t in parameters {
                if !t.is_floating_point() || t.kind() == kind {
                    continue;
                }
                let own = t.detach();
                let other = t.f_to_kind(kind).map_err(|e| {
                    Error::Native(format!(
                        "casting the parameters to {kind:?}: {}",
                        torch_message(&e.to_string())
                    ))
                })?;
                t.set_data(&other);
                cast.kept.push((t, own));
            }
            Ok(cast)
        })
    }
}

impl Drop for CastParameters {
    fn drop(&mut self) {
        tch::no_grad(|| {
            for (t, own) in &mut self.kept {
                t.set_data(own);
            }
        });
    }
}

/// The variables of `vs` in the order tch created them: trainable variables keep their
/// creation order; each buffer goes just before the first trainable variable of its
/// module (tch's batch norm creates its running statistics first), and buffers of
/// modules without trainable variables go last, by name.
pub(super) fn creation_order(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let named = vs.variables();
    let by_ptr: HashMap<usize, &String> = named
        .iter()
        .filter(|(_, t)| t.numel() > 0)
        .map(|(n, t)| (t.data_ptr() as usize, n))
        .collect();
    let trainable: Vec<String> = vs
        .trainable_variables()
        .iter()
        .filter(|t| t.numel() > 0)
        .filter_map(|t| by_ptr.get(&(t.data_ptr() as usize)).map(|n| (*n).clone()))
        .collect();
    let parent = |n: &str| n.rsplit_once('.').map_or("", |(p, _)| p).to_string();
    let mut buffers: Vec<&String> = named.keys().filter(|n| !trainable.contains(n)).collect();
    buffers.sort();
    let mut order: Vec<String> = Vec::with_capacity(named.len());
    for t in &trainable {
        let p = parent(t);
        buffers.retain(|b| {
            if parent(b) == p {
                order.push((*b).clone());
                false
            } else {
                true
            }
        });
        order.push(t.clone());
    }
    order.extend(buffers.into_iter().cloned());
    order
        .into_iter()
        .filter_map(|n| named.get(&n).map(|t| (n.clone(), t.shallow_clone())))
        .collect()
}
