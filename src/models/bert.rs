//! BERT-base as a tch user writes it, after the original's names (`embeddings.*`,
//! `encoder.layer.N.attention.self.{query,key,value}`, `...attention.output.dense`,
//! `intermediate.dense`, `output.dense`, `pooler.dense`): post-norm blocks, exact GELU,
//! bidirectional attention through `scaled_dot_product_attention`, the pooler (tanh of a
//! dense layer on the first token). 109,482,240 parameters. The forward pass takes token
//! ids `[batch, tokens]` (int64; token types all 0) and returns the pooled output
//! `[batch, 768]`.

use tch::nn::{self, Module, ModuleT};
use tch::{Kind, Tensor};

use super::blocks::{layer_norm, SelfAttention};
use super::Chain;

const VOCAB: i64 = 30522;
const POSITIONS: i64 = 512;
const DIM: i64 = 768;
const LAYERS: i64 = 12;
const HEADS: i64 = 12;
const HIDDEN: i64 = 3072;
const EPS: f64 = 1e-12;

#[derive(Debug)]
struct Layer {
    attention: SelfAttention,
    attention_norm: nn::LayerNorm,
    intermediate: nn::Linear,
    output: nn::Linear,
    output_norm: nn::LayerNorm,
}

impl Layer {
    fn new(p: &nn::Path) -> Layer {
        let a = p / "attention";
        Layer {
            attention: SelfAttention::apart(
                &(&a / "self"),
                ["query", "key", "value"],
                &(&a / "output" / "dense"),
                DIM,
                HEADS,
            ),
            attention_norm: layer_norm(&a / "output" / "LayerNorm", DIM, EPS),
            intermediate: nn::linear(
                p / "intermediate" / "dense",
                DIM,
                HIDDEN,
                Default::default(),
            ),
            output: nn::linear(p / "output" / "dense", HIDDEN, DIM, Default::default()),
            output_norm: layer_norm(p / "output" / "LayerNorm", DIM, EPS),
        }
    }
}

impl ModuleT for Layer {
    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let a = self.attention.forward(x).dropout(0.1, train);
        let x = self.attention_norm.forward(&(a + x));
        let h = self.intermediate.forward(&x).gelu("none");
        let h = self.output.forward(&h).dropout(0.1, train);
        self.output_norm.forward(&(h + x))
    }
}

/// BERT-base with its pooler.
#[derive(Debug)]
pub struct Bert {
    word: nn::Embedding,
    position: nn::Embedding,
    token_type: nn::Embedding,
    norm: nn::LayerNorm,
    layers: Vec<Layer>,
    pooler: nn::Linear,
}

/// BERT-base (110M).
pub fn bert_base(p: &nn::Path) -> Bert {
    let e = p / "embeddings";
    let l = p / "encoder" / "layer";
    Bert {
        word: nn::embedding(&e / "word_embeddings", VOCAB, DIM, Default::default()),
        position: nn::embedding(
            &e / "position_embeddings",
            POSITIONS,
            DIM,
            Default::default(),
        ),
        token_type: nn::embedding(&e / "token_type_embeddings", 2, DIM, Default::default()),
        norm: layer_norm(&e / "LayerNorm", DIM, EPS),
        layers: (0..LAYERS).map(|i| Layer::new(&(&l / i))).collect(),
        pooler: nn::linear(p / "pooler" / "dense", DIM, DIM, Default::default()),
    }
}

/// Segments: the embeddings, each layer, the pooler.
impl Chain for Bert {
    fn segments(&self) -> usize {
        self.layers.len() + 2
    }

    fn segment(&self, i: usize, x: &Tensor, train: bool) -> Tensor {
        if i == 0 {
            let ids = x;
            let (_, t) = ids.size2().expect("BERT takes token ids [batch, tokens]");
            let pos = Tensor::arange(t, (Kind::Int64, ids.device()));
            let types = ids.zeros_like();
            let x = self.word.forward(ids)
                + self.position.forward(&pos)
                + self.token_type.forward(&types);
            self.norm.forward(&x).dropout(0.1, train)
        } else if i <= self.layers.len() {
            self.layers[i - 1].forward_t(x, train)
        } else {
            self.pooler.forward(&x.select(1, 0)).tanh()
        }
    }

    fn forward_plain(&self, x: &Tensor, train: bool) -> Tensor {
        self.forward_t(x, train)
    }
}

/// As a tch user writes it in one function: the embeddings' sum, its positions and
/// token types live to the end of the forward pass (each `let` shadows, none drops),
/// where the chain frees them when its first segment returns.
impl ModuleT for Bert {
    fn forward_t(&self, ids: &Tensor, train: bool) -> Tensor {
        let (_, t) = ids.size2().expect("BERT takes token ids [batch, tokens]");
        let pos = Tensor::arange(t, (Kind::Int64, ids.device()));
        let types = ids.zeros_like();
        let x =
            self.word.forward(ids) + self.position.forward(&pos) + self.token_type.forward(&types);
        let mut x = self.norm.forward(&x).dropout(0.1, train);
        for layer in &self.layers {
            x = layer.forward_t(&x, train);
        }
        self.pooler.forward(&x.select(1, 0)).tanh()
    }
}
