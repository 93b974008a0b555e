//! GPUs the estimator knows by name: their memory and the size of the cuBLAS workspace
//! PyTorch takes on them.

use crate::error::{Error, Result};

/// Bytes in a MiB.
const MIB: u64 = 1 << 20;

/// The cuBLAS workspace PyTorch 2.11 takes by default (`CUBLAS_WORKSPACE_CONFIG`
/// unset; CublasHandlePool.cpp): `:4096:2:16:8` (2 chunks of 4096 KiB and 8 of 16 KiB)
/// before Hopper.
pub const CUBLAS_WORKSPACE_DEFAULT: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;
/// ... and `:4096:8` (8 chunks of 4096 KiB) on compute capability 9.0 (Hopper) and 10.0.
pub const CUBLAS_WORKSPACE_SM90: u64 = 4096 * 1024 * 8;

/// The cuBLASLt workspace PyTorch 2.11 takes by default (`CUBLASLT_WORKSPACE_SIZE`
/// unset): 1 MiB, kept apart from the cuBLAS one unless
/// `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`.
pub const CUBLASLT_WORKSPACE: u64 = 1024 * 1024;

/// The memory set aside for the CUDA context when a GPU's usable memory is derived from
/// its total ([`Gpu::usable`]): the driver's and the CUDA libraries' own memory, which
/// PyTorch's allocator cannot use. An allowance, not a measurement: it varies with the
/// GPU, the driver and the libraries loaded.
pub const CONTEXT_ALLOWANCE: u64 = 1024 * MIB;

/// A GPU: what the estimate needs to know of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Its name.
    pub name: String,
    /// Total memory in bytes (as `nvidia-smi` lists it); 0 when unknown.
    pub memory: u64,
    /// cuBLAS workspace PyTorch takes per thread that runs cuBLAS.
    pub cublas_workspace: u64,
    /// Compute capability, major * 10 + minor (`90` = 9.0): which attention kernels
    /// PyTorch's CUDA build picks on it.
    pub sm: u32,
    /// Streaming multiprocessors: how CUDA's reductions (sum, mean) split across thread
    /// blocks, which sizes the buffer they take for the blocks' partial results.
    pub multiprocessors: u32,
    /// The threads a multiprocessor holds at once (the same reductions' split).
    pub threads_per_multiprocessor: u32,
}

/// The compute capability [`Gpu::generic`] assumes: 8.0 (an A100), the oldest that runs
/// every fused attention kernel, before Hopper as its cuBLAS workspace.
pub const GENERIC_SM: u32 = 80;

/// The streaming multiprocessors [`Gpu::generic`] assumes: an A100's.
pub const GENERIC_MULTIPROCESSORS: u32 = 108;

/// (name, total MiB as nvidia-smi lists it, Hopper or later, compute capability,
/// streaming multiprocessors), from NVIDIA's specifications (the H100 is the SXM one).
const KNOWN: [(&str, u64, bool, u32, u32); 12] = [
    ("t4", 15_360, false, 75, 40),
    ("v100-16gb", 16_384, false, 70, 80),
    ("v100-32gb", 32_768, false, 70, 80),
    ("a10", 23_028, false, 86, 72),
    ("l4", 23_034, false, 89, 58),
    ("rtx3090", 24_576, false, 86, 82),
    ("rtx4090", 24_564, false, 89, 128),
    ("a100-40gb", 40_960, false, 80, 108),
    ("a100-80gb", 81_920, false, 80, 108),
    ("l40s", 46_068, false, 89, 142),
    ("h100", 81_559, true, 90, 132),
    ("h200", 143_771, true, 90, 132),
];

/// cuDNN's workspace inside each convolution and convolution backward an NVIDIA H200
/// ran in 9 torchvision, timm and transformers models (PyTorch 2.11.0+cu130 and the
/// cuDNN 9 it bundles, `cudnn.benchmark` off, 2026-11-26), a line a distinct call: the
/// call's arguments as the measuring script wrote them, a tab, the most the call held
/// at once above what it left (`scripts/conv-workspace-table.py` writes it from
/// `tests/data/gpu-truth/h200-2026-11-26/workspaces.csv`). An NVIDIA H100 SXM measured
/// the same peaks for every convolution net but VGG-16's training, 125 KiB lower
/// (`tests/data/gpu-truth/h100-2026-11-26`), so the table is taken for it too.
const SM90_CONV_WORKSPACES: &str = include_str!("conv_workspaces_sm90.tsv");

/// The threads a streaming multiprocessor holds at once, by compute capability
/// (CUDA's programming guide, "Technical Specifications per Compute Capability").
fn threads_per_multiprocessor(sm: u32) -> u32 {
    match sm {
        75 => 1024,
        86 | 87 | 89 => 1536,
        _ => 2048,
    }
}

/// The most streaming multiprocessors of a GPU [`Gpu::named`] knows.
pub(crate) fn most_multiprocessors() -> u32 {
    KNOWN
        .iter()
        .map(|k| k.4)
        .max()
        .unwrap_or(GENERIC_MULTIPROCESSORS)
}

impl Gpu {
    /// A GPU of unknown memory before Hopper (the default cuBLAS workspace), of compute
    /// capability 8.0 (an A100: the oldest that runs every fused attention kernel) for the choice of attention kernels.
    pub fn generic() -> Gpu {
        Gpu {
            name: "generic (pre-Hopper)".to_string(),
            memory: 0,
            cublas_workspace: CUBLAS_WORKSPACE_DEFAULT,
            sm: GENERIC_SM,
            multiprocessors: GENERIC_MULTIPROCESSORS,
            threads_per_multiprocessor: threads_per_multiprocessor(GENERIC_SM),
        }
    }

