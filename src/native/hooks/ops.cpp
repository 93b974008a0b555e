// The one op callback and the one op recorder. The callback (registered once, while a
// dry run or a profiling session's records need it: op_callback_use) moves the
// profiled loop into backward when a backward node starts (where no callback is
// registered, the allocation hooks do: internal.h, backward_if_in_task) and hands each
// record to the op recorder of its thread's target (the dry run's thread records into
// the meta trace, every other thread into the profiled step):
// - the profiled step (StepSink): the step log's op events, FLOPs and reads, and the
//   origin of allocations (op and layer, for leak hunting and snapshots);
// - the estimator's dry run (DryRunSink): the same events into the meta trace, plus
//   what only a prediction needs (the cuBLAS workspaces' ops, outputs sized without
//   the allocator), from the dry run's hooks (dryrun/trace.cpp).
// So FLOPs, layers, module paths and reads are counted by the same code for a
// measured step and a predicted one. The profiled step asks libtorch for op inputs only
// in the iterations that learn what its ops take from them (op_seq.cpp); the others look
// it up.
//
// A record counts as "backward running" when it is an autograd node
// (BACKWARD_FUNCTION scope) or the engine's wrapper around one
// ("autograd::engine::evaluate_function: ...", FUNCTION scope). The engine's own work
// between node and buffer (validate_outputs' sum_to of broadcast gradients, gradient
// accumulation in input buffers) is backward too: inside the wrapper's record where
// FUNCTION records are on, and always inside the engine's graph task
// (in_autograd_task), which a session without records (no leak hunting, or leak
// hunting between its learning iterations; no timeline) relies on.
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

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "../dryrun/dryrun.h"
#include "../script/script.h"

