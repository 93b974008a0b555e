// tch-memprof native layer: sees every allocation and the autograd phases.
//
// Everything here is reached from Rust through `src/ffi.rs` only. Rules:
// - No C++ exception crosses `extern "C"`: every entry point catches everything and
//   returns a status, with the message kept in a thread-local last-error slot.
// - The allocation hooks run millions of times: they use atomics only, never allocate
//   through the allocator they watch, never take a lock that allocator holds, and do
//   no I/O. The CUDA reporter runs under the CUDA caching allocator's lock: it never
//   calls back into that allocator.
//
// Accounting model (see DESIGN.md "What the numbers mean"):
// - Every block carries a birth tag: the *generation* (a counter bumped at every phase
//   change and at every `record_stats`) and the phase it was born in.
// - Per device, live bytes are kept per generation in a ring of kRing slots; a slot
//   whose generation falls out of the ring is folded into a per-phase "old" counter.
//   Slot updates are single 64-bit CASes (generation, phase and bytes packed), so a
//   free can never be charged to the wrong generation, even racing with a fold.
// - Feature maps: bytes of the forward generation still live when the first backward
//   node starts. Optimizer state: live bytes born in optimizer generations.
// - During backward, block births and deaths go to a lock-free event log that the
//   Rust side replays to compute intermediate gradients (it knows which blocks ended up
//   as weight gradients only after backward).

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "flops.h"

namespace {

// ---------------------------------------------------------------------------------
// Shared constants (mirrored in src/ffi.rs).

constexpr int kMaxCuda = 16;
constexpr int kMaxDevices = 1 + kMaxCuda;  // slot 0 = CPU, 1 + i = cuda:i
constexpr int kRing = 8;
constexpr uint32_t kPhaseForward = 0;
constexpr uint32_t kPhaseBackward = 1;
constexpr uint32_t kPhaseOptimizer = 2;
constexpr uint32_t kPhaseIdle = 3;  // no profiler active
constexpr int kPhases = 4;

constexpr uint64_t kGenBits = 20;
constexpr uint64_t kGenMask = (1ull << kGenBits) - 1;
constexpr uint64_t kBytesBits = 42;
constexpr uint64_t kBytesMask = (1ull << kBytesBits) - 1;

// ---------------------------------------------------------------------------------
// Last error, handed to Rust as a value.

thread_local std::string tl_last_error;

void set_error(const char* what) {
  try {
    tl_last_error = what ? what : "unknown error";
  } catch (...) {
  }
}

// Runs `body` (returning 0 or -1) with every exception turned into -1 and a message:
// nothing crosses the C ABI.
template <class F>
int guarded(const char* what, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error((std::string("unknown C++ exception in ") + what).c_str());
  }
  return -1;
}

// ---------------------------------------------------------------------------------
// Generation slots.

inline uint64_t pack(uint32_t gen, uint32_t phase, int64_t bytes) {
  return ((uint64_t(gen) & kGenMask) << (kBytesBits + 2)) |
      ((uint64_t(phase) & 3u) << kBytesBits) | (uint64_t(bytes) & kBytesMask);
}
inline uint32_t slot_gen(uint64_t v) {
  return uint32_t(v >> (kBytesBits + 2));
}
inline uint32_t slot_phase(uint64_t v) {
  return uint32_t((v >> kBytesBits) & 3u);
}
inline int64_t slot_bytes(uint64_t v) {
  // 42-bit two's complement.
  int64_t b = int64_t(v & kBytesMask);
  if (b & (1ll << (kBytesBits - 1))) {
    b -= (1ll << kBytesBits);
  }
  return b;
}

struct DeviceState {
  std::atomic<int64_t> live{0};       // live bytes of blocks this layer saw born
  std::atomic<int64_t> peak_iter{0};  // peak of `live` since the iteration began
  std::atomic<int64_t> peak_run{0};   // peak of `live` since the profiler started
  std::atomic<int64_t> allocs{0};
  std::atomic<int64_t> frees{0};
  std::atomic<uint64_t> slots[kRing];
  std::atomic<int64_t> old_by_phase[kPhases];
  // Feature maps: the largest forward-generation live bytes seen at a backward start
  // in this iteration; -1 when no backward started.
  std::atomic<int64_t> feature_maps{-1};
  // CUDA only: the caching allocator's own counters, as passed with each report.
  std::atomic<int64_t> reported_allocated{-1};
  std::atomic<int64_t> reported_reserved{-1};
  std::atomic<int64_t> reported_peak_allocated_iter{-1};
  std::atomic<int64_t> reported_peak_reserved_iter{-1};
  std::atomic<int64_t> reported_peak_allocated_run{-1};
  std::atomic<int64_t> reported_peak_reserved_run{-1};
};

DeviceState g_dev[kMaxDevices];

// Current generation and phase, packed (gen << 8 | phase) so both are read together.
std::atomic<uint64_t> g_genphase{(uint64_t(kRing) << 8) | kPhaseIdle};
// Backward nodes running now, on any thread.
std::atomic<int64_t> g_active_backward{0};
std::atomic<int64_t> g_backward_passes{0};
// Whether the CPU wrapper is installed.
std::atomic<bool> g_cpu_installed{false};
// Events whose birth tag could not be read (should stay 0).
std::atomic<int64_t> g_untagged_frees{0};

thread_local bool tl_training_thread = false;

inline uint32_t cur_gen(uint64_t gp) {
  return uint32_t(gp >> 8);
}
inline uint32_t cur_phase(uint64_t gp) {
  return uint32_t(gp & 0xff);
}

void init_slots() {
  for (auto& d : g_dev) {
    for (int i = 0; i < kRing; ++i) {
      // Generations start at kRing: every slot holds an older generation.
      d.slots[i].store(pack(uint32_t(i), kPhaseIdle, 0), std::memory_order_relaxed);
    }
    for (auto& o : d.old_by_phase) {
      o.store(0, std::memory_order_relaxed);
    }
  }
}

// Is generation a (20 bits) older than generation b (20 bits)?
inline bool gen_older(uint32_t a, uint32_t b) {
  uint32_t diff = (b - a) & uint32_t(kGenMask);
  return diff != 0 && diff < (1u << (kGenBits - 1));
}

