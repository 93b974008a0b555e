//! A user's training loop on tch 0.26 with the four profiler lines, checked against bytes
//! computed by hand: a 2-layer MLP (8 -> 16 -> 4, f32) trained with SGD for 2 epochs of 3
//! iterations. Exits non-zero, naming the figure, when one differs.

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};

const F32: u64 = 4;

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let net = nn::seq()
        .add(nn::linear(&root / "fc1", 8, 16, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "fc2", 16, 4, Default::default()));
    let mut opt = nn::Sgd::default().build(&vs, 1e-2).expect("SGD");

    // The four lines (with printing off, so the output is this check's own).
    let mut profiler = tch_memprof::MemoryProfiler::builder(&vs) // 1
        .print(false)
        .csv(false)
        .build()
        .expect("profiler");
    for _epoch in 0..2 {
        for _ in 0..3 {
            let x = Tensor::randn([5, 8], (Kind::Float, Device::Cpu));
            let y = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
            let loss = net.forward(&x).mse_loss(&y, tch::Reduction::Mean);
            opt.zero_grad();
            loss.backward();
            opt.step();
            profiler.record_stats(); // 2
        }
        profiler.epoch_end(); // 3
    }

    // By hand: fc1 is 16x8 + 16, fc2 is 4x16 + 4 floats.
    let weights = (16 * 8 + 16 + 4 * 16 + 4) * F32;
    let s = profiler.last_stats().expect("six record_stats calls made stats");
    let mut bad = Vec::new();
    let mut check = |what: &str, got: u64, want: u64| {
        if got != want {
            bad.push(format!("{what}: measured {got} B, by hand {want} B"));
        }
    };
    check("weights", s.weights_bytes, weights);
    check("gradients", s.gradients_bytes, weights);
    check("optimizer state (plain SGD)", s.optimizer_state_bytes, 0);
    check("epochs", profiler.epochs().len() as u64, 2);
    check("steps", s.step, 6);
    check("variables", s.variables.len() as u64, 4);
    for v in &s.variables {
        let elems: i64 = v.shape.iter().product();
        check(&v.name, v.bytes, elems as u64 * F32);
        check(&format!("{}.grad", v.name), v.grad_bytes.unwrap_or(0), elems as u64 * F32);
    }
    check("profiler failures", profiler.failures(), 0);
    if !bad.is_empty() {
        eprintln!("downstream: tch 0.26 check failed:\n  {}", bad.join("\n  "));
        std::process::exit(1);
    }
    println!(
        "downstream: tch 0.26 + tch-memprof (libtorch {}): weights {} B and gradients {} B as computed by hand, \
         {} variables, 2 epochs x 3 steps",
        tch_memprof::LIBTORCH_VERSION,
        s.weights_bytes,
        s.gradients_bytes,
        s.variables.len()
    );
}
