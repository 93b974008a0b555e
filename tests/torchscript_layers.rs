//! `tch-memprof profile --train` of TorchScript files traced by PyTorch: each op, its
//! activations and its FLOPs belong to the module that ran it, named as PyTorch's
//! `named_modules()` names it, and the parameters keep PyTorch's names. Every expected
//! name and number comes from PyTorch (module hooks, `named_parameters()`, the
//! convolutions' output shapes), none from the profiler.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The tracing and the bookkeeping, shared by the models: `MODEL` defines `make()` (the
/// model) and `example()` (its input). PyTorch runs one training step of the eager model
/// with a hook on every module and a dispatch mode that notes the innermost module of
/// each aten op, and prints as JSON: the modules that run ops themselves (the root
/// apart), each module's own parameter bytes, `named_parameters()`, each convolution's
/// forward FLOPs from its output shape (2 * Cin/groups * Cout * k * k * Hout * Wout * B)
/// and whether its input needs a gradient (and its element count), each linear layer's
/// forward FLOPs (2 * in * out per output row), and the input's bytes.
const BOOKKEEPING: &str = r#"
import json, sys, torch, torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
torch.manual_seed(0)
m = make().train()
x = example()
torch.jit.trace(m, x).save(sys.argv[1])
names = {mod: name for name, mod in m.named_modules()}
stack, running, convs, linears = [], set(), {}, {}
def pre(mod, args):
    stack.append(names[mod])
def post(mod, args, out):
    stack.pop()
    if isinstance(mod, nn.Conv2d):
        b, cout, h, w = out.shape
        k = mod.kernel_size[0] * mod.kernel_size[1]
        convs[names[mod]] = {
            "forward": 2 * (mod.in_channels // mod.groups) * cout * k * h * w * b,
            "input_grad": args[0].requires_grad,
            "input_numel": args[0].numel(),
        }
    if isinstance(mod, nn.Linear):
        linears[names[mod]] = 2 * out.numel() * mod.in_features
for mod in m.modules():
    mod.register_forward_pre_hook(pre)
    mod.register_forward_hook(post)
class Ops(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if stack:
            running.add(stack[-1])
        return func(*args, **(kwargs or {}))
with Ops():
    m(x)
own = {name: sum(p.numel() * p.element_size() for p in mod.parameters(recurse=False))
       for name, mod in m.named_modules()}
print(json.dumps({
    "running": sorted(n for n in running if n != ""),
    "own_param_bytes": own,
    "parameters": [n for n, _ in m.named_parameters()],
    "convs": convs,
    "linears": linears,
    "input_bytes": x.numel() * x.element_size(),
}))
"#;

/// A ResNet as torchvision writes it (BasicBlock, downsampling shortcut, one ReLU module
/// used twice per block, average pooling module, flatten in the root's forward), small.
const RESNET: &str = r#"
import torch, torch.nn as nn
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)
class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16, 1))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 10)
    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))
def make():
    return ResNet()
def example():
    return torch.randn(2, 3, 64, 64)
"#;

/// A BERT-style encoder as Hugging Face names its modules (`embeddings`,
/// `encoder.layer.N.attention.query`, `...intermediate.dense`, `...output.LayerNorm`),
/// attention written out (matmul, softmax), token ids in.
const ENCODER: &str = r#"
import math, torch, torch.nn as nn
H, HEADS, T, VOCAB = 32, 4, 16, 100
class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, H)
        self.position_embeddings = nn.Embedding(T, H)
        self.LayerNorm = nn.LayerNorm(H)
    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(pos))
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, HEADS, H // HEADS).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(H // HEADS)
        ctx = torch.matmul(scores.softmax(-1), v)
        return ctx.transpose(1, 2).reshape(b, t, H)
class Output(nn.Module):
    def __init__(self, cin):
        super().__init__()
        self.dense = nn.Linear(cin, H)
        self.LayerNorm = nn.LayerNorm(H)
    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)
class Intermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(H, 4 * H)
    def forward(self, x):
        return nn.functional.gelu(self.dense(x))
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.attention_output = Output(H)
        self.intermediate = Intermediate()
        self.output = Output(4 * H)
    def forward(self, x):
        a = self.attention_output(self.attention(x), x)
        return self.output(self.intermediate(a), a)
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([Layer() for _ in range(2)])
    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x
class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = Embeddings()
        self.encoder = Encoder()
    def forward(self, ids):
        return self.encoder(self.embeddings(ids))
def make():
    return Bert()
def example():
    return torch.zeros(2, T, dtype=torch.long)
