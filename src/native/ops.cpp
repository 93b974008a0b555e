// Op callbacks: phases (a backward node starting moves forward -> backward), the
// origin of allocations (op and layer, for leak hunting and snapshots), and the step
// log's op events and FLOPs.
//
// A record counts as "backward running" when it is an autograd node
// (BACKWARD_FUNCTION scope) or the engine's wrapper around one
// ("autograd::engine::evaluate_function: ...", FUNCTION scope), which also covers the
// engine's own work between node and buffer (validate_outputs' sum_to of broadcast
// gradients, gradient accumulation in input buffers).
//
// A "timeline op" is the outermost record on its thread, or an autograd node's
// evaluate_function record (so each backward node is one op). FLOPs are counted at
// the outermost op of a known kind (conv2d -> convolution is counted once, at
// convolution); an aten:: op with no nested records that is neither counted nor known
// to do no arithmetic is logged as "uncounted".
//
// Inside the TorchScript interpreter, a timeline op of the profiled step belongs to the
// innermost module running it: its path as PyTorch's named_modules() writes it
// (`layer4.0.conv2`), read from the interpreter's module hierarchy.

#include <torch/csrc/jit/runtime/interpreter.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "internal.h"

namespace memprof {

thread_local OpStack tls_ops;

namespace {
constexpr char kEvaluateFunction[] = "autograd::engine::evaluate_function";

// ---------------------------------------------------------------------------------
// The model's variables by storage pointer (set from Rust between iterations; replaced
// tables are kept until the session ends, as another thread may still read them).

struct ParamTable {
  uint64_t mask = 0;
  std::unique_ptr<uint64_t[]> keys;
  std::unique_ptr<int32_t[]> vals;    // variable index
  std::unique_ptr<int32_t[]> layers;  // name id of the variable's layer, -1 none
};
std::atomic<ParamTable*> g_params{nullptr};
std::mutex g_params_mutex;  // serialises replacement (Rust side, between iterations)
// Every table ever published (readers may still hold an old one), under g_params_mutex;
// made at the first set_params (no dynamic initialiser at load).
std::vector<std::unique_ptr<ParamTable>>* g_params_all = nullptr;

// The table slot of `key`, or -1.
inline int64_t param_lookup(const ParamTable* t, uint64_t key) {
  if (!t || key == 0) {
    return -1;
  }
  uint64_t i = (key >> 4) & t->mask;
  for (uint64_t probe = 0; probe <= t->mask; ++probe, i = (i + 1) & t->mask) {
    if (t->keys[i] == key) {
      return int64_t(i);
    }
    if (t->keys[i] == 0) {
      return -1;
    }
  }
  return -1;
}

// The first VarStore variable among an op's tensor inputs, by storage; its layer's
// name id + 1 goes to *layer1 (untouched when none is found).
inline int32_t first_variable(c10::ArrayRef<const c10::IValue> inputs, int32_t* layer1) {
  const ParamTable* t = g_params.load(std::memory_order_acquire);
  if (!t) {
    return -1;
  }
  for (const auto& v : inputs) {
    if (!v.isTensor()) {
      continue;
    }
    const at::Tensor& x = v.toTensor();
    if (!x.defined() || !x.has_storage()) {
      continue;
    }
    const int64_t slot = param_lookup(t, uint64_t(x.storage().data()));
    if (slot >= 0) {
      *layer1 = t->layers[slot] + 1;
      return t->vals[slot];
    }
  }
  return -1;
}

// ---------------------------------------------------------------------------------
// The TorchScript module running on this thread.

// The module path in one entry of the interpreter's module hierarchy: entries read
// `TOP(ResNet)::forward` (the root), `layer4(Sequential)::forward`, `0(BasicBlock)::forward`,
// `SELF(Conv2d)::_conv_forward` (a method of the module above), `::relu` or
// `CALL_FUNCTION::relu` (free functions). Appends `.instance` to buf (at `*len`) for a
// submodule entry; false when the path does not fit.
inline bool append_instance(const std::string& entry, char* buf, size_t cap, size_t* len) {
  const size_t paren = entry.find('(');
  const size_t colons = entry.find("::");
  if (paren == std::string::npos || paren == 0 || (colons != std::string::npos && colons < paren)) {
    return true;  // a free function: no module
  }
  const char* name = entry.data();
  if ((paren == 4 && std::strncmp(name, "SELF", 4) == 0) ||
      (paren == 3 && std::strncmp(name, "TOP", 3) == 0) ||
      (paren == 21 && std::strncmp(name, "INSTANCE_NAME_UNKNOWN", 21) == 0)) {
    return true;
  }
  const size_t sep = *len > 0 ? 1 : 0;
  if (*len + sep + paren >= cap) {
    return false;
  }
  if (sep) {
    buf[(*len)++] = '.';
  }
  std::memcpy(buf + *len, name, paren);
  *len += paren;
  buf[*len] = 0;
  return true;
}

// Whether this thread runs TorchScript now; if so, *layer1 gets the name id + 1 of the
// innermost module's path (0 for the root module's own ops, or a path that does not fit
// a name). Costs one call returning an empty vector when no TorchScript runs.
}  // namespace

bool script_module_path(char* buf, size_t cap, bool* fits) {
  const std::vector<std::string> frames = torch::jit::currentModuleHierarchy();
  if (frames.empty()) {
    return false;
  }
  size_t len = 0;
  buf[0] = 0;
  *fits = true;
  // The first entry is the root module (TOP) or the function the interpreter was given.
  for (size_t k = 1; k < frames.size() && *fits; ++k) {
    *fits = append_instance(frames[k], buf, cap, &len);
  }
  return true;
}

namespace {
inline bool script_module(int32_t* layer1) {
  char buf[kNameLen];
  bool fits = true;
  if (!script_module_path(buf, sizeof buf, &fits)) {
    return false;
  }
  *layer1 = fits && buf[0] != 0 ? intern(buf) + 1 : 0;
  return true;
}

// ---------------------------------------------------------------------------------
// Forward op of each autograd sequence number: a backward node carries the sequence
// number of the forward op that created it. Packed: seq low 32 bits | step 8 | op 24.

constexpr size_t kSeqSlots = size_t(1) << 16;
std::atomic<uint64_t> g_seq[kSeqSlots];

inline void seq_store(int64_t seq, uint32_t step, int32_t op) {
  if (seq < 0 || op < 0 || op >= (1 << 24)) {
    return;
  }
  const uint64_t v =
      (uint64_t(uint32_t(seq)) << 32) | (uint64_t(step & 0xff) << 24) | uint64_t(op);
  g_seq[uint64_t(seq) & (kSeqSlots - 1)].store(v, std::memory_order_relaxed);
}

inline int32_t seq_load(int64_t seq, uint32_t step) {
  if (seq < 0) {
    return -1;
  }
  const uint64_t v = g_seq[uint64_t(seq) & (kSeqSlots - 1)].load(std::memory_order_relaxed);
  if (uint32_t(v >> 32) != uint32_t(seq) || ((v >> 24) & 0xff) != (step & 0xff)) {
    return -1;
  }
  return int32_t(v & 0xffffff);
}

// Layer of each autograd sequence number's forward op (for leak origins): seq low 32
// bits | layer id + 1. No step check: a layer does not change between iterations.
std::atomic<uint64_t> g_seq_layer[kSeqSlots];

inline void seq_layer_store(int64_t seq, int32_t layer1) {
  if (seq < 0 || layer1 <= 0) {
    return;
  }
  g_seq_layer[uint64_t(seq) & (kSeqSlots - 1)].store(
      (uint64_t(uint32_t(seq)) << 32) | uint64_t(uint32_t(layer1)), std::memory_order_relaxed);
}

inline int32_t seq_layer_load(int64_t seq) {
  if (seq < 0) {
    return 0;
  }
  const uint64_t v = g_seq_layer[uint64_t(seq) & (kSeqSlots - 1)].load(std::memory_order_relaxed);
  return uint32_t(v >> 32) == uint32_t(seq) ? int32_t(uint32_t(v)) : 0;
}

// Phase shown for an op: what it is, not when the next allocation flips the phase
// (the first forward op begins while the phase still says "optimizer").
inline uint32_t shown_phase(bool backward_record) {
  if (backward_record) {
    return kBackward;
  }
  const uint32_t ph = cur_phase(g_genphase.load(std::memory_order_acquire));
  if (ph == kBackward && g_active_backward.load(std::memory_order_acquire) == 0) {
    return kOptimizer;
  }
  if (ph == kOptimizer && c10::GradMode::is_enabled()) {
    return kForward;
  }
  return ph;
}

// Op bookkeeping on the calling thread. `steplog`: the step log is on (log op events,
// count FLOPs); otherwise only the origin of allocations is kept (leak hunting).
void op_start(const at::RecordFunction& fn, bool backward_record, bool steplog) {
  OpStack& t = tls_ops;
  const uint32_t step = g_step_id.load(std::memory_order_relaxed);
  if (t.step != step) {
    // A new iteration: whatever this thread had open belongs to the last one.
    t.step = step;
    t.n_open = 0;
    t.read_op = -1;
  }
  const int d = t.depth++;
  if (d >= kMaxDepth) {
    return;
  }
  const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  const bool evaluate = backward_record && !node;
  const bool opens = (evaluate || t.n_open == 0) && t.n_open < kMaxOpenOps;
  // Without the step log, only timeline-level ops need their name.
  const int32_t id = (steplog || opens) ? intern(fn.name()) : -1;
  t.ids[d] = id;
  if (steplog) {
    // A parent counts as a leaf for the "uncounted" list when its only children are
    // ops known to do no arithmetic (most kernels allocate their output via aten::empty).
    if (d > 0 && kind_of(id).family != memprof_flops::kZero) {
      t.had_child |= (uint64_t(1) << (d - 1));
    }
    t.had_child &= ~(uint64_t(1) << d);
  }
  const uint32_t phase = shown_phase(backward_record);

  if (opens) {
    int32_t op = -1;
    if (steplog) {
      op = g_op_counter.fetch_add(1, std::memory_order_relaxed);
      g_last_op.store(op, std::memory_order_relaxed);
    }
    int32_t layer1 = 0;
    const int32_t var = backward_record ? -1 : first_variable(fn.inputs(), &layer1);
    const uint32_t scope = t.n_scope > 0 ? uint32_t(t.scopes[t.n_scope - 1] + 1) : 0;
    int32_t module1 = 0;
    const bool script = !backward_record && steplog && script_module(&module1);
    if (scope != 0) {
      layer1 = int32_t(scope);
    } else if (script) {
      layer1 = module1;  // the module running it, 0 for the root module's own ops
    } else if (!backward_record && layer1 == 0) {
      layer1 = t.last_layer1;  // the layer that ran last
    }
    if (!backward_record && layer1 != 0) {
      t.last_layer1 = layer1;
    }
    t.open_depth[t.n_open] = d;
    t.open_op[t.n_open] = op;
    t.open_name[t.n_open] = id;
    t.open_layer1[t.n_open] = layer1;  // a backward node sets it below
    ++t.n_open;
    if (steplog) {
      const uint64_t module = script ? uint64_t(module1) + 1 : 0;
      steplog_append(
          MpTlEvent{MP_EV_OP_BEGIN, uint8_t(phase), 0, 0, scope, op, id, module, var});
    }
  }
  const int32_t cur = t.n_open > 0 ? t.open_op[t.n_open - 1] : -1;
  if (steplog && g_detail_on.load(std::memory_order_relaxed)) {
    log_reads(fn.inputs(), cur, phase);
  }
  if (node) {
    const int64_t seq = fn.seqNr();
    if (steplog) {
      steplog_append(MpTlEvent{
          MP_EV_LINK, uint8_t(phase), 0, 0, 0, cur, seq_load(seq, step), uint64_t(seq), 0});
    }
    if (t.n_open > 0) {
      const int32_t fwd_layer1 = seq_layer_load(seq);
      if (fwd_layer1 != 0) {
        t.open_layer1[t.n_open - 1] = fwd_layer1;
      }
    }
  } else if (!backward_record && phase == kForward) {
    if (steplog) {
      seq_store(fn.seqNr(), step, cur);
    }
    if (t.n_open > 0) {
      seq_layer_store(fn.seqNr(), t.open_layer1[t.n_open - 1]);
    }
  }
  if (steplog && t.counted_depth1 == 0) {
    const memprof_flops::Kind k = kind_of(id);
    if (memprof_flops::counted(k)) {
      t.counted_depth1 = d + 1;
      const int64_t flops = memprof_flops::count(k, fn.inputs());
      steplog_append(MpTlEvent{MP_EV_FLOPS, uint8_t(phase), 0, 0, 0, cur, id, 0, flops});
    }
  }
}

void op_end(bool backward_record, bool steplog) {
  OpStack& t = tls_ops;
  if (t.depth <= 0) {
    return;
  }
  const int d = --t.depth;
  if (d >= kMaxDepth) {
    return;
  }
  if (t.step != g_step_id.load(std::memory_order_relaxed)) {
    return;  // opened in an earlier iteration
  }
  const int32_t id = t.ids[d];
  if (steplog) {
    const char* name = name_of(id);
    if (t.counted_depth1 == d + 1) {
      t.counted_depth1 = 0;
    } else if (
        t.counted_depth1 == 0 && !backward_record && !(t.had_child & (uint64_t(1) << d)) &&
        name && kind_of(id).family == memprof_flops::kUnknown &&
        std::strncmp(name, "aten::", 6) == 0) {
      const int32_t cur = t.n_open > 0 ? t.open_op[t.n_open - 1] : -1;
      steplog_append(
          MpTlEvent{MP_EV_UNCOUNTED, uint8_t(shown_phase(false)), 0, 0, 0, cur, id, 0, 0});
    }
  }
  if (t.n_open > 0 && t.open_depth[t.n_open - 1] == d) {
    const int32_t op = t.open_op[--t.n_open];
    if (steplog) {
      const int slot = g_steplog_device.load(std::memory_order_relaxed);
      const int64_t live = g_dev[slot].live.load(std::memory_order_relaxed);
      steplog_append(MpTlEvent{
          MP_EV_OP_END, uint8_t(shown_phase(backward_record)), 0, 0, 0, op, id, 0, live});
    }
  }
}
}  // namespace

bool is_backward_record(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    return true;
  }
  const char* name = fn.name();
  return name && name[0] == 'a' &&
      std::strncmp(name, kEvaluateFunction, sizeof(kEvaluateFunction) - 1) == 0;
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  const bool backward_record = is_backward_record(fn);
  if (backward_record) {
    g_active_backward.fetch_add(1, std::memory_order_acq_rel);
    const uint64_t gp = g_genphase.load(std::memory_order_acquire);
    const uint32_t ph = cur_phase(gp);
    if (ph == kForward || ph == kOptimizer) {
      transition(ph, kBackward);
    }
  }
  const bool steplog = g_steplog_on.load(std::memory_order_relaxed);
  if (steplog || g_origin_on.load(std::memory_order_relaxed)) {
    try {
      op_start(fn, backward_record, steplog);
    } catch (...) {
      // Never let the profiler fail the user's op.
    }
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  const bool backward_record = is_backward_record(fn);
  const bool steplog = g_steplog_on.load(std::memory_order_relaxed);
  if (steplog || g_origin_on.load(std::memory_order_relaxed)) {
    try {
      op_end(backward_record, steplog);
    } catch (...) {
    }
  }
  if (backward_record) {
    g_active_backward.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void clear_params() {
  std::lock_guard<std::mutex> lock(g_params_mutex);
  g_params.store(nullptr);
  if (g_params_all) {
    g_params_all->clear();
  }
}

int set_params(const uint64_t* ptrs, const int32_t* ids, const int32_t* layers, size_t n) {
  if (n > 0 && (!ptrs || !ids || !layers)) {
    set_error("memprof_set_params: null array");
    return -1;
  }
  auto t = std::make_unique<ParamTable>();
  uint64_t cap = 16;
  while (cap < 2 * uint64_t(n) + 1) {
    cap <<= 1;
  }
  t->mask = cap - 1;
  t->keys.reset(new uint64_t[cap]());
  t->vals.reset(new int32_t[cap]());
  t->layers.reset(new int32_t[cap]());
  for (size_t k = 0; k < n; ++k) {
    const uint64_t key = ptrs[k];
    if (key == 0) {
      continue;
    }
    uint64_t i = (key >> 4) & t->mask;
    while (t->keys[i] != 0 && t->keys[i] != key) {
      i = (i + 1) & t->mask;
    }
    if (t->keys[i] == 0) {
      t->keys[i] = key;
      t->vals[i] = ids[k];
      t->layers[i] = layers[k];
    }
  }
  std::lock_guard<std::mutex> lock(g_params_mutex);
  if (!g_params_all) {
    g_params_all = new std::vector<std::unique_ptr<ParamTable>>();
  }
  g_params_all->reserve(g_params_all->size() + 1);
  g_params.store(t.get(), std::memory_order_release);
  g_params_all->push_back(std::move(t));
  return 0;
}

}  // namespace memprof
