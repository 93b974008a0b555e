//! [`mobilenet_v3_small`](super::mobilenet_v3_small) is torchvision's `mobilenet_v3_small` (torchvision 0.26,
//! `torchvision/models/mobilenetv3.py` with `Conv2dNormActivation` and
//! `SqueezeExcitation` from `torchvision/ops/misc.py`), at width 1.0, without the reduced
//! tail and without dilation:
//!
//! - the same layers, variable names (`features.1.block.1.fc1.weight`,
//!   `classifier.3.bias`: torchvision's `state_dict` keys), shapes and order of
//!   creation (modules in order; in a convolution the weight, then the bias; in a batch
//!   norm the weight, the bias, `running_mean`, `running_var`);
//! - the same operations in the same order, in place where torchvision works in place:
//!   the ReLU and Hardswish of every `Conv2dNormActivation` (`inplace=True`, its
//!   default), the residual `result += input`, the classifier's Hardswish and Dropout
//!   (both `inplace=True`); out of place where torchvision is: the squeeze-excitation's
//!   ReLU and Hardsigmoid (built without `inplace`) and its `scale * input`. What the
//!   forward pass allocates, keeps for backward and frees is therefore what torchvision's
//!   does.
//!
//! Differences from torchvision:
//!
//! - tch's batch norm has no `num_batches_tracked` buffer, so the store has no
//!   `*.num_batches_tracked` variables (torchvision's `state_dict` has one 8-byte `int64`
//!   scalar per batch norm, 34 in all). Nothing reads it here: with a fixed momentum
//!   (0.01) PyTorch only counts batches in it.
//! - Initialization draws from the same distributions (Kaiming normal with fan-out and
//!   gain √2 for convolutions, ones and zeros for batch norms, N(0, 0.01) for linear
//!   weights, zeros for biases) but not the same numbers: tch's generator calls differ,
//!   and tch draws each variable once where PyTorch first applies the layers' default
//!   initialization and then overwrites it.
//! - The running statistics are VarStore variables that do not require gradients
//!   (buffers, as in torchvision), created right after their layer's weight and bias.

use tch::nn::{self, Module, ModuleT};
use tch::Tensor;

/// torchvision's `_make_divisible(v, divisor)` (from the TensorFlow MobileNet code): the
/// multiple of `divisor` nearest to `v`, at least `divisor`, and not more than 10% below
/// `v`.
fn make_divisible(v: f64, divisor: i64) -> i64 {
    let mut new_v = divisor.max((v + divisor as f64 / 2.0) as i64 / divisor * divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

/// The activation that closes a `Conv2dNormActivation`; always in place
/// (torchvision's `inplace=True` default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    /// `activation_layer=None`: the projection of an inverted residual block.
    Identity,
    /// `nn.ReLU(inplace=True)`.
    Relu,
    /// `nn.Hardswish(inplace=True)`.
    Hardswish,
}

/// Kaiming normal, fan-out, gain √2: torchvision's `kaiming_normal_(w, mode="fan_out")`
/// (its default `leaky_relu` with slope 0 has ReLU's gain).
const CONV_INIT: nn::Init = nn::Init::Kaiming {
    dist: nn::init::NormalOrUniform::Normal,
    fan: nn::init::FanInOut::FanOut,
    non_linearity: nn::init::NonLinearity::ReLU,
};

/// A 2-D convolution whose weight is created before its bias (tch's `nn::conv2d`
/// creates the bias first): the weight by `nn::conv2d` without bias, then the bias.
fn conv2d(p: &nn::Path, c_in: i64, c_out: i64, k: i64, mut config: nn::ConvConfig) -> nn::Conv2D {
    let bias = config.bias;
    config.bias = false;
    let mut conv = nn::conv2d(p, c_in, c_out, k, config);
    if bias {
        conv.bs = Some(p.var("bias", &[c_out], config.bs_init));
    }
    conv
}

/// torchvision's `nn.Linear(c_in, c_out)` as `MobileNetV3` initializes it (weight
/// N(0, 0.01), bias zeros), weight created before bias (tch's `nn::linear` creates the
/// bias first).
fn linear(p: &nn::Path, c_in: i64, c_out: i64) -> nn::Linear {
    let config = nn::LinearConfig {
        ws_init: nn::Init::Randn {
            mean: 0.,
            stdev: 0.01,
        },
        bs_init: None,
        bias: false,
    };
    let mut linear = nn::linear(p, c_in, c_out, config);
    linear.bs = Some(p.var("bias", &[c_out], nn::Init::Const(0.)));
    linear
}

/// torchvision's `Conv2dNormActivation`: `0` a convolution without bias, padding
/// `(k - 1) / 2`; `1` `BatchNorm2d(eps=0.001, momentum=0.01)`; `2` the activation.
#[derive(Debug)]
struct ConvNormActivation {
    conv: nn::Conv2D,
    bn: nn::BatchNorm,
    activation: Activation,
}

impl ConvNormActivation {
    fn new(
        p: &nn::Path,
        c_in: i64,
        c_out: i64,
        kernel: i64,
        stride: i64,
        groups: i64,
        activation: Activation,
    ) -> Self {
        let dilation = 1;
        let conv = conv2d(
            &(p / 0),
            c_in,
            c_out,
            kernel,
            nn::ConvConfig {
                stride,
                padding: (kernel - 1) / 2 * dilation,
                dilation,
                groups,
                bias: false,
                ws_init: CONV_INIT,
                ..Default::default()
            },
        );
        let bn = nn::batch_norm2d(
            p / 1,
            c_out,
            nn::BatchNormConfig {
                eps: 1e-3,
                momentum: 0.01,
                ws_init: nn::Init::Const(1.),
                bs_init: nn::Init::Const(0.),
                ..Default::default()
            },
        );
        ConvNormActivation {
            conv,
            bn,
            activation,
        }
    }
}

impl ModuleT for ConvNormActivation {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut ys = self.conv.forward(xs).apply_t(&self.bn, train);
        match self.activation {
            Activation::Identity => ys,
            Activation::Relu => ys.relu_(),
            Activation::Hardswish => ys.hardswish_(),
        }
    }
}

