//! The estimator's dry run on the meta device (`dryrun/`) and TorchScript modules (`script/`).

use std::ffi::{c_char, c_void};

use tch::Tensor;

use super::{buffer, check, native};
use crate::error::{Error, Result};

extern "C" {
    fn memprof_meta_begin() -> i32;
    fn memprof_meta_end() -> i32;
    fn memprof_meta_mark(value: i32) -> i32;
    fn memprof_meta_sites(on: i32) -> i32;
    fn memprof_meta_read(out: *mut super::MpTlEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_meta_empty(
        sizes: *const i64,
        n: usize,
        like: *const c_void,
        out: *mut *mut c_void,
    ) -> i32;
    fn memprof_meta_convert(tensor: *mut c_void) -> i32;
    fn memprof_meta_attention(set: *const MpAttention, get: *mut MpAttention) -> i32;
    fn memprof_meta_gpu(multiprocessors: i32, threads_per_multiprocessor: i32) -> i32;
    fn memprof_reduce_buffers(
        sizes: *const i64,
        strides: *const i64,
        ndim: u64,
        offset: i64,
        in_dtype: i32,
        out_dtype: i32,
        dims: *const i64,
        ndims: i64,
        keepdim: i32,
        multiprocessors: i32,
        threads_per_multiprocessor: i32,
        out: *mut i64,
        cap: u64,
        total: *mut u64,
    ) -> i32;
    fn memprof_meta_conv_workspaces(table: *const c_char, len: usize) -> i32;
    fn memprof_meta_autocast_begin(list: i32, dtype: i32) -> i32;
    fn memprof_meta_autocast_end() -> i32;
    fn memprof_meta_inventory(buf: *mut c_char, len: usize, needed: *mut u64) -> i32;
    #[cfg(test)]
    fn memprof_autocast_listing(which: i32, buf: *mut c_char, len: usize, needed: *mut u64) -> i32;
    fn memprof_script_load(path: *const c_char, out: *mut *mut c_void) -> i32;
    fn memprof_script_cpu_uses(
        module: *mut c_void,
        buf: *mut c_char,
        len: usize,
        needed: *mut u64,
    ) -> i32;
    fn memprof_script_free(module: *mut c_void) -> i32;
    fn memprof_script_train(module: *mut c_void, on: i32) -> i32;
    fn memprof_script_fresh(module: *mut c_void) -> i32;
    fn memprof_script_input_kind(module: *mut c_void, kind: *mut i32) -> i32;
    fn memprof_script_forward(
        module: *mut c_void,
        inputs: *const *const c_void,
        n: usize,
        optimize: i32,
        out: *mut *mut c_void,
    ) -> i32;
    fn memprof_script_tensor(
        module: *mut c_void,
        which: i32,
        index: u64,
        n: *mut u64,
        tensor: *mut *mut c_void,
        name_buf: *mut c_char,
        len: usize,
        name_len: *mut u64,
    ) -> i32;
}

/// The op lists of autocast a dry run applies on the meta device: the estimator's own
/// for CUDA or for the CPU, or (for the checks that they are libtorch's) the ops
/// libtorch registers on its AutocastCUDA or AutocastCPU key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AutocastList {
    Cuda,
    Cpu,
    #[cfg(test)]
    RegisteredCuda,
    #[cfg(test)]
    RegisteredCpu,
}

impl AutocastList {
    fn code(self) -> i32 {
        match self {
            AutocastList::Cuda => native::AUTOCAST_LIST_CUDA,
            AutocastList::Cpu => native::AUTOCAST_LIST_CPU,
            #[cfg(test)]
            AutocastList::RegisteredCuda => native::AUTOCAST_REGISTERED_CUDA,
            #[cfg(test)]
            AutocastList::RegisteredCpu => native::AUTOCAST_REGISTERED_CPU,
        }
    }
}

/// The scaled_dot_product_attention backend a dry run takes: chosen as PyTorch chooses
/// for the GPU (`Auto`), or one forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SdpaBackend {
    Auto,
    Flash,
    Efficient,
    Cudnn,
    Math,
}

