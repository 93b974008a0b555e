// The estimator's dry run on libtorch's meta device: tensors with shapes, dtypes and
// strides but no memory, so a model's forward, backward and optimizer step run on the
// CPU in milliseconds whatever their size.
//
// - The meta trace allocator replaces ATen's meta allocator (c10::SetAllocator, above
//   its priority 0). It hands out unique fake addresses (never dereferenced: meta
//   kernels touch no data) and logs every allocation and free with its size into the
//   meta trace, in order: the same (size, order, lifetime) sequence a CUDA run gives
//   the caching allocator, without memory.
// - The op recorder (ops.cpp, the one the profiled step uses) logs the dry run's ops
//   into the same trace, in the step log's event model; the hooks here add every
//   cuBLAS-backed op (the estimator charges the cuBLAS workspace at the first one of
//   each thread, and the cuBLASLt one at the first that CUDA would run on cuBLASLt) and
//   adopt outputs sized without the allocator.
// - Kernels libtorch's C++ lacks on the meta device are registered at the first trace
//   (kernels.cpp: each allocates what the CUDA kernel allocates).
//
// The trace is for the estimator's dry runs, never for a user's training loop; its
// allocator and the op recorder still keep the hot-path rules (atomics, no lock, no
// heap), with one exception: while a TorchScript file runs, the recorder asks the
// interpreter for its module path (a vector of strings, malloc'd, never through the
// watched allocator; nothing when no TorchScript runs).

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "dryrun.h"

