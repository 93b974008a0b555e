// Generation slots, device counters, phase transitions, and the hooks' re-entry count.

#include <cstring>

#include <torch/csrc/autograd/graph_task.h>

#include "../internal.h"

namespace memprof {

std::atomic<int64_t> g_hook_reentries{0};

MEMPROF_CONSTINIT HotState g_hot{
    /*genphase=*/{genphase(kRing, kIdle)},
    /*active_backward=*/{0},
    /*reg=*/nullptr,
    /*reg_live=*/{{0}, {0}},
    /*cpu_epoch=*/{0},
    /*iter=*/{0},
    /*session_id=*/{0},
    /*reg_own_free=*/0,
    /*cpu_forget=*/{false},
    /*origin_on=*/{false},
    /*hist_on=*/{false},
    /*steplog_on=*/{false},
    /*detail_on=*/{false},
    /*graph_task_direct=*/{true},
};
static_assert(sizeof(HotState) == 64, "what the hooks read fills one cache line");

MEMPROF_CONSTINIT thread_local HotTls tls_hot{};
// What -fno-extern-tls-init (build.rs) requires of every thread-local another source
// reads: no initialiser to run, no destructor.
static_assert(std::is_trivially_default_constructible_v<HotTls> &&
                  std::is_trivially_destructible_v<HotTls>,
              "tls_hot is constant-initialised");
static_assert(std::is_trivially_default_constructible_v<OpStack> &&
                  std::is_trivially_destructible_v<OpStack>,
              "tls_ops and tls_dry_ops are constant-initialised");

DeviceState g_dev[kMaxDevices];
std::atomic<int64_t> g_backward_passes{0};
std::atomic<int64_t> g_untagged_frees{0};

namespace {
std::atomic<bool> g_own_lane_claimed{false};
}  // namespace

void claim_own_lane() {
  if (!tls_hot.own_lane && !g_own_lane_claimed.exchange(true)) {
    tls_hot.own_lane = true;
  }
}

void init_slots() {
  for (auto& d : g_dev) {
    for (auto& l : d.lane) {
      for (int i = 0; i < kRing; ++i) {
        // Generations start at kRing: every slot holds an older generation.
        l.slots[i].store(pack(uint32_t(i), kIdle, 0), std::memory_order_relaxed);
      }
      for (auto& o : l.old_by_phase) {
        o.store(0, std::memory_order_relaxed);
      }
    }
  }
}

void reset_live(DeviceState& d) {
  // Every slot holds a generation older than any the session will tag.
  const uint32_t older = cur_gen(g_genphase.load()) - uint32_t(kRing);
  for (auto& l : d.lane) {
    l.live.store(0);
    for (auto& slot : l.slots) {
      slot.store(pack(older, kIdle, 0), std::memory_order_relaxed);
    }
    for (auto& old : l.old_by_phase) {
      old.store(0, std::memory_order_relaxed);
    }
  }
}

namespace {
// Is generation a (20 bits) older than generation b (20 bits)?
inline bool gen_older(uint32_t a, uint32_t b) {
  const uint32_t diff = (b - a) & uint32_t(kGenMask);
  return diff != 0 && diff < (1u << (kGenBits - 1));
}

// Live bytes still held by blocks born in `gen` (0 if it left the ring), both lanes.
int64_t gen_live(const DeviceState& d, uint32_t gen) {
  int64_t total = 0;
  for (const auto& l : d.lane) {
    const uint64_t v = l.slots[gen % kRing].load(std::memory_order_relaxed);
    total += slot_gen(v) == (gen & uint32_t(kGenMask)) ? slot_bytes(v) : 0;
  }
  return total;
}

// A slot's compare-and-swap: a plain store on the own lane (its one writer).
template <bool Own>
inline bool slot_swap(std::atomic<uint64_t>& s, uint64_t& cur, uint64_t next) {
  if (Own) {
    s.store(next, std::memory_order_relaxed);
    return true;
  }
  return s.compare_exchange_weak(cur, next, std::memory_order_relaxed);
}
}  // namespace

template <bool Own>
void slot_add(Lane& l, uint32_t gen, uint32_t phase, int64_t delta) {
  auto& s = l.slots[gen % kRing];
  const uint32_t g20 = gen & uint32_t(kGenMask);
  uint64_t cur = s.load(std::memory_order_relaxed);
  for (;;) {
    const uint32_t sg = slot_gen(cur);
    if (sg == g20) {
      if (slot_swap<Own>(s, cur, pack(gen, phase, slot_bytes(cur) + delta))) {
        return;
      }
      continue;
    }
    if (!gen_older(sg, g20)) {
      // The block's generation has left the ring (or the slot already moved past it).
      lane_add<Own>(l.old_by_phase[phase], delta);
      return;
    }
    // The slot holds an older generation: fold it and take the slot. A free takes it
    // too: its block was born in the other lane (bytes below zero here, the lanes' sum
    // the generation's).
    if (slot_swap<Own>(s, cur, pack(gen, phase, delta))) {
      lane_add<Own>(l.old_by_phase[slot_phase(cur)], slot_bytes(cur));
      return;
    }
  }
}
template void slot_add<true>(Lane&, uint32_t, uint32_t, int64_t);
template void slot_add<false>(Lane&, uint32_t, uint32_t, int64_t);

int64_t phase_live(const DeviceState& d, uint32_t phase) {
  int64_t total = 0;
  for (const auto& l : d.lane) {
    total += l.old_by_phase[phase].load(std::memory_order_relaxed);
    for (int i = 0; i < kRing; ++i) {
      const uint64_t v = l.slots[i].load(std::memory_order_relaxed);
      if (slot_phase(v) == phase) {
        total += slot_bytes(v);
      }
    }
  }
  return total;
}

bool transition(uint32_t from, uint32_t to) {
  uint64_t gp = g_genphase.load(std::memory_order_acquire);
  for (;;) {
    if (cur_phase(gp) != from) {
      return false;
    }
    const uint32_t gen = cur_gen(gp);
    if (to == kBackward) {
      // Feature maps: what the forward generation still holds now.
      for (auto& d : g_dev) {
        atomic_max(d.feature_maps, gen_live(d, gen));
      }
    }
    if (g_genphase.compare_exchange_weak(gp, genphase(gen + 1, to), std::memory_order_acq_rel)) {
      if (to == kBackward) {
        g_backward_passes.fetch_add(1, std::memory_order_relaxed);
      }
      if (g_steplog_on.load(std::memory_order_relaxed)) {
        steplog_append(MpTlEvent{MP_EV_PHASE, uint8_t(to), 0, 0, gen + 1, -1, 0, 0, 0});
      }
      return true;
    }
  }
}

// Whether this thread runs inside a graph task is asked at nearly every allocation and
// free of a step. libtorch keeps a thread's graph task in a c10::ThreadLocal (engine.cpp's
// tls_current_graph_task: a function that returns the address of the thread's
// std::shared_ptr<GraphTask>), and get_current_graph_task_id() reads it through three
// calls (the PLT, that function, __tls_get_addr), about 20 instructions, or a fifth of
// the profiler's own instructions in a step of small ops. The address is the thread's
// for its lifetime: it is asked once a thread, from the function that
// get_current_graph_task_id's code calls, and the shared_ptr's pointer read after that.
// Only where that code is exactly what libtorch 2.11's x86-64 wheel holds:
//   sub $8,%rsp; call *T(%rip); cmpq $0,(%rax); je ..; call *T(%rip); mov (%rax),%rax
// (T the same ThreadLocal both times); elsewhere (another build, another version, an
// address that is a stub), every check asks libtorch, as it did.
namespace {
using GraphTaskSlot = void* (*)();

GraphTaskSlot find_graph_task_slot() {
  const auto* code = reinterpret_cast<const uint8_t*>(&torch::autograd::get_current_graph_task_id);
  static constexpr uint8_t kHead[] = {0x48, 0x83, 0xec, 0x08, 0xff, 0x15};
  static constexpr uint8_t kTest[] = {0x48, 0x83, 0x38, 0x00, 0x74};
  static constexpr uint8_t kLoad[] = {0x48, 0x8b, 0x00};
  if (std::memcmp(code, kHead, sizeof kHead) != 0 ||
      std::memcmp(code + 10, kTest, sizeof kTest) != 0 || code[16] != 0xff ||
      code[17] != 0x15 || std::memcmp(code + 22, kLoad, sizeof kLoad) != 0) {
    return nullptr;
  }
  int32_t first = 0;
  int32_t second = 0;
  std::memcpy(&first, code + 6, 4);
  std::memcpy(&second, code + 18, 4);
  const uint8_t* table = code + 10 + first;
  if (code + 22 + second != table) {
    return nullptr;
  }
  GraphTaskSlot slot = nullptr;
  std::memcpy(&slot, table, sizeof slot);
  return slot;
}

// Null where the code is not the expected one (asked once, at the first check).
GraphTaskSlot graph_task_slot() {
  static const GraphTaskSlot slot = find_graph_task_slot();
  return slot;
}

}  // namespace

bool graph_task_read_direct() {
  return graph_task_slot() != nullptr && g_graph_task_direct.load(std::memory_order_relaxed);
}

// The first check on a thread (or every check where the direct read is off; in_autograd_task
// reads the thread's graph task itself otherwise): libtorch's
// answer, and the thread's graph task found for the next checks (tls_hot.graph_task),
// the direct read turned off for good if the two disagree.
bool in_autograd_task_slow() {
  void* const* task = tls_hot.graph_task;
  const bool in_task = torch::autograd::get_current_graph_task_id() != -1;
  const GraphTaskSlot slot = graph_task_slot();
  if (task == nullptr && slot != nullptr && g_graph_task_direct.load(std::memory_order_relaxed)) {
    task = static_cast<void* const*>(slot());
    if ((*task != nullptr) == in_task) {
      tls_hot.graph_task = task;
    } else {
      g_graph_task_direct.store(false, std::memory_order_relaxed);
    }
  }
  return in_task;
}

uint64_t phase_for_alloc_slow(uint64_t gp) {
  if (backward_if_in_task(gp)) {
    gp = g_genphase.load(std::memory_order_acquire);
  }
  if (tls_hot.training_thread) {
    if (cur_phase(gp) == kBackward && g_active_backward.load(std::memory_order_acquire) == 0 &&
        !in_autograd_task()) {
      transition(kBackward, kOptimizer);
      gp = g_genphase.load(std::memory_order_acquire);
    }
    if (cur_phase(gp) == kOptimizer && grad_mode_enabled()) {
      transition(kOptimizer, kForward);
      gp = g_genphase.load(std::memory_order_acquire);
    }
  }
  return gp;
}

void count_birth_shared(DeviceState& d, int64_t size, uint32_t gen, uint32_t phase, bool alloc) {
  count_birth_in<false>(d, size, gen, phase, alloc);
}

void count_death_shared(DeviceState& d, int64_t size, uint32_t gen, uint32_t phase) {
  count_death_in<false>(d, size, gen, phase);
}

}  // namespace memprof
