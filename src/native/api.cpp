// The C ABI (declared in memprof.h): the session, the readers, and the load-time
// initialiser. Every function is noexcept and runs behind guarded(), which turns any
// C++ exception into -1 and a message in the calling thread's last-error slot.

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "internal.h"

namespace memprof {

std::atomic<int64_t> g_hook_reentries{0};
thread_local int tls_hook_depth = 0;

namespace {
thread_local std::string tls_last_error;

template <class F>
int guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    try {
      set_error((std::string("unknown C++ exception in ") + what).c_str());
    } catch (...) {
    }
  }
  return -1;
}

// False (with the error set) when an out- or in-pointer the caller must give is null.
bool given(const void* p, const char* what) {
  if (!p) {
    set_error((std::string(what) + ": null pointer").c_str());
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------
// Out-of-memory report writer (Rust), called at most once at a time.

std::atomic<MpOomCallback> g_oom_callback{nullptr};
std::atomic<void*> g_oom_ctx{nullptr};
std::atomic<int> g_oom_busy{0};

// ---------------------------------------------------------------------------------
// The session.

struct Session {
  at::CallbackHandle callback = 0;
  bool reporter_pushed = false;
  bool leaks_requested = false;  // restored when the memory history stops
};
Session g_session;
std::mutex g_session_mutex;  // session start and stop only (never a hook)

constexpr uint64_t kCudaTableSlots = uint64_t(1) << 20;

// Runs at library load, before main and so before the user's model is built.
struct Init {
  Init() {
    init_slots();
    g_log = reserve<MpLogEvent>(kLogCapacity);
    g_steplog = reserve<MpTlEvent>(kStepLogCapacity);
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

int device_slot(const c10::Device& dev) {
  if (dev.is_cpu()) {
    return 0;
  }
  if (dev.is_cuda() && dev.index() >= 0 && dev.index() < kMaxCuda) {
    return 1 + dev.index();
  }
  return -1;
}

c10::DeviceType device_type_of(int32_t device_type) {
  return device_type == MP_DEVICE_CPU ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
}

// The default random generator of a device.
at::Generator default_generator(int32_t device_type, int32_t index) {
  const c10::Device d = device_type == MP_DEVICE_CPU
      ? c10::Device(c10::DeviceType::CPU)
      : c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(index));
  return at::globalContext().defaultGenerator(d);
}

bool valid_device_type(int32_t device_type) {
  if (device_type != MP_DEVICE_CPU && device_type != MP_DEVICE_CUDA) {
    set_error("unknown device type (0: CPU, 1: CUDA)");
    return false;
  }
  return true;
}
}  // namespace

void set_error(const char* what) noexcept {
  try {
    tls_last_error = what ? what : "unknown error";
  } catch (...) {
  }
}

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

int memprof_start(int32_t want_cuda, int32_t timeline_slot, int32_t leaks) noexcept {
  return guarded("memprof_start", [&]() -> int {
    std::lock_guard<std::mutex> lock(g_session_mutex);
    // Every check before any state changes.
    if (g_session.callback != 0) {
      set_error("a profiling session is already active in this process");
      return -1;
    }
    if (!g_cpu_installed.load()) {
      set_error(
          getenv("TCH_MEMPROF_DISABLE")
              ? "TCH_MEMPROF_DISABLE is set: the tracking CPU allocator was not installed"
              : "the tracking CPU allocator could not be installed");
      return -1;
    }
    if (timeline_slot < -1 || timeline_slot >= kMaxDevices) {
      set_error("timeline device slot out of range (-1: off, 0: CPU, 1 + i: cuda:i)");
      return -1;
    }
    if (timeline_slot >= 0 && !g_steplog) {
      set_error("the step log could not be reserved (mmap failed)");
      return -1;
    }
    if (leaks && !g_reg) {
      set_error("the live-block registry could not be reserved (mmap failed)");
      return -1;
    }
    if (want_cuda && !g_cuda_blocks.slots) {
      g_cuda_blocks.slots = reserve<BlockSlot>(kCudaTableSlots);
      g_cuda_blocks.mask = kCudaTableSlots - 1;
      if (!g_cuda_blocks.slots) {
        set_error("the CUDA block table could not be reserved (mmap failed)");
        return -1;
      }
    }
    g_active_backward.store(0);
    g_backward_passes.store(0);
    g_log_len.store(0);
    for (auto& d : g_dev) {
      d.peak_iter.store(d.live.load());
      d.peak_run.store(d.live.load());
      d.feature_maps.store(-1);
      d.reported_peak_allocated_iter.store(d.reported_allocated.load());
      d.reported_peak_reserved_iter.store(d.reported_reserved.load());
      d.reported_peak_allocated_run.store(d.reported_allocated.load());
      d.reported_peak_reserved_run.store(d.reported_reserved.load());
    }
    tls_training_thread = true;
    tls_ops.last_layer1 = 0;
    g_session_id.fetch_add(1);
    g_iter.store(1);
    g_origin_on.store(leaks != 0);
    g_session.leaks_requested = leaks != 0;
    if (want_cuda) {
      push_cuda_reporter();
      g_session.reporter_pushed = true;
    }
    g_session.callback = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end)
            .needsInputs(timeline_slot >= 0 || leaks != 0)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    // Start iteration 1 in the forward phase.
    const uint32_t gen = cur_gen(g_genphase.load()) + 1;
    g_genphase.store(genphase(gen, kForward));
    if (timeline_slot >= 0) {
      g_steplog_device.store(timeline_slot);
      begin_steplog(gen);
      g_steplog_on.store(true);
    }
    return 0;
  });
}

int memprof_stop(void) noexcept {
  return guarded("memprof_stop", [&]() -> int {
    std::lock_guard<std::mutex> lock(g_session_mutex);
    if (g_session.callback != 0) {
      at::removeCallback(g_session.callback);
      g_session.callback = 0;
    }
    g_steplog_on.store(false);
    g_origin_on.store(false);
    clear_params();
    g_genphase.store(genphase(cur_gen(g_genphase.load()) + 1, kIdle));
    tls_training_thread = false;
    if (g_session.reporter_pushed) {
      g_session.reporter_pushed = false;
      pop_cuda_reporter();
    }
    return 0;
  });
}

// Ends the current iteration and starts the next one in the forward phase: resets the
// per-iteration peaks, the feature maps and the backward log.
int memprof_begin_iteration(void) noexcept {
  return guarded("memprof_begin_iteration", [&]() -> int {
    const uint64_t gp = g_genphase.load();
    if (cur_phase(gp) == kIdle) {
      set_error("no profiling session is active");
      return -1;
    }
    const uint32_t gen = cur_gen(gp) + 1;
    g_genphase.store(genphase(gen, kForward));
    g_iter.fetch_add(1);
    // Called on the training thread: ops before the first layer of the new iteration
    // (the batch, user code) belong to no layer, as in the step timeline.
    tls_ops.last_layer1 = 0;
    g_log_len.store(0);
    g_backward_passes.store(0);
    if (g_steplog_on.load()) {
      begin_steplog(gen);
    }
    for (auto& d : g_dev) {
      d.peak_iter.store(d.live.load());
      d.feature_maps.store(-1);
      d.reported_peak_allocated_iter.store(d.reported_allocated.load());
      d.reported_peak_reserved_iter.store(d.reported_reserved.load());
    }
    return 0;
  });
}

int memprof_state(MpState* out) noexcept {
  return guarded("memprof_state", [&]() -> int {
    if (!given(out, "memprof_state")) {
      return -1;
    }
    const uint64_t gp = g_genphase.load();
    out->generation = cur_gen(gp);
    out->phase = cur_phase(gp);
    out->active_backward = g_active_backward.load();
    out->backward_passes = g_backward_passes.load();
    out->log_len = g_log_len.load();
    out->log_capacity = g_log ? kLogCapacity : 0;
    out->untagged_frees = g_untagged_frees.load();
    out->cpu_installed = g_cpu_installed.load() ? 1 : 0;
    out->cuda_loaded = cuda_loaded() ? 1 : 0;
    out->cuda_ooms_seen = g_cuda_ooms_seen.load();
    out->hook_reentries = g_hook_reentries.load();
    out->cuda_untracked = g_cuda_untracked.load();
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
    const DeviceState& d = g_dev[slot];
    out->live = d.live.load();
    out->peak_iter = d.peak_iter.load();
    out->peak_run = d.peak_run.load();
    out->allocs = d.allocs.load();
    out->frees = d.frees.load();
    out->optimizer_born_live = phase_live(d, kOptimizer);
    out->feature_maps = d.feature_maps.load();
    out->reported_allocated = d.reported_allocated.load();
    out->reported_reserved = d.reported_reserved.load();
    out->reported_peak_allocated_iter = d.reported_peak_allocated_iter.load();
    out->reported_peak_reserved_iter = d.reported_peak_reserved_iter.load();
    out->reported_peak_allocated_run = d.reported_peak_allocated_run.load();
    out->reported_peak_reserved_run = d.reported_peak_reserved_run.load();
    return 0;
  });
}

int memprof_registry(MpRegistry* out) noexcept {
  return guarded("memprof_registry", [&]() -> int {
    if (!given(out, "memprof_registry")) {
      return -1;
    }
    const uint32_t hw = g_reg_hw.load();
    out->capacity = g_reg ? kRegCapacity : 0;
    out->high_water = hw < kRegCapacity ? hw : kRegCapacity;
    out->live = g_reg_live.load();
    out->dropped = g_reg_dropped.load();
    out->entry_bytes = sizeof(RegEntry);
    out->on = g_origin_on.load() ? 1 : 0;
    out->pad = 0;
    return 0;
  });
}

int memprof_timeline_header(MpTimelineHeader* out) noexcept {
  return guarded("memprof_timeline_header", [&]() -> int {
    if (!given(out, "memprof_timeline_header")) {
      return -1;
    }
    out->len = g_steplog_len.load(std::memory_order_acquire);
    out->capacity = g_steplog ? kStepLogCapacity : 0;
    out->start_generation = g_steplog_start_gen.load();
    out->ops = g_op_counter.load();
    out->start_live = g_steplog_start_live.load();
    out->on = g_steplog_on.load() ? 1 : 0;
    out->device = g_steplog_device.load();
    return 0;
  });
}

int memprof_read_log(MpLogEvent* out, uint64_t cap, uint64_t* total) noexcept {
  return guarded("memprof_read_log", [&]() -> int {
    if (!given(total, "memprof_read_log") || (cap > 0 && !given(out, "memprof_read_log"))) {
      return -1;
    }
    const uint64_t n = g_log_len.load(std::memory_order_acquire);
    const uint64_t avail = n < kLogCapacity ? n : kLogCapacity;
    const uint64_t c = avail < cap ? avail : cap;
    if (g_log && c > 0) {
      std::memcpy(out, g_log, c * sizeof(MpLogEvent));
    }
    *total = n;
    return 0;
  });
}

int memprof_read_timeline(MpTlEvent* out, uint64_t cap, uint64_t* total) noexcept {
  return guarded("memprof_read_timeline", [&]() -> int {
    if (!given(total, "memprof_read_timeline") ||
        (cap > 0 && !given(out, "memprof_read_timeline"))) {
      return -1;
    }
    const uint64_t n = g_steplog_len.load(std::memory_order_acquire);
    const uint64_t avail = n < kStepLogCapacity ? n : kStepLogCapacity;
    const uint64_t c = avail < cap ? avail : cap;
    if (g_steplog && c > 0) {
      std::memcpy(out, g_steplog, c * sizeof(MpTlEvent));
    }
    *total = n;
    return 0;
  });
}

int memprof_read_history(MpHistEvent* out, uint64_t cap, uint64_t* total, uint64_t* ring) noexcept {
  return guarded("memprof_read_history", [&]() -> int {
    if (!given(total, "memprof_read_history") || !given(ring, "memprof_read_history") ||
        (cap > 0 && !given(out, "memprof_read_history"))) {
      return -1;
    }
    const uint64_t len = g_hist_len.load(std::memory_order_acquire);
    const uint64_t r = g_hist ? g_hist_cap.load() : 0;
    *total = len;
    *ring = r;
    if (r == 0) {
      return 0;
    }
    const uint64_t n = len < r ? len : r;
    const uint64_t c = n < cap ? n : cap;
    const uint64_t first = len - c;  // the newest c events
    for (uint64_t k = 0; k < c; ++k) {
      out[k] = g_hist[(first + k) % r];
    }
    return 0;
  });
}

int memprof_live_blocks(int32_t slot, MpLiveBlock* out, uint64_t cap, uint64_t* count) noexcept {
  return guarded("memprof_live_blocks", [&]() -> int {
    if (!given(count, "memprof_live_blocks") || (cap > 0 && !given(out, "memprof_live_blocks"))) {
      return -1;
    }
    *count = 0;
    if (!g_reg) {
      return 0;
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
    return 0;
  });
}

namespace {
// The block behind `t0` (or behind its .grad): what memprof_tensor_block(s) report.
void fill_block(const at::Tensor& t0, bool grad, MpBlock* out) {
  std::memset(out, 0, sizeof(MpBlock));
  out->device = -1;
  if (!t0.defined()) {
    return;
  }
  // References, not copies: no reference-count traffic on every variable's tensor.
  const at::Tensor& t = grad ? t0.grad() : t0;
  if (!t.defined() || !t.has_storage()) {
    return;
  }
  const c10::Storage& st = t.storage();
  const c10::DataPtr& dp = st.data_ptr();
  out->defined = 1;
  out->device = device_slot(dp.device());
  out->base = uint64_t(dp.get());
  out->bytes = int64_t(st.nbytes());
  if (dp.device().is_cpu()) {
    int64_t size = 0;
    uint32_t gen = 0;
    uint32_t phase = 0;
    if (cpu_block_tag(dp, &size, &gen, &phase)) {
      out->tracked = 1;
      out->bytes = size;
      out->generation = gen;
      out->phase = phase;
    }
  } else if (dp.device().is_cuda()) {
    out->bytes = cuda_round(int64_t(st.nbytes()));
    uint64_t tag = 0;
    if (table_find(g_cuda_blocks, out->base, &tag)) {
      out->tracked = 1;
      out->bytes = slot_bytes(tag);
      out->generation = slot_gen(tag);
      out->phase = slot_phase(tag);
    }
  }
}
}  // namespace

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
                          MpBlock* grads) noexcept {
  return guarded("memprof_tensor_blocks", [&]() -> int {
    if (n == 0) {
      return 0;
    }
    if (!given(tensors, "memprof_tensor_blocks") || !given(blocks, "memprof_tensor_blocks") ||
        !given(grads, "memprof_tensor_blocks")) {
      return -1;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!tensors[i]) {
        set_error("memprof_tensor_blocks: a null tensor handle");
        return -1;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& t = *static_cast<const at::Tensor*>(tensors[i]);
      fill_block(t, false, &blocks[i]);
      fill_block(t, true, &grads[i]);
    }
    return 0;
  });
}

int memprof_name(int32_t id, char* buf, size_t len, int64_t* name_len) noexcept {
  return guarded("memprof_name", [&]() -> int {
    if (!given(name_len, "memprof_name")) {
      return -1;
    }
    const char* n = name_of(id);
    if (!n) {
      *name_len = -1;
      return 0;
    }
    const size_t l = std::strlen(n);
    if (buf && len > 0) {
      const size_t c = l < len - 1 ? l : len - 1;
      std::memcpy(buf, n, c);
      buf[c] = 0;
    }
    *name_len = int64_t(l);
    return 0;
  });
}

int memprof_intern(const char* name, int32_t* id) noexcept {
  return guarded("memprof_intern", [&]() -> int {
    if (!given(name, "memprof_intern") || !given(id, "memprof_intern")) {
      return -1;
    }
    *id = intern(name);
    if (*id < 0) {
      set_error("the name table is full");
      return -1;
    }
    return 0;
  });
}

int memprof_set_params(const uint64_t* ptrs, const int32_t* ids, const int32_t* layers,
                       size_t n) noexcept {
  return guarded("memprof_set_params", [&]() -> int { return set_params(ptrs, ids, layers, n); });
}

// Scopes name the layer of the ops run on this thread until the matching pop.
int memprof_scope_push(int32_t id) noexcept {
  return guarded("memprof_scope_push", [&]() -> int {
    OpStack& t = tls_ops;
    if (t.n_scope >= kMaxScopes) {
      set_error("scopes nested deeper than 32");
      return -1;
    }
    t.scopes[t.n_scope++] = id;
    return 0;
  });
}

int memprof_scope_pop(void) noexcept {
  return guarded("memprof_scope_pop", [&]() -> int {
    OpStack& t = tls_ops;
    if (t.n_scope <= 0) {
      set_error("no scope is open on this thread");
      return -1;
    }
    --t.n_scope;
    return 0;
  });
}

// Starts (clearing it) or stops the memory history; `max_entries` (1..2^24) is the
// ring's size when starting.
int memprof_history(int32_t on, uint64_t max_entries) noexcept {
  return guarded("memprof_history", [&]() -> int {
    if (!on) {
      g_hist_on.store(false);
      g_origin_on.store(g_session.leaks_requested);
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
    return 0;
  });
}

// Sets (or clears, with a null cb) the out-of-memory report writer. Returns once no
// call of the previous one is running, so its context may be freed after.
int memprof_set_oom_callback(MpOomCallback cb, void* ctx) noexcept {
  return guarded("memprof_set_oom_callback", [&]() -> int {
    g_oom_callback.store(nullptr);
    while (g_oom_busy.load() != 0) {
      std::this_thread::yield();
    }
    g_oom_ctx.store(ctx);
    g_oom_callback.store(cb);
    return 0;
  });
}

int memprof_process_memory(int64_t* resident, int64_t* peak_resident) noexcept {
  return guarded("memprof_process_memory", [&]() -> int {
    if (!given(resident, "memprof_process_memory") ||
        !given(peak_resident, "memprof_process_memory")) {
      return -1;
    }
    *resident = 0;
    *peak_resident = 0;
    // Opened once (a thread-safe local static) and read from offset 0 each time: the
    // kernel regenerates the text on every read.
    static const int statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    static const long page = sysconf(_SC_PAGESIZE);
    if (statm >= 0 && page > 0) {
      char buf[128];
      const ssize_t n = pread(statm, buf, sizeof(buf) - 1, 0);
      if (n > 0) {
        buf[n] = 0;
        // "size resident shared text lib data dt", in pages.
        char* end = nullptr;
        std::strtoll(buf, &end, 10);
        const long long pages = std::strtoll(end, nullptr, 10);
        *resident = int64_t(pages) * int64_t(page);
      }
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
      *peak_resident = int64_t(ru.ru_maxrss) * 1024;  // kilobytes on Linux
    }
    // The kernel sums resident pages from per-CPU counters: two reads a moment apart can
    // disagree by a few pages. A peak is never below the current figure it reports with.
    *peak_resident = std::max(*peak_resident, *resident);
    return 0;
  });
}

int memprof_write_stdout(const char* buf, size_t len) noexcept {
  return guarded("memprof_write_stdout", [&]() -> int {
    if (len > 0 && !given(buf, "memprof_write_stdout")) {
      return -1;
    }
    size_t done = 0;
    while (done < len) {
      const ssize_t w = ::write(STDOUT_FILENO, buf + done, len - done);
      if (w < 0 && errno == EINTR) {
        continue;
      }
      if (w <= 0) {
        set_error("write to standard output failed");
        return -1;
      }
      done += size_t(w);
    }
    return 0;
  });
}

int memprof_cuda_stats(int32_t index, MpCudaStats* out) noexcept {
  return guarded("memprof_cuda_stats", [&]() -> int {
    if (!given(out, "memprof_cuda_stats")) {
      return -1;
    }
    std::memset(out, 0, sizeof(MpCudaStats));
    return cuda_stats(index, out);
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

// Turns autocast on (or off) for a device type with `dtype`, remembering the previous
// state in *prev for memprof_autocast_exit.
int memprof_autocast_enter(int32_t device_type, int32_t enabled, int32_t dtype,
                           MpAutocast* prev) noexcept {
  return guarded("memprof_autocast_enter", [&]() -> int {
    if (!given(prev, "memprof_autocast_enter") || !valid_device_type(device_type)) {
      return -1;
    }
    const auto dt = device_type_of(device_type);
    prev->enabled = at::autocast::is_autocast_enabled(dt) ? 1 : 0;
    prev->dtype = int32_t(at::autocast::get_autocast_dtype(dt));
    at::autocast::set_autocast_enabled(dt, enabled != 0);
    if (enabled) {
      at::autocast::set_autocast_dtype(dt, c10::ScalarType(dtype));
    }
    at::autocast::increment_nesting();
    return 0;
  });
}

int memprof_autocast_exit(int32_t device_type, const MpAutocast* prev) noexcept {
  return guarded("memprof_autocast_exit", [&]() -> int {
    if (!given(prev, "memprof_autocast_exit") || !valid_device_type(device_type)) {
      return -1;
    }
    const auto dt = device_type_of(device_type);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();  // the cached low-precision copies of the weights
    }
    at::autocast::set_autocast_enabled(dt, prev->enabled != 0);
    at::autocast::set_autocast_dtype(dt, c10::ScalarType(prev->dtype));
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
    *out = nullptr;
    at::Generator gen = default_generator(device_type, index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    *out = new at::Tensor(gen.get_state());
    return 0;
  });
}

int memprof_rng_set(int32_t device_type, int32_t index, const void* state) noexcept {
  return guarded("memprof_rng_set", [&]() -> int {
    if (!given(state, "memprof_rng_set") || !valid_device_type(device_type)) {
      return -1;
    }
    at::Generator gen = default_generator(device_type, index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(*static_cast<const at::Tensor*>(state));
    return 0;
  });
}

int memprof_selftest_block_table(uint64_t n, uint64_t* errors) noexcept {
  return guarded("memprof_selftest_block_table", [&]() -> int {
    if (!given(errors, "memprof_selftest_block_table")) {
      return -1;
    }
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
    // check, re-insert (reusing tombstones), then remove all.
    auto worker = [&](uint64_t base) {
      auto key = [&](uint64_t k) { return base + 512 * k; };
      uint32_t stale = 0;
      for (uint64_t k = 0; k < n; ++k) {
        if (!table_insert(t, key(k), pack(uint32_t(k), 1, int64_t(k) * 512 + 512), uint32_t(k), &stale) ||
            stale != kNoReg) {
          bad.fetch_add(1);
        }
      }
      for (int round = 0; round < 2; ++round) {
        for (uint64_t k = 0; k < n; ++k) {
          uint64_t tag = 0;
          if (!table_find(t, key(k), &tag) || slot_bytes(tag) != int64_t(k) * 512 + 512 ||
              slot_gen(tag) != (uint32_t(k) & uint32_t(kGenMask))) {
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
          if (!table_insert(t, key(k), pack(uint32_t(k), 1, int64_t(k) * 512 + 512), uint32_t(k), &stale)) {
            bad.fetch_add(1);
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
  });
}

int memprof_selftest_reenter(void) noexcept {
  return guarded("memprof_selftest_reenter", [&]() -> int {
    reenter_cpu_hook();
    return 0;
  });
}

// ---------------------------------------------------------------------------------
// The estimator's dry run on the meta device (meta.cpp).

int memprof_meta_begin(void) noexcept {
  return guarded("memprof_meta_begin", [&]() -> int { return meta_begin() ? 0 : -1; });
}

int memprof_meta_end(void) noexcept {
  return guarded("memprof_meta_end", [&]() -> int {
    meta_end();
    return 0;
  });
}

int memprof_meta_mark(int32_t value) noexcept {
  return guarded("memprof_meta_mark", [&]() -> int {
    if (value < MP_MARK_FORWARD || value > MP_MARK_BASELINE) {
      set_error("memprof_meta_mark: not a MpMetaMark");
      return -1;
    }
    meta_mark(value);
    return 0;
  });
}

int memprof_meta_read(MpMetaEvent* out, uint64_t cap, uint64_t* total) noexcept {
  return guarded("memprof_meta_read", [&]() -> int {
    if (!given(total, "memprof_meta_read") || (cap > 0 && !given(out, "memprof_meta_read"))) {
      return -1;
    }
    meta_read(out, cap, total);
    return 0;
  });
}

int memprof_meta_empty(const int64_t* sizes, size_t n, const void* like, void** out) noexcept {
  return guarded("memprof_meta_empty", [&]() -> int {
    if (!given(out, "memprof_meta_empty") || !given(like, "memprof_meta_empty") ||
        (n > 0 && !given(sizes, "memprof_meta_empty"))) {
      return -1;
    }
    if (!meta_ensure_ready()) {
      return -1;
    }
    *out = meta_empty(sizes, n, *static_cast<const at::Tensor*>(like));
    return 0;
  });
}

int memprof_meta_convert(void* tensor) noexcept {
  return guarded("memprof_meta_convert", [&]() -> int {
    if (!given(tensor, "memprof_meta_convert") || !meta_ensure_ready()) {
      return -1;
    }
    meta_convert(static_cast<at::Tensor*>(tensor));
    return 0;
  });
}

int memprof_script_load(const char* path, void** out) noexcept {
  return guarded("memprof_script_load", [&]() -> int {
    if (!given(path, "memprof_script_load") || !given(out, "memprof_script_load") ||
        !meta_ensure_ready()) {
      return -1;
    }
    *out = script_load(path);
    return 0;
  });
}

int memprof_script_free(void* module) noexcept {
  return guarded("memprof_script_free", [&]() -> int {
    script_free(module);
    return 0;
  });
}

int memprof_script_train(void* module, int32_t on) noexcept {
  return guarded("memprof_script_train", [&]() -> int {
    if (!given(module, "memprof_script_train")) {
      return -1;
    }
    script_train(module, on != 0);
    return 0;
  });
}

int memprof_script_forward(void* module, const void* const* inputs, size_t n, void** out) noexcept {
  return guarded("memprof_script_forward", [&]() -> int {
    if (!given(module, "memprof_script_forward") || !given(out, "memprof_script_forward") ||
        (n > 0 && !given(inputs, "memprof_script_forward"))) {
      return -1;
    }
    *out = script_forward(module, reinterpret_cast<const at::Tensor* const*>(inputs), n);
    return 0;
  });
}

int memprof_script_tensor(void* module, int32_t which, uint64_t index, uint64_t* n,
                          void** tensor, char* name_buf, size_t len, uint64_t* name_len) noexcept {
  return guarded("memprof_script_tensor", [&]() -> int {
    if (!given(module, "memprof_script_tensor") || !given(n, "memprof_script_tensor")) {
      return -1;
    }
    auto all = script_tensors(module, which);
    *n = all.size();
    if (index >= all.size()) {
      return 0;
    }
    if (!given(tensor, "memprof_script_tensor") || !given(name_len, "memprof_script_tensor")) {
      return -1;
    }
    const std::string& name = all[index].first;
    *name_len = name.size();
    if (name_buf && len > 0) {
      const size_t k = std::min(len - 1, name.size());
      std::memcpy(name_buf, name.data(), k);
      name_buf[k] = 0;
    }
    *tensor = new at::Tensor(all[index].second);
    return 0;
  });
}

}  // extern "C"