namespace memprof {

std::atomic<bool> g_meta_on{false};

namespace {
thread_local bool tls_dry_run_thread = false;

constexpr uint64_t kMetaIds = uint64_t(1) << 26;     // blocks ever made (64 M)
constexpr uint64_t kMetaEvents = MP_META_CAPACITY;    // events of one trace (32 M)
constexpr uint64_t kFakeBase = uint64_t(1) << 44;    // fake addresses: base + 64 * id
constexpr uint64_t kFakeAlign = 64;

uint64_t* g_meta_sizes = nullptr;  // bytes of each block id
uint32_t* g_meta_tags = nullptr;   // birth of each block id: step << 2 | phase
std::atomic<uint64_t> g_meta_next_id{1};
MpTlEvent* g_meta_log = nullptr;
std::atomic<uint64_t> g_meta_len{0};
std::atomic<bool> g_meta_sites{false};  // allocations keep their call stacks
std::atomic<bool> g_meta_ready{false};
// The dry run's state, set by its marks: phase, training step (0 before the first),
// op numbers within the step; and the live bytes of every meta block of the process.
std::atomic<uint32_t> g_meta_phase{kForward};
// Backward was marked and begins at the autograd engine's first node, as the profiler
// finds it: what `backward()` allocates before the engine runs (the loss's gradient
// seed) is the forward pass's.
std::atomic<bool> g_meta_backward_pending{false};
std::atomic<uint32_t> g_meta_step{0};
// A user's own step runs (MP_MARK_STEP): the phases change as the profiler's do, by
// what runs, not by marks; backward nodes running on the dry run's thread now.
std::atomic<bool> g_meta_auto{false};
thread_local int tls_meta_backward = 0;

// Sets the phase to `to` and logs the change.
void meta_set_phase(uint32_t to) {
  g_meta_phase.store(to);
  meta_append(MpTlEvent{MP_EV_PHASE, uint8_t(to), 0, 0, g_meta_step.load(), -1, 0, 0, 0});
}

// In a user's step, at an allocation: backward is over when no backward node runs (the
// optimizer's phase begins); after it, an allocation under grad mode begins the next
// micro-batch's forward pass (both checks, as the profiler's phase_for_alloc).
uint32_t meta_phase_for_alloc() {
  uint32_t ph = g_meta_phase.load(std::memory_order_relaxed);
  if (!g_meta_auto.load(std::memory_order_relaxed)) {
    return ph;
  }
  if (ph == kBackward && tls_meta_backward == 0) {
    meta_set_phase(kOptimizer);
    ph = kOptimizer;
  }
  if (ph == kOptimizer && c10::GradMode::is_enabled()) {
    meta_set_phase(kForward);
    ph = kForward;
  }
  return ph;
}
std::atomic<int32_t> g_meta_ops{0};
std::atomic<int64_t> g_meta_live{0};

inline int32_t dry_run_current_op() {
  const OpStack& t = tls_dry_ops;
  return t.n_open > 0 && t.step == g_meta_step.load(std::memory_order_relaxed)
      ? t.open_op[t.n_open - 1]
      : -1;
}

void meta_delete(void* ctx) {
  const uint64_t id = (uint64_t(ctx) - kFakeBase) / kFakeAlign;
  if (id == 0 || id >= kMetaIds) {
    return;
  }
  const int64_t n = int64_t(g_meta_sizes[id]);
  const uint32_t tag = g_meta_tags[id];
  g_meta_live.fetch_sub(n, std::memory_order_relaxed);
  meta_append(MpTlEvent{
      MP_EV_FREE, uint8_t(tag & 3), 0, 0, tag >> 2, dry_run_current_op(), 0, uint64_t(ctx), -n});
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
    const uint32_t phase = meta_phase_for_alloc();
    const uint32_t step = g_meta_step.load(std::memory_order_relaxed);
    g_meta_sizes[id] = n;
    g_meta_tags[id] = (step << 2) | phase;
    g_meta_live.fetch_add(int64_t(n), std::memory_order_relaxed);
    void* fake = reinterpret_cast<void*>(kFakeBase + kFakeAlign * id);
    const int32_t site = g_meta_sites.load(std::memory_order_relaxed) ? take_site() : 0;
    meta_append(MpTlEvent{
        MP_EV_ALLOC, uint8_t(phase), 0, 0, step, dry_run_current_op(), site, uint64_t(fake),
        int64_t(n)});
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
// What only a dry run records at an op (the op recorder in ops.cpp calls these).

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

// The module of a TorchScript file whose op ran last on this thread (for the message of
// a dry run that fails inside the file); the op recorder writes it.
thread_local char tls_script_module[kNameLen] = "";

// The cuBLAS kind of each op open on this thread, by nesting depth: decided at the op's
// start, where its inputs are valid (the dispatcher destroys the boxed inputs after the
// start callbacks), and logged at its end: 0 none, 1 cuBLAS, 2 cuBLASLt.
thread_local int8_t tls_blas_kind[kMaxDepth];

// What each record open on this thread is, by nesting depth (0 an op, kRecordNode an
// autograd node, kRecordEngine the engine's evaluate_function around a node; how many
// are open is the op recorder's depth): where an op's parent is an evaluate_function
// record, the op is the engine's own work between node and input buffer (gradient
// accumulation, validate_outputs' casts and sums).
thread_local int8_t tls_record_kind[kMaxDepth];

// A meta kernel that sizes its output by resizing an empty tensor (`arange`, `out=`
// variants) sets the storage's size without the allocator: its bytes would be missing
// from the trace, though a CUDA run allocates them. Such an output (a meta storage of
// some bytes and no address) gets a block of the trace allocator here, logged as the
// op's allocation and freed with the storage.
void adopt_resized(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta() || !t.has_storage()) {
    return;
  }
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->data_ptr().get() != nullptr || s->nbytes() == 0) {
    return;
  }
  s->set_data_ptr_noswap(meta_allocator()->allocate(s->nbytes()));
}

std::once_flag g_meta_once;
// Why the meta trace could not be set up (constant-initialised: no dynamic initialiser).
char g_meta_init_error[256] = "";

void set_init_error(const char* what) {
  std::snprintf(g_meta_init_error, sizeof g_meta_init_error, "%s", what);
}

bool meta_init() {
  std::call_once(g_meta_once, []() {
    try {
      g_meta_sizes = reserve<uint64_t>(kMetaIds);
      g_meta_tags = reserve<uint32_t>(kMetaIds);
      g_meta_log = reserve<MpTlEvent>(kMetaEvents);
      if (!g_meta_sizes || !g_meta_tags || !g_meta_log) {
        set_init_error("the meta trace could not be reserved (mmap failed)");
        return;
      }
      c10::SetAllocator(c10::DeviceType::Meta, meta_allocator(), /*priority=*/1);
      if (c10::GetAllocator(c10::DeviceType::Meta) != meta_allocator()) {
        set_init_error("the meta trace allocator could not be installed");
        return;
      }
      register_meta_kernels();
      g_meta_ready.store(true);
    } catch (const std::exception& e) {
      set_init_error(e.what());
    }
  });
  if (!g_meta_ready.load()) {
    set_error(g_meta_init_error);
    return false;
  }
  return true;
}

std::mutex g_trace_mutex;  // begin/end of a trace (never on a hot path)
}  // namespace

