// Internals shared by the native layer's translation units. Nothing here crosses the
// FFI: the contract with Rust is memprof.h.
//
// Hot-path rules (the allocation hooks and op callbacks run millions of times):
// - atomics only: no lock, no heap allocation, no I/O, no unbounded wait (one exception:
//   while TorchScript runs in the profiled step or a dry run, the op callback asks the
//   interpreter for the module path, a malloc'd vector of strings, never through the
//   watched allocator);
// - never allocate through the allocator being watched (HookScope counts re-entries,
//   and the tests require the count to stay 0);
// - the CUDA reporter runs under the caching allocator's lock: it never calls back
//   into that allocator.
//
// Accounting model:
// - Every block carries a birth tag: the generation (bumped at every phase change and
//   every iteration start) and the phase it was born in.
// - Per device, live bytes are kept per generation in a ring of kRing slots; a slot
//   whose generation falls out of the ring is folded into a per-phase "old" counter.
//   Slot updates are single 64-bit CASes (generation, phase and bytes packed), so a
//   free is never charged to the wrong generation, even racing with a fold.
// - Feature maps: bytes of the forward generation still live when the first backward
//   node starts. Optimizer state: live bytes born in optimizer generations.
// - During backward, births and deaths go to a lock-free log that the Rust side
//   replays for the intermediate gradients (which blocks became weight gradients is
//   known only after backward).

#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/AutogradState.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flops/flops.h"
#include "memprof.h"

