//! A tensor of N bytes moves the CPU's live bytes by exactly N, and its drop moves
//! them back. One test function: the counter is process-wide, so nothing else may
//! allocate concurrently in this process.

use tch::{Device, Kind, Tensor};
use tch_memprof::__private::{cpu_live_bytes, cpu_tracking_installed};

#[test]
fn live_bytes_move_by_exactly_the_tensor_size() {
    assert!(
        cpu_tracking_installed(),
        "the tracking allocator is installed at load"
    );
    let cases: [(&[i64], Kind, i64); 7] = [
        (&[1000], Kind::Float, 4000),
        (&[3, 5], Kind::Double, 3 * 5 * 8),
        (&[7], Kind::Int8, 7),
        (&[13], Kind::Bool, 13),
        (&[2, 3, 4], Kind::Half, 2 * 3 * 4 * 2),
        (&[1 << 20], Kind::Int64, 8 << 20),
        (&[1], Kind::BFloat16, 2),
    ];
    for (shape, kind, bytes) in cases {
        let before = cpu_live_bytes();
        let t = Tensor::zeros(shape, (kind, Device::Cpu));
        assert_eq!(cpu_live_bytes() - before, bytes, "{shape:?} {kind:?}");
        drop(t);
        assert_eq!(cpu_live_bytes(), before, "{shape:?} {kind:?} freed");
    }

    // An empty tensor allocates nothing; a view shares its base's block.
    let before = cpu_live_bytes();
    let empty = Tensor::zeros([0], (Kind::Float, Device::Cpu));
    assert_eq!(cpu_live_bytes(), before);
    drop(empty);

    let base = Tensor::zeros([100, 10], (Kind::Float, Device::Cpu));
    let after_base = cpu_live_bytes();
    assert_eq!(after_base - before, 4000);
    let view = base.narrow(0, 10, 20);
    assert_eq!(cpu_live_bytes(), after_base, "a view allocates nothing");
    let copy = view.copy();
    assert_eq!(
        cpu_live_bytes() - after_base,
        20 * 10 * 4,
        "a copy of the view"
    );
    drop(base);
    assert_eq!(
        cpu_live_bytes() - before,
        4000 + 800,
        "the view keeps the block alive"
    );
    drop(view);
    drop(copy);
    assert_eq!(cpu_live_bytes(), before);
}