"#;

/// What PyTorch says of the model (see [`BOOKKEEPING`]).
struct Truth {
    running: BTreeSet<String>,
    own_param_bytes: BTreeMap<String, u64>,
    parameters: BTreeSet<String>,
    convs: BTreeMap<String, (u64, bool, u64)>,
    linears: BTreeMap<String, u64>,
    input_bytes: u64,
}

/// Traces `model` into `dir/model.pt` with the torch wheel's Python; None (said) when
/// there is no such Python.
fn export(model: &str, dir: &Path) -> Option<Truth> {
    let Some(python) = common::torch_python() else {
        common::cannot_run(
            "the TorchScript export by PyTorch: no Python with torch beside LIBTORCH \
             (run through scripts/with-libtorch.sh)",
        );
        return None;
    };
    let out = Command::new(python)
        .args([
            "-c",
            &format!("{model}\n{BOOKKEEPING}"),
            dir.join("model.pt").to_str().unwrap(),
        ])
        .output()
        .expect("runs python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from python");
    let strings = |k: &str| -> BTreeSet<String> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    Some(Truth {
        running: strings("running"),
        parameters: strings("parameters"),
        own_param_bytes: v["own_param_bytes"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, b)| (k.clone(), b.as_u64().unwrap()))
            .collect(),
        convs: v["convs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, c)| {
                (
                    k.clone(),
                    (
                        c["forward"].as_u64().unwrap(),
                        c["input_grad"].as_bool().unwrap(),
                        c["input_numel"].as_u64().unwrap(),
                    ),
                )
            })
            .collect(),
        linears: v["linears"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, f)| (k.clone(), f.as_u64().unwrap()))
            .collect(),
        input_bytes: v["input_bytes"].as_u64().unwrap(),
    })
}

/// One row of `layers.csv`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Layer {
    parameters_bytes: u64,
    activation_bytes: u64,
    forward_flops: u64,
    backward_flops: u64,
}

/// Runs `tch-memprof profile --train` on `dir/model.pt`; its layers by name and the
/// parameter names of the run's parameters CSV.
fn profile(dir: &Path, input: &str) -> (BTreeMap<String, Layer>, BTreeSet<String>, String) {
    let results = dir.join("profile");
    common::cli_ok(&[
        "profile",
        dir.join("model.pt").to_str().unwrap(),
        "--input",
        input,
        "--train",
        "--output-dir",
        results.to_str().unwrap(),
    ]);
    let mut r = csv::Reader::from_path(results.join("layers.csv")).unwrap();
    let layers = r
        .records()
        .map(|row| {
            let row = row.unwrap();
            let n = |i: usize| row[i].parse::<u64>().unwrap();
            (
                row[0].to_string(),
                Layer {
                    parameters_bytes: n(1),
                    activation_bytes: n(2),
                    forward_flops: n(3),
                    backward_flops: n(4),
                },
            )
        })
        .collect();
    let params_csv = std::fs::read_dir(&results)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("_parameters.csv"))
        .expect("the run's parameters CSV");
    let mut r = csv::Reader::from_path(&params_csv).unwrap();
    let col = r
        .headers()
        .unwrap()
        .iter()
        .position(|c| c == "parameter")
        .unwrap();
    let names = r
        .records()
        .map(|row| row.unwrap()[col].to_string())
        .collect();
    let summary = std::fs::read_to_string(results.join("summary.txt")).unwrap();
    (layers, names, summary)
}

/// The summary's `FLOPs: forward F, backward B`.
fn summary_flops(summary: &str) -> (u64, u64) {
    let line = summary
        .lines()
        .find_map(|l| l.strip_prefix("FLOPs: forward "))
        .unwrap();
    let (f, b) = line.split_once(", backward ").unwrap();
    (f.parse().unwrap(), b.parse().unwrap())
}

