"""(Not named transformers.py: the scripts beside it in the GPU bundle import the
`transformers` package.) The built-in transformers of `tch-memprof estimate` (gpt2, gpt2-medium, bert-base,
vit-b16, llama3.2-1b, llama3-8b), written in plain PyTorch as the tch code of
src/models/{blocks,gpt2,bert,vit,llama}.rs writes them, and their CUDA peaks
measured on `cuda:0`, to be set beside the estimate's (builtin_join.py).

The mirror is op for op: the same parameters created in the same order (tch's `Linear`
and `Conv2D` create the bias before the weight, its initialisers allocate what they
allocate here), the same ops with the same arguments, and every intermediate held as long
as the Rust code holds it (a shadowed `let` keeps its value to the end of the block; a
temporary that is only borrowed lives until its statement ends, one moved into an
operator, as tch's `Tensor + Tensor` takes it, is freed right after the operator). The optimizer gets the
parameters in tch's creation order. Training runs the estimate's loop (src/estimate/
model.rs `dry_run` and `loss`): per step, the input is made, forward, the loss
(`log_softmax(-1, float32)` then `nll_loss` against class-0 targets: tch's
`cross_entropy_for_logits`), `zero_grad(set_to_none=True)`, backward, the optimizer step,
then loss, output and input are dropped; 2 steps of `torch.optim.AdamW(lr=1e-3,
weight_decay=0.01, foreach=False)` (the per-parameter loop tch's C++ AdamW also runs).
Under `--autocast bf16` the forward pass and the loss run under
`torch.autocast(device, torch.bfloat16)`; backward and the step outside it.

What is measured: `reset_peak_memory_stats()` once the model is on the GPU and before the
first input is made (the estimate's peak covers the weights and the run; its baseline is
taken after the first input), then `max_memory_allocated()` and `max_memory_reserved()`.
The SDPA backend that ran is read from a CPU-only `torch.profiler` trace of the measured
run (the forward op `scaled_dot_product_attention` dispatched to:
`_scaled_dot_product_{flash,efficient,cudnn}_attention`, `_scaled_dot_product_attention_math`;
joined with `+` when several ran, `none` when none did). A CPU-only profiler records op
names on the host and allocates no CUDA memory; `--no-probe` measures without it.

By default each case runs in a process of its own (a fresh CUDA context, cuBLAS
workspaces and caching allocator, as one estimate assumes); `--in-process` runs them in
one, freeing each model and emptying the cache between cases.

    python3 builtin_mirrors.py [--quick | --models gpt2,bert-base] [--out FILE]
    python3 builtin_mirrors.py --list-cases [--quick | --models ...]   # for run.sh
    python3 builtin_mirrors.py --count-params          # full configs on the meta device
    python3 builtin_mirrors.py --device cpu --tiny     # tiny configs: the models run

Prints CSV: model,input,mode,autocast,measured_allocated,measured_reserved,sdpa_backend,note
(note: ok, skipped and why, OOM, or the error).
"""
import argparse
import contextlib
import csv
import gc
import io
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------
# Variables, created as tch's VarStore creates them.


class Vars:
    """Creates parameters as tch's `Path::var` does (src nn/init.rs `f_init`) and keeps
    them in creation order (tch's `trainable_variables`, the order its optimizer walks)."""

    def __init__(self, device):
        self.device = device
        self.params = []

    def var(self, shape, init):
        kind, arg = init
        d = self.device
        if kind == "zeros":
            t = torch.zeros(shape, device=d)
        elif kind == "ones":
            t = torch.ones(shape, device=d)
        elif kind == "uniform":  # Init::Uniform and Kaiming uniform: zeros, then uniform_
            t = torch.zeros(shape, device=d).uniform_(-arg, arg)
        elif kind == "randn":  # Init::Randn: randn, then * stdev + mean unless N(0, 1)
            t = torch.randn(shape, device=d)
            if arg != 1.0:
                t = t * arg
                t = t + 0.0
        else:
            raise ValueError(kind)
        p = nn.Parameter(t)
        self.params.append(p)
        return p


def kaiming_uniform(fan_in):
    # tch's DEFAULT_KAIMING_UNIFORM: fan in, ReLU gain.
    return ("uniform", math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(fan_in))


