//! The one walk over the VarStore: every defined variable with the blocks behind it
//! and its gradient, in a stable order. The profiler's report, the step timeline, the
//! leak hunt, the OOM writer and the native variable table all read it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use tch::nn::Variables;
use tch::Tensor;

use crate::error::Result;
use crate::ffi::{self, Block};
use crate::names::layer_of;

/// One defined VarStore variable.
pub(crate) struct Var<'a> {
    /// Its path (`layer1.0.conv1.weight`).
    pub name: &'a String,
    pub tensor: &'a Tensor,
    /// The block behind its storage.
    pub block: Block,
    /// The block behind its `.grad` (undefined without one).
    pub grad: Block,
    /// A trainable parameter (else a buffer).
    pub trainable: bool,
}

/// The store's variables, locked (a poisoned lock is taken over: the variables are
/// only read).
pub(crate) fn lock(vars: &Arc<Mutex<Variables>>) -> MutexGuard<'_, Variables> {
    match vars.lock() {
        Ok(v) => v,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Every defined variable, by name.
pub(crate) fn walk(vars: &Variables) -> Result<Vec<Var<'_>>> {
    // The store lists trainable variables without names: a named variable is trainable
    // when its storage is among theirs.
    let mut trainable = HashSet::with_capacity(vars.trainable_variables.len());
    for v in &vars.trainable_variables {
        let b = ffi::tensor_block(&v.tensor, false)?;
        if b.is_defined() {
            trainable.insert(b.base);
        }
    }
    let mut names: Vec<&String> = vars.named_variables.keys().collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let tensor = &vars.named_variables[name];
        let block = ffi::tensor_block(tensor, false)?;
        if !block.is_defined() {
            continue;
        }
        out.push(Var {
            name,
            tensor,
            block,
            grad: ffi::tensor_block(tensor, true)?,
            trainable: trainable.contains(&block.base),
        });
    }
    Ok(out)
}

/// The native table of model variables (storage -> variable index in walk order and
/// the name id of its layer), replaced when the store's storages change.
#[derive(Debug, Default)]
pub(crate) struct ParamSync {
    ptrs: Vec<u64>,
}

impl ParamSync {
    pub(crate) fn update(&mut self, vars: &[Var<'_>]) -> Result<()> {
        if vars.len() == self.ptrs.len()
            && vars.iter().zip(&self.ptrs).all(|(v, p)| v.block.base == *p)
        {
            return Ok(());
        }
        let ptrs: Vec<u64> = vars.iter().map(|v| v.block.base).collect();
        let ids: Vec<i32> = (0..ptrs.len() as i32).collect();
        let layers: Vec<i32> = vars
            .iter()
            .map(|v| ffi::intern(&layer_of(v.name)).unwrap_or(-1))
            .collect();
        ffi::set_params(&ptrs, &ids, &layers)?;
        self.ptrs = ptrs;
        Ok(())
    }
}
