// The C ABI (declared in memprof.h) and the load-time initialiser. Every function is
// noexcept and runs behind guarded(), which turns any C++ exception into -1 and a
// message in the calling thread's last-error slot. A function here checks the pointers
// its caller must give and calls into its subsystem, whose file its Rust mirror in
// src/ffi/ names: state/ (session.cpp, logs.cpp, registry.cpp, names.cpp, process.cpp,
// amp.cpp) and hooks/ (cuda.cpp, oom.cpp, cpu_allocator.cpp); the estimator's (dryrun/,
// script/, program/) are in api_estimate.cpp.

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "internal.h"
#include "guarded.h"

namespace memprof {

namespace {
thread_local std::string tls_last_error;

// Runs at library load, before main and so before the user's model is built. It
// touches only globals that are constant-initialised (set before any dynamic
// initialiser runs), so its order against other files' initialisers does not matter.
struct Init {
  Init() {
    init_slots();
    g_log = reserve<MpLogEvent>(kLogCapacity);
    g_steplog = reserve<MpTlEvent>(kStepLogCapacity);
    g_sites = reserve<MpSite>(kSiteCapacity);
    g_reg = reserve<RegEntry>(kRegCapacity);  // zero pages: every entry starts free
    g_hist = reserve<MpHistEvent>(kHistMax);
    if (!getenv("TCH_MEMPROF_DISABLE")) {
      try {
        install_cpu_allocator();
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
}  // namespace

void set_error(const char* what) noexcept {
  try {
    tls_last_error = what ? what : "unknown error";
  } catch (...) {
  }
}

bool given(const void* p, const char* what) {
  if (!p) {
    set_error((std::string(what) + ": null pointer").c_str());
    return false;
  }
  return true;
}

}  // namespace memprof

using namespace memprof;

extern "C" {

int memprof_last_error(char* buf, size_t len, size_t* needed) noexcept {
  const size_t n = tls_last_error.size();
  if (needed) {
    *needed = n;
  }
  if (buf && len > 0) {
    const size_t c = n < len - 1 ? n : len - 1;
    std::memcpy(buf, tls_last_error.data(), c);
    buf[c] = 0;
  }
  return 0;
}

// ---------------------------------------------------------------------------------
// The session (session.cpp).

int memprof_start(int32_t want_cuda, int32_t timeline_slot, int32_t leaks) noexcept {
  return guarded("memprof_start", [&]() -> int {
    return session_start(want_cuda, timeline_slot, leaks);
  });
}

int memprof_stop(void) noexcept {
  return guarded("memprof_stop", [&]() -> int {
    session_stop();
    return 0;
  });
}

// Ends the current iteration and starts the next one in the forward phase: resets the
// per-iteration peaks, the feature maps and the backward log.
int memprof_begin_iteration(void) noexcept {
  return guarded("memprof_begin_iteration", [&]() -> int { return begin_iteration(); });
}

int memprof_state(MpState* out) noexcept {
  return guarded("memprof_state", [&]() -> int {
    if (!given(out, "memprof_state")) {
      return -1;
    }
    read_state(out);
    return 0;
  });
}

int memprof_device_stats(int32_t slot, MpDeviceStats* out) noexcept {
  return guarded("memprof_device_stats", [&]() -> int {
    if (!given(out, "memprof_device_stats")) {
      return -1;
    }
    if (slot < 0 || slot >= kMaxDevices) {
      set_error("device slot out of range");
      return -1;
    }
    read_device_stats(slot, out);
    return 0;
  });
}

// ---------------------------------------------------------------------------------
// The live-block registry and tensors' blocks (registry.cpp).

int memprof_registry(MpRegistry* out) noexcept {
  return guarded("memprof_registry", [&]() -> int {
    if (!given(out, "memprof_registry")) {
      return -1;
    }
    registry_stats(out);
    return 0;
  });
}

int memprof_live_blocks(int32_t slot, MpLiveBlock* out, uint64_t cap, uint64_t* count) noexcept {
  return guarded("memprof_live_blocks", [&]() -> int {
    if (!given(count, "memprof_live_blocks") || (cap > 0 && !given(out, "memprof_live_blocks"))) {
      return -1;
    }
    live_blocks(slot, out, cap, count);
    return 0;
  });
}

int memprof_tensor_block(const void* tensor, int32_t grad, MpBlock* out) noexcept {
  return guarded("memprof_tensor_block", [&]() -> int {
    if (!given(out, "memprof_tensor_block") || !given(tensor, "memprof_tensor_block")) {
      return -1;
    }
    fill_block(*static_cast<const at::Tensor*>(tensor), grad != 0, out);
    return 0;
  });
}

int memprof_tensor_blocks(const void* const* tensors, size_t n, MpBlock* blocks,
                          MpBlock* grads, int32_t flags, uint64_t* frees) noexcept {
  return guarded("memprof_tensor_blocks", [&]() -> int {
    if (!given(frees, "memprof_tensor_blocks")) {
      return -1;
    }
    // Before the reads: a watched block freed while they run changes the count after.
    frees[0] = g_watched_frees[0].load(std::memory_order_acquire);
    frees[1] = g_watched_frees[1].load(std::memory_order_acquire);
    if (n == 0) {
      return 0;
    }
    if (!given(tensors, "memprof_tensor_blocks") || !given(grads, "memprof_tensor_blocks") ||
        (!(flags & MP_BLOCKS_GRADS_ONLY) && !given(blocks, "memprof_tensor_blocks"))) {
      return -1;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!tensors[i]) {
        set_error("memprof_tensor_blocks: a null tensor handle");
        return -1;
      }
    }
    fill_blocks(tensors, n, blocks, grads, flags);
    return 0;
  });
}

int memprof_watched_frees(uint64_t* out) noexcept {
  return guarded("memprof_watched_frees", [&]() -> int {
    if (!given(out, "memprof_watched_frees")) {
      return -1;
    }
    out[0] = g_watched_frees[0].load(std::memory_order_acquire);
    out[1] = g_watched_frees[1].load(std::memory_order_acquire);
    return 0;
  });
}

int memprof_adopt_blocks(const void* const* tensors, size_t n, int64_t* bytes) noexcept {
  return guarded("memprof_adopt_blocks", [&]() -> int {
    if (!given(bytes, "memprof_adopt_blocks") ||
        (n > 0 && !given(tensors, "memprof_adopt_blocks"))) {
      return -1;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!tensors[i]) {
        set_error("memprof_adopt_blocks: a null tensor handle");
        return -1;
      }
    }
    adopt_blocks(tensors, n, bytes);
    return 0;
  });
}

int memprof_forget_cpu_blocks(void) noexcept {
  return guarded("memprof_forget_cpu_blocks", [&]() -> int {
    forget_cpu_blocks();
    return 0;
  });
}

int memprof_cuda_report_cost(uint64_t n, int32_t other_thread, uint64_t* ns) noexcept {
  return guarded("memprof_cuda_report_cost", [&]() -> int {
    if (!given(ns, "memprof_cuda_report_cost")) {
      return -1;
    }
    return cuda_report_cost(n, other_thread, ns);
  });
}

int memprof_selftest_block_table(uint64_t n, uint64_t* errors) noexcept {
  return guarded("memprof_selftest_block_table", [&]() -> int {
    if (!given(errors, "memprof_selftest_block_table")) {
      return -1;
    }
    return selftest_block_table(n, errors);
  });
}

// ---------------------------------------------------------------------------------
// The logs (logs.cpp).

int memprof_timeline_header(MpTimelineHeader* out) noexcept {
  return guarded("memprof_timeline_header", [&]() -> int {
    if (!given(out, "memprof_timeline_header")) {
      return -1;
    }
    timeline_header(out);
    return 0;
  });
}

int memprof_log_view(const MpLogEvent** events, uint64_t* len, uint64_t* total) noexcept {
  return guarded("memprof_log_view", [&]() -> int {
    if (!given(events, "memprof_log_view") || !given(len, "memprof_log_view") ||
        !given(total, "memprof_log_view")) {
      return -1;
    }
    log_view(events, len, total);
    return 0;
  });
}

int memprof_set_detail(int32_t on) noexcept {
  return guarded("memprof_set_detail", [&]() -> int { return set_detail(on != 0); });
}

int memprof_relearn() noexcept {
  return guarded("memprof_relearn", [&]() -> int {
    op_seq_relearn();
    return 0;
  });
}

int memprof_site(uint64_t id, MpSite* out) noexcept {
  return guarded("memprof_site", [&]() -> int {
    if (!given(out, "memprof_site")) {
      return -1;
    }
    return read_site(id, out);
  });
}

int memprof_read_timeline(MpTlEvent* out, uint64_t cap, uint64_t* total) noexcept {
  return guarded("memprof_read_timeline", [&]() -> int {
    if (!given(total, "memprof_read_timeline") ||
        (cap > 0 && !given(out, "memprof_read_timeline"))) {
      return -1;
    }
    read_timeline(out, cap, total);
    return 0;
  });
}

int memprof_read_history(MpHistEvent* out, uint64_t cap, uint64_t* total, uint64_t* ring) noexcept {
  return guarded("memprof_read_history", [&]() -> int {
    if (!given(total, "memprof_read_history") || !given(ring, "memprof_read_history") ||
        (cap > 0 && !given(out, "memprof_read_history"))) {
      return -1;
    }
    read_history(out, cap, total, ring);
    return 0;
  });
}

// Starts (clearing it) or stops the memory history; `max_entries` (1..2^24) is the
// ring's size when starting.
int memprof_history(int32_t on, uint64_t max_entries) noexcept {
  return guarded("memprof_history", [&]() -> int { return set_history(on != 0, max_entries); });
}

// ---------------------------------------------------------------------------------
// Names and scopes (names.cpp); parameters (hooks/ops.cpp).

int memprof_name(int32_t id, char* buf, size_t len, int64_t* name_len) noexcept {
  return guarded("memprof_name", [&]() -> int {
    if (!given(name_len, "memprof_name")) {
      return -1;
    }
    *name_len = copy_name(id, buf, len);
    return 0;
  });
}

int memprof_intern(const char* name, int32_t* id) noexcept {
  return guarded("memprof_intern", [&]() -> int {
    if (!given(name, "memprof_intern") || !given(id, "memprof_intern")) {
      return -1;
    }
    return intern_checked(name, id);
  });
}

int memprof_set_params(int32_t target, const uint64_t* ptrs, const int32_t* ids, const int32_t* layers,
                       size_t n) noexcept {
  return guarded("memprof_set_params", [&]() -> int { return set_params(target, ptrs, ids, layers, n); });
}

// Scopes name the layer of the ops run on this thread until the matching pop.
int memprof_scope_push(int32_t id) noexcept {
  return guarded("memprof_scope_push", [&]() -> int { return scope_push(id); });
}

int memprof_scope_pop(void) noexcept {
  return guarded("memprof_scope_pop", [&]() -> int { return scope_pop(); });
}

// ---------------------------------------------------------------------------------
// Out-of-memory reports (oom.cpp).

// Sets (or clears, with a null cb) the out-of-memory report writer. Returns once no
// call of the previous one is running, so its context may be freed after.
int memprof_set_oom_callback(MpOomCallback cb, void* ctx) noexcept {
  return guarded("memprof_set_oom_callback", [&]() -> int {
    set_oom_callback(cb, ctx);
    return 0;
  });
}

// ---------------------------------------------------------------------------------
// The process (process.cpp).

int memprof_process_memory(int64_t* resident, int64_t* peak_resident) noexcept {
  return guarded("memprof_process_memory", [&]() -> int {
    if (!given(resident, "memprof_process_memory") ||
        !given(peak_resident, "memprof_process_memory")) {
      return -1;
    }
    process_memory(resident, peak_resident);
    return 0;
  });
}

int memprof_write_stdout(const char* buf, size_t len) noexcept {
  return guarded("memprof_write_stdout", [&]() -> int {
    if (len > 0 && !given(buf, "memprof_write_stdout")) {
      return -1;
    }
    return write_stdout(buf, len);
  });
}

// ---------------------------------------------------------------------------------
// CUDA (cuda.cpp).

int memprof_cuda_stats(int32_t index, MpCudaStats* out) noexcept {
  return guarded("memprof_cuda_stats", [&]() -> int {
    if (!given(out, "memprof_cuda_stats")) {
      return -1;
    }
    std::memset(out, 0, sizeof(MpCudaStats));
    return cuda_stats(index, out);
  });
}

int memprof_cuda_memory_info(int32_t index, int64_t* free_bytes, int64_t* total_bytes) noexcept {
  return guarded("memprof_cuda_memory_info", [&]() -> int {
    if (!given(free_bytes, "memprof_cuda_memory_info") ||
        !given(total_bytes, "memprof_cuda_memory_info")) {
      return -1;
    }
    *free_bytes = 0;
    *total_bytes = 0;
    return cuda_memory_info(index, free_bytes, total_bytes);
  });
}

int memprof_cuda_history(int32_t on, int64_t max_entries) noexcept {
  return guarded("memprof_cuda_history", [&]() -> int { return cuda_history(on != 0, max_entries); });
}

int memprof_cuda_snapshot(const char* path) noexcept {
  return guarded("memprof_cuda_snapshot", [&]() -> int {
    if (!given(path, "memprof_cuda_snapshot")) {
      return -1;
    }
    return cuda_snapshot(path);
  });
}

int memprof_cuda_control(int32_t index, int32_t what) noexcept {
  return guarded("memprof_cuda_control", [&]() -> int { return cuda_control(index, what); });
}

int memprof_cuda_workspaces(MpWorkspace* out, int32_t cap) noexcept {
  return guarded("memprof_cuda_workspaces", [&]() -> int { return cuda_workspaces(out, cap); });
}

// ---------------------------------------------------------------------------------
// Autocast and random-generator state (amp.cpp).

// Turns autocast on (or off) for a device type with `dtype`, remembering the previous
// state in *prev for memprof_autocast_exit.
int memprof_autocast_enter(int32_t device_type, int32_t enabled, int32_t dtype,
                           MpAutocast* prev) noexcept {
  return guarded("memprof_autocast_enter", [&]() -> int {
    if (!given(prev, "memprof_autocast_enter") || !valid_device_type(device_type)) {
      return -1;
    }
    autocast_enter(device_type, enabled, dtype, prev);
    return 0;
  });
}

int memprof_autocast_exit(int32_t device_type, const MpAutocast* prev) noexcept {
  return guarded("memprof_autocast_exit", [&]() -> int {
    if (!given(prev, "memprof_autocast_exit") || !valid_device_type(device_type)) {
      return -1;
    }
    autocast_exit(device_type, prev);
    return 0;
  });
}

// The default generator's state as a new tensor handle (an at::Tensor*, owned by the
// caller as tch owns its tensors).
int memprof_rng_get(int32_t device_type, int32_t index, void** out) noexcept {
  return guarded("memprof_rng_get", [&]() -> int {
    if (!given(out, "memprof_rng_get") || !valid_device_type(device_type)) {
      return -1;
    }
    rng_get(device_type, index, out);
    return 0;
  });
}

int memprof_rng_set(int32_t device_type, int32_t index, const void* state) noexcept {
  return guarded("memprof_rng_set", [&]() -> int {
    if (!given(state, "memprof_rng_set") || !valid_device_type(device_type)) {
      return -1;
    }
    rng_set(device_type, index, *static_cast<const at::Tensor*>(state));
    return 0;
  });
}

// ---------------------------------------------------------------------------------
// The tracking CPU allocator (cpu_allocator.cpp).

int memprof_selftest_reenter(void) noexcept {
  return guarded("memprof_selftest_reenter", [&]() -> int {
    reenter_cpu_hook();
    return 0;
  });
}

}  // extern "C"