/// torchvision's `SqueezeExcitation(c, squeeze, scale_activation=nn.Hardsigmoid)`:
/// adaptive average pool to 1x1, `fc1` (1x1 convolution with bias), ReLU, `fc2`,
/// Hardsigmoid (both activations out of place), then `scale * input`.
#[derive(Debug)]
struct SqueezeExcitation {
    fc1: nn::Conv2D,
    fc2: nn::Conv2D,
}

impl SqueezeExcitation {
    fn new(p: &nn::Path, channels: i64, squeeze: i64) -> Self {
        let config = nn::ConvConfig {
            ws_init: CONV_INIT,
            bs_init: nn::Init::Const(0.),
            ..Default::default()
        };
        SqueezeExcitation {
            fc1: conv2d(&(p / "fc1"), channels, squeeze, 1, config),
            fc2: conv2d(&(p / "fc2"), squeeze, channels, 1, config),
        }
    }
}

impl Module for SqueezeExcitation {
    fn forward(&self, xs: &Tensor) -> Tensor {
        // One statement per step, each result replacing the previous one: every
        // intermediate is released when torchvision's is.
        let mut scale = xs.adaptive_avg_pool2d([1, 1]);
        scale = self.fc1.forward(&scale);
        scale = scale.relu();
        scale = self.fc2.forward(&scale);
        scale = scale.hardsigmoid();
        &scale * xs
    }
}

/// One row of torchvision's inverted-residual table (`InvertedResidualConfig`).
#[derive(Debug, Clone, Copy)]
struct BlockConfig {
    input_channels: i64,
    kernel: i64,
    expanded_channels: i64,
    out_channels: i64,
    use_se: bool,
    /// `"HS"` (Hardswish) rather than `"RE"` (ReLU).
    use_hs: bool,
    stride: i64,
}

