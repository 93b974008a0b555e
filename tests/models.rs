//! `tch_memprof::models` against torchvision's definitions.
//!
//! `mobilenet_v3_small`: the variables (names, shapes, trainable or buffer, order of
//! creation) and the parameter count are derived here, independently, from torchvision's
//! inverted-residual table and compared with the store, and the count with torchvision's
//! published 2,542,856; a forward pass gives `[N, classes]` in train and eval mode and
//! backward reaches every trainable variable.
//!
//! ResNet-18/50/101/152, VGG-16 and AlexNet: the trainable parameter count of each built
//! model equals torchvision's published `num_params` (its model weights tables), and the
//! same count is derived here by formula from the architecture (layer by layer, as
//! torchvision's `resnet.py`, `vgg.py` and `alexnet.py` define it).

use std::collections::HashMap;

use tch::{nn, Device, Kind, Tensor};
use tch_memprof::models::build;

/// torchvision's published `num_params` of `mobilenet_v3_small` (1000 classes).
const TORCHVISION_NUM_PARAMS: i64 = 2_542_856;

/// `_mobilenet_v3_conf("mobilenet_v3_small")`: input, kernel, expanded, out, SE, stride
/// (the activation does not change any variable).
const TABLE: [(i64, i64, i64, i64, bool, i64); 11] = [
    (16, 3, 16, 16, true, 2),
    (16, 3, 72, 24, false, 2),
    (24, 3, 88, 24, false, 1),
    (24, 5, 96, 40, true, 2),
    (40, 5, 240, 40, true, 1),
    (40, 5, 240, 40, true, 1),
    (40, 5, 120, 48, true, 1),
    (48, 5, 144, 48, true, 1),
    (48, 5, 288, 96, true, 2),
    (96, 5, 576, 96, true, 1),
    (96, 5, 576, 96, true, 1),
];
const LAST_CHANNEL: i64 = 1024;

/// torchvision's `_make_divisible(v, 8)`.
fn make_divisible_8(v: i64) -> i64 {
    let new_v = 8.max((v + 4) / 8 * 8);
    if (new_v as f64) < 0.9 * v as f64 {
        new_v + 8
    } else {
        new_v
    }
}

/// One expected variable: name, shape, trainable.
type Expected = (String, Vec<i64>, bool);

/// Every variable torchvision's `mobilenet_v3_small(num_classes)` has (less
/// `num_batches_tracked`), in torchvision's module order.
fn expected_variables(num_classes: i64) -> Vec<Expected> {
    let mut out: Vec<Expected> = Vec::new();
    let conv = |out: &mut Vec<Expected>, name: &str, c_in: i64, c_out: i64, k: i64, g: i64| {
        out.push((format!("{name}.weight"), vec![c_out, c_in / g, k, k], true));
    };
    let bn = |out: &mut Vec<Expected>, name: &str, c: i64| {
        out.push((format!("{name}.weight"), vec![c], true));
        out.push((format!("{name}.bias"), vec![c], true));
        out.push((format!("{name}.running_mean"), vec![c], false));
        out.push((format!("{name}.running_var"), vec![c], false));
    };
    let cna = |out: &mut Vec<Expected>, name: &str, c_in: i64, c_out: i64, k: i64, g: i64| {
        conv(out, &format!("{name}.0"), c_in, c_out, k, g);
        bn(out, &format!("{name}.1"), c_out);
    };
    cna(&mut out, "features.0", 3, TABLE[0].0, 3, 1);
    for (i, &(c_in, k, e, c_out, se, _stride)) in TABLE.iter().enumerate() {
        let block = format!("features.{}.block", i + 1);
        let mut j = 0;
        if e != c_in {
            cna(&mut out, &format!("{block}.{j}"), c_in, e, 1, 1);
            j += 1;
        }
        cna(&mut out, &format!("{block}.{j}"), e, e, k, e);
        j += 1;
        if se {
            let s = make_divisible_8(e / 4);
            out.push((format!("{block}.{j}.fc1.weight"), vec![s, e, 1, 1], true));
            out.push((format!("{block}.{j}.fc1.bias"), vec![s], true));
            out.push((format!("{block}.{j}.fc2.weight"), vec![e, s, 1, 1], true));
            out.push((format!("{block}.{j}.fc2.bias"), vec![e], true));
            j += 1;
        }
        cna(&mut out, &format!("{block}.{j}"), e, c_out, 1, 1);
    }
    let last_in = TABLE[TABLE.len() - 1].3;
    cna(
        &mut out,
        &format!("features.{}", TABLE.len() + 1),
        last_in,
        6 * last_in,
        1,
        1,
    );
    out.push((
        "classifier.0.weight".into(),
        vec![LAST_CHANNEL, 6 * last_in],
        true,
    ));
    out.push(("classifier.0.bias".into(), vec![LAST_CHANNEL], true));
    out.push((
        "classifier.3.weight".into(),
        vec![num_classes, LAST_CHANNEL],
        true,
    ));
    out.push(("classifier.3.bias".into(), vec![num_classes], true));
    out
}