inline void atomic_max(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void slot_add(DeviceState& d, uint32_t gen, uint32_t phase, int64_t delta) {
  auto& s = d.slots[gen % kRing];
  const uint32_t g20 = gen & uint32_t(kGenMask);
  uint64_t cur = s.load(std::memory_order_relaxed);
  for (;;) {
    const uint32_t sg = slot_gen(cur);
    if (sg == g20) {
      if (s.compare_exchange_weak(
              cur, pack(gen, phase, slot_bytes(cur) + delta), std::memory_order_relaxed)) {
        return;
      }
      continue;
    }
    if (delta < 0 || !gen_older(sg, g20)) {
      // The block's generation has left the ring (or the slot already moved past it).
      d.old_by_phase[phase].fetch_add(delta, std::memory_order_relaxed);
      return;
    }
    // The slot holds an older generation: fold it and take the slot.
    if (s.compare_exchange_weak(cur, pack(gen, phase, delta), std::memory_order_relaxed)) {
      d.old_by_phase[slot_phase(cur)].fetch_add(slot_bytes(cur), std::memory_order_relaxed);
      return;
    }
  }
}

// Live bytes still held by blocks born in `gen` (0 if it left the ring).
int64_t gen_live(const DeviceState& d, uint32_t gen) {
  uint64_t v = d.slots[gen % kRing].load(std::memory_order_relaxed);
  return slot_gen(v) == (gen & uint32_t(kGenMask)) ? slot_bytes(v) : 0;
}

int64_t phase_live(const DeviceState& d, uint32_t phase) {
  int64_t total = d.old_by_phase[phase].load(std::memory_order_relaxed);
  for (int i = 0; i < kRing; ++i) {
    uint64_t v = d.slots[i].load(std::memory_order_relaxed);
    if (slot_phase(v) == phase) {
      total += slot_bytes(v);
    }
  }
  return total;
}

// ---------------------------------------------------------------------------------
// Backward event log: fixed capacity, reserved with mmap (pages are touched only as
// they fill), appended with one atomic increment.

struct LogEvent {
  uint64_t ptr;
  int64_t delta;  // +size at birth, -size at death
  uint32_t gen;
  uint32_t device;  // device slot
};
constexpr size_t kLogCapacity = size_t(1) << 20;
LogEvent* g_log = nullptr;
std::atomic<uint64_t> g_log_len{0};

void log_event(uint64_t ptr, int64_t delta, uint32_t gen, uint32_t dev) {
  if (!g_log) {
    return;
  }
  uint64_t i = g_log_len.fetch_add(1, std::memory_order_relaxed);
  if (i < kLogCapacity) {
    g_log[i] = LogEvent{ptr, delta, gen, dev};
  }
}

// ---------------------------------------------------------------------------------
// Step timeline (off unless the profiler asks for it). While on, every block birth and
// death on every device, every timeline-level op begin and end, every phase change,
// every counted FLOP and every op that could not be counted goes to a second event
// log, reset at each iteration; the Rust side replays it (src/timeline.rs).
//
// A "timeline op" is the outermost record on its thread, or an autograd node's
// `evaluate_function` record (so each backward node is one op). FLOPs are counted at
// the outermost op of a known kind (conv2d -> convolution is counted once, at
// convolution); an aten:: op with no nested records that is neither counted nor known
// to do no arithmetic is logged as "uncounted".

enum : uint8_t {
  kEvAlloc = 1,
  kEvFree = 2,
  kEvOpBegin = 3,
  kEvOpEnd = 4,
  kEvLink = 5,
  kEvFlops = 6,
  kEvUncounted = 7,
  kEvPhase = 8,
};

struct TlEvent {
  uint8_t type;
  uint8_t phase;   // alloc/free: birth phase; op events: phase; phase: new phase
  uint8_t device;  // alloc/free: device slot
  uint8_t pad;
  uint32_t gen;    // alloc/free: birth generation; op begin: scope name id + 1; phase: new gen
  int32_t op;      // timeline op index (in this step), -1 none
  int32_t aux;     // op begin/flops/uncounted: name id; link: forward op index
  uint64_t ptr;    // alloc/free: block; link: sequence number
  int64_t value;   // alloc/free: +/- bytes; op begin: variable index; op end: live
                   // bytes of the timeline device; flops: FLOPs
};
static_assert(sizeof(TlEvent) == 32, "TlEvent layout is mirrored in src/ffi.rs");

constexpr size_t kTlCapacity = size_t(1) << 22;
TlEvent* g_tl = nullptr;
std::atomic<uint64_t> g_tl_len{0};
std::atomic<bool> g_tl_on{false};
std::atomic<int32_t> g_op_counter{0};
std::atomic<int32_t> g_last_op{-1};
std::atomic<uint32_t> g_step_id{1};
std::atomic<int32_t> g_tl_device{0};
std::atomic<uint32_t> g_tl_start_gen{0};
std::atomic<int64_t> g_tl_start_live{0};

inline void tl_append(const TlEvent& e) {
  if (!g_tl) {
    return;
  }
  uint64_t i = g_tl_len.fetch_add(1, std::memory_order_relaxed);
  if (i < kTlCapacity) {
    g_tl[i] = e;
  }
}

constexpr int kMaxDepth = 64;
constexpr int kMaxTlStack = 8;
constexpr int kMaxScopes = 32;

// Per-thread op state; zero-initialised means "nothing open".
struct OpTls {
  int depth;
  int counted_depth1;  // 1 + depth of the counted op we are inside, 0 if none
  uint64_t had_child;  // bit d: the open record at depth d has a nested record
  int n_tl;
  int tl_depth[kMaxTlStack];
  int32_t tl_op[kMaxTlStack];
  int32_t ids[kMaxDepth];  // name id of the open record at each depth
  uint32_t step;
  int n_scope;
  int32_t scopes[kMaxScopes];
  // Origin of allocations (leak hunting): name id and layer (id + 1, 0 none) of each
  // open timeline-level op, and the layer of the last forward op on this thread.
  int32_t tl_name[kMaxTlStack];
  int32_t tl_layer1[kMaxTlStack];
  int32_t last_layer1;
};
thread_local OpTls tl_ops;

// Where an allocation on this thread comes from: the timeline-level op running (-1 if
// none) and its layer (-1 if unknown).
inline void current_origin(int32_t* op, int32_t* layer) {
  const OpTls& t = tl_ops;
  if (t.n_tl > 0) {
    *op = t.tl_name[t.n_tl - 1];
    *layer = t.tl_layer1[t.n_tl - 1] - 1;
  } else {
    *op = -1;
    *layer = t.last_layer1 - 1;
  }
}

inline int32_t current_op() {
  const OpTls& t = tl_ops;
  if (t.n_tl > 0 && t.step == g_step_id.load(std::memory_order_relaxed)) {
    return t.tl_op[t.n_tl - 1];
  }
  return g_last_op.load(std::memory_order_relaxed);
}

inline void tl_block_event(
    uint8_t type, int dev, uint64_t ptr, int64_t delta, uint32_t gen, uint32_t phase) {
  if (g_tl_on.load(std::memory_order_relaxed)) {
    tl_append(TlEvent{
        type, uint8_t(phase), uint8_t(dev), 0, gen, current_op(), 0, ptr, delta});
  }
}

// ---------------------------------------------------------------------------------
// Phase changes.

// Moves from `from` to `to` (bumping the generation) if the phase is still `from`.
bool transition(uint32_t from, uint32_t to) {
  uint64_t gp = g_genphase.load(std::memory_order_acquire);
  for (;;) {
    if (cur_phase(gp) != from) {
      return false;
    }
    const uint32_t gen = cur_gen(gp);
    if (to == kPhaseBackward) {
      // Feature maps: what the forward generation still holds now.
      for (auto& d : g_dev) {
        atomic_max(d.feature_maps, gen_live(d, gen));
      }
    }
    uint64_t next = (uint64_t(gen + 1) << 8) | to;
    if (g_genphase.compare_exchange_weak(gp, next, std::memory_order_acq_rel)) {
      if (to == kPhaseBackward) {
        g_backward_passes.fetch_add(1, std::memory_order_relaxed);
      }
      if (g_tl_on.load(std::memory_order_relaxed)) {
        tl_append(TlEvent{kEvPhase, uint8_t(to), 0, 0, gen + 1, -1, 0, 0, 0});
      }
      return true;
    }
  }
}

// Called on every allocation by the training thread: the allocation-driven phase
// changes (backward -> optimizer when no backward node runs; optimizer -> forward when
// a grad-mode op allocates, i.e. the next micro-batch's forward pass).
inline uint64_t phase_for_alloc() {
  uint64_t gp = g_genphase.load(std::memory_order_acquire);
  if (tl_training_thread) {
    const uint32_t ph = cur_phase(gp);
    if (ph == kPhaseBackward && g_active_backward.load(std::memory_order_acquire) == 0) {
      transition(kPhaseBackward, kPhaseOptimizer);
      gp = g_genphase.load(std::memory_order_acquire);
    } else if (ph == kPhaseOptimizer && c10::GradMode::is_enabled()) {
      transition(kPhaseOptimizer, kPhaseForward);
      gp = g_genphase.load(std::memory_order_acquire);
    }
  }
  return gp;
}

inline void on_alloc(int dev, uint64_t ptr, int64_t size, uint32_t gen, uint32_t phase) {
  DeviceState& d = g_dev[dev];
  int64_t live = d.live.fetch_add(size, std::memory_order_relaxed) + size;
  d.allocs.fetch_add(1, std::memory_order_relaxed);
  atomic_max(d.peak_iter, live);
  atomic_max(d.peak_run, live);
  slot_add(d, gen, phase, size);
  if (phase == kPhaseBackward) {
    log_event(ptr, size, gen, uint32_t(dev));
  }
  tl_block_event(kEvAlloc, dev, ptr, size, gen, phase);
}

inline void on_free(int dev, uint64_t ptr, int64_t size, uint32_t gen, uint32_t phase) {
  DeviceState& d = g_dev[dev];
  d.live.fetch_sub(size, std::memory_order_relaxed);
  d.frees.fetch_add(1, std::memory_order_relaxed);
  slot_add(d, gen, phase, -size);
  if (phase == kPhaseBackward) {
    uint64_t gp = g_genphase.load(std::memory_order_relaxed);
    if (cur_gen(gp) == gen) {
      log_event(ptr, -size, gen, uint32_t(dev));
    }
  }
  tl_block_event(kEvFree, dev, ptr, -size, gen, phase);
}

// ---------------------------------------------------------------------------------
// Live-block registry (leak hunting; on only when the profiler asks for it). Every
// block born while it is on gets an entry: its size, birth phase, iteration, device and
// origin (op and layer). Entries are recycled through a lock-free free list (a tagged
// Treiber stack), so the registry holds as many entries as blocks were ever live at
// once, not one per allocation: its memory is bounded by the peak number of live
// blocks, never by the number of iterations. Reserved with mmap: untouched entries
// cost nothing. Every field is an atomic so that the epoch-end scan may read entries
// that another thread is filling (it re-reads the pointer to drop torn entries).

constexpr uint32_t kNoReg = 0xffffffffu;
constexpr uint32_t kRegCapacity = 1u << 21;

struct RegEntry {
  std::atomic<uint64_t> ptr;     // block data pointer; 0 while free or being filled
  std::atomic<int64_t> size;
  std::atomic<uint64_t> origin;  // op id (low 32 bits) | layer id (high 32 bits)
  std::atomic<uint64_t> misc;    // iteration | phase << 32 | device << 40 | session << 48
  std::atomic<uint32_t> next;    // free-list link: index + 1, 0 = end
};

RegEntry* g_reg = nullptr;
std::atomic<uint64_t> g_reg_free{0};  // ABA tag << 32 | (index + 1); 0 = empty
std::atomic<uint32_t> g_reg_hw{0};    // entries ever handed out
std::atomic<int64_t> g_reg_live{0};
std::atomic<int64_t> g_reg_dropped{0};  // births not registered: registry full
std::atomic<bool> g_origin_on{false};
bool g_leaks_requested = false;  // the session's setting, restored when history stops
std::atomic<uint32_t> g_iter{0};      // iteration (step) that births belong to
std::atomic<uint32_t> g_session_id{0};  // bumped at each memprof_start

uint32_t reg_pop() {
  uint64_t h = g_reg_free.load(std::memory_order_acquire);
  while (uint32_t(h) != 0) {
    const uint32_t idx = uint32_t(h) - 1;
    const uint64_t next = g_reg[idx].next.load(std::memory_order_relaxed);
    const uint64_t nh = (((h >> 32) + 1) << 32) | next;
    if (g_reg_free.compare_exchange_weak(
            h, nh, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return idx;
    }
  }
  uint32_t hw = g_reg_hw.load(std::memory_order_relaxed);
  while (hw < kRegCapacity) {
    if (g_reg_hw.compare_exchange_weak(hw, hw + 1, std::memory_order_relaxed)) {
      return hw;
    }
  }
  return kNoReg;
}

void reg_push(uint32_t idx) {
  uint64_t h = g_reg_free.load(std::memory_order_relaxed);
  for (;;) {
    g_reg[idx].next.store(uint32_t(h), std::memory_order_relaxed);
    const uint64_t nh = (((h >> 32) + 1) << 32) | uint64_t(idx + 1);
    if (g_reg_free.compare_exchange_weak(
            h, nh, std::memory_order_release, std::memory_order_relaxed)) {
      return;
    }
  }
}

// Registers a block born now; returns its entry or kNoReg.
inline uint32_t reg_add(uint64_t ptr, int64_t size, uint32_t phase, int dev) {
  if (!g_reg || !g_origin_on.load(std::memory_order_relaxed) || ptr == 0) {
    return kNoReg;
  }
  const uint32_t idx = reg_pop();
  if (idx == kNoReg) {
    g_reg_dropped.fetch_add(1, std::memory_order_relaxed);
    return kNoReg;
  }
  int32_t op = -1;
  int32_t layer = -1;
  current_origin(&op, &layer);
  RegEntry& e = g_reg[idx];
  e.size.store(size, std::memory_order_relaxed);
  e.origin.store(
      uint64_t(uint32_t(op)) | (uint64_t(uint32_t(layer)) << 32), std::memory_order_relaxed);
  e.misc.store(
      uint64_t(g_iter.load(std::memory_order_relaxed)) | (uint64_t(phase & 0xff) << 32) |
          (uint64_t(dev & 0xff) << 40) |
          (uint64_t(g_session_id.load(std::memory_order_relaxed) & 0xffff) << 48),
      std::memory_order_relaxed);
  e.ptr.store(ptr, std::memory_order_release);
  g_reg_live.fetch_add(1, std::memory_order_relaxed);
  return idx;
}

inline void reg_remove(uint32_t idx) {
  if (idx >= kRegCapacity || !g_reg) {
    return;
  }
  g_reg[idx].ptr.store(0, std::memory_order_release);
  g_reg_live.fetch_sub(1, std::memory_order_relaxed);
  reg_push(idx);
}

// ---------------------------------------------------------------------------------
// Memory history (off unless asked for): every block birth and death on every device
// with its origin and a timestamp, in a ring of the last `g_hist_cap` events (reserved
// with mmap at its largest; only the entries written are touched). Written out as the
// device trace of a memory_viz snapshot (src/snapshot.rs).

struct HistEvent {
  uint64_t ptr;
  int64_t size;       // +bytes at birth, -bytes at death
  int32_t op;         // name id of the op running on the thread, -1 none
  int32_t layer;      // its layer's name id, -1 unknown
  uint64_t time_dev;  // microseconds (CLOCK_MONOTONIC) << 8 | device slot
};
static_assert(sizeof(HistEvent) == 32, "mirrored in src/ffi.rs");

constexpr uint64_t kHistMax = uint64_t(1) << 24;
HistEvent* g_hist = nullptr;
std::atomic<bool> g_hist_on{false};
std::atomic<uint64_t> g_hist_len{0};
std::atomic<uint64_t> g_hist_cap{0};

inline void hist_append(int dev, uint64_t ptr, int64_t delta) {
  if (!g_hist_on.load(std::memory_order_relaxed)) {
    return;
  }
  const uint64_t cap = g_hist_cap.load(std::memory_order_relaxed);
  if (!g_hist || cap == 0) {
    return;
  }
  int32_t op = -1;
  int32_t layer = -1;
  current_origin(&op, &layer);
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t us = uint64_t(ts.tv_sec) * 1000000u + uint64_t(ts.tv_nsec) / 1000u;
  const uint64_t i = g_hist_len.fetch_add(1, std::memory_order_relaxed);
  g_hist[i % cap] = HistEvent{ptr, delta, op, layer, (us << 8) | uint64_t(dev & 0xff)};
}

// ---------------------------------------------------------------------------------
// Out-of-memory hook: the Rust side's report writer, called when an allocation fails,
// before the error is raised to the user's code. For CUDA it runs inside the caching
// allocator's OOM path, holding its lock: the callback must not touch CUDA memory (it
// reads the registry and writes files). One at a time; a failure inside it is dropped.

using OomCallback = void (*)(int32_t slot, int64_t requested, int64_t allocated, int64_t reserved);
std::atomic<OomCallback> g_oom_callback{nullptr};
std::atomic<int> g_oom_busy{0};
std::atomic<int64_t> g_ooms_reported{0};

void fire_oom(int slot, int64_t requested, int64_t allocated, int64_t reserved) {
  g_ooms_reported.fetch_add(1, std::memory_order_relaxed);
  OomCallback cb = g_oom_callback.load(std::memory_order_acquire);
  if (!cb || g_oom_busy.exchange(1) != 0) {
    return;
  }
  try {
    cb(slot, requested, allocated, reserved);
  } catch (...) {
  }
  g_oom_busy.store(0);
}

// ---------------------------------------------------------------------------------
// CPU: a wrapping allocator, installed at library load, process-wide.
//
// Each block has a header in front of the data (data == context, as c10 requires):
// [base ... header (kHeader bytes, holds the tag) | data ...]. The header size is the
// alignment c10 would use, so the data keeps c10's alignment.

constexpr uint64_t kMagic = 0x6d656d70726f6631ull;  // "memprof1"

struct BlockHeader {
  uint64_t magic;
  uint64_t size;        // bytes requested by the tensor
  uint64_t head_bytes;  // distance from base to data
  uint32_t gen;
  uint32_t phase;
  uint32_t reg;         // live-block registry entry, kNoReg if not registered
  uint32_t pad;
};
static_assert(sizeof(BlockHeader) <= 64, "header fits the minimum alignment");

inline BlockHeader* header_of(void* data) {
  return reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - sizeof(BlockHeader));
}

void tracked_delete(void* data) {
  if (!data) {
    return;
  }
  BlockHeader* h = header_of(data);
  void* base = static_cast<char*>(data) - h->head_bytes;
  if (h->magic == kMagic) {
    on_free(0, uint64_t(data), int64_t(h->size), h->gen, h->phase);
    reg_remove(h->reg);
    hist_append(0, uint64_t(data), -int64_t(h->size));
  } else {
    g_untagged_frees.fetch_add(1, std::memory_order_relaxed);
  }
  h->magic = 0;
  c10::free_cpu(base);
}

struct TrackingCpuAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) {
      return {nullptr, nullptr, &tracked_delete, c10::Device(c10::DeviceType::CPU)};
    }
    size_t head = c10::c10_compute_alignment(n);
    if (head < 64) {
      head = 64;
    }
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(n + head);  // throws c10::Error on failure, like c10's
    } catch (...) {
      fire_oom(0, int64_t(n), g_dev[0].live.load(std::memory_order_relaxed), 0);
      throw;
    }
    void* data = static_cast<char*>(base) + head;
    uint64_t gp = phase_for_alloc();
    BlockHeader* h = header_of(data);
    h->magic = kMagic;
    h->size = n;
    h->head_bytes = head;
    h->gen = cur_gen(gp);
    h->phase = cur_phase(gp);
    h->reg = reg_add(uint64_t(data), int64_t(n), h->phase, 0);
    hist_append(0, uint64_t(data), int64_t(n));
    on_alloc(0, uint64_t(data), int64_t(n), h->gen, h->phase);
    return {data, data, &tracked_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &tracked_delete;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

TrackingCpuAllocator g_cpu_allocator;

// ---------------------------------------------------------------------------------
// CUDA: the caching allocator reports to the thread-local MemoryReportingInfoBase that
// the profiler pushes on the training thread (the autograd engine carries it to its
// device threads). Sizes are the allocator's rounded block sizes.

struct CudaTag {
  int64_t size;
  uint32_t gen;
  uint32_t phase;
  uint32_t reg;
};
std::mutex g_cuda_mutex;
std::unordered_map<uint64_t, CudaTag>* g_cuda_blocks = nullptr;  // under g_cuda_mutex
std::atomic<int64_t> g_cuda_ooms_seen{0};

struct Reporter final : public c10::MemoryReportingInfoBase {
  void reportMemoryUsage(
      void* ptr,
      int64_t alloc_size,
      size_t total_allocated,
      size_t total_reserved,
      c10::Device device) override {
    try {
      if (device.type() != c10::DeviceType::CUDA || device.index() < 0 ||
          device.index() >= kMaxCuda) {
        return;  // the CPU is counted by the wrapping allocator
      }
      const int dev = 1 + device.index();
      DeviceState& d = g_dev[dev];
      const int64_t alloc = int64_t(total_allocated);
      const int64_t reserved = int64_t(total_reserved);
      d.reported_allocated.store(alloc, std::memory_order_relaxed);
      d.reported_reserved.store(reserved, std::memory_order_relaxed);
      atomic_max(d.reported_peak_allocated_iter, alloc);
      atomic_max(d.reported_peak_reserved_iter, reserved);
      atomic_max(d.reported_peak_allocated_run, alloc);
      atomic_max(d.reported_peak_reserved_run, reserved);
      const uint64_t key = uint64_t(ptr);
      if (alloc_size > 0) {
        uint64_t gp = phase_for_alloc();
        CudaTag tag{alloc_size, cur_gen(gp), cur_phase(gp), kNoReg};
        tag.reg = reg_add(key, alloc_size, tag.phase, dev);
        uint32_t stale = kNoReg;
        {
          std::lock_guard<std::mutex> lock(g_cuda_mutex);
          auto [it, inserted] = g_cuda_blocks->try_emplace(key, tag);
          if (!inserted) {
            stale = it->second.reg;  // a free we never saw
            it->second = tag;
          }
        }
        reg_remove(stale);
        hist_append(dev, key, alloc_size);
        on_alloc(dev, key, alloc_size, tag.gen, tag.phase);
      } else if (alloc_size < 0) {
        CudaTag tag{0, 0, 0, kNoReg};
        bool found = false;
        {
          std::lock_guard<std::mutex> lock(g_cuda_mutex);
          auto it = g_cuda_blocks->find(key);
          if (it != g_cuda_blocks->end()) {
            tag = it->second;
            g_cuda_blocks->erase(it);
            found = true;
          }
        }
        if (found) {
          on_free(dev, key, tag.size, tag.gen, tag.phase);
          reg_remove(tag.reg);
          hist_append(dev, key, -tag.size);
        }
      }
    } catch (...) {
      // Never let anything escape into the allocator.
    }
  }

  void reportOutOfMemory(
      int64_t alloc_size,
      size_t total_allocated,
      size_t total_reserved,
      c10::Device device) override {
    g_cuda_ooms_seen.fetch_add(1, std::memory_order_relaxed);
    if (device.type() == c10::DeviceType::CUDA && device.index() >= 0 &&
        device.index() < kMaxCuda) {
      fire_oom(1 + device.index(), alloc_size, int64_t(total_allocated), int64_t(total_reserved));
    }
  }

  bool memoryProfilingEnabled() const override {
    return true;
  }
};

// ---------------------------------------------------------------------------------
// Op callbacks. A record counts as "backward running" when it is an autograd node
// (BACKWARD_FUNCTION scope) or the engine's wrapper around one
// ("autograd::engine::evaluate_function: ...", FUNCTION scope), which also covers the
// engine's own work between node and buffer (validate_outputs' sum_to of broadcast
// gradients, gradient accumulation in input buffers).

constexpr char kEvaluateFunction[] = "autograd::engine::evaluate_function";

inline bool is_backward_record(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    return true;
  }
  const char* name = fn.name();
  return name && name[0] == 'a' &&
      std::strncmp(name, kEvaluateFunction, sizeof(kEvaluateFunction) - 1) == 0;
}

