//! The VarStore's variables with the blocks behind them and their gradients, in name
//! order: [`VarTable`], kept between `record_stats` calls (what only changes with the
//! variable set is computed once), and [`walk`], a one-off walk for the step timeline.

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
    /// The block behind its storage.
    pub block: Block,
    /// The block behind its `.grad` (undefined without one).
    pub grad: Block,
    /// A trainable parameter (else a buffer).
    pub trainable: bool,
}

/// Adds `tensor` (shared, not copied) to the store under its dotted module path
/// (`layer4.0.conv2.weight`, as PyTorch's `named_parameters()` writes it): one store path
/// component per module, so the variable keeps the name and its layer is the module.
pub(crate) fn add_dotted(root: &tch::nn::Path, dotted: &str, tensor: Tensor, trainable: bool) {
    let mut parts: Vec<&str> = dotted.split('.').filter(|p| !p.is_empty()).collect();
    let leaf = parts.pop().unwrap_or("_");
    let mut path = root.clone();
    for c in parts {
        path = path.sub(c);
    }
    let _ = path.add(leaf, tensor, trainable);
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
            block,
            grad: ffi::tensor_block(tensor, true)?,
            trainable: trainable.contains(&block.base),
        });
    }
    Ok(out)
}

/// What is known of one variable while the variable set stays the same.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Its path (`layer1.0.conv1.weight`).
    pub name: String,
    /// Its layer (the path less the last part).
    pub layer: String,
    /// Element type, as `Debug` of tch's `Kind` (`Float`).
    pub dtype: String,
    pub shape: Vec<i64>,
    /// A trainable parameter (else a buffer).
    pub trainable: bool,
    /// Its position in the store's map iteration order (where its blocks are read).
    pos: usize,
    /// The block behind it when the table was built; a change rebuilds the table.
    block: Block,
}

/// The variables of a VarStore, kept between calls. [`refresh`](Self::refresh) reads
/// every variable's block and gradient block in one native call, and rebuilds the
/// per-variable facts (names sorted, layer, dtype, shape, trainable or buffer) only when
/// the set changed: another tensor under a name, a variable added or removed, a
/// trainable flag changed, or a storage replaced or resized (`set_data`, loading into a
/// new storage).
#[derive(Debug, Default)]
pub(crate) struct VarTable {
    /// Tensor handles in the map's iteration order, and of the trainable list: the key
    /// the facts are valid for.
    handles: Vec<usize>,
    trainable_handles: Vec<usize>,
    /// Defined variables, by name.
    entries: Vec<Entry>,
    /// Bumped at each rebuild.
    generation: u64,
    /// This call's blocks and gradient blocks, in map order.
    blocks: Vec<Block>,
    grads: Vec<Block>,
}

impl VarTable {
    /// Reads the blocks of every variable now; returns whether the facts were rebuilt.
    pub(crate) fn refresh(&mut self, vars: &Variables) -> Result<bool> {
        let tensors: Vec<&Tensor> = vars.named_variables.values().collect();
        ffi::tensor_blocks(&tensors, &mut self.blocks, &mut self.grads)?;
        let same_set = tensors.len() == self.handles.len()
            && tensors
                .iter()
                .zip(&self.handles)
                .all(|(t, h)| ffi::tensor_handle(t) == *h)
            && vars.trainable_variables.len() == self.trainable_handles.len()
            && vars
                .trainable_variables
                .iter()
                .zip(&self.trainable_handles)
                .all(|(v, h)| ffi::tensor_handle(&v.tensor) == *h);
        let same_blocks = same_set
            && self.defined_count() == self.blocks.iter().filter(|b| b.is_defined()).count()
            && self.entries.iter().all(|e| {
                let b = &self.blocks[e.pos];
                b.base == e.block.base && b.bytes == e.block.bytes
            });
        if same_blocks {
            return Ok(false);
        }
        self.rebuild(vars, &tensors)?;
        Ok(true)
    }

    fn defined_count(&self) -> usize {
        self.entries.len()
    }

    fn rebuild(&mut self, vars: &Variables, tensors: &[&Tensor]) -> Result<()> {
        self.handles = tensors.iter().map(|t| ffi::tensor_handle(t)).collect();
        self.trainable_handles = vars
            .trainable_variables
            .iter()
            .map(|v| ffi::tensor_handle(&v.tensor))
            .collect();
        // The store lists trainable variables without names: a named variable is
        // trainable when its storage is among theirs.
        let trainable_tensors: Vec<&Tensor> =
            vars.trainable_variables.iter().map(|v| &v.tensor).collect();
        let (mut tb, mut tg) = (Vec::new(), Vec::new());
        ffi::tensor_blocks(&trainable_tensors, &mut tb, &mut tg)?;
        let trainable: HashSet<u64> = tb
            .iter()
            .filter(|b| b.is_defined())
            .map(|b| b.base)
            .collect();
        // The map's iteration order, as `values()` gave the tensors.
        let mut named: Vec<(&String, usize)> = vars
            .named_variables
            .keys()
            .enumerate()
            .map(|(pos, name)| (name, pos))
            .collect();
        named.sort();
        self.entries.clear();
        for (name, pos) in named {
            let block = self.blocks[pos];
            if !block.is_defined() {
                continue;
            }
            let tensor = tensors[pos];
            self.entries.push(Entry {
                name: name.clone(),
                layer: layer_of(name),
                dtype: tensor
                    .f_kind()
                    .map(|k| format!("{k:?}"))
                    .unwrap_or_else(|_| crate::names::MISSING.into()),
                shape: tensor.size(),
                trainable: trainable.contains(&block.base),
                pos,
                block,
            });
        }
        self.generation += 1;
        Ok(())
    }

    /// Bumped each time the facts are rebuilt.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The defined variables by name, with their block and gradient block as read by
    /// the last [`refresh`](Self::refresh).
    pub(crate) fn rows(&self) -> impl Iterator<Item = (&Entry, Block, Block)> + '_ {
        self.entries
            .iter()
            .map(|e| (e, self.blocks[e.pos], self.grads[e.pos]))
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The native table of model variables (storage -> variable index in walk order and
/// the name id of its layer), replaced when the store's storages change.
#[derive(Debug, Default)]
pub(crate) struct ParamSync {
    ptrs: Vec<u64>,
}

impl ParamSync {
    /// [`update`](Self::update) from a table.
    pub(crate) fn sync(&mut self, table: &VarTable) -> Result<()> {
        if table.len() == self.ptrs.len()
            && table
                .rows()
                .zip(&self.ptrs)
                .all(|((_, b, _), p)| b.base == *p)
        {
            return Ok(());
        }
        let ptrs: Vec<u64> = table.rows().map(|(_, b, _)| b.base).collect();
        let ids: Vec<i32> = (0..ptrs.len() as i32).collect();
        let layers: Vec<i32> = table
            .rows()
            .map(|(e, _, _)| ffi::intern(&e.layer).unwrap_or(-1))
            .collect();
        ffi::set_params(ffi::Target::Step, &ptrs, &ids, &layers)?;
        self.ptrs = ptrs;
        Ok(())
    }

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
        ffi::set_params(ffi::Target::Step, &ptrs, &ids, &layers)?;
        self.ptrs = ptrs;
        Ok(())
    }
}