namespace memprof {

// ---------------------------------------------------------------------------------
// Constants.

constexpr int kMaxCuda = MP_MAX_CUDA;
constexpr int kMaxDevices = MP_MAX_DEVICES;  // slot 0 = CPU, 1 + i = cuda:i
constexpr int kRing = 8;
constexpr uint32_t kForward = MP_PHASE_FORWARD;
constexpr uint32_t kBackward = MP_PHASE_BACKWARD;
constexpr uint32_t kOptimizer = MP_PHASE_OPTIMIZER;
constexpr uint32_t kIdle = MP_PHASE_IDLE;
constexpr int kPhases = 4;

constexpr uint64_t kGenBits = 20;
constexpr uint64_t kGenMask = (1ull << kGenBits) - 1;
constexpr uint64_t kBytesBits = 42;
constexpr uint64_t kBytesMask = (1ull << kBytesBits) - 1;

constexpr uint32_t kNoReg = 0xffffffffu;

// ---------------------------------------------------------------------------------
// What every allocation and free reads, in one cache line each: the process's flags and
// phase (HotState, counters.cpp) and the thread's (HotTls). Between two allocations of
// a step of small ops, libtorch's own work evicts the hooks' data from the first-level
// cache, so each line a hook reads is a miss: as globals of their own, scattered over
// the binary's data, an allocation read about ten lines of them (cachegrind of the
// overhead bench's MLP child). The names below are the fields' old names, kept as
// references the compiler resolves to the field's address.

struct RegEntry;

// Constant initialisation, checked by the compiler: g_hot and tls_hot are read by the
// allocation hooks from the library's load on (the CPU allocator is installed by a
// load-time initialiser whose order against counters.cpp's is unspecified), so neither
// may have an initialiser that runs at load.
#if defined(__cpp_constinit)
#define MEMPROF_CONSTINIT constinit
#elif defined(__clang__)
#define MEMPROF_CONSTINIT [[clang::require_constant_initialization]]
#elif defined(__GNUC__)
#define MEMPROF_CONSTINIT __constinit
#else
#define MEMPROF_CONSTINIT
#endif

struct alignas(64) HotState {
  // Current generation and phase, packed (gen << 8 | phase) so both are read together.
  std::atomic<uint64_t> genphase;
  // Backward nodes running now, on any thread.
  std::atomic<int64_t> active_backward;
  // Leak hunting's live-block registry (registry.cpp): its entries, and by lane the
  // entries of live blocks.
  RegEntry* reg;
  std::atomic<int64_t> reg_live[2];
  // The CPU blocks' epoch (cpu_allocator.cpp).
  std::atomic<uint32_t> cpu_epoch;
  // The iteration (step) that births belong to, and the session (registry.cpp).
  std::atomic<uint32_t> iter;
  std::atomic<uint32_t> session_id;
  // The registry's entries freed by the own lane's thread, (index + 1) of the list's
  // head, 0 = empty: that thread alone reads and writes it (registry.cpp).
  uint32_t reg_own_free;
  // Whether blocks of earlier CPU epochs are forgotten (the CUDA-like test mode).
  std::atomic<bool> cpu_forget;
  // The registry (leak hunting), the memory history (logs.cpp), the step log (logs.cpp)
  // and the step detail (sites.cpp): on or off.
  std::atomic<bool> origin_on;
  std::atomic<bool> hist_on;
  std::atomic<bool> steplog_on;
  std::atomic<bool> detail_on;
  // Whether in_autograd_task reads libtorch's graph task directly (counters.cpp).
  std::atomic<bool> graph_task_direct;
};
extern HotState g_hot;
inline constexpr std::atomic<uint64_t>& g_genphase = g_hot.genphase;
inline constexpr std::atomic<int64_t>& g_active_backward = g_hot.active_backward;
inline constexpr RegEntry*& g_reg = g_hot.reg;
inline constexpr std::atomic<int64_t> (&g_reg_live)[2] = g_hot.reg_live;
inline constexpr std::atomic<uint32_t>& g_cpu_epoch = g_hot.cpu_epoch;
inline constexpr std::atomic<uint32_t>& g_iter = g_hot.iter;
inline constexpr std::atomic<uint32_t>& g_session_id = g_hot.session_id;
inline constexpr uint32_t& g_reg_own_free = g_hot.reg_own_free;
inline constexpr std::atomic<bool>& g_cpu_forget = g_hot.cpu_forget;
inline constexpr std::atomic<bool>& g_origin_on = g_hot.origin_on;
inline constexpr std::atomic<bool>& g_hist_on = g_hot.hist_on;
inline constexpr std::atomic<bool>& g_steplog_on = g_hot.steplog_on;
inline constexpr std::atomic<bool>& g_detail_on = g_hot.detail_on;
inline constexpr std::atomic<bool>& g_graph_task_direct = g_hot.graph_task_direct;

struct alignas(64) HotTls {
  // Hooks open on this thread (HookScope).
  int hook_depth;
  // Whether this thread is the training thread of the session.
  bool training_thread;
  // Whether this thread writes the own lane (see Lane, counters.h).
  bool own_lane;
  // Sizes of the blocks this thread allocated in this iteration, hashed in order
  // (op_seq.cpp: a learned op is looked up only after the same allocations).
  uint64_t alloc_sig;
  // The thread's AutogradState (grad_mode_enabled, counters.h), once asked.
  c10::AutogradState* autograd_state;
  // This thread's std::shared_ptr<GraphTask> (its first word the GraphTask pointer),
  // once found (in_autograd_task).
  void* const* graph_task;
};
// Constant-initialised (all zero): the sources are compiled with -fno-extern-tls-init.
extern thread_local HotTls tls_hot;

// ---------------------------------------------------------------------------------
// Errors (api.cpp): the calling thread's last-error slot.

void set_error(const char* what) noexcept;
// False (with the error set) when an out- or in-pointer the caller must give is null.
bool given(const void* p, const char* what);

// ---------------------------------------------------------------------------------
// The session (session.cpp). Start and stop take the session mutex; the rest reads
// or bumps atomics. -1 (with the error set) where memprof.h says so.

int session_start(int32_t want_cuda, int32_t timeline_slot, int32_t leaks);
void session_stop();
// Whether the running session asked for leak hunting (restored when the memory
// history stops).
bool session_leaks_requested();
// Whether the profiled step needs ops recorded (leak hunting's origins, the step
// timeline, the memory history): leak hunting alone records them only in the
// iterations that learn its blocks' origins; its phases need no record
// (backward_if_in_task).
bool step_records_ops();
int begin_iteration();
void read_state(MpState* out);
// `slot` in 0..kMaxDevices.
void read_device_stats(int32_t slot, MpDeviceStats* out);

// ---------------------------------------------------------------------------------
// Re-entrancy of the hooks (counters.cpp): every hook body runs inside a HookScope;
// entering one while another is open on the same thread means a hook allocated through
// the allocator it watches (or called back into itself), which is counted.

extern std::atomic<int64_t> g_hook_reentries;

struct HookScope {
  HookScope() noexcept {
    if (tls_hot.hook_depth++ > 0) {
      g_hook_reentries.fetch_add(1, std::memory_order_relaxed);
    }
  }
  ~HookScope() {
    --tls_hot.hook_depth;
  }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

// ---------------------------------------------------------------------------------
// Generation slots, device counters and the phase (counters.h; counters.cpp).
}  // namespace memprof
#include "counters.h"  // NOLINT: after what it uses above
namespace memprof {

// ---------------------------------------------------------------------------------
// Logs (logs.cpp): fixed-capacity event logs reserved with mmap (pages touched only
// as they fill), appended with one atomic increment.

// Reserves address space for `bytes` (zero-filled pages, no swap reserved); null if
// the reservation fails.
void* reserve_pages(size_t bytes);
template <class T>
T* reserve(size_t n) {
  return static_cast<T*>(reserve_pages(n * sizeof(T)));
}

// The backward log.
constexpr size_t kLogCapacity = size_t(1) << 20;
extern MpLogEvent* g_log;
extern std::atomic<uint64_t> g_log_len;

// Returns 1 + the event's place in the log, or 0 where it was not logged (no log, or
// the log is full).
inline uint32_t log_event(uint64_t ptr, int64_t delta, uint32_t gen, uint32_t dev) {
  if (!g_log) {
    return 0;
  }
  const uint64_t i = g_log_len.fetch_add(1, std::memory_order_relaxed);
  if (i < kLogCapacity) {
    g_log[i] = MpLogEvent{ptr, delta, gen, dev};
    return uint32_t(i + 1);
  }
  return 0;
}

// The step log (timeline; off unless asked for): every block birth and death on
// every device, every timeline-level op begin and end, every phase change, every
// counted FLOP and every op that could not be counted, reset at each iteration.
constexpr size_t kStepLogCapacity = size_t(1) << 22;
extern MpTlEvent* g_steplog;
extern std::atomic<uint64_t> g_steplog_len;
extern std::atomic<int32_t> g_op_counter;
extern std::atomic<int32_t> g_last_op;
extern std::atomic<uint32_t> g_step_id;
extern std::atomic<int32_t> g_steplog_device;
extern std::atomic<uint32_t> g_steplog_start_gen;
extern std::atomic<int64_t> g_steplog_start_live;

inline void steplog_append(const MpTlEvent& e) {
  if (!g_steplog) {
    return;
  }
  const uint64_t i = g_steplog_len.fetch_add(1, std::memory_order_relaxed);
  if (i < kStepLogCapacity) {
    g_steplog[i] = e;
  }
}

// Empties the step log for a new iteration whose first generation is `gen`.
void begin_steplog(uint32_t gen);
// The FLOPs logged for timeline op `op` from log index `from` on become "not counted"
// (they were looked up for inputs the op did not have: op_seq.cpp).
void steplog_uncount(uint64_t from, int32_t op);
// Blocks adopted on device slot `dev` were live when the step began: its start counts them.
void steplog_add_start_live(int dev, int64_t bytes);

// The step detail (sites.cpp; off unless asked for, one profiled step): every op's
// tensor inputs (MP_EV_READ) and the call stack of every allocation of the timeline
// device, kept as raw return addresses in a reserved table and symbolised by the Rust
// side after the step.
constexpr uint64_t kSiteCapacity = uint64_t(1) << 16;
extern MpSite* g_sites;
// The call stack of the allocation running now, as a site id + 1 (0: the table is full).
// `skip`: the frames at the top that are the profiler's own (take_site's, and the
// caller's where it is not the hook itself).
int32_t take_site(uint32_t skip = 1);
// Starts the site table anew (the next site taken is id 0).
void reset_sites();

// Calls f on every tensor among an op's inputs or outputs `values`: a tensor, and each
// tensor of a list of tensors (`Tensor[]`, as `cat` takes), of a list of optional ones
// (`Tensor?[]`, as `index` takes) or of a tuple (a multi-output op's results). Reads the
// lists in place: allocates nothing.
template <class Values, class F>
void for_each_tensor(const Values& values, F&& f) {
  for (const c10::IValue& v : values) {
    if (v.isTensor()) {
      f(v.toTensor());
    } else if (v.isTensorList() || v.isOptionalTensorList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          f(e.toTensor());
        }
      }
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) {
        if (e.isTensor()) {
          f(e.toTensor());
        }
      }
    }
  }
}
int set_detail(bool on);
int read_site(uint64_t id, MpSite* out);

