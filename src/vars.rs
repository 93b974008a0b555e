//! The VarStore's variables with the blocks behind them and their gradients, in name
//! order: [`VarTable`], kept between `record_stats` calls (what only changes with the
//! variable set is computed once, and the blocks are re-read only when one may have
//! changed).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use tch::nn::Variables;
use tch::Tensor;

use crate::error::Result;
use crate::ffi::{self, TensorBlock};
use crate::names::layer_of;

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
    block: TensorBlock,
}

/// The variables of a VarStore, kept between calls. [`refresh`](Self::refresh) reads
/// the variables' blocks and gradient blocks in one native call, and rebuilds the
/// per-variable facts (names sorted, layer, dtype, shape, trainable or buffer) only when
/// the set changed: another tensor under a name, a variable added or removed, a
/// trainable flag changed, or a storage replaced or resized (`set_data`, loading into a
/// new storage).
///
/// Each variable's blocks sit at the end of a chain of pointers (its tensor, the
/// storage, the autograd meta, the gradient's tensor and storage, the block header):
/// with thousands of variables these no longer fit a core's cache. So the blocks a read
/// finds are *watched* by the native layer, which counts their frees
/// ([`ffi::watched_frees`]), the variables' own blocks apart from the gradients'. While
/// the store's tensors and trainable list stay the same and no watched variable block
/// was freed, the variables' blocks are not read again; the gradient blocks are read
/// again only after a watched gradient block was freed (as an optimizer's `zero_grad`
/// does each step: the gradients are then new blocks); and at every refresh the
/// variables a free would not reveal a change of are read (a block whose birth was not
/// seen, a variable without a gradient yet). The native read walks many variables at
/// once so that their cache misses overlap. What this cannot see: a variable or
/// gradient moved to another block while its old block stays held by another tensor
/// (no free), or freed on a thread the native layer does not see (a CUDA free on a
/// thread the user started); it is seen at the next free of a watched block of its
/// kind, or change of the set.
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
    /// Bumped at each rebuild and at each read that found a block or gradient block
    /// other than before.
    version: u64,
    /// Bumped at each rebuild and at each read that found a variable's own block other
    /// than before (not its gradient's).
    blocks_version: u64,
    /// The last read's blocks and gradient blocks, in map order.
    blocks: Vec<TensorBlock>,
    grads: Vec<TensorBlock>,
    /// Map positions a watched free would not reveal a change of: a block or gradient
    /// block whose birth was not seen, or no gradient yet (one may appear). Re-read at
    /// every refresh.
    unwatched: Vec<usize>,
    /// [`ffi::watched_frees`] before the blocks were last read (none before the first
    /// read, or after a read that failed).
    frees: Option<ffi::WatchedFrees>,
    /// Scratch buffers of a read.
    scratch: (Vec<TensorBlock>, Vec<TensorBlock>),
    /// The native read's own buffers, kept: a steady refresh allocates nothing.
    reader: ffi::BlockReader,
}

impl VarTable {
    /// Brings the blocks up to date; returns whether the facts were rebuilt.
    pub(crate) fn refresh(&mut self, vars: &Variables) -> Result<bool> {
        if let Some(before) = self.frees.filter(|_| self.same_set(vars)) {
            let now = ffi::watched_frees()?;
            if now.variables == before.variables {
                if now.grads != before.grads {
                    self.read_grads(vars, before.variables)?;
                    return Ok(false);
                }
                if self.unwatched_same(vars)? {
                    return Ok(false);
                }
            }
        }
        self.read_all(vars)
    }

    /// Reads every block and gradient block; rebuilds the facts if the set or a
    /// variable's block changed.
    fn read_all(&mut self, vars: &Variables) -> Result<bool> {
        let same_set = self.same_set(vars);
        // Until this read succeeds, the next refresh reads everything again.
        self.frees = None;
        let (mut blocks, mut grads) = std::mem::take(&mut self.scratch);
        let frees = self.reader.read(
            vars.named_variables.values(),
            Some(&mut blocks),
            &mut grads,
            true,
        )?;
        let same_variables = same_blocks(&blocks, &self.blocks);
        if !same_variables || !same_blocks(&grads, &self.grads) {
            self.version += 1;
        }
        if !same_variables {
            self.blocks_version += 1;
        }
        self.scratch = (
            std::mem::replace(&mut self.blocks, blocks),
            std::mem::replace(&mut self.grads, grads),
        );
        self.find_unwatched();
        let facts_hold = same_set
            && self.defined_count() == self.blocks.iter().filter(|b| b.defined).count()
            && self.entries.iter().all(|e| {
                let b = &self.blocks[e.pos];
                b.base == e.block.base && b.bytes == e.block.bytes
            });
        let rebuilt = !facts_hold;
        if rebuilt {
            let tensors: Vec<&Tensor> = vars.named_variables.values().collect();
            self.rebuild(vars, &tensors)?;
        }
        self.frees = Some(frees);
        Ok(rebuilt)
    }

    /// Reads every gradient block again (the variables' own blocks are known to be
    /// where they were when the count of their frees was `variables`).
    fn read_grads(&mut self, vars: &Variables, variables: u64) -> Result<()> {
        self.frees = None;
        let mut grads = std::mem::take(&mut self.scratch.1);
        let frees = self
            .reader
            .read(vars.named_variables.values(), None, &mut grads, true)?;
        if !same_blocks(&grads, &self.grads) {
            self.version += 1;
        }
        self.scratch.1 = std::mem::replace(&mut self.grads, grads);
        self.find_unwatched();
        // A variable block freed since `variables` was counted is seen next time.
        self.frees = Some(ffi::WatchedFrees {
            variables,
            grads: frees.grads,
        });
        Ok(())
    }

