//! ViT-B/16 as torchvision defines it (`conv_proj`, `class_token`,
//! `encoder.pos_embedding`, `encoder.layers.encoder_layer_N.{ln_1, self_attention, ln_2,
//! mlp}`, `encoder.ln`, `heads.head`), written as a tch user writes it: 16x16 patches of a
//! 224x224 image, a class token, pre-norm blocks with exact GELU and attention through
//! `scaled_dot_product_attention`. 86,567,656 parameters. Takes images
//! `[batch, 3, 224, 224]` and returns the class scores `[batch, 1000]`.

use tch::nn::{self, Module, ModuleT};
use tch::Tensor;

use super::blocks::{layer_norm, Mlp, PreNormBlock, SelfAttention};
use super::Chain;

const PATCH: i64 = 16;
const DIM: i64 = 768;
const LAYERS: i64 = 12;
const HEADS: i64 = 12;
const HIDDEN: i64 = 3072;
const TOKENS: i64 = (224 / PATCH) * (224 / PATCH) + 1;

/// ViT-B/16.
#[derive(Debug)]
pub struct Vit {
    conv_proj: nn::Conv2D,
    class_token: Tensor,
    pos_embedding: Tensor,
    blocks: Vec<PreNormBlock>,
    ln: nn::LayerNorm,
    head: nn::Linear,
}

/// ViT-B/16 (86.6M), 1000 classes.
pub fn vit_b16(p: &nn::Path, num_classes: i64) -> Vit {
    let e = p / "encoder";
    let layers = &e / "layers";
    let blocks = (0..LAYERS)
        .map(|i| {
            let b = &layers / format!("encoder_layer_{i}");
            let mlp = &b / "mlp";
            PreNormBlock {
                ln_1: layer_norm(&b / "ln_1", DIM, 1e-6),
                attn: SelfAttention::fused(
                    &(&b / "self_attention"),
                    "in_proj",
                    "out_proj",
                    DIM,
                    HEADS,
                    false,
                ),
                ln_2: layer_norm(&b / "ln_2", DIM, 1e-6),
                mlp: Mlp::new(&(&mlp / "0"), &(&mlp / "3"), DIM, HIDDEN, false),
                dropout: Some(0.0),
            }
        })
        .collect();
    Vit {
        conv_proj: nn::conv2d(
            p / "conv_proj",
            3,
            DIM,
            PATCH,
            nn::ConvConfig {
                stride: PATCH,
                ..Default::default()
            },
        ),
        class_token: p.var("class_token", &[1, 1, DIM], nn::Init::Const(0.)),
        pos_embedding: e.var(
            "pos_embedding",
            &[1, TOKENS, DIM],
            nn::Init::Randn {
                mean: 0.,
                stdev: 0.02,
            },
        ),
        blocks,
        ln: layer_norm(&e / "ln", DIM, 1e-6),
        head: nn::linear(p / "heads" / "head", DIM, num_classes, Default::default()),
    }
}

/// Segments: the patch embedding, each block, the head.
impl Chain for Vit {
    fn segments(&self) -> usize {
        self.blocks.len() + 2
    }

    fn segment(&self, i: usize, x: &Tensor, train: bool) -> Tensor {
        if i == 0 {
            let b = x.size()[0];
            let x = self.conv_proj.forward(x).flatten(2, 3).transpose(1, 2);
            let cls = self.class_token.expand([b, 1, DIM], false);
            (Tensor::cat(&[&cls, &x], 1) + &self.pos_embedding).dropout(0.0, train)
        } else if i <= self.blocks.len() {
            self.blocks[i - 1].forward_t(x, train)
        } else {
            let x = self.ln.forward(x);
            self.head.forward(&x.select(1, 0))
        }
    }

    fn forward_plain(&self, x: &Tensor, train: bool) -> Tensor {
        self.forward_t(x, train)
    }
}

/// As a tch user writes it in one function: the patch embeddings live to the end of
/// the forward pass (the next `let` shadows them), where the chain frees them when its
/// first segment returns.
impl ModuleT for Vit {
    fn forward_t(&self, images: &Tensor, train: bool) -> Tensor {
        let b = images.size()[0];
        let x = self.conv_proj.forward(images).flatten(2, 3).transpose(1, 2);
        let cls = self.class_token.expand([b, 1, DIM], false);
        let mut x = (Tensor::cat(&[&cls, &x], 1) + &self.pos_embedding).dropout(0.0, train);
        for block in &self.blocks {
            x = block.forward_t(&x, train);
        }
        let x = self.ln.forward(&x);
        self.head.forward(&x.select(1, 0))
    }
}