// ---------------------------------------------------------------------------------
// Op names, interned once into a fixed table (no lock; a slot is claimed with a CAS on
// its hash). The stored name drops the evaluate_function prefix of backward nodes.

constexpr uint32_t kNameSlots = 1u << 13;
constexpr size_t kNameLen = 96;
struct NameSlot {
  std::atomic<uint64_t> hash;
  std::atomic<uint32_t> ready;
  memprof_flops::Kind kind;
  char name[kNameLen];
};
NameSlot g_names[kNameSlots];

inline uint64_t name_hash(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) {
    h = (h ^ uint8_t(*s)) * 1099511628211ull;
  }
  return h | 1;  // 0 marks an empty slot
}

// Interns `name`; returns its id, or -1 when the table is full.
int32_t intern(const char* name) {
  if (!name) {
    name = "?";
  }
  const uint64_t h = name_hash(name);
  uint32_t i = uint32_t(h) & (kNameSlots - 1);
  for (uint32_t probe = 0; probe < 256; ++probe, i = (i + 1) & (kNameSlots - 1)) {
    NameSlot& slot = g_names[i];
    uint64_t cur = slot.hash.load(std::memory_order_acquire);
    if (cur == 0) {
      if (slot.hash.compare_exchange_strong(cur, h, std::memory_order_acq_rel)) {
        const char* shown = name;
        constexpr size_t kPrefix = sizeof(kEvaluateFunction) - 1;
        if (std::strncmp(name, kEvaluateFunction, kPrefix) == 0) {
          shown = name + kPrefix;
          while (*shown == ':' || *shown == ' ') {
            ++shown;
          }
        }
        std::strncpy(slot.name, shown, kNameLen - 1);
        slot.name[kNameLen - 1] = 0;
        slot.kind = memprof_flops::classify(name);
        slot.ready.store(1, std::memory_order_release);
        return int32_t(i);
      }
    }
    if (cur == h) {
      while (slot.ready.load(std::memory_order_acquire) == 0) {
      }
      return int32_t(i);
    }
  }
  return -1;
}

