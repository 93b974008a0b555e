//! GPT-2 (small, medium) as a tch user writes it, after the names and shapes of the
//! original (`transformer.wte`, `transformer.h.N.attn.c_attn`, ...; the projections as
//! `nn::Linear`, so their weights are `[out, in]` where the original's Conv1D stores
//! `[in, out]`, the same bytes). Pre-norm blocks, causal attention through
//! `scaled_dot_product_attention`, tanh-approximate GELU, the LM head tied to the token
//! embedding. The forward pass takes token ids `[batch, tokens]` (int64) and returns the
//! logits flattened to `[batch * tokens, vocab]`, so training takes cross-entropy over
//! every token.

use tch::nn::{self, Module, ModuleT};
use tch::{Kind, Tensor};

use super::blocks::{layer_norm, Mlp, PreNormBlock, SelfAttention};
use super::Chain;

/// The sizes of a GPT-2.
#[derive(Debug, Clone, Copy)]
pub struct Gpt2Config {
    /// Token vocabulary.
    pub vocab: i64,
    /// Positions.
    pub context: i64,
    /// Width.
    pub dim: i64,
    /// Blocks.
    pub layers: i64,
    /// Attention heads.
    pub heads: i64,
}

impl Gpt2Config {
    /// GPT-2 small: 124,439,808 parameters.
    pub const SMALL: Gpt2Config = Gpt2Config {
        vocab: 50257,
        context: 1024,
        dim: 768,
        layers: 12,
        heads: 12,
    };
    /// GPT-2 medium: 354,823,168 parameters.
    pub const MEDIUM: Gpt2Config = Gpt2Config {
        vocab: 50257,
        context: 1024,
        dim: 1024,
        layers: 24,
        heads: 16,
    };
}

fn block(p: &nn::Path, c: &Gpt2Config) -> PreNormBlock {
    let attn = p / "attn";
    let mlp = p / "mlp";
    PreNormBlock {
        ln_1: layer_norm(p / "ln_1", c.dim, 1e-5),
        attn: SelfAttention::fused(&attn, "c_attn", "c_proj", c.dim, c.heads, true),
        ln_2: layer_norm(p / "ln_2", c.dim, 1e-5),
        mlp: Mlp::new(&(&mlp / "c_fc"), &(&mlp / "c_proj"), c.dim, 4 * c.dim, true),
        dropout: None,
    }
}

/// A GPT-2 language model.
#[derive(Debug)]
pub struct Gpt2 {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<PreNormBlock>,
    ln_f: nn::LayerNorm,
}

impl Gpt2 {
    /// A GPT-2 of these sizes on `p`.
    pub fn new(p: &nn::Path, c: Gpt2Config) -> Gpt2 {
        let t = p / "transformer";
        let h = &t / "h";
        Gpt2 {
            wte: nn::embedding(&t / "wte", c.vocab, c.dim, Default::default()),
            wpe: nn::embedding(&t / "wpe", c.context, c.dim, Default::default()),
            blocks: (0..c.layers).map(|i| block(&(&h / i), &c)).collect(),
            ln_f: layer_norm(&t / "ln_f", c.dim, 1e-5),
        }
    }
}

/// Segments: the embeddings, each block, the head.
impl Chain for Gpt2 {
    fn segments(&self) -> usize {
        self.blocks.len() + 2
    }

    fn segment(&self, i: usize, x: &Tensor, train: bool) -> Tensor {
        if i == 0 {
            let (_, t) = x.size2().expect("GPT-2 takes token ids [batch, tokens]");
            let pos = Tensor::arange(t, (Kind::Int64, x.device()));
            (self.wte.forward(x) + self.wpe.forward(&pos)).dropout(0.1, train)
        } else if i <= self.blocks.len() {
            self.blocks[i - 1].forward_t(x, train)
        } else {
            let x = self.ln_f.forward(x);
            // The LM head is the token embedding, transposed (tied weights).
            let logits = x.matmul(&self.wte.ws.tr());
            logits.view([-1, logits.size()[2]])
        }
    }

    fn forward_plain(&self, x: &Tensor, train: bool) -> Tensor {
        self.forward_t(x, train)
    }
}

/// As a tch user writes it in one function: the positions live to the end of the
/// forward pass, where the chain frees them when its first segment returns.
impl ModuleT for Gpt2 {
    fn forward_t(&self, idx: &Tensor, train: bool) -> Tensor {
        let (_, t) = idx.size2().expect("GPT-2 takes token ids [batch, tokens]");
        let pos = Tensor::arange(t, (Kind::Int64, idx.device()));
        let mut x = (self.wte.forward(idx) + self.wpe.forward(&pos)).dropout(0.1, train);
        for block in &self.blocks {
            x = block.forward_t(&x, train);
        }
        let x = self.ln_f.forward(&x);
        // The LM head is the token embedding, transposed (tied weights).
        let logits = x.matmul(&self.wte.ws.tr());
        logits.view([-1, logits.size()[2]])
    }
}

/// GPT-2 small (124M).
pub fn gpt2(p: &nn::Path) -> Gpt2 {
    Gpt2::new(p, Gpt2Config::SMALL)
}

/// GPT-2 medium (355M).
pub fn gpt2_medium(p: &nn::Path) -> Gpt2 {
    Gpt2::new(p, Gpt2Config::MEDIUM)
}
