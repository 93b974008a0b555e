//! Gradient checkpointing and mixed precision: gradients equal to the plain run's, and
//! feature maps lower by exactly what the checkpointed segments keep.

mod common;

use tch::{nn, nn::Module, nn::ModuleT, Device, Kind, Tensor};
use tch_memprof::{autocast, Checkpointed, MemoryProfiler};

const B: i64 = 64;
const D: i64 = 256;
const N: usize = 4;

/// Block i: Linear(D -> 4D) -> ReLU -> Linear(4D -> D).
fn blocks(vs: &nn::VarStore) -> Vec<nn::Sequential> {
    (0..N)
        .map(|i| {
            let p = vs.root() / format!("block{i}");
            nn::seq()
                .add(nn::linear(&p / "up", D, 4 * D, Default::default()))
                .add_fn(|x| x.relu())
                .add(nn::linear(&p / "down", 4 * D, D, Default::default()))
        })
        .collect()
}

fn chain<'a>(vs: &nn::VarStore, blocks: &'a [nn::Sequential]) -> Checkpointed<'a> {
    blocks.iter().fold(Checkpointed::new(vs), |c, b| {
        c.segment(move |x, _train| b.forward(x))
    })
}

/// The blocks as segments, block i checkpointed where `checkpointed(i)`, else kept
/// (`segment_kept`).
fn mixed_chain<'a>(
    vs: &nn::VarStore,
    blocks: &'a [nn::Sequential],
    checkpointed: impl Fn(usize) -> bool,
) -> Checkpointed<'a> {
    blocks
        .iter()
        .enumerate()
        .fold(Checkpointed::new(vs), |c, (i, b)| {
            let f = move |x: &Tensor, _train: bool| b.forward(x);
            if checkpointed(i) {
                c.segment(f)
            } else {
                c.segment_kept(f)
            }
        })
}

/// Every variable's gradient, by name.
fn grads(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.grad().defined())
        .map(|(n, t)| (n, t.grad().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn zero_grads(vs: &nn::VarStore) {
    for mut t in vs.trainable_variables() {
        t.zero_grad();
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn assert_same_grads(plain: &[(String, Tensor)], ckpt: &[(String, Tensor)], tol: f64) {
    assert_eq!(plain.len(), ckpt.len());
    assert!(!plain.is_empty());
    for ((n1, g1), (n2, g2)) in plain.iter().zip(ckpt) {
        assert_eq!(n1, n2);
        let scale = g1.abs().max().double_value(&[]).max(1e-30);
        let d = max_abs_diff(g1, g2);
        assert!(
            d <= tol * scale,
            "{n1}: max |diff| {d:e}, max |grad| {scale:e}"
        );
    }
}

#[test]
fn gradients_match_the_plain_run_in_float32() {
    let _s = common::serial();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = blocks(&vs);
    let model = chain(&vs, &bl);
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));

    let loss = model
        .forward_t(&x, true)
        .unwrap()
        .cross_entropy_for_logits(&y);
    loss.backward();
    let plain = grads(&vs);
    zero_grads(&vs);
    let loss_ck = model
        .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
        .unwrap();
    let ckpt = grads(&vs);
    assert_eq!(
        plain.len(),
        4 * N,
        "weights and biases of every linear layer"
    );
    assert_eq!(loss.double_value(&[]), loss_ck.double_value(&[]));
    // The recomputation repeats the same float32 kernels on the same inputs, and the
    // boundary gradient enters as exactly g: equal to the last bit in practice, 1e-6
    // relative allowed.
    assert_same_grads(&plain, &ckpt, 1e-6);
}

#[test]
fn feature_maps_drop_by_what_the_checkpointed_segments_keep() {
    let _s = common::serial();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = blocks(&vs);
    let model = chain(&vs, &bl).preserve_rng(false);
    let mut profiler = MemoryProfiler::builder(&vs)
        .print(false)
        .leak_check(false)
        .build()
        .unwrap();
    let mut measure = |checkpointed: bool| {
        let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));
        zero_grads(&vs);
        if checkpointed {
            let _loss = model
                .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
                .unwrap();
        } else {
            let loss = model
                .forward_t(&x, true)
                .unwrap()
                .cross_entropy_for_logits(&y);
            loss.backward();
        }
        drop((x, y));
        profiler.record_stats();
        let s = profiler.last_stats().unwrap();
        (s.feature_maps_bytes, s.peak_allocated_bytes)
    };
    let _warm = measure(false);
    let (plain_fm, plain_peak) = measure(false);
    let (ckpt_fm, ckpt_peak) = measure(true);
    // Each block keeps its ReLU output (B x 4D f32, saved by ReluBackward and by the
    // second linear) for backward; its input and output are boundaries, kept either
    // way. Checkpointing the first N-1 blocks drops their ReLU outputs.
    let predicted = (N as u64 - 1) * 4 * (B * 4 * D) as u64;
    assert_eq!(
        plain_fm - ckpt_fm,
        predicted,
        "plain {plain_fm}, checkpointed {ckpt_fm}"
    );
    assert!(ckpt_peak < plain_peak, "peak {ckpt_peak} vs {plain_peak}");
}

