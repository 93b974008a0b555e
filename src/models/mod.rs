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

use crate::error::{Error, Result};
use crate::workload::Input;

pub use gpt2::{Gpt2, Gpt2Config};

use bert::bert_base;
use convnet::{alexnet, vgg16};
use gpt2::{gpt2, gpt2_medium};
use llama::{llama3_2_1b, llama3_8b};
use mobilenet::mobilenet_v3_small;
use resnet::{resnet101, resnet152, resnet18, resnet50};
use vit::vit_b16;

/// A built-in model: its name as `tch-memprof estimate --model` takes it, the input it
/// takes when none is given, and how it is built. [`BUILTINS`] is the one list of
/// them: the names, the default inputs, the builders and the CLI's help come from it.
pub struct Builtin {
    /// The name `--model` takes.
    pub name: &'static str,
    /// The input it takes when none is given: one 224x224 RGB image for the vision
    /// models, int64 token ids for the language models (BERT: 1x512; GPT-2 and Llama:
    /// 1x1024, GPT-2's whole context).
    pub default_input: (&'static [i64], Kind),
    /// Builds it on a path, the image models with the number of classes given (the
    /// language models end in their vocabulary, BERT in its pooled output).
    pub build: fn(&nn::Path, i64) -> Built,
}

/// A built-in model as built: a chain of segments, which activation checkpointing
/// takes, or a module without one (AlexNet, VGG-16, MobileNet v3).
pub enum Built {
    /// A chain of segments, also a module.
    Chain(Box<dyn ChainModule>),
    /// A module only.
    Module(Box<dyn nn::ModuleT>),
}

impl Built {
    /// The model as a module, chain or not.
    pub fn into_module(self) -> Box<dyn nn::ModuleT> {
        match self {
            Built::Chain(c) => c,
            Built::Module(m) => m,
        }
    }
}

/// A chain of segments that is also a module: what the built-in chains are.
pub trait ChainModule: Chain + nn::ModuleT {}
impl<T: Chain + nn::ModuleT> ChainModule for T {}

const IMAGE: (&[i64], Kind) = (&[1, 3, 224, 224], Kind::Float);
const TOKENS: (&[i64], Kind) = (&[1, 1024], Kind::Int64);

/// Every built-in model, in the order the CLI's help lists them.
pub const BUILTINS: [Builtin; 13] = [
    Builtin {
        name: "alexnet",
        default_input: IMAGE,
        build: |p, n| Built::Module(Box::new(alexnet(p, n))),
    },
    Builtin {
        name: "mobilenet_v3_small",
        default_input: IMAGE,
        build: |p, n| Built::Module(Box::new(mobilenet_v3_small(p, n))),
    },
    Builtin {
        name: "resnet18",
        default_input: IMAGE,
        build: |p, n| Built::Chain(Box::new(resnet18(p, n))),
    },
    Builtin {
        name: "resnet50",
        default_input: IMAGE,
        build: |p, n| Built::Chain(Box::new(resnet50(p, n))),
    },
    Builtin {
        name: "resnet101",
        default_input: IMAGE,
        build: |p, n| Built::Chain(Box::new(resnet101(p, n))),
    },
    Builtin {
        name: "resnet152",
        default_input: IMAGE,
        build: |p, n| Built::Chain(Box::new(resnet152(p, n))),
    },
    Builtin {
        name: "vgg16",
        default_input: IMAGE,
        build: |p, n| Built::Module(Box::new(vgg16(p, n))),
    },
    Builtin {
        name: "vit-b16",
        default_input: IMAGE,
        build: |p, n| Built::Chain(Box::new(vit_b16(p, n))),
    },
    Builtin {
        name: "bert-base",
        default_input: (&[1, 512], Kind::Int64),
        build: |p, _| Built::Chain(Box::new(bert_base(p))),
    },
    Builtin {
        name: "gpt2",
        default_input: TOKENS,
        build: |p, _| Built::Chain(Box::new(gpt2(p))),
    },
    Builtin {
        name: "gpt2-medium",
        default_input: TOKENS,
        build: |p, _| Built::Chain(Box::new(gpt2_medium(p))),
    },
    Builtin {
        name: "llama3.2-1b",
        default_input: TOKENS,
        build: |p, _| Built::Chain(Box::new(llama3_2_1b(p))),
    },
    Builtin {
        name: "llama3-8b",
        default_input: TOKENS,
        build: |p, _| Built::Chain(Box::new(llama3_8b(p))),
    },
];

/// Names of the built-in models, as `tch-memprof estimate --model` takes them (those
/// of [`BUILTINS`], in its order).
pub(crate) const BUILTIN: [&str; BUILTINS.len()] = {
    let mut names = [""; BUILTINS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = BUILTINS[i].name;
        i += 1;
    }
    names
};

/// The built-in model `name`, or the error that lists the known ones.
pub fn builtin(name: &str) -> Result<&'static Builtin> {
    BUILTINS
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| unknown(name))
}

/// The input a built-in model takes when none is given ([`Builtin::default_input`];
/// an image for a name not among them).
pub(crate) fn default_input(name: &str) -> Input {
    let (shape, kind) = builtin(name).map_or(IMAGE, |b| b.default_input);
    Input::new(shape, kind)
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
pub(crate) fn run_chain<C: Chain + ?Sized>(chain: &C, x: &Tensor, train: bool) -> Tensor {
    let mut h = x.shallow_clone();
    for i in 0..chain.segments() {
        h = chain.segment(i, &h, train);
    }
    h
}

/// Builds the built-in model `name` on `p`; the image models with `num_classes`
/// outputs (the language models end in their vocabulary, BERT in its pooled output).
pub fn build(name: &str, p: &nn::Path, num_classes: i64) -> Result<Box<dyn nn::ModuleT>> {
    Ok((builtin(name)?.build)(p, num_classes).into_module())
}

fn unknown(name: &str) -> Error {
    Error::InvalidInput {
        name: "model",
        value: name.to_string(),
        reason: format!("unknown built-in model; known: {}", BUILTIN.join(", ")),
    }
}