class Linear(nn.Module):
    """tch `nn::linear`: the bias (uniform +-1/sqrt(in)) before the weight [out, in];
    forward `at::linear`."""

    def __init__(self, vs, i, o, bias=True):
        super().__init__()
        if bias:
            self.bias = vs.var([o], ("uniform", 1.0 / math.sqrt(i)))
        else:
            self.register_parameter("bias", None)
        self.weight = vs.var([o, i], kaiming_uniform(i))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """tch `nn::embedding`: weight N(0, 1); forward `at::embedding(w, ids, -1, false, false)`."""

    def __init__(self, vs, n, d):
        super().__init__()
        self.weight = vs.var([n, d], ("randn", 1.0))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class LayerNorm(nn.Module):
    """tch `nn::layer_norm`: weight (ones) then bias (zeros); `at::layer_norm`."""

    def __init__(self, vs, d, eps):
        super().__init__()
        self.weight = vs.var([d], ("ones", None))
        self.bias = vs.var([d], ("zeros", None))
        self.d, self.eps = d, eps

    def forward(self, x):
        return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)


class RmsNorm(nn.Module):
    """blocks.rs `RmsNorm`: `x / sqrt(mean(x^2) + eps) * weight`, computed in f32."""

    def __init__(self, vs, d, eps):
        super().__init__()
        self.weight = vs.var([d], ("ones", None))
        self.eps = eps

    def forward(self, x):
        kind = x.dtype
        xf = x.to(torch.float32)
        # let rms = (xf.square().mean_dim(-1, true, Float) + eps).rsqrt(): the square
        # (borrowed) lives until the statement ends, the mean is consumed by the add.
        sq = xf.square()
        m = torch.mean(sq, dim=[-1], keepdim=True, dtype=torch.float32)
        s = m + self.eps
        del m
        rms = s.rsqrt()
        del s, sq
        # (xf * rms).to_kind(kind) * &self.weight: xf and rms are moved into the product
        # (freed after it); the product lives to the end, its cast is consumed.
        p = xf * rms
        del xf, rms
        pk = p.to(kind)
        out = pk * self.weight
        del pk
        return out


# ---------------------------------------------------------------------------------------
# blocks.rs


def attend(q, k, v, causal, btc):
    """`scaled_dot_product_attention` of heads [b, heads, t, hd], back to [b, t, c]."""
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                       is_causal=causal, scale=None, enable_gqa=False)
    return y.transpose(1, 2).contiguous().view(btc)


class SelfAttention(nn.Module):
    """Fused `qkv` (dim -> 3 dim) or apart (`query`, `key`, `value`), then `out`."""

    def __init__(self, vs, dim, heads, causal, fused):
        super().__init__()
        self.fused = fused
        if fused:
            self.qkv = Linear(vs, dim, 3 * dim)
        else:
            self.q = Linear(vs, dim, dim)
            self.k = Linear(vs, dim, dim)
            self.v = Linear(vs, dim, dim)
        self.out = Linear(vs, dim, dim)
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, t, c = x.shape

        def split(y):
            return y.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        if self.fused:
            chunks = self.qkv(x).split(c, 2)
            q, k, v = (split(y) for y in chunks)
            del chunks
        else:
            q = split(self.q(x))
            k = split(self.k(x))
            v = split(self.v(x))
        # q, k, v live until the function returns, as in the Rust code.
        return self.out(attend(q, k, v, self.causal, [b, t, c]))


class Mlp(nn.Module):
    """`Linear(dim, hidden)`, GELU (tanh for GPT-2, exact otherwise), `Linear(hidden, dim)`."""

    def __init__(self, vs, dim, hidden, tanh):
        super().__init__()
        self.fc = Linear(vs, dim, hidden)
        self.proj = Linear(vs, hidden, dim)
        self.approximate = "tanh" if tanh else "none"

    def forward(self, x):
        h0 = self.fc(x)  # shadowed in Rust: kept to the end
        h = F.gelu(h0, approximate=self.approximate)
        return self.proj(h)


