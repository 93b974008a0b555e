//! CUDA: on a machine without a GPU every CUDA path fails softly with a message (checked
//! here, on CPU-only CI); with a GPU, the profiler's allocated bytes equal the caching
//! allocator's own counter at every report, the categories add up, and the weights,
//! gradients and Adam state are the sizes computed by hand. The GPU checks are ignored
//! unless asked for (`cargo test --test cuda -- --include-ignored`, as
//! `scripts/gpu/run.sh` runs them), so `cargo test` lists them as ignored, with the
//! reason; asked for on a machine without a GPU, they fail.
//!
//! Every test that starts a profiler takes `common::serial()`: one profiler per process,
//! and cargo runs a binary's tests in parallel.

mod common;

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

/// Without a GPU, the status says why in words naming CUDA; with one, it is Ok.
#[test]
fn cuda_status_says_why_without_a_gpu() {
    match tch_memprof::cuda::status() {
        Err(why) => {
            assert!(!tch::Cuda::is_available(), "an error with a GPU: {why}");
            assert!(why.contains("CUDA"), "{why}");
        }
        Ok(()) => assert!(tch::Cuda::is_available(), "Ok without a GPU"),
    }
}

#[test]
#[ignore = "needs a CUDA device (scripts/gpu/run.sh runs it with --include-ignored)"]
fn profiler_matches_the_allocator_on_a_gpu() {
    let _serial = common::serial();
    common::need_cuda(
        "no CUDA device: the profiler's allocated bytes against the caching allocator's \
             counter, and the weights, gradients and Adam state by hand",
    );
    let dev = Device::Cuda(0);
    let vs = nn::VarStore::new(dev);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 1024, 4096, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 4096, 10, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut p = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    // Every block the caching allocator hands out is rounded up to 512 bytes.
    let round = |n: u64| n.div_ceil(512) * 512;
    // Weights: 4 x (1024x4096 + 4096 + 4096x10 + 10), each rounded.
    let w = round(4 * 1024 * 4096) + round(4 * 4096) + round(4 * 4096 * 10) + round(4 * 10);
    for _ in 0..3 {
        let x = Tensor::randn([256, 1024], (Kind::Float, dev));
        let y = Tensor::randint(10, [256], (Kind::Int64, dev));
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        p.record_stats();
        // The allocator's counter read here, after the report, with nothing allocated
        // in between.
        let now = tch_memprof::cuda::stats(0).unwrap();
        let s = p.last_stats().unwrap();
        let c = s.cuda.expect("allocator statistics on CUDA");
        assert_eq!(s.allocated_bytes as i64, c.allocated_current);
        assert_eq!(s.allocated_bytes as i64, now.allocated_current);
        assert!(c.reserved_current >= c.allocated_current);
        assert_eq!(
            s.allocated_bytes,
            s.weights_bytes
                + s.gradients_bytes
                + s.optimizer_state_bytes
                + s.blas_workspaces_bytes
                + s.other_bytes
        );
        let each: Vec<(String, u64)> = s
            .variables
            .iter()
            .map(|v| (v.name.clone(), v.bytes))
            .collect();
        assert_eq!(s.weights_bytes, w, "step {}: variables {each:?}", s.step);
        assert_eq!(s.gradients_bytes, w, "one gradient per weight, same shape");
        assert_eq!(
            s.optimizer_state_bytes,
            2 * w,
            "Adam: exp_avg and exp_avg_sq"
        );
        // x, y and the loss are alive at the report: 1 MiB, 2 KiB and one f32 scalar.
        let live = round(4 * 256 * 1024) + round(8 * 256) + round(4);
        assert!(s.other_bytes >= live, "{} < {live}", s.other_bytes);
    }
    // The cuBLAS workspaces the products took (the training thread's and the autograd
    // engine's), named apart from "other": the report's figure is what leaves the
    // allocator's counter when PyTorch releases them.
    let s = p.last_stats().unwrap();
    let ws = tch_memprof::cuda::blas_workspaces().unwrap();
    println!(
        "cuBLAS workspaces: {ws:?}; the report: {} B",
        s.blas_workspaces_bytes
    );
    assert!(
        s.blas_workspaces_bytes > 0,
        "a matrix product took no workspace"
    );
    let before = tch_memprof::cuda::stats(0).unwrap().allocated_current;
    tch_memprof::cuda::clear_cublas_workspaces().unwrap();
    let after = tch_memprof::cuda::stats(0).unwrap().allocated_current;
    assert_eq!((before - after) as u64, s.blas_workspaces_bytes);
    assert!(tch_memprof::cuda::blas_workspaces().unwrap().is_empty());
    assert_eq!(p.failures(), 0);
}