inline memprof_flops::Kind kind_of(int32_t id) {
  return id >= 0 ? g_names[id].kind : memprof_flops::Kind{memprof_flops::kUnknown, 0};
}

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
std::mutex g_params_mutex;  // serialises replacement; readers never take it
std::unique_ptr<std::vector<std::unique_ptr<ParamTable>>> g_params_all;

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
// Forward op of each autograd sequence number: a backward node carries the sequence
// number of the forward op that created it. Packed: seq low 32 bits | step 8 | op 24.

constexpr size_t kSeqSlots = size_t(1) << 16;
std::atomic<uint64_t> g_seq[kSeqSlots];

inline void seq_store(int64_t seq, uint32_t step, int32_t op) {
  if (seq < 0 || op < 0 || op >= (1 << 24)) {
    return;
  }
  const uint64_t v = (uint64_t(uint32_t(seq)) << 32) | (uint64_t(step & 0xff) << 24) |
      uint64_t(op);
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
  const uint64_t v =
      g_seq_layer[uint64_t(seq) & (kSeqSlots - 1)].load(std::memory_order_relaxed);
  return uint32_t(v >> 32) == uint32_t(seq) ? int32_t(uint32_t(v)) : 0;
}

// Phase shown for an op: what it is, not when the next allocation flips the phase
// (the first forward op begins while the phase still says "optimizer").
inline uint32_t shown_phase(bool backward_record) {
  if (backward_record) {
    return kPhaseBackward;
  }
  const uint32_t ph = cur_phase(g_genphase.load(std::memory_order_acquire));
  if (ph == kPhaseBackward && g_active_backward.load(std::memory_order_acquire) == 0) {
    return kPhaseOptimizer;
  }
  if (ph == kPhaseOptimizer && c10::GradMode::is_enabled()) {
    return kPhaseForward;
  }
  return ph;
}