/// Linear -> BatchNorm -> ReLU -> Dropout(0.5): random and with running statistics.
fn noisy_blocks(vs: &nn::VarStore) -> Vec<nn::SequentialT> {
    (0..3)
        .map(|i| {
            let p = vs.root() / format!("noisy{i}");
            nn::seq_t()
                .add(nn::linear(&p / "fc", D, D, Default::default()))
                .add(nn::batch_norm1d(&p / "bn", D, Default::default()))
                .add_fn(|x| x.relu())
                .add_fn_t(|x, train| x.dropout(0.5, train))
        })
        .collect()
}

#[test]
fn dropout_and_batch_norm_see_the_same_step_as_the_plain_run() {
    let _s = common::serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = noisy_blocks(&vs);
    let model = bl.iter().fold(Checkpointed::new(&vs), |c, b| {
        c.segment(move |x, train| b.forward_t(x, train))
    });
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));
    let buffers = |vs: &nn::VarStore| {
        let mut v: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(n, _)| n.contains("running"))
            .map(|(n, t)| (n, t.copy()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let initial = buffers(&vs);
    assert_eq!(
        initial.len(),
        6,
        "running mean and var of three batch norms"
    );

    tch::manual_seed(42);
    let loss = model
        .forward_t(&x, true)
        .unwrap()
        .cross_entropy_for_logits(&y);
    loss.backward();
    let next_random = Tensor::rand([1], (Kind::Float, Device::Cpu)).double_value(&[0]);
    let (plain, plain_buffers) = (grads(&vs), buffers(&vs));

    // Back to the state before the plain step.
    zero_grads(&vs);
    tch::no_grad(|| {
        for (name, saved) in &initial {
            vs.variables()[name].shallow_clone().copy_(saved);
        }
    });
    tch::manual_seed(42);
    let _loss = model
        .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
        .unwrap();
    let next_random_ck = Tensor::rand([1], (Kind::Float, Device::Cpu)).double_value(&[0]);

    assert_same_grads(&plain, &grads(&vs), 1e-6);
    for ((n, a), (_, b)) in plain_buffers.iter().zip(&buffers(&vs)) {
        assert_eq!(
            max_abs_diff(a, b),
            0.0,
            "{n}: updated once, as in the plain step"
        );
    }
    assert_ne!(
        plain_buffers[0].1.double_value(&[0]),
        initial[0].1.double_value(&[0])
    );
    assert_eq!(
        next_random, next_random_ck,
        "the generator ends where the plain run left it"
    );
}

#[test]
fn mixed_precision_on_the_cpu_computes_in_bfloat16_and_checkpointing_keeps_its_gradients() {
    let _s = common::serial();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = blocks(&vs);
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));

    let inside = autocast(Device::Cpu, Kind::BFloat16, || bl[0].forward(&x)).unwrap();
    assert_eq!(inside.kind(), Kind::BFloat16);
    assert_eq!(
        bl[0].forward(&x).kind(),
        Kind::Float,
        "off again after the closure"
    );
    let nested = autocast(Device::Cpu, Kind::BFloat16, || {
        autocast(Device::Cpu, Kind::BFloat16, || ()).unwrap();
        bl[0].forward(&x).kind()
    })
    .unwrap();
    assert_eq!(
        nested,
        Kind::BFloat16,
        "an inner autocast restores the outer state"
    );

    let model = chain(&vs, &bl).mixed_precision(Kind::BFloat16);
    let loss = model.forward_t(&x, true).unwrap();
    let loss = autocast(Device::Cpu, Kind::BFloat16, || {
        loss.cross_entropy_for_logits(&y)
    })
    .unwrap();
    loss.backward();
    let plain = grads(&vs);
    zero_grads(&vs);
    let _loss = model
        .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
        .unwrap();
    assert!(
        plain.iter().all(|(_, g)| g.kind() == Kind::Float),
        "float32 master weights"
    );
    assert_same_grads(&plain, &grads(&vs), 1e-6);
}

