//! The profiler's own memory does not grow with the number of iterations of a clean
//! loop (the 100,000-iteration figure is `benches/bounded_memory.rs`).

mod common;

use tch::{nn, nn::OptimizerConfig, Device};

#[test]
fn own_memory_is_the_same_after_1000_and_3000_iterations() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = common::tiny_mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = tch_memprof::MemoryProfiler::builder(&vs)
        .print(false)
        .build()
        .unwrap();
    let mut at = Vec::new();
    for i in 1..=3000 {
        common::tiny_step(&net, &mut opt);
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
