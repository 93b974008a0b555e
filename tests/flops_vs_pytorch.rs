//! The step anatomy's FLOPs against PyTorch's own counter on the same model: a GPT-style
//! decoder (embeddings, layer norm, fused qkv, attention written out with matmul and a
//! causal mask, GELU MLP, tied head) defined and traced in PyTorch, profiled for one
//! training step by `tch-memprof profile --train` (cross-entropy over every token), and
//! counted by `torch.utils.flop_counter.FlopCounterMode` on the same module, forward and
//! backward apart.
//!
//! FlopCounterMode counts matrix products only (mm, addmm, bmm, baddbmm, convolutions,
//! fused attention); the step anatomy counts the rest too (layer norm, GELU, softmax,
//! the loss, the embedding's backward), which here is under 1% of either pass.

mod common;

use std::process::Command;

const GPT_MATH: &str = r#"
import sys, math, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
class Block(nn.Module):
    def __init__(s, d, h, T):
        super().__init__(); s.h = h
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.out = nn.Linear(4 * d, d)
        s.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, 2)
        q, k, v = [t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.h)
        att = att.masked_fill(~s.mask[:T, :T], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.proj(y)
        return x + s.out(F.gelu(s.fc(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s, V=512, T=64, d=512, L=2, h=8):
        super().__init__()
        s.wte = nn.Embedding(V, d); s.wpe = nn.Embedding(T, d)
        s.blocks = nn.ModuleList([Block(d, h, T) for _ in range(L)]); s.ln = nn.LayerNorm(d)
    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        return s.ln(x) @ s.wte.weight.t()
g = GPT().train()
idx = torch.randint(0, 512, (2, 64))
torch.jit.trace(g, idx).save(sys.argv[1])
with FlopCounterMode(display=False) as fwd:
    logits = g(idx)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.zeros(2 * 64, dtype=torch.long))
with FlopCounterMode(display=False) as bwd:
    loss.backward()
print(fwd.get_total_flops(), bwd.get_total_flops())
"#;

#[test]
fn a_gpt_training_step_counts_the_flops_pytorch_counts_within_1_percent() {
    let Some(python) = common::torch_python() else {
        common::cannot_run("FLOPs against FlopCounterMode: no Python with torch beside LIBTORCH");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("gpt.pt");
    let out = Command::new(python)
        .args(["-c", GPT_MATH, model.to_str().unwrap()])
        .output()
        .expect("runs python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counted: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let (torch_forward, torch_backward) = (counted[0], counted[1]);

    let results = dir.path().join("profile");
    common::cli_ok(&[
        "profile",
        model.to_str().unwrap(),
        "--input",
        "2x64:i64",
        "--train",
        "--output-dir",
        results.to_str().unwrap(),
    ]);
    let mut layers = csv::Reader::from_path(results.join("layers.csv")).unwrap();
    let headers = layers.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (fwd, bwd) = (column("forward_flops"), column("backward_flops"));
    let (mut forward, mut backward) = (0f64, 0f64);
    for row in layers.records() {
        let row = row.unwrap();
        forward += row[fwd].parse::<f64>().unwrap();
        backward += row[bwd].parse::<f64>().unwrap();
    }
    for (what, ours, theirs) in [
        ("forward", forward, torch_forward),
        ("backward", backward, torch_backward),
    ] {
        let off = (ours - theirs).abs() / theirs;
        eprintln!(
            "{what}: step anatomy {ours} FLOPs, FlopCounterMode {theirs} ({:+.2}%)",
            100.0 * (ours - theirs) / theirs
        );
        assert!(
            off < 0.01,
            "{what}: step anatomy {ours} vs FlopCounterMode {theirs} ({:.2}% off)",
            100.0 * off
        );
        // Never below PyTorch's count: the step anatomy counts every product it counts.
        assert!(ours >= theirs, "{what}: {ours} < {theirs}");
    }
}