class PreNormBlock(nn.Module):
    """`x + attn(ln_1(x))` (through dropout when set), then `x + mlp(ln_2(x))`."""

    def __init__(self, vs, dim, heads, hidden, eps, causal, tanh, dropout):
        super().__init__()
        self.ln_1 = LayerNorm(vs, dim, eps)
        self.attn = SelfAttention(vs, dim, heads, causal, fused=True)
        self.ln_2 = LayerNorm(vs, dim, eps)
        self.mlp = Mlp(vs, dim, hidden, tanh)
        self.dropout = dropout

    def forward(self, x):
        # let x = x + attn(&ln_1(x))[.dropout(p)]: ln_1's output (borrowed) lives until
        # the statement ends, attn's too when dropout borrows it; the operand moved into
        # the sum is freed after it.
        h = self.ln_1(x)
        a = self.attn(h)
        if self.dropout is not None:
            ad = F.dropout(a, self.dropout, self.training)
            x1 = x + ad
            del ad
        else:
            x1 = x + a
        del a, h
        # &x + mlp(ln_2(&x)): the tail's temporaries live until the function returns.
        h2 = self.ln_2(x1)
        m = self.mlp(h2)
        return x1 + m


# ---------------------------------------------------------------------------------------
# gpt2.rs


class Gpt2(nn.Module):
    def __init__(self, vs, vocab, context, dim, layers, heads):
        super().__init__()
        self.wte = Embedding(vs, vocab, dim)
        self.wpe = Embedding(vs, context, dim)
        self.h = nn.ModuleList(
            PreNormBlock(vs, dim, heads, 4 * dim, 1e-5, causal=True, tanh=True, dropout=None)
            for _ in range(layers))
        self.ln_f = LayerNorm(vs, dim, 1e-5)

    def forward(self, idx):
        _, t = idx.shape
        pos = torch.arange(t, dtype=torch.int64, device=idx.device)
        # (wte(idx) + wpe(pos)).dropout(0.1, train): the sum consumes both embeddings;
        # it is borrowed by dropout and lives until the statement ends.
        s = self.wte(idx) + self.wpe(pos)
        x = F.dropout(s, 0.1, self.training)
        del s
        for block in self.h:
            x = block(x)
        y = self.ln_f(x)  # `let x = ln_f(&x)` shadows: the last block's output stays
        logits = y.matmul(self.wte.weight.t())  # the LM head: the tied token embedding
        return logits.view(-1, logits.size(2))


# ---------------------------------------------------------------------------------------
# bert.rs


class BertLayer(nn.Module):
    def __init__(self, vs, dim, heads, hidden, eps):
        super().__init__()
        self.attention = SelfAttention(vs, dim, heads, causal=False, fused=False)
        self.attention_norm = LayerNorm(vs, dim, eps)
        self.intermediate = Linear(vs, dim, hidden)
        self.output = Linear(vs, hidden, dim)
        self.output_norm = LayerNorm(vs, dim, eps)

    def forward(self, x):
        a = F.dropout(self.attention(x), 0.1, self.training)
        # attention_norm(&(a + x)): `a` is moved into the sum and freed after it.
        s = a + x
        del a
        x1 = self.attention_norm(s)
        del s
        h = F.gelu(self.intermediate(x1), approximate="none")
        # `let h = output(&h).dropout(..)` shadows: the GELU output stays to the end.
        h2 = F.dropout(self.output(h), 0.1, self.training)
        # output_norm(&(h + x)): both moved into the sum and freed after it.
        s2 = h2 + x1
        del h2, x1
        return self.output_norm(s2)


class Bert(nn.Module):
    def __init__(self, vs, vocab=30522, positions=512, dim=768, layers=12, heads=12,
                 hidden=3072, eps=1e-12):
        super().__init__()
        self.word = Embedding(vs, vocab, dim)
        self.position = Embedding(vs, positions, dim)
        self.token_type = Embedding(vs, 2, dim)
        self.norm = LayerNorm(vs, dim, eps)
        self.layers = nn.ModuleList(BertLayer(vs, dim, heads, hidden, eps)
                                    for _ in range(layers))
        self.pooler = Linear(vs, dim, dim)

    def forward(self, ids):
        _, t = ids.shape
        pos = torch.arange(t, dtype=torch.int64, device=ids.device)
        types = torch.zeros_like(ids)
        e = self.word(ids) + self.position(pos) + self.token_type(types)
        x = F.dropout(self.norm(e), 0.1, self.training)  # shadows: `e` stays
        for layer in self.layers:
            x = layer(x)
        return self.pooler(x.select(1, 0)).tanh()


# ---------------------------------------------------------------------------------------
# vit.rs


