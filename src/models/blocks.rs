//! Pieces the built-in transformers share, written as a tch user writes them: multi-head
//! self-attention through `scaled_dot_product_attention`, a GELU MLP, RMSNorm, rotary
//! position embeddings.

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

/// Multi-head self-attention with one fused `qkv` projection (GPT-2's `c_attn`, ViT's
/// `in_proj`) or three (`query`, `key`, `value`, as BERT names them), and an output
/// projection.
#[derive(Debug)]
pub(super) struct SelfAttention {
    qkv: Qkv,
    out: nn::Linear,
    heads: i64,
    causal: bool,
}

#[derive(Debug)]
enum Qkv {
    Fused(nn::Linear),
    Apart(nn::Linear, nn::Linear, nn::Linear),
}

impl SelfAttention {
    /// Fused: `qkv_name` is a `dim -> 3 dim` linear layer, `out_name` the projection.
    pub(super) fn fused(
        p: &nn::Path,
        qkv_name: &str,
        out_name: &str,
        dim: i64,
        heads: i64,
        causal: bool,
    ) -> SelfAttention {
        SelfAttention {
            qkv: Qkv::Fused(nn::linear(p / qkv_name, dim, 3 * dim, Default::default())),
            out: nn::linear(p / out_name, dim, dim, Default::default()),
            heads,
            causal,
        }
    }

    /// Three projections `q`, `k`, `v` under `p`, the output projection at `out`.
    pub(super) fn apart(
        p: &nn::Path,
        [q, k, v]: [&str; 3],
        out: &nn::Path,
        dim: i64,
        heads: i64,
    ) -> SelfAttention {
        SelfAttention {
            qkv: Qkv::Apart(
                nn::linear(p / q, dim, dim, Default::default()),
                nn::linear(p / k, dim, dim, Default::default()),
                nn::linear(p / v, dim, dim, Default::default()),
            ),
            out: nn::linear(out, dim, dim, Default::default()),
            heads,
            causal: false,
        }
    }
}

impl Module for SelfAttention {
    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, c) = x.size3().expect("attention takes [batch, tokens, dim]");
        let split = |y: Tensor| y.view([b, t, self.heads, c / self.heads]).transpose(1, 2);
        let (q, k, v) = match &self.qkv {
            Qkv::Fused(l) => {
                let qkv = l.forward(x).split(c, 2);
                let mut it = qkv.into_iter().map(split);
                let q = it.next().expect("three chunks");
                let k = it.next().expect("three chunks");
                let v = it.next().expect("three chunks");
                (q, k, v)
            }
            Qkv::Apart(q, k, v) => (
                split(q.forward(x)),
                split(k.forward(x)),
                split(v.forward(x)),
            ),
        };
        self.out
            .forward(&attend(&q, &k, &v, self.causal, [b, t, c]))
    }
}

/// `scaled_dot_product_attention` of heads `[b, heads, t, head_dim]`, back to
/// `[b, t, c]`.
pub(super) fn attend(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, btc: [i64; 3]) -> Tensor {
    Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, 0.0, causal, None, false)
        .transpose(1, 2)
        .contiguous()
        .view(btc)
}

/// A pre-norm transformer block (GPT-2's and ViT's): `x + attn(ln_1(x))`, then
/// `x + mlp(ln_2(x))`; the attention's output through dropout when `dropout` is set (as
/// torchvision's ViT does, with p = 0).
#[derive(Debug)]
pub(super) struct PreNormBlock {
    pub(super) ln_1: nn::LayerNorm,
    pub(super) attn: SelfAttention,
    pub(super) ln_2: nn::LayerNorm,
    pub(super) mlp: Mlp,
    pub(super) dropout: Option<f64>,
}

impl nn::ModuleT for PreNormBlock {
    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        // One statement each, as the originals wrote them: the temporaries of a branch
        // live until it ends.
        let x = match self.dropout {
            Some(p) => x + self.attn.forward(&self.ln_1.forward(x)).dropout(p, train),
            None => x + self.attn.forward(&self.ln_1.forward(x)),
        };
        &x + self.mlp.forward(&self.ln_2.forward(&x))
    }
}

/// `Linear(dim, hidden)`, GELU, `Linear(hidden, dim)`.
#[derive(Debug)]
pub(super) struct Mlp {
    fc: nn::Linear,
    proj: nn::Linear,
    tanh: bool,
}

impl Mlp {
    /// `tanh`: GPT-2's approximate GELU; otherwise the exact one.
    pub(super) fn new(fc: &nn::Path, proj: &nn::Path, dim: i64, hidden: i64, tanh: bool) -> Mlp {
        Mlp {
            fc: nn::linear(fc, dim, hidden, Default::default()),
            proj: nn::linear(proj, hidden, dim, Default::default()),
            tanh,
        }
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.fc.forward(x);
        let h = h.gelu(if self.tanh { "tanh" } else { "none" });
        self.proj.forward(&h)
    }
}

/// Layer norm with PyTorch's default epsilon unless given.
pub(super) fn layer_norm(p: nn::Path, dim: i64, eps: f64) -> nn::LayerNorm {
    nn::layer_norm(
        p,
        vec![dim],
        nn::LayerNormConfig {
            eps,
            ..Default::default()
        },
    )
}

/// RMSNorm (Llama): `x / sqrt(mean(x²) + eps) * weight`, computed in f32.
#[derive(Debug)]
pub(super) struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub(super) fn new(p: &nn::Path, dim: i64, eps: f64) -> RmsNorm {
        RmsNorm {
            weight: p.var("weight", &[dim], nn::Init::Const(1.)),
            eps,
        }
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let rms = (xf.square().mean_dim(-1, true, Kind::Float) + self.eps).rsqrt();
        (xf * rms).to_kind(kind) * &self.weight
    }
}

/// Rotary position embedding tables for `t` positions: `(cos, sin)`, each
/// `[t, head_dim]` (the half-rotation layout: frequencies repeated twice).
pub(super) fn rotary(t: i64, head_dim: i64, theta: f64, like: &Tensor) -> (Tensor, Tensor) {
    let opts = (Kind::Float, like.device());
    let inv = Tensor::arange_start_step(0, head_dim, 2, opts) / head_dim as f64;
    let inv = Tensor::from(theta)
        .to_device(like.device())
        .pow(&inv)
        .reciprocal();
    let pos = Tensor::arange(t, opts);
    let freqs = pos.outer(&inv);
    let emb = Tensor::cat(&[&freqs, &freqs], -1);
    (emb.cos(), emb.sin())
}

/// Applies rotary embeddings to `x` (`[b, heads, t, head_dim]`).
pub(super) fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    let rotated = Tensor::cat(&[&(-&x2), &x1], -1);
    let kind = x.kind();
    (x * cos.to_kind(kind)) + (rotated * sin.to_kind(kind))
}
