//! Forward FLOPs of torchvision-style ResNets (tch::vision::resnet) at 224x224 against
//! their published cost: 1.82, 4.11 and 11.51 billion multiply-adds for ResNet-18, -50
//! and -152 (a multiply-add counts 2 FLOPs). The count also includes batch norm, ReLU,
//! pooling and residual additions, which the published figures leave out; they add
//! well under 2%.

mod common;

use std::path::Path;

use tch::nn::ModuleT;
use tch::{nn, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

fn within(got: u64, expected: f64, tolerance: f64) -> bool {
    ((got as f64 - expected) / expected).abs() <= tolerance
}

/// Forward FLOPs of one eval-mode pass at batch `b`, from the step profile.
fn forward_flops(vs: &nn::VarStore, net: &impl ModuleT, b: i64, csv_dir: Option<&Path>) -> u64 {
    let _guard = common::serial();
    let mut builder = MemoryProfiler::builder(vs).print(false).timeline_step(1);
    if let Some(dir) = csv_dir {
        builder = builder.csv(true).csv_dir(dir);
    }
    let mut prof = builder.build().unwrap();
    {
        let _no_grad = tch::no_grad_guard();
        let x = Tensor::randn([b, 3, 224, 224], (Kind::Float, Device::Cpu));
        let _ = net.forward_t(&x, false);
    }
    prof.record_stats();
    assert_eq!(prof.failures(), 0);
    prof.step_profile().unwrap().forward_flops
}

#[test]
fn resnet18_and_resnet50_forward_flops_match_the_published_cost() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = tch::vision::resnet::resnet18(&vs.root(), 1000);
    let got = forward_flops(&vs, &net, 1, None);
    eprintln!(
        "ResNet-18 forward FLOPs at 224x224: {got} ({:.4} x 2 x 1.82e9)",
        got as f64 / 3.64e9
    );
    assert!(within(got, 2.0 * 1.82e9, 0.02), "ResNet-18: {got}");

    let vs = nn::VarStore::new(Device::Cpu);
    let net = tch::vision::resnet::resnet50(&vs.root(), 1000);
    let got = forward_flops(&vs, &net, 1, None);
    eprintln!(
        "ResNet-50 forward FLOPs at 224x224: {got} ({:.4} x 2 x 4.11e9)",
        got as f64 / 8.22e9
    );
    assert!(within(got, 2.0 * 4.11e9, 0.02), "ResNet-50: {got}");
}

#[test]
fn resnet152_forward_flops_in_layers_csv_scale_with_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = tch::vision::resnet::resnet152(&vs.root(), 1000);
    let b = 2;
    let total = forward_flops(&vs, &net, b, Some(dir.path()));
    let layers = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("_step1_layers.csv"))
        .expect("layers CSV of step 1");
    let mut reader = csv::Reader::from_path(&layers).unwrap();
    let headers = reader.headers().unwrap().clone();
    assert_eq!(
        headers.iter().collect::<Vec<_>>(),
        [
            "layer",
            "parameters_bytes",
            "activation_bytes",
            "forward_flops",
            "backward_flops"
        ]
    );
    let mut from_csv = 0u64;
    let mut rows = 0;
    for r in reader.records() {
        let r = r.unwrap();
        from_csv += r[3].parse::<u64>().unwrap();
        rows += 1;
    }
    assert!(
        rows > 150,
        "ResNet-152 has more than 150 layers with variables: {rows}"
    );
    assert_eq!(from_csv, total, "the CSV holds every forward FLOP");
    let expected = 2.0 * 11.51e9 * b as f64;
    eprintln!(
        "ResNet-152 forward FLOPs at 224x224, batch {b}: {from_csv} ({:.4} x 2 x 11.51e9 x {b})",
        from_csv as f64 / expected
    );
    assert!(
        within(from_csv, expected, 0.02),
        "ResNet-152 at batch {b}: {from_csv} vs {expected}"
    );
}
