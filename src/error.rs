//! Errors of the profiler.

use std::path::PathBuf;

/// What can go wrong when building or driving a [`MemoryProfiler`](crate::MemoryProfiler).
///
/// `record_stats` and `epoch_end` never return these: failures there are logged and
/// counted (see [`MemoryProfiler::failures`](crate::MemoryProfiler::failures)) so that
/// a training run never stops because of its profiler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder value is out of range or unusable.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidConfig {
        /// The builder setting.
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// Another `MemoryProfiler` is alive in this process.
    #[error(
        "a MemoryProfiler is already active in this process (one at a time: the allocator \
         hooks are process-wide); drop the other one first"
    )]
    AlreadyActive,
    /// A file or folder could not be created, written or read.
    #[error("{path}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A CSV file could not be written.
    #[error("{path}: {source}")]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: csv::Error,
    },
    /// A plot could not be drawn or written.
    #[error("{path}: plot failed: {reason}")]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The native layer (libtorch) reported an error.
    #[error("native layer: {0}")]
    Native(String),
    /// A run's files could not be found or read back (see [`runs`](crate::runs)).
    #[error("{0}")]
    Run(String),
    /// A value given to the estimate (a shape, a dtype, a batch size, a GPU, a memory
    /// size, an optimizer, a model name) is out of range or unknown.
    #[error("invalid {name} {value:?}: {reason}")]
    InvalidInput {
        /// What the value is (`input shape`, `gpu`, ...).
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// `PYTORCH_CUDA_ALLOC_CONF` (or `PYTORCH_ALLOC_CONF`) cannot be read: the message
    /// names the key and the value.
    #[error("{0}")]
    AllocatorConf(String),
    /// A recorded run (a memory snapshot, a history) could not be read.
    #[error("{path}: {reason}")]
    Recording {
        /// The file.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// A model file could not be loaded (not TorchScript, unreadable).
    #[error("{path}: {reason}")]
    ModelLoad {
        /// The file.
        path: PathBuf,
        /// libtorch's reason, first line only.
        reason: String,
    },
    /// The model failed its dry run on the meta device, or its real step: the op or
    /// step that failed and libtorch's reason, in one line.
    #[error("{model}: {reason}")]
    DryRun {
        /// The model (its file name or built-in name).
        model: String,
        /// What failed and why, in one line.
        reason: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

thread_local! {
    /// Depth of [`catching`] calls on this thread: panics inside are expected and turned
    /// into errors, so the panic hook stays quiet for them.
    static CATCHING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

static QUIET_HOOK: std::sync::Once = std::sync::Once::new();

/// Runs `f`, turning a panic of the model's code (tch's panicking wrappers panic on
/// libtorch errors, such as a shape a layer rejects) into libtorch's message in one line.
/// The panic prints nothing: a panic hook, installed once and chained to the one before
/// it, stays quiet inside `catching` and reports every other panic as before.
pub(crate) fn catching<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CATCHING.with(|c| c.get()) == 0 {
                previous(info);
            }
        }));
    });
    CATCHING.with(|c| c.set(c.get() + 1));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(c.get() - 1));
    result.map_err(|p| torch_message(&panic_message(p.as_ref())))
}

/// The text of a panic's payload (`panic!` with a string or a format).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".to_string())
}

/// The first line of libtorch's message inside a tch panic or error text, without
/// `called Result::unwrap()...Torch("` and without the C++ stack frames.
pub(crate) fn torch_message(text: &str) -> String {
    let start = text.find("Torch(\"").map_or(0, |i| i + 7);
    let mut rest = &text[start..];
    rest = rest.strip_prefix("native layer: ").unwrap_or(rest);
    // A dry run of a TorchScript file names the module the failing op ran in.
    let mut module = None;
    if let Some(after) = rest.strip_prefix("in module ") {
        if let Some((name, cause)) = after.split_once(": ") {
            module = Some(name);
            rest = cause;
        }
    }
    let line = torch_line(rest);
    match module {
        Some(m) => format!("{line} (in module {m})"),
        None => line,
    }
}

/// Ops whose result's size (or the value they return) is read from their input's data:
/// a dry run on the meta device has no data, so a model that calls them cannot be
/// estimated.
const DATA_DEPENDENT: &[&str] = &[
    "aten::nonzero",
    "aten::nonzero_numpy",
    "aten::argwhere",
    "aten::masked_select",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::unique_dim_consecutive",
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::repeat_interleave",
    "aten::bincount",
    "aten::histc",
    "aten::_assert_async",
    "aten::allclose",
];