bool dry_run_thread() {
  return tls_dry_run_thread && g_meta_on.load(std::memory_order_relaxed);
}

// The phase an op is shown in: in a user's step, what it is, not when the next
// allocation flips the phase (as the profiler's shown_phase).
uint32_t meta_phase() {
  const uint32_t ph = g_meta_phase.load(std::memory_order_relaxed);
  if (g_meta_auto.load(std::memory_order_relaxed)) {
    if (ph == kBackward && tls_meta_backward == 0) {
      return c10::GradMode::is_enabled() ? kForward : kOptimizer;
    }
    if (ph == kOptimizer && c10::GradMode::is_enabled()) {
      return kForward;
    }
  }
  return ph;
}

uint32_t meta_step() {
  return g_meta_step.load(std::memory_order_relaxed);
}

int64_t meta_live() {
  return g_meta_live.load(std::memory_order_relaxed);
}

int32_t meta_next_op() {
  return g_meta_ops.fetch_add(1, std::memory_order_relaxed);
}

void meta_append(const MpTlEvent& e) {
  if (!g_meta_on.load(std::memory_order_relaxed)) {
    return;
  }
  const uint64_t i = g_meta_len.fetch_add(1, std::memory_order_relaxed);
  if (i < kMetaEvents) {
    g_meta_log[i] = e;
  }
}

void dry_run_op_started(const at::RecordFunction& fn, int depth) {
  const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  const bool backward = node || is_backward_record(fn);
  tls_record_kind[depth] = node ? int8_t(kRecordNode) : backward ? int8_t(kRecordEngine) : 0;
  if (g_meta_auto.load(std::memory_order_relaxed)) {
    if (backward) {
      ++tls_meta_backward;
      if (g_meta_phase.load() != kBackward) {
        meta_set_phase(kBackward);
      }
    }
  } else if (g_meta_backward_pending.load(std::memory_order_relaxed) && backward) {
    g_meta_backward_pending.store(false);
    meta_set_phase(kBackward);
  }
  const char* name = fn.name();
  tls_blas_kind[depth] = !is_cublas_op(name) ? int8_t(0) : uses_cublaslt(name, fn) ? 2 : 1;
  reduce_started(fn, depth);
}

// The workspaces are taken inside the op, after its output is allocated: logged at the
// op's end; outputs sized without the allocator are adopted at the outermost op's end.
void dry_run_op_ended(const at::RecordFunction& fn, int depth) {
  if (g_meta_auto.load(std::memory_order_relaxed) && tls_meta_backward > 0 &&
      is_backward_record(fn)) {
    --tls_meta_backward;
  }
  reduce_ended(fn, depth);
  if (tls_blas_kind[depth] != 0) {
    meta_append(MpTlEvent{
        MP_EV_WORKSPACE, uint8_t(meta_phase()), 0, 0, meta_step(), dry_run_current_op(),
        intern(fn.name()), 0, tls_blas_kind[depth]});
  }
  if (depth == 0) {
    for_each_tensor(fn.outputs(), adopt_resized);
  }
}

bool dry_run_in_node() {
  if (!dry_run_thread()) {
    return false;
  }
  for (int d = std::min(tls_dry_ops.depth, kMaxDepth) - 2; d >= 0; --d) {
    if (tls_record_kind[d] == kRecordNode) {
      return true;
    }
  }
  return false;
}

