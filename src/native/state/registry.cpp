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
//
// Also here: the readers of the registry (its statistics, the live blocks of a device),
// the block behind a tensor (memprof_tensor_block(s)), and the block table's self-test.

#include <cstring>
#include <thread>

#include "../internal.h"

namespace memprof {

// The entries (g_reg), their live counts by lane (g_reg_live), the iteration and the
// session births belong to (g_iter, g_session_id) and the own lane's free list
// (g_reg_own_free) are in HotState (internal.h).
namespace {
// Freed entries, to hand out again: those the own lane's thread freed (see Lane) in a
// list of its own (g_reg_own_free), pushed and popped by that thread alone with plain
// stores; those every other thread freed in a shared stack.
std::atomic<uint64_t> g_reg_free{0};  // ABA tag << 32 | (index + 1); 0 = empty
}  // namespace
std::atomic<uint32_t> g_reg_hw{0};      // entries ever handed out
std::atomic<int64_t> g_reg_dropped{0};  // births not registered: registry full

namespace {
// The shared free list and the high-water mark: other threads' births, and the training
// thread's once its own free list is empty (out of line: the training thread's steady
// iterations reuse their own entries).
[[gnu::noinline]] uint32_t reg_pop_shared() {
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

inline uint32_t reg_pop() {
  if (tls_hot.own_lane && g_reg_own_free != 0) {
    const uint32_t idx = g_reg_own_free - 1;
    g_reg_own_free = uint32_t(g_reg[idx].next.load(std::memory_order_relaxed));
    return idx;
  }
  return reg_pop_shared();
}

[[gnu::noinline]] void reg_push_shared(uint32_t idx) {
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

uint32_t reg_add_on(uint64_t ptr, int64_t size, uint32_t phase, int dev) {
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
  op_seq_block_origin(dev, size, &op, &layer);
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
  if (tls_hot.own_lane) {
    lane_add<true>(g_reg_live[kOwnLane], 1);
  } else {
    lane_add<false>(g_reg_live[kSharedLane], 1);
  }
  return idx;
}

void reg_remove_entry(uint32_t idx) {
  if (idx >= kRegCapacity || !g_reg) {
    return;
  }
  g_reg[idx].ptr.store(0, std::memory_order_release);
  if (tls_hot.own_lane) {
    lane_add<true>(g_reg_live[kOwnLane], -1);
    g_reg[idx].next.store(g_reg_own_free, std::memory_order_relaxed);
    g_reg_own_free = idx + 1;
  } else {
    lane_add<false>(g_reg_live[kSharedLane], -1);
    reg_push_shared(idx);
  }
}

// ---------------------------------------------------------------------------------
// The CUDA block table.

BlockTable g_cuda_blocks;
std::atomic<int64_t> g_cuda_untracked{0};
std::atomic<uint64_t> g_watched_frees[2] = {};

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
  s.watched.store(0, std::memory_order_relaxed);
  s.birth.store(0, std::memory_order_relaxed);
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
// A key was just published at slot `at`, its home `h`: lookups walk from h and stop at
// the first empty slot, so every slot between must hold something. A slot this insert
// passed while it was taken may have been freed and emptied by another thread's
// reclaim since (its successor was still empty then, and its re-check ran before this
// claim): walking back from `at`, such a slot becomes a tombstone again. A reclaim
// that empties one after this walk passed it sees its successor taken when it checks
// again, and restores it.
void keep_chain(BlockTable& t, uint64_t h, uint64_t at) {
  for (uint64_t i = at; i != h;) {
    i = (i - 1) & t.mask;
    uint64_t expect = kEmpty;
    t.slots[i].key.compare_exchange_strong(expect, kTomb, std::memory_order_acq_rel);
  }
}
}  // namespace

BlockSlot* table_insert(BlockTable& t, uint64_t ptr, uint64_t tag, uint32_t reg,
                        uint32_t* stale_reg) {
  *stale_reg = kNoReg;
  if (!t.slots || ptr <= kBusy) {
    return nullptr;
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
        // A watched block went (its free unreported): its address is reused.
        count_watched_free(s.watched.load(std::memory_order_relaxed));
        publish(s, ptr, tag, reg);
        return &s;
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
  // Claim the first reusable slot of the chain (another writer may take it first; a
  // slot a failed CAS finds free again, as reclaim leaves a tombstone, is tried again,
  // never passed).
  for (int p = 0; p < kMaxProbe && reusable >= 0; ++p) {
    const uint64_t i = (uint64_t(reusable) + uint64_t(p)) & t.mask;
    BlockSlot& s = t.slots[i];
    uint64_t k = s.key.load(std::memory_order_acquire);
    while (k == kEmpty || k == kTomb) {
      if (s.key.compare_exchange_strong(k, kBusy, std::memory_order_acq_rel)) {
        publish(s, ptr, tag, reg);
        keep_chain(t, h, i);
        return &s;
      }
    }
  }
  return nullptr;
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
    const uint32_t w = s.watched.load(std::memory_order_relaxed);
    if (s.key.compare_exchange_strong(k, kTomb, std::memory_order_acq_rel)) {
      *tag = v;
      *reg = r;
      count_watched_free(w);
      reclaim(t, i);
      return true;
    }
  }
  return false;
}

bool table_find(const BlockTable& t, uint64_t ptr, uint64_t* tag, uint32_t* birth) {
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
      const uint32_t b = s.birth.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.key.load(std::memory_order_relaxed) == ptr) {
        *tag = v;
        if (birth) {
          *birth = b;
        }
        return true;
      }
    }
  }
  return false;
}

