//! Command-line options shared by the examples (`#[path]`-included by each).
#![allow(dead_code)]

use tch::Device;

/// The value after `name`, if given.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Whether `name` is given.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// A positive integer after `name`, or `default`.
pub fn number(name: &str, default: i64) -> Result<i64, String> {
    match arg(name) {
        None => Ok(default),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{name} {v}: expected a positive integer")),
        },
    }
}

/// `--device cpu|cuda`, or `default` when not given; CUDA must be usable.
pub fn device(default: Device) -> Result<Device, String> {
    match arg("--device").as_deref() {
        None => Ok(default),
        Some("cpu") => Ok(Device::Cpu),
        Some("cuda") if tch::Cuda::is_available() => Ok(Device::Cuda(0)),
        Some("cuda") => Err(format!(
            "--device cuda: CUDA is not available ({})",
            tch_memprof::cuda::status().err().unwrap_or_default()
        )),
        Some(other) => Err(format!("--device {other}: expected cpu or cuda")),
    }
}