impl SdpaBackend {
    fn code(self) -> i32 {
        match self {
            SdpaBackend::Auto => native::ATTN_AUTO,
            SdpaBackend::Flash => native::ATTN_FLASH,
            SdpaBackend::Efficient => native::ATTN_EFFICIENT,
            SdpaBackend::Cudnn => native::ATTN_CUDNN,
            SdpaBackend::Math => native::ATTN_MATH,
        }
    }
}

/// What a TorchScript module's forward takes first, from the op its first input reaches
/// first in the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputKind {
    /// Token ids (they index an embedding).
    Tokens,
    /// Images (they go into a 2-d convolution).
    Images,
    /// The graph does not say.
    Unknown,
}

/// The most allocator events one dry run's meta trace holds; a run that makes more is
/// incomplete ([`meta_read`] says so).
pub(crate) const META_TRACE_CAPACITY: u64 = native::META_CAPACITY;

/// `MpAttention`: how the dry run runs scaled_dot_product_attention.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MpAttention {
    /// The GPU's compute capability, major * 10 + minor.
    pub sm: i32,
    /// `SdpaBackend`'s code (`MP_ATTN_*`).
    pub backend: i32,
    /// Calls since the last set, by backend: flash, efficient, cudnn, math.
    pub runs: [u64; 4],
}

/// Sets how later dry runs run scaled_dot_product_attention (compute capability
/// `sm` = major * 10 + minor); the run counts start again at 0.
pub(crate) fn meta_attention_set(sm: i32, backend: SdpaBackend) -> Result<()> {
    let a = MpAttention {
        sm,
        backend: backend.code(),
        runs: [0; 4],
    };
    // SAFETY: `a` is a valid struct for the call; `get` is null.
    check(unsafe { memprof_meta_attention(&a, std::ptr::null_mut()) })
}

/// Sets the GPU later dry runs size CUDA's reduction buffers for: its streaming
/// multiprocessors and the threads each holds at once.
pub(crate) fn meta_gpu_set(multiprocessors: i32, threads_per_multiprocessor: i32) -> Result<()> {
    // SAFETY: plain call with two integers.
    check(unsafe { memprof_meta_gpu(multiprocessors, threads_per_multiprocessor) })
}

/// A sum's or mean's input and output as CUDA's reduction kernel sees them: the input's
/// sizes, strides (in elements) and offset into its storage, its dtype and the result's
/// (c10::ScalarType codes: [`scalar_type`]), the dims reduced (`None`: all), keepdim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reduction {
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
    pub input: i32,
    pub output: i32,
    pub dims: Option<Vec<i64>>,
    pub keepdim: bool,
}

