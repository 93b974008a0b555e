//! The phases without leak hunting: the profiler then registers no op callback (every op
//! stays on libtorch's fast path; backward begins at the first allocation or free in the
//! engine's graph task), so the engine's own work between two nodes (a gradient summed
//! in an input buffer, a broadcast gradient reduced to its variable's shape) runs with
//! no record open. It is still backward: every number
//! equals the default profiler's (which records every op), byte for byte, in an
//! iteration with one backward pass and in one with two (gradient accumulation).

mod common;
use common::*;
use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::{IterationStats, MemoryProfiler};

/// A model whose backward sums a gradient in an input buffer (`r` feeds two ops) and
/// reduces a broadcast one (`shift`, one row added to every sample).
struct Net {
    l1: nn::Linear,
    l2: nn::Linear,
    shift: Tensor,
}

impl Net {
    fn new(vs: &nn::VarStore) -> Net {
        Net {
            l1: nn::linear(vs.root() / "l1", IN, HIDDEN, Default::default()),
            l2: nn::linear(vs.root() / "l2", HIDDEN, OUT, Default::default()),
            shift: vs.root().zeros("shift", &[HIDDEN]),
        }
    }

    fn loss(&self) -> Tensor {
        let x = Tensor::randn([B, IN], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(OUT, [B], (Kind::Int64, Device::Cpu));
        let r = self.l1.forward(&x).relu();
        let s = &r + r.sigmoid();
        let t = s + &self.shift;
        self.l2.forward(&t).cross_entropy_for_logits(&y)
    }
}

/// Three iterations, the second with two backward passes before its step; the stats of
/// each.
fn run(leak_check: bool) -> Vec<IterationStats> {
    tch::manual_seed(7);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = MemoryProfiler::builder(&vs)
        .print(false)
        .leak_check(leak_check)
        .build()
        .unwrap();
    let mut out = Vec::new();
    for passes in [1, 2, 1] {
        opt.zero_grad();
        for _ in 0..passes {
            net.loss().backward();
        }
        opt.step();
        profiler.record_stats();
        out.push(profiler.last_stats().cloned().unwrap());
    }
    assert_eq!(profiler.failures(), 0);
    out
}

#[test]
fn without_leak_hunting_the_engines_work_between_nodes_is_backward() {
    let _serial = serial();
    let core = run(false);
    let full = run(true);
    // On the libtorch this project provisions (2.11.0), the hooks read the engine's
    // graph task from libtorch's thread-local themselves (its code is the shape they
    // expect, and the first read of each thread agreed with libtorch's own answer):
    // the phases below are that read's. Elsewhere they may ask libtorch each time.
    if tch_memprof::LIBTORCH_VERSION.starts_with("2.11.") {
        assert!(tch_memprof::__private::graph_task_read_direct());
    }
    for (i, (c, f)) in core.iter().zip(&full).enumerate() {
        let it = i + 1;
        let passes = if it == 2 { 2 } else { 1 };
        assert_eq!(c.backward_passes, passes, "iteration {it}");
        assert_eq!(f.backward_passes, passes, "iteration {it}");
        // Both the input buffer's sum and the sigmoid's gradient are B x HIDDEN f32
        // blocks born in backward: the intermediate peak holds at least two of them.
        assert!(
            c.intermediate_gradients_bytes >= 2 * F32 * (B * HIDDEN) as u64,
            "iteration {it}: {}",
            c.intermediate_gradients_bytes
        );
        let pick = |s: &IterationStats| {
            (
                s.allocated_bytes,
                s.peak_allocated_bytes,
                s.weights_bytes,
                s.gradients_bytes,
                s.feature_maps_bytes,
                s.intermediate_gradients_bytes,
                s.optimizer_state_bytes,
                s.other_bytes,
            )
        };
        assert_eq!(
            pick(c),
            pick(f),
            "iteration {it}: without and with leak hunting"
        );
    }
}

#[test]
fn ops_are_recorded_only_while_something_needs_them() {
    use tch_memprof::__private::records_every_op;
    let _serial = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let _net = Net::new(&vs);
    assert!(!records_every_op(), "no profiler: no op callback");
    {
        let _core = MemoryProfiler::builder(&vs)
            .print(false)
            .leak_check(false)
            .build()
            .unwrap();
        assert!(!records_every_op(), "without leak hunting: no op record");
    }
    {
        let _default = MemoryProfiler::builder(&vs).print(false).build().unwrap();
        assert!(records_every_op(), "leak hunting takes each block's op");
    }
    assert!(!records_every_op(), "a dropped profiler leaves no callback");
    let mut core = MemoryProfiler::builder(&vs)
        .print(false)
        .leak_check(false)
        .build()
        .unwrap();
    core.start_memory_history(1000).unwrap();
    assert!(
        records_every_op(),
        "the memory history takes each block's op"
    );
    core.stop_memory_history().unwrap();
    assert!(!records_every_op(), "history stopped: no op record again");
}
