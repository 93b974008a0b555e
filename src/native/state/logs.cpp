// The event logs: the backward log, the step log (timeline) and the memory history.
// Each is reserved once with mmap at its largest and touched only as it fills. Also
// here: their readers (copies for the Rust side) and the memory history's start and
// stop.

#include <sys/mman.h>
#include <time.h>

#include <cstring>

#include "../internal.h"

namespace memprof {

void* reserve_pages(size_t bytes) {
  void* mem = mmap(
      nullptr,
      bytes,
      PROT_READ | PROT_WRITE,
      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
      -1,
      0);
  return mem == MAP_FAILED ? nullptr : mem;
}

MpLogEvent* g_log = nullptr;
std::atomic<uint64_t> g_log_len{0};

MpTlEvent* g_steplog = nullptr;
std::atomic<uint64_t> g_steplog_len{0};
std::atomic<int32_t> g_op_counter{0};
std::atomic<int32_t> g_last_op{-1};
std::atomic<uint32_t> g_step_id{1};
std::atomic<int32_t> g_steplog_device{0};
std::atomic<uint32_t> g_steplog_start_gen{0};
std::atomic<int64_t> g_steplog_start_live{0};

void begin_steplog(uint32_t gen) {
  g_step_id.fetch_add(1);
  g_op_counter.store(0);
  g_last_op.store(-1);
  g_steplog_start_gen.store(gen);
  g_steplog_start_live.store(g_dev[g_steplog_device.load()].live());
  g_steplog_len.store(0);
}

void steplog_uncount(uint64_t from, int32_t op) {
  if (!g_steplog) {
    return;
  }
  const uint64_t len = g_steplog_len.load(std::memory_order_relaxed);
  const uint64_t n = len < kStepLogCapacity ? len : kStepLogCapacity;
  for (uint64_t i = from; i < n; ++i) {
    MpTlEvent& e = g_steplog[i];
    if (e.kind == MP_EV_FLOPS && e.op == op) {
      e.kind = MP_EV_UNCOUNTED;
      e.value = 0;
    }
  }
}

void steplog_add_start_live(int dev, int64_t bytes) {
  if (g_steplog_on.load() && dev == g_steplog_device.load()) {
    g_steplog_start_live.fetch_add(bytes);
  }
}

// The step log's entry for a block's birth or death (internal.h's steplog_block_event).
void steplog_block_event_on(
    uint8_t kind, int dev, uint64_t ptr, int64_t delta, uint32_t gen, uint32_t phase) {
  int32_t site = 0;
  if (kind == MP_EV_ALLOC && g_detail_on.load(std::memory_order_relaxed) &&
      dev == g_steplog_device.load(std::memory_order_relaxed)) {
    site = take_site(2);  // this function's frame too
  }
  if (kind == MP_EV_ALLOC && !g_origin_on.load(std::memory_order_relaxed)) {
    // The timeline without leak hunting: the block takes its place in the learned
    // sequence (learned, or checked: a block of another size parts), as the
    // registry's do with it.
    int32_t op = -1;
    int32_t layer = -1;
    op_seq_block_origin(dev, delta, &op, &layer);
  }
  steplog_append(MpTlEvent{
      kind, uint8_t(phase), uint8_t(dev), 0, gen, current_op(), site, ptr, delta});
}

MpHistEvent* g_hist = nullptr;
std::atomic<uint64_t> g_hist_len{0};
std::atomic<uint64_t> g_hist_cap{0};

void hist_append_on(int dev, uint64_t ptr, int64_t delta) {
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
  g_hist[i % cap] = MpHistEvent{ptr, delta, op, layer, (us << 8) | uint64_t(dev & 0xff)};
}

// ---------------------------------------------------------------------------------
// Readers.

void timeline_header(MpTimelineHeader* out) {
  out->len = g_steplog_len.load(std::memory_order_acquire);
  out->capacity = g_steplog ? kStepLogCapacity : 0;
  out->start_generation = g_steplog_start_gen.load();
  out->ops = g_op_counter.load();
  out->start_live = g_steplog_start_live.load();
  out->on = g_steplog_on.load() ? 1 : 0;
  out->device = g_steplog_device.load();
  out->records = op_seq_records();
  out->learning = op_seq_learning() ? 1 : 0;
}

void log_view(const MpLogEvent** events, uint64_t* len, uint64_t* total) {
  const uint64_t n = g_log_len.load(std::memory_order_acquire);
  *events = g_log;
  *len = g_log ? (n < kLogCapacity ? n : kLogCapacity) : 0;
  *total = n;
}

void read_timeline(MpTlEvent* out, uint64_t cap, uint64_t* total) {
  const uint64_t n = g_steplog_len.load(std::memory_order_acquire);
  const uint64_t avail = n < kStepLogCapacity ? n : kStepLogCapacity;
  const uint64_t c = avail < cap ? avail : cap;
  if (g_steplog && c > 0) {
    std::memcpy(out, g_steplog, c * sizeof(MpTlEvent));
  }
  *total = n;
}

void read_history(MpHistEvent* out, uint64_t cap, uint64_t* total, uint64_t* ring) {
  const uint64_t len = g_hist_len.load(std::memory_order_acquire);
  const uint64_t r = g_hist ? g_hist_cap.load() : 0;
  *total = len;
  *ring = r;
  if (r == 0) {
    return;
  }
  const uint64_t n = len < r ? len : r;
  const uint64_t c = n < cap ? n : cap;
  const uint64_t first = len - c;  // the newest c events
  for (uint64_t k = 0; k < c; ++k) {
    out[k] = g_hist[(first + k) % r];
  }
}

// Starts (clearing it) or stops the memory history; `max_entries` (1..2^24) is the
// ring's size when starting.
int set_history(bool on, uint64_t max_entries) {
  if (!on) {
    g_hist_on.store(false);
    g_origin_on.store(session_leaks_requested());
    op_callback_want_functions(MP_TARGET_STEP, step_records_ops());
    return 0;
  }
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
  op_seq_stop_blocks();  // the history's events take their op from records
  op_callback_want_functions(MP_TARGET_STEP, true);  // the origins are ops
  return 0;
}

}  // namespace memprof
