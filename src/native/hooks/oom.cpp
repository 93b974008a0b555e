// Out-of-memory reports: the Rust report writer, registered through
// memprof_set_oom_callback and called by the allocation hooks (CPU and CUDA) when an
// allocation fails, at most one call at a time. Off the hot path: it runs only on a
// failed allocation, outside the hook's scope.

#include <thread>

#include "../internal.h"

namespace memprof {

namespace {
std::atomic<MpOomCallback> g_oom_callback{nullptr};
std::atomic<void*> g_oom_ctx{nullptr};
std::atomic<int> g_oom_busy{0};
}  // namespace

void fire_oom(int slot, int64_t requested, int64_t allocated, int64_t reserved) {
  if (g_oom_busy.exchange(1) != 0) {
    return;  // one report at a time
  }
  const MpOomCallback cb = g_oom_callback.load();
  if (cb) {
    try {
      cb(g_oom_ctx.load(), slot, requested, allocated, reserved);
    } catch (...) {
    }
  }
  g_oom_busy.store(0);
}

void set_oom_callback(MpOomCallback cb, void* ctx) {
  g_oom_callback.store(nullptr);
  while (g_oom_busy.load() != 0) {
    std::this_thread::yield();
  }
  g_oom_ctx.store(ctx);
  g_oom_callback.store(cb);
}

}  // namespace memprof