/// The cause of a libtorch error in one line.
fn torch_line(text: &str) -> String {
    let mut rest = text;
    // The TorchScript interpreter's errors open with a fixed line and a traceback of
    // TorchScript code; the cause is on the last line that names an error.
    if rest.starts_with("The following operation failed in the TorchScript interpreter") {
        let lines: Vec<&str> = rest.split("\\n").flat_map(|l| l.split('\n')).collect();
        if let Some(cause) = lines.iter().rev().find_map(|l| {
            let l = l.trim();
            l.find("Error: ").map(|i| &l[i + "Error: ".len()..])
        }) {
            rest = cause;
        }
    }
    let end = ["\\n", "\n", "Exception raised from", "\")"]
        .iter()
        .filter_map(|pat| rest.find(pat))
        .min()
        .unwrap_or(rest.len());
    let line = rest[..end].trim();
    // An op libtorch's C++ has no meta kernel for: say so in a few words.
    if let Some((op, _)) = line.split_once(": attempted to run this operator with Meta tensors") {
        if DATA_DEPENDENT.contains(&op) {
            return format!(
                "{op} depends on the values of its input (the size of its result, or a \
                 branch taken on it), which a dry run does not have: this model's step \
                 depends on its data (a mixture of experts' routing, a boolean mask, \
                 `.item()`), so it cannot be estimated; `tch-memprof profile` measures it \
                 on the CPU"
            );
        }
        return format!(
            "{op} has no meta kernel in libtorch's C++, so the dry run cannot run it \
             (tch-memprof registers the ones it knows; this one is missing; \
             `tch-memprof profile` measures the step on the CPU instead)"
        );
    }
    // A value copied to the host from a meta tensor.
    if line.starts_with("Cannot copy out of meta tensor") {
        return "the step copies a tensor's values to the host (`.item()`, `f64::try_from`, \
                `.to(Device::Cpu)`, tch's `clip_grad_norm`), which a dry run does not have: \
                the step depends on its data, so it cannot be estimated as written"
            .to_string();
    }
    // A file traced in eval mode under no_grad holds nn.MultiheadAttention's inference
    // fast path, which autograd cannot differentiate (in PyTorch either).
    if line.contains("derivative for aten::_native_multi_head_attention is not implemented") {
        return format!(
            "{line}: the file was traced in eval mode, where nn.MultiheadAttention takes \
             its inference-only fast path; to estimate training, trace it in training mode \
             (model.train())"
        );
    }
    if line.is_empty() {
        "failed".to_string()
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_messages_lose_their_wrapping_and_stack_frames() {
        let text = "called `Result::unwrap()` on an `Err` value: Torch(\"shape '[2, 3]' is invalid for input of size 5\\nException raised from infer_size_impl at ../aten/src/ATen/InferSize.h:92 (most recent call first):\\nframe #0: c10::Error::Error\")";
        assert_eq!(
            torch_message(text),
            "shape '[2, 3]' is invalid for input of size 5"
        );
    }

    #[test]
    fn meta_kernel_gaps_and_torchscript_tracebacks_read_in_one_line() {
        let text = "aten::_local_scalar_dense: attempted to run this operator with Meta tensors, but there was no fake impl or Meta kernel registered. You may have run into this message";
        assert_eq!(
            torch_message(text),
            "aten::_local_scalar_dense depends on the values of its input (the size of its result, or a branch taken on it), which a dry run does not have: this model's step depends on its data (a mixture of experts' routing, a boolean mask, `.item()`), so it cannot be estimated; `tch-memprof profile` measures it on the CPU"
        );
        let roll = "aten::roll: attempted to run this operator with Meta tensors, but there was no fake impl";
        assert!(torch_message(roll).starts_with("aten::roll has no meta kernel in libtorch's C++"));
        let script = "The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript, serialized code (most recent call last):\n  File \"code/__torch__.py\", line 12, in forward\n    _0 = torch.arange(32)\nRuntimeError: shape '[2, 3]' is invalid for input of size 5\n";
        assert_eq!(
            torch_message(script),
            "shape '[2, 3]' is invalid for input of size 5"
        );
        assert_eq!(
            torch_message(&format!("in module blocks.0.attn: {script}")),
            "shape '[2, 3]' is invalid for input of size 5 (in module blocks.0.attn)"
        );
    }

    #[test]
    fn a_caught_panic_becomes_its_message_and_the_thread_goes_on() {
        let r: std::result::Result<(), String> = catching(|| panic!("boom {}", 7));
        assert_eq!(r.unwrap_err(), "boom 7");
        assert_eq!(catching(|| 5).unwrap(), 5);
        assert_eq!(CATCHING.with(|c| c.get()), 0);
    }
}
