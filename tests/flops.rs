//! FLOPs of single ops against closed-form formulas (a multiply-add counts 2; the
//! per-element costs are the documented table in docs/step-anatomy.md).

mod common;

use tch::{Device, Kind, Tensor};
use tch_memprof::{MemoryProfiler, StepProfile};

/// Runs `f` as step 1 of a fresh profiler and returns its profile.
fn profile(f: impl FnOnce()) -> StepProfile {
    let _guard = common::serial();
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(1)
        .build()
        .unwrap();
    f();
    prof.record_stats();
    assert_eq!(prof.failures(), 0);
    prof.step_profile().unwrap().clone()
}

fn randn(shape: &[i64]) -> Tensor {
    Tensor::randn(shape, (Kind::Float, Device::Cpu))
}

fn forward_flops(f: impl FnOnce()) -> u64 {
    let _no_grad = tch::no_grad_guard();
    profile(f).forward_flops
}

/// 2 * N * Cout * prod(out) * Cin/groups * prod(kernel).
fn conv_formula(n: i64, cout: i64, out: &[i64], cin_per_group: i64, kernel: &[i64]) -> u64 {
    (2 * n * cout * out.iter().product::<i64>() * cin_per_group * kernel.iter().product::<i64>())
        as u64
}

/// Output length of a convolution or pooling window along one dimension.
fn out_len(i: i64, k: i64, s: i64, p: i64, d: i64) -> i64 {
    (i + 2 * p - d * (k - 1) - 1) / s + 1
}

#[test]
fn matrix_products_count_two_per_multiply_add() {
    let (a, b) = (randn(&[64, 128]), randn(&[128, 32]));
    assert_eq!(forward_flops(|| drop(a.mm(&b))), 2 * 64 * 128 * 32);
    let (a, b) = (randn(&[4, 8, 16]), randn(&[4, 16, 5]));
    assert_eq!(forward_flops(|| drop(a.bmm(&b))), 2 * 4 * 8 * 16 * 5);
    // linear -> addmm, counted once; the fused bias add is not counted.
    let (x, w, bias) = (randn(&[8, 100]), randn(&[50, 100]), randn(&[50]));
    assert_eq!(
        forward_flops(|| drop(x.linear(&w, Some(&bias)))),
        2 * 8 * 100 * 50
    );
    // matmul of a 3-d by a 2-d tensor folds into one mm.
    let (x, w) = (randn(&[3, 7, 20]), randn(&[20, 9]));
    assert_eq!(forward_flops(|| drop(x.matmul(&w))), 2 * 3 * 7 * 20 * 9);
}

#[test]
fn convolutions_follow_stride_padding_dilation_and_groups() {
    // conv2d, stride 2, padding 1, dilation 2, groups 2.
    let (x, w) = (randn(&[2, 4, 17, 19]), randn(&[6, 2, 3, 3]));
    let got = forward_flops(|| drop(x.conv2d(&w, None::<Tensor>, [2, 2], [1, 1], [2, 2], 2)));
    let (h, wd) = (out_len(17, 3, 2, 1, 2), out_len(19, 3, 2, 1, 2));
    assert_eq!(got, conv_formula(2, 6, &[h, wd], 2, &[3, 3]));

    // conv1d, stride 3.
    let (x, w) = (randn(&[3, 5, 20]), randn(&[7, 5, 4]));
    let got = forward_flops(|| drop(x.conv1d(&w, None::<Tensor>, [3], [0], [1], 1)));
    assert_eq!(got, conv_formula(3, 7, &[out_len(20, 4, 3, 0, 1)], 5, &[4]));

    // conv3d, padding 1 keeps the size.
    let (x, w) = (randn(&[1, 2, 6, 7, 8]), randn(&[3, 2, 3, 3, 3]));
    let got =
        forward_flops(|| drop(x.conv3d(&w, None::<Tensor>, [1, 1, 1], [1, 1, 1], [1, 1, 1], 1)));
    assert_eq!(got, conv_formula(1, 3, &[6, 7, 8], 2, &[3, 3, 3]));

    // Depthwise (groups = channels) with a bias: the bias is not counted.
    let (x, w, b) = (randn(&[2, 8, 10, 10]), randn(&[8, 1, 3, 3]), randn(&[8]));
    let got = forward_flops(|| drop(x.conv2d(&w, Some(&b), [1, 1], [1, 1], [1, 1], 8)));
    assert_eq!(got, conv_formula(2, 8, &[10, 10], 1, &[3, 3]));
}