#[test]
fn bad_autocast_settings_fail_softly_with_a_reason() {
    let err = autocast(Device::Cpu, Kind::Float, || ()).unwrap_err();
    assert!(err.to_string().contains("autocast dtype = Float"), "{err}");
    if !tch::Cuda::is_available() {
        let err = autocast(Device::Cuda(0), Kind::BFloat16, || ()).unwrap_err();
        assert!(err.to_string().contains("CUDA is not available"), "{err}");
    }
    let vs = nn::VarStore::new(Device::Cpu);
    let empty = Checkpointed::new(&vs);
    let x = Tensor::zeros([1], (Kind::Float, Device::Cpu));
    let err = empty
        .forward_backward(&x, |o| o.sum(Kind::Float))
        .unwrap_err();
    assert!(err.to_string().contains("at least one segment"), "{err}");
}

/// Conv(3x3)-BN-ReLU blocks at 32x32 (the shape of the example's first stage).
fn conv_blocks(vs: &nn::VarStore, n: usize, c: i64) -> Vec<nn::SequentialT> {
    (0..n)
        .map(|i| {
            let p = vs.root() / format!("conv{i}");
            let c_in = if i == 0 { 3 } else { c };
            let cfg = nn::ConvConfig {
                padding: 1,
                bias: false,
                ..Default::default()
            };
            nn::seq_t()
                .add(nn::conv2d(&p / "conv", c_in, c, 3, cfg))
                .add(nn::batch_norm2d(&p / "bn", c, Default::default()))
                .add_fn(|x| x.relu())
        })
        .collect()
}

/// A chain of conv + batch norm + ReLU blocks. Without checkpointing each block keeps
/// for backward its conv output (batch norm's input) and its ReLU output (the next
/// conv's input); checkpointed, a block keeps only its output, the boundary. So
/// checkpointing cuts the feature maps by N conv outputs, N x B x C x H x W x 4 bytes,
/// give or take the small tensors that batch norm and the CPU's convolution kernels
/// keep (statistics, workspaces: under 64 KiB here, and kernel-dependent). How much the
/// *peak* drops depends on the kernels' temporaries too, so it is asserted only to
/// drop. (A ratio of peaks was asserted here once: it held on AVX-512 machines and
/// failed on AVX2-only ones.)
#[test]
fn checkpointing_a_conv_chain_keeps_only_the_block_outputs() {
    const N: usize = 6;
    const B: i64 = 8;
    const C: i64 = 32;
    const HW: i64 = 32;
    let _s = common::serial();
    let run = |checkpointing: bool| {
        tch::manual_seed(5);
        let vs = nn::VarStore::new(Device::Cpu);
        let bl = conv_blocks(&vs, N, C);
        let fc = nn::linear(vs.root() / "fc", C, 10, Default::default());
        let model = bl
            .iter()
            .fold(Checkpointed::new(&vs), |c, b| {
                c.segment(move |x, train| b.forward_t(x, train))
            })
            .segment(|x, _| x.mean_dim([2, 3].as_slice(), false, Kind::Float).apply(&fc));
        let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
        let x = Tensor::randn([B, 3, HW, HW], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [B], (Kind::Int64, Device::Cpu));
        for _ in 0..2 {
            zero_grads(&vs);
            if checkpointing {
                let _loss = model
                    .forward_backward(&x, |o| o.cross_entropy_for_logits(&y))
                    .unwrap();
            } else {
                model
                    .forward_t(&x, true)
                    .unwrap()
                    .cross_entropy_for_logits(&y)
                    .backward();
            }
            profiler.record_stats();
        }
        let s = profiler.last_stats().unwrap().clone();
        (s.feature_maps_bytes, s.peak_allocated_bytes, grads(&vs))
    };
    let (base_fm, base_peak, base_grads) = run(false);
    let (ckpt_fm, ckpt_peak, ckpt_grads) = run(true);
    assert_same_grads(&base_grads, &ckpt_grads, 1e-6);
    let conv_outputs = N as i64 * B * C * HW * HW * 4;
    let cut = base_fm as i64 - ckpt_fm as i64;
    assert!(
        (cut - conv_outputs).abs() < 64 << 10,
        "feature maps {base_fm} B plain, {ckpt_fm} B checkpointed: cut {cut} B, \
         {N} conv outputs are {conv_outputs} B"
    );
    assert!(ckpt_peak < base_peak, "peak {ckpt_peak} B vs {base_peak} B");
}