// The memory history (off unless asked for): births and deaths with their origin and
// a timestamp, in a ring of the last g_hist_cap events.
constexpr uint64_t kHistMax = uint64_t(1) << 24;
extern MpHistEvent* g_hist;
extern std::atomic<uint64_t> g_hist_len;
extern std::atomic<uint64_t> g_hist_cap;

// Readers of the logs (copies for the Rust side; `out` may be null when `cap` is 0; the
// backward log is read in place: it lives as long as the process).
void timeline_header(MpTimelineHeader* out);
void log_view(const MpLogEvent** events, uint64_t* len, uint64_t* total);
void read_timeline(MpTlEvent* out, uint64_t cap, uint64_t* total);
void read_history(MpHistEvent* out, uint64_t cap, uint64_t* total, uint64_t* ring);
// Starts (clearing it) or stops the memory history.
int set_history(bool on, uint64_t max_entries);

// ---------------------------------------------------------------------------------
// Per-thread op state (ops.cpp); zero-initialised means "nothing open".

constexpr int kMaxDepth = 64;
constexpr int kMaxOpenOps = 8;
constexpr int kMaxScopes = 32;

struct OpStack {
  int depth;
  int counted_depth1;  // 1 + depth of the counted op we are inside, 0 if none
  uint64_t had_child;  // bit d: the open record at depth d has a nested record
  int n_open;          // open timeline-level ops
  int open_depth[kMaxOpenOps];
  int32_t open_op[kMaxOpenOps];
  int32_t ids[kMaxDepth];  // name id of the open record at each depth
  uint32_t step;
  int n_scope;
  int32_t scopes[kMaxScopes];
  // Origin of allocations (leak hunting): name id and layer (id + 1, 0 none) of each
  // open timeline-level op, and the layer of the last forward op on this thread.
  int32_t open_name[kMaxOpenOps];
  int32_t open_layer1[kMaxOpenOps];
  int32_t last_layer1;
  // The profiled step's log length when each open timeline-level op began.
  uint64_t open_log[kMaxOpenOps];
  // The step detail: storages already logged as read by timeline op read_op.
  int32_t read_op;
  int n_read;
  uint64_t read_ptrs[8];
};
extern thread_local OpStack tls_ops;

