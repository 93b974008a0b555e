//! One node of an exported program called through libtorch's dispatcher (`program/`).

use std::ffi::{c_char, c_void, CString};

use tch::Tensor;

use super::meta::owned_tensor;
use super::{check, native};
use crate::error::{Error, Result};

extern "C" {
    fn memprof_program_call(
        op: *const c_char,
        overload: *const c_char,
        module: *const c_char,
        args: *const MpValue,
        n: usize,
        out: *mut MpValue,
        cap: usize,
        n_out: *mut usize,
    ) -> i32;
}

/// `MpValue`: an argument or a result of an op.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct MpValue {
    pub kind: i32,
    pub len: i32,
    pub i: i64,
    pub f: f64,
    pub tensor: *mut c_void,
    pub name: *const c_char,
    pub str: *const c_char,
}

impl Default for MpValue {
    fn default() -> MpValue {
        MpValue {
            kind: native::VALUE_NONE,
            len: 0,
            i: 0,
            f: 0.0,
            tensor: std::ptr::null_mut(),
            name: std::ptr::null(),
            str: std::ptr::null(),
        }
    }
}

/// An argument of an op, as a node gives it.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    None,
    Tensor(&'a Tensor),
    /// An int, a `c10::ScalarType`, a `c10::Layout` or a `c10::MemoryFormat`.
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(&'a str),
    Device(&'a str),
    /// Elements that are not lists.
    List(Vec<Arg<'a>>),
}

/// What an op returned.
#[derive(Debug)]
pub(crate) enum Returned {
    None,
    Tensor(Tensor),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<Returned>),
}

/// Most values one call returns, lists' elements included.
const RETURNED_CAPACITY: usize = 4096;

fn flat(arg: &Arg<'_>, name: *const c_char, out: &mut Vec<MpValue>) -> Result<()> {
    let mut v = MpValue {
        name,
        ..MpValue::default()
    };
    match arg {
        Arg::None => {}
        Arg::Tensor(t) => {
            v.kind = native::VALUE_TENSOR;
            v.tensor = t.as_ptr() as *mut c_void;
        }
        Arg::Int(i) => {
            v.kind = native::VALUE_INT;
            v.i = *i;
        }
        Arg::Float(f) => {
            v.kind = native::VALUE_FLOAT;
            v.f = *f;
        }
        Arg::Bool(b) => {
            v.kind = native::VALUE_BOOL;
            v.i = i64::from(*b);
        }
        Arg::Str(s) | Arg::Device(s) => {
            v.kind = if matches!(arg, Arg::Str(_)) {
                native::VALUE_STRING
            } else {
                native::VALUE_DEVICE
            };
            v.len = i32::try_from(s.len())
                .map_err(|_| Error::Native("a string argument over 2 GiB".into()))?;
            v.str = s.as_ptr().cast();
        }
        Arg::List(items) => {
            v.kind = native::VALUE_LIST;
            v.len = i32::try_from(items.len())
                .map_err(|_| Error::Native("a list argument too long".into()))?;
            out.push(v);
            for item in items {
                if matches!(item, Arg::List(_)) {
                    return Err(Error::Native(
                        "a list of lists is not an op argument".into(),
                    ));
                }
                flat(item, std::ptr::null(), out)?;
            }
            return Ok(());
        }
    }
    out.push(v);
    Ok(())
}

/// Takes the owned values of `out` back as Rust values (each tensor handle once).
fn returned(out: &[MpValue]) -> Result<Vec<Returned>> {
    let mut all = Vec::new();
    let mut k = 0;
    let one = |v: &MpValue| -> Result<Returned> {
        Ok(match v.kind {
            native::VALUE_TENSOR => {
                Returned::Tensor(owned_tensor(v.tensor, "memprof_program_call")?)
            }
            native::VALUE_INT => Returned::Int(v.i),
            native::VALUE_FLOAT => Returned::Float(v.f),
            native::VALUE_BOOL => Returned::Bool(v.i != 0),
            _ => Returned::None,
        })
    };
    while k < out.len() {
        let v = &out[k];
        k += 1;
        if v.kind == native::VALUE_LIST {
            let end = (k + v.len.max(0) as usize).min(out.len());
            let items = out[k..end].iter().map(one).collect::<Result<Vec<_>>>()?;
            k = end;
            all.push(Returned::List(items));
        } else {
            all.push(one(v)?);
        }
    }
    Ok(all)
}

/// Calls `op` (`aten::conv2d`) at `overload` ("" for the default) with the named
/// arguments `args` (the schema's defaults fill the others), as the layer `module`;
/// its returns in the schema's order.
pub(crate) fn program_call(
    op: &str,
    overload: &str,
    module: &str,
    args: &[(&str, Arg<'_>)],
) -> Result<Vec<Returned>> {
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| Error::Native(format!("{s:?}: a name with a NUL byte")))
    };
    let (op_c, overload_c, module_c) = (cstr(op)?, cstr(overload)?, cstr(module)?);
    let names = args
        .iter()
        .map(|(n, _)| cstr(n))
        .collect::<Result<Vec<_>>>()?;
    let mut flat_args = Vec::with_capacity(args.len() + 8);
    for ((_, arg), name) in args.iter().zip(&names) {
        flat(arg, name.as_ptr(), &mut flat_args)?;
    }
    let mut out = vec![MpValue::default(); RETURNED_CAPACITY];
    let mut n_out = 0usize;
    // SAFETY: every pointer in `flat_args` (names, strings, tensor handles) borrows from
    // `names` and `args`, alive for the call; `out` holds `out.len()` values.
    check(unsafe {
        memprof_program_call(
            op_c.as_ptr(),
            overload_c.as_ptr(),
            module_c.as_ptr(),
            flat_args.as_ptr(),
            flat_args.len(),
            out.as_mut_ptr(),
            out.len(),
            &mut n_out,
        )
    })?;
    returned(&out[..n_out.min(out.len())])
}
