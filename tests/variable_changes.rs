//! record_stats keeps what it knows of the variables between calls (names, shapes,
//! dtypes, the sums over their blocks) and redoes it only when something changed. These
//! are the changes a training program makes: a variable added after the profiler
//! started, a variable's storage replaced (`set_data`, as loading into a new storage
//! does), a dtype change, and gradients appearing. Each report must show the store as
//! it is at that call, byte for byte.

mod common;
use common::*;
use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

fn by_name<'a>(s: &'a tch_memprof::IterationStats, name: &str) -> &'a tch_memprof::VariableStats {
    s.variables
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| {
            panic!(
                "{name} not among {:?}",
                s.variables.iter().map(|v| &v.name).collect::<Vec<_>>()
            )
        })
}

#[test]
fn each_report_shows_the_variables_as_they_are_at_that_call() {
    let _guard = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let fc = nn::linear(vs.root() / "fc", 8, 4, Default::default());
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    let linear = F32 * (8 * 4 + 4);

    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    assert_eq!(s.weights_bytes, linear);
    assert_eq!(s.gradients_bytes, 0, "no backward yet");
    assert_eq!(s.variables.len(), 2);

    // Gradients appear.
    fc.forward(&Tensor::ones([3, 8], (Kind::Float, Device::Cpu)))
        .sum(Kind::Float)
        .backward();
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    assert_eq!(s.gradients_bytes, linear);
    assert_eq!(by_name(&s, "fc.weight").grad_bytes, Some(F32 * 32));

    // A variable added after the profiler started: its name sorts first.
    let extra = vs.root().var("aaa_extra", &[100], nn::Init::Const(0.0));
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    assert_eq!(s.weights_bytes, linear + F32 * 100);
    assert_eq!(&*s.variables[0].name, "aaa_extra");
    assert_eq!(by_name(&s, "aaa_extra").grad_bytes, None);

    // Its storage replaced by a larger one of another shape.
    tch::no_grad(|| {
        let mut t = extra.shallow_clone();
        t.set_data(&Tensor::zeros([10, 30], (Kind::Float, Device::Cpu)));
    });
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    let v = by_name(&s, "aaa_extra");
    assert_eq!((v.bytes, v.shape.as_slice()), (F32 * 300, &[10i64, 30][..]));
    assert_eq!(s.weights_bytes, linear + F32 * 300);

    // And by one of another dtype.
    tch::no_grad(|| {
        let mut t = extra.shallow_clone();
        t.set_data(&Tensor::zeros([300], (Kind::Double, Device::Cpu)));
    });
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    let v = by_name(&s, "aaa_extra");
    assert_eq!((v.bytes, v.dtype.as_str()), (8 * 300, "Double"));
    assert_eq!(s.weights_bytes, linear + 8 * 300);
    assert_eq!(
        s.gradients_bytes, linear,
        "the linear layer's gradients kept"
    );
    assert_eq!(profiler.failures(), 0);

    // Nothing changed: the same variables, shared with the previous report, not copied.
    let before = profiler.last_stats().unwrap().variables.clone();
    profiler.record_stats();
    let after = &profiler.last_stats().unwrap().variables;
    assert_eq!(&before, after);
    assert!(
        std::ptr::eq(before.as_ptr(), after.as_ptr()),
        "rebuilt without a change"
    );
}

/// Once every variable has a gradient, record_stats re-reads the variables' blocks only
/// after a free of one of them, and their gradients' blocks only after a free of one of
/// those (the native layer counts those frees). Each change below happens in that
/// state, and each must show in the next report.
#[test]
fn changes_show_once_every_variable_has_a_gradient() {
    let _guard = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let fc = nn::linear(vs.root() / "fc", 8, 4, Default::default());
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    let step = || {
        fc.forward(&Tensor::ones([3, 8], (Kind::Float, Device::Cpu)))
            .sum(Kind::Float)
            .backward()
    };
    let linear = F32 * (8 * 4 + 4);
    step();
    profiler.record_stats();
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    assert_eq!((s.weights_bytes, s.gradients_bytes), (linear, linear));

    // An optimizer's zero_grad sets the gradients to none (libtorch's default), and the
    // next backward pass makes new ones.
    let mut opt = nn::Sgd::default().build(&vs, 0.0).unwrap();
    opt.zero_grad();
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    assert_eq!((s.weights_bytes, s.gradients_bytes), (linear, 0));
    assert_eq!(by_name(&s, "fc.weight").grad_bytes, None);
    for _ in 0..2 {
        opt.zero_grad();
        step();
        profiler.record_stats();
        let s = profiler.last_stats().unwrap().clone();
        assert_eq!((s.weights_bytes, s.gradients_bytes), (linear, linear));
        assert_eq!(by_name(&s, "fc.weight").grad_bytes, Some(F32 * 32));
    }
    drop(opt);

    // A weight's storage replaced (its old block freed).
    tch::no_grad(|| {
        let mut w = fc.ws.shallow_clone();
        w.set_data(&Tensor::zeros([4, 16], (Kind::Float, Device::Cpu)));
    });
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    let w = by_name(&s, "fc.weight");
    assert_eq!((w.bytes, w.shape.as_slice()), (F32 * 64, &[4i64, 16][..]));
    assert_eq!(s.weights_bytes, F32 * (64 + 4));

    // A gradient's storage replaced (its old block freed).
    tch::no_grad(|| {
        let mut g = fc.bs.as_ref().unwrap().grad();
        g.set_data(&Tensor::zeros([40], (Kind::Float, Device::Cpu)));
    });
    profiler.record_stats();
    let s = profiler.last_stats().unwrap().clone();
    assert_eq!(by_name(&s, "fc.bias").grad_bytes, Some(F32 * 40));
    assert_eq!(s.gradients_bytes, F32 * (32 + 40));

    // A freed gradient that is not a variable's changes nothing in the report.
    let other = Tensor::ones([5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    other.sum(Kind::Float).backward();
    drop(other);
    profiler.record_stats();
    let s2 = profiler.last_stats().unwrap().clone();
    assert_eq!(
        (s2.weights_bytes, s2.gradients_bytes),
        (s.weights_bytes, s.gradients_bytes)
    );
    assert_eq!(profiler.failures(), 0);
}