// Where an allocation on this thread comes from: the timeline-level op running (-1 if
// none) and its layer (-1 if unknown).
inline void current_origin(int32_t* op, int32_t* layer) {
  const OpStack& t = tls_ops;
  if (t.n_open > 0) {
    *op = t.open_name[t.n_open - 1];
    *layer = t.open_layer1[t.n_open - 1] - 1;
  } else {
    *op = -1;
    *layer = t.last_layer1 - 1;
  }
}

inline int32_t current_op() {
  const OpStack& t = tls_ops;
  if (t.n_open > 0 && t.step == g_step_id.load(std::memory_order_relaxed)) {
    return t.open_op[t.n_open - 1];
  }
  return g_last_op.load(std::memory_order_relaxed);
}

void hist_append_on(int dev, uint64_t ptr, int64_t delta);
// Appends to the memory history when it is on (a check inline: a call at every
// allocation and free of every session otherwise).
inline void hist_append(int dev, uint64_t ptr, int64_t delta) {
  if (g_hist_on.load(std::memory_order_relaxed)) {
    hist_append_on(dev, ptr, delta);
  }
}

// ---------------------------------------------------------------------------------
// Live-block registry (registry.cpp).

struct RegEntry {
  std::atomic<uint64_t> ptr;     // block data pointer; 0 while free or being filled
  std::atomic<int64_t> size;
  std::atomic<uint64_t> origin;  // op id (low 32 bits) | layer id (high 32 bits)
  std::atomic<uint64_t> misc;    // iteration | phase << 32 | device << 40 | session << 48
  std::atomic<uint32_t> next;    // free-list link: index + 1, 0 = end
};