bool table_watch(BlockTable& t, uint64_t ptr, uint32_t kind) {
  if (!t.slots || ptr <= kBusy) {
    return false;
  }
  const uint64_t h = home(t, ptr);
  for (int p = 0; p < kMaxProbe; ++p) {
    BlockSlot& s = t.slots[(h + uint64_t(p)) & t.mask];
    const uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == kEmpty) {
      return false;
    }
    if (k == ptr) {
      // The caller holds a tensor on this block: its entry stays while this runs.
      s.watched.store(kind, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------
// Readers.

void registry_stats(MpRegistry* out) {
  const uint32_t hw = g_reg_hw.load();
  out->capacity = g_reg ? kRegCapacity : 0;
  out->high_water = hw < kRegCapacity ? hw : kRegCapacity;
  out->live = g_reg_live[0].load() + g_reg_live[1].load();
  out->dropped = g_reg_dropped.load();
  out->entry_bytes = sizeof(RegEntry);
  out->on = g_origin_on.load() ? 1 : 0;
  out->pad = 0;
  out->learned_ops_bytes = op_seq_bytes();
  out->looked_up_ops = op_seq_looked_up();
}

void live_blocks(int32_t slot, MpLiveBlock* out, uint64_t cap, uint64_t* count) {
  *count = 0;
  if (!g_reg) {
    return;
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
    if (n < cap) {
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
  *count = n;
}

namespace {
int device_slot(const c10::Device& dev) {
  if (dev.is_cpu()) {
    return 0;
  }
  if (dev.is_cuda() && dev.index() >= 0 && dev.index() < kMaxCuda) {
    return 1 + dev.index();
  }
  return -1;
}
}  // namespace

namespace {
// The block of storage `st` (null: none), watched as `kind`: the second half of
// fill_block, which fill_blocks calls with the gradients' storages it already walked to.
void fill_storage(const c10::StorageImpl* st, uint32_t kind, MpBlock* out) {
  std::memset(out, 0, sizeof(MpBlock));
  out->device = -1;
  if (!st) {
    return;
  }
  const c10::DataPtr& dp = st->data_ptr();
  out->defined = 1;
  out->device = device_slot(dp.device());
  out->base = uint64_t(dp.get());
  out->bytes = int64_t(st->nbytes());
  if (dp.device().is_cpu()) {
    int64_t size = 0;
    uint32_t gen = 0;
    uint32_t phase = 0;
    uint32_t birth = 0;
    if (cpu_block_tag(dp, &size, &gen, &phase, kind, &birth)) {
      out->tracked = 1;
      out->watched = kind;
      out->bytes = size;
      out->generation = gen;
      out->phase = phase;
      out->birth_log = birth;
    }
  } else if (dp.device().is_cuda()) {
    out->bytes = cuda_round(int64_t(st->nbytes()));
    uint64_t tag = 0;
    uint32_t birth = 0;
    if (table_find(g_cuda_blocks, out->base, &tag, &birth)) {
      out->tracked = 1;
      out->birth_log = birth;
      out->watched = (kind != MP_WATCH_NONE && table_watch(g_cuda_blocks, out->base, kind))
          ? kind
          : MP_WATCH_NONE;
      out->bytes = slot_bytes(tag);
      out->generation = slot_gen(tag);
      out->phase = slot_phase(tag);
    }
  }
}

}  // namespace

// The block behind `t0` (or behind its .grad): what memprof_tensor_block(s) report.
void fill_block(const at::Tensor& t0, bool grad, MpBlock* out, bool watch) {
  const uint32_t kind = !watch ? MP_WATCH_NONE : grad ? MP_WATCH_GRAD : MP_WATCH_VARIABLE;
  if (!t0.defined()) {
    fill_storage(nullptr, kind, out);
    return;
  }
  // References, not copies: no reference-count traffic on every variable's tensor. The
  // gradient straight from the TensorImpl: Tensor::grad() also asks whether the tensor
  // is a leaf that retains its gradient, only to warn, at every variable of every step.
  const at::Tensor& t = grad ? t0.unsafeGetTensorImpl()->grad() : t0;
  const bool stored = t.defined() && t.has_storage();
  fill_storage(stored ? t.storage().unsafeGetStorageImpl() : nullptr, kind, out);
}

namespace {
// Asks for the cache line at `p` (a hint: never faults, whatever the address).
inline void prefetch(const void* p) {
  __builtin_prefetch(p);
}
}  // namespace

void fill_blocks(const void* const* tensors, size_t n, MpBlock* blocks, MpBlock* grads,
                 int32_t flags) {
  const bool watch = (flags & MP_BLOCKS_WATCH) != 0;
  const bool grads_only = (flags & MP_BLOCKS_GRADS_ONLY) != 0;
  // Each variable is a chain of dependent loads (handle, TensorImpl, autograd meta,
  // the gradient's TensorImpl, its StorageImpl, the block header): one after another,
  // thousands of variables cost a cache miss per link. So a batch of variables is
  // walked link by link, the same link of every variable of the batch at once: those
  // loads do not depend on each other, and their misses overlap. The last pass reads
  // what the earlier ones brought into the cache.
  constexpr size_t kBatch = 16;
  const c10::TensorImpl* impl[kBatch];
  const c10::TensorImpl* gimpl[kBatch];
  const c10::StorageImpl* st[kBatch];
  for (size_t b0 = 0; b0 < n; b0 += kBatch) {
    const size_t m = std::min(kBatch, n - b0);
    for (size_t i = 0; i < m; ++i) {
      prefetch(tensors[b0 + i]);
    }
    for (size_t i = 0; i < m; ++i) {
      const at::Tensor& t = *static_cast<const at::Tensor*>(tensors[b0 + i]);
      impl[i] = t.defined() ? t.unsafeGetTensorImpl() : nullptr;
      if (impl[i]) {
        prefetch(&impl[i]->unsafe_storage());
      }
    }
    for (size_t i = 0; i < m; ++i) {
      if (!impl[i]) {
        continue;
      }
      if (!grads_only && impl[i]->has_storage()) {
        prefetch(impl[i]->unsafe_storage().unsafeGetStorageImpl());
      }
      if (const c10::AutogradMetaInterface* meta = impl[i]->autograd_meta()) {
        prefetch(meta);
      }
    }
    for (size_t i = 0; i < m; ++i) {
      const c10::AutogradMetaInterface* meta = impl[i] ? impl[i]->autograd_meta() : nullptr;
      const at::Tensor* g = meta ? &meta->grad() : nullptr;
      gimpl[i] = g && g->defined() ? g->unsafeGetTensorImpl() : nullptr;
      if (gimpl[i]) {
        prefetch(&gimpl[i]->unsafe_storage());
      }
    }
    for (size_t i = 0; i < m; ++i) {
      st[i] = gimpl[i] && gimpl[i]->has_storage()
          ? gimpl[i]->unsafe_storage().unsafeGetStorageImpl()
          : nullptr;
      if (st[i]) {
        prefetch(st[i]);
      }
    }
    for (size_t i = 0; i < m; ++i) {
      if (st[i] && st[i]->device_type() == c10::DeviceType::CPU) {
        // The tracking allocator's header ends where the data begins.
        prefetch(static_cast<const char*>(st[i]->data_ptr().get()) - 8);
      }
    }
    for (size_t i = 0; i < m; ++i) {
      const at::Tensor& t = *static_cast<const at::Tensor*>(tensors[b0 + i]);
      if (!grads_only) {
        fill_block(t, false, &blocks[b0 + i], watch);
      }
      // The gradient's storage, walked to above (null: no gradient, or none stored).
      fill_storage(st[i], watch ? MP_WATCH_GRAD : MP_WATCH_NONE, &grads[b0 + i]);
    }
  }
}

// ---------------------------------------------------------------------------------
// The block table's self-test (memprof_selftest_block_table): two writers on one
// table of its own; *errors counts every check that failed.

namespace {
// Adopts the block behind `t` (see adopt_blocks); the bytes adopted, 0 if none.
int64_t adopt_one(const at::Tensor& t, uint32_t gen, uint32_t phase) {
  if (!t.defined() || !t.has_storage()) {
    return 0;
  }
  const c10::DataPtr& dp = t.storage().data_ptr();
  const int dev = device_slot(dp.device());
  if (dev < 0 || !dp.get()) {
    return 0;
  }
  int64_t size = 0;
  if (dp.device().is_cpu()) {
    if (!cpu_adopt(dp, gen, phase, &size)) {
      return 0;
    }
  } else {
    const uint64_t key = uint64_t(dp.get());
    uint64_t tag = 0;
    if (!g_cuda_blocks.slots || table_find(g_cuda_blocks, key, &tag)) {
      return 0;
    }
    // A storage's block is the allocator's block for its bytes (the same rounding the
    // estimate models): what the reporter will report when it is freed.
    size = cuda_round(int64_t(t.storage().nbytes()));
    uint32_t stale = kNoReg;
    if (!table_insert(g_cuda_blocks, key, pack(gen, phase, size), kNoReg, &stale)) {
      g_cuda_untracked.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    reg_remove(stale);
  }
  count_birth(g_dev[dev], size, gen, phase, false);
  steplog_add_start_live(dev, size);
  return size;
}
}  // namespace

void forget_cuda_blocks() {
  // No reporter is installed between sessions, so the frees of that time went unseen:
  // what the table holds may name blocks long gone, and their addresses reused. A new
  // session starts from what it can know, as a first one does (the variables, adopted).
  if (g_cuda_blocks.slots) {
    for (uint64_t i = 0; i <= g_cuda_blocks.mask; ++i) {
      BlockSlot& s = g_cuda_blocks.slots[i];
      const uint64_t k = s.key.load(std::memory_order_relaxed);
      if (k == kEmpty) {
        continue;  // read only: untouched pages stay uncommitted
      }
      if (k != kTomb) {
        reg_remove(s.reg.load(std::memory_order_relaxed));
      }
      s.tag.store(0, std::memory_order_relaxed);
      s.reg.store(kNoReg, std::memory_order_relaxed);
      s.watched.store(0, std::memory_order_relaxed);
      s.key.store(kEmpty, std::memory_order_release);
    }
  }
  for (int dev = 1; dev <= kMaxCuda; ++dev) {
    DeviceState& d = g_dev[dev];
    reset_live(d);
    // The allocator's counters as last reported, in the session before: unknown now
    // (the first report of this session, or the allocator's own statistics, tell).
    d.reported_allocated.store(-1);
    d.reported_reserved.store(-1);
  }
}

void adopt_blocks(const void* const* tensors, size_t n, int64_t* bytes) {
  *bytes = 0;
  // Born before the session's first generation, in the forward phase (as a model built
  // before the loop is on the CPU).
  const uint32_t gen = cur_gen(g_genphase.load()) - 1;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = *static_cast<const at::Tensor*>(tensors[i]);
    *bytes += adopt_one(t, gen, kForward);
    if (t.defined()) {
      *bytes += adopt_one(t.grad(), gen, kForward);
    }
  }
}

int selftest_block_table(uint64_t n, uint64_t* errors) {
  uint64_t slots = 64;
  while (slots < 4 * n) {
    slots <<= 1;
  }
  BlockTable t;
  t.slots = reserve<BlockSlot>(slots);
  t.mask = slots - 1;
  if (!t.slots) {
    set_error("mmap failed");
    return -1;
  }
  std::atomic<uint64_t> bad{0};
  // Two writers on disjoint keys, each: insert all, find all, remove every other,
  // check, re-insert (reusing tombstones), then remove all. The odd keys' inserters
  // set their births, as the CUDA reporter does for a block born in backward; the even
  // keys' must read 0, whatever slot they reuse.
  auto worker = [&](uint64_t base) {
    auto key = [&](uint64_t k) { return base + 512 * k; };
    auto birth = [](uint64_t k) { return k % 2 ? uint32_t(k + 1) : 0u; };
    uint32_t stale = 0;
    for (uint64_t k = 0; k < n; ++k) {
      BlockSlot* s =
          table_insert(t, key(k), pack(uint32_t(k), 1, int64_t(k) * 512 + 512), uint32_t(k), &stale);
      if (!s || stale != kNoReg) {
        bad.fetch_add(1);
      } else if (birth(k)) {
        s->birth.store(birth(k), std::memory_order_relaxed);
      }
    }
    for (int round = 0; round < 2; ++round) {
      for (uint64_t k = 0; k < n; ++k) {
        uint64_t tag = 0;
        uint32_t b = 7;
        if (!table_find(t, key(k), &tag, &b) || slot_bytes(tag) != int64_t(k) * 512 + 512 ||
            slot_gen(tag) != (uint32_t(k) & uint32_t(kGenMask)) || b != birth(k)) {
          bad.fetch_add(1);
        }
      }
      for (uint64_t k = round; k < n; k += 2) {
        uint64_t tag = 0;
        uint32_t reg = 0;
        if (!table_remove(t, key(k), &tag, &reg) || reg != uint32_t(k)) {
          bad.fetch_add(1);
        }
        if (table_find(t, key(k), &tag)) {
          bad.fetch_add(1);
        }
      }
      for (uint64_t k = round; k < n; k += 2) {
        BlockSlot* s =
            table_insert(t, key(k), pack(uint32_t(k), 1, int64_t(k) * 512 + 512), uint32_t(k), &stale);
        if (!s) {
          bad.fetch_add(1);
        } else if (birth(k)) {
          s->birth.store(birth(k), std::memory_order_relaxed);
        }
      }
    }
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t tag = 0;
      uint32_t reg = 0;
      if (!table_remove(t, key(k), &tag, &reg)) {
        bad.fetch_add(1);
      }
    }
  };
  std::thread a(worker, uint64_t(1) << 40);
  std::thread b(worker, (uint64_t(1) << 40) + 256);
  a.join();
  b.join();
  // Everything removed: every tombstone must have become an empty slot again.
  for (uint64_t i = 0; i < slots; ++i) {
    if (t.slots[i].key.load() != 0) {
      bad.fetch_add(1);
    }
  }
  *errors = bad.load();
  return 0;
}

}  // namespace memprof
