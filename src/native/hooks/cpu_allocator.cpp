// The tracking CPU allocator: wraps c10's CPU allocation, installed when the library
// loads (before the user's model is built), process-wide.
//
// Each block has a header in front of the data (data == context, as c10 requires):
// [base ... header (kHeader bytes, holds the tag) | data ...]. The header size is the
// alignment c10 would use, so the data keeps c10's alignment.

#include <algorithm>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include "../internal.h"

namespace memprof {

std::atomic<bool> g_cpu_installed{false};

// The CUDA-like test mode (memprof_forget_cpu_blocks): blocks of an earlier epoch are
// unknown, as CUDA blocks born before the session's reporter was pushed are
// (g_cpu_forget, g_cpu_epoch: in HotState, internal.h).

namespace {
constexpr uint64_t kMagic = 0x6d656d70726f6631ull;  // "memprof1"

struct BlockHeader {
  uint64_t magic;
  uint64_t size;        // bytes requested by the tensor
  uint64_t head_bytes;  // distance from base to data
  uint32_t gen;
  uint32_t phase;
  uint32_t reg;         // live-block registry entry, kNoReg if not registered
  uint32_t watched;     // MpWatch: its free counts in g_watched_frees
  uint32_t epoch;       // g_cpu_epoch at its birth (or adoption)
  uint32_t birth;       // MpBlock's birth_log: 1 + its place in the backward log, or 0
};
static_assert(sizeof(BlockHeader) <= 64, "header fits the minimum alignment");

inline BlockHeader* header_of(void* data) {
  return reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - sizeof(BlockHeader));
}

inline bool forgotten(const BlockHeader* h) {
  return g_cpu_forget.load(std::memory_order_relaxed) &&
         h->epoch != g_cpu_epoch.load(std::memory_order_relaxed);
}

void tracked_delete(void* data) {
  if (!data) {
    return;
  }
  // The header's line and the one before it, where malloc keeps the chunk's size that
  // free() reads, are cold for most blocks freed (activations in backward, last
  // iteration's gradients): both loads start now and overlap, rather than free()'s
  // waiting behind the header's. The header is nearly always 64 bytes (c10's alignment),
  // and a prefetch of a wrong line costs nothing.
  __builtin_prefetch(static_cast<char*>(data) - 64 - 16);
  HookScope hook;
  BlockHeader* h = header_of(data);
  void* base = static_cast<char*>(data) - h->head_bytes;
  if (h->magic == kMagic && forgotten(h)) {
    // Unknown to the accounting, as CUDA's reporter ignores frees it never saw born.
    reg_remove(h->reg);
  } else if (h->magic == kMagic) {
    phase_for_free();
    on_free(0, uint64_t(data), int64_t(h->size), h->gen, h->phase);
    count_watched_free(h->watched);
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
    // c10 aligns a block to 64 bytes (gAlignment) below its transparent-huge-page
    // threshold (gAlloc_threshold_thp, 2 MiB), whether huge pages are enabled or not;
    // only larger blocks ask c10 (a call into libc10 at every allocation of a step of
    // small ops, most of them well below it).
    constexpr size_t kThpThreshold = size_t(2) << 20;
    size_t head = 64;
    if (n >= kThpThreshold) {
      head = std::max<size_t>(c10::c10_compute_alignment(n), 64);
    }
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(n + head);  // throws c10::Error on failure, like c10's
    } catch (...) {
      // Outside the hook scope: the report writer is not the hook.
      fire_oom(0, int64_t(n), g_dev[0].live(), 0);
      throw;
    }
    // One scope, opened after c10's allocation (a second one around that call, which
    // cannot come back here, cost a thread-local read-modify-write and its checks).
    HookScope hook;
    void* data = static_cast<char*>(base) + head;
    const uint64_t gp = phase_for_alloc();
    BlockHeader* h = header_of(data);
    h->magic = kMagic;
    h->size = n;
    h->head_bytes = head;
    h->gen = cur_gen(gp);
    h->phase = cur_phase(gp);
    h->watched = 0;
    h->epoch = g_cpu_epoch.load(std::memory_order_relaxed);
    h->reg = reg_add(uint64_t(data), int64_t(n), h->phase, 0);
    hist_append(0, uint64_t(data), int64_t(n));
    h->birth = on_alloc(0, uint64_t(data), int64_t(n), h->gen, h->phase);
    return {data, data, &tracked_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &tracked_delete;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// Constructed on first use (not a global with a dynamic initialiser, whose order
// against the library's load-time initialiser would be unspecified).
TrackingCpuAllocator* tracking_allocator() {
  static TrackingCpuAllocator a;
  return &a;
}
}  // namespace

void install_cpu_allocator() {
  c10::SetCPUAllocator(tracking_allocator(), /*priority=*/100);
  g_cpu_installed.store(c10::GetCPUAllocator() == tracking_allocator());
}

bool cpu_block_tag(const c10::DataPtr& dp, int64_t* size, uint32_t* gen, uint32_t* phase,
                   uint32_t watch, uint32_t* birth) {
  if (dp.get_deleter() != &tracked_delete || !dp.get()) {
    return false;
  }
  BlockHeader* h = header_of(dp.get());
  if (h->magic != kMagic || forgotten(h)) {
    return false;
  }
  *size = int64_t(h->size);
  *gen = h->gen;
  *phase = h->phase;
  if (birth) {
    *birth = h->birth;
  }
  if (watch != MP_WATCH_NONE && h->watched != watch) {
    // The caller holds a tensor on this block: it cannot be freed meanwhile.
    h->watched = watch;
  }
  return true;
}

void forget_cpu_blocks() {
  g_cpu_epoch.fetch_add(1, std::memory_order_relaxed);
  g_cpu_forget.store(true, std::memory_order_relaxed);
  // Counted from now on, as CUDA's counters start with the reporter.
  reset_live(g_dev[0]);
}

bool cpu_adopt(const c10::DataPtr& dp, uint32_t gen, uint32_t phase, int64_t* size) {
  if (dp.get_deleter() != &tracked_delete || !dp.get()) {
    return false;
  }
  BlockHeader* h = header_of(dp.get());
  if (h->magic != kMagic || !forgotten(h)) {
    return false;
  }
  reg_remove(h->reg);
  h->reg = kNoReg;
  h->epoch = g_cpu_epoch.load(std::memory_order_relaxed);
  h->gen = gen;
  h->phase = phase;
  h->birth = 0;
  *size = int64_t(h->size);
  return true;
}

void reenter_cpu_hook() {
  HookScope hook;
  // What a hook must never do: allocate through the allocator it watches.
  c10::DataPtr p = tracking_allocator()->allocate(16);
}

}  // namespace memprof