    /// The positions a watched free would not reveal a change of.
    fn find_unwatched(&mut self) {
        let (blocks, grads) = (&self.blocks, &self.grads);
        self.unwatched.clear();
        self.unwatched.extend((0..blocks.len()).filter(|&i| {
            let (b, g) = (&blocks[i], &grads[i]);
            (b.defined && !b.watched) || !g.defined || !g.watched
        }));
    }

    /// The same tensors under the same names, and the same trainable list, as at the
    /// last read (the map's order is then the same too).
    fn same_set(&self, vars: &Variables) -> bool {
        vars.named_variables.len() == self.handles.len()
            && vars
                .named_variables
                .values()
                .zip(&self.handles)
                .all(|(t, h)| ffi::tensor_handle(t) == *h)
            && vars.trainable_variables.len() == self.trainable_handles.len()
            && vars
                .trainable_variables
                .iter()
                .zip(&self.trainable_handles)
                .all(|(v, h)| ffi::tensor_handle(&v.tensor) == *h)
    }

    /// Whether the variables a watched free would not reveal a change of still have the
    /// blocks of the last read.
    fn unwatched_same(&mut self, vars: &Variables) -> Result<bool> {
        if self.unwatched.is_empty() {
            return Ok(true);
        }
        let mut want = self.unwatched.iter().copied().peekable();
        let tensors = vars
            .named_variables
            .values()
            .enumerate()
            .filter(|(pos, _)| {
                let wanted = want.peek() == Some(pos);
                if wanted {
                    want.next();
                }
                wanted
            })
            .map(|(_, t)| t);
        let (mut blocks, mut grads) = std::mem::take(&mut self.scratch);
        self.reader
            .read(tensors, Some(&mut blocks), &mut grads, false)?;
        let same = self
            .unwatched
            .iter()
            .zip(blocks.iter().zip(&grads))
            .all(|(&p, (b, g))| b.same(&self.blocks[p]) && g.same(&self.grads[p]));
        self.scratch = (blocks, grads);
        Ok(same)
    }

    fn defined_count(&self) -> usize {
        self.entries.len()
    }

    fn rebuild(&mut self, vars: &Variables, tensors: &[&Tensor]) -> Result<()> {
        // The set the facts are of is recorded last: a rebuild that fails leaves a set
        // that the next refresh finds changed.
        self.handles.clear();
        // The store lists trainable variables without names: a named variable is
        // trainable when its storage is among theirs.
        let trainable_tensors: Vec<&Tensor> =
            vars.trainable_variables.iter().map(|v| &v.tensor).collect();
        let (mut tb, mut tg) = (Vec::new(), Vec::new());
        ffi::tensor_blocks(&trainable_tensors, Some(&mut tb), &mut tg, false)?;
        let trainable: HashSet<u64> = tb.iter().filter(|b| b.defined).map(|b| b.base).collect();
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
            if !block.defined {
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
        self.handles = tensors.iter().map(|t| ffi::tensor_handle(t)).collect();
        self.trainable_handles = vars
            .trainable_variables
            .iter()
            .map(|v| ffi::tensor_handle(&v.tensor))
            .collect();
        self.generation += 1;
        self.version += 1;
        self.blocks_version += 1;
        Ok(())
    }

    /// Bumped each time the facts are rebuilt.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Bumped at each rebuild and each time a block or gradient block changed.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Bumped at each rebuild and each time a variable's own block changed (a gradient
    /// block's change aside).
    pub(crate) fn blocks_version(&self) -> u64 {
        self.blocks_version
    }

    /// The defined variables' gradient blocks, by name (as [`rows`](Self::rows) gives
    /// them), without copying the rest of each row.
    pub(crate) fn grad_blocks(&self) -> impl Iterator<Item = &TensorBlock> + '_ {
        self.entries.iter().map(|e| &self.grads[e.pos])
    }

    /// The defined variables by name, with their block and gradient block as read by
    /// the last [`refresh`](Self::refresh).
    pub(crate) fn rows(&self) -> impl Iterator<Item = (&Entry, TensorBlock, TensorBlock)> + '_ {
        self.entries
            .iter()
            .map(|e| (e, self.blocks[e.pos], self.grads[e.pos]))
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The native table of model variables (storage -> variable index in name order and
/// the name id of its layer), replaced when the store's storages change.
#[derive(Debug, Default)]
pub(crate) struct ParamSync {
    ptrs: Vec<u64>,
    /// The table's blocks version the native table was last checked against (only
    /// the variables' own blocks matter here: not every gradient change).
    version: Option<u64>,
}

impl ParamSync {
    /// Replaces the native table if the variables' storages changed since the last call.
    pub(crate) fn sync(&mut self, table: &VarTable) -> Result<()> {
        if self.version == Some(table.blocks_version()) {
            return Ok(());
        }
        if table.len() == self.ptrs.len()
            && table
                .rows()
                .zip(&self.ptrs)
                .all(|((_, b, _), p)| b.base == *p)
        {
            self.version = Some(table.blocks_version());
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
        self.version = Some(table.blocks_version());
        Ok(())
    }
}

/// The same blocks, one for one (whether they are watched aside).
fn same_blocks(now: &[TensorBlock], before: &[TensorBlock]) -> bool {
    now.len() == before.len() && now.iter().zip(before).all(|(a, b)| a.same(b))
}