#[test]
fn transposed_convolutions_count_input_positions() {
    // Weight [Cin, Cout/groups, kh, kw]: 2 * N * Cin * Hin * Win * Cout/groups * kh * kw.
    let (x, w) = (randn(&[2, 6, 5, 5]), randn(&[6, 4, 3, 3]));
    let got = forward_flops(|| {
        drop(x.conv_transpose2d(&w, None::<Tensor>, [2, 2], [1, 1], [1, 1], 1, [1, 1]))
    });
    assert_eq!(got, 2 * 2 * 6 * 5 * 5 * 4 * 3 * 3);
}

#[test]
fn convolution_backward_counts_input_and_weight_gradients() {
    let x = randn(&[2, 3, 12, 12]).set_requires_grad(true);
    let w = randn(&[5, 3, 3, 3]).set_requires_grad(true);
    let p = profile(|| {
        let y = x.conv2d(&w, None::<Tensor>, [1, 1], [0, 0], [1, 1], 1);
        y.sum(Kind::Float).backward();
    });
    let f = conv_formula(2, 5, &[10, 10], 3, &[3, 3]);
    let out_elems = 2 * 5 * 10 * 10;
    assert_eq!(p.forward_flops, f + out_elems, "conv + sum");
    assert_eq!(p.backward_flops, 2 * f, "input gradient + weight gradient");

    // Without an input gradient only the weight gradient is computed (a fresh weight:
    // accumulating into an existing .grad would add one addition per element).
    let x = randn(&[2, 3, 12, 12]);
    let w = randn(&[5, 3, 3, 3]).set_requires_grad(true);
    let p = profile(|| {
        let y = x.conv2d(&w, None::<Tensor>, [1, 1], [0, 0], [1, 1], 1);
        y.sum(Kind::Float).backward();
    });
    assert_eq!(p.backward_flops, f);
}

#[test]
fn normalizations_count_statistics_normalize_and_affine() {
    let x = randn(&[4, 3, 5, 5]);
    let n = x.numel() as u64;
    let (w, b) = (randn(&[3]), randn(&[3]));
    let (rm, rv) = (
        Tensor::zeros([3], (Kind::Float, Device::Cpu)),
        Tensor::ones([3], (Kind::Float, Device::Cpu)),
    );
    // Training: statistics 4 + normalize 2 + affine 2 per element.
    let got = forward_flops(|| {
        drop(Tensor::batch_norm(
            &x,
            Some(&w),
            Some(&b),
            Some(&rm),
            Some(&rv),
            true,
            0.1,
            1e-5,
            false,
        ))
    });
    assert_eq!(got, 8 * n);
    // Evaluation: running statistics, normalize 2 + affine 2.
    let got = forward_flops(|| {
        drop(Tensor::batch_norm(
            &x,
            Some(&w),
            Some(&b),
            Some(&rm),
            Some(&rv),
            false,
            0.1,
            1e-5,
            false,
        ))
    });
    assert_eq!(got, 4 * n);
    // Layer norm and group norm always compute statistics.
    let y = randn(&[4, 10]);
    let (lw, lb) = (randn(&[10]), randn(&[10]));
    let got = forward_flops(|| drop(y.layer_norm([10], Some(&lw), Some(&lb), 1e-5, false)));
    assert_eq!(got, 8 * 40);
    let (gw, gb) = (randn(&[3]), randn(&[3]));
    let got = forward_flops(|| drop(x.group_norm(3, Some(&gw), Some(&gb), 1e-5, false)));
    assert_eq!(got, 8 * n);
    let got = forward_flops(|| drop(x.group_norm(3, None::<Tensor>, None::<Tensor>, 1e-5, false)));
    assert_eq!(got, 6 * n);
}

