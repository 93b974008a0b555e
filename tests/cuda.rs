//! CUDA: on a machine without a GPU every CUDA path fails softly with a message (checked
//! here, on CPU-only CI); with a GPU, the profiler's allocated bytes equal the caching
//! allocator's own counter at every report and the categories add up.

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

#[test]
fn cuda_fails_softly_without_a_gpu_and_matches_the_allocator_with_one() {
    if !tch::Cuda::is_available() {
        let why = tch_memprof::cuda_status().expect_err("no CUDA here, so an error");
        assert!(why.contains("CUDA"), "{why}");
        // Written to the stderr handle, not eprintln!, so the test harness shows it.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "cuda: skipped the GPU checks: {why}");
        return;
    }
    let dev = Device::Cuda(0);
    let vs = nn::VarStore::new(dev);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 1024, 4096, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 4096, 10, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut p = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    for _ in 0..3 {
        let x = Tensor::randn([256, 1024], (Kind::Float, dev));
        let y = Tensor::randint(10, [256], (Kind::Int64, dev));
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        p.record_stats();
        let s = p.last_stats().unwrap();
        let c = s.cuda.expect("allocator statistics on CUDA");
        assert_eq!(s.allocated_bytes as i64, c.allocated_current);
        assert_eq!(
            s.allocated_bytes,
            s.weights_bytes + s.gradients_bytes + s.optimizer_state_bytes + s.other_bytes
        );
        // Weights: 4 x (1024x4096 + 4096 + 4096x10 + 10), each rounded to 512 bytes.
        let round = |n: u64| n.div_ceil(512) * 512;
        let w = round(4 * 1024 * 4096) + round(4 * 4096) + round(4 * 4096 * 10) + round(4 * 10);
        assert_eq!(s.weights_bytes, w);
        assert_eq!(s.optimizer_state_bytes, 2 * w);
    }
    assert_eq!(p.failures(), 0);
}