namespace memprof {

thread_local OpStack tls_ops;

namespace {
constexpr char kEvaluateFunction[] = "autograd::engine::evaluate_function";

// ---------------------------------------------------------------------------------
// The model's variables by storage pointer (set from Rust between iterations; replaced
// tables are kept until the session ends, as another thread may still read them).

struct ParamTable {
  int target = MP_TARGET_STEP;  // whose table
  uint64_t mask = 0;
  std::unique_ptr<uint64_t[]> keys;
  std::unique_ptr<int32_t[]> vals;    // variable index
  std::unique_ptr<int32_t[]> layers;  // name id of the variable's layer, -1 none
};
std::atomic<ParamTable*> g_params[2] = {{nullptr}, {nullptr}};  // by MpTarget
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
inline int32_t first_variable(
    int target, c10::ArrayRef<const c10::IValue> inputs, int32_t* layer1) {
  const ParamTable* t = g_params[target].load(std::memory_order_acquire);
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

}  // namespace

namespace {
// Whether TorchScript runs on this thread; if so *layer1 gets its module path's name id
// + 1 (0: the root module, or a path that does not fit), and buf the path ("" then).
inline bool script_module(int32_t* layer1, char* buf, size_t cap) {
  bool fits = true;
  if (!script_module_path(buf, cap, &fits)) {
    buf[0] = 0;
    return false;
  }
  if (!fits) {
    buf[0] = 0;
  }
  *layer1 = buf[0] != 0 ? intern(buf) + 1 : 0;
  return true;
}

// ---------------------------------------------------------------------------------
// Forward op of each autograd sequence number: a backward node carries the sequence
// number of the forward op that created it. Packed: seq low 32 bits | step 8 | op 24.

constexpr size_t kSeqSlots = size_t(1) << 16;
std::atomic<uint64_t> g_seq_tables[2][kSeqSlots];  // by MpTarget

inline void seq_store(std::atomic<uint64_t>* g_seq, int64_t seq, uint32_t step, int32_t op) {
  if (seq < 0 || op < 0 || op >= (1 << 24)) {
    return;
  }
  const uint64_t v =
      (uint64_t(uint32_t(seq)) << 32) | (uint64_t(step & 0xff) << 24) | uint64_t(op);
  g_seq[uint64_t(seq) & (kSeqSlots - 1)].store(v, std::memory_order_relaxed);
}

inline int32_t seq_load(const std::atomic<uint64_t>* g_seq, int64_t seq, uint32_t step) {
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
std::atomic<uint64_t> g_seq_layer_tables[2][kSeqSlots];  // by MpTarget

inline void seq_layer_store(std::atomic<uint64_t>* g_seq_layer, int64_t seq, int32_t layer1) {
  if (seq < 0 || layer1 <= 0) {
    return;
  }
  g_seq_layer[uint64_t(seq) & (kSeqSlots - 1)].store(
      (uint64_t(uint32_t(seq)) << 32) | uint64_t(uint32_t(layer1)), std::memory_order_relaxed);
}

inline int32_t seq_layer_load(const std::atomic<uint64_t>* g_seq_layer, int64_t seq) {
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
  if (ph == kBackward && g_active_backward.load(std::memory_order_acquire) == 0 &&
      !in_autograd_task()) {
    return kOptimizer;
  }
  if (ph == kOptimizer && c10::GradMode::is_enabled()) {
    return kForward;
  }
  return ph;
}

// ---------------------------------------------------------------------------------
// Where the recorder's events go. A sink gives the per-thread op stack, the step the
// stack belongs to, op numbers, the phase an op is shown in, the variables and the
// sequence tables of its target, and where events are appended.

// The profiled step: the step log, numbered per iteration.
struct StepSink {
  static constexpr int kTarget = MP_TARGET_STEP;
  static OpStack& stack() {
    return tls_ops;
  }
  static uint32_t step() {
    return g_step_id.load(std::memory_order_relaxed);
  }
  static int32_t next_op() {
    const int32_t op = g_op_counter.fetch_add(1, std::memory_order_relaxed);
    g_last_op.store(op, std::memory_order_relaxed);
    return op;
  }
  static uint32_t phase(bool backward_record) {
    return shown_phase(backward_record);
  }
  static bool reads() {
    return g_detail_on.load(std::memory_order_relaxed);
  }
  static int64_t live() {
    const int slot = g_steplog_device.load(std::memory_order_relaxed);
    return g_dev[slot].live();
  }
  static void append(const MpTlEvent& e) {
    steplog_append(e);
  }
  // Nothing beyond the shared recording.
  static void started(const at::RecordFunction&, int) {}
  static void ended(const at::RecordFunction&, int) {}
  static char* module_buf() {
    thread_local char buf[kNameLen];
    return buf;
  }
};

// The dry run: the meta trace, numbered per training step of the dry run (dryrun/).
struct DryRunSink {
  static constexpr int kTarget = MP_TARGET_DRY_RUN;
  static OpStack& stack() {
    return tls_dry_ops;
  }
  static uint32_t step() {
    return meta_step();
  }
  static int32_t next_op() {
    return meta_next_op();
  }
  static uint32_t phase(bool backward_record) {
    return backward_record ? kBackward : meta_phase();
  }
  static bool reads() {
    return true;
  }
  static int64_t live() {
    return meta_live();
  }
  static void append(const MpTlEvent& e) {
    meta_append(e);
  }
  static void started(const at::RecordFunction& fn, int depth) {
    dry_run_op_started(fn, depth);
  }
  static void ended(const at::RecordFunction& fn, int depth) {
    dry_run_op_ended(fn, depth);
  }
  static char* module_buf() {
    return dry_run_module_buf();
  }
};

// Logs that the timeline op `op` read the storage of x, once per op among its last few.
template <class S>
inline void log_read(OpStack& t, const at::Tensor& x, int32_t op, uint32_t phase) {
  if (!x.defined() || !x.has_storage()) {
    return;
  }
  const uint64_t ptr = uint64_t(x.storage().data());
  if (ptr == 0) {
    return;
  }
  if (t.read_op != op) {
    t.read_op = op;
    t.n_read = 0;
  }
  const int kept = t.n_read < 8 ? t.n_read : 8;
  for (int k = 0; k < kept; ++k) {
    if (t.read_ptrs[k] == ptr) {
      return;
    }
  }
  t.read_ptrs[t.n_read % 8] = ptr;
  ++t.n_read;
  S::append(MpTlEvent{MP_EV_READ, uint8_t(phase), 0, 0, 0, op, 0, ptr, 0});
}

// The op recorder, on the calling thread. `steplog`: log op events and count FLOPs
// (always for the dry run); otherwise only the origin of allocations is kept (leak
// hunting).
template <class S>
void op_start(const at::RecordFunction& fn, bool backward_record, bool steplog) {
  OpStack& t = S::stack();
  const uint32_t step = S::step();
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
  S::started(fn, d);
  const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  const bool evaluate = backward_record && !node;
  const bool opens = (evaluate || t.n_open == 0) && t.n_open < kMaxOpenOps;
  // Without the step log, only timeline-level ops need their name.
  const int32_t id = (steplog || opens) ? intern(fn.name()) : -1;
  t.ids[d] = id;
  const memprof_flops::Kind kind =
      steplog ? kind_of(id) : memprof_flops::Kind{memprof_flops::kUnknown, 0};
  if (steplog) {
    // A parent counts as a leaf for the "uncounted" list when its only children are
    // ops known to do no arithmetic (most kernels allocate their output via aten::empty).
    if (d > 0 && kind.family != memprof_flops::kZero) {
      t.had_child |= (uint64_t(1) << (d - 1));
    }
    t.had_child &= ~(uint64_t(1) << d);
  }
  const uint32_t phase = S::phase(backward_record);

  // What the op takes from its inputs: a timeline op outside backward, its first
  // variable; with the step log, the outermost op with a FLOP formula, its FLOPs (linear
  // counts at addmm). The profiled step asks for inputs only while it learns them
  // (op_seq.cpp), and looks them up in the other iterations.
  const bool wants_var = opens && !backward_record;
  const bool wants_flops =
      steplog && t.counted_depth1 == 0 && memprof_flops::counted(kind);
  OpInputs took;
  bool flops_lost = false;
  if (S::kTarget == MP_TARGET_STEP && steplog && backward_record && !tls_hot.training_thread &&
      !fn.needsInputs()) {
    // Backward on another thread (CUDA's autograd engine): its ops are not learned, so
    // the rest of the iteration asks for inputs before the node's ops begin.
    op_seq_ask_inputs(false);
  }
  if (wants_var || wants_flops) {
    if (fn.needsInputs() || S::kTarget != MP_TARGET_STEP) {
      if (wants_var) {
        took.var = first_variable(S::kTarget, fn.inputs(), &took.layer1);
      }
      if (wants_flops) {
        took.flops = memprof_flops::count(kind, fn.inputs());
      }
      if (S::kTarget == MP_TARGET_STEP) {
        op_seq_learn(id, took);
      }
    } else if (!tls_hot.training_thread) {
      // Another thread, no inputs: nothing known of this op; with the timeline, the ops
      // after it get their inputs (this iteration only: not a parting).
      if (steplog) {
        flops_lost = wants_flops;
        op_seq_ask_inputs(false);
      }
    } else if (!op_seq_looking_up()) {
      // No inputs and nothing learned (the memory history alone): nothing known.
    } else if (!op_seq_lookup(id, &took)) {
      took = OpInputs{};
      if (steplog) {
        // The timeline: this op's FLOPs are not known; the ops after it are counted
        // from their own inputs.
        flops_lost = wants_flops;
        op_seq_ask_inputs(true);
      } else if (wants_var) {
        // Leak hunting alone: not the op learned here, so no layer, not the last one's.
        t.last_layer1 = 0;
      }
    }
  }

  if (opens) {
    int32_t op = -1;
    if (steplog) {
      op = S::next_op();
    }
    int32_t layer1 = took.layer1;
    const int32_t var = took.var;
    // The thread's scopes (tch_memprof::scope), whichever recorder runs.
    const OpStack& scopes = tls_ops;
    const uint32_t scope =
        scopes.n_scope > 0 ? uint32_t(scopes.scopes[scopes.n_scope - 1] + 1) : 0;
    int32_t module1 = 0;
    const bool script =
        !backward_record && steplog && script_module(&module1, S::module_buf(), kNameLen);
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
    t.open_log[t.n_open] = S::kTarget == MP_TARGET_STEP && steplog
        ? g_steplog_len.load(std::memory_order_relaxed)
        : 0;
    ++t.n_open;
    if (steplog) {
      const uint64_t module = script ? uint64_t(module1) + 1 : 0;
      S::append(MpTlEvent{MP_EV_OP_BEGIN, uint8_t(phase), 0, 0, scope, op, id, module, var});
    }
  }
  const int32_t cur = t.n_open > 0 ? t.open_op[t.n_open - 1] : -1;
  if (steplog && cur >= 0 && S::reads()) {
    for_each_tensor(fn.inputs(), [&](const at::Tensor& x) { log_read<S>(t, x, cur, phase); });
  }
  std::atomic<uint64_t>* seq_ops = g_seq_tables[S::kTarget];
  std::atomic<uint64_t>* seq_layers = g_seq_layer_tables[S::kTarget];
  if (node) {
    const int64_t seq = fn.seqNr();
    if (steplog) {
      S::append(MpTlEvent{
          MP_EV_LINK, uint8_t(phase), 0, 0, 0, cur, seq_load(seq_ops, seq, step), uint64_t(seq),
          0});
    }
    if (t.n_open > 0) {
      const int32_t fwd_layer1 = seq_layer_load(seq_layers, seq);
      if (fwd_layer1 != 0) {
        t.open_layer1[t.n_open - 1] = fwd_layer1;
      }
    }
  } else if (!backward_record && phase == kForward) {
    if (steplog) {
      seq_store(seq_ops, fn.seqNr(), step, cur);
    }
    if (t.n_open > 0) {
      seq_layer_store(seq_layers, fn.seqNr(), t.open_layer1[t.n_open - 1]);
    }
  }
  // FLOPs once, at the outermost op with a formula.
  if (wants_flops) {
    t.counted_depth1 = d + 1;
    if (flops_lost) {
      S::append(MpTlEvent{MP_EV_UNCOUNTED, uint8_t(phase), 0, 0, 0, cur, id, 0, 0});
    } else {
      S::append(MpTlEvent{MP_EV_FLOPS, uint8_t(phase), 0, 0, 0, cur, id, 0, took.flops});
    }
  }
}

template <class S>
void op_end(const at::RecordFunction& fn, bool backward_record, bool steplog) {
  OpStack& t = S::stack();
  if (t.depth <= 0) {
    return;
  }
  const int d = --t.depth;
  if (d >= kMaxDepth) {
    return;
  }
  if (t.step != S::step()) {
    return;  // opened in an earlier iteration
  }
  S::ended(fn, d);
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
      S::append(MpTlEvent{MP_EV_UNCOUNTED, uint8_t(S::phase(false)), 0, 0, 0, cur, id, 0, 0});
    }
  }
  if (t.n_open > 0 && t.open_depth[t.n_open - 1] == d) {
    const int32_t op = t.open_op[--t.n_open];
    if (S::kTarget == MP_TARGET_STEP && steplog && !op_seq_op_end(id)) {
      // It allocated other sizes than the op learned there: the FLOPs looked up inside
      // it may have been another shape's.
      steplog_uncount(t.open_log[t.n_open], op);
    }
    if (steplog) {
      S::append(MpTlEvent{
          MP_EV_OP_END, uint8_t(S::phase(backward_record)), 0, 0, 0, op, id, 0, S::live()});
    }
  }
}

}  // namespace

thread_local OpStack tls_dry_ops;

bool is_backward_record(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    return true;
  }
  const char* name = fn.name();
  // Most names are "aten::...": the second letter settles them without a call.
  return name && name[0] == 'a' && name[1] == 'u' &&
      std::strncmp(name, kEvaluateFunction, sizeof(kEvaluateFunction) - 1) == 0;
}