class Vit(nn.Module):
    def __init__(self, vs, image=224, patch=16, dim=768, layers=12, heads=12, hidden=3072,
                 num_classes=1000):
        super().__init__()
        tokens = (image // patch) * (image // patch) + 1
        # The blocks first: vit.rs builds them before the struct's other fields.
        self.blocks = nn.ModuleList(
            PreNormBlock(vs, dim, heads, hidden, 1e-6, causal=False, tanh=False, dropout=0.0)
            for _ in range(layers))
        # conv_proj: tch's conv2d, bias (zeros) before weight.
        self.conv_bias = vs.var([dim], ("zeros", None))
        self.conv_weight = vs.var([dim, 3, patch, patch], kaiming_uniform(3 * patch * patch))
        self.class_token = vs.var([1, 1, dim], ("zeros", None))
        self.pos_embedding = vs.var([1, tokens, dim], ("randn", 0.02))
        self.ln = LayerNorm(vs, dim, 1e-6)
        self.head = Linear(vs, dim, num_classes)
        self.patch, self.dim = patch, dim

    def forward(self, images):
        b = images.shape[0]
        x = F.conv2d(images, self.conv_weight, self.conv_bias, stride=self.patch)
        x = x.flatten(2, 3).transpose(1, 2)  # a view of the conv output
        cls = self.class_token.expand(b, 1, self.dim)
        # (cat([cls, x], 1) + pos_embedding).dropout(0.0, train): the sum consumes cat's
        # output and lives until the statement ends; `let mut x` shadows the patches,
        # which stay.
        s = torch.cat([cls, x], 1) + self.pos_embedding
        x2 = F.dropout(s, 0.0, self.training)
        del s
        for block in self.blocks:
            x2 = block(x2)
        y = self.ln(x2)
        return self.head(y.select(1, 0))


# ---------------------------------------------------------------------------------------
# llama.rs

THETA = 500_000.0


def rotary(t, head_dim, theta, like):
    """blocks.rs `rotary`: (cos, sin), each [t, head_dim], frequencies repeated twice."""
    d = like.device
    inv0 = torch.arange(0, head_dim, 2, dtype=torch.float32, device=d) / float(head_dim)
    # Tensor::from(theta).to_device(d).pow(&inv).reciprocal(): a 0-dim f64 tensor; the
    # chain's temporaries live until the statement ends, the first `inv` to the end.
    th = torch.tensor(theta, dtype=torch.float64)
    thd = th.to(d)
    pw = thd.pow(inv0)
    inv = pw.reciprocal()
    del pw, thd, th
    pos = torch.arange(t, dtype=torch.float32, device=d)
    freqs = pos.outer(inv)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    """blocks.rs `apply_rotary` on [b, heads, t, head_dim]."""
    half = x.size(3) // 2
    x1 = x.narrow(-1, 0, half)
    x2 = x.narrow(-1, half, half)
    rotated = torch.cat([-x2, x1], -1)
    kind = x.dtype
    # (x * cos.to_kind(kind)) + (rotated * sin.to_kind(kind)): each cast is consumed by
    # its product, each product by the sum.
    ck = cos.to(kind)
    a = x * ck
    del ck
    sk = sin.to(kind)
    b = rotated * sk
    del sk
    return a + b


class LlamaLayer(nn.Module):
    def __init__(self, vs, dim, heads, kv_heads, hidden):
        super().__init__()
        hd = dim // heads
        self.input_norm = RmsNorm(vs, dim, 1e-5)
        self.q = Linear(vs, dim, heads * hd, bias=False)
        self.k = Linear(vs, dim, kv_heads * hd, bias=False)
        self.v = Linear(vs, dim, kv_heads * hd, bias=False)
        self.o = Linear(vs, heads * hd, dim, bias=False)
        self.post_norm = RmsNorm(vs, dim, 1e-5)
        self.gate = Linear(vs, dim, hidden, bias=False)
        self.up = Linear(vs, dim, hidden, bias=False)
        self.down = Linear(vs, hidden, dim, bias=False)
        self.heads, self.kv_heads = heads, kv_heads

    def forward(self, x, cos, sin):
        # Every `let` of the Rust code shadows: each value lives until the layer returns.
        b, t, c = x.shape
        hd = c // self.heads
        h = self.input_norm(x)
        q0 = self.q(h).view(b, t, self.heads, hd).transpose(1, 2)
        k0 = self.k(h).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v0 = self.v(h).view(b, t, self.kv_heads, hd).transpose(1, 2)
        q = apply_rotary(q0, cos, sin)
        k1 = apply_rotary(k0, cos, sin)
        rep = self.heads // self.kv_heads
        k = k1.repeat_interleave(rep, dim=1)
        v = v0.repeat_interleave(rep, dim=1)
        y0 = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                            is_causal=True, scale=None, enable_gqa=False)
        y = y0.transpose(1, 2).contiguous().view(b, t, c)
        x1 = x + self.o(y)
        h2 = self.post_norm(x1)
        # gate(&h).silu() * up(&h): gate's output (borrowed by silu) lives until the
        # statement ends; the product consumes silu's and up's.
        g = self.gate(h2)
        gs = F.silu(g)
        u = self.up(h2)
        gated = gs * u
        del u, gs, g
        return x1 + self.down(gated)


