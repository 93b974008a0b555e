//! What a step of a model file is given and what it minimises: its inputs (shapes and
//! dtypes, as the command line writes them) and its training loss. Shared by the real
//! profiled step of a file (`profiler`) and the dry run that predicts it (`estimate`), so
//! both run the same step.

use tch::{Kind, Tensor};

use crate::error::{catching, Error, Result};

/// One input of the model: its shape (batch first) and dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// Sizes, the batch first.
    pub shape: Vec<i64>,
    /// Element type.
    pub kind: Kind,
}

/// Dtype names accepted by [`Input::parse`].
const DTYPES: [(&str, Kind); 12] = [
    ("f32", Kind::Float),
    ("float", Kind::Float),
    ("float32", Kind::Float),
    ("f16", Kind::Half),
    ("half", Kind::Half),
    ("float16", Kind::Half),
    ("bf16", Kind::BFloat16),
    ("bfloat16", Kind::BFloat16),
    ("f64", Kind::Double),
    ("i64", Kind::Int64),
    ("int64", Kind::Int64),
    ("i32", Kind::Int),
];

impl Input {
    /// An input of `shape` (batch first) and `kind`.
    pub fn new(shape: &[i64], kind: Kind) -> Input {
        Input {
            shape: shape.to_vec(),
            kind,
        }
    }

    /// Parses `1x3x224x224` (sizes separated by `x`, batch first) and an optional dtype
    /// (`f32` by default; `f16`, `bf16`, `f64`, `i64`, `i32` and their long names).
    pub fn parse(shape: &str, dtype: Option<&str>) -> Result<Input> {
        let bad = |reason: String| Error::InvalidInput {
            name: "input",
            value: shape.to_string(),
            reason,
        };
        let mut dims = Vec::new();
        for part in shape.split(['x', 'X', ',']) {
            let n: i64 = part.trim().parse().map_err(|_| {
                bad(format!(
                    "{part:?} is not a size (write the sizes separated by x, batch first: 1x3x224x224)"
                ))
            })?;
            if n <= 0 {
                return Err(bad(format!("size {n} must be positive")));
            }
            dims.push(n);
        }
        let kind = match dtype {
            None => Kind::Float,
            Some(d) => {
                let lower = d.to_ascii_lowercase();
                DTYPES
                    .iter()
                    .find(|(n, _)| *n == lower)
                    .map(|(_, k)| *k)
                    .ok_or_else(|| Error::InvalidInput {
                        name: "dtype",
                        value: d.to_string(),
                        reason: format!("unknown; known: {}", DTYPES.map(|(n, _)| n).join(", ")),
                    })?
            }
        };
        Ok(Input { shape: dims, kind })
    }

    /// The same input at batch `b`.
    pub fn with_batch(&self, b: i64) -> Input {
        let mut shape = self.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = b;
        }
        Input {
            shape,
            kind: self.kind,
        }
    }

    /// The batch (the first size).
    pub fn batch(&self) -> i64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// As `--input` writes it: `1x3x224x224`, `1x1024:i64` (the dtype after a colon
    /// unless it is f32).
    pub(crate) fn spec(&self) -> String {
        let sizes: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        let sizes = sizes.join("x");
        match DTYPES.iter().find(|(_, k)| *k == self.kind) {
            Some(_) if self.kind == Kind::Float => sizes,
            Some((name, _)) => format!("{sizes}:{name}"),
            None => format!("{sizes}:{:?}", self.kind),
        }
    }
}

/// The loss of a training step when the model is a file: cross-entropy against one
/// class per row for a 2-D output (class scores), against one class per token for a 3-D
/// output (a token model's `[batch, tokens, vocab]` logits, as a language model trains),
/// the mean otherwise. `target(n)` makes
/// `n` int64 class indices on the output's device. Used by the estimate's dry run and by
/// a real profiled step of a TorchScript file, so both run the same step.
pub(crate) fn loss(
    out: &Tensor,
    target: impl FnOnce(i64) -> Result<Tensor>,
) -> std::result::Result<Tensor, String> {
    if !matches!(
        out.kind(),
        Kind::Float | Kind::Half | Kind::BFloat16 | Kind::Double
    ) {
        return Err(format!(
            "the model's output has dtype {:?}: training needs a floating-point output",
            out.kind()
        ));
    }
    if out.dim() == 2 {
        let target = target(out.size()[0]).map_err(|e| e.to_string())?;
        catching(|| out.cross_entropy_for_logits(&target))
    } else if out.dim() == 3 {
        let size = out.size();
        let rows = size[0] * size[1];
        let target = target(rows).map_err(|e| e.to_string())?;
        catching(|| {
            out.reshape([rows, size[2]])
                .cross_entropy_for_logits(&target)
        })
    } else {
        catching(|| out.mean(out.kind()))
    }
}
