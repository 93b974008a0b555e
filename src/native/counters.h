// The hot path's counters: generation slots, the device counters' two lanes, births and
// deaths counted, and the phase each allocation and free sees (counters.cpp defines what
// is not inline here). A part of internal.h, included there after the constants and the
// hook scopes it uses; not included on its own. The hot-path rules at the top of
// internal.h hold here.
#pragma once

namespace memprof {

// Generation slots and device counters (counters.cpp).

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

// A device's counters come in two lanes. Lane kOwnLane is written by one thread only,
// the first thread that starts a session (for the life of the process: a training loop's
// thread), with plain loads and stores; lane kSharedLane by every other thread (CUDA's
// backward on the engine's device thread, intra-op workers, other sessions' threads)
// with atomic read-modify-writes. The training thread's allocations and frees so cost no
// locked instruction. A device's figures are the lanes' sums: live bytes, allocations,
// each generation's and phase's bytes. Each lane keeps the peaks of the device's total
// its writer saw (its own lane's bytes after the event plus the other's), the device's
// peak their larger: exact where the two lanes' writers do not allocate at the same
// moment (a training step's phases do not overlap; when they do, a peak of the two
// events together can be missed by the smaller of them, as at any instant the order of
// two concurrent allocations is not defined).
constexpr int kOwnLane = 0;
constexpr int kSharedLane = 1;

struct Lane {
  std::atomic<int64_t> live{0};       // live bytes of blocks this lane counted born, less its frees
  std::atomic<int64_t> allocs{0};
  std::atomic<int64_t> peak_iter{0};  // the device's peak since the iteration began, as seen here
  std::atomic<int64_t> peak_run{0};   // the device's peak since the profiler started, as seen here
  std::atomic<uint64_t> slots[kRing];
  std::atomic<int64_t> old_by_phase[kPhases];
};

struct DeviceState {
  Lane lane[2];
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

