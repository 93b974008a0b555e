//! The training thread counts its blocks in a lane of its own, without locked
//! instructions; every other thread (CUDA's backward on the engine's device thread,
//! intra-op workers) in a shared lane; a device's figures are the two lanes' sums. Blocks
//! born on one thread and freed on the other count exactly: an iteration's peak and its
//! allocated bytes at the end are the bytes by hand, and a forward-born block freed on
//! another thread before backward leaves the feature maps what it leaves when freed on
//! the training thread.
//!
//! One test function, in a binary of its own: the CPU's counters are process-wide.

use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::__private::cpu_live_bytes;
use tch_memprof::MemoryProfiler;

const MIB: i64 = 1 << 20;

/// A tensor of `bytes` bytes on the CPU (f32).
fn block(bytes: i64) -> Tensor {
    Tensor::zeros([bytes / 4], (Kind::Float, Device::Cpu))
}

/// Runs `f` on a thread of its own and returns what it returns.
fn elsewhere<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// One training step of `w` whose forward pass makes a 1 MiB block that backward does
/// not need, freed before backward on the training thread or (`moved`) on another.
fn step(w: &Tensor, opt: &mut nn::Optimizer, moved: bool) {
    let x = Tensor::ones([64, 64], (Kind::Float, Device::Cpu));
    let y = x.matmul(w);
    let scratch = y.detach().copy().reshape([-1]).repeat([64]);
    assert_eq!(scratch.numel() * 4, MIB as usize);
    if moved {
        elsewhere(move || drop(scratch));
    } else {
        drop(scratch);
    }
    let loss = y.sum(Kind::Float);
    opt.zero_grad();
    loss.backward();
    opt.step();
}

#[test]
fn blocks_born_on_one_thread_and_freed_on_another_count_exactly() {
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().randn("w", &[64, 64], 0.0, 0.1);
    let mut opt = nn::Sgd::default().build(&vs, 1e-3).unwrap();
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .leak_check(false)
        .build()
        .unwrap();
    // Settled: gradients exist, the first iterations' one-time blocks are made.
    for _ in 0..3 {
        step(&w, &mut opt, false);
        prof.record_stats();
    }

    // Peaks and live bytes: a block born on the training thread freed on another, one
    // born there freed here.
    for _ in 0..3 {
        let base = cpu_live_bytes();
        let a = block(MIB);
        let b = elsewhere(move || {
            let b = block(2 * MIB);
            drop(a);
            b
        });
        let c = block(MIB / 2);
        drop(b);
        prof.record_stats();
        let s = prof.last_stats().unwrap().clone();
        assert_eq!(
            cpu_live_bytes() - base,
            MIB / 2,
            "live bytes after the moves"
        );
        assert_eq!(
            s.peak_allocated_bytes as i64 - base,
            3 * MIB,
            "the iteration's peak: the 1 MiB and 2 MiB blocks together"
        );
        assert_eq!(s.allocated_bytes as i64 - base, MIB / 2);
        drop(c);
    }

    // Feature maps: the same step, its 1 MiB scratch block freed here or elsewhere.
    let mut maps = [Vec::new(), Vec::new()];
    for round in 0..6 {
        let moved = round % 2 == 1;
        step(&w, &mut opt, moved);
        prof.record_stats();
        maps[moved as usize].push(prof.last_stats().unwrap().feature_maps_bytes);
    }
    assert!(maps[0][0] > 0, "feature maps measured: {maps:?}");
    assert!(
        maps[0].iter().chain(&maps[1]).all(|&m| m == maps[0][0]),
        "feature maps, scratch freed on the training thread vs on another: {maps:?}"
    );
    assert_eq!(prof.failures(), 0);
}
