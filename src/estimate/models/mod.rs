//! The models `tch-memprof estimate --model NAME` knows.
//!
//! - The CNNs are written in tch as torchvision defines them: the same variables (names,
//!   shapes, order of creation) and the same operations in the same order, in place where
//!   torchvision works in place, each intermediate freed where torchvision's Python code
//!   drops its last reference. A dry run of one is therefore a dry run of the PyTorch
//!   model.
//! - The transformers (GPT-2 small and medium, BERT-base, ViT-B/16, Llama 3.2 1B, Llama 3
//!   8B) are written as a tch user writes them, after the original's names and shapes,
//!   with attention through `scaled_dot_product_attention`.
//!
//! Each one's parameter count is checked against its published count (`tests/models.rs`).
//!
//! They are ordinary tch modules: train them, profile them, or read them as examples of
//! tch code that holds no tensor longer than PyTorch would.

mod bert;
mod blocks;
mod convnet;
mod gpt2;
mod llama;
mod mobilenet;
mod resnet;
mod vit;

use tch::{nn, Kind, Tensor};

use super::Input;
use crate::error::{Error, Result};

pub use bert::{bert_base, Bert};
pub use convnet::{alexnet, vgg16, ConvNet};
pub use gpt2::{gpt2, gpt2_medium, Gpt2, Gpt2Config};
pub use llama::{llama3_2_1b, llama3_8b, Llama, LlamaConfig};
pub use mobilenet::{mobilenet_v3_small, MobileNetV3};
pub use resnet::{resnet101, resnet152, resnet18, resnet50, ResNet};
pub use vit::{vit_b16, Vit};

/// Names of the built-in models, as `tch-memprof estimate --model` takes them.
pub const BUILTIN: [&str; 13] = [
    "alexnet",
    "mobilenet_v3_small",
    "resnet18",
    "resnet50",
    "resnet101",
    "resnet152",
    "vgg16",
    "vit-b16",
    "bert-base",
    "gpt2",
    "gpt2-medium",
    "llama3.2-1b",
    "llama3-8b",
];

/// The input a built-in model takes when none is given: one 224x224 RGB image for the
/// vision models, 1x512 int64 token ids for BERT, 1x1024 for GPT-2 and Llama (GPT-2's
/// whole context).
pub fn default_input(name: &str) -> Input {
    match name {
        "bert-base" => Input::new(&[1, 512], Kind::Int64),
        "gpt2" | "gpt2-medium" | "llama3.2-1b" | "llama3-8b" => Input::new(&[1, 1024], Kind::Int64),
        _ => Input::new(&[1, 3, 224, 224], Kind::Float),
    }
}

/// A model that runs as a chain of segments, each one tensor in and one out (the
/// embedding or stem, each block, the head): the shape gradient checkpointing
/// ([`crate::Checkpointed`]) takes.
pub trait Chain {
    /// Number of segments.
    fn segments(&self) -> usize;
    /// Runs segment `i` (`0..segments()`) on `x`.
    fn segment(&self, i: usize, x: &Tensor, train: bool) -> Tensor;
    /// The forward pass without checkpointing (default: every segment in order).
    fn forward_plain(&self, x: &Tensor, train: bool) -> Tensor {
        run_chain(self, x, train)
    }
}

/// Every segment of `chain` in order: its forward pass.
pub fn run_chain<C: Chain + ?Sized>(chain: &C, x: &Tensor, train: bool) -> Tensor {
    let mut h = x.shallow_clone();
    for i in 0..chain.segments() {
        h = chain.segment(i, &h, train);
    }
    h
}

/// The built-in model `name` as a chain of segments, on `p` (`None` for the models
/// without one: AlexNet, VGG-16, MobileNet v3).
pub fn build_chain(name: &str, p: &nn::Path, num_classes: i64) -> Result<Option<Box<dyn Chain>>> {
    check(name)?;
    Ok(Some(match name {
        "resnet18" => Box::new(resnet18(p, num_classes)),
        "resnet50" => Box::new(resnet50(p, num_classes)),
        "resnet101" => Box::new(resnet101(p, num_classes)),
        "resnet152" => Box::new(resnet152(p, num_classes)),
        "vit-b16" => Box::new(vit_b16(p, num_classes)),
        "bert-base" => Box::new(bert_base(p)),
        "gpt2" => Box::new(gpt2(p)),
        "gpt2-medium" => Box::new(gpt2_medium(p)),
        "llama3.2-1b" => Box::new(llama3_2_1b(p)),
        "llama3-8b" => Box::new(llama3_8b(p)),
        _ => return Ok(None),
    }))
}

/// Builds the built-in model `name` on `p`; the image models with `num_classes`
/// outputs (the language models end in their vocabulary, BERT in its pooled output).
pub fn build(name: &str, p: &nn::Path, num_classes: i64) -> Result<Box<dyn nn::ModuleT>> {
    Ok(match name {
        "alexnet" => Box::new(alexnet(p, num_classes)),
        "mobilenet_v3_small" => Box::new(mobilenet_v3_small(p, num_classes)),
        "resnet18" => Box::new(resnet18(p, num_classes)),
        "resnet50" => Box::new(resnet50(p, num_classes)),
        "resnet101" => Box::new(resnet101(p, num_classes)),
        "resnet152" => Box::new(resnet152(p, num_classes)),
        "vgg16" => Box::new(vgg16(p, num_classes)),
        "vit-b16" => Box::new(vit_b16(p, num_classes)),
        "bert-base" => Box::new(bert_base(p)),
        "gpt2" => Box::new(gpt2(p)),
        "gpt2-medium" => Box::new(gpt2_medium(p)),
        "llama3.2-1b" => Box::new(llama3_2_1b(p)),
        "llama3-8b" => Box::new(llama3_8b(p)),
        other => return Err(unknown(other)),
    })
}

/// `Ok` for a name in [`BUILTIN`], else the error that lists the known ones.
pub fn check(name: &str) -> Result<()> {
    if BUILTIN.contains(&name) {
        Ok(())
    } else {
        Err(unknown(name))
    }
}

fn unknown(name: &str) -> Error {
    Error::InvalidInput {
        name: "model",
        value: name.to_string(),
        reason: format!("unknown built-in model; known: {}", BUILTIN.join(", ")),
    }
}