/// The c10::ScalarType code of a dtype as PyTorch names it (`float32`, `bfloat16`, ...).
pub(crate) fn scalar_type(name: &str) -> Option<i32> {
    const CODES: [(&str, i32); 13] = [
        ("uint8", 0),
        ("int8", 1),
        ("int16", 2),
        ("int32", 3),
        ("int64", 4),
        ("float16", 5),
        ("float32", 6),
        ("float64", 7),
        ("complex32", 8),
        ("complex64", 9),
        ("complex128", 10),
        ("bool", 11),
        ("bfloat16", 15),
    ];
    CODES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// The blocks CUDA's sum or mean kernel takes from the caching allocator for `r` on a GPU
/// of `multiprocessors` (each holding `threads_per_multiprocessor` threads at once), in
/// the order it takes them: a staging buffer and its semaphores per part, none where the
/// reduction is not split across thread blocks (the dry run's rule, `dryrun/reduce.cpp`).
pub(crate) fn reduction_buffers(
    r: &Reduction,
    multiprocessors: u32,
    threads_per_multiprocessor: u32,
) -> Result<Vec<u64>> {
    if r.sizes.len() != r.strides.len() {
        return Err(Error::Native(format!(
            "a reduction of {} sizes and {} strides",
            r.sizes.len(),
            r.strides.len()
        )));
    }
    let (dims, ndims) = match &r.dims {
        Some(d) => (d.as_ptr(), d.len() as i64),
        None => (std::ptr::null(), -1),
    };
    let mut out = vec![0i64; 4];
    loop {
        let mut total = 0u64;
        // SAFETY: sizes and strides are valid for `ndim` values, dims for `ndims` (or
        // null with -1), `out` for `cap`; `total` is a valid out-pointer.
        check(unsafe {
            memprof_reduce_buffers(
                r.sizes.as_ptr(),
                r.strides.as_ptr(),
                r.sizes.len() as u64,
                r.offset,
                r.input,
                r.output,
                dims,
                ndims,
                i32::from(r.keepdim),
                multiprocessors.min(i32::MAX as u32) as i32,
                threads_per_multiprocessor.min(i32::MAX as u32) as i32,
                out.as_mut_ptr(),
                out.len() as u64,
                &mut total,
            )
        })?;
        if total as usize <= out.len() {
            out.truncate(total as usize);
            return Ok(out.into_iter().map(|b| b.max(0) as u64).collect());
        }
        out = vec![0; total as usize];
    }
}

/// Sets the cuDNN convolution workspaces later dry runs charge where a call was
/// measured (`table`: a line a call, `key\tbytes`; lines without a tab are skipped;
/// empty: none measured). The native side copies what it parses.
pub(crate) fn meta_conv_workspaces_set(table: &str) -> Result<()> {
    // SAFETY: `table` is valid for `len` bytes for the call.
    check(unsafe { memprof_meta_conv_workspaces(table.as_ptr().cast(), table.len()) })
}

/// The attention calls of the dry runs since the last set, by backend: flash, efficient,
/// cudnn, math.
pub(crate) fn meta_attention_runs() -> Result<[u64; 4]> {
    let mut a = MpAttention::default();
    // SAFETY: `set` is null; `a` is a valid out-struct.
    check(unsafe { memprof_meta_attention(std::ptr::null(), &mut a) })?;
    Ok(a.runs)
}

/// Starts the meta trace (one per process at a time); installs the meta trace
/// allocator and the missing meta kernels the first time.
pub(crate) fn meta_begin() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_begin() })
}

/// Stops the meta trace.
pub(crate) fn meta_end() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_end() })
}

/// From now on, the meta trace's allocations keep their call stacks (sites), the site
/// table started anew; `false`: no more.
pub(crate) fn meta_sites(on: bool) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_sites(i32::from(on)) })
}

/// A mark of the dry run, which the meta trace turns into its phase and baseline events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A forward pass begins (after an optimizer step, or first: a new training step).
    Forward,
    /// Its backward pass is next: it begins at the autograd engine's first node, as the
    /// profiler finds it.
    Backward,
    /// Its optimizer step begins.
    Optimizer,
    /// The weights and the first batch are on the device.
    Baseline,
    /// The dry run's loop is over: what it frees after is in no step.
    End,
    /// A user's own step begins: its phases are found as the profiler finds them.
    Step,
}

/// Puts `mark` into the meta trace.
pub(crate) fn meta_mark(mark: Mark) -> Result<()> {
    let value = match mark {
        Mark::Forward => native::MARK_FORWARD,
        Mark::Backward => native::MARK_BACKWARD,
        Mark::Optimizer => native::MARK_OPTIMIZER,
        Mark::Baseline => native::MARK_BASELINE,
        Mark::End => native::MARK_END,
        Mark::Step => native::MARK_STEP,
    };
    // SAFETY: plain call.
    check(unsafe { memprof_meta_mark(value) })
}

/// The meta trace's events, decoded; `false` when the trace overflowed its capacity.
pub(crate) fn meta_read(into: &mut Vec<crate::events::Event>) -> Result<bool> {
    let mut total = 0u64;
    // SAFETY: a zero-capacity read only writes `total`.
    check(unsafe { memprof_meta_read(std::ptr::null_mut(), 0, &mut total) })?;
    let n = total.min(native::META_CAPACITY) as usize;
    let mut raw: Vec<super::MpTlEvent> = Vec::new();
    buffer(&mut raw, n)?;
    let mut again = 0u64;
    // SAFETY: `raw` holds `n` writable events.
    check(unsafe { memprof_meta_read(raw.as_mut_ptr(), n as u64, &mut again) })?;
    super::events::decode(&raw, into)?;
    Ok(total <= native::META_CAPACITY)
}

