//! The profiler's own memory does not grow with the number of iterations of a clean
//! loop (the 100,000-iteration figure is `benches/bounded_memory.rs`).

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};

#[test]
fn own_memory_is_the_same_after_1000_and_3000_iterations() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 16, 32, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 32, 4, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = tch_memprof::MemoryProfiler::builder(&vs)
        .print(false)
        .build()
        .unwrap();
    let mut at = Vec::new();
    for i in 1..=3000 {
        let x = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(4, [8], (Kind::Int64, Device::Cpu));
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        opt.backward_step(&loss);
        profiler.record_stats();
        if i % 500 == 0 {
            profiler.epoch_end();
        }
        if i == 1000 || i == 3000 {
            let (live, high_water, dropped) = tch_memprof::__private::registry();
            at.push((
                profiler.stats().profiler_memory_bytes,
                live,
                high_water,
                dropped,
            ));
        }
    }
    assert_eq!(profiler.failures(), 0);
    assert!(profiler.last_leaks().is_none());
    assert!(at[0].0 > 0);
    assert_eq!(
        at[0], at[1],
        "(own bytes, live entries, high water, dropped)"
    );
}
