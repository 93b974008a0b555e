//! Exported programs: the `.pt2` files `torch.export.save` writes, read without Python.
//!
//! The archive is a zip with one root folder: `archive_format` ("pt2"),
//! `archive_version`, `models/model.json` (the program in torch.export's serialization
//! schema), `data/weights/` and `data/constants/` (each tensor's raw storage bytes, and a
//! config naming them). The graph is run node by node ([`run`]): each aten node through
//! libtorch's dispatcher, with its arguments matched to the op's schema by name, so
//! autograd, the dry run's meta kernels and the op recorders see every op as they see an
//! eager call. Weights come as meta tensors from their metadata (never read) for an
//! estimate, or read for real for a profile.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use crate::error::{Error, Result};

mod dtypes;
mod run;
mod schema;
mod symbolic;
mod weights;

use dtypes::c10_layout;
pub(crate) use dtypes::kind_of;
use weights::contiguous_strides;
pub(crate) use weights::{add_to_var_store, Weight, WeightKind};

use schema::{Argument, ExportedProgram, Graph, InputSpec, OutputSpec, PayloadConfig, SymInt};

/// The serialization schema's major version this reader reads (torch 2.11 to 2.13 write 8).
const SCHEMA_MAJOR: i64 = 8;
/// The archive versions this reader reads (`archive_version`).
const ARCHIVE_VERSIONS: [&str; 1] = ["0"];

/// A user input the program takes: its graph name and its exported sizes (a symbol's
/// name for a dynamic dimension).
#[derive(Debug, Clone)]
struct UserInput {
    name: String,
    kind: Kind,
    sizes: Vec<Dim>,
}

#[derive(Debug, Clone)]
enum Dim {
    Fixed(i64),
    /// A dynamic dimension: its symbol (`s77`), whose range constraint holds it.
    Symbol(String),
    /// A size computed from symbols (`2*s77`): checked by the sizes it comes from.
    Derived(String),
}

/// A dimension from its serialized form: an int, a symbol written as sympy's `srepr`
/// (`Symbol('s77', positive=True, integer=True)`) or as its name, or an expression.
fn dim_of(s: &SymInt) -> Dim {
    let expr = match s {
        SymInt::AsInt(n) => return Dim::Fixed(*n),
        SymInt::AsExpr(e) => e.expr_str.trim(),
    };
    if let Some(rest) = expr.strip_prefix("Symbol('") {
        if let Some((name, _)) = rest.split_once('\'') {
            return Dim::Symbol(name.to_string());
        }
    }
    if !expr.is_empty() && expr.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Dim::Symbol(expr.to_string());
    }
    Dim::Derived(expr.to_string())
}

/// An exported program, read and checked, ready to run.
pub(crate) struct Program {
    path: PathBuf,
    graph: Graph,
    weights: Vec<Weight>,
    /// Graph inputs bound to constants of the signature (`constant_input`).
    constant_inputs: HashMap<String, symbolic::Val>,
    user_inputs: Vec<UserInput>,
    /// The first user output's graph value.
    output: String,
    ranges: HashMap<String, (Option<i64>, Option<i64>)>,
    /// Every parameter was saved with `requires_grad=False` (a program exported for
    /// inference): they are all read as parameters that train, and this says so.
    all_frozen: bool,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("path", &self.path)
            .field("nodes", &self.graph.nodes.len())
            .finish_non_exhaustive()
    }
}

