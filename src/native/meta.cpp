// The estimator's dry run on libtorch's meta device: tensors with shapes, dtypes and
// strides but no memory, so a model's forward, backward and optimizer step run on the
// CPU in milliseconds whatever their size.
//
// - The meta trace allocator replaces ATen's meta allocator (c10::SetAllocator, above
//   its priority 0). It hands out unique fake addresses (never dereferenced: meta
//   kernels touch no data) and logs every allocation and free with its size into the
//   meta trace, in order: the same (size, order, lifetime) sequence a CUDA run gives
//   the caching allocator, without memory.
// - An op callback (RecordFunction, installed for the span of a trace) logs the
//   outermost op of each thread (for the peak's op) and every cuBLAS-backed op (the
//   estimator charges the cuBLAS workspace at the first one of each thread, and the
//   cuBLASLt one at the first that CUDA would run on cuBLASLt).
// - Kernels libtorch's C++ lacks on the meta device (PyTorch's Python registers them
//   in Python) are registered at the first trace, each only when no meta kernel is
//   there already. Each mirrors what the CUDA kernel allocates (outputs and saved
//   tensors; workspaces are the estimator's business). `dropout` on meta is routed to
//   the fused kernel, as it is on CUDA (output + a one-byte mask instead of a float
//   noise tensor).
// - TorchScript modules loaded straight onto the meta device (the weights' bytes are
//   read from the file and dropped).
//
// The trace is for the estimator's dry runs, never for a user's training loop; its
// allocator and op callback still keep the hot-path rules (atomics, no lock, no heap).

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/library.h>

#include <mutex>
#include <string>
#include <vector>

#include "internal.h"

namespace memprof {
namespace {

constexpr uint64_t kMetaIds = uint64_t(1) << 26;     // blocks ever made (64 M)
constexpr uint64_t kMetaEvents = MP_META_CAPACITY;    // events of one trace (32 M)
constexpr uint64_t kFakeBase = uint64_t(1) << 44;    // fake addresses: base + 64 * id
constexpr uint64_t kFakeAlign = 64;

uint64_t* g_meta_sizes = nullptr;  // bytes of each block id
std::atomic<uint64_t> g_meta_next_id{1};
MpMetaEvent* g_meta_log = nullptr;
std::atomic<uint64_t> g_meta_len{0};
std::atomic<bool> g_meta_on{false};
std::atomic<bool> g_meta_ready{false};
at::CallbackHandle g_meta_callback = 0;
thread_local int tls_meta_depth = 0;

inline void meta_append(int32_t kind, uint64_t id, int64_t bytes, int32_t name,
                        int32_t mark = MP_MARK_NONE) {
  if (!g_meta_on.load(std::memory_order_relaxed)) {
    return;
  }
  const uint64_t i = g_meta_len.fetch_add(1, std::memory_order_relaxed);
  if (i < kMetaEvents) {
    g_meta_log[i] = MpMetaEvent{id, bytes, kind, name, mark, 0};
  }
}

void meta_delete(void* ctx) {
  const uint64_t id = (uint64_t(ctx) - kFakeBase) / kFakeAlign;
  if (id == 0 || id >= kMetaIds) {
    return;
  }
  meta_append(MP_META_FREE, id, int64_t(g_meta_sizes[id]), -1);
}

struct MetaTraceAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) {
      return {nullptr, nullptr, &meta_delete, c10::Device(c10::DeviceType::Meta)};
    }
    const uint64_t id = g_meta_next_id.fetch_add(1, std::memory_order_relaxed);
    TORCH_CHECK(
        id < kMetaIds,
        "tch-memprof: the meta dry runs of this process made more than ",
        kMetaIds,
        " allocations; start a new process");
    g_meta_sizes[id] = n;
    void* fake = reinterpret_cast<void*>(kFakeBase + kFakeAlign * id);
    meta_append(MP_META_ALLOC, id, int64_t(n), -1);
    return {fake, fake, &meta_delete, c10::Device(c10::DeviceType::Meta)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &meta_delete;
  }
  void copy_data(void*, const void*, std::size_t) const override {
    // Meta tensors have no data.
  }
};