// Op bookkeeping on the calling thread. `tl`: the step log is on (log op events,
// count FLOPs); otherwise only the origin of allocations is kept (leak hunting).
void op_start(const at::RecordFunction& fn, bool backward_record, bool tl) {
  OpTls& t = tl_ops;
  const uint32_t step = g_step_id.load(std::memory_order_relaxed);
  if (t.step != step) {
    // A new iteration: whatever this thread had open belongs to the last one.
    t.step = step;
    t.n_tl = 0;
  }
  const int d = t.depth++;
  if (d >= kMaxDepth) {
    return;
  }
  const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  const bool evaluate = backward_record && !node;
  const bool opens = (evaluate || t.n_tl == 0) && t.n_tl < kMaxTlStack;
  // Without the step log, only timeline-level ops need their name.
  const int32_t id = (tl || opens) ? intern(fn.name()) : -1;
  t.ids[d] = id;
  if (tl) {
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
    if (tl) {
      op = g_op_counter.fetch_add(1, std::memory_order_relaxed);
      g_last_op.store(op, std::memory_order_relaxed);
    }
    int32_t layer1 = 0;
    const int32_t var = backward_record ? -1 : first_variable(fn.inputs(), &layer1);
    const uint32_t scope = t.n_scope > 0 ? uint32_t(t.scopes[t.n_scope - 1] + 1) : 0;
    if (scope != 0) {
      layer1 = int32_t(scope);
    } else if (!backward_record && layer1 == 0) {
      layer1 = t.last_layer1;  // the layer that ran last
    }
    if (!backward_record && layer1 != 0) {
      t.last_layer1 = layer1;
    }
    t.tl_depth[t.n_tl] = d;
    t.tl_op[t.n_tl] = op;
    t.tl_name[t.n_tl] = id;
    t.tl_layer1[t.n_tl] = layer1;  // a backward node sets it below
    ++t.n_tl;
    if (tl) {
      tl_append(TlEvent{kEvOpBegin, uint8_t(phase), 0, 0, scope, op, id, 0, var});
    }
  }
  const int32_t cur = t.n_tl > 0 ? t.tl_op[t.n_tl - 1] : -1;
  if (node) {
    const int64_t seq = fn.seqNr();
    if (tl) {
      tl_append(TlEvent{
          kEvLink, uint8_t(phase), 0, 0, 0, cur, seq_load(seq, step), uint64_t(seq), 0});
    }
    if (t.n_tl > 0) {
      const int32_t fwd_layer1 = seq_layer_load(seq);
      if (fwd_layer1 != 0) {
        t.tl_layer1[t.n_tl - 1] = fwd_layer1;
      }
    }
  } else if (!backward_record && phase == kPhaseForward) {
    if (tl) {
      seq_store(fn.seqNr(), step, cur);
    }
    if (t.n_tl > 0) {
      seq_layer_store(fn.seqNr(), t.tl_layer1[t.n_tl - 1]);
    }
  }
  if (tl && t.counted_depth1 == 0) {
    const memprof_flops::Kind k = kind_of(id);
    if (memprof_flops::counted(k)) {
      t.counted_depth1 = d + 1;
      const int64_t flops = memprof_flops::count(k, fn.inputs());
      tl_append(TlEvent{kEvFlops, uint8_t(phase), 0, 0, 0, cur, id, 0, flops});
    }
  }
}

void op_end(bool backward_record, bool tl) {
  OpTls& t = tl_ops;
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
  if (tl) {
    if (t.counted_depth1 == d + 1) {
      t.counted_depth1 = 0;
    } else if (
        t.counted_depth1 == 0 && !backward_record && !(t.had_child & (uint64_t(1) << d)) &&
        id >= 0 && kind_of(id).family == memprof_flops::kUnknown &&
        std::strncmp(g_names[id].name, "aten::", 6) == 0) {
      const int32_t cur = t.n_tl > 0 ? t.tl_op[t.n_tl - 1] : -1;
      tl_append(TlEvent{kEvUncounted, uint8_t(shown_phase(false)), 0, 0, 0, cur, id, 0, 0});
    }
  }
  if (t.n_tl > 0 && t.tl_depth[t.n_tl - 1] == d) {
    const int32_t op = t.tl_op[--t.n_tl];
    if (tl) {
      const int slot = g_tl_device.load(std::memory_order_relaxed);
      const int64_t live = g_dev[slot].live.load(std::memory_order_relaxed);
      tl_append(TlEvent{
          kEvOpEnd, uint8_t(shown_phase(backward_record)), 0, 0, 0, op, id, 0, live});
    }
  }
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  const bool backward_record = is_backward_record(fn);
  if (backward_record) {
    g_active_backward.fetch_add(1, std::memory_order_acq_rel);
    uint64_t gp = g_genphase.load(std::memory_order_acquire);
    const uint32_t ph = cur_phase(gp);
    if (ph == kPhaseForward || ph == kPhaseOptimizer) {
      transition(ph, kPhaseBackward);
    }
  }
  const bool tl = g_tl_on.load(std::memory_order_relaxed);
  if (tl || g_origin_on.load(std::memory_order_relaxed)) {
    try {
      op_start(fn, backward_record, tl);
    } catch (...) {
      // Never let the profiler fail the user's op.
    }
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  const bool backward_record = is_backward_record(fn);
  const bool tl = g_tl_on.load(std::memory_order_relaxed);
  if (tl || g_origin_on.load(std::memory_order_relaxed)) {
    try {
      op_end(backward_record, tl);
    } catch (...) {
    }
  }
  if (backward_record) {
    g_active_backward.fetch_sub(1, std::memory_order_acq_rel);
  }
}

struct ActiveSession {
  at::CallbackHandle callback = 0;
  bool reporter_pushed = false;
};
ActiveSession g_session;
std::mutex g_session_mutex;

// ---------------------------------------------------------------------------------
// Loading libtorch_cuda.so, which tch binaries do not list as needed.

std::string g_cuda_load_message = "not attempted";
bool g_cuda_loaded = false;

std::string libtorch_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&c10::alloc_cpu), &info) && info.dli_fname) {
    std::string p(info.dli_fname);
    auto slash = p.rfind('/');
    if (slash != std::string::npos) {
      return p.substr(0, slash);
    }
  }
  return "";
}

bool nvidia_driver_present() {
  return access("/proc/driver/nvidia/version", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0;
}

void load_cuda() {
  if (getenv("TCH_MEMPROF_NO_CUDA")) {
    g_cuda_load_message = "TCH_MEMPROF_NO_CUDA is set";
    return;
  }
  if (!nvidia_driver_present()) {
    g_cuda_load_message = "no NVIDIA driver on this machine (/proc/driver/nvidia absent)";
    return;
  }
  std::string dir = libtorch_dir();
  std::string path = dir.empty() ? "libtorch_cuda.so" : dir + "/libtorch_cuda.so";
  if (access(path.c_str(), F_OK) != 0) {
    g_cuda_load_message = path + " not found: this libtorch is CPU-only";
    return;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char* e = dlerror();
    g_cuda_load_message = std::string("dlopen ") + path + " failed: " + (e ? e : "?");
    return;
  }
  g_cuda_loaded = true;
  g_cuda_load_message = "loaded " + path;
}

// Reserves address space for `n` T (zero-filled pages, touched only as they are
// written; no swap reserved); null if the reservation fails.
template <class T>
T* reserve(size_t n) {
  void* mem = mmap(
      nullptr,
      n * sizeof(T),
      PROT_READ | PROT_WRITE,
      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
      -1,
      0);
  return mem == MAP_FAILED ? nullptr : static_cast<T*>(mem);
}

// Runs at library load, before main and so before the user's model is built.
struct Init {
  Init() {
    init_slots();
    try {
      g_cuda_blocks = new std::unordered_map<uint64_t, CudaTag>();
    } catch (...) {
    }
    g_log = reserve<LogEvent>(kLogCapacity);
    g_tl = reserve<TlEvent>(kTlCapacity);
    g_reg = reserve<RegEntry>(kRegCapacity);  // zero pages: every entry starts free
    g_hist = reserve<HistEvent>(kHistMax);
    try {
      g_params_all = std::make_unique<std::vector<std::unique_ptr<ParamTable>>>();
    } catch (...) {
    }
    if (!getenv("TCH_MEMPROF_DISABLE")) {
      try {
        c10::SetCPUAllocator(&g_cpu_allocator, /*priority=*/100);
        g_cpu_installed.store(c10::GetCPUAllocator() == &g_cpu_allocator);
      } catch (...) {
      }
    }
    try {
      load_cuda();
    } catch (...) {
    }
  }
};
Init g_init;

int device_slot(const c10::Device& dev) {
  if (dev.is_cpu()) {
    return 0;
  }
  if (dev.is_cuda() && dev.index() >= 0 && dev.index() < kMaxCuda) {
    return 1 + dev.index();
  }
  return -1;
}

// Rounds a CUDA request the way the caching allocator does for its blocks.
int64_t cuda_round(int64_t n) {
  const int64_t kMin = 512;
  if (n < kMin) {
    return kMin;
  }
  return kMin * ((n + kMin - 1) / kMin);
}

// Empties the step log for a new iteration whose first generation is `gen`.
void begin_timeline(uint32_t gen) {
  g_step_id.fetch_add(1);
  g_op_counter.store(0);
  g_last_op.store(-1);
  g_tl_start_gen.store(gen);
  g_tl_start_live.store(g_dev[g_tl_device.load()].live.load());
  g_tl_len.store(0);
}

}  // namespace

