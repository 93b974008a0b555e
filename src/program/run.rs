//! Runs an exported program's graph node by node: aten nodes through the dispatcher
//! (`ffi::program_call`), symbolic-integer nodes (`_operator.mul` on sizes, ...) as
//! integer arithmetic, `wrap_with_set_grad_enabled` regions under the grad mode they
//! name. Each value is dropped after its last use, as eager code drops a temporary, so
//! the memory a run holds is the memory the same step holds in PyTorch.

use std::collections::{HashMap, HashSet};

use tch::Tensor;

use super::dtypes::{c10_layout, c10_memory_format, c10_scalar_type};
use super::schema::{Argument, Float, Graph, Node, OptionalTensorArgument, SymArgument};
use super::symbolic::{is_symbolic, symbolic, Val};
use crate::error::{torch_message, Error, Result};
use crate::ffi::{self, Arg, Returned};

/// Nodes that only check what the exporter assumed; the run skips them.
const CHECKS: [&str; 6] = [
    "torch.ops.aten._assert_tensor_metadata.default",
    "torch.ops.aten._assert_scalar.default",
    "torch.ops.aten._assert_async.msg",
    "torch.ops.aten.sym_constrain_range.default",
    "torch.ops.aten.sym_constrain_range_for_size.default",
    "torch.ops.aten._print.default",
];

/// The module path a node ran in, from its `nn_module_stack` metadata
/// (`key,path,type;key,path,type`, outermost first): the innermost entry's path, as
/// `named_modules()` names it (`layers.0.self_attn`).
pub(crate) fn module_path(node: &Node) -> String {
    let Some(stack) = node.metadata.get("nn_module_stack") else {
        return String::new();
    };
    // Entries are `key,path,type`; a path may hold commas (`slice(None, 2, None)`), a
    // key and a type do not.
    let Some(last) = stack.rsplit(';').next() else {
        return String::new();
    };
    let path = last
        .split_once(',')
        .and_then(|(_, rest)| rest.rsplit_once(','))
        .map_or("", |(path, _type)| path);
    clean_path(path)
}

/// `L['self'].layers.slice(None, 2, None).0` → `layers.0`; drops call counts (`@1`).
fn clean_path(path: &str) -> String {
    let path = path
        .strip_prefix("L['self'].")
        .or_else(|| path.strip_prefix("L['self']"))
        .unwrap_or(path);
    let mut out: Vec<&str> = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = path.as_bytes();
    let mut parts = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'.' if depth == 0 => {
                parts.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&path[start..]);
    for p in parts {
        let p = p.split('@').next().unwrap_or(p);
        if p.is_empty() || p.starts_with("slice(") {
            continue;
        }
        out.push(p);
    }
    out.join(".")
}

/// For each node, the values whose last use it is: the last node that reads them, or
/// the node that makes them when none does (an op's unused outputs, such as core ATen's
/// batch-norm statistics in evaluation). Values in `keep` and the graph's outputs are
/// never dropped.
fn last_uses<'g>(graph: &'g Graph, keep: &HashSet<&str>) -> Vec<Vec<&'g str>> {
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (k, node) in graph.nodes.iter().enumerate() {
        for a in &node.inputs {
            for name in names(&a.arg) {
                last.insert(name, k);
            }
        }
        for o in &node.outputs {
            for name in names(o) {
                last.entry(name).or_insert(k);
            }
        }
    }
    for a in &graph.outputs {
        for name in names(a) {
            last.remove(name);
        }
    }
    let mut by_node = vec![Vec::new(); graph.nodes.len()];
    for (name, k) in last {
        if !keep.contains(name) {
            by_node[k].push(name);
        }
    }
    by_node
}

/// The graph values an argument names.
fn names(a: &Argument) -> Vec<&str> {
    match a {
        Argument::AsTensor(t) => vec![t.name.as_str()],
        Argument::AsTensors(ts) => ts.iter().map(|t| t.name.as_str()).collect(),
        Argument::AsOptionalTensors(ts) => ts
            .iter()
            .filter_map(|t| match t {
                OptionalTensorArgument::AsTensor(t) => Some(t.name.as_str()),
                OptionalTensorArgument::AsNone(_) => None,
            })
            .collect(),
        Argument::AsOptionalTensor(OptionalTensorArgument::AsTensor(t)) => vec![t.name.as_str()],
        Argument::AsSymInt(SymArgument::AsName(n))
        | Argument::AsSymFloat(SymArgument::AsName(n))
        | Argument::AsSymBool(SymArgument::AsName(n)) => vec![n.as_str()],
        Argument::AsSymInts(xs) => sym_names(xs),
        Argument::AsSymFloats(xs) => sym_names(xs),
        Argument::AsSymBools(xs) => sym_names(xs),
        _ => Vec::new(),
    }
}