MetaTraceAllocator* meta_allocator() {
  static MetaTraceAllocator a;
  return &a;
}

// ---------------------------------------------------------------------------------
// The op callback.

bool is_cublas_op(const char* name) {
  static const char* const kOps[] = {
      "aten::mm",
      "aten::addmm",
      "aten::bmm",
      "aten::baddbmm",
      "aten::addbmm",
      "aten::addmv",
      "aten::mv",
      "aten::dot",
      "aten::vdot",
      "aten::_addmm_activation",
  };
  for (const char* op : kOps) {
    if (std::strcmp(name, op) == 0) {
      return true;
    }
  }
  return false;
}

// Whether CUDA would run this addmm on cuBLASLt (PyTorch's Blas.cpp: a 1-D contiguous
// bias of length N, beta 1, every matrix size above 1), which takes a workspace of its
// own.
bool uses_cublaslt(const char* name, const at::RecordFunction& fn) {
  if (std::strcmp(name, "aten::addmm") != 0 && std::strcmp(name, "aten::_addmm_activation") != 0) {
    return false;
  }
  const auto inputs = fn.inputs();
  if (inputs.size() < 3 || !inputs[0].isTensor() || !inputs[1].isTensor() ||
      !inputs[2].isTensor()) {
    return false;
  }
  const at::Tensor& bias = inputs[0].toTensor();
  const at::Tensor& m1 = inputs[1].toTensor();
  const at::Tensor& m2 = inputs[2].toTensor();
  if (inputs.size() > 3 && inputs[3].isScalar() && inputs[3].toScalar().toDouble() != 1.0) {
    return false;
  }
  return bias.dim() == 1 && bias.is_contiguous() && m1.dim() == 2 && m2.dim() == 2 &&
      bias.size(0) == m2.size(1) && m1.size(0) > 1 && m1.size(1) > 1 && m2.size(0) > 1 &&
      m2.size(1) > 1;
}

std::unique_ptr<at::ObserverContext> meta_op_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (tls_meta_depth++ == 0) {
    meta_append(MP_META_OP, 0, 0, intern(name));
  }
  return nullptr;
}

// The workspaces are taken inside the op, after its output is allocated: logged at
// the op's end.
void meta_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  --tls_meta_depth;
  const char* name = fn.name();
  if (is_cublas_op(name)) {
    meta_append(uses_cublaslt(name, fn) ? MP_META_BLASLT : MP_META_BLAS, 0, 0, intern(name));
  }
}

// ---------------------------------------------------------------------------------
// Meta kernels libtorch's C++ lacks. Each allocates what the CUDA kernel returns.

at::Tensor empty_as(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options());
}