class Llama(nn.Module):
    def __init__(self, vs, vocab, dim, layers, heads, kv_heads, hidden, tied):
        super().__init__()
        self.embed = Embedding(vs, vocab, dim)
        self.layers = nn.ModuleList(LlamaLayer(vs, dim, heads, kv_heads, hidden)
                                    for _ in range(layers))
        self.norm = RmsNorm(vs, dim, 1e-5)
        self.lm_head = None if tied else Linear(vs, dim, vocab, bias=False)
        self.head_dim = dim // heads

    def forward(self, ids):
        _, t = ids.shape
        x = self.embed(ids)
        cos, sin = rotary(t, self.head_dim, THETA, x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        y = self.norm(x)  # shadows: the last layer's output stays
        if self.lm_head is not None:
            logits = self.lm_head(y)
        else:
            logits = y.matmul(self.embed.weight.t())
        return logits.view(-1, logits.size(2)).to(torch.float32)


# ---------------------------------------------------------------------------------------
# The models, their published parameter counts, and the cases.

FULL = {
    "gpt2": lambda vs: Gpt2(vs, 50257, 1024, 768, 12, 12),
    "gpt2-medium": lambda vs: Gpt2(vs, 50257, 1024, 1024, 24, 16),
    "bert-base": lambda vs: Bert(vs),
    "vit-b16": lambda vs: Vit(vs),
    "llama3.2-1b": lambda vs: Llama(vs, 128256, 2048, 16, 32, 8, 8192, tied=True),
    "llama3-8b": lambda vs: Llama(vs, 128256, 4096, 32, 32, 8, 14336, tied=False),
}

TINY = {
    "gpt2": lambda vs: Gpt2(vs, 128, 64, 32, 2, 4),
    "gpt2-medium": lambda vs: Gpt2(vs, 128, 64, 48, 3, 4),
    "bert-base": lambda vs: Bert(vs, 128, 64, 32, 2, 4, 64),
    "vit-b16": lambda vs: Vit(vs, 32, 16, 32, 2, 4, 64, 10),
    "llama3.2-1b": lambda vs: Llama(vs, 128, 64, 2, 4, 2, 128, tied=True),
    "llama3-8b": lambda vs: Llama(vs, 128, 64, 2, 4, 2, 128, tied=False),
}

PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "bert-base": 109_482_240,
    "vit-b16": 86_567_656,
    "llama3.2-1b": 1_235_814_400,
    "llama3-8b": 8_030_261_248,
}

MODELS = list(FULL)
QUICK = ["gpt2", "bert-base", "vit-b16"]
GIB = 1 << 30


def cases(models, tiny):
    """(model, input, mode, autocast, min_gib): min_gib is the GPU memory (total, as
    torch.cuda.get_device_properties reports it) below which the case is skipped."""
    out = []
    for m in models:
        if tiny:
            shapes = {"vit-b16": "2x3x32x32"}
            inp = shapes.get(m, "2x16")
            plan = [(inp, mode, ac, 0) for mode in ("inference", "train") for ac in ("off", "bf16")]
        elif m == "llama3-8b":
            # f32 weights are 32 GB: inference fits an 80 GB GPU at 1x2048 (bf16 autocast
            # adds a 16 GB bf16 copy of the weights, cached for the forward pass). f32
            # training holds weights, gradients and AdamW's two moments: 128 GB, so only
            # a 141 GB GPU (H200) runs it, at 1x256, and not under autocast.
            plan = [("1x2048", "inference", "off", 40), ("1x2048", "inference", "bf16", 60),
                    ("1x256", "train", "off", 135)]
        else:
            inp = {"gpt2": "8x1024", "gpt2-medium": "4x1024", "bert-base": "8x512",
                   "vit-b16": "32x3x224x224", "llama3.2-1b": "2x2048"}[m]
            plan = [(inp, mode, ac, 0) for mode in ("inference", "train") for ac in ("off", "bf16")]
        out += [(m, i, mode, ac, g) for (i, mode, ac, g) in plan]
    return out


