//! The dry run's own meta kernels against libtorch's CPU kernels: each op runs on meta
//! tensors inside a dry run (a user's step, `Model::estimate_steps`) and on CPU tensors
//! of the same sizes; the outputs' sizes and dtypes, and those of the input gradients
//! autograd computes through the op's backward kernel, must be the CPU's.

mod common;

use tch::nn;
use tch::{Device, Kind, Reduction, Tensor};
use tch_memprof::estimate::{Model, Options};

type Case = (&'static str, fn(Device) -> Vec<Tensor>);

/// A float tensor of `shape` on `device` that requires grad.
fn x(shape: &[i64], device: Device) -> Tensor {
    Tensor::ones(shape, (Kind::Float, device)).set_requires_grad(true)
}

/// `y` and the gradient of its sum with respect to `input`.
fn with_grad(input: &Tensor, y: Tensor) -> Vec<Tensor> {
    let g = Tensor::run_backward(&[y.sum(Kind::Float)], &[input], false, false);
    let mut out = vec![y.detach()];
    out.extend(g);
    out
}

const CASES: &[Case] = &[
    ("roll", |d| {
        let a = x(&[2, 5, 7], d);
        with_grad(&a, a.roll([2, 3], [1, 2]))
    }),
    ("flip", |d| {
        let a = x(&[2, 5, 7], d);
        with_grad(&a, a.flip([0, 2]))
    }),
    ("hardtanh (ReLU6)", |d| {
        let a = x(&[3, 4], d);
        with_grad(&a, a.hardtanh())
    }),
    ("hardswish", |d| {
        let a = x(&[3, 4], d);
        with_grad(&a, a.hardswish())
    }),
    ("logit", |d| {
        let a = x(&[3, 4], d);
        vec![a.logit(None)]
    }),
    ("isnan", |d| vec![x(&[3, 4], d).isnan()]),
    ("channel_shuffle", |d| {
        vec![x(&[2, 6, 3, 3], d).channel_shuffle(3)]
    }),
    ("rsub", |d| vec![x(&[3, 1], d).rsub(&x(&[1, 4], d))]),
    ("floor_divide", |d| {
        vec![x(&[3, 1], d).floor_divide(&x(&[4], d))]
    }),
    ("dot, vdot", |d| {
        vec![x(&[5], d).dot(&x(&[5], d)), x(&[5], d).vdot(&x(&[5], d))]
    }),
    ("trace, max, min", |d| {
        let a = x(&[4, 4], d);
        vec![a.trace(), a.max(), a.min()]
    }),
    ("var, std, var_mean (a hand-written LayerNorm)", |d| {
        let a = x(&[2, 3, 8], d);
        let (v, m) = a.var_mean_dim(&[-1i64][..], false, true);
        let mut out = with_grad(&a, a.var_dim(&[-1i64][..], false, true));
        out.extend([a.std_dim(&[1i64, 2][..], true, false).detach(), v, m]);
        out
    }),
    ("reflection_pad2d", |d| {
        let a = x(&[2, 3, 6, 7], d);
        with_grad(&a, a.reflection_pad2d([1, 2, 3, 1]))
    }),
    ("replication_pad2d's backward", |d| {
        let a = x(&[2, 3, 6, 7], d);
        with_grad(&a, a.replication_pad2d([1, 2, 3, 1]))
    }),
    ("glu's backward", |d| {
        let a = x(&[4, 6], d);
        with_grad(&a, a.glu(-1))
    }),
    ("mse_loss's backward", |d| {
        let a = x(&[4, 6], d);
        with_grad(&a, a.mse_loss(&x(&[4, 6], d), Reduction::Mean))
    }),
    ("binary_cross_entropy", |d| {
        let a = x(&[4, 6], d);
        let t = Tensor::ones([4, 6], (Kind::Float, d));
        let mut out = with_grad(
            &a,
            a.binary_cross_entropy(&t, None::<Tensor>, Reduction::Mean),
        );
        out.push(
            a.binary_cross_entropy(&t, None::<Tensor>, Reduction::None)
                .detach(),
        );
        out
    }),
    ("nll_loss2d", |d| {
        let a = x(&[2, 5, 3, 4], d);
        let t = Tensor::zeros([2, 3, 4], (Kind::Int64, d));
        let mut out = with_grad(&a, a.nll_loss2d(&t, None::<Tensor>, Reduction::Mean, -100));
        out.push(
            a.nll_loss2d(&t, None::<Tensor>, Reduction::None, -100)
                .detach(),
        );
        out
    }),
    ("log_sigmoid", |d| {
        let a = x(&[4, 6], d);
        with_grad(&a, a.log_sigmoid())
    }),
    ("prelu", |d| {
        let a = x(&[2, 3, 4], d);
        let w = x(&[3], d);
        let y = a.prelu(&w);
        let g = Tensor::run_backward(&[y.sum(Kind::Float)], &[&a, &w], false, false);
        let mut out = vec![y.detach()];
        out.extend(g);
        out
    }),
    ("grid_sampler_2d", |d| {
        let a = x(&[2, 3, 5, 6], d);
        let grid = Tensor::zeros([2, 4, 7, 2], (Kind::Float, d));
        with_grad(&a, a.grid_sampler_2d(&grid, 0, 0, false))
    }),
    ("unfold's backward", |d| {
        let a = x(&[2, 10], d);
        with_grad(&a, a.unfold(1, 3, 2))
    }),
    ("logical_not, and, or, xor", |d| {
        let a = x(&[3, 1], d).gt(0.5);
        let b = x(&[4], d).gt(0.5);
        vec![
            a.logical_not(),
            a.logical_and(&b),
            a.logical_or(&b),
            a.logical_xor(&b),
        ]
    }),
    ("take", |d| {
        let idx = Tensor::zeros([3, 2], (Kind::Int64, d));
        vec![x(&[4, 5], d).take(&idx)]
    }),
    ("weight norm", |d| {
        let v = x(&[8, 3, 5], d);
        let g = x(&[8, 1, 1], d);
        let w = Tensor::internal_weight_norm(&v, &g, 0);
        let grads = Tensor::run_backward(&[w.sum(Kind::Float)], &[&v, &g], false, false);
        let mut out = vec![w.detach()];
        out.extend(grads);
        out
    }),
    ("group norm's backward", |d| {
        let a = x(&[2, 6, 4, 4], d);
        let w = x(&[6], d);
        let b = x(&[6], d);
        with_grad(&a, a.group_norm(3, Some(&w), Some(&b), 1e-5, false))
    }),
    // The batch norms of core ATen (torch.export's run_decompositions()).
    (
        "_native_batch_norm_legit (training, evaluation, no stats)",
        |d| {
            let a = x(&[2, 6, 4, 4], d);
            let w = x(&[6], d);
            let (rm, rv) = (
                Tensor::zeros([6], (Kind::Float, d)),
                Tensor::ones([6], (Kind::Float, d)),
            );
            let (y, m, v) = a.internal_native_batch_norm_legit(
                Some(&w),
                None::<&Tensor>,
                &rm,
                &rv,
                true,
                0.1,
                1e-5,
            );
            let (ye, me, ve) = a.internal_native_batch_norm_legit(
                Some(&w),
                None::<&Tensor>,
                &rm,
                &rv,
                false,
                0.1,
                1e-5,
            );
            let (yn, mn, vn) = a.internal_native_batch_norm_legit_no_stats(
                Some(&w),
                None::<&Tensor>,
                true,
                0.1,
                1e-5,
            );
            let mut out = with_grad(&a, y);
            out.extend([m, v, ye.detach(), me, ve, yn.detach(), mn, vn]);
            out
        },
    ),
    ("_native_batch_norm_legit_functional", |d| {
        let a = x(&[2, 6, 4, 4], d);
        let (rm, rv) = (
            Tensor::zeros([6], (Kind::Float, d)),
            Tensor::ones([6], (Kind::Float, d)),
        );
        let (y, m, v, rm2, rv2) = a.internal_native_batch_norm_legit_functional(
            None::<Tensor>,
            None::<Tensor>,
            &rm,
            &rv,
            true,
            0.1,
            1e-5,
        );
        vec![y, m, v, rm2, rv2]
    }),
];

fn shapes(ts: &[Tensor]) -> Vec<(Vec<i64>, Kind)> {
    ts.iter().map(|t| (t.size(), t.kind())).collect()
}

#[test]
fn each_meta_kernel_gives_the_cpu_kernels_sizes_and_dtypes() {
    let _serial = common::serial();
    let (model, mut results) =
        Model::build_steps_on_meta(|_vs: &mut nn::VarStore| Vec::new()).unwrap();
    let options = Options {
        steps: 1,
        ..Options::default()
    };
    let e = model.estimate_steps(&options, &mut results, |results, device| {
        for (name, case) in CASES {
            let meta = shapes(&case(device));
            let cpu = shapes(&case(Device::Cpu));
            results.push((*name, meta, cpu));
        }
    });
    e.unwrap();
    assert_eq!(results.len(), CASES.len());
    for (name, meta, cpu) in &results {
        assert_eq!(meta, cpu, "{name}: meta {meta:?}, CPU {cpu:?}");
    }
}