/// Trainable parameters by formula, layer by layer from the table: a k x k convolution
/// with `g` groups has `c_out * c_in / g * k * k` weights (no bias before a batch norm),
/// a batch norm `2 * c`, a squeeze-excitation two 1x1 convolutions with biases, a linear
/// layer `c_in * c_out + c_out`.
fn parameters_by_formula(num_classes: i64) -> i64 {
    let conv_bn = |c_in: i64, c_out: i64, k: i64, g: i64| c_out * (c_in / g) * k * k + 2 * c_out;
    let mut n = conv_bn(3, 16, 3, 1);
    for &(c_in, k, e, c_out, se, _stride) in &TABLE {
        if e != c_in {
            n += conv_bn(c_in, e, 1, 1);
        }
        n += conv_bn(e, e, k, e);
        if se {
            let s = make_divisible_8(e / 4);
            n += (e * s + s) + (s * e + e);
        }
        n += conv_bn(e, c_out, 1, 1);
    }
    n += conv_bn(96, 576, 1, 1);
    n += 576 * LAST_CHANNEL + LAST_CHANNEL;
    n += LAST_CHANNEL * num_classes + num_classes;
    n
}

/// The store's trainable variables' names, in order of creation.
fn trainable_names_in_order(vs: &nn::VarStore) -> Vec<String> {
    let by_ptr: HashMap<usize, String> = vs
        .variables()
        .into_iter()
        .map(|(name, t)| (t.data_ptr() as usize, name))
        .collect();
    vs.trainable_variables()
        .iter()
        .map(|t| by_ptr[&(t.data_ptr() as usize)].clone())
        .collect()
}

#[test]
fn parameter_count_is_torchvisions() {
    assert_eq!(parameters_by_formula(1000), TORCHVISION_NUM_PARAMS);
    let vs = nn::VarStore::new(Device::Cpu);
    let _net = build("mobilenet_v3_small", &vs.root(), 1000).unwrap();
    let trainable: i64 = vs
        .trainable_variables()
        .iter()
        .map(|t| t.numel() as i64)
        .sum();
    assert_eq!(trainable, TORCHVISION_NUM_PARAMS);
    let expected_sum: i64 = expected_variables(1000)
        .iter()
        .filter(|v| v.2)
        .map(|v| v.1.iter().product::<i64>())
        .sum();
    assert_eq!(expected_sum, TORCHVISION_NUM_PARAMS);
}

#[test]
fn names_shapes_and_order_are_torchvisions() {
    for num_classes in [1000, 10] {
        let vs = nn::VarStore::new(Device::Cpu);
        let _net = build("mobilenet_v3_small", &vs.root(), num_classes).unwrap();
        let expected = expected_variables(num_classes);

        // Every variable, with its shape and whether it is trainable.
        let vars = vs.variables();
        assert_eq!(vars.len(), expected.len());
        for (name, shape, trainable) in &expected {
            let t = vars
                .get(name)
                .unwrap_or_else(|| panic!("no variable {name}"));
            assert_eq!(&t.size(), shape, "{name}");
            assert_eq!(t.requires_grad(), *trainable, "{name}");
        }

        // Trainable variables in torchvision's parameter order.
        let expected_order: Vec<&String> = expected.iter().filter(|v| v.2).map(|v| &v.0).collect();
        let got: Vec<String> = trainable_names_in_order(&vs);
        assert_eq!(got.iter().collect::<Vec<_>>(), expected_order);
        assert_eq!(got.len(), 142);
    }
}