int dry_run_parent_record() {
  const int d = tls_dry_ops.depth - 1;
  return dry_run_thread() && d >= 1 && d < kMaxDepth ? tls_record_kind[d - 1] : -1;
}

void meta_transient(int64_t bytes, int32_t kind) {
  if (bytes > 0 && dry_run_thread()) {
    meta_append(MpTlEvent{
        MP_EV_TRANSIENT, uint8_t(meta_phase_for_alloc()), 0, 0, meta_step(),
        dry_run_current_op(), kind, 0, bytes});
  }
}

char* dry_run_module_buf() {
  return tls_script_module;
}

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
  g_meta_step.store(0);
  g_meta_phase.store(kForward);
  g_meta_backward_pending.store(false);
  g_meta_auto.store(false);
  tls_meta_backward = 0;
  g_meta_ops.store(0);
  tls_dry_ops = OpStack{};
  op_callback_use(MP_TARGET_DRY_RUN, true, /*inputs=*/true, /*outputs=*/true, /*functions=*/true);
  tls_dry_run_thread = true;
  g_meta_on.store(true);
  return true;
}

void meta_end() {
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_meta_sites.store(false);
  g_meta_auto.store(false);
  if (g_meta_on.load()) {
    g_meta_on.store(false);
    tls_dry_run_thread = false;
    op_callback_use(MP_TARGET_DRY_RUN, false, false, false, false);
    clear_params(MP_TARGET_DRY_RUN);
  }
}

bool meta_sites(bool on) {
  if (on && g_detail_on.load()) {
    set_error("a profiled step is keeping allocation sites; the dry run cannot now");
    return false;
  }
  if (on && !g_sites) {
    set_error("the site table could not be reserved (mmap failed)");
    return false;
  }
  g_meta_sites.store(false);
  if (on) {
    reset_sites();
  }
  g_meta_sites.store(on);
  return true;
}

// A mark of the dry run: a forward pass begins (after an optimizer step, or first: a new
// training step, whose ops are numbered from 0 again), backward is about to begin (it
// does at the engine's first node) or the optimizer step begins, the weights and first batch are on the device, or the loop is over (what the
// dry run frees after it, in a step of its own).
void meta_mark(int32_t what) {
  uint32_t phase = g_meta_phase.load();
  switch (what) {
    case MP_MARK_BASELINE:
      meta_append(MpTlEvent{MP_EV_BASELINE, uint8_t(phase), 0, 0, g_meta_step.load(), -1, 0, 0, 0});
      return;
    case MP_MARK_FORWARD:
      g_meta_backward_pending.store(false);
      if (g_meta_step.load() == 0 || phase == kOptimizer) {
        g_meta_step.fetch_add(1);
        g_meta_ops.store(0);
      }
      phase = kForward;
      break;
    case MP_MARK_BACKWARD:
      // The phase changes at the first backward node (dry_run_op_started).
      g_meta_backward_pending.store(true);
      return;
    case MP_MARK_OPTIMIZER:
      g_meta_backward_pending.store(false);
      phase = kOptimizer;
      break;
    case MP_MARK_STEP:
      g_meta_backward_pending.store(false);
      g_meta_auto.store(true);
      tls_meta_backward = 0;
      g_meta_step.fetch_add(1);
      g_meta_ops.store(0);
      phase = kForward;
      break;
    default:  // MP_MARK_END: a step of its own, with no op
      g_meta_backward_pending.store(false);
      g_meta_auto.store(false);
      g_meta_step.fetch_add(1);
      g_meta_ops.store(0);
      phase = kForward;
      break;
  }
  g_meta_phase.store(phase);
  meta_append(MpTlEvent{MP_EV_PHASE, uint8_t(phase), 0, 0, g_meta_step.load(), -1, 0, 0, 0});
}

uint64_t meta_read(MpTlEvent* out, uint64_t cap, uint64_t* total) {
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

}  // namespace memprof