pub(super) fn owned_tensor(out: *mut c_void, what: &str) -> Result<Tensor> {
    if out.is_null() {
        return Err(Error::Native(format!("{what}: no tensor returned")));
    }
    // SAFETY: `out` is a heap at::Tensor* (tch's C_tensor) the callee made for us.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// A new meta tensor of `sizes` with the dtype of `like`.
pub(crate) fn meta_empty(sizes: &[i64], like: &Tensor) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `sizes` is valid for its length, `like` a live tensor, `out` a valid slot.
    check(unsafe {
        memprof_meta_empty(sizes.as_ptr(), sizes.len(), like.as_ptr().cast(), &mut out)
    })?;
    owned_tensor(out, "memprof_meta_empty")
}

/// Moves `t` onto the meta device in place (every handle sharing it follows).
pub(crate) fn meta_convert(t: &Tensor) -> Result<()> {
    // SAFETY: `t` is a live tensor handle; the callee changes the TensorImpl it points
    // to, not the handle.
    check(unsafe { memprof_meta_convert(t.as_ptr() as *mut c_void) })
}

/// Starts autocast in the dry run on this thread: the ops of `list` cast meta tensors to
/// `dtype` (a c10::ScalarType code) as that autocast casts its device's. Only during a
/// meta trace.
pub(crate) fn meta_autocast_begin(list: AutocastList, dtype: i32) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_autocast_begin(list.code(), dtype) })
}

/// Ends it (the cached casts are dropped).
pub(crate) fn meta_autocast_end() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_autocast_end() })
}

/// The meta-kernel inventory of this process's dispatcher: each aten op with a CPU
/// kernel, no composite kernel and no meta kernel of libtorch's C++, and whether
/// tch-memprof registers one (`true`).
pub(crate) fn meta_inventory() -> Result<Vec<(String, bool)>> {
    // SAFETY: `native_text` passes a buffer valid for `len` bytes (or none, with 0).
    let text = native_text(|buf, len, needed| unsafe { memprof_meta_inventory(buf, len, needed) })?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(op, state)| (op.to_string(), state == "ours"))
        .collect())
}