#[test]
fn initialization_follows_torchvision() {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let _net = build("mobilenet_v3_small", &vs.root(), 1000).unwrap();
    let vars = vs.variables();
    let std = |name: &str| vars[name].std(true).double_value(&[]);
    let mean = |name: &str| vars[name].mean(Kind::Float).double_value(&[]);
    // Kaiming normal, fan-out: sqrt(2 / (c_out * k * k)).
    let w = "features.10.block.0.0.weight"; // [576, 96, 1, 1]
    let expected = (2.0f64 / 576.0).sqrt();
    assert!((std(w) / expected - 1.0).abs() < 0.02, "{}", std(w));
    let w = "features.10.block.1.0.weight"; // depthwise [576, 1, 5, 5]
    let expected = (2.0f64 / (576.0 * 25.0)).sqrt();
    assert!((std(w) / expected - 1.0).abs() < 0.05, "{}", std(w));
    assert!((std("classifier.0.weight") / 0.01 - 1.0).abs() < 0.01);
    for zero in [
        "classifier.0.bias",
        "classifier.3.bias",
        "features.1.block.1.fc1.bias",
    ] {
        assert_eq!(vars[zero].abs().max().double_value(&[]), 0.0, "{zero}");
    }
    assert_eq!(mean("features.0.1.weight"), 1.0);
    assert_eq!(std("features.0.1.weight"), 0.0);
    assert_eq!(vars["features.0.1.bias"].abs().max().double_value(&[]), 0.0);
}

#[test]
fn forward_and_backward() {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = build("mobilenet_v3_small", &vs.root(), 1000).unwrap();
    let x = Tensor::randn([2, 3, 224, 224], (Kind::Float, Device::Cpu));

    let before = vs.variables()["features.0.1.running_mean"].copy();
    let y = net.forward_t(&x, true);
    assert_eq!(y.size(), [2, 1000]);
    assert!(bool::try_from(y.isfinite().all()).unwrap());
    // Batch norm in train mode updates its running statistics.
    let after = vs.variables()["features.0.1.running_mean"].copy();
    assert!(!before.equal(&after));

    let target = Tensor::from_slice(&[3i64, 7]);
    y.cross_entropy_for_logits(&target).backward();
    let vars = vs.variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let mut with_grad = 0;
    for name in names {
        let t = &vars[name];
        if t.requires_grad() {
            let g = t.grad();
            assert!(g.defined(), "{name} has no gradient");
            assert_eq!(g.size(), t.size(), "{name}");
            with_grad += 1;
        } else {
            assert!(!t.grad().defined(), "{name}: a buffer with a gradient");
        }
    }
    assert_eq!(with_grad, vs.trainable_variables().len());

    // Eval mode: running statistics, no dropout, deterministic.
    let (a, b) = tch::no_grad(|| (net.forward_t(&x, false), net.forward_t(&x, false)));
    assert_eq!(a.size(), [2, 1000]);
    assert!(a.equal(&b));
    let after_eval = vs.variables()["features.0.1.running_mean"].copy();
    assert!(after.equal(&after_eval));
}

/// torchvision's published `num_params` (1000 classes), from its model weights tables
/// (`ResNet18_Weights.IMAGENET1K_V1.meta["num_params"]` and so on).
const TORCHVISION_PUBLISHED: [(&str, i64); 6] = [
    ("resnet18", 11_689_512),
    ("resnet50", 25_557_032),
    ("resnet101", 44_549_160),
    ("resnet152", 60_192_808),
    ("vgg16", 138_357_544),
    ("alexnet", 61_100_840),
];

/// A k x k convolution from `c_in` to `c_out` channels, with or without a bias.
fn conv(c_in: i64, c_out: i64, k: i64, bias: bool) -> i64 {
    c_out * c_in * k * k + if bias { c_out } else { 0 }
}

/// A linear layer with bias.
fn linear(c_in: i64, c_out: i64) -> i64 {
    c_in * c_out + c_out
}

/// torchvision's `ResNet`: a 7x7 stem convolution and batch norm; four stages of 64,
/// 128, 256, 512 planes; a BasicBlock is two 3x3 convolutions (expansion 1), a
/// Bottleneck 1x1, 3x3, 1x1 (expansion 4), each convolution without bias and followed by
/// a batch norm (2 parameters a channel); the first block of a stage has a 1x1
/// downsample convolution and batch norm when the stride is not 1 or the channels change;
/// then a linear layer from 512 x expansion to the classes.
fn resnet_by_formula(layers: [i64; 4], bottleneck: bool, num_classes: i64) -> i64 {
    let bn = |c: i64| 2 * c;
    let expansion = if bottleneck { 4 } else { 1 };
    let mut n = conv(3, 64, 7, false) + bn(64);
    let mut inplanes = 64;
    for (stage, (planes, blocks)) in [64, 128, 256, 512].into_iter().zip(layers).enumerate() {
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            if bottleneck {
                n += conv(inplanes, planes, 1, false) + bn(planes);
                n += conv(planes, planes, 3, false) + bn(planes);
                n += conv(planes, planes * 4, 1, false) + bn(planes * 4);
            } else {
                n += conv(inplanes, planes, 3, false) + bn(planes);
                n += conv(planes, planes, 3, false) + bn(planes);
            }
            if block == 0 && (stride != 1 || inplanes != planes * expansion) {
                n += conv(inplanes, planes * expansion, 1, false) + bn(planes * expansion);
            }
            inplanes = planes * expansion;
        }
    }
    n + linear(512 * expansion, num_classes)
}