/// A second profiler in one process: between two sessions no reporter is installed, so
/// the frees of that time go unseen, and the caching allocator hands their addresses
/// out again. A block freed there and a weight made at its address afterwards: the new
/// profiler counts the weight at its own size, not at the size of the block that went,
/// and its peak is its own, not the allocated bytes the first session last saw.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu/run.sh runs it with --include-ignored)"]
fn a_second_profiler_forgets_blocks_freed_between_sessions() {
    let _serial = common::serial();
    common::need_cuda(
        "no CUDA device: the CUDA block table of a second profiler after blocks freed \
             between sessions",
    );
    let dev = Device::Cuda(0);
    tch_memprof::cuda::empty_cache().unwrap();
    let first = nn::VarStore::new(dev);
    let p = MemoryProfiler::builder(&first)
        .print(false)
        .build()
        .unwrap();
    // 4 MiB, from a new 20 MiB segment of the large pool (its first block).
    let gone = Tensor::zeros([1 << 20], (Kind::Float, dev));
    let addr = gone.data_ptr() as usize;
    // 64 MiB more: the allocated bytes last reported in the first session.
    let big = Tensor::zeros([16 << 20], (Kind::Float, dev));
    drop(p);
    drop(gone); // unseen: no session
    drop(big);
    tch_memprof::cuda::reset_peak_stats(0).unwrap();
    // 6 MiB: the best fit is the freed segment, from its start.
    let second = nn::VarStore::new(dev);
    let w = second.root().zeros("w", &[3 << 19]);
    let same = w.data_ptr() as usize == addr;
    let mut p = MemoryProfiler::builder(&second)
        .print(false)
        .build()
        .unwrap();
    p.record_stats();
    let s = p.last_stats().unwrap();
    assert_eq!(
        s.weights_bytes,
        6 << 20,
        "the weight at the freed block's address ({}) counted at that block's size",
        if same { "same" } else { "not the same" }
    );
    // Nor does the first session's last report stand for this one's peak.
    let allocator = tch_memprof::cuda::stats(0).unwrap();
    assert!(
        s.peak_allocated_bytes as i64 <= allocator.allocated_peak,
        "peak {} above the allocator's own {}",
        s.peak_allocated_bytes,
        allocator.allocated_peak
    );
    assert_eq!(p.failures(), 0);
}

/// The explicit allocator calls and snapshots fail softly without a GPU, each with a
/// reason; with one, they succeed.
#[test]
fn allocator_calls_answer_as_pytorch_before_a_cuda_tensor_and_fail_in_one_line_without_cuda() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    let e = p.write_cuda_allocator_snapshot("x.pickle").unwrap_err();
    assert!(e.to_string().contains("CUDA VarStore"), "{e}");
    drop(p);
    if tch::Cuda::is_available() {
        // Whether or not a test before this one made a CUDA tensor: before one,
        // torch.cuda.memory_stats() answers with zeros and reset/empty do nothing;
        // after, the allocator's counters. Either way no error.
        let s = tch_memprof::cuda::stats(0).unwrap();
        assert!(s.allocated_current >= 0 && s.reserved_current >= s.allocated_current);
        tch_memprof::cuda::reset_peak_stats(0).unwrap();
        tch_memprof::cuda::empty_cache().unwrap();
        tch_memprof::cuda::clear_cublas_workspaces().unwrap();
        tch_memprof::cuda::blas_workspaces().unwrap();
        // A device the machine lacks: refused in one line that names it.
        let n = tch::Cuda::device_count() as usize;
        let e = tch_memprof::cuda::stats(n).unwrap_err().to_string();
        assert!(
            e.contains(&format!("cuda:{n}")) && e.lines().count() == 1,
            "{e}"
        );
        return;
    }
    for (what, r) in [
        ("stats", tch_memprof::cuda::stats(0).map(|_| ())),
        ("reset_peak_stats", tch_memprof::cuda::reset_peak_stats(0)),
        ("empty_cache", tch_memprof::cuda::empty_cache()),
        (
            "clear_cublas_workspaces",
            tch_memprof::cuda::clear_cublas_workspaces(),
        ),
        (
            "blas_workspaces",
            tch_memprof::cuda::blas_workspaces().map(|_| ()),
        ),
    ] {
        let e = r.expect_err(what).to_string();
        assert!(e.contains("CUDA is not available"), "{what}: {e}");
        assert_eq!(e.lines().count(), 1, "{what}: {e}");
    }
    assert!(tch_memprof::cuda::devices_in_use().is_empty());
}

