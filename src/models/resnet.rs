//! ResNets as torchvision runs them.
//!
//! tch's own `vision` models compute each block in one chained expression: Rust keeps
//! every intermediate of an expression alive until its statement ends, and they use
//! out-of-place ReLUs. That is faithful to a tch user's run of those models, but not to
//! torchvision's, where `x = f(x)` frees the previous tensor as soon as the new one
//! exists and ReLUs run in place. These definitions release each intermediate exactly
//! where torchvision's Python code drops its last reference, so a dry run of them is a
//! dry run of the PyTorch model.

use tch::nn::{self, ModuleT};
use tch::Tensor;

use super::Chain;

/// A convolution without bias followed by batch norm (torchvision's `conv` + `bn`).
#[derive(Debug)]
struct ConvBn {
    conv: nn::Conv2D,
    bn: nn::BatchNorm,
}

impl ConvBn {
    fn new(conv: &nn::Path, bn: &nn::Path, c_in: i64, c_out: i64, k: i64, stride: i64) -> ConvBn {
        let config = nn::ConvConfig {
            stride,
            padding: k / 2,
            bias: false,
            ..Default::default()
        };
        ConvBn {
            conv: nn::conv2d(conv, c_in, c_out, k, config),
            bn: nn::batch_norm2d(bn, c_out, Default::default()),
        }
    }

    /// `out = bn(conv(x))`: the convolution's output is freed once batch norm's exists.
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut out = x.apply(&self.conv);
        out = out.apply_t(&self.bn, train);
        out
    }
}

/// A residual block: torchvision's `BasicBlock` (two 3x3 convolutions) or `Bottleneck`
/// (1x1, 3x3, 1x1 with 4x expansion).
#[derive(Debug)]
struct ResidualBlock {
    convs: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

impl ResidualBlock {
    fn new(p: &nn::Path, c_in: i64, planes: i64, stride: i64, bottleneck: bool) -> ResidualBlock {
        let expansion = if bottleneck { 4 } else { 1 };
        let c_out = planes * expansion;
        let convs = if bottleneck {
            vec![
                ConvBn::new(&(p / "conv1"), &(p / "bn1"), c_in, planes, 1, 1),
                ConvBn::new(&(p / "conv2"), &(p / "bn2"), planes, planes, 3, stride),
                ConvBn::new(&(p / "conv3"), &(p / "bn3"), planes, c_out, 1, 1),
            ]
        } else {
            vec![
                ConvBn::new(&(p / "conv1"), &(p / "bn1"), c_in, planes, 3, stride),
                ConvBn::new(&(p / "conv2"), &(p / "bn2"), planes, planes, 3, 1),
            ]
        };
        let downsample = (stride != 1 || c_in != c_out).then(|| {
            let d = p / "downsample";
            ConvBn::new(&(&d / "0"), &(&d / "1"), c_in, c_out, 1, stride)
        });
        ResidualBlock { convs, downsample }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut out = self.convs[0].forward(x, train);
        for cb in &self.convs[1..] {
            let _ = out.relu_();
            out = cb.forward(&out, train);
        }
        match &self.downsample {
            Some(d) => {
                let identity = d.forward(x, train);
                let _ = out.g_add_(&identity);
            }
            None => {
                let _ = out.g_add_(x);
            }
        }
        let _ = out.relu_();
        out
    }
}

/// torchvision's ResNet with `blocks` residual blocks per stage.
#[derive(Debug)]
pub struct ResNet {
    stem: ConvBn,
    stages: Vec<Vec<ResidualBlock>>,
    fc: nn::Linear,
}

impl ResNet {
    fn new(p: &nn::Path, blocks: [usize; 4], bottleneck: bool, num_classes: i64) -> ResNet {
        let stem = ConvBn::new(&(p / "conv1"), &(p / "bn1"), 3, 64, 7, 2);
        let expansion = if bottleneck { 4 } else { 1 };
        let mut c_in = 64;
        let mut stages = Vec::new();
        for (s, (&n, planes)) in blocks.iter().zip([64, 128, 256, 512]).enumerate() {
            let stage = p / format!("layer{}", s + 1);
            let mut layer = Vec::new();
            for b in 0..n {
                let stride = if s > 0 && b == 0 { 2 } else { 1 };
                layer.push(ResidualBlock::new(
                    &(&stage / b.to_string()),
                    c_in,
                    planes,
                    stride,
                    bottleneck,
                ));
                c_in = planes * expansion;
            }
            stages.push(layer);
        }
        let fc = nn::linear(p / "fc", 512 * expansion, num_classes, Default::default());
        ResNet { stem, stages, fc }
    }
}

/// Segments: the stem, each residual block, the head.
impl Chain for ResNet {
    fn segments(&self) -> usize {
        self.stages.iter().map(Vec::len).sum::<usize>() + 2
    }

    fn segment(&self, i: usize, x: &Tensor, train: bool) -> Tensor {
        let blocks = self.segments() - 2;
        if i == 0 {
            let mut x = self.stem.forward(x, train);
            let _ = x.relu_();
            x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)
        } else if i <= blocks {
            let block = self
                .stages
                .iter()
                .flatten()
                .nth(i - 1)
                .expect("a block per segment");
            block.forward(x, train)
        } else {
            let x = x.adaptive_avg_pool2d([1, 1]);
            let x = x.flatten(1, -1);
            x.apply(&self.fc)
        }
    }

    fn forward_plain(&self, x: &Tensor, train: bool) -> Tensor {
        self.forward_t(x, train)
    }
}

/// As torchvision runs it: each feature map dropped where torchvision drops it (the
/// last block's output before the head's linear layer, which the chain keeps to the end
/// of its segment).
impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = self.stem.forward(xs, train);
        let _ = x.relu_();
        x = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for stage in &self.stages {
            for block in stage {
                x = block.forward(&x, train);
            }
        }
        x = x.adaptive_avg_pool2d([1, 1]);
        x = x.flatten(1, -1);
        x.apply(&self.fc)
    }
}

/// ResNet-18 (torchvision's `resnet18`).
pub fn resnet18(p: &nn::Path, num_classes: i64) -> ResNet {
    ResNet::new(p, [2, 2, 2, 2], false, num_classes)
}

/// ResNet-50 (torchvision's `resnet50`).
pub fn resnet50(p: &nn::Path, num_classes: i64) -> ResNet {
    ResNet::new(p, [3, 4, 6, 3], true, num_classes)
}

/// ResNet-101 (torchvision's `resnet101`).
pub fn resnet101(p: &nn::Path, num_classes: i64) -> ResNet {
    ResNet::new(p, [3, 4, 23, 3], true, num_classes)
}

/// ResNet-152 (torchvision's `resnet152`).
pub fn resnet152(p: &nn::Path, num_classes: i64) -> ResNet {
    ResNet::new(p, [3, 8, 36, 3], true, num_classes)
}