/// `_mobilenet_v3_conf("mobilenet_v3_small")` at width 1.0, dilation 1:
/// (input, kernel, expanded, out, SE, activation, stride).
const SMALL: [BlockConfig; 11] = {
    const fn b(i: i64, k: i64, e: i64, o: i64, se: bool, hs: bool, s: i64) -> BlockConfig {
        BlockConfig {
            input_channels: i,
            kernel: k,
            expanded_channels: e,
            out_channels: o,
            use_se: se,
            use_hs: hs,
            stride: s,
        }
    }
    const RE: bool = false;
    const HS: bool = true;
    [
        b(16, 3, 16, 16, true, RE, 2),
        b(16, 3, 72, 24, false, RE, 2),
        b(24, 3, 88, 24, false, RE, 1),
        b(24, 5, 96, 40, true, HS, 2),
        b(40, 5, 240, 40, true, HS, 1),
        b(40, 5, 240, 40, true, HS, 1),
        b(40, 5, 120, 48, true, HS, 1),
        b(48, 5, 144, 48, true, HS, 1),
        b(48, 5, 288, 96, true, HS, 2),
        b(96, 5, 576, 96, true, HS, 1),
        b(96, 5, 576, 96, true, HS, 1),
    ]
};

/// `last_channel` of mobilenet_v3_small: `adjust_channels(1024)`.
const SMALL_LAST_CHANNEL: i64 = 1024;

/// A child of an inverted residual's `block`.
#[derive(Debug)]
enum BlockLayer {
    ConvNormActivation(ConvNormActivation),
    SqueezeExcitation(SqueezeExcitation),
}

impl ModuleT for BlockLayer {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        match self {
            BlockLayer::ConvNormActivation(layer) => layer.forward_t(xs, train),
            BlockLayer::SqueezeExcitation(layer) => layer.forward(xs),
        }
    }
}

/// torchvision's `InvertedResidual`: `block` is expand (1x1, when the expanded width
/// differs from the input's), depthwise (k x k, groups = width), squeeze-excitation
/// (when set), project (1x1, no activation); the input is added in place when the
/// stride is 1 and the widths match.
#[derive(Debug)]
struct InvertedResidual {
    block: Vec<BlockLayer>,
    use_res_connect: bool,
}

impl InvertedResidual {
    fn new(p: &nn::Path, cnf: &BlockConfig) -> Self {
        let p = p / "block";
        let activation = if cnf.use_hs {
            Activation::Hardswish
        } else {
            Activation::Relu
        };
        let e = cnf.expanded_channels;
        let mut block = Vec::with_capacity(4);
        // expand
        if e != cnf.input_channels {
            let layer = ConvNormActivation::new(
                &(&p / block.len()),
                cnf.input_channels,
                e,
                1,
                1,
                1,
                activation,
            );
            block.push(BlockLayer::ConvNormActivation(layer));
        }
        // depthwise
        let layer = ConvNormActivation::new(
            &(&p / block.len()),
            e,
            e,
            cnf.kernel,
            cnf.stride,
            e,
            activation,
        );
        block.push(BlockLayer::ConvNormActivation(layer));
        if cnf.use_se {
            let squeeze = make_divisible((e / 4) as f64, 8);
            let layer = SqueezeExcitation::new(&(&p / block.len()), e, squeeze);
            block.push(BlockLayer::SqueezeExcitation(layer));
        }
        // project
        let layer = ConvNormActivation::new(
            &(&p / block.len()),
            e,
            cnf.out_channels,
            1,
            1,
            1,
            Activation::Identity,
        );
        block.push(BlockLayer::ConvNormActivation(layer));
        InvertedResidual {
            block,
            use_res_connect: cnf.stride == 1 && cnf.input_channels == cnf.out_channels,
        }
    }
}

/// `nn.Sequential`'s forward: each child's output replaces its input, which is released
/// then (the first input stays with the caller).
fn sequential<'a>(
    mut layers: impl Iterator<Item = &'a dyn ModuleT>,
    xs: &Tensor,
    train: bool,
) -> Tensor {
    let mut x = match layers.next() {
        Some(first) => first.forward_t(xs, train),
        None => return xs.shallow_clone(),
    };
    for layer in layers {
        x = layer.forward_t(&x, train);
    }
    x
}

impl ModuleT for InvertedResidual {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut result = sequential(self.block.iter().map(|l| l as &dyn ModuleT), xs, train);
        if self.use_res_connect {
            // `result += input`: `Tensor.__iadd__`, in place (`add_`)
            let _ = result.g_add_(xs);
        }
        result
    }
}