// ===================================================================================
// The C ABI. Every function returns 0 on success and -1 on failure (message in
// memprof_last_error), unless documented otherwise.

extern "C" {

struct MpDeviceStats {
  int64_t live;
  int64_t peak_iter;
  int64_t peak_run;
  int64_t allocs;
  int64_t frees;
  int64_t optimizer_born_live;
  int64_t feature_maps;  // -1: no backward in this iteration
  int64_t reported_allocated;
  int64_t reported_reserved;
  int64_t reported_peak_allocated_iter;
  int64_t reported_peak_reserved_iter;
  int64_t reported_peak_allocated_run;
  int64_t reported_peak_reserved_run;
};

struct MpState {
  uint32_t gen;
  uint32_t phase;
  int64_t active_backward;
  int64_t backward_passes;
  uint64_t log_len;
  uint64_t log_capacity;
  int64_t untagged_frees;
  int32_t cpu_installed;
  int32_t cuda_loaded;
  int64_t cuda_ooms_seen;
};

struct MpBlock {
  int32_t defined;
  int32_t device;  // device slot, -1 unknown device type
  int32_t tracked; // the block's birth was seen
  uint32_t phase;  // birth phase (tracked only)
  uint32_t gen;    // birth generation (tracked only)
  uint32_t pad;
  uint64_t base;   // storage base pointer (block identity)
  int64_t bytes;   // block bytes as accounted (CUDA: rounded)
};

struct MpCudaStats {
  int64_t allocated_current, allocated_peak;
  int64_t reserved_current, reserved_peak;
  int64_t active_current, active_peak;
  int64_t requested_current, requested_peak;
  int64_t alloc_retries;
  int64_t ooms;
  int64_t free_bytes, total_bytes;
};

size_t memprof_last_error(char* buf, size_t len) {
  size_t n = tl_last_error.size();
  if (buf && len > 0) {
    size_t c = n < len - 1 ? n : len - 1;
    std::memcpy(buf, tl_last_error.data(), c);
    buf[c] = 0;
  }
  return n;
}

int memprof_start(int32_t want_cuda, int32_t timeline_slot, int32_t leaks) {
  try {
    std::lock_guard<std::mutex> lock(g_session_mutex);
    if (g_session.callback != 0) {
      set_error("a profiling session is already active in this process");
      return -1;
    }
    if (!g_cpu_installed.load()) {
      set_error(
          getenv("TCH_MEMPROF_DISABLE")
              ? "TCH_MEMPROF_DISABLE is set: the tracking CPU allocator was not installed"
              : "the tracking CPU allocator could not be installed");
      return -1;
    }
    g_active_backward.store(0);
    g_backward_passes.store(0);
    g_log_len.store(0);
    for (auto& d : g_dev) {
      d.peak_iter.store(d.live.load());
      d.peak_run.store(d.live.load());
      d.feature_maps.store(-1);
      d.reported_peak_allocated_iter.store(d.reported_allocated.load());
      d.reported_peak_reserved_iter.store(d.reported_reserved.load());
      d.reported_peak_allocated_run.store(d.reported_allocated.load());
      d.reported_peak_reserved_run.store(d.reported_reserved.load());
    }
    if (timeline_slot >= kMaxDevices) {
      set_error("timeline device slot out of range");
      return -1;
    }
    if (timeline_slot >= 0 && !g_tl) {
      set_error("the timeline event log could not be reserved (mmap failed)");
      return -1;
    }
    if (leaks && !g_reg) {
      set_error("the live-block registry could not be reserved (mmap failed)");
      return -1;
    }
    tl_training_thread = true;
    tl_ops.last_layer1 = 0;
    g_session_id.fetch_add(1);
    g_iter.store(1);
    g_origin_on.store(leaks != 0);
    g_leaks_requested = leaks != 0;
    if (want_cuda) {
      c10::ThreadLocalDebugInfo::_push(
          c10::DebugInfoKind::PROFILER_STATE, std::make_shared<Reporter>());
      g_session.reporter_pushed = true;
    }
    g_session.callback = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end)
            .needsInputs(timeline_slot >= 0 || leaks != 0)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    // Start iteration 1 in the forward phase.
    uint64_t gp = g_genphase.load();
    g_genphase.store((uint64_t(cur_gen(gp) + 1) << 8) | kPhaseForward);
    if (timeline_slot >= 0) {
      g_tl_device.store(timeline_slot);
      begin_timeline(cur_gen(gp) + 1);
      g_tl_on.store(true);
    }
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception in memprof_start");
  }
  return -1;
}