/// Whether `path` is a torch.export archive (a zip whose root folder holds
/// `archive_format` reading "pt2"), as opposed to a TorchScript file (also a zip).
/// Why `path` cannot be a TorchScript file, told by its contents (what
/// [`is_program`] is not): missing; not a zip archive (both formats are); a zip
/// archive with neither an exported program's `archive_format` nor TorchScript's
/// `code/` folder. None: it may load as TorchScript. The reason says which file was
/// expected: an exported program when the name ends in `.pt2`.
pub(crate) fn not_torchscript(path: &Path) -> Option<String> {
    let expected = if path.extension().is_some_and(|e| e == "pt2") {
        "an exported program (torch.export.save)"
    } else {
        "a model file: an exported program (.pt2, torch.export.save) or a TorchScript file \
         (torch.jit.save)"
    };
    let Ok(file) = File::open(path) else {
        return Some(if path.exists() {
            format!("cannot be read (expected {expected})")
        } else {
            format!("no such file (expected {expected})")
        });
    };
    let Ok(zip) = zip::ZipArchive::new(file) else {
        return Some(format!(
            "not a model file: exported programs and TorchScript files are zip archives, \
             this is not one (expected {expected})"
        ));
    };
    let torchscript = zip.file_names().any(|n| {
        n.split('/')
            .nth(1)
            .is_some_and(|d| d == "code" || d == "constants.pkl")
    });
    (!torchscript).then(|| {
        format!(
            "a zip archive, but neither an exported program (no archive_format) nor a \
             TorchScript file (no code/ folder) (expected {expected})"
        )
    })
}

pub(crate) fn is_program(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let Ok(mut zip) = zip::ZipArchive::new(file) else {
        return false;
    };
    let Some(root) = root_folder(&mut zip) else {
        return false;
    };
    read_text(&mut zip, &format!("{root}archive_format")).is_ok_and(|f| f.trim() == "pt2")
}

fn root_folder(zip: &mut zip::ZipArchive<File>) -> Option<String> {
    let first = zip.file_names().next()?.to_string();
    let (root, _) = first.split_once('/')?;
    Some(format!("{root}/"))
}

fn read_bytes(zip: &mut zip::ZipArchive<File>, name: &str) -> std::result::Result<Vec<u8>, String> {
    let mut f = zip
        .by_name(name)
        .map_err(|e| format!("no record {name} ({e})"))?;
    // The directory's size is a hint only (a damaged archive may claim any).
    let mut out = Vec::with_capacity((f.size() as usize).min(1 << 26));
    f.read_to_end(&mut out)
        .map_err(|e| format!("record {name} is unreadable ({e})"))?;
    Ok(out)
}

fn read_text(zip: &mut zip::ZipArchive<File>, name: &str) -> std::result::Result<String, String> {
    String::from_utf8(read_bytes(zip, name)?).map_err(|_| format!("record {name} is not UTF-8"))
}

