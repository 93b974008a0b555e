//! The built-in models of `tch-memprof estimate --model NAME`.

use tch::nn;

use crate::error::{Error, Result};

/// Names of the built-in models: torchvision's definitions, written in tch so that each
/// intermediate is freed where torchvision's Python code frees it ([`crate::models`]).
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
    use crate::models as m;
    Ok(match name {
        "alexnet" => Box::new(m::alexnet(p, num_classes)),
        "mobilenet_v3_small" => Box::new(m::mobilenet_v3_small(p, num_classes)),
        "resnet18" => Box::new(m::resnet18(p, num_classes)),
        "resnet50" => Box::new(m::resnet50(p, num_classes)),
        "resnet101" => Box::new(m::resnet101(p, num_classes)),
        "resnet152" => Box::new(m::resnet152(p, num_classes)),
        "vgg16" => Box::new(m::vgg16(p, num_classes)),
        other => {
            return Err(Error::InvalidConfig {
                name: "model",
                value: other.to_string(),
                reason: format!("unknown built-in model; known: {}", BUILTIN.join(", ")),
            })
        }
    })
}
