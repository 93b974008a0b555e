//! An exported program's weights: made on meta from their metadata or read from the
//! archive's records, each record's storage once, and put in a VarStore.

use std::collections::HashMap;
use std::fs::File;

use tch::{nn, Device, Kind, Tensor};

use super::{read_bytes, Program};
use crate::error::{torch_message, Error, Result};

/// What a weight of the program is to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightKind {
    /// A parameter: trained (requires grad in a training step).
    Parameter,
    /// A parameter saved with `requires_grad=False` (frozen: a fine-tune's base
    /// weights): no gradient and no optimizer state, as PyTorch's training step gives it.
    FrozenParameter,
    /// A buffer (batch norm's running statistics).
    Buffer,
    /// A tensor constant: a non-persistent buffer or a tensor the forward pass made
    /// from a constant (`torch.tensor(...)`), lifted to an input by torch.export.
    Constant,
}

/// One tensor the program takes besides the user's inputs.
#[derive(Debug, Clone)]
pub(crate) struct Weight {
    /// Its name in the model (`layer1.0.conv1.weight`).
    pub name: String,
    pub kind: WeightKind,
    /// The graph input it is bound to.
    pub(super) input: String,
    /// Its record in the archive (`data/weights/weight_3`), none for a constant
    /// the archive does not hold.
    pub(super) record: Option<String>,
    /// The record's bytes: the whole storage the tensor views.
    pub(super) record_bytes: u64,
    pub(super) kind_dtype: Kind,
    pub(super) sizes: Vec<i64>,
    pub(super) strides: Vec<i64>,
    pub(super) offset: i64,
}

impl Weight {
    /// The bytes of the tensor itself (its sizes in its dtype).
    pub(crate) fn tensor_bytes(&self) -> u64 {
        let numel: u64 = self.sizes.iter().map(|&d| d.max(0) as u64).product();
        numel * self.kind_dtype.elt_size_in_bytes() as u64
    }

    /// Whether the tensor is its record's whole storage, laid out contiguously.
    fn is_whole_record(&self) -> bool {
        let numel = self
            .sizes
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d).ok()?));
        self.offset == 0
            && self.strides == contiguous_strides(&self.sizes)
            && numel
                .and_then(|n| n.checked_mul(self.kind_dtype.elt_size_in_bytes() as u64))
                .is_some_and(|b| b == self.record_bytes)
    }
}

pub(super) fn contiguous_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; sizes.len()];
    for k in (0..sizes.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1].saturating_mul(sizes[k + 1].max(1));
    }
    strides
}