impl Program {
    /// Reads and checks the program at `path`. A file that is not a torch.export
    /// archive, a damaged one, a version this reader does not know, or a program
    /// holding what it does not run (control flow, custom ops, script objects) is
    /// refused in one line.
    pub(crate) fn open(path: &Path) -> Result<Program> {
        let fail = |reason: String| Error::ModelLoad {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(fail(
                "no such file (a program saved with torch.export.save)".into(),
            ));
        }
        let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| {
            fail(format!(
                "not a torch.export archive (not a readable zip: {e})"
            ))
        })?;
        let root = root_folder(&mut zip)
            .ok_or_else(|| fail("not a torch.export archive (no root folder)".into()))?;
        let format = read_text(&mut zip, &format!("{root}archive_format"))
            .map_err(|e| fail(format!("not a torch.export archive ({e})")))?;
        if format.trim() != "pt2" {
            return Err(fail(format!(
                "archive format {:?}, where a torch.export program has \"pt2\"",
                format.trim()
            )));
        }
        let version = read_text(&mut zip, &format!("{root}archive_version")).map_err(&fail)?;
        if !ARCHIVE_VERSIONS.contains(&version.trim()) {
            return Err(fail(format!(
                "archive version {:?}, which this reader does not know (it reads {})",
                version.trim(),
                ARCHIVE_VERSIONS.join(", ")
            )));
        }
        let json = read_bytes(&mut zip, &format!("{root}models/model.json")).map_err(|e| {
            fail(format!(
                "{e}: an archive of AOTInductor packages or of several models is not read"
            ))
        })?;
        let ep: ExportedProgram = serde_json::from_slice(&json)
            .map_err(|e| fail(format!("models/model.json does not parse: {e}")))?;
        if ep.schema_version.major != SCHEMA_MAJOR {
            return Err(fail(format!(
                "serialization schema {}.{} (torch {}), where this reader reads {SCHEMA_MAJOR}.x",
                ep.schema_version.major, ep.schema_version.minor, ep.torch_version
            )));
        }
        // Each tensor's record, the record's bytes (from the zip's directory: nothing is
        // read) and the tensor's metadata.
        let mut payloads: HashMap<String, (String, u64, schema::TensorMeta)> = HashMap::new();
        for (folder, config) in [
            ("weights", "model_weights_config.json"),
            ("constants", "model_constants_config.json"),
        ] {
            let name = format!("{root}data/{folder}/{config}");
            if zip.by_name(&name).is_err() {
                continue;
            }
            let text = read_bytes(&mut zip, &name).map_err(&fail)?;
            let cfg: PayloadConfig = serde_json::from_slice(&text)
                .map_err(|e| fail(format!("data/{folder}/{config} does not parse: {e}")))?;
            for (tensor, meta) in cfg.config {
                // No tensor metadata: a script object, which the signature refuses.
                let Some(tensor_meta) = meta.tensor_meta else {
                    continue;
                };
                if meta.use_pickle {
                    return Err(fail(format!(
                        "{tensor} is stored pickled (a tensor subclass), which is not read"
                    )));
                }
                let record = format!("{root}data/{folder}/{}", meta.path_name);
                let bytes = zip
                    .by_name(&record)
                    .map_err(|e| fail(format!("no record {record} for {tensor} ({e})")))?
                    .size();
                payloads.insert(tensor, (record, bytes, tensor_meta));
            }
        }
        let graph_module = ep.graph_module;
        let graph = graph_module.graph;
        refuse_unread(&graph).map_err(&fail)?;
        let tensor_meta = |input: &str| graph.tensor_values.get(input).cloned();
        let mut weights = Vec::new();
        let mut user_inputs = Vec::new();
        let mut constant_inputs = HashMap::new();
        let graph_inputs: Vec<String> = graph
            .inputs
            .iter()
            .map(|a| match a {
                Argument::AsTensor(t) => t.name.clone(),
                _ => String::new(),
            })
            .collect();
        for (k, spec) in graph_module.signature.input_specs.iter().enumerate() {
            let (name, kind, input) = match spec {
                InputSpec::Parameter(p) => (&p.parameter_name, WeightKind::Parameter, &p.arg.name),
                InputSpec::Buffer(b) => (&b.buffer_name, WeightKind::Buffer, &b.arg.name),
                InputSpec::TensorConstant(c) => {
                    (&c.tensor_constant_name, WeightKind::Constant, &c.arg.name)
                }
                InputSpec::UserInput(u) => {
                    let Argument::AsTensor(t) = &u.arg else {
                        return Err(fail(format!(
                            "user input {k} is not a tensor; only tensor inputs are given"
                        )));
                    };
                    let meta = tensor_meta(&t.name)
                        .ok_or_else(|| fail(format!("user input {} has no metadata", t.name)))?;
                    user_inputs.push(UserInput {
                        name: t.name.clone(),
                        kind: kind_of(meta.dtype).ok_or_else(|| {
                            fail(format!("user input {} has dtype {}", t.name, meta.dtype))
                        })?,
                        sizes: meta.sizes.iter().map(dim_of).collect(),
                    });
                    continue;
                }
                InputSpec::ConstantInput(c) => {
                    let v = match &c.value {
                        schema::ConstantValue::AsNone(_) => symbolic::Val::None,
                        schema::ConstantValue::AsInt(i) => symbolic::Val::Int(*i),
                        schema::ConstantValue::AsFloat(f) => symbolic::Val::Float(f.0),
                        schema::ConstantValue::AsBool(b) => symbolic::Val::Bool(*b),
                        schema::ConstantValue::AsString(_) => {
                            return Err(fail(format!(
                                "input {} is a string constant, which is not read",
                                c.name
                            )))
                        }
                    };
                    let input = graph_inputs.get(k).cloned().unwrap_or_default();
                    constant_inputs.insert(
                        if input.is_empty() {
                            c.name.clone()
                        } else {
                            input
                        },
                        v,
                    );
                    continue;
                }
                InputSpec::CustomObj(_) => {
                    return Err(fail(
                        "the program takes a script object (a TorchBind class), which is not read"
                            .into(),
                    ))
                }
                InputSpec::Token(_) => return Err(fail(
                    "the program threads effect tokens (ops with side effects), which are not read"
                        .into(),
                )),
            };
            let (record, meta) = match payloads.get(name) {
                Some((record, bytes, meta)) => (Some((record.clone(), *bytes)), meta.clone()),
                None => (
                    None,
                    tensor_meta(input)
                        .ok_or_else(|| fail(format!("{name} has neither a record nor metadata")))?,
                ),
            };
            if c10_layout(meta.layout).is_none() {
                return Err(fail(format!(
                    "{name} has a sparse layout, which is not read"
                )));
            }
            let fixed = |xs: &[SymInt]| {
                xs.iter()
                    .map(|s| match s {
                        SymInt::AsInt(n) => Ok(*n),
                        SymInt::AsExpr(e) => Err(fail(format!(
                            "{name} has a symbolic size {}, which a weight cannot have",
                            e.expr_str
                        ))),
                    })
                    .collect::<Result<Vec<i64>>>()
            };
            let sizes = fixed(&meta.sizes)?;
            let strides = fixed(&meta.strides)?;
            let offset = fixed(meta.storage_offset.as_slice())?
                .first()
                .copied()
                .unwrap_or(0);
            // The extent the tensor views must lie in its record (a record cut short is
            // a damaged archive; the estimate never reads it, so this is checked here).
            if let Some((record, bytes)) = &record {
                let elem = kind_of(meta.dtype).map_or(1, |k| k.elt_size_in_bytes() as i64);
                let span = sizes.iter().zip(&strides).try_fold(offset, |a, (&n, &st)| {
                    a.checked_add(n.checked_sub(1)?.checked_mul(st)?)
                });
                let needed = span.and_then(|s| s.checked_add(1)?.checked_mul(elem));
                let empty = sizes.contains(&0);
                if !empty
                    && strides.len() == sizes.len()
                    && !needed.is_some_and(|n| n <= *bytes as i64)
                {
                    let record = record.rsplit('/').next().unwrap_or(record);
                    return Err(fail(format!(
                        "{name}: its record {record} holds {bytes} B, fewer than its sizes {sizes:?} need (a damaged archive)"
                    )));
                }
            }
            // Frozen as its archive record says (the weights config's metadata; a graph
            // placeholder's is not taken for it).
            let kind = match (kind, meta.requires_grad, &record) {
                (WeightKind::Parameter, Some(false), Some(_)) => WeightKind::FrozenParameter,
                _ => kind,
            };
            weights.push(Weight {
                name: name.clone(),
                kind,
                input: input.clone(),
                record: record.as_ref().map(|(r, _)| r.clone()),
                record_bytes: record.map_or(0, |(_, b)| b),
                kind_dtype: kind_of(meta.dtype)
                    .ok_or_else(|| fail(format!("{name} has dtype {}", meta.dtype)))?,
                strides: if strides.len() == sizes.len() {
                    strides
                } else {
                    contiguous_strides(&sizes)
                },
                offset,
                sizes,
            });
        }
        let output = graph_module
            .signature
            .output_specs
            .iter()
            .find_map(|o| match o {
                OutputSpec::UserOutput(u) => match &u.arg {
                    Argument::AsTensor(t) => Some(t.name.clone()),
                    _ => None,
                },
                _ => None,
            })
            .ok_or_else(|| fail("the program returns no tensor".into()))?;
        let ranges = ep
            .range_constraints
            .into_iter()
            .map(|(s, r)| (s, (r.min_val, r.max_val)))
            .collect();
        // Nothing trains: a program exported for inference (its parameters frozen for
        // it). A training estimate of it trains them all, as before the archives'
        // requires_grad was read; the estimate says so.
        let all_frozen = weights
            .iter()
            .any(|w| w.kind == WeightKind::FrozenParameter)
            && !weights.iter().any(|w| w.kind == WeightKind::Parameter);
        if all_frozen {
            for w in &mut weights {
                if w.kind == WeightKind::FrozenParameter {
                    w.kind = WeightKind::Parameter;
                }
            }
        }
        Ok(Program {
            path: path.to_path_buf(),
            graph,
            weights,
            constant_inputs,
            user_inputs,
            output,
            ranges,
            all_frozen,
        })
    }

    /// Every parameter was saved with `requires_grad=False`, and all are read as
    /// parameters that train (a training estimate of a program exported for inference).
    pub(crate) fn all_frozen(&self) -> bool {
        self.all_frozen
    }

    /// The program's weights: parameters, buffers and tensor constants, in the order of
    /// its signature (the order torch.export lifted them, the module's).
    pub(crate) fn weights(&self) -> &[Weight] {
        &self.weights
    }

    /// The kinds of the user inputs, in order.
    pub(crate) fn input_kinds(&self) -> Vec<Kind> {
        self.user_inputs.iter().map(|u| u.kind).collect()
    }

    /// The sizes the program was exported at, a dynamic dimension as None (its size is
    /// the caller's to give).
    pub(crate) fn exported_sizes(&self) -> Vec<Vec<Option<i64>>> {
        self.user_inputs
            .iter()
            .map(|u| {
                u.sizes
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => Some(*n),
                        Dim::Symbol(_) | Dim::Derived(_) => None,
                    })
                    .collect()
            })
            .collect()
    }

    /// Checks the user's input sizes against the program's: a static dimension must be
    /// its exported size, a dynamic one within its range constraint (the graph itself
    /// checks neither).
    pub(crate) fn check_inputs(&self, shapes: &[Vec<i64>]) -> Result<()> {
        let invalid = |value: String, reason: String| Error::InvalidInput {
            name: "input",
            value,
            reason,
        };
        let show = |s: &[i64]| {
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        };
        if shapes.len() != self.user_inputs.len() {
            return Err(invalid(
                shapes.iter().map(|s| show(s)).collect::<Vec<_>>().join(","),
                format!(
                    "the program takes {} input(s), {} given",
                    self.user_inputs.len(),
                    shapes.len()
                ),
            ));
        }
        let mut bound: HashMap<&str, i64> = HashMap::new();
        for (u, shape) in self.user_inputs.iter().zip(shapes) {
            let exported = u
                .sizes
                .iter()
                .map(|d| match d {
                    Dim::Fixed(n) => n.to_string(),
                    Dim::Symbol(s) | Dim::Derived(s) => s.clone(),
                })
                .collect::<Vec<_>>()
                .join("x");
            if shape.len() != u.sizes.len() {
                return Err(invalid(
                    show(shape),
                    format!(
                        "input {} was exported with {} dimensions ({exported})",
                        u.name,
                        u.sizes.len()
                    ),
                ));
            }
            for (d, (dim, &n)) in u.sizes.iter().zip(shape).enumerate() {
                match dim {
                    Dim::Fixed(m) if *m != n => {
                        return Err(invalid(
                            show(shape),
                            format!(
                                "the program was exported with static sizes {exported}: dimension {d} of input {} must be {m} (export it with dynamic_shapes to estimate other sizes)",
                                u.name
                            ),
                        ))
                    }
                    Dim::Fixed(_) | Dim::Derived(_) => {}
                    Dim::Symbol(s) => {
                        if let Some(&(lo, hi)) = self.ranges.get(s) {
                            if lo.is_some_and(|lo| n < lo) || hi.is_some_and(|hi| n > hi) {
                                return Err(invalid(
                                    show(shape),
                                    format!(
                                        "dimension {d} of input {} ({s}) must be within {}..={} (the program's range constraint)",
                                        u.name,
                                        lo.map_or("-inf".into(), |v| v.to_string()),
                                        hi.map_or("inf".into(), |v| v.to_string())
                                    ),
                                ));
                            }
                        }
                        if let Some(prev) = bound.insert(s.as_str(), n) {
                            if prev != n {
                                return Err(invalid(
                                    show(shape),
                                    format!(
                                        "dimension {d} of input {} is {s}, which another dimension gives as {prev}",
                                        u.name
                                    ),
                                ));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The range of the first input's first size (the batch) the program takes: its
    /// exported size for a static program, its range constraint for a dynamic one.
    pub(crate) fn batch_range(&self) -> Option<(i64, i64)> {
        match self.user_inputs.first()?.sizes.first()? {
            Dim::Fixed(n) => Some((*n, *n)),
            Dim::Symbol(s) => {
                let (lo, hi) = self.ranges.get(s).copied().unwrap_or((None, None));
                Some((lo.unwrap_or(1).max(1), hi.unwrap_or(i64::MAX)))
            }
            Dim::Derived(_) => None,
        }
    }

    /// Runs the program's graph on `weights` (as [`Program::load_weights`] gave them)
    /// and the user's `inputs`, making what it makes on `device` ("meta" or "cpu"):
    /// its first user output.
    pub(crate) fn forward(
        &self,
        weights: &[Tensor],
        inputs: &[Tensor],
        device: &str,
    ) -> Result<Tensor> {
        let mut env: HashMap<String, symbolic::Val> = HashMap::new();
        for (w, t) in self.weights.iter().zip(weights) {
            env.insert(w.input.clone(), symbolic::Val::Tensor(t.shallow_clone()));
        }
        for (u, t) in self.user_inputs.iter().zip(inputs) {
            env.insert(u.name.clone(), symbolic::Val::Tensor(t.shallow_clone()));
        }
        for (k, v) in &self.constant_inputs {
            env.insert(k.clone(), v.clone());
        }
        let keep: HashSet<&str> = [self.output.as_str()].into_iter().collect();
        run::run_graph(&self.graph, &mut env, &keep, device)?;
        match env.remove(&self.output) {
            Some(symbolic::Val::Tensor(t)) => Ok(t),
            _ => Err(Error::Native(format!(
                "the program's output {} is not a tensor",
                self.output
            ))),
        }
    }
}

/// Refuses, in one line, what the reader does not run: control flow, custom ops,
/// autocast regions, script objects.
fn refuse_unread(graph: &Graph) -> std::result::Result<(), String> {
    for node in &graph.nodes {
        let t = node.target.as_str();
        let name = node.name.as_deref().unwrap_or("?");
        if let Some(hop) = t.strip_prefix("torch.ops.higher_order.") {
            match hop {
                "wrap_with_set_grad_enabled" => {}
                "wrap_with_autocast" => {
                    if !matches!(node.inputs.get(2).map(|a| &a.arg), Some(Argument::AsBool(false))) {
                        return Err(format!(
                            "the program turns autocast on inside its forward (torch.autocast, node {name}), which is not read: export it without and estimate with --autocast"
                        ));
                    }
                }
                "cond" | "while_loop" | "scan" | "map_impl" | "associative_scan" => {
                    return Err(format!(
                        "node {name} is control flow (torch.{hop}), which is not read: the dry run runs one path of a graph without data"
                    ))
                }
                other => {
                    return Err(format!(
                        "node {name} calls the higher-order op {other}, which is not read"
                    ))
                }
            }
        } else if let Some(op) = t.strip_prefix("torch.ops.") {
            let mut parts = op.split('.');
            let (ns, op_name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if ns != "aten" {
                return Err(format!(
                    "node {name} calls the custom op {ns}::{op_name}, which is not read (only aten ops are)"
                ));
            }
        } else if !symbolic::is_symbolic(t) {
            return Err(format!("node {name} calls {t}, which is not read"));
        }
        for a in &node.inputs {
            match &a.arg {
                Argument::AsGraph(g) => refuse_unread(&g.graph)?,
                Argument::AsCustomObj(c) => {
                    return Err(format!(
                        "node {name} takes a script object ({}), which is not read",
                        c.class_fqn
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(())
}
