//! Llama 3 as a tch user writes it, after the reference names (`model.embed_tokens`,
//! `model.layers.N.self_attn.{q,k,v,o}_proj`, `model.layers.N.mlp.{gate,up,down}_proj`,
//! `model.layers.N.{input,post_attention}_layernorm`, `model.norm`, `lm_head`): RMSNorm,
//! rotary position embeddings (theta 500,000), grouped-query attention through
//! `scaled_dot_product_attention` (the key and value heads repeated to the query heads),
//! a SwiGLU MLP, no biases; the LM head tied to the embedding where the original ties it
//! (Llama 3.2 1B). Takes token ids `[batch, tokens]` (int64) and returns the logits
//! flattened to `[batch * tokens, vocab]`.

use tch::nn::{self, Module, ModuleT};
use tch::{Kind, Tensor};

use super::blocks::{apply_rotary, rotary, RmsNorm};
use super::Chain;

/// The sizes of a Llama 3.
#[derive(Debug, Clone, Copy)]
pub struct LlamaConfig {
    /// Token vocabulary.
    pub vocab: i64,
    /// Width.
    pub dim: i64,
    /// Blocks.
    pub layers: i64,
    /// Query heads.
    pub heads: i64,
    /// Key and value heads.
    pub kv_heads: i64,
    /// The MLP's hidden width.
    pub hidden: i64,
    /// The LM head is the embedding.
    pub tied: bool,
}

impl LlamaConfig {
    /// Llama 3.2 1B: 1,235,814,400 parameters (tied head).
    pub const LLAMA3_2_1B: LlamaConfig = LlamaConfig {
        vocab: 128256,
        dim: 2048,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        hidden: 8192,
        tied: true,
    };
    /// Llama 3 8B: 8,030,261,248 parameters.
    pub const LLAMA3_8B: LlamaConfig = LlamaConfig {
        vocab: 128256,
        dim: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        hidden: 14336,
        tied: false,
    };
}

const THETA: f64 = 500_000.0;
const EPS: f64 = 1e-5;

fn linear(p: nn::Path, i: i64, o: i64) -> nn::Linear {
    nn::linear(
        p,
        i,
        o,
        nn::LinearConfig {
            bias: false,
            ..Default::default()
        },
    )
}

#[derive(Debug)]
struct Layer {
    input_norm: RmsNorm,
    q: nn::Linear,
    k: nn::Linear,
    v: nn::Linear,
    o: nn::Linear,
    post_norm: RmsNorm,
    gate: nn::Linear,
    up: nn::Linear,
    down: nn::Linear,
    heads: i64,
    kv_heads: i64,
}

impl Layer {
    fn new(p: &nn::Path, c: &LlamaConfig) -> Layer {
        let a = p / "self_attn";
        let m = p / "mlp";
        let head_dim = c.dim / c.heads;
        Layer {
            input_norm: RmsNorm::new(&(p / "input_layernorm"), c.dim, EPS),
            q: linear(&a / "q_proj", c.dim, c.heads * head_dim),
            k: linear(&a / "k_proj", c.dim, c.kv_heads * head_dim),
            v: linear(&a / "v_proj", c.dim, c.kv_heads * head_dim),
            o: linear(&a / "o_proj", c.heads * head_dim, c.dim),
            post_norm: RmsNorm::new(&(p / "post_attention_layernorm"), c.dim, EPS),
            gate: linear(&m / "gate_proj", c.dim, c.hidden),
            up: linear(&m / "up_proj", c.dim, c.hidden),
            down: linear(&m / "down_proj", c.hidden, c.dim),
            heads: c.heads,
            kv_heads: c.kv_heads,
        }
    }