fn sym_names<T>(xs: &[SymArgument<T>]) -> Vec<&str> {
    xs.iter()
        .filter_map(|x| match x {
            SymArgument::AsName(n) => Some(n.as_str()),
            SymArgument::AsInt(_) => None,
        })
        .collect()
}

/// Runs `graph` over `env` (its inputs bound), leaving its outputs in `env`.
pub(crate) fn run_graph(
    graph: &Graph,
    env: &mut HashMap<String, Val>,
    keep: &HashSet<&str>,
    device: &str,
) -> Result<()> {
    let drops = last_uses(graph, keep);
    for (node, dead) in graph.nodes.iter().zip(drops) {
        run_node(node, env, device).map_err(|e| {
            let module = module_path(node);
            let name = node.name.as_deref().unwrap_or("?");
            let op = node
                .target
                .strip_prefix("torch.ops.")
                .unwrap_or(&node.target);
            let msg = match e {
                Error::Native(m) => torch_message(&m),
                other => other.to_string(),
            };
            let at = if module.is_empty() {
                String::new()
            } else {
                format!(" in module {module}")
            };
            Error::Native(format!("node {name} ({op}){at}: {msg}"))
        })?;
        for name in dead {
            env.remove(name);
        }
    }
    Ok(())
}

fn lookup<'e>(env: &'e HashMap<String, Val>, name: &str) -> Result<&'e Val> {
    env.get(name)
        .ok_or_else(|| Error::Native(format!("the graph uses {name} before it is made")))
}

fn tensor<'e>(env: &'e HashMap<String, Val>, name: &str) -> Result<&'e Tensor> {
    match lookup(env, name)? {
        Val::Tensor(t) => Ok(t),
        other => Err(Error::Native(format!("{name} is {other:?}, not a tensor"))),
    }
}

fn sym<T: Copy>(
    env: &HashMap<String, Val>,
    a: &SymArgument<T>,
    lit: impl Fn(T) -> Val,
) -> Result<Val> {
    match a {
        SymArgument::AsName(n) => Ok(lookup(env, n)?.clone()),
        SymArgument::AsInt(v) => Ok(lit(*v)),
    }
}

fn scalar_arg(v: &Val) -> Result<Arg<'_>> {
    Ok(match v {
        Val::None => Arg::None,
        Val::Tensor(t) => Arg::Tensor(t),
        Val::Int(i) => Arg::Int(*i),
        Val::Float(f) => Arg::Float(*f),
        Val::Bool(b) => Arg::Bool(*b),
        Val::Tensors(_) => return Err(Error::Native("a list where a value is wanted".into())),
    })
}

/// Symbolic values of an argument, for Python-level nodes.
fn python_value(env: &HashMap<String, Val>, a: &Argument) -> Result<Val> {
    Ok(match a {
        Argument::AsNone(_) => Val::None,
        Argument::AsInt(i) => Val::Int(*i),
        Argument::AsFloat(f) => Val::Float(f.0),
        Argument::AsBool(b) => Val::Bool(*b),
        Argument::AsSymInt(s) => sym(env, s, Val::Int)?,
        Argument::AsSymFloat(s) => sym(env, s, |f: Float| Val::Float(f.0))?,
        Argument::AsSymBool(s) => sym(env, s, Val::Bool)?,
        Argument::AsTensor(t) => Val::Tensor(tensor(env, &t.name)?.shallow_clone()),
        Argument::AsTensors(ts) => Val::Tensors(
            ts.iter()
                .map(|t| Ok(Some(tensor(env, &t.name)?.shallow_clone())))
                .collect::<Result<_>>()?,
        ),
        other => {
            return Err(Error::Native(format!(
                "an argument {other:?} to a size computation"
            )))
        }
    })
}