constexpr uint32_t kRegCapacity = 1u << 21;
extern std::atomic<uint32_t> g_reg_hw;
extern std::atomic<int64_t> g_reg_dropped;

uint32_t reg_add_on(uint64_t ptr, int64_t size, uint32_t phase, int dev);
void reg_remove_entry(uint32_t idx);
// Registers a block born now; returns its entry or kNoReg. The checks that leave most
// allocations and frees of a session without leak hunting here are inline.
inline uint32_t reg_add(uint64_t ptr, int64_t size, uint32_t phase, int dev) {
  return g_origin_on.load(std::memory_order_relaxed) ? reg_add_on(ptr, size, phase, dev) : kNoReg;
}
inline void reg_remove(uint32_t idx) {
  if (idx < kRegCapacity) {
    reg_remove_entry(idx);
  }
}

// CUDA block table: block pointer -> birth tag (pack(gen, phase, bytes)) and registry
// entry. Lock-free open addressing (linear probing, bounded), safe with several
// writers; a removed key leaves a tombstone, turned back into an empty slot when no
// probe chain runs through it.
struct BlockSlot {
  std::atomic<uint64_t> key;  // 0 empty, 1 tombstone, 2 being written, else the pointer
  std::atomic<uint64_t> tag;
  std::atomic<uint32_t> reg;
  std::atomic<uint32_t> watched;  // MpWatch: its removal counts in g_watched_frees
  std::atomic<uint32_t> birth;    // MpBlock's birth_log, set by the block's inserter
};
struct BlockTable {
  BlockSlot* slots = nullptr;
  uint64_t mask = 0;
};
constexpr int kMaxProbe = 512;
// Inserts `ptr`; *stale_reg gets the registry entry of an earlier entry for the same
// pointer (a free that was never reported), else kNoReg. Null: no room; else its slot,
// whose key stays `ptr` until the block's free is reported (the inserter may set its
// birth meanwhile).
BlockSlot* table_insert(BlockTable& t, uint64_t ptr, uint64_t tag, uint32_t reg,
                        uint32_t* stale_reg);
// Removes `ptr`, handing back its tag and registry entry. False: not found.
bool table_remove(BlockTable& t, uint64_t ptr, uint64_t* tag, uint32_t* reg);
// Reads `ptr`'s tag (and its birth, unless null) without removing it. False: not found.
bool table_find(const BlockTable& t, uint64_t ptr, uint64_t* tag, uint32_t* birth = nullptr);
// Marks `ptr`'s entry watched as `kind` (MpWatch: its removal will count in
// g_watched_frees[kind - 1]); false if absent.
bool table_watch(BlockTable& t, uint64_t ptr, uint32_t kind);
// Watched blocks freed since the process started, by kind - 1 (memprof_watched_frees).
extern std::atomic<uint64_t> g_watched_frees[2];
inline void count_watched_free(uint32_t kind) {
  if (kind == MP_WATCH_VARIABLE || kind == MP_WATCH_GRAD) {
    g_watched_frees[kind - 1].fetch_add(1, std::memory_order_release);
  }
}

extern BlockTable g_cuda_blocks;
extern std::atomic<int64_t> g_cuda_untracked;