    fn forward(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let (b, t, c) = x.size3().expect("[batch, tokens, dim]");
        let hd = c / self.heads;
        let h = self.input_norm.forward(x);
        let q = self
            .q
            .forward(&h)
            .view([b, t, self.heads, hd])
            .transpose(1, 2);
        let k = self
            .k
            .forward(&h)
            .view([b, t, self.kv_heads, hd])
            .transpose(1, 2);
        let v = self
            .v
            .forward(&h)
            .view([b, t, self.kv_heads, hd])
            .transpose(1, 2);
        let q = apply_rotary(&q, cos, sin);
        let k = apply_rotary(&k, cos, sin);
        // Grouped-query attention: each key and value head serves heads / kv_heads
        // query heads.
        let rep = self.heads / self.kv_heads;
        let k = k.repeat_interleave_self_int(rep, 1, None);
        let v = v.repeat_interleave_self_int(rep, 1, None);
        let y = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        );
        let y = y.transpose(1, 2).contiguous().view([b, t, c]);
        let x = x + self.o.forward(&y);
        let h = self.post_norm.forward(&x);
        let gated = self.gate.forward(&h).silu() * self.up.forward(&h);
        &x + self.down.forward(&gated)
    }
}

/// A Llama 3 language model.
#[derive(Debug)]
pub struct Llama {
    embed: nn::Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<nn::Linear>,
    head_dim: i64,
}

impl Llama {
    /// A Llama of these sizes on `p`.
    pub fn new(p: &nn::Path, c: LlamaConfig) -> Llama {
        let m = p / "model";
        let l = &m / "layers";
        Llama {
            embed: nn::embedding(&m / "embed_tokens", c.vocab, c.dim, Default::default()),
            layers: (0..c.layers).map(|i| Layer::new(&(&l / i), &c)).collect(),
            norm: RmsNorm::new(&(&m / "norm"), c.dim, EPS),
            lm_head: (!c.tied).then(|| linear(p / "lm_head", c.dim, c.vocab)),
            head_dim: c.dim / c.heads,
        }
    }
}

impl ModuleT for Llama {
    fn forward_t(&self, ids: &Tensor, _train: bool) -> Tensor {
        let (_, t) = ids.size2().expect("Llama takes token ids [batch, tokens]");
        let mut x = self.embed.forward(ids);
        let (cos, sin) = rotary(t, self.head_dim, THETA, &x);
        for layer in &self.layers {
            x = layer.forward(&x, &cos, &sin);
        }
        self.head(&x)
    }
}

/// Segments: the embedding, each layer, the head. Each layer makes its rotary tables anew
/// (2 x tokens x head size f32: 4 MiB for Llama 3 8B at 4096 tokens) where the plain
/// forward pass makes them once, and a layer that keeps its activations saves them for
/// backward.
impl Chain for Llama {
    fn segments(&self) -> usize {
        self.layers.len() + 2
    }

    fn segment(&self, i: usize, x: &Tensor, _train: bool) -> Tensor {
        if i == 0 {
            self.embed.forward(x)
        } else if i <= self.layers.len() {
            let (_, t, _) = x.size3().expect("[batch, tokens, dim]");
            let (cos, sin) = rotary(t, self.head_dim, THETA, x);
            self.layers[i - 1].forward(x, &cos, &sin)
        } else {
            self.head(x)
        }
    }

    fn forward_plain(&self, x: &Tensor, train: bool) -> Tensor {
        self.forward_t(x, train)
    }
}

impl Llama {
    fn head(&self, x: &Tensor) -> Tensor {
        let x = self.norm.forward(x);
        let logits = match &self.lm_head {
            Some(head) => head.forward(&x),
            None => x.matmul(&self.embed.ws.tr()),
        };
        logits.view([-1, logits.size()[2]]).to_kind(Kind::Float)
    }
}

/// Llama 3.2 1B.
pub fn llama3_2_1b(p: &nn::Path) -> Llama {
    Llama::new(p, LlamaConfig::LLAMA3_2_1B)
}

/// Llama 3 8B.
pub fn llama3_8b(p: &nn::Path) -> Llama {
    Llama::new(p, LlamaConfig::LLAMA3_8B)
}
