//! VGG-16 and AlexNet as torchvision runs them (in-place ReLUs, each intermediate freed
//! where torchvision frees it).

use tch::nn::{self, ModuleT};
use tch::Tensor;

/// A layer of a VGG or AlexNet feature extractor.
#[derive(Debug)]
enum Feature {
    /// Convolution followed by an in-place ReLU.
    ConvRelu(nn::Conv2D),
    /// Max pooling (kernel, stride).
    MaxPool(i64, i64),
}

/// The classifier of VGG and AlexNet: (dropout before each hidden linear layer?, layers).
#[derive(Debug)]
struct Classifier {
    dropout_first: bool,
    linears: Vec<nn::Linear>,
}

impl Classifier {
    fn forward(&self, mut x: Tensor, train: bool) -> Tensor {
        let last = self.linears.len() - 1;
        for (i, l) in self.linears.iter().enumerate() {
            if self.dropout_first && i < last {
                x = x.dropout(0.5, train);
            }
            x = x.apply(l);
            if i < last {
                let _ = x.relu_();
                if !self.dropout_first {
                    x = x.dropout(0.5, train);
                }
            }
        }
        x
    }
}

/// torchvision's VGG-16 (configuration D, no batch norm) or AlexNet.
#[derive(Debug)]
pub struct ConvNet {
    features: Vec<Feature>,
    pool: i64,
    classifier: Classifier,
}

impl ModuleT for ConvNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = xs.shallow_clone();
        for f in &self.features {
            match f {
                Feature::ConvRelu(c) => {
                    x = x.apply(c);
                    let _ = x.relu_();
                }
                Feature::MaxPool(k, s) => {
                    x = x.max_pool2d([*k, *k], [*s, *s], [0, 0], [1, 1], false);
                }
            }
        }
        x = x.adaptive_avg_pool2d([self.pool, self.pool]);
        x = x.flatten(1, -1);
        self.classifier.forward(x, train)
    }
}

/// VGG-16 (torchvision's `vgg16`: configuration D, without batch norm).
pub fn vgg16(p: &nn::Path, num_classes: i64) -> ConvNet {
    const CFG: [i64; 18] = [
        64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
    ];
    let f = p / "features";
    let mut features = Vec::new();
    let (mut c_in, mut index) = (3, 0);
    for c in CFG {
        if c == 0 {
            features.push(Feature::MaxPool(2, 2));
            index += 1;
        } else {
            let config = nn::ConvConfig {
                padding: 1,
                ..Default::default()
            };
            features.push(Feature::ConvRelu(nn::conv2d(
                &f / index.to_string(),
                c_in,
                c,
                3,
                config,
            )));
            c_in = c;
            index += 2;
        }
    }
    let c = p / "classifier";
    let classifier = Classifier {
        dropout_first: false,
        linears: vec![
            nn::linear(&c / "0", 512 * 7 * 7, 4096, Default::default()),
            nn::linear(&c / "3", 4096, 4096, Default::default()),
            nn::linear(&c / "6", 4096, num_classes, Default::default()),
        ],
    };
    ConvNet {
        features,
        pool: 7,
        classifier,
    }
}

/// AlexNet (torchvision's `alexnet`).
pub fn alexnet(p: &nn::Path, num_classes: i64) -> ConvNet {
    let f = p / "features";
    let conv = |i: &str, c_in, c_out, k, stride, padding| {
        let config = nn::ConvConfig {
            stride,
            padding,
            ..Default::default()
        };
        Feature::ConvRelu(nn::conv2d(&f / i, c_in, c_out, k, config))
    };
    let features = vec![
        conv("0", 3, 64, 11, 4, 2),
        Feature::MaxPool(3, 2),
        conv("3", 64, 192, 5, 1, 2),
        Feature::MaxPool(3, 2),
        conv("6", 192, 384, 3, 1, 1),
        conv("8", 384, 256, 3, 1, 1),
        conv("10", 256, 256, 3, 1, 1),
        Feature::MaxPool(3, 2),
    ];
    let c = p / "classifier";
    let classifier = Classifier {
        dropout_first: true,
        linears: vec![
            nn::linear(&c / "1", 256 * 6 * 6, 4096, Default::default()),
            nn::linear(&c / "4", 4096, 4096, Default::default()),
            nn::linear(&c / "6", 4096, num_classes, Default::default()),
        ],
    };
    ConvNet {
        features,
        pool: 6,
        classifier,
    }
}