// Readers of the registry and of tensors' blocks, and the block table's self-test.
void registry_stats(MpRegistry* out);
// The live blocks of device `slot` born in this session: up to `cap` into `out`, the
// count of all in *count.
void live_blocks(int32_t slot, MpLiveBlock* out, uint64_t cap, uint64_t* count);
// The block behind `t` (or behind its .grad).
// With watch, a tracked block is also marked watched (MpBlock.watched: MP_WATCH_GRAD
// for a .grad, else MP_WATCH_VARIABLE).
void fill_block(const at::Tensor& t, bool grad, MpBlock* out, bool watch = false);
// fill_block for n tensor handles (at::Tensor*, none null), tensor and .grad (flags:
// MpBlocksFlags; with MP_BLOCKS_GRADS_ONLY, blocks is not written).
void fill_blocks(const void* const* tensors, size_t n, MpBlock* blocks, MpBlock* grads,
                 int32_t flags);
int selftest_block_table(uint64_t n, uint64_t* errors);
// The CUDA accounting's cost without a GPU (cuda.cpp): n births then n deaths of fake
// cuda:0 blocks reported to a reporter as the caching allocator reports them, on this
// thread or on a thread of its own (CUDA's backward); *ns: the time of the 2n reports.
int cuda_report_cost(uint64_t n, int32_t other_thread, uint64_t* ns);
// Adopts the blocks behind n tensors and their .grad that the counters never saw born
// (CUDA blocks from before the session's reporter; CPU blocks in the test mode): tagged
// as born before the session in the forward phase, counted live from now on, their frees
// then seen like any other. *bytes: the bytes adopted.
void adopt_blocks(const void* const* tensors, size_t n, int64_t* bytes);
// Empties the CUDA block table, the CUDA devices' live counters and their last reported
// allocator counters (at a session's start, with no reporter installed).
void forget_cuda_blocks();

// ---------------------------------------------------------------------------------
// Counting births and deaths (every device).

void op_seq_block_origin(int dev, int64_t size, int32_t* op, int32_t* layer);

// A block's birth or death in the step log (the timeline), out of line (logs.cpp): the
// timeline's steps run it, every other allocation and free only the check below.
[[gnu::noinline]] void steplog_block_event_on(
    uint8_t kind, int dev, uint64_t ptr, int64_t delta, uint32_t gen, uint32_t phase);
inline void steplog_block_event(
    uint8_t kind, int dev, uint64_t ptr, int64_t delta, uint32_t gen, uint32_t phase) {
  if (__builtin_expect(g_steplog_on.load(std::memory_order_relaxed), 0)) {
    steplog_block_event_on(kind, dev, ptr, delta, gen, phase);
  }
}

// Returns the block's birth_log (MpBlock): 1 + its place in the backward log, or 0.
inline uint32_t on_alloc(int dev, uint64_t ptr, int64_t size, uint32_t gen, uint32_t phase) {
  tls_hot.alloc_sig = (tls_hot.alloc_sig ^ uint64_t(size) ^ (uint64_t(dev) << 56)) * 0x100000001b3ull;
  count_birth(g_dev[dev], size, gen, phase, true);
  uint32_t birth = 0;
  if (phase == kBackward) {
    birth = log_event(ptr, size, gen, uint32_t(dev));
  }
  steplog_block_event(MP_EV_ALLOC, dev, ptr, size, gen, phase);
  return birth;
}

inline void on_free(int dev, uint64_t ptr, int64_t size, uint32_t gen, uint32_t phase) {
  count_death(g_dev[dev], size, gen, phase);
  if (phase == kBackward) {
    const uint64_t gp = g_genphase.load(std::memory_order_relaxed);
    if (cur_gen(gp) == gen) {
      log_event(ptr, -size, gen, uint32_t(dev));
    }
  }
  steplog_block_event(MP_EV_FREE, dev, ptr, -size, gen, phase);
}

// ---------------------------------------------------------------------------------
// Names (names.cpp): op, layer and scope names interned once into a fixed table.

constexpr uint32_t kNameSlots = 1u << 13;
constexpr size_t kNameLen = 96;
// Interns `name`; its id, or -1 when the table is full (or a slot stays unready).
int32_t intern(const char* name);
memprof_flops::Kind kind_of(int32_t id);
// The stored name of `id`, or null.
const char* name_of(int32_t id);
// Copies name_of(id) into buf (truncated, NUL-terminated); its length, -1 if none.
int64_t copy_name(int32_t id, char* buf, size_t len);
// intern(), with the error set when the table is full.
int intern_checked(const char* name, int32_t* id);
// The calling thread's layer scopes.
int scope_push(int32_t id);
int scope_pop();