int memprof_stop() {
  try {
    std::lock_guard<std::mutex> lock(g_session_mutex);
    if (g_session.callback != 0) {
      at::removeCallback(g_session.callback);
      g_session.callback = 0;
    }
    g_tl_on.store(false);
    g_origin_on.store(false);
    {
      std::lock_guard<std::mutex> plock(g_params_mutex);
      g_params.store(nullptr);
      if (g_params_all) {
        g_params_all->clear();
      }
    }
    uint64_t gp = g_genphase.load();
    g_genphase.store((uint64_t(cur_gen(gp) + 1) << 8) | kPhaseIdle);
    tl_training_thread = false;
    if (g_session.reporter_pushed) {
      g_session.reporter_pushed = false;
      auto top = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
      if (top && dynamic_cast<Reporter*>(top)) {
        c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception in memprof_stop");
  }
  return -1;
}

// Ends the current iteration and starts the next one in the forward phase: resets the
// per-iteration peaks, the feature maps and the backward log.
int memprof_begin_iteration() {
  try {
    uint64_t gp = g_genphase.load();
    if (cur_phase(gp) == kPhaseIdle) {
      set_error("no profiling session is active");
      return -1;
    }
    g_genphase.store((uint64_t(cur_gen(gp) + 1) << 8) | kPhaseForward);
    g_iter.fetch_add(1);
    // Called on the training thread: ops before the first layer of the new iteration
    // (the batch, user code) belong to no layer, as in the step timeline.
    tl_ops.last_layer1 = 0;
    g_log_len.store(0);
    g_backward_passes.store(0);
    if (g_tl_on.load()) {
      begin_timeline(cur_gen(gp) + 1);
    }
    for (auto& d : g_dev) {
      d.peak_iter.store(d.live.load());
      d.feature_maps.store(-1);
      d.reported_peak_allocated_iter.store(d.reported_allocated.load());
      d.reported_peak_reserved_iter.store(d.reported_reserved.load());
    }
    return 0;
  } catch (...) {
    set_error("unknown C++ exception in memprof_begin_iteration");
  }
  return -1;
}

int memprof_state(MpState* out) {
  if (!out) {
    return -1;
  }
  uint64_t gp = g_genphase.load();
  out->gen = cur_gen(gp);
  out->phase = cur_phase(gp);
  out->active_backward = g_active_backward.load();
  out->backward_passes = g_backward_passes.load();
  out->log_len = g_log_len.load();
  out->log_capacity = g_log ? kLogCapacity : 0;
  out->untagged_frees = g_untagged_frees.load();
  out->cpu_installed = g_cpu_installed.load() ? 1 : 0;
  out->cuda_loaded = g_cuda_loaded ? 1 : 0;
  out->cuda_ooms_seen = g_cuda_ooms_seen.load();
  return 0;
}

int memprof_device_stats(int32_t slot, MpDeviceStats* out) {
  if (!out || slot < 0 || slot >= kMaxDevices) {
    set_error("device slot out of range");
    return -1;
  }
  const DeviceState& d = g_dev[slot];
  out->live = d.live.load();
  out->peak_iter = d.peak_iter.load();
  out->peak_run = d.peak_run.load();
  out->allocs = d.allocs.load();
  out->frees = d.frees.load();
  out->optimizer_born_live = phase_live(d, kPhaseOptimizer);
  out->feature_maps = d.feature_maps.load();
  out->reported_allocated = d.reported_allocated.load();
  out->reported_reserved = d.reported_reserved.load();
  out->reported_peak_allocated_iter = d.reported_peak_allocated_iter.load();
  out->reported_peak_reserved_iter = d.reported_peak_reserved_iter.load();
  out->reported_peak_allocated_run = d.reported_peak_allocated_run.load();
  out->reported_peak_reserved_run = d.reported_peak_reserved_run.load();
  return 0;
}

// Copies up to `cap` events of the backward log; returns how many were logged in all
// (more than `cap`, or more than the capacity, means the log overflowed).
uint64_t memprof_read_log(LogEvent* out, uint64_t cap) {
  uint64_t n = g_log_len.load(std::memory_order_acquire);
  uint64_t avail = n < kLogCapacity ? n : kLogCapacity;
  uint64_t c = avail < cap ? avail : cap;
  if (g_log && out && c > 0) {
    std::memcpy(out, g_log, c * sizeof(LogEvent));
  }
  return n;
}

// The block behind a tensor's storage (grad=1: behind its .grad).
int memprof_tensor_block(const void* tensor, int32_t grad, MpBlock* out) {
  try {
    std::memset(out, 0, sizeof(MpBlock));
    out->device = -1;
    if (!tensor) {
      set_error("null tensor");
      return -1;
    }
    const at::Tensor& t0 = *static_cast<const at::Tensor*>(tensor);
    if (!t0.defined()) {
      return 0;
    }
    at::Tensor t = grad ? t0.grad() : t0;
    if (!t.defined() || !t.has_storage()) {
      return 0;
    }
    const c10::Storage& st = t.storage();
    const c10::DataPtr& dp = st.data_ptr();
    out->defined = 1;
    out->device = device_slot(dp.device());
    out->base = uint64_t(dp.get());
    out->bytes = int64_t(st.nbytes());
    if (dp.device().is_cpu()) {
      if (dp.get_deleter() == &tracked_delete && dp.get()) {
        BlockHeader* h = header_of(dp.get());
        if (h->magic == kMagic) {
          out->tracked = 1;
          out->bytes = int64_t(h->size);
          out->gen = h->gen;
          out->phase = h->phase;
        }
      }
    } else if (dp.device().is_cuda()) {
      out->bytes = cuda_round(int64_t(st.nbytes()));
      std::lock_guard<std::mutex> lock(g_cuda_mutex);
      auto it = g_cuda_blocks->find(out->base);
      if (it != g_cuda_blocks->end()) {
        out->tracked = 1;
        out->bytes = it->second.size;
        out->gen = it->second.gen;
        out->phase = it->second.phase;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception in memprof_tensor_block");
  }
  return -1;
}

// CUDA allocator statistics for one device. Fails softly without CUDA.
int memprof_cuda_stats(int32_t index, MpCudaStats* out) {
  try {
    std::memset(out, 0, sizeof(MpCudaStats));
    if (!g_cuda_loaded) {
      set_error(("CUDA is not available: " + g_cuda_load_message).c_str());
      return -1;
    }
    auto* alloc = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
    if (!alloc || !alloc->initialized()) {
      set_error("the CUDA caching allocator is not initialized (no CUDA tensor yet)");
      return -1;
    }
    auto s = alloc->getDeviceStats(c10::DeviceIndex(index));
    constexpr auto A = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated_current = s.allocated_bytes[A].current;
    out->allocated_peak = s.allocated_bytes[A].peak;
    out->reserved_current = s.reserved_bytes[A].current;
    out->reserved_peak = s.reserved_bytes[A].peak;
    out->active_current = s.active_bytes[A].current;
    out->active_peak = s.active_bytes[A].peak;
    out->requested_current = s.requested_bytes[A].current;
    out->requested_peak = s.requested_bytes[A].peak;
    out->alloc_retries = s.num_alloc_retries;
    out->ooms = s.num_ooms;
    auto info = alloc->getMemoryInfo(c10::DeviceIndex(index));
    out->free_bytes = int64_t(info.first);
    out->total_bytes = int64_t(info.second);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception in memprof_cuda_stats");
  }
  return -1;
}

struct MpTimelineHeader {
  uint64_t len;        // events logged this iteration (more than capacity: overflow)
  uint64_t capacity;
  uint32_t start_gen;  // first generation of this iteration
  int32_t ops;         // timeline ops begun this iteration
  int64_t start_live;  // live bytes of the timeline device when the iteration began
  int32_t on;
  int32_t device;
};

int memprof_timeline_header(MpTimelineHeader* out) {
  if (!out) {
    return -1;
  }
  out->len = g_tl_len.load(std::memory_order_acquire);
  out->capacity = g_tl ? kTlCapacity : 0;
  out->start_gen = g_tl_start_gen.load();
  out->ops = g_op_counter.load();
  out->start_live = g_tl_start_live.load();
  out->on = g_tl_on.load() ? 1 : 0;
  out->device = g_tl_device.load();
  return 0;
}

// Copies up to `cap` events of this iteration's timeline log; returns how many were
// logged in all.
uint64_t memprof_read_timeline(TlEvent* out, uint64_t cap) {
  uint64_t n = g_tl_len.load(std::memory_order_acquire);
  uint64_t avail = n < kTlCapacity ? n : kTlCapacity;
  uint64_t c = avail < cap ? avail : cap;
  if (g_tl && out && c > 0) {
    std::memcpy(out, g_tl, c * sizeof(TlEvent));
  }
  return n;
}

// Copies the name of interned id `id` into buf; returns its length, -1 if unknown.
int64_t memprof_name(int32_t id, char* buf, size_t len) {
  if (id < 0 || uint32_t(id) >= kNameSlots ||
      g_names[id].ready.load(std::memory_order_acquire) == 0) {
    return -1;
  }
  const char* n = g_names[id].name;
  size_t l = std::strlen(n);
  if (buf && len > 0) {
    size_t c = l < len - 1 ? l : len - 1;
    std::memcpy(buf, n, c);
    buf[c] = 0;
  }
  return int64_t(l);
}

// Interns a name (for scopes); returns its id or -1.
int32_t memprof_intern(const char* name) {
  try {
    int32_t id = intern(name);
    if (id < 0) {
      set_error("the op name table is full");
    }
    return id;
  } catch (...) {
    set_error("unknown C++ exception in memprof_intern");
  }
  return -1;
}

// Replaces the table of model variables: storage pointers and their indices.
int memprof_set_params(
    const uint64_t* ptrs, const int32_t* ids, const int32_t* layers, size_t n) {
  try {
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
      set_error("parameter table storage missing");
      return -1;
    }
    g_params.store(t.get(), std::memory_order_release);
    g_params_all->push_back(std::move(t));
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception in memprof_set_params");
  }
  return -1;
}

// Scopes name the layer of the ops run on this thread until the matching pop.
int memprof_scope_push(int32_t id) {
  OpTls& t = tl_ops;
  if (t.n_scope >= kMaxScopes) {
    set_error("scopes nested deeper than 32");
    return -1;
  }
  t.scopes[t.n_scope++] = id;
  return 0;
}

int memprof_scope_pop() {
  OpTls& t = tl_ops;
  if (t.n_scope <= 0) {
    set_error("no scope is open on this thread");
    return -1;
  }
  --t.n_scope;
  return 0;
}

struct MpLiveBlock {
  uint64_t ptr;
  int64_t size;
  int32_t op;      // name id of the timeline-level op that allocated it, -1 none
  int32_t layer;   // name id of its layer, -1 unknown
  uint32_t iter;   // iteration (step, from 1) it was born in
  uint8_t phase;   // birth phase
  uint8_t device;  // device slot
  uint16_t pad;
};
static_assert(sizeof(MpLiveBlock) == 32, "mirrored in src/ffi.rs");

// Copies up to `cap` live blocks of device slot `slot` registered in this session;
// returns how many there are (more than `cap`: call again with a larger buffer).
uint64_t memprof_live_blocks(int32_t slot, MpLiveBlock* out, uint64_t cap) {
  if (!g_reg) {
    return 0;
  }
  const uint32_t session = g_session_id.load() & 0xffff;
  uint32_t hw = g_reg_hw.load(std::memory_order_acquire);
  if (hw > kRegCapacity) {
    hw = kRegCapacity;
  }
  uint64_t n = 0;
  for (uint32_t i = 0; i < hw; ++i) {
    const RegEntry& e = g_reg[i];
    const uint64_t p = e.ptr.load(std::memory_order_acquire);
    if (p == 0) {
      continue;
    }
    const int64_t size = e.size.load(std::memory_order_relaxed);
    const uint64_t origin = e.origin.load(std::memory_order_relaxed);
    const uint64_t misc = e.misc.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.ptr.load(std::memory_order_relaxed) != p) {
      continue;  // freed (and maybe reused) while read
    }
    if (((misc >> 40) & 0xff) != uint64_t(slot) || (misc >> 48) != session) {
      continue;
    }
    if (out && n < cap) {
      out[n] = MpLiveBlock{
          p,
          size,
          int32_t(uint32_t(origin)),
          int32_t(uint32_t(origin >> 32)),
          uint32_t(misc),
          uint8_t((misc >> 32) & 0xff),
          uint8_t(slot),
          0};
    }
    ++n;
  }
  return n;
}

struct MpRegistry {
  uint64_t capacity;    // entries reserved
  uint64_t high_water;  // entries ever used (their memory is touched)
  int64_t live;         // entries in use now
  int64_t dropped;      // births not registered because the registry was full
  uint64_t entry_bytes;
  int32_t on;
  int32_t pad;
};

int memprof_registry(MpRegistry* out) {
  if (!out) {
    return -1;
  }
  const uint32_t hw = g_reg_hw.load();
  out->capacity = g_reg ? kRegCapacity : 0;
  out->high_water = hw < kRegCapacity ? hw : kRegCapacity;
  out->live = g_reg_live.load();
  out->dropped = g_reg_dropped.load();
  out->entry_bytes = sizeof(RegEntry);
  out->on = g_origin_on.load() ? 1 : 0;
  out->pad = 0;
  return 0;
}

// Sets (or clears, with null) the out-of-memory report writer.
int memprof_set_oom_callback(OomCallback cb) {
  g_oom_callback.store(cb, std::memory_order_release);
  return 0;
}

// Starts (clearing it) or stops the memory history; `max_entries` (1..2^24) is the ring's
// size when starting.
int memprof_history(int32_t on, uint64_t max_entries) {
  if (on) {
    if (!g_hist) {
      set_error("the memory history could not be reserved (mmap failed)");
      return -1;
    }
    if (max_entries == 0 || max_entries > kHistMax) {
      set_error("max_entries must be between 1 and 16777216");
      return -1;
    }
    g_hist_on.store(false);
    g_hist_cap.store(max_entries);
    g_hist_len.store(0);
    g_origin_on.store(true);  // snapshots list the registered live blocks
    g_hist_on.store(true);
  } else {
    g_hist_on.store(false);
    g_origin_on.store(g_leaks_requested);
  }
  return 0;
}

// CUDA: the caching allocator's own history and snapshot (torch::cuda functions of
// libtorch_cuda.so, looked up by their mangled names: tch does not link that library).
using RecordHistoryFn = void (*)(
    bool, bool, int64_t, bool, bool, bool, bool, bool, const std::vector<std::string>&);
using SnapshotFn = std::string (*)();

void* cuda_symbol(const char* mangled) {
  if (!g_cuda_loaded) {
    set_error(("CUDA is not available: " + g_cuda_load_message).c_str());
    return nullptr;
  }
  void* f = dlsym(RTLD_DEFAULT, mangled);
  if (!f) {
    set_error((std::string("libtorch_cuda.so lacks ") + mangled).c_str());
  }
  return f;
}

int memprof_cuda_history(int32_t on, int64_t max_entries) {
  return guarded("memprof_cuda_history", [&]() -> int {
    auto f = reinterpret_cast<RecordHistoryFn>(cuda_symbol(
        "_ZN5torch4cuda22_record_memory_historyEbblbbbbbRKSt6vectorINSt7__cxx1112basic_"
        "stringIcSt11char_traitsIcESaIcEEESaIS7_EE"));
    if (!f) {
      return -1;
    }
    // enabled, record_context, trace_alloc_max_entries, trace_alloc_record_context,
    // record_cpp_context (C++ unwinding is slow: off), clearHistory, compileContext,
    // globalRecordAllocations, skip_actions.
    f(on != 0, on != 0, max_entries, on != 0, false, on != 0, false, false, {});
    return 0;
  });
}

// Writes the caching allocator's snapshot (the pickle memory_viz reads) to `path`.
int memprof_cuda_snapshot(const char* path) {
  return guarded("memprof_cuda_snapshot", [&]() -> int {
    auto f = reinterpret_cast<SnapshotFn>(
        cuda_symbol("_ZN5torch4cuda24_memory_snapshot_pickledB5cxx11Ev"));
    if (!f) {
      return -1;
    }
    const std::string bytes = f();
    FILE* out = std::fopen(path, "wb");
    if (!out) {
      set_error((std::string("cannot create ") + path).c_str());
      return -1;
    }
    const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), out);
    const bool ok = n == bytes.size() && std::fclose(out) == 0;
    if (!ok) {
      set_error((std::string("cannot write ") + path).c_str());
      return -1;
    }
    return 0;
  });
}

