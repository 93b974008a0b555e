// The event logs: the backward log, the step log (timeline) and the memory history.
// Each is reserved once with mmap at its largest and touched only as it fills.

#include <sys/mman.h>
#include <time.h>

#include "internal.h"

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
std::atomic<bool> g_steplog_on{false};
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
  g_steplog_start_live.store(g_dev[g_steplog_device.load()].live.load());
  g_steplog_len.store(0);
}

MpHistEvent* g_hist = nullptr;
std::atomic<bool> g_hist_on{false};
std::atomic<uint64_t> g_hist_len{0};
std::atomic<uint64_t> g_hist_cap{0};

void hist_append(int dev, uint64_t ptr, int64_t delta) {
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

}  // namespace memprof