#[test]
fn activations_cost_their_table_entry_per_element() {
    let x = randn(&[6, 7, 8]);
    let n = x.numel() as u64;
    type Activation = Box<dyn Fn(&Tensor) -> Tensor>;
    let cases: Vec<(&str, u64, Activation)> = vec![
        ("relu", 1, Box::new(|t| t.relu())),
        ("relu6", 2, Box::new(|t| t.relu6())),
        ("leaky_relu", 2, Box::new(|t| t.leaky_relu())),
        ("gelu", 8, Box::new(|t| t.gelu("none"))),
        ("sigmoid", 4, Box::new(|t| t.sigmoid())),
        ("tanh", 4, Box::new(|t| t.tanh())),
        ("hardswish", 4, Box::new(|t| t.hardswish())),
        ("hardsigmoid", 3, Box::new(|t| t.hardsigmoid())),
        ("softmax", 5, Box::new(|t| t.softmax(-1, Kind::Float))),
        (
            "log_softmax",
            5,
            Box::new(|t| t.log_softmax(-1, Kind::Float)),
        ),
    ];
    for (name, per_element, f) in cases {
        assert_eq!(forward_flops(|| drop(f(&x))), per_element * n, "{name}");
    }
}

#[test]
fn pooling_counts_windows() {
    let x = randn(&[2, 3, 9, 9]);
    // max pool 3x3, stride 2, padding 1: out 5x5, 9 comparisons each.
    let o = out_len(9, 3, 2, 1, 1);
    let got = forward_flops(|| drop(x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)));
    assert_eq!(got, (2 * 3 * o * o * 9) as u64);
    // ceil_mode: 2x2 stride 2 on 9 gives 5 instead of 4.
    let got = forward_flops(|| drop(x.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], true)));
    assert_eq!(got, (2 * 3 * 5 * 5 * 4) as u64);
    // avg pool 3x3 stride 3: out 3x3.
    let got = forward_flops(|| drop(x.avg_pool2d([3, 3], [3, 3], [0, 0], false, true, None)));
    assert_eq!(got, (2 * 3 * 3 * 3 * 9) as u64);
    // adaptive average pooling reads every input element once.
    let got = forward_flops(|| drop(x.adaptive_avg_pool2d([1, 1])));
    assert_eq!(got, x.numel() as u64);
}

#[test]
fn ops_without_a_formula_are_listed_not_zeroed_silently() {
    let x = randn(&[10, 10]);
    let p = {
        let _g = tch::no_grad_guard();
        profile(|| drop(x.cumsum(0, Kind::Float)))
    };
    assert_eq!(p.forward_flops, 0);
    let cumsum = p.uncounted_ops.iter().find(|u| u.op == "aten::cumsum");
    assert_eq!(cumsum.map(|u| u.calls), Some(1), "{:?}", p.uncounted_ops);
}

#[test]
fn fused_attention_counts_its_matmuls_as_pytorchs_flop_counter_does() {
    // query [b, h, L, E], key and value [b, h, S, E]: forward q k^T and scores v
    // (2 b h L S (E + Ev)); backward the scores again, grad scores, grad v, grad q and
    // grad k (2 b h L S (3 E + 2 Ev)), as torch.utils.flop_counter's sdpa formulas.
    let (b, h, l, s, e) = (2i64, 3, 16, 24, 8);
    let q = randn(&[b, h, l, e]).set_requires_grad(true);
    let k = randn(&[b, h, s, e]).set_requires_grad(true);
    let v = randn(&[b, h, s, e]).set_requires_grad(true);
    let p = profile(|| {
        let y = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            false,
            None,
            false,
        );
        y.sum(Kind::Float).backward();
    });
    let forward = (2 * b * h * l * s * (e + e)) as u64;
    let out_elems = (b * h * l * e) as u64;
    assert_eq!(p.forward_flops, forward + out_elems, "attention + sum");
    assert_eq!(
        p.backward_flops,
        (2 * b * h * l * s * (3 * e + 2 * e)) as u64
    );
    assert!(
        p.uncounted_ops
            .iter()
            .all(|u| !u.op.contains("scaled_dot_product")),
        "{:?}",
        p.uncounted_ops
    );
}