def estimate_input(model, inp):
    """The `--input` of `tch-memprof estimate` for this case."""
    return inp if model == "vit-b16" else inp + ":i64"


def make_input(model, inp, vocab, device):
    shape = [int(s) for s in inp.split("x")]
    if model == "vit-b16":
        return torch.randn(shape, device=device)
    return torch.randint(0, vocab, shape, dtype=torch.int64, device=device)


def vocab_of(model):
    if isinstance(model, Vit):
        return None
    if isinstance(model, Gpt2):
        return model.wte.weight.shape[0]
    if isinstance(model, Bert):
        return model.word.weight.shape[0]
    return model.embed.weight.shape[0]


def count_params(name, build=FULL):
    with torch.device("meta"):
        model = build[name](Vars(torch.device("meta")))
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------
# One case.

SDPA_OPS = [
    ("flash", ("aten::_scaled_dot_product_flash_attention",
               "aten::_scaled_dot_product_flash_attention_for_cpu")),
    ("efficient", ("aten::_scaled_dot_product_efficient_attention",)),
    ("cudnn", ("aten::_scaled_dot_product_cudnn_attention",)),
    ("math", ("aten::_scaled_dot_product_attention_math",)),
    ("overrideable", ("aten::_scaled_dot_product_fused_attention_overrideable",)),
]


def sdpa_label(names):
    ran = [label for label, ops in SDPA_OPS if any(o in names for o in ops)]
    return "+".join(ran) if ran else "none"


def check_output(name, inp, y, vocab):
    """--tiny: the output has the tch model's shape and is finite."""
    dims = [int(s) for s in inp.split("x")]
    if name == "vit-b16":
        want = [dims[0], 10]
    elif name == "bert-base":
        want = [dims[0], 32]
    else:
        want = [dims[0] * dims[1], vocab]
    assert list(y.shape) == want, f"{name}: output {list(y.shape)}, expected {want}"
    if name.startswith("llama"):  # llama.rs casts the logits to f32
        assert y.dtype == torch.float32, f"{name}: logits {y.dtype}"
    assert torch.isfinite(y.float()).all().item(), f"{name}: output not finite"