/// The op's argument as the dispatcher call takes it.
fn op_arg<'e>(env: &'e HashMap<String, Val>, a: &'e Argument, device: &'e str) -> Result<Arg<'e>> {
    let unread = |what: &str| Err(Error::Native(format!("an argument {what} is not read")));
    let int = |x: &SymArgument<i64>| -> Result<Arg<'e>> {
        match x {
            SymArgument::AsInt(i) => Ok(Arg::Int(*i)),
            SymArgument::AsName(n) => scalar_arg(lookup(env, n)?),
        }
    };
    Ok(match a {
        Argument::AsNone(_) => Arg::None,
        Argument::AsTensor(t) => Arg::Tensor(tensor(env, &t.name)?),
        Argument::AsTensors(ts) => Arg::List(
            ts.iter()
                .map(|t| tensor(env, &t.name).map(Arg::Tensor))
                .collect::<Result<_>>()?,
        ),
        Argument::AsOptionalTensors(ts) => Arg::List(
            ts.iter()
                .map(|t| match t {
                    OptionalTensorArgument::AsTensor(t) => tensor(env, &t.name).map(Arg::Tensor),
                    OptionalTensorArgument::AsNone(_) => Ok(Arg::None),
                })
                .collect::<Result<_>>()?,
        ),
        Argument::AsOptionalTensor(t) => match t {
            OptionalTensorArgument::AsTensor(t) => Arg::Tensor(tensor(env, &t.name)?),
            OptionalTensorArgument::AsNone(_) => Arg::None,
        },
        Argument::AsInt(i) => Arg::Int(*i),
        Argument::AsInts(xs) => Arg::List(xs.iter().map(|i| Arg::Int(*i)).collect()),
        Argument::AsFloat(f) => Arg::Float(f.0),
        Argument::AsFloats(xs) => Arg::List(xs.iter().map(|f| Arg::Float(f.0)).collect()),
        Argument::AsBool(b) => Arg::Bool(*b),
        Argument::AsBools(xs) => Arg::List(xs.iter().map(|b| Arg::Bool(*b)).collect()),
        Argument::AsString(s) => Arg::Str(s),
        Argument::AsSymInt(x) => int(x)?,
        Argument::AsSymInts(xs) => Arg::List(xs.iter().map(int).collect::<Result<_>>()?),
        Argument::AsSymFloat(x) => match x {
            SymArgument::AsInt(f) => Arg::Float(f.0),
            SymArgument::AsName(n) => scalar_arg(lookup(env, n)?)?,
        },
        Argument::AsSymBool(x) => match x {
            SymArgument::AsInt(b) => Arg::Bool(*b),
            SymArgument::AsName(n) => scalar_arg(lookup(env, n)?)?,
        },
        Argument::AsScalarType(t) => Arg::Int(
            c10_scalar_type(*t)
                .ok_or_else(|| Error::Native(format!("dtype {t} of the schema is not read")))?,
        ),
        Argument::AsLayout(l) => {
            Arg::Int(c10_layout(*l).ok_or_else(|| {
                Error::Native(format!("layout {l}: only strided tensors are run"))
            })?)
        }
        Argument::AsMemoryFormat(m) => Arg::Int(c10_memory_format(*m).ok_or_else(|| {
            Error::Native(format!("memory format {m} of the schema is not read"))
        })?),
        // Every device the graph names is the run's: what the exported program made on
        // "its" device (the CPU it was exported on) is made where the run is.
        Argument::AsDevice(_) => Arg::Device(device),
        Argument::AsStrings(_) => return unread("list of strings"),
        Argument::AsSymFloats(_) | Argument::AsSymBools(_) => {
            return unread("list of symbolic values")
        }
        Argument::AsGraph(_) => return unread("subgraph"),
        Argument::AsCustomObj(_) => return unread("script object"),
        Argument::AsOperator(_) => return unread("operator"),
        Argument::AsComplex(_) => return unread("complex number"),
        Argument::AsNestedTensors(_)
        | Argument::AsIntLists(_)
        | Argument::AsStringToArgument(_) => return unread("nested list or dict"),
    })
}