#[test]
fn a_traced_resnet_is_profiled_by_module() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(truth) = export(RESNET, dir.path()) else {
        return;
    };
    let (layers, params, summary) = profile(dir.path(), "2x3x64x64");
    let missing = tch_memprof::MISSING;

    // The layers are the modules that run ops (the block-level residual additions in
    // `layer1.0` and so on, the ReLU modules, the pooling modules, every module with
    // parameters), plus `(none)`: what no submodule runs.
    let listed: BTreeSet<String> = layers.keys().filter(|l| *l != missing).cloned().collect();
    assert_eq!(listed, truth.running, "{layers:#?}");
    assert!(listed.contains("layer2.0.downsample.0"));
    assert!(listed.contains("layer1.1.conv2"));

    // Parameters keep PyTorch's names; each layer holds its module's own parameters.
    assert_eq!(params, truth.parameters);
    for (name, l) in &layers {
        let own = truth.own_param_bytes.get(name).copied().unwrap_or(0);
        assert_eq!(l.parameters_bytes, own, "{name}");
    }

    // Each convolution's FLOPs, by formula from its output shape: forward once,
    // backward once for the weight's gradient and once more for the input's when the
    // input needs one (not for the stem, whose input is the batch). Where the input
    // also feeds the residual branch, the engine adds the two gradients of the input
    // in the node that runs second: 1 FLOP per input element, in each block's conv1
    // (autograd runs the later forward op's node first).
    assert_eq!(truth.convs.len(), 10);
    let mut sums = Vec::new();
    for (name, &(forward, input_grad, input_numel)) in &truth.convs {
        let l = layers[name];
        assert_eq!(l.forward_flops, forward, "{name}");
        let backward = if input_grad { 2 * forward } else { forward };
        if l.backward_flops == backward + input_numel {
            sums.push(name.as_str());
        } else {
            assert_eq!(l.backward_flops, backward, "{name}");
        }
        assert!(
            l.activation_bytes > 0,
            "{name} keeps its output for backward"
        );
    }
    assert_eq!(
        sums,
        [
            "layer1.0.conv1",
            "layer1.1.conv1",
            "layer2.0.conv1",
            "layer2.1.conv1"
        ]
    );

    // Nothing is lost: the layers' FLOPs add up to the step's. What belongs to no
    // module is the input batch (made before the forward pass, kept for backward) and
    // the root's own flatten (a view: no FLOPs, no bytes).
    let (forward, backward) = summary_flops(&summary);
    assert_eq!(
        layers.values().map(|l| l.forward_flops).sum::<u64>(),
        forward
    );
    assert_eq!(
        layers.values().map(|l| l.backward_flops).sum::<u64>(),
        backward
    );
    let none = layers.get(missing).copied().unwrap_or(Layer {
        parameters_bytes: 0,
        activation_bytes: 0,
        forward_flops: 0,
        backward_flops: 0,
    });
    assert_eq!(
        none,
        Layer {
            parameters_bytes: 0,
            activation_bytes: truth.input_bytes,
            forward_flops: 0,
            backward_flops: 0,
        }
    );
}

#[test]
fn a_traced_encoder_is_profiled_by_module() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(truth) = export(ENCODER, dir.path()) else {
        return;
    };
    let (layers, params, summary) = profile(dir.path(), "2x16:i64");
    let missing = tch_memprof::MISSING;

    // The attention's own matmuls and softmax in `encoder.layer.N.attention`, its
    // projections in `...attention.query` and so on; the embeddings' position ids and
    // sum in `embeddings`; the encoder's loop runs no op of its own.
    let listed: BTreeSet<String> = layers.keys().filter(|l| *l != missing).cloned().collect();
    assert_eq!(listed, truth.running, "{layers:#?}");
    for l in [
        "embeddings",
        "encoder.layer.0.attention",
        "encoder.layer.0.attention.query",
        "encoder.layer.1.output.LayerNorm",
    ] {
        assert!(listed.contains(l), "{l}: {listed:?}");
    }
    assert!(!listed.contains("encoder"));
    assert_eq!(params, truth.parameters);
    for (name, l) in &layers {
        let own = truth.own_param_bytes.get(name).copied().unwrap_or(0);
        assert_eq!(l.parameters_bytes, own, "{name}");
    }

    // Each linear layer's forward FLOPs by formula (its bias add is not counted).
    assert_eq!(truth.linears.len(), 12);
    for (name, &forward) in &truth.linears {
        assert_eq!(layers[name].forward_flops, forward, "{name}");
    }
    let attention = layers["encoder.layer.0.attention"];
    assert!(attention.forward_flops > 0 && attention.activation_bytes > 0);

    // Nothing is lost; no module holds the token ids, which embedding's backward keeps.
    let (forward, backward) = summary_flops(&summary);
    assert_eq!(
        layers.values().map(|l| l.forward_flops).sum::<u64>(),
        forward
    );
    assert_eq!(
        layers.values().map(|l| l.backward_flops).sum::<u64>(),
        backward
    );
    let none = layers[missing];
    assert_eq!(
        (
            none.activation_bytes,
            none.forward_flops,
            none.backward_flops
        ),
        (truth.input_bytes, 0, 0)
    );
}
