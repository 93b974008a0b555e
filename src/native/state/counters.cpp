// Generation slots, device counters, phase transitions, and the hooks' re-entry count.

#include <torch/csrc/autograd/graph_task.h>

#include "../internal.h"

namespace memprof {

std::atomic<int64_t> g_hook_reentries{0};
thread_local int tls_hook_depth = 0;

DeviceState g_dev[kMaxDevices];
std::atomic<uint64_t> g_genphase{genphase(kRing, kIdle)};
std::atomic<int64_t> g_active_backward{0};
std::atomic<int64_t> g_backward_passes{0};
std::atomic<int64_t> g_untagged_frees{0};
thread_local bool tls_training_thread = false;

void init_slots() {
  for (auto& d : g_dev) {
    for (int i = 0; i < kRing; ++i) {
      // Generations start at kRing: every slot holds an older generation.
      d.slots[i].store(pack(uint32_t(i), kIdle, 0), std::memory_order_relaxed);
    }
    for (auto& o : d.old_by_phase) {
      o.store(0, std::memory_order_relaxed);
    }
  }
}

void reset_live(DeviceState& d) {
  // Every slot holds a generation older than any the session will tag.
  const uint32_t older = cur_gen(g_genphase.load()) - uint32_t(kRing);
  d.live.store(0);
  for (auto& slot : d.slots) {
    slot.store(pack(older, kIdle, 0), std::memory_order_relaxed);
  }
  for (auto& old : d.old_by_phase) {
    old.store(0, std::memory_order_relaxed);
  }
}

namespace {
// Is generation a (20 bits) older than generation b (20 bits)?
inline bool gen_older(uint32_t a, uint32_t b) {
  const uint32_t diff = (b - a) & uint32_t(kGenMask);
  return diff != 0 && diff < (1u << (kGenBits - 1));
}

// Live bytes still held by blocks born in `gen` (0 if it left the ring).
int64_t gen_live(const DeviceState& d, uint32_t gen) {
  const uint64_t v = d.slots[gen % kRing].load(std::memory_order_relaxed);
  return slot_gen(v) == (gen & uint32_t(kGenMask)) ? slot_bytes(v) : 0;
}
}  // namespace

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

int64_t phase_live(const DeviceState& d, uint32_t phase) {
  int64_t total = d.old_by_phase[phase].load(std::memory_order_relaxed);
  for (int i = 0; i < kRing; ++i) {
    const uint64_t v = d.slots[i].load(std::memory_order_relaxed);
    if (slot_phase(v) == phase) {
      total += slot_bytes(v);
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

bool in_autograd_task() {
  return torch::autograd::get_current_graph_task_id() != -1;
}

}  // namespace memprof