impl Program {
    /// The weights as tensors: on meta (`on` None; `Device::Mps` in tch's terms inside
    /// the dry run) made from their metadata, never read; on the device `on` read from
    /// the archive, each record moved there once. A weight
    /// that is its record's whole storage is made as itself; weights that view one
    /// storage otherwise (ties of other shapes, offsets, strides) are views of one tensor
    /// of that storage, as PyTorch loads them.
    pub(crate) fn load_weights(&self, on: Option<Device>) -> Result<Vec<Tensor>> {
        let on_meta = on.is_none();
        let fail = |reason: String| Error::ModelLoad {
            path: self.path.clone(),
            reason,
        };
        let mut zip = if on_meta {
            None
        } else {
            let file = File::open(&self.path).map_err(|e| fail(format!("cannot open: {e}")))?;
            Some(zip::ZipArchive::new(file).map_err(|e| fail(format!("not a readable zip: {e}")))?)
        };
        let native = |e: Error| match e {
            Error::Native(m) => fail(torch_message(&m)),
            other => other,
        };
        // A record's tensor: the weight itself, or its whole storage (1-d).
        let mut made: HashMap<&str, (Tensor, bool)> = HashMap::new();
        let mut out = Vec::with_capacity(self.weights.len());
        for w in &self.weights {
            let whole = w.is_whole_record();
            if let Some((t, was_whole)) = w.record.as_deref().and_then(|r| made.get(r)) {
                let tied = *was_whole && whole && t.size() == w.sizes;
                let t = if tied {
                    t.shallow_clone()
                } else {
                    let base = if *was_whole {
                        t.view([-1])
                    } else {
                        t.shallow_clone()
                    };
                    base.f_as_strided(&w.sizes, &w.strides, Some(w.offset))
                        .map_err(|e| {
                            fail(format!("{}: {}", w.name, torch_message(&e.to_string())))
                        })?
                };
                out.push(t);
                continue;
            }
            let elem = w.kind_dtype.elt_size_in_bytes() as u64;
            // The sizes to make: the weight's own, or its record's whole storage.
            let storage_sizes = if whole || w.record.is_none() {
                w.sizes.clone()
            } else {
                if w.record_bytes % elem != 0 {
                    return Err(fail(format!(
                        "{}: its record's {} bytes are not whole {:?} elements",
                        w.name, w.record_bytes, w.kind_dtype
                    )));
                }
                vec![(w.record_bytes / elem) as i64]
            };
            let t = if on_meta {
                let like = Tensor::empty([0], (w.kind_dtype, Device::Cpu));
                crate::ffi::meta_empty(&storage_sizes, &like).map_err(native)?
            } else {
                let record = w
                    .record
                    .as_deref()
                    .ok_or_else(|| fail(format!("{} has no record in the archive", w.name)))?;
                let zip = zip.as_mut().expect("opened above when not on meta");
                let bytes = read_bytes(zip, record).map_err(&fail)?;
                let t = from_storage(&bytes, w.kind_dtype, &storage_sizes)
                    .map_err(|e| fail(format!("{} ({record}): {e}", w.name)))?;
                match on {
                    Some(d) if d != Device::Cpu => t.to_device(d),
                    _ => t,
                }
            };
            let view = if whole || w.record.is_none() {
                t.shallow_clone()
            } else {
                t.f_as_strided(&w.sizes, &w.strides, Some(w.offset))
                    .map_err(|e| fail(format!("{}: {}", w.name, torch_message(&e.to_string()))))?
            };
            if let Some(r) = w.record.as_deref() {
                made.insert(r, (t, whole));
            }
            out.push(view);
        }
        Ok(out)
    }
}

/// A tensor of `sizes` made from raw storage bytes (`weight_N`).
fn from_storage(bytes: &[u8], kind: Kind, sizes: &[i64]) -> std::result::Result<Tensor, String> {
    let elem = kind.elt_size_in_bytes();
    let needed = sizes
        .iter()
        .try_fold(elem, |a, &d| a.checked_mul(usize::try_from(d).ok()?))
        .ok_or_else(|| format!("sizes {sizes:?} overflow"))?;
    if bytes.len() < needed {
        return Err(format!(
            "the record holds {} bytes, where {sizes:?} of {kind:?} needs {needed}",
            bytes.len()
        ));
    }
    Tensor::f_from_data_size(&bytes[..needed], sizes, kind)
        .map_err(|e| torch_message(&e.to_string()))
}

/// The program's parameters in `vs` under their names, those that train as trainable
/// variables, frozen ones (saved with `requires_grad=False`) as variables without
/// gradients, with its buffers; its tensor constants stay out (they are not variables
/// of the model).
pub(crate) fn add_to_var_store(vs: &nn::VarStore, weights: &[Weight], tensors: &[Tensor]) {
    for (w, t) in weights.iter().zip(tensors) {
        match w.kind {
            WeightKind::Parameter => {
                crate::vars::add_dotted(&vs.root(), &w.name, t.shallow_clone(), true)
            }
            WeightKind::Buffer | WeightKind::FrozenParameter => {
                crate::vars::add_dotted(&vs.root(), &w.name, t.shallow_clone(), false)
            }
            WeightKind::Constant => {}
        }
    }
}
