// Live-block registry (leak hunting, snapshots, OOM reports) and the CUDA block table.
//
// Registry: every block born while it is on gets an entry: its size, birth phase,
// iteration, device and origin (op and layer). Entries are recycled through a
// lock-free free list (a tagged Treiber stack), so the registry holds as many entries
// as blocks were ever live at once, not one per allocation: its memory is bounded by
// the peak number of live blocks, never by the number of iterations. Reserved with
// mmap: untouched entries cost nothing. Every field is an atomic so that a scan may
// read entries that another thread is filling (it re-reads the pointer to drop torn
// entries).

#include "internal.h"

namespace memprof {

RegEntry* g_reg = nullptr;
namespace {
std::atomic<uint64_t> g_reg_free{0};  // ABA tag << 32 | (index + 1); 0 = empty
}  // namespace
std::atomic<uint32_t> g_reg_hw{0};      // entries ever handed out
std::atomic<int64_t> g_reg_live{0};
std::atomic<int64_t> g_reg_dropped{0};  // births not registered: registry full
std::atomic<bool> g_origin_on{false};
std::atomic<uint32_t> g_iter{0};        // iteration (step) that births belong to
std::atomic<uint32_t> g_session_id{0};  // bumped at each memprof_start

namespace {
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
}  // namespace

uint32_t reg_add(uint64_t ptr, int64_t size, uint32_t phase, int dev) {
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

void reg_remove(uint32_t idx) {
  if (idx >= kRegCapacity || !g_reg) {
    return;
  }
  g_reg[idx].ptr.store(0, std::memory_order_release);
  g_reg_live.fetch_sub(1, std::memory_order_relaxed);
  reg_push(idx);
}

// ---------------------------------------------------------------------------------
// The CUDA block table.

BlockTable g_cuda_blocks;
std::atomic<int64_t> g_cuda_untracked{0};

namespace {
constexpr uint64_t kEmpty = 0;
constexpr uint64_t kTomb = 1;
constexpr uint64_t kBusy = 2;

inline uint64_t home(const BlockTable& t, uint64_t ptr) {
  return ((ptr >> 4) * 0x9E3779B97F4A7C15ull >> 17) & t.mask;
}

inline void publish(BlockSlot& s, uint64_t ptr, uint64_t tag, uint32_t reg) {
  s.tag.store(tag, std::memory_order_relaxed);
  s.reg.store(reg, std::memory_order_relaxed);
  s.key.store(ptr, std::memory_order_release);
}

// Slot i was just tombstoned: if no probe chain runs through it (the next slot is
// empty), it and the tombstones before it become empty again.
void reclaim(BlockTable& t, uint64_t i) {
  for (int n = 0; n < kMaxProbe; ++n) {
    const uint64_t next = (i + 1) & t.mask;
    if (t.slots[next].key.load(std::memory_order_acquire) != kEmpty) {
      return;
    }
    uint64_t expect = kTomb;
    if (!t.slots[i].key.compare_exchange_strong(expect, kEmpty, std::memory_order_acq_rel)) {
      return;
    }
    // A writer may have claimed `next` meanwhile, through this slot: keep the chain.
    if (t.slots[next].key.load(std::memory_order_acquire) != kEmpty) {
      expect = kEmpty;
      t.slots[i].key.compare_exchange_strong(expect, kTomb, std::memory_order_acq_rel);
      return;
    }
    i = (i - 1) & t.mask;
    if (t.slots[i].key.load(std::memory_order_acquire) != kTomb) {
      return;
    }
  }
}
}  // namespace

bool table_insert(BlockTable& t, uint64_t ptr, uint64_t tag, uint32_t reg, uint32_t* stale_reg) {
  *stale_reg = kNoReg;
  if (!t.slots || ptr <= kBusy) {
    return false;
  }
  const uint64_t h = home(t, ptr);
  int64_t reusable = -1;
  for (int p = 0; p < kMaxProbe; ++p) {
    const uint64_t i = (h + uint64_t(p)) & t.mask;
    BlockSlot& s = t.slots[i];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == ptr) {
      // An entry for this pointer whose free was never reported: replace it.
      if (s.key.compare_exchange_strong(k, kBusy, std::memory_order_acq_rel)) {
        *stale_reg = s.reg.load(std::memory_order_relaxed);
        publish(s, ptr, tag, reg);
        return true;
      }
      continue;
    }
    if (k == kTomb && reusable < 0) {
      reusable = int64_t(i);
    }
    if (k == kEmpty) {
      if (reusable < 0) {
        reusable = int64_t(i);
      }
      break;
    }
  }
  // Claim the first reusable slot of the chain (another writer may take it first).
  for (int p = 0; p < kMaxProbe && reusable >= 0; ++p) {
    const uint64_t i = (uint64_t(reusable) + uint64_t(p)) & t.mask;
    BlockSlot& s = t.slots[i];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if ((k == kEmpty || k == kTomb) &&
        s.key.compare_exchange_strong(k, kBusy, std::memory_order_acq_rel)) {
      publish(s, ptr, tag, reg);
      return true;
    }
  }
  return false;
}

bool table_remove(BlockTable& t, uint64_t ptr, uint64_t* tag, uint32_t* reg) {
  if (!t.slots || ptr <= kBusy) {
    return false;
  }
  const uint64_t h = home(t, ptr);
  for (int p = 0; p < kMaxProbe; ++p) {
    const uint64_t i = (h + uint64_t(p)) & t.mask;
    BlockSlot& s = t.slots[i];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == kEmpty) {
      return false;
    }
    if (k != ptr) {
      continue;
    }
    const uint64_t v = s.tag.load(std::memory_order_relaxed);
    const uint32_t r = s.reg.load(std::memory_order_relaxed);
    if (s.key.compare_exchange_strong(k, kTomb, std::memory_order_acq_rel)) {
      *tag = v;
      *reg = r;
      reclaim(t, i);
      return true;
    }
  }
  return false;
}

bool table_find(const BlockTable& t, uint64_t ptr, uint64_t* tag) {
  if (!t.slots || ptr <= kBusy) {
    return false;
  }
  const uint64_t h = home(t, ptr);
  for (int p = 0; p < kMaxProbe; ++p) {
    const BlockSlot& s = t.slots[(h + uint64_t(p)) & t.mask];
    const uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == kEmpty) {
      return false;
    }
    if (k == ptr) {
      const uint64_t v = s.tag.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.key.load(std::memory_order_relaxed) == ptr) {
        *tag = v;
        return true;
      }
    }
  }
  return false;
}

}  // namespace memprof