// ---------------------------------------------------------------------------------
// Op callbacks (ops.cpp).

bool is_backward_record(const at::RecordFunction& fn);
// The op callback (ops.cpp), registered by callback.cpp.
std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn);
void on_op_end(const at::RecordFunction& fn, at::ObserverContext*);
// A profiling session uses the callback (callback.cpp).
extern std::atomic<bool> g_step_user;
// The one op callback's registration: target (MpTarget) needs it (on) or not, with the
// ops' inputs and/or outputs, for every op's record (functions) or only the autograd
// nodes'; registered while any target needs it, with what they need.
void op_callback_use(int target, bool on, bool inputs, bool outputs, bool functions);
// Target now needs the ops' inputs too, if it still needs the callback (else nothing).
void op_callback_want_inputs(int target);
// Target now needs every op's record (or only the nodes'), if it still needs the
// callback (else nothing).
void op_callback_want_functions(int target, bool functions);
// Target now needs every op's record with its inputs, if it still needs the callback.
void op_callback_want_records(int target);
// The variables the op recorder of `target` finds among an op's inputs.
void clear_params(int target);
int set_params(int target, const uint64_t* ptrs, const int32_t* ids, const int32_t* layers,
               size_t n);
// op_seq.cpp: what the training thread's ops take from their inputs, learned in some
// iterations and looked up in the others (leak hunting and the step timeline ask for op
// inputs only while they learn).
struct OpInputs {
  int32_t var = -1;     // the first VarStore variable among them, -1 none
  int32_t layer1 = 0;   // its layer's name id + 1, 0 none
  int64_t flops = -1;   // a counted op's FLOPs, -1 not counted there
};
// At session start: learn and look up (`on`) or ask for inputs always; `sizes`: an op is
// looked up only after the same sizes allocated (the timeline's FLOPs depend on shapes).
void op_seq_start(bool on, bool sizes);
// At an iteration's start, on the training thread: whether it learns (needs inputs).
// `by_blocks`: nothing but leak hunting needs ops this iteration (no step timeline, no
// memory history), so a looking-up iteration may take origins by block.
bool op_seq_next_iteration(bool by_blocks);
// A learning iteration's next op that took something from its inputs.
void op_seq_learn(int32_t name, const OpInputs& took);
// On the training thread, while op_seq_looking_up(): what the next op learned took, if
// it is that op (same name and, with `sizes`, the same sizes allocated before it);
// false: it parts from the learned ops.
bool op_seq_lookup(int32_t name, OpInputs* took);
// A timeline op ends (with `sizes`): learned, or checked, so that an op that allocated
// other sizes is caught before the next op starts (which then gets its inputs). False:
// it parted there (what was looked up inside it may be wrong).
bool op_seq_op_end(int32_t name);
// On the training thread: this iteration looks its ops up (asked for no inputs, nor
// parted yet).
bool op_seq_looking_up();
// The rest of this iteration asks for op inputs (registered anew, while the session
// is on); `parted`: because it parted from the learned ops (the next iteration learns).
void op_seq_ask_inputs(bool parted);
// Leak hunting alone learns each block's origin at its place in the iteration's
// allocations and, between learning iterations, registers no op callback (op_seq.cpp).
// Whether this iteration's origins are the learned ones: read by the op callback.
bool op_seq_origins_learned();
// The origin of the block of `size` bytes on `dev` born now on this thread: learned
// (looking up) or from the op running (learning, and kept at its place).
void op_seq_block_origin(int dev, int64_t size, int32_t* op, int32_t* layer);
// Origins from records from now on in this iteration (the memory history started).
void op_seq_stop_blocks();
// What this iteration's step log holds of its ops (MpRecords): every op's events, none
// (the step timeline between its learning iterations: the Rust side takes them from the
// last learning iteration's log, profiler/template.rs), or those after it parted.
int op_seq_records();
// Set by begin_iteration: MP_RECORDS_ALL where it registered every op's record, else NONE.
void op_seq_set_records(int records);
// Whether this iteration learns.
bool op_seq_learning();
// Every op's record from now on in this iteration, which has had none yet (the step
// detail, set right after the iteration began).
void op_seq_record_all();
// The next iteration learns (the Rust side found this one's log unlike the learned one).
void op_seq_relearn();
// The learned sequence's memory in use (the most entries ever written).
uint64_t op_seq_bytes();
// Ops (and, leak hunting alone, blocks) of this session that took what they needed
// from the learned ones.
uint64_t op_seq_looked_up();
// The dry run's op stack on this thread (the meta trace's current op).
extern thread_local OpStack tls_dry_ops;