  // Live bytes of blocks this layer saw born.
  int64_t live() const {
    return lane[0].live.load(std::memory_order_relaxed) +
        lane[1].live.load(std::memory_order_relaxed);
  }
  // Peak of live() since the iteration began.
  int64_t peak_iter() const {
    return std::max(lane[0].peak_iter.load(std::memory_order_relaxed),
                    lane[1].peak_iter.load(std::memory_order_relaxed));
  }
  // Peak of live() since the profiler started.
  int64_t peak_run() const {
    return std::max(lane[0].peak_run.load(std::memory_order_relaxed),
                    lane[1].peak_run.load(std::memory_order_relaxed));
  }
  int64_t allocs() const {
    return lane[0].allocs.load(std::memory_order_relaxed) +
        lane[1].allocs.load(std::memory_order_relaxed);
  }
  // Starts the iteration's (and with `run`, the run's) peak from live bytes now.
  void restart_peaks(bool run) {
    const int64_t now = live();
    for (auto& l : lane) {
      l.peak_iter.store(now, std::memory_order_relaxed);
      if (run) {
        l.peak_run.store(now, std::memory_order_relaxed);
      }
    }
  }
};

extern DeviceState g_dev[kMaxDevices];
extern std::atomic<int64_t> g_backward_passes;
// Frees whose birth tag could not be read (should stay 0).
extern std::atomic<int64_t> g_untagged_frees;

inline uint32_t cur_gen(uint64_t gp) {
  return uint32_t(gp >> 8);
}
inline uint32_t cur_phase(uint64_t gp) {
  return uint32_t(gp & 0xff);
}
constexpr uint64_t genphase(uint32_t gen, uint32_t phase) {
  return (uint64_t(gen) << 8) | phase;
}

inline void atomic_max(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// Makes this thread the own lane's writer if no thread is yet (at a session's start).
void claim_own_lane();

// A lane's read-modify-writes: plain on the own lane (one writer), atomic on the shared.
template <bool Own>
inline int64_t lane_add(std::atomic<int64_t>& a, int64_t v) {
  if (Own) {
    const int64_t now = a.load(std::memory_order_relaxed) + v;
    a.store(now, std::memory_order_relaxed);
    return now;
  }
  return a.fetch_add(v, std::memory_order_relaxed) + v;
}
template <bool Own>
inline void lane_max(std::atomic<int64_t>& a, int64_t v) {
  if (Own) {
    if (v > a.load(std::memory_order_relaxed)) {
      a.store(v, std::memory_order_relaxed);
    }
  } else {
    atomic_max(a, v);
  }
}

void init_slots();
// Forgets a device's live bytes: 0 live, no generation holding any (a session that
// starts from what it can know again).
void reset_live(DeviceState& d);
template <bool Own>
void slot_add(Lane& l, uint32_t gen, uint32_t phase, int64_t delta);
// slot_add on the own lane where the slot already holds the generation (nearly every
// event): one load and one store, inline; the rest out of line.
inline void slot_add_own(Lane& l, uint32_t gen, uint32_t phase, int64_t delta) {
  auto& s = l.slots[gen % kRing];
  const uint64_t cur = s.load(std::memory_order_relaxed);
  if (__builtin_expect(slot_gen(cur) == (gen & uint32_t(kGenMask)), 1)) {
    s.store(pack(gen, phase, slot_bytes(cur) + delta), std::memory_order_relaxed);
    return;
  }
  slot_add<true>(l, gen, phase, delta);
}
template <bool Own>
inline void lane_slot_add(Lane& l, uint32_t gen, uint32_t phase, int64_t delta) {
  if (Own) {
    slot_add_own(l, gen, phase, delta);
  } else {
    slot_add<false>(l, gen, phase, delta);
  }
}
// Counts a birth of `size` bytes in lane Own (`alloc`: also as an allocation): live
// bytes, the peaks, the generation's bytes.
template <bool Own>
inline void count_birth_in(DeviceState& d, int64_t size, uint32_t gen, uint32_t phase,
                           bool alloc) {
  Lane& l = d.lane[Own ? kOwnLane : kSharedLane];
  const Lane& other = d.lane[Own ? kSharedLane : kOwnLane];
  const int64_t live = lane_add<Own>(l.live, size) + other.live.load(std::memory_order_relaxed);
  if (alloc) {
    lane_add<Own>(l.allocs, 1);
  }
  lane_max<Own>(l.peak_iter, live);
  lane_max<Own>(l.peak_run, live);
  lane_slot_add<Own>(l, gen, phase, size);
}
template <bool Own>
inline void count_death_in(DeviceState& d, int64_t size, uint32_t gen, uint32_t phase) {
  Lane& l = d.lane[Own ? kOwnLane : kSharedLane];
  lane_add<Own>(l.live, -size);
  lane_slot_add<Own>(l, gen, phase, -size);
}
// The shared lane's counting (count_birth_in<false>, count_death_in<false>), out of
// line: only threads other than the training thread take it, and inlined at every hook
// it doubled the code an allocation runs through (instruction-cache lines that
// libtorch's ops evict between two allocations).
[[gnu::noinline]] void count_birth_shared(DeviceState& d, int64_t size, uint32_t gen,
                                          uint32_t phase, bool alloc);
[[gnu::noinline]] void count_death_shared(DeviceState& d, int64_t size, uint32_t gen,
                                          uint32_t phase);
// Counts a birth in this thread's lane.
inline void count_birth(DeviceState& d, int64_t size, uint32_t gen, uint32_t phase, bool alloc) {
  if (__builtin_expect(!tls_hot.own_lane, 0)) {
    count_birth_shared(d, size, gen, phase, alloc);
  } else {
    count_birth_in<true>(d, size, gen, phase, alloc);
  }
}
inline void count_death(DeviceState& d, int64_t size, uint32_t gen, uint32_t phase) {
  if (__builtin_expect(!tls_hot.own_lane, 0)) {
    count_death_shared(d, size, gen, phase);
  } else {
    count_death_in<true>(d, size, gen, phase);
  }
}
int64_t phase_live(const DeviceState& d, uint32_t phase);
// Moves from `from` to `to` (bumping the generation) if the phase is still `from`.
bool transition(uint32_t from, uint32_t to);
// Whether this thread runs inside the autograd engine's graph task now: between two
// nodes of a backward pass (gradients summed in input buffers, broadcast gradients
// reduced), where no node's record is open. Inline where the thread's graph task is
// read directly (every thread after its first check), else in_autograd_task_slow.
bool in_autograd_task_slow();
inline bool in_autograd_task() {
  void* const* task = tls_hot.graph_task;
  if (__builtin_expect(task != nullptr, 1) && g_graph_task_direct.load(std::memory_order_relaxed)) {
    return *task != nullptr;
  }
  return in_autograd_task_slow();
}
// Whether in_autograd_task reads libtorch's thread-local graph task itself (found in
// libtorch's code once), not through get_current_graph_task_id().
bool graph_task_read_direct();

// Whether this thread runs an estimator's dry run (dryrun/trace.cpp): its backward is
// the dry run's, not the profiled step's.
bool dry_run_thread();

// Forward (or optimizer) -> backward at the first allocation or free inside the autograd
// engine's graph task, on any thread (CUDA's backward runs on the engine's device
// thread). No op record is needed for it, so a session that needs none registers no op
// callback at all: libtorch then builds no record, not even an autograd node's, and
// the engine's thread-local state, set again for every node it runs, has no callback
// to rebuild its lists for. Nothing is allocated or freed between the first node's
// start and this event: the feature maps measured at the transition are the same.
// True when it moved the phase (or another thread did meanwhile): `gp` is stale then.
inline bool backward_if_in_task(uint64_t gp) {
  const uint32_t ph = cur_phase(gp);
  if ((ph == kForward || ph == kOptimizer) && in_autograd_task() && !dry_run_thread()) {
    transition(ph, kBackward);
    return true;
  }
  return false;
}

// c10::GradMode::is_enabled(), without its two calls (into libc10, then __tls_get_addr)
// at every allocation of the optimizer phase: the thread's AutogradState, whose address
// libc10 gives and which lives as long as the thread, asked once a thread.
inline bool grad_mode_enabled() {
  c10::AutogradState* s = tls_hot.autograd_state;
  if (s == nullptr) {
    s = &c10::AutogradState::get_tls_state();
    tls_hot.autograd_state = s;
  }
  return s->get_grad_mode();
}

// Called on every free of a tracked block, before it is counted.
inline void phase_for_free() {
  backward_if_in_task(g_genphase.load(std::memory_order_acquire));
}

// What phase_for_alloc does where a phase may change (counters.cpp), out of line.
[[gnu::noinline]] uint64_t phase_for_alloc_slow(uint64_t gp);

// Called on every allocation: backward begins inside the engine's graph task (any
// thread); and by the training thread, the allocation-driven phase changes (backward ->
// optimizer when no backward node runs and no graph task; optimizer -> forward when a
// grad-mode op allocates, i.e. the next micro-batch's forward pass, whose first
// allocation may be the one that ends backward: both checks run). Inline: the two cases
// of nearly every allocation, where nothing changes (forward outside the graph task,
// backward inside it or off the training thread).
inline uint64_t phase_for_alloc() {
  const uint64_t gp = g_genphase.load(std::memory_order_acquire);
  const uint32_t ph = cur_phase(gp);
  if (ph == kForward) {
    if (__builtin_expect(!in_autograd_task(), 1)) {
      return gp;
    }
  } else if (ph == kIdle) {
    return gp;
  } else if (ph == kBackward) {
    if (!tls_hot.training_thread || g_active_backward.load(std::memory_order_acquire) != 0 ||
        in_autograd_task()) {
      return gp;
    }
  }
  return phase_for_alloc_slow(gp);
}

}  // namespace memprof
