//! The Python-level nodes of an exported graph: the integer (and float, bool)
//! arithmetic it computes sizes with (`sym_size` then `_operator.mul`, `floordiv`,
//! `torch.sym_max`, ...), evaluated as Python evaluates it.

use tch::Tensor;

use crate::error::{Error, Result};

/// A value of the graph: a tensor (or a list of them), or one of the Python-level values
/// the size arithmetic here computes with.
#[derive(Debug)]
pub(crate) enum Val {
    None,
    Tensor(Tensor),
    /// A list of tensors, some absent (`Tensor?[]`).
    Tensors(Vec<Option<Tensor>>),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Clone for Val {
    fn clone(&self) -> Val {
        match self {
            Val::None => Val::None,
            Val::Tensor(t) => Val::Tensor(t.shallow_clone()),
            Val::Tensors(ts) => Val::Tensors(
                ts.iter()
                    .map(|t| t.as_ref().map(Tensor::shallow_clone))
                    .collect(),
            ),
            Val::Int(i) => Val::Int(*i),
            Val::Float(f) => Val::Float(*f),
            Val::Bool(b) => Val::Bool(*b),
        }
    }
}

/// Python-level targets the graph computes sizes with.
const SYMBOLIC: [&str; 33] = [
    "_operator.add",
    "_operator.sub",
    "_operator.mul",
    "_operator.floordiv",
    "_operator.truediv",
    "_operator.mod",
    "_operator.pow",
    "_operator.neg",
    "_operator.eq",
    "_operator.ne",
    "_operator.lt",
    "_operator.le",
    "_operator.gt",
    "_operator.ge",
    "_operator.and_",
    "_operator.or_",
    "_operator.not_",
    "_operator.getitem",
    "_operator.pos",
    "_operator.lshift",
    "_operator.rshift",
    "torch.sym_max",
    "torch.sym_min",
    "torch.sym_not",
    "torch.sym_float",
    "torch.sym_int",
    "torch.sym_ite",
    "torch.sym_sqrt",
    "math.ceil",
    "math.floor",
    "math.trunc",
    "math.sqrt",
    "builtins.round",
];

pub(crate) fn is_symbolic(target: &str) -> bool {
    SYMBOLIC.contains(&target)
}

fn as_f64(v: &Val) -> Result<f64> {
    match v {
        Val::Int(i) => Ok(*i as f64),
        Val::Float(f) => Ok(*f),
        Val::Bool(b) => Ok(f64::from(u8::from(*b))),
        other => Err(Error::Native(format!("{other:?} in a size computation"))),
    }
}

fn as_i64(v: &Val) -> Result<i64> {
    match v {
        Val::Int(i) => Ok(*i),
        Val::Bool(b) => Ok(i64::from(*b)),
        Val::Float(f) => Ok(*f as i64),
        other => Err(Error::Native(format!("{other:?} in a size computation"))),
    }
}

fn truthy(v: &Val) -> Result<bool> {
    Ok(match v {
        Val::Bool(b) => *b,
        other => as_f64(other)? != 0.0,
    })
}

/// A Python-level node: integer (or float, bool) arithmetic on sizes.
pub(super) fn symbolic(target: &str, args: &[Val]) -> Result<Val> {
    let arg = |k: usize| {
        args.get(k)
            .ok_or_else(|| Error::Native(format!("{target} wants argument {k}")))
    };
    let both_int = args.iter().all(|a| matches!(a, Val::Int(_) | Val::Bool(_)));
    let num = |f: fn(i64, i64) -> Option<i64>, g: fn(f64, f64) -> f64| -> Result<Val> {
        let (a, b) = (arg(0)?, arg(1)?);
        if both_int {
            f(as_i64(a)?, as_i64(b)?).map(Val::Int).ok_or_else(|| {
                Error::Native(format!("{target}: integer overflow or division by zero"))
            })
        } else {
            Ok(Val::Float(g(as_f64(a)?, as_f64(b)?)))
        }
    };
    let cmp = |f: fn(f64, f64) -> bool| -> Result<Val> {
        Ok(Val::Bool(f(as_f64(arg(0)?)?, as_f64(arg(1)?)?)))
    };
    let name = target.rsplit('.').next().unwrap_or(target);
    match name {
        "add" => num(i64::checked_add, |a, b| a + b),
        "sub" => num(i64::checked_sub, |a, b| a - b),
        "mul" => num(i64::checked_mul, |a, b| a * b),
        // Python's: the quotient rounds down, the remainder has the divisor's sign.
        "floordiv" => num(
            |a, b| {
                let q = a.checked_div(b)?;
                Some(if a % b != 0 && ((a < 0) != (b < 0)) {
                    q - 1
                } else {
                    q
                })
            },
            |a, b| (a / b).floor(),
        ),
        "mod" => num(
            |a, b| {
                let r = a.checked_rem(b)?;
                Some(if r != 0 && ((r < 0) != (b < 0)) {
                    r + b
                } else {
                    r
                })
            },
            |a, b| a - b * (a / b).floor(),
        ),
        "pow" => num(
            |a, b| u32::try_from(b).ok().and_then(|b| a.checked_pow(b)),
            f64::powf,
        ),
        "truediv" => Ok(Val::Float(as_f64(arg(0)?)? / as_f64(arg(1)?)?)),
        "neg" => Ok(match arg(0)? {
            Val::Float(f) => Val::Float(-f),
            v => Val::Int(-as_i64(v)?),
        }),
        "eq" => cmp(|a, b| a == b),
        "ne" => cmp(|a, b| a != b),
        "lt" => cmp(|a, b| a < b),
        "le" => cmp(|a, b| a <= b),
        "gt" => cmp(|a, b| a > b),
        "ge" => cmp(|a, b| a >= b),
        // Python's & and |: bitwise on ints, logical on bools.
        "and_" | "or_" => match (arg(0)?, arg(1)?) {
            (Val::Int(a), Val::Int(b)) => Ok(Val::Int(if name == "and_" { a & b } else { a | b })),
            (a, b) => Ok(Val::Bool(if name == "and_" {
                truthy(a)? && truthy(b)?
            } else {
                truthy(a)? || truthy(b)?
            })),
        },
        "pos" => Ok(arg(0)?.clone()),
        "lshift" => num(
            |a, b| u32::try_from(b).ok().and_then(|b| a.checked_shl(b)),
            |a, _| a,
        ),
        "rshift" => num(
            |a, b| u32::try_from(b).ok().map(|b| a >> b.min(63)),
            |a, _| a,
        ),
        "not_" | "sym_not" => Ok(Val::Bool(!truthy(arg(0)?)?)),
        "sym_max" => num(|a, b| Some(a.max(b)), f64::max),
        "sym_min" => num(|a, b| Some(a.min(b)), f64::min),
        "sym_float" => Ok(Val::Float(as_f64(arg(0)?)?)),
        "sym_int" | "trunc" => Ok(Val::Int(as_f64(arg(0)?)?.trunc() as i64)),
        "sym_ite" => Ok(if truthy(arg(0)?)? {
            arg(1)?.clone()
        } else {
            arg(2)?.clone()
        }),
        "sym_sqrt" | "sqrt" => Ok(Val::Float(as_f64(arg(0)?)?.sqrt())),
        "ceil" => Ok(Val::Int(as_f64(arg(0)?)?.ceil() as i64)),
        "floor" => Ok(Val::Int(as_f64(arg(0)?)?.floor() as i64)),
        "round" => Ok(Val::Int(as_f64(arg(0)?)?.round_ties_even() as i64)),
        "getitem" => match (arg(0)?, arg(1)?) {
            (Val::Tensors(ts), Val::Int(i)) => {
                let k =
                    usize::try_from(*i).map_err(|_| Error::Native(format!("getitem at {i}")))?;
                Ok(ts
                    .get(k)
                    .and_then(|t| t.as_ref())
                    .map_or(Val::None, |t| Val::Tensor(t.shallow_clone())))
            }
            (a, b) => Err(Error::Native(format!("getitem of {a:?} at {b:?}"))),
        },
        _ => Err(Error::Native(format!("{target} is not read"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arithmetic_follows_python() {
        let i = |v| Val::Int(v);
        let get = |t, a: &[Val]| match symbolic(t, a).unwrap() {
            Val::Int(v) => v,
            other => panic!("{other:?}"),
        };
        assert_eq!(get("_operator.floordiv", &[i(-7), i(2)]), -4); // Python: -7 // 2
        assert_eq!(get("_operator.floordiv", &[i(7), i(-2)]), -4);
        assert_eq!(get("_operator.mod", &[i(-7), i(2)]), 1); // Python: -7 % 2
        assert_eq!(get("_operator.mul", &[i(6), i(7)]), 42);
        assert_eq!(get("torch.sym_max", &[i(3), i(9)]), 9);
        assert_eq!(get("math.ceil", &[Val::Float(2.1)]), 3);
    }
}