/// A text the native layer writes into a caller's buffer (`call(buf, len, needed)`:
/// at most `len - 1` bytes and a NUL, `*needed` the whole length): asked for its
/// length first, then read whole.
fn native_text(call: impl Fn(*mut c_char, usize, &mut u64) -> i32) -> Result<String> {
    let mut needed = 0u64;
    check(call(std::ptr::null_mut(), 0, &mut needed))?;
    let mut buf = vec![0u8; needed as usize + 1];
    check(call(buf.as_mut_ptr().cast(), buf.len(), &mut needed))?;
    buf.truncate(needed as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The lines of `which`: the crate's autocast lists (`aten::op.overload policy`) or the
/// ops this libtorch registers autocast kernels for.
#[cfg(test)]
pub(crate) fn autocast_listing(which: AutocastList) -> Result<Vec<String>> {
    // SAFETY: `native_text` passes a buffer valid for `len` bytes (or none, with 0).
    let text = native_text(|buf, len, needed| unsafe {
        memprof_autocast_listing(which.code(), buf, len, needed)
    })?;
    Ok(text.lines().map(str::to_string).collect())
}

/// A TorchScript module loaded onto the meta device.
pub(crate) struct ScriptModule {
    ptr: *mut c_void,
}

impl ScriptModule {
    pub(crate) fn load(path: &std::path::Path) -> Result<ScriptModule> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::Native(format!("{}: the path has a NUL byte", path.display())))?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated string, `ptr` a valid slot.
        check(unsafe { memprof_script_load(c.as_ptr(), &mut ptr) })?;
        Ok(ScriptModule { ptr })
    }

    pub(crate) fn set_train(&self, on: bool) -> Result<()> {
        // SAFETY: `ptr` is the live module this value owns.
        check(unsafe { memprof_script_train(self.ptr, on as i32) })
    }

    /// Forgets what the graph executor learnt in earlier forward passes (its profiles,
    /// its optimized plans): the next pass runs as a fresh process's first.
    pub(crate) fn fresh(&self) -> Result<()> {
        // SAFETY: `ptr` is the live module this value owns.
        check(unsafe { memprof_script_fresh(self.ptr) })
    }

    /// What forward's first input is, from the op it reaches first in the graph.
    pub(crate) fn input_kind(&self) -> Result<InputKind> {
        let mut kind = native::INPUT_UNKNOWN;
        // SAFETY: `ptr` is the live module this value owns; `kind` a valid slot.
        check(unsafe { memprof_script_input_kind(self.ptr, &mut kind) })?;
        Ok(match kind {
            native::INPUT_TOKENS => InputKind::Tokens,
            native::INPUT_IMAGES => InputKind::Images,
            _ => InputKind::Unknown,
        })
    }

    /// The ops the file's `cpu` device constants feed, each once: where it was traced
    /// on the CPU, what a GPU run of it makes on the CPU (none for a file traced on a
    /// GPU, or one that names no device).
    pub(crate) fn cpu_uses(&self) -> Result<Vec<String>> {
        // SAFETY: the module is live; `native_text` passes a buffer valid for `len`
        // bytes (or none, with 0).
        let text = native_text(|buf, len, needed| unsafe {
            memprof_script_cpu_uses(self.ptr, buf, len, needed)
        })?;
        Ok(text.lines().map(str::to_string).collect())
    }

    /// forward(inputs...) and the first tensor it returns; `optimize`: through the
    /// graph executor's optimizations, as tch runs a file by default, else as written.
    pub(crate) fn forward(&self, inputs: &[Tensor], optimize: bool) -> Result<Tensor> {
        let ptrs: Vec<*const c_void> = inputs.iter().map(|t| t.as_ptr().cast()).collect();
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: the module is live; `ptrs` holds live tensor handles for the call.
        check(unsafe {
            memprof_script_forward(
                self.ptr,
                ptrs.as_ptr(),
                ptrs.len(),
                optimize as i32,
                &mut out,
            )
        })?;
        owned_tensor(out, "memprof_script_forward")
    }

    /// The parameters (`buffers` false) or buffers, recursively, with dotted names.
    pub(crate) fn tensors(&self, buffers: bool) -> Result<Vec<(String, Tensor)>> {
        let which = buffers as i32;
        let mut n = 0u64;
        let mut unused: *mut c_void = std::ptr::null_mut();
        let mut name_len = 0u64;
        // SAFETY: an index past the end only writes `n`.
        check(unsafe {
            memprof_script_tensor(
                self.ptr,
                which,
                u64::MAX,
                &mut n,
                &mut unused,
                std::ptr::null_mut(),
                0,
                &mut name_len,
            )
        })?;
        let mut out = Vec::with_capacity(n as usize);
        let mut buf = vec![0u8; 512];
        for i in 0..n {
            let mut count = 0u64;
            let mut t: *mut c_void = std::ptr::null_mut();
            // SAFETY: `buf` is valid for its length; `t`, `n`, `name_len` valid slots.
            check(unsafe {
                memprof_script_tensor(
                    self.ptr,
                    which,
                    i,
                    &mut count,
                    &mut t,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut name_len,
                )
            })?;
            let tensor = owned_tensor(t, "memprof_script_tensor")?;
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            out.push((String::from_utf8_lossy(&buf[..end]).into_owned(), tensor));
        }
        Ok(out)
    }
}

impl Drop for ScriptModule {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the module this value owns, freed once.
        unsafe { memprof_script_free(self.ptr) };
    }
}