/// torchvision's `vgg16` (configuration "D", no batch norm): thirteen 3x3 convolutions
/// with bias, then 512x7x7 -> 4096 -> 4096 -> classes.
fn vgg16_by_formula(num_classes: i64) -> i64 {
    let channels = [
        64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512,
    ];
    let mut n = 0;
    let mut c_in = 3;
    for c in channels {
        n += conv(c_in, c, 3, true);
        c_in = c;
    }
    n + linear(512 * 7 * 7, 4096) + linear(4096, 4096) + linear(4096, num_classes)
}

/// torchvision's `alexnet`: convolutions 3->64 (11x11), 64->192 (5x5), 192->384,
/// 384->256, 256->256 (3x3), all with bias, then 256x6x6 -> 4096 -> 4096 -> classes.
fn alexnet_by_formula(num_classes: i64) -> i64 {
    conv(3, 64, 11, true)
        + conv(64, 192, 5, true)
        + conv(192, 384, 3, true)
        + conv(384, 256, 3, true)
        + conv(256, 256, 3, true)
        + linear(256 * 6 * 6, 4096)
        + linear(4096, 4096)
        + linear(4096, num_classes)
}

fn trainable_parameters(build: impl FnOnce(&nn::Path)) -> i64 {
    let vs = nn::VarStore::new(Device::Cpu);
    build(&vs.root());
    vs.trainable_variables()
        .iter()
        .map(|t| t.numel() as i64)
        .sum()
}

#[test]
fn resnet_vgg_and_alexnet_parameter_counts_are_torchvisions() {
    for (name, published) in TORCHVISION_PUBLISHED {
        let (by_formula, built) = match name {
            "resnet18" => (
                resnet_by_formula([2, 2, 2, 2], false, 1000),
                trainable_parameters(|p| drop(build("resnet18", p, 1000).unwrap())),
            ),
            "resnet50" => (
                resnet_by_formula([3, 4, 6, 3], true, 1000),
                trainable_parameters(|p| drop(build("resnet50", p, 1000).unwrap())),
            ),
            "resnet101" => (
                resnet_by_formula([3, 4, 23, 3], true, 1000),
                trainable_parameters(|p| drop(build("resnet101", p, 1000).unwrap())),
            ),
            "resnet152" => (
                resnet_by_formula([3, 8, 36, 3], true, 1000),
                trainable_parameters(|p| drop(build("resnet152", p, 1000).unwrap())),
            ),
            "vgg16" => (
                vgg16_by_formula(1000),
                trainable_parameters(|p| drop(build("vgg16", p, 1000).unwrap())),
            ),
            "alexnet" => (
                alexnet_by_formula(1000),
                trainable_parameters(|p| drop(build("alexnet", p, 1000).unwrap())),
            ),
            _ => unreachable!(),
        };
        assert_eq!(by_formula, published, "{name}: the formula");
        assert_eq!(built, published, "{name}: the built model");
    }
    // Another number of classes changes only the last layer.
    assert_eq!(
        trainable_parameters(|p| drop(build("resnet18", p, 10).unwrap())),
        resnet_by_formula([2, 2, 2, 2], false, 10)
    );
}

/// The built-in transformers, built on the meta device (no host memory), hold exactly
/// their published parameter counts (every variable f32: 4 bytes each; none has a
/// buffer). Published counts: GPT-2 small 124,439,808 and medium 354,823,168 (tied
/// heads), BERT-base with its pooler 109,482,240, ViT-B/16 86,567,656 (torchvision),
/// Llama 3.2 1B 1,235,814,400 (tied) and Llama 3 8B 8,030,261,248.
#[test]
fn built_in_transformers_have_their_published_parameter_counts() {
    for (name, published) in [
        ("gpt2", 124_439_808u64),
        ("gpt2-medium", 354_823_168),
        ("bert-base", 109_482_240),
        ("vit-b16", 86_567_656),
        ("llama3.2-1b", 1_235_814_400),
        ("llama3-8b", 8_030_261_248),
    ] {
        let m = tch_memprof::estimate::Model::builtin(name).unwrap();
        assert_eq!(m.weights_bytes(), 4 * published, "{name}");
    }
}
