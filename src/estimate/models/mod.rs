//! The models `tch-memprof estimate --model NAME` knows, written in tch as torchvision
//! defines them: the same variables (names, shapes, order of creation) and the same
//! operations in the same order, in place where torchvision works in place, each
//! intermediate freed where torchvision's Python code drops its last reference. A dry run
//! of one is therefore a dry run of the PyTorch model. Each one's parameter count is
//! checked against torchvision's published count (`tests/models.rs`).
//!
//! They are ordinary tch modules: train them, profile them, or read them as examples of
//! tch code that holds no tensor longer than PyTorch would.

mod convnet;
mod mobilenet;
mod resnet;

use tch::nn;

use crate::error::{Error, Result};

pub use convnet::{alexnet, vgg16, ConvNet};
pub use mobilenet::{mobilenet_v3_small, MobileNetV3};
pub use resnet::{resnet101, resnet152, resnet18, resnet50, ResNet};

/// Names of the built-in models, as `tch-memprof estimate --model` takes them.
pub const BUILTIN: [&str; 7] = [
    "alexnet",
    "mobilenet_v3_small",
    "resnet18",
    "resnet50",
    "resnet101",
    "resnet152",
    "vgg16",
];

/// Builds the built-in model `name` on `p` with `num_classes` outputs.
pub fn build(name: &str, p: &nn::Path, num_classes: i64) -> Result<Box<dyn nn::ModuleT>> {
    Ok(match name {
        "alexnet" => Box::new(alexnet(p, num_classes)),
        "mobilenet_v3_small" => Box::new(mobilenet_v3_small(p, num_classes)),
        "resnet18" => Box::new(resnet18(p, num_classes)),
        "resnet50" => Box::new(resnet50(p, num_classes)),
        "resnet101" => Box::new(resnet101(p, num_classes)),
        "resnet152" => Box::new(resnet152(p, num_classes)),
        "vgg16" => Box::new(vgg16(p, num_classes)),
        other => {
            return Err(Error::InvalidInput {
                name: "model",
                value: other.to_string(),
                reason: format!("unknown built-in model; known: {}", BUILTIN.join(", ")),
            })
        }
    })
}