def run_case(name, inp, mode, autocast, device, tiny, probe):
    """Builds the model on `device`, runs the case, returns (allocated, reserved, sdpa)."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    vs = Vars(device)
    model = (TINY if tiny else FULL)[name](vs)
    vocab = vocab_of(model)
    ac = (torch.autocast(device.type, dtype=torch.bfloat16) if autocast == "bf16"
          else contextlib.nullcontext())
    prof = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if probe else contextlib.nullcontext())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with prof:
        if mode == "inference":
            model.eval()
            x = make_input(name, inp, vocab, device)
            with torch.no_grad(), ac:
                y = model(x)
            if tiny:
                check_output(name, inp, y, vocab)
            del y, x
        else:
            model.train()
            opt = torch.optim.AdamW(vs.params, lr=1e-3, weight_decay=0.01, foreach=False)
            for _ in range(2):
                x = make_input(name, inp, vocab, device)
                with ac:
                    out = model(x)
                    target = torch.zeros(out.shape[0], dtype=torch.int64, device=device)
                    # tch's cross_entropy_for_logits: log_softmax(-1, Float).nll_loss(t)
                    loss = torch.ops.aten.nll_loss(
                        out.log_softmax(-1, dtype=torch.float32), target, None, 1, -100)
                    del target
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if tiny:
                    check_output(name, inp, out, vocab)
                    assert torch.isfinite(loss).item(), f"{name}: loss {loss.item()}"
                del loss, out, x
            opt.zero_grad(set_to_none=True)
            del opt
        if cuda:
            torch.cuda.synchronize()
    allocated = torch.cuda.max_memory_allocated() if cuda else ""
    reserved = torch.cuda.max_memory_reserved() if cuda else ""
    sdpa = sdpa_label({e.name for e in prof.events()}) if probe else "not probed"
    del model, vs
    return allocated, reserved, sdpa


HEADER = ["model", "input", "mode", "autocast", "measured_allocated", "measured_reserved",
          "sdpa_backend", "note"]


def row_text(row):
    s = io.StringIO()
    csv.writer(s, lineterminator="\n").writerow(row)
    return s.getvalue()


def one_case(args, case):
    """The row of one case, measured in this process."""
    name, inp, mode, autocast, min_gib = case
    device = torch.device(args.device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if total < min_gib * GIB:
            return [name, inp, mode, autocast, "", "", "",
                    f"skipped: needs a GPU of {min_gib} GiB, this one has {total / GIB:.1f}"]
    try:
        a, r, sdpa = run_case(name, inp, mode, autocast, device, args.tiny, not args.no_probe)
        note = "ok"
    except torch.OutOfMemoryError as e:
        a, r, sdpa = "", "", ""
        note = "OOM: " + str(e).splitlines()[0]
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return [name, inp, mode, autocast, a, r, sdpa, note]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--models", help="comma-separated: " + ",".join(MODELS))
    p.add_argument("--quick", action="store_true", help="only " + ",".join(QUICK))
    p.add_argument("--tiny", action="store_true", help="tiny configs (a check that they run)")
    p.add_argument("--list-cases", action="store_true",
                   help="print 'model input estimate_input mode autocast' per case and exit")
    p.add_argument("--count-params", action="store_true",
                   help="build the full configs on the meta device, check parameter counts")
    p.add_argument("--in-process", action="store_true",
                   help="run every case in this process (default: a process per case)")
    p.add_argument("--no-probe", action="store_true",
                   help="measure without the profiler (no SDPA backend)")
    p.add_argument("--case", help=argparse.SUPPRESS)  # model,input,mode,autocast,min_gib
    p.add_argument("--out", help="also write the CSV to this file")
    args = p.parse_args()

    if args.count_params:
        bad = 0
        for name in MODELS:
            n = count_params(name)
            ok = n == PUBLISHED[name]
            bad += not ok
            print(f"{name:12} {n:>14,} {'ok' if ok else 'expected %s' % format(PUBLISHED[name], ',')}")
        sys.exit(1 if bad else 0)

    if args.case:
        m, i, mode, ac, g = args.case.split(",")
        sys.stdout.write(row_text(one_case(args, (m, i, mode, ac, int(g)))))
        return

    models = QUICK if args.quick else MODELS
    if args.models:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in models if m not in FULL]
        if unknown:
            p.error(f"unknown model(s) {unknown}; known: {','.join(MODELS)}")
    todo = cases(models, args.tiny)

    if args.list_cases:
        for (m, i, mode, ac, _) in todo:
            print(m, i, estimate_input(m, i), mode, ac)
        return

    out = open(args.out, "w") if args.out else None
    failed = 0

    def emit(text):
        sys.stdout.write(text)
        sys.stdout.flush()
        if out:
            out.write(text)
            out.flush()

    emit(row_text(HEADER))
    for case in todo:
        name, inp, mode, ac, min_gib = case
        if args.in_process:
            row = one_case(args, case)
            emit(row_text(row))
            failed += row[-1] != "ok" and not row[-1].startswith("skipped")
            continue
        # This process never touches CUDA: its context would take GPU memory from the
        # case's.
        cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device,
               "--case", ",".join([name, inp, mode, ac, str(min_gib)])]
        cmd += ["--tiny"] if args.tiny else []
        cmd += ["--no-probe"] if args.no_probe else []
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        lines = [line for line in r.stdout.splitlines() if line.strip()]
        if r.returncode == 0 and lines:
            emit(lines[-1] + "\n")
            note = next(csv.reader([lines[-1]]))[-1]
            failed += note != "ok" and not note.startswith("skipped")
        else:
            emit(row_text([name, inp, mode, ac, "", "", "", f"failed (exit {r.returncode})"]))
            failed += 1
    if out:
        out.close()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