at::Tensor conv_meta(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>&,
    at::IntArrayRef stride,
    at::IntArrayRef padding,
    at::IntArrayRef dilation,
    bool transposed,
    at::IntArrayRef output_padding,
    int64_t groups) {
  const int64_t dims = input.dim() - 2;
  TORCH_CHECK(dims >= 1 && weight.dim() == input.dim(), "convolution: input ", input.sizes(),
              " and weight ", weight.sizes(), " do not match");
  auto at_or_last = [](at::IntArrayRef v, int64_t i, int64_t dflt) {
    if (v.empty()) {
      return dflt;
    }
    return v[std::min<int64_t>(i, int64_t(v.size()) - 1)];
  };
  std::vector<int64_t> out{input.size(0)};
  out.push_back(transposed ? weight.size(1) * groups : weight.size(0));
  for (int64_t d = 0; d < dims; ++d) {
    const int64_t in = input.size(d + 2);
    const int64_t k = weight.size(d + 2);
    const int64_t s = at_or_last(stride, d, 1);
    const int64_t p = at_or_last(padding, d, 0);
    const int64_t dl = at_or_last(dilation, d, 1);
    int64_t o;
    if (transposed) {
      o = (in - 1) * s - 2 * p + dl * (k - 1) + at_or_last(output_padding, d, 0) + 1;
    } else {
      o = (in + 2 * p - dl * (k - 1) - 1) / s + 1;
    }
    TORCH_CHECK(o > 0, "convolution: input ", input.sizes(), " is too small for kernel ",
                weight.sizes(), " (output size ", o, ")");
    out.push_back(o);
  }
  return at::empty(out, input.options().memory_format(input.suggest_memory_format()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_backward_meta(
    const at::Tensor&,
    const at::Tensor& input,
    const at::Tensor& weight,
    at::IntArrayRef,
    at::IntArrayRef,
    at::IntArrayRef,
    bool,
    at::IntArrayRef,
    int64_t,
    std::array<bool, 3> mask) {
  // CUDA (cuDNN) gives the input and weight gradients; convolution_backward then sums
  // grad_output for the bias gradient when it is asked for and undefined here.
  return {
      mask[0] ? empty_as(input) : at::Tensor(),
      mask[1] ? empty_as(weight) : at::Tensor(),
      at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_meta(
    const at::Tensor& input,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    bool training,
    double,
    double) {
  // CUDA saves the batch mean and inverse deviation per channel in training; in
  // evaluation both are empty.
  const int64_t c = input.dim() > 1 ? input.size(1) : 1;
  const auto st = input.scalar_type();
  auto stat = input.options().dtype(
      (st == at::kHalf || st == at::kBFloat16) ? at::kFloat : st);
  return {
      empty_as(input),
      at::empty({training ? c : 0}, stat),
      at::empty({training ? c : 0}, stat)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_meta(
    const at::Tensor&,
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    bool,
    double,
    std::array<bool, 3> mask) {
  const int64_t c = input.dim() > 1 ? input.size(1) : 1;
  auto opts = (weight && weight->defined()) ? weight->options() : input.options();
  return {
      mask[0] ? empty_as(input) : at::Tensor(),
      mask[1] ? at::empty({c}, opts) : at::Tensor(),
      mask[2] ? at::empty({c}, opts) : at::Tensor()};
}

at::Tensor adaptive_avg_pool2d_meta(const at::Tensor& input, at::IntArrayRef output_size) {
  TORCH_CHECK(output_size.size() == 2, "adaptive_avg_pool2d: output_size must have 2 values");
  std::vector<int64_t> out(input.sizes().begin(), input.sizes().end() - 2);
  out.push_back(output_size[0]);
  out.push_back(output_size[1]);
  return at::empty(out, input.options());
}

at::Tensor adaptive_avg_pool2d_backward_meta(const at::Tensor&, const at::Tensor& input) {
  return empty_as(input);
}

at::Tensor unary_meta(const at::Tensor& self) {
  return empty_as(self);
}

at::Tensor& unary_inplace_meta(at::Tensor& self) {
  return self;
}

at::Tensor hardswish_backward_meta(const at::Tensor& grad_output, const at::Tensor&) {
  return empty_as(grad_output);
}

std::tuple<at::Tensor, at::Tensor> native_dropout_meta(
    const at::Tensor& input,
    double,
    std::optional<bool>) {
  // CUDA: the output and a one-byte mask (in evaluation, a copy and an all-true mask).
  return {empty_as(input), at::empty(input.sizes(), input.options().dtype(at::kBool))};
}

at::Tensor native_dropout_backward_meta(const at::Tensor& grad_output, const at::Tensor&, double) {
  return empty_as(grad_output);
}

// aten::dropout on meta tensors, as libtorch runs it on CUDA: the fused kernel when
// training with 0 < p < 1 (output + one-byte mask saved for backward), the input
// itself when not training.
at::Tensor dropout_as_on_cuda(const at::Tensor& input, double p, bool train) {
  if (!train || p == 0 || input.numel() == 0) {
    return input;
  }
  if (p >= 1) {
    return input * at::zeros({}, input.options());
  }
  return std::get<0>(at::native_dropout(input, p, train));
}

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

void register_meta_kernels() {
  // Kept for the life of the process (a registration ends with its Library).
  auto* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  if (!has_meta_kernel("aten::convolution_overrideable", "")) {
    lib->impl("convolution_overrideable", TORCH_FN(conv_meta));
  }
  if (!has_meta_kernel("aten::convolution_backward_overrideable", "")) {
    lib->impl("convolution_backward_overrideable", TORCH_FN(conv_backward_meta));
  }
  if (!has_meta_kernel("aten::native_batch_norm", "")) {
    lib->impl("native_batch_norm", TORCH_FN(batch_norm_meta));
  }
  if (!has_meta_kernel("aten::native_batch_norm_backward", "")) {
    lib->impl("native_batch_norm_backward", TORCH_FN(batch_norm_backward_meta));
  }
  if (!has_meta_kernel("aten::_adaptive_avg_pool2d", "")) {
    lib->impl("_adaptive_avg_pool2d", TORCH_FN(adaptive_avg_pool2d_meta));
  }
  if (!has_meta_kernel("aten::_adaptive_avg_pool2d_backward", "")) {
    lib->impl("_adaptive_avg_pool2d_backward", TORCH_FN(adaptive_avg_pool2d_backward_meta));
  }
  if (!has_meta_kernel("aten::relu", "")) {
    lib->impl("relu", TORCH_FN(unary_meta));
  }
  if (!has_meta_kernel("aten::relu_", "")) {
    lib->impl("relu_", TORCH_FN(unary_inplace_meta));
  }
  if (!has_meta_kernel("aten::hardswish_backward", "")) {
    lib->impl("hardswish_backward", TORCH_FN(hardswish_backward_meta));
  }
  if (!has_meta_kernel("aten::native_dropout", "")) {
    lib->impl("native_dropout", TORCH_FN(native_dropout_meta));
  }
  if (!has_meta_kernel("aten::native_dropout_backward", "")) {
    lib->impl("native_dropout_backward", TORCH_FN(native_dropout_backward_meta));
  }
  auto* autograd = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
  autograd->impl("dropout", TORCH_FN(dropout_as_on_cuda));
}

std::once_flag g_meta_once;
std::string g_meta_init_error;

bool meta_init() {
  std::call_once(g_meta_once, []() {
    try {
      g_meta_sizes = reserve<uint64_t>(kMetaIds);
      g_meta_log = reserve<MpMetaEvent>(kMetaEvents);
      if (!g_meta_sizes || !g_meta_log) {
        g_meta_init_error = "the meta trace could not be reserved (mmap failed)";
        return;
      }
      c10::SetAllocator(c10::DeviceType::Meta, meta_allocator(), /*priority=*/1);
      if (c10::GetAllocator(c10::DeviceType::Meta) != meta_allocator()) {
        g_meta_init_error = "the meta trace allocator could not be installed";
        return;
      }
      register_meta_kernels();
      g_meta_ready.store(true);
    } catch (const std::exception& e) {
      g_meta_init_error = e.what();
    }
  });
  if (!g_meta_ready.load()) {
    set_error(g_meta_init_error.c_str());
    return false;
  }
  return true;
}

std::mutex g_trace_mutex;  // begin/end of a trace (never on a hot path)
}  // namespace

// ---------------------------------------------------------------------------------
// Called by the C ABI (api.cpp).

bool meta_begin() {
  if (!meta_init()) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  if (g_meta_on.load()) {
    set_error("a meta dry run is already being traced in this process");
    return false;
  }
  g_meta_len.store(0);
  g_meta_callback = at::addGlobalCallback(
      at::RecordFunctionCallback(&meta_op_start, &meta_op_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  g_meta_on.store(true);
  return true;
}

void meta_end() {
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_meta_on.store(false);
  if (g_meta_callback != 0) {
    at::removeCallback(g_meta_callback);
    g_meta_callback = 0;
  }
}

void meta_mark(int32_t what) {
  meta_append(MP_META_MARK, 0, 0, -1, what);
}

uint64_t meta_read(MpMetaEvent* out, uint64_t cap, uint64_t* total) {
  const uint64_t len = g_meta_len.load();
  *total = len;
  const uint64_t n = std::min({len, cap, kMetaEvents});
  for (uint64_t i = 0; i < n; ++i) {
    out[i] = g_meta_log[i];
  }
  return n;
}

bool meta_ensure_ready() {
  return meta_init();
}

at::Tensor* meta_empty(const int64_t* sizes, size_t n, const at::Tensor& like) {
  auto opts = at::TensorOptions().device(at::kMeta).dtype(like.scalar_type());
  return new at::Tensor(at::empty(at::IntArrayRef(sizes, n), opts));
}

// Moves a tensor's TensorImpl onto the meta device in place: every handle sharing it
// (the model's layers, the VarStore) sees a meta tensor of the same sizes, strides and
// dtype, with its autograd settings kept; the old storage is released.
void meta_convert(at::Tensor* t) {
  TORCH_CHECK(t->defined(), "cannot move an undefined tensor to the meta device");
  if (t->is_meta()) {
    return;
  }
  at::Tensor m = at::empty_strided(t->sizes(), t->strides(), t->options().device(at::kMeta));
  t->unsafeGetTensorImpl()->shallow_copy_from(m.getIntrusivePtr());
}

void* script_load(const char* path) {
  auto m = torch::jit::load(std::string(path), c10::Device(c10::kMeta));
  return new torch::jit::Module(std::move(m));
}

void script_free(void* m) {
  delete static_cast<torch::jit::Module*>(m);
}

void script_train(void* m, bool on) {
  static_cast<torch::jit::Module*>(m)->train(on);
}

at::Tensor* script_forward(void* m, const at::Tensor* const* inputs, size_t n) {
  std::vector<c10::IValue> args;
  args.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    args.emplace_back(*inputs[i]);
  }
  c10::IValue out = static_cast<torch::jit::Module*>(m)->forward(std::move(args));
  // The first tensor of what forward returns (a tensor, or a tuple/list/dict holding one).
  std::vector<c10::IValue> todo{out};
  while (!todo.empty()) {
    c10::IValue v = std::move(todo.back());
    todo.pop_back();
    if (v.isTensor()) {
      return new at::Tensor(v.toTensor());
    }
    if (v.isTuple()) {
      const auto& elems = v.toTupleRef().elements();
      for (size_t k = elems.size(); k-- > 0;) {
        todo.push_back(elems[k]);
      }
    } else if (v.isList()) {
      const auto list = v.toListRef();
      for (size_t k = list.size(); k-- > 0;) {
        todo.push_back(list[k]);
      }
    } else if (v.isGenericDict()) {
      for (const auto& kv : v.toGenericDict()) {
        todo.insert(todo.begin(), kv.value());
      }
    }
  }
  TORCH_CHECK(false, "the module's forward returned no tensor");
}

// Parameters (which = 0) or buffers (1) of a module, recursively, in the module's order.
std::vector<std::pair<std::string, at::Tensor>> script_tensors(void* m, int32_t which) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto* mod = static_cast<torch::jit::Module*>(m);
  if (which == 0) {
    for (const auto& p : mod->named_parameters(/*recurse=*/true)) {
      out.emplace_back(p.name, p.value);
    }
  } else {
    for (const auto& b : mod->named_buffers(/*recurse=*/true)) {
      out.emplace_back(b.name, b.value);
    }
  }
  return out;
}

}  // namespace memprof