namespace {
// What each open record of this thread entered, by nesting depth (bit d): the session's
// count of running backward nodes, the profiled step's recorder, the dry run's. Decided
// at the record's start and undone at its end from these bits, so a flag that changes in
// between (a session starting, a dry run ending) never unbalances a count or a stack.
// Records nested deeper than 64 are left to their parents.
struct Entered {
  int depth;
  uint64_t backward;
  uint64_t step;
  uint64_t dry;
  uint64_t backward_record;  // is_backward_record, kept for the end
};
thread_local Entered tls_entered;
}  // namespace

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  Entered& en = tls_entered;
  const int d = en.depth++;
  if (d >= 64) {
    return nullptr;
  }
  const uint64_t bit = uint64_t(1) << d;
  en.backward &= ~bit;
  en.step &= ~bit;
  en.dry &= ~bit;
  const bool backward_record = is_backward_record(fn);
  en.backward_record = backward_record ? en.backward_record | bit : en.backward_record & ~bit;
  // A dry run's thread records into the meta trace only; any other thread into the
  // profiled step only.
  if (dry_run_thread()) {
    if (meta_trace_on()) {
      en.dry |= bit;
      try {
        op_start<DryRunSink>(fn, backward_record, true);
      } catch (...) {
      }
    }
    return nullptr;
  }
  if (g_step_user.load(std::memory_order_relaxed)) {
    if (backward_record) {
      en.backward |= bit;
      g_active_backward.fetch_add(1, std::memory_order_acq_rel);
      const uint64_t gp = g_genphase.load(std::memory_order_acquire);
      const uint32_t ph = cur_phase(gp);
      if (ph == kForward || ph == kOptimizer) {
        transition(ph, kBackward);
      }
    }
    const bool steplog = g_steplog_on.load(std::memory_order_relaxed);
    // Origins learned by block (op_seq.cpp) need no record of the nodes either.
    if (steplog ||
        (g_origin_on.load(std::memory_order_relaxed) && !op_seq_origins_learned())) {
      en.step |= bit;
      try {
        op_start<StepSink>(fn, backward_record, steplog);
      } catch (...) {
        // Never let the profiler fail the user's op.
      }
    }
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  Entered& en = tls_entered;
  if (en.depth <= 0) {
    return;  // begun before this thread's first record was seen
  }
  const int d = --en.depth;
  if (d >= 64) {
    return;
  }
  const uint64_t bit = uint64_t(1) << d;
  if (!((en.backward | en.step | en.dry) & bit)) {
    return;
  }
  const bool backward_record = (en.backward_record & bit) != 0;
  if (en.step & bit) {
    try {
      op_end<StepSink>(fn, backward_record, g_steplog_on.load(std::memory_order_relaxed));
    } catch (...) {
    }
  }
  if (en.backward & bit) {
    g_active_backward.fetch_sub(1, std::memory_order_acq_rel);
  }
  if (en.dry & bit) {
    try {
      op_end<DryRunSink>(fn, backward_record, true);
    } catch (...) {
    }
  }
}

void clear_params(int target) {
  std::lock_guard<std::mutex> lock(g_params_mutex);
  g_params[target].store(nullptr);
  // This target's tables are released here, when its recorder stops; the other
  // target's, current and replaced, stay (a reader may still hold one).
  if (g_params_all) {
    auto& all = *g_params_all;
    all.erase(
        std::remove_if(
            all.begin(), all.end(),
            [&](const std::unique_ptr<ParamTable>& t) { return t->target == target; }),
        all.end());
  }
}

int set_params(int target, const uint64_t* ptrs, const int32_t* ids, const int32_t* layers,
               size_t n) {
  if (target != MP_TARGET_STEP && target != MP_TARGET_DRY_RUN) {
    set_error("memprof_set_params: not a MpTarget");
    return -1;
  }
  if (n > 0 && (!ptrs || !ids || !layers)) {
    set_error("memprof_set_params: null array");
    return -1;
  }
  auto t = std::make_unique<ParamTable>();
  t->target = target;
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
  g_params[target].store(t.get(), std::memory_order_release);
  g_params_all->push_back(std::move(t));
  return 0;
}

}  // namespace memprof
