//! The parts of torch.export's serialization schema (`torch/_export/serde/schema.py`,
//! major version 8) that an exported program is run from. Unions are JSON objects with
//! one key (`{"as_tensor": {"name": "x"}}`): externally tagged enums here. Fields the
//! reader does not use are skipped.

// The variants are named after the schema's own fields (`as_tensor`), which serde maps.
#![allow(clippy::enum_variant_names)]

use std::collections::HashMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

/// A float as the serializer writes it: a number, or "Infinity", "-Infinity", "NaN"
/// (JSON has no literal for them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Float(pub f64);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Float, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(f) => Ok(Float(f)),
            Raw::Text(t) => match t.as_str() {
                "Infinity" | "inf" => Ok(Float(f64::INFINITY)),
                "-Infinity" | "-inf" => Ok(Float(f64::NEG_INFINITY)),
                "NaN" | "nan" => Ok(Float(f64::NAN)),
                other => Err(serde::de::Error::custom(format!(
                    "{other:?} is not a float"
                ))),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ExportedProgram {
    pub graph_module: GraphModule,
    #[serde(default)]
    pub range_constraints: HashMap<String, RangeConstraint>,
    pub schema_version: SchemaVersion,
    #[serde(default)]
    pub torch_version: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct SchemaVersion {
    pub major: i64,
    pub minor: i64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RangeConstraint {
    pub min_val: Option<i64>,
    pub max_val: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct GraphModule {
    pub graph: Graph,
    pub signature: GraphSignature,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Graph {
    pub inputs: Vec<Argument>,
    pub outputs: Vec<Argument>,
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub tensor_values: HashMap<String, TensorMeta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Node {
    pub target: String,
    pub inputs: Vec<NamedArgument>,
    pub outputs: Vec<Argument>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct NamedArgument {
    pub name: String,
    pub arg: Argument,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TensorArgument {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SymArgument<T> {
    AsName(String),
    #[serde(alias = "as_float", alias = "as_bool")]
    AsInt(T),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OptionalTensorArgument {
    AsTensor(TensorArgument),
    AsNone(IgnoredAny),
}

#[derive(Debug, Deserialize)]
pub(crate) struct GraphArgument {
    pub graph: Box<Graph>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CustomObjArgument {
    pub class_fqn: String,
}

/// One argument or output of a node.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Argument {
    AsNone(IgnoredAny),
    AsTensor(TensorArgument),
    AsTensors(Vec<TensorArgument>),
    AsInt(i64),
    AsInts(Vec<i64>),
    AsFloat(Float),
    AsFloats(Vec<Float>),
    AsString(String),
    AsStrings(IgnoredAny),
    AsSymInt(SymArgument<i64>),
    AsSymInts(Vec<SymArgument<i64>>),
    AsScalarType(i32),
    AsMemoryFormat(i32),
    AsLayout(i32),
    AsDevice(IgnoredAny),
    AsBool(bool),
    AsBools(Vec<bool>),
    AsSymBool(SymArgument<bool>),
    AsSymBools(Vec<SymArgument<bool>>),
    AsGraph(GraphArgument),
    AsOptionalTensors(Vec<OptionalTensorArgument>),
    AsCustomObj(CustomObjArgument),
    AsOperator(IgnoredAny),
    AsSymFloat(SymArgument<Float>),
    AsSymFloats(Vec<SymArgument<Float>>),
    AsOptionalTensor(OptionalTensorArgument),
    AsComplex(IgnoredAny),
    AsNestedTensors(IgnoredAny),
    AsIntLists(IgnoredAny),
    AsStringToArgument(IgnoredAny),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SymInt {
    AsExpr(SymExpr),
    AsInt(i64),
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SymExpr {
    pub expr_str: String,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TensorMeta {
    pub dtype: i32,
    pub sizes: Vec<SymInt>,
    #[serde(default)]
    pub strides: Vec<SymInt>,
    #[serde(default)]
    pub storage_offset: Option<SymInt>,
    pub layout: i32,
    /// Whether the tensor requires grad: a parameter saved with `False` is frozen (a
    /// fine-tune's base weights). Absent in some records: a parameter then trains.
    #[serde(default)]
    pub requires_grad: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct GraphSignature {
    pub input_specs: Vec<InputSpec>,
    pub output_specs: Vec<OutputSpec>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct UserInputSpec {
    pub arg: Argument,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ParameterSpec {
    pub arg: TensorArgument,
    pub parameter_name: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct BufferSpec {
    pub arg: TensorArgument,
    pub buffer_name: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TensorConstantSpec {
    pub arg: TensorArgument,
    pub tensor_constant_name: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ConstantInputSpec {
    pub name: String,
    pub value: ConstantValue,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ConstantValue {
    AsNone(IgnoredAny),
    AsInt(i64),
    AsFloat(Float),
    AsString(IgnoredAny),
    AsBool(bool),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum InputSpec {
    UserInput(UserInputSpec),
    Parameter(ParameterSpec),
    Buffer(BufferSpec),
    TensorConstant(TensorConstantSpec),
    CustomObj(IgnoredAny),
    Token(IgnoredAny),
    ConstantInput(ConstantInputSpec),
}

#[derive(Debug, Deserialize)]
pub(crate) struct UserOutputSpec {
    pub arg: Argument,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OutputSpec {
    UserOutput(UserOutputSpec),
    LossOutput(IgnoredAny),
    BufferMutation(IgnoredAny),
    GradientToParameter(IgnoredAny),
    GradientToUserInput(IgnoredAny),
    UserInputMutation(IgnoredAny),
    Token(IgnoredAny),
    ParameterMutation(IgnoredAny),
}

/// `data/weights/model_weights_config.json` and `data/constants/model_constants_config.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct PayloadConfig {
    pub config: HashMap<String, PayloadMeta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct PayloadMeta {
    pub path_name: String,
    #[serde(default)]
    pub use_pickle: bool,
    /// None for a script object (the signature refuses it).
    #[serde(default)]
    pub tensor_meta: Option<TensorMeta>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(json: &str) -> f64 {
        match serde_json::from_str::<Argument>(&format!(r#"{{"as_float": {json}}}"#)).unwrap() {
            Argument::AsFloat(Float(f)) => f,
            other => panic!("{json}: read as {other:?}"),
        }
    }

    fn int(json: &str) -> i64 {
        match serde_json::from_str::<Argument>(&format!(r#"{{"as_int": {json}}}"#)).unwrap() {
            Argument::AsInt(i) => i,
            other => panic!("{json}: read as {other:?}"),
        }
    }

    /// The numbers an exported program holds are the numbers written, to the bit. The
    /// texts are what `torch.export.save` writes (Python's `repr` of a float) for the
    /// values that sit on the edges; the expected values come from Rust's own constants
    /// and IEEE arithmetic, not from the parser under test.
    #[test]
    fn edge_values_read_from_a_program_are_exact() {
        // torch.finfo(torch.float32).min/max: the mask value of transformers' encoders.
        // One unit in the last place off, and libtorch refuses to make a float of it.
        assert_eq!(
            float("-3.4028234663852886e+38").to_bits(),
            (f32::MIN as f64).to_bits()
        );
        assert_eq!(
            float("3.4028234663852886e+38").to_bits(),
            (f32::MAX as f64).to_bits()
        );
        assert_eq!((float("-3.4028234663852886e+38") as f32), f32::MIN);
        // torch.finfo(torch.bfloat16).min: (2 - 2^-7) * 2^127.
        assert_eq!(
            float("-3.3895313892515355e+38"),
            -(2.0 - 2f64.powi(-7)) * 2f64.powi(127)
        );
        // torch.finfo(torch.float16).min and the smallest float16 subnormal.
        assert_eq!(float("-65504.0"), -65504.0);
        assert_eq!(float("5.960464477539063e-08"), 2f64.powi(-24));
        // float64's own edges: the largest finite and the smallest subnormal.
        assert_eq!(float("1.7976931348623157e+308"), f64::MAX);
        assert_eq!(float("5e-324").to_bits(), 1);
        assert_eq!(float("0.1").to_bits(), 0x3fb999999999999a);
        assert_eq!(float("-0.0").to_bits(), (-0.0f64).to_bits());
        // Non-finite values, written as strings.
        assert_eq!(float(r#""-Infinity""#), f64::NEG_INFINITY);
        assert_eq!(float(r#""Infinity""#), f64::INFINITY);
        assert!(float(r#""NaN""#).is_nan());
        // Integers beyond 2^53 (which a float cannot hold) stay integers, exactly:
        // sys.maxsize is the end of an open slice.
        assert_eq!(int("9007199254740993"), (1i64 << 53) + 1);
        assert_eq!(int("9223372036854775807"), i64::MAX);
        assert_eq!(int("-9223372036854775808"), i64::MIN);
    }
}