/// With a GPU: the allocator calls' effect on its counters, a CUDA snapshot, and an
/// out-of-memory error provoked on purpose that is reported while the loop goes on.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu/run.sh runs it with --include-ignored)"]
fn allocator_calls_snapshots_and_oom_on_cuda() {
    let _serial = common::serial();
    common::need_cuda(
        "no CUDA device: empty_cache, reset_peak_stats, CUDA snapshots and the OOM report",
    );
    let dir = tempfile::tempdir().unwrap();
    let dev = Device::Cuda(0);
    let vs = nn::VarStore::new(dev);
    let net = nn::linear(vs.root() / "l1", 1024, 1024, Default::default());
    let mut p = common::quiet_csv(&vs, dir.path()).build().unwrap();
    p.start_memory_history(100_000).unwrap();
    let big = Tensor::zeros([64 << 20], (Kind::Float, dev)); // 256 MiB
    drop(big);
    let s = tch_memprof::cuda::stats(0).unwrap();
    assert!(s.reserved_current >= s.allocated_current + (256 << 20));
    tch_memprof::cuda::empty_cache().unwrap();
    let after = tch_memprof::cuda::stats(0).unwrap();
    assert!(
        after.reserved_current < s.reserved_current,
        "the cache was emptied"
    );
    assert_eq!(after.allocated_current, s.allocated_current);
    tch_memprof::cuda::reset_peak_stats(0).unwrap();
    let reset = tch_memprof::cuda::stats(0).unwrap();
    assert_eq!(reset.allocated_peak, reset.allocated_current);

    let x = Tensor::randn([256, 1024], (Kind::Float, dev));
    let y = net.forward(&x);
    let ours = dir.path().join("ours.pickle");
    p.write_memory_snapshot(&ours).unwrap();
    let theirs = dir.path().join("allocator.pickle");
    p.write_cuda_allocator_snapshot(&theirs).unwrap();
    assert!(std::fs::metadata(&ours).unwrap().len() > 0);
    assert!(std::fs::metadata(&theirs).unwrap().len() > 0);

    // Out of memory on purpose: twice the device's memory.
    let total = tch_memprof::cuda::stats(0).unwrap().total_bytes;
    let huge = Tensor::f_empty([total / 2], (Kind::Float, dev));
    assert!(huge.is_err());
    let r = p.last_oom().expect("OOM report");
    assert_eq!(r.device, "cuda:0");
    assert!(r.requested_bytes >= total as u64 * 2);
    assert_eq!(
        r.by_category.iter().map(|(_, b)| b).sum::<u64>(),
        r.allocated_bytes
    );
    assert!(r.report_path.as_ref().is_some_and(|f| f.exists()));
    assert!(r.snapshot_path.as_ref().is_some_and(|f| f.exists()));
    drop((x, y));
    p.record_stats(); // writes the allocator snapshot owed since the OOM
    assert_eq!(p.failures(), 0);
    let owed = std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .ends_with("_oom1_allocator.pickle")
    });
    assert!(owed, "the allocator snapshot after the OOM");
    let last = p.last_stats().unwrap();
    assert_eq!(last.cuda_devices[0].0, 0);
    assert_eq!(last.cuda.unwrap().ooms, 1);
}