/// The replay of the random generator is what makes dropout segments right: without it
/// the recomputation draws other masks and the gradients differ from the plain run's.
#[test]
fn without_rng_replay_dropout_gradients_differ() {
    let _s = common::serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = noisy_blocks(&vs);
    let model = bl
        .iter()
        .fold(Checkpointed::new(&vs), |c, b| {
            c.segment(move |x, train| b.forward_t(x, train))
        })
        .preserve_rng(false);
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));
    tch::manual_seed(42);
    let loss = model
        .forward_t(&x, true)
        .unwrap()
        .cross_entropy_for_logits(&y);
    loss.backward();
    let plain = grads(&vs);
    zero_grads(&vs);
    tch::manual_seed(42);
    let _loss = model
        .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
        .unwrap();
    let worst = plain
        .iter()
        .zip(&grads(&vs))
        .map(|((_, a), (_, b))| max_abs_diff(a, b) / a.abs().max().double_value(&[]).max(1e-30))
        .fold(0.0, f64::max);
    eprintln!("largest relative gradient difference without RNG replay: {worst:e}");
    assert!(worst > 1e-3, "{worst:e}");
}

/// Kept segments (`segment_kept`) between checkpointed ones: every second block keeps
/// its activations, the others are recomputed. Gradients equal the plain run's (the
/// memory they keep: the next test).
#[test]
fn kept_segments_between_checkpointed_ones_give_the_plain_gradients() {
    // The first segment checkpointed, then kept.
    kept_segments(0);
    kept_segments(1);
}

/// The feature maps a step keeps, by hand: each block keeps its ReLU output (B x 4D
/// f32) for backward unless its segment is checkpointed and not the last (the last
/// segment's forward runs with backward right after it, as
/// `feature_maps_drop_by_what_the_checkpointed_segments_keep` measures). So every
/// second block checkpointed from the first drops blocks 0 and 2's; from the second,
/// block 1's only (block 3 is the last); every block checkpointed drops three; none, none.
#[test]
fn kept_segments_keep_the_activations_of_their_blocks() {
    let _s = common::serial();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = blocks(&vs);
    let models = [
        mixed_chain(&vs, &bl, |_| false).preserve_rng(false),
        mixed_chain(&vs, &bl, |i| i % 2 == 0).preserve_rng(false),
        mixed_chain(&vs, &bl, |i| i % 2 == 1).preserve_rng(false),
        mixed_chain(&vs, &bl, |_| true).preserve_rng(false),
    ];
    let mut profiler = MemoryProfiler::builder(&vs)
        .print(false)
        .leak_check(false)
        .build()
        .unwrap();
    let mut feature_maps = |m: &Checkpointed| {
        let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));
        zero_grads(&vs);
        let _loss = m
            .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
            .unwrap();
        drop((x, y));
        profiler.record_stats();
        profiler.last_stats().unwrap().feature_maps_bytes
    };
    let _warm = feature_maps(&models[0]);
    let kept: Vec<u64> = models.iter().map(&mut feature_maps).collect();
    let relu = 4 * (B * 4 * D) as u64;
    let dropped: Vec<u64> = kept.iter().map(|k| kept[0] - k).collect();
    assert_eq!(dropped, [0, 2 * relu, relu, 3 * relu], "kept {kept:?}");
}

fn kept_segments(checkpointed_parity: usize) {
    let _s = common::serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let bl = blocks(&vs);
    let mixed = mixed_chain(&vs, &bl, |i| i % 2 == checkpointed_parity);
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let y = Tensor::randint(D, [B], (Kind::Int64, Device::Cpu));

    let loss = mixed
        .forward_t(&x, true)
        .unwrap()
        .cross_entropy_for_logits(&y);
    loss.backward();
    let plain = grads(&vs);
    let plain_x = x.grad().copy();
    zero_grads(&vs);
    let _ = x.grad().zero_();
    let loss_ck = mixed
        .forward_backward(&x, |out| out.cross_entropy_for_logits(&y))
        .unwrap();
    assert_eq!(loss.double_value(&[]), loss_ck.double_value(&[]));
    assert_eq!(plain.len(), 4 * N);
    assert_same_grads(&plain, &grads(&vs), 1e-6);
    // The input's gradient too: it flows through the first segment, checkpointed or kept.
    let scale = plain_x.abs().max().double_value(&[]);
    assert!(max_abs_diff(&plain_x, &x.grad()) <= 1e-6 * scale);
}