// CUDA: resets the caching allocator's peak statistics, or empties its cache.
int memprof_cuda_control(int32_t index, int32_t what) {
  return guarded("memprof_cuda_control", [&]() -> int {
    if (!g_cuda_loaded) {
      set_error(("CUDA is not available: " + g_cuda_load_message).c_str());
      return -1;
    }
    auto* alloc = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
    if (!alloc || !alloc->initialized()) {
      set_error("the CUDA caching allocator is not initialized (no CUDA tensor yet)");
      return -1;
    }
    if (what == 0) {
      alloc->resetPeakStats(c10::DeviceIndex(index));
    } else {
      alloc->emptyCache();
    }
    return 0;
  });
}

// Copies the history's last min(len, capacity) events, oldest first, into out (up to
// cap of them); returns how many were appended since the start (more than the ring's
// capacity: the oldest were overwritten).
uint64_t memprof_read_history(HistEvent* out, uint64_t cap) {
  const uint64_t len = g_hist_len.load(std::memory_order_acquire);
  const uint64_t ring = g_hist_cap.load();
  if (!g_hist || ring == 0 || !out) {
    return len;
  }
  const uint64_t n = len < ring ? len : ring;
  const uint64_t first = len - n;
  const uint64_t c = n < cap ? n : cap;
  for (uint64_t k = 0; k < c; ++k) {
    out[k] = g_hist[(first + k) % ring];
  }
  return len;
}

// ---------------------------------------------------------------------------------
// Mixed precision and RNG state, for src/optimize.rs (autocast and checkpointing).

c10::DeviceType autocast_device(int32_t device_type) {
  return device_type == 0 ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
}

struct MpAutocast {
  int32_t enabled;
  int32_t dtype;  // c10::ScalarType
};

// Turns autocast on (or off) for a device type with `dtype`, remembering the previous
// state in *prev for memprof_autocast_exit.
int memprof_autocast_enter(int32_t device_type, int32_t enabled, int32_t dtype, MpAutocast* prev) {
  return guarded("memprof_autocast_enter", [&]() -> int {
    const auto dt = autocast_device(device_type);
    prev->enabled = at::autocast::is_autocast_enabled(dt) ? 1 : 0;
    prev->dtype = int32_t(at::autocast::get_autocast_dtype(dt));
    at::autocast::set_autocast_enabled(dt, enabled != 0);
    if (enabled) {
      at::autocast::set_autocast_dtype(dt, c10::ScalarType(dtype));
    }
    at::autocast::increment_nesting();
    return 0;
  });
}

int memprof_autocast_exit(int32_t device_type, const MpAutocast* prev) {
  return guarded("memprof_autocast_exit", [&]() -> int {
    const auto dt = autocast_device(device_type);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();  // the cached low-precision copies of the weights
    }
    at::autocast::set_autocast_enabled(dt, prev->enabled != 0);
    at::autocast::set_autocast_dtype(dt, c10::ScalarType(prev->dtype));
    return 0;
  });
}

}  // extern "C"

namespace {
// The default random generator of a device (CPU: device_type 0; CUDA: 1, index).
at::Generator default_generator(int32_t device_type, int32_t index) {
  const c10::Device d = device_type == 0
      ? c10::Device(c10::DeviceType::CPU)
      : c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(index));
  return at::globalContext().defaultGenerator(d);
}
}  // namespace

extern "C" {

// The default generator's state as a new tensor handle (an at::Tensor*, owned by the
// caller as tch owns its tensors).
int memprof_rng_get(int32_t device_type, int32_t index, void** out) {
  return guarded("memprof_rng_get", [&]() -> int {
    *out = nullptr;
    at::Generator gen = default_generator(device_type, index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    *out = new at::Tensor(gen.get_state());
    return 0;
  });
}

int memprof_rng_set(int32_t device_type, int32_t index, const void* state) {
  return guarded("memprof_rng_set", [&]() -> int {
    at::Generator gen = default_generator(device_type, index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(*static_cast<const at::Tensor*>(state));
    return 0;
  });
}

}  // extern "C"
