//! An input of the wrong type, in the project's words: the forward pass's failure says
//! which input, what the model reads it as, and the `--input` that gives it.

use tch::{Kind, Tensor};

/// libtorch's words for an input of the wrong type, said in the project's: which input,
/// what the model reads it as, and the `--input` that gives it. The failure's place (the
/// node and module, where the reason names them) is kept; None for any other failure.
pub(super) fn input_type_words(reason: &str, xs: &[Tensor]) -> Option<String> {
    const AS_TOKEN_IDS: &[&str] = &["'indices' to have one of the following scalar types"];
    const AS_FLOATS: &[&str] = &[
        "Input dtype must be either a floating point",
        "could not infer output dtype",
        "expected scalar type Float but found Long",
        "and weight type (float) should be the same",
        "mat1 and mat2 must have the same dtype",
        "expected m1 and m2 to have the same dtype",
        "not implemented for 'Long'",
    ];
    let found = |phrases: &[&str]| phrases.iter().find_map(|p| reason.find(p));
    let shape = |t: &Tensor| {
        t.size()
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x")
    };
    let (at, words) = if let Some(at) = found(AS_TOKEN_IDS) {
        let i = xs.iter().position(|t| t.is_floating_point())?;
        let s = shape(&xs[i]);
        (
            at,
            format!(
                "input {} ({s}, {}) is read as token ids (an embedding's indices), which are \
                 integers: give it as --input {s}:i64",
                i + 1,
                kind_name(xs[i].kind())
            ),
        )
    } else if let Some(at) = found(AS_FLOATS) {
        let i = xs.iter().position(|t| !t.is_floating_point())?;
        let s = shape(&xs[i]);
        (
            at,
            format!(
                "input {} ({s}, {}) is integer, where the model computes in floating point: \
                 give it as --input {s} (f32; :bf16 or :f16 for half precision)",
                i + 1,
                kind_name(xs[i].kind())
            ),
        )
    } else {
        return None;
    };
    // The failure's place: what precedes libtorch's sentence, up to its last ": ".
    let place = reason[..at].rfind(": ").map_or("", |q| &reason[..q]);
    Some(if place.is_empty() {
        words
    } else {
        format!("{place}: {words}")
    })
}

/// A tensor type as `--input` spells it.
fn kind_name(kind: Kind) -> String {
    match kind {
        Kind::Float => "f32".into(),
        Kind::Double => "f64".into(),
        Kind::Half => "f16".into(),
        Kind::BFloat16 => "bf16".into(),
        Kind::Int64 => "i64".into(),
        Kind::Int => "i32".into(),
        Kind::Int16 => "i16".into(),
        Kind::Int8 => "i8".into(),
        Kind::Uint8 => "u8".into(),
        Kind::Bool => "bool".into(),
        other => format!("{other:?}"),
    }
}