/// Binds what an op returned to the node's outputs.
fn bind(env: &mut HashMap<String, Val>, out: &Argument, r: Returned) -> Result<()> {
    let val = |r: Returned| -> Val {
        match r {
            Returned::None => Val::None,
            Returned::Tensor(t) => Val::Tensor(t),
            Returned::Int(i) => Val::Int(i),
            Returned::Float(f) => Val::Float(f),
            Returned::Bool(b) => Val::Bool(b),
            Returned::List(items) => Val::Tensors(
                items
                    .into_iter()
                    .map(|x| match x {
                        Returned::Tensor(t) => Some(t),
                        _ => None,
                    })
                    .collect(),
            ),
        }
    };
    match (out, r) {
        (Argument::AsTensor(t), r) => {
            env.insert(t.name.clone(), val(r));
        }
        (Argument::AsTensors(ts), Returned::List(items)) => {
            for (t, x) in ts.iter().zip(items) {
                env.insert(t.name.clone(), val(x));
            }
        }
        (Argument::AsOptionalTensors(ts), Returned::List(items)) => {
            for (t, x) in ts.iter().zip(items) {
                if let OptionalTensorArgument::AsTensor(t) = t {
                    env.insert(t.name.clone(), val(x));
                }
            }
        }
        (Argument::AsSymInt(SymArgument::AsName(n)), r)
        | (Argument::AsSymFloat(SymArgument::AsName(n)), r)
        | (Argument::AsSymBool(SymArgument::AsName(n)), r) => {
            env.insert(n.clone(), val(r));
        }
        (Argument::AsSymInts(xs), Returned::List(items)) => {
            for (x, r) in xs.iter().zip(items) {
                if let SymArgument::AsName(n) = x {
                    env.insert(n.clone(), val(r));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn run_node(node: &Node, env: &mut HashMap<String, Val>, device: &str) -> Result<()> {
    let target = node.target.as_str();
    if CHECKS.contains(&target) {
        return Ok(());
    }
    if is_symbolic(target) {
        let args = node
            .inputs
            .iter()
            .map(|a| python_value(env, &a.arg))
            .collect::<Result<Vec<_>>>()?;
        let v = symbolic(target, &args)?;
        if let Some(out) = node.outputs.first() {
            match (out, v) {
                (Argument::AsTensor(t), v) => {
                    env.insert(t.name.clone(), v);
                }
                (a, v) => {
                    for n in names(a) {
                        env.insert(n.to_string(), v.clone());
                    }
                }
            }
        }
        return Ok(());
    }
    if target == "torch.ops.higher_order.wrap_with_set_grad_enabled" {
        return set_grad_region(node, env, device);
    }
    if target == "torch.ops.higher_order.wrap_with_autocast" {
        return autocast_off_region(node, env, device);
    }
    let op = target
        .strip_prefix("torch.ops.")
        .ok_or_else(|| Error::Native(format!("{target} is not read")))?;
    let mut parts = op.splitn(3, '.');
    let (ns, name, overload) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("default"),
    );
    let qualified = format!("{ns}::{name}");
    let overload = if overload == "default" { "" } else { overload };
    let module = module_path(node);
    let returned = {
        let args = node
            .inputs
            .iter()
            .map(|a| Ok((a.name.as_str(), op_arg(env, &a.arg, device)?)))
            .collect::<Result<Vec<_>>>()?;
        match ffi::program_call(&qualified, overload, &module, &args) {
            // torch.export drops a `.contiguous()` that was a no-op where the program was
            // exported (`x.permute(...).contiguous().view(...)`); where the tensor is laid
            // out otherwise (a CUDA kernel's output), eager code copies there: so does
            // the run, with the reshape the view came from.
            Err(Error::Native(m))
                if qualified == "aten::view" && m.contains("view size is not compatible") =>
            {
                let renamed: Vec<(&str, Arg<'_>)> = args
                    .iter()
                    .map(|(n, a)| (if *n == "size" { "shape" } else { *n }, a.clone()))
                    .collect();
                ffi::program_call("aten::reshape", "", &module, &renamed)?
            }
            other => other?,
        }
    };
    let outs = &node.outputs;
    if outs.len() == returned.len() {
        for (o, r) in outs.iter().zip(returned) {
            bind(env, o, r)?;
        }
    } else if let ([Argument::AsTensors(ts)], true) = (outs.as_slice(), returned.len() > 1) {
        // A tuple of tensors serialized as one list.
        for (t, r) in ts.iter().zip(returned) {
            bind(
                env,
                &Argument::AsTensor(super::schema::TensorArgument {
                    name: t.name.clone(),
                }),
                r,
            )?;
        }
    } else if let (1, Some(Returned::List(_))) = (returned.len(), returned.first()) {
        let Some(Returned::List(items)) = returned.into_iter().next() else {
            unreachable!()
        };
        for (o, r) in outs.iter().zip(items) {
            bind(env, o, r)?;
        }
    } else {
        return Err(Error::Native(format!(
            "the op returned {} values for {} outputs",
            returned.len(),
            outs.len()
        )));
    }
    Ok(())
}

/// `wrap_with_set_grad_enabled(enabled, body, *operands)`: the body's graph under that
/// grad mode.
fn set_grad_region(node: &Node, env: &mut HashMap<String, Val>, device: &str) -> Result<()> {
    let enabled = match node.inputs.first().map(|a| &a.arg) {
        Some(Argument::AsBool(b)) => *b,
        _ => {
            return Err(Error::Native(
                "wrap_with_set_grad_enabled without its flag".into(),
            ))
        }
    };
    region(node, env, device, 1, Some(enabled))
}

/// `wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)`
/// with `enabled` false (the program checks at opening that it is): a region that
/// keeps its ops out of autocast, such as rotary embeddings computed in f32. Its body
/// runs as its surroundings do: in an estimate under autocast, its few small ops are
/// cast as the rest (not modelled: they stay f32 on a GPU).
fn autocast_off_region(node: &Node, env: &mut HashMap<String, Val>, device: &str) -> Result<()> {
    region(node, env, device, 4, None)
}

/// A higher-order node's body (its input at `body`, the operands after it), under
/// the grad mode `grad` (None: the surrounding one).
fn region(
    node: &Node,
    env: &mut HashMap<String, Val>,
    device: &str,
    body: usize,
    grad: Option<bool>,
) -> Result<()> {
    let graph = match node.inputs.get(body).map(|a| &a.arg) {
        Some(Argument::AsGraph(g)) => &g.graph,
        _ => return Err(Error::Native(format!("{} without its body", node.target))),
    };
    let mut inner: HashMap<String, Val> = HashMap::new();
    for (param, a) in graph.inputs.iter().zip(&node.inputs[body + 1..]) {
        let v = python_value(env, &a.arg)?;
        for n in names(param) {
            inner.insert(n.to_string(), v.clone());
        }
    }
    let keep: HashSet<&str> = graph.outputs.iter().flat_map(names).collect();
    let run = |inner: &mut HashMap<String, Val>| run_graph(graph, inner, &keep, device);
    match grad {
        Some(true) => tch::with_grad(|| run(&mut inner))?,
        Some(false) => tch::no_grad(|| run(&mut inner))?,
        None => run(&mut inner)?,
    }
    let results: Vec<Val> = graph
        .outputs
        .iter()
        .map(|o| match names(o).first() {
            Some(n) => inner.get(*n).cloned().unwrap_or(Val::None),
            None => Val::None,
        })
        .collect();
    let outs = &node.outputs;
    if let ([Argument::AsTensors(ts)], true) = (outs.as_slice(), results.len() != 1) {
        for (t, v) in ts.iter().zip(results) {
            env.insert(t.name.clone(), v);
        }
    } else {
        for (o, v) in outs.iter().zip(results) {
            for n in names(o) {
                env.insert(n.to_string(), v.clone());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_read_as_named_modules_names_them() {
        assert_eq!(clean_path("layer1.0.conv1"), "layer1.0.conv1");
        assert_eq!(
            clean_path("L['self'].layers.slice(None, 2, None).0.mlp"),
            "layers.0.mlp"
        );
        assert_eq!(clean_path("model.layers.0@1"), "model.layers.0");
        assert_eq!(clean_path(""), "");
        let node = |stack: &str| Node {
            target: String::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            metadata: [("nn_module_stack".to_string(), stack.to_string())].into(),
            name: None,
        };
        assert_eq!(
            module_path(&node(
                "L__self__,,m.Model;L__self___layers_0,L['self'].layers.slice(None, 2, None).0,m.Block"
            )),
            "layers.0"
        );
        assert_eq!(
            module_path(&node("L__self__,,m.M;L__self__fc,fc,torch.nn.Linear")),
            "fc"
        );
    }
}