/// torchvision's `MobileNetV3`, as built by [`mobilenet_v3_small`]: `features` (a 3x3
/// stride-2 convolution to 16 channels with Hardswish, the eleven inverted-residual
/// blocks, a 1x1 convolution to 576 channels with Hardswish), adaptive average pool to
/// 1x1, flatten, `classifier` (`0` Linear(576, 1024), `1` Hardswish, `2` Dropout(0.2),
/// `3` Linear(1024, classes)).
///
/// `forward_t(xs, train)`: `xs` is `[N, 3, H, W]` (224x224 in torchvision's recipe), the
/// result `[N, classes]` logits; `train` selects batch statistics in batch norm (and
/// updates the running ones) and enables dropout. Intermediate results are released at
/// the moments torchvision's forward releases them.
#[derive(Debug)]
pub struct MobileNetV3 {
    first: ConvNormActivation,
    blocks: Vec<InvertedResidual>,
    last: ConvNormActivation,
    classifier_0: nn::Linear,
    classifier_3: nn::Linear,
    dropout: f64,
}

impl MobileNetV3 {
    /// `self.features(x)`.
    fn features(&self, xs: &Tensor, train: bool) -> Tensor {
        let layers = std::iter::once(&self.first as &dyn ModuleT)
            .chain(self.blocks.iter().map(|b| b as &dyn ModuleT))
            .chain(std::iter::once(&self.last as &dyn ModuleT));
        sequential(layers, xs, train)
    }

    /// `self.classifier(x)`: Linear, Hardswish and Dropout in place, Linear.
    fn classifier(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = self.classifier_0.forward(xs);
        x = x.hardswish_();
        x = x.dropout_(self.dropout, train);
        self.classifier_3.forward(&x)
    }
}

impl ModuleT for MobileNetV3 {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = self.features(xs, train);
        x = x.adaptive_avg_pool2d([1, 1]);
        x = x.flatten(1, -1);
        self.classifier(&x, train)
    }
}

/// torchvision's `mobilenet_v3_small(num_classes=num_classes)`, untrained: 2,542,856
/// trainable parameters with 1000 classes, plus 12,112 buffer values (the
/// `running_mean` and `running_var` of 34 batch norms).
///
/// Variables are created under `p` with torchvision's `state_dict` names
/// (`features.0.0.weight` ... `classifier.3.bias`), except that tch's batch norm has no
/// `num_batches_tracked` buffer (nothing reads it with a fixed momentum), and
/// initialization draws from torchvision's distributions but not the same numbers.
pub fn mobilenet_v3_small(p: &nn::Path, num_classes: i64) -> MobileNetV3 {
    let features = p / "features";
    let first = ConvNormActivation::new(
        &(&features / 0),
        3,
        SMALL[0].input_channels,
        3,
        2,
        1,
        Activation::Hardswish,
    );
    let blocks: Vec<InvertedResidual> = SMALL
        .iter()
        .enumerate()
        .map(|(i, cnf)| InvertedResidual::new(&(&features / (i + 1)), cnf))
        .collect();
    let last_in = SMALL[SMALL.len() - 1].out_channels;
    let last_out = 6 * last_in;
    let last = ConvNormActivation::new(
        &(&features / (SMALL.len() + 1)),
        last_in,
        last_out,
        1,
        1,
        1,
        Activation::Hardswish,
    );
    let classifier = p / "classifier";
    let last_channel = make_divisible(SMALL_LAST_CHANNEL as f64, 8);
    let classifier_0 = linear(&(&classifier / 0), last_out, last_channel);
    let classifier_3 = linear(&(&classifier / 3), last_channel, num_classes);
    MobileNetV3 {
        first,
        blocks,
        last,
        classifier_0,
        classifier_3,
        dropout: 0.2,
    }
}

#[cfg(test)]
mod tests {
    use super::make_divisible;

    #[test]
    fn make_divisible_matches_torchvision() {
        // _make_divisible(v, 8) for the squeeze widths of mobilenet_v3_small.
        let cases = [
            (4, 8),
            (24, 24),
            (60, 64),
            (30, 32),
            (36, 40),
            (72, 72),
            (144, 144),
        ];
        for (v, expected) in cases {
            assert_eq!(make_divisible(v as f64, 8), expected, "v = {v}");
        }
        assert_eq!(make_divisible(1024.0, 8), 1024);
        // Rounding that would lose more than 10% goes up one step.
        assert_eq!(make_divisible(10.0, 8), 16);
    }
}