    /// The names [`Gpu::named`] knows.
    pub fn known() -> Vec<&'static str> {
        KNOWN.iter().map(|(n, ..)| *n).collect()
    }

    /// A GPU by name: `h100`, `a100-80gb` (`a100` alone is the 80 GB one), `rtx4090`, ...
    /// (case, spaces, `-` and `_` do not matter: `A100 80GB` works).
    pub fn named(name: &str) -> Result<Gpu> {
        let key: String = name
            .to_ascii_lowercase()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        let key = match key.as_str() {
            "a100" => "a10080gb".to_string(),
            "v100" => "v10032gb".to_string(),
            "h100sxm" | "h10080gb" => "h100".to_string(),
            "geforcertx4090" => "rtx4090".to_string(),
            "geforcertx3090" => "rtx3090".to_string(),
            _ => key,
        };
        KNOWN
            .iter()
            .find(|(n, ..)| n.replace('-', "") == key)
            .map(|(n, mib, hopper, sm, sms)| Gpu {
                name: (*n).to_string(),
                memory: mib * MIB,
                cublas_workspace: if *hopper {
                    CUBLAS_WORKSPACE_SM90
                } else {
                    CUBLAS_WORKSPACE_DEFAULT
                },
                sm: *sm,
                multiprocessors: *sms,
                threads_per_multiprocessor: threads_per_multiprocessor(*sm),
            })
            .ok_or_else(|| Error::InvalidInput {
                name: "gpu",
                value: name.to_string(),
                reason: format!("unknown GPU; known: {}", Gpu::known().join(", ")),
            })
    }

    /// The cuDNN convolution workspaces measured on a GPU like this one (a line a call,
    /// as [`SM90_CONV_WORKSPACES`]): those an NVIDIA H200 took, for any GPU of compute
    /// capability 9.0 with 132 multiprocessors (the H200 and the H100 SXM, whose peaks
    /// in every measured convolution net were the H200's); empty for another GPU, whose
    /// convolutions are charged the larger plausible size.
    pub(crate) fn measured_conv_workspaces(&self) -> &'static str {
        if self.sm == 90 && self.multiprocessors == 132 {
            SM90_CONV_WORKSPACES
        } else {
            ""
        }
    }

    /// Memory PyTorch's allocator can use: the total less 1 GiB kept for the CUDA context (an allowance, not a measurement); `None`
    /// when the total is unknown.
    pub fn usable(&self) -> Option<u64> {
        (self.memory > 0).then(|| self.memory.saturating_sub(CONTEXT_ALLOWANCE))
    }
}

/// Whether a `--memory` value is a size (`24GB`) rather than a GPU's name (`h100`): it
/// starts with a digit.
pub fn is_size(text: &str) -> bool {
    text.trim().starts_with(|c: char| c.is_ascii_digit())
}

/// Parses a memory size: `80GiB`, `24 GB` (10^9 bytes), `512MiB`, `1.5TiB`, `4096B`. A
/// number without a unit is refused: `24` is far likelier meant as 24 GB than as bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = |reason: &str| Error::InvalidInput {
        name: "memory",
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| bad("not a size (write 80GiB, 24GB, 512MiB or a GPU name such as h100)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => {
            return Err(bad(&format!(
                "a size needs a unit: {num}GiB, {num}GB, {num}MiB (or {num}B for bytes), \
                 or a GPU name such as h100"
            )))
        }
        "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad("unknown unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    let bytes = n * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(bad("out of range"));
    }
    Ok(bytes as u64)
}

/// A memory given as a size (`80GiB`) or a GPU name (`h100`: its usable memory,
/// [`Gpu::usable`]); the GPU too when a name was given.
pub fn gpu_memory(text: &str) -> Result<(u64, Option<Gpu>)> {
    if is_size(text) {
        return Ok((parse_size(text)?, None));
    }
    let gpu = Gpu::named(text)?;
    let usable = gpu.usable().unwrap_or(0);
    Ok((usable, Some(gpu)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_sizes_follow_the_cublas_workspace_config_strings() {
        // ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB; ":4096:8" = 8 x 4096 KiB.
        assert_eq!(CUBLAS_WORKSPACE_DEFAULT, 8 * MIB + 128 * 1024);
        assert_eq!(CUBLAS_WORKSPACE_SM90, 32 * MIB);
        assert_eq!(Gpu::named("H100").unwrap().cublas_workspace, 32 * MIB);
        assert_eq!(Gpu::named("rtx 4090").unwrap().cublas_workspace, 8_519_680);
    }

    #[test]
    fn names_and_sizes() {
        assert_eq!(Gpu::named("A100").unwrap().memory, 80 * 1024 * MIB);
        assert_eq!(Gpu::named("a100_40gb").unwrap().memory, 40 * 1024 * MIB);
        let err = Gpu::named("tpu").unwrap_err().to_string();
        assert!(err.contains("tpu") && err.contains("h100"), "{err}");
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("24 GB").unwrap(), 24_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        // No unit: refused, saying how to write it.
        let e = parse_size("24").unwrap_err().to_string();
        assert!(e.contains("needs a unit") && e.contains("24GiB"), "{e}");
        for bad in ["", "GiB", "12 parsecs", "-3GiB", "0"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Gpu::named("h100").unwrap().usable(),
            Some(81_559 * MIB - CONTEXT_ALLOWANCE)
        );
        assert_eq!(Gpu::generic().usable(), None);
    }
}