// ---------------------------------------------------------------------------------
// Allocators.

// cpu_allocator.cpp: the tracking CPU allocator (installed at library load).
extern std::atomic<bool> g_cpu_installed;
void install_cpu_allocator();
// Fills the tag of a CPU block if it is ours (and its birth_log, unless null); false
// otherwise. With watch (an MpWatch kind), also marks the block watched (its free
// counts in g_watched_frees).
bool cpu_block_tag(const c10::DataPtr& dp, int64_t* size, uint32_t* gen, uint32_t* phase,
                   uint32_t watch = MP_WATCH_NONE, uint32_t* birth = nullptr);
// Re-enters the CPU allocation hook on purpose (memprof_selftest_reenter).
void reenter_cpu_hook();
// The CUDA-like test mode (memprof_forget_cpu_blocks): every CPU block born so far is
// unknown, and the CPU counters start from zero.
void forget_cpu_blocks();
// Tags a CPU block that the test mode made unknown as born in (gen, phase); its size in
// *size. False: the block is known already, or not the tracking allocator's.
bool cpu_adopt(const c10::DataPtr& dp, uint32_t gen, uint32_t phase, int64_t* size);

// cuda.cpp: the CUDA reporter, libtorch_cuda, allocator statistics and control.
extern std::atomic<int64_t> g_cuda_ooms_seen;
bool cuda_loaded();
const char* cuda_load_message();
void load_cuda();
void push_cuda_reporter();
void pop_cuda_reporter();
int cuda_stats(int32_t index, MpCudaStats* out);
int cuda_memory_info(int32_t index, int64_t* free_bytes, int64_t* total_bytes);
int cuda_history(bool on, int64_t max_entries);
int cuda_snapshot(const char* path);
int cuda_control(int32_t index, int32_t what);
int cuda_workspaces(MpWorkspace* out, int32_t cap);
// Rounds a CUDA request the way the caching allocator does for its blocks.
inline int64_t cuda_round(int64_t n) {
  constexpr int64_t kMin = 512;
  return n < kMin ? kMin : kMin * ((n + kMin - 1) / kMin);
}

// ---------------------------------------------------------------------------------
// Out-of-memory hook (oom.cpp): calls the Rust report writer, one call at a time.
// Only on a failed allocation, never on the hot path.

void fire_oom(int slot, int64_t requested, int64_t allocated, int64_t reserved);
// Sets (or clears) the report writer; returns once no call of the previous one runs.
void set_oom_callback(MpOomCallback cb, void* ctx);

// ---------------------------------------------------------------------------------
// The process (process.cpp).

void process_memory(int64_t* resident, int64_t* peak_resident);
int write_stdout(const char* buf, size_t len);

// ---------------------------------------------------------------------------------
// Autocast and random-generator state (amp.cpp).

// False (with the error set) unless MP_DEVICE_CPU or MP_DEVICE_CUDA.
bool valid_device_type(int32_t device_type);
void autocast_enter(int32_t device_type, int32_t enabled, int32_t dtype, MpAutocast* prev);
void autocast_exit(int32_t device_type, const MpAutocast* prev);
// The default generator's state as a new tensor handle in *out.
void rng_get(int32_t device_type, int32_t index, void** out);
void rng_set(int32_t device_type, int32_t index, const at::Tensor& state);

}  // namespace memprof
