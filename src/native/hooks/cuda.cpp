// CUDA: the caching allocator's reports, libtorch_cuda.so (which tch binaries do not
// list as needed), the allocator's statistics, history, snapshot and control.
//
// The caching allocator reports to the thread-local MemoryReportingInfoBase that the
// session pushes on the training thread (the autograd engine carries it to its device
// threads). Sizes are the allocator's rounded block sizes. The reporter runs under the
// allocator's lock: it keeps its tags in the lock-free block table (registry.cpp),
// takes no lock, allocates nothing and never calls back into the allocator.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <torch/version.h>

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "../internal.h"

namespace memprof {

std::atomic<int64_t> g_cuda_ooms_seen{0};

namespace {
std::atomic<bool> g_cuda_loaded{false};
// Why CUDA is (not) available; written once, at library load.
char g_cuda_message[512] = "not attempted";

void set_message(const std::string& m) {
  std::snprintf(g_cuda_message, sizeof(g_cuda_message), "%s", m.c_str());
}

struct Reporter final : public c10::MemoryReportingInfoBase {
  void reportMemoryUsage(
      void* ptr,
      int64_t alloc_size,
      size_t total_allocated,
      size_t total_reserved,
      c10::Device device) override {
    if (device.type() != c10::DeviceType::CUDA || device.index() < 0 ||
        device.index() >= kMaxCuda) {
      return;  // the CPU is counted by the tracking allocator
    }
    HookScope hook;
    const int dev = 1 + device.index();
    DeviceState& d = g_dev[dev];
    const int64_t alloc = int64_t(total_allocated);
    const int64_t reserved = int64_t(total_reserved);
    d.reported_allocated.store(alloc, std::memory_order_relaxed);
    d.reported_reserved.store(reserved, std::memory_order_relaxed);
    atomic_max(d.reported_peak_allocated_iter, alloc);
    atomic_max(d.reported_peak_reserved_iter, reserved);
    atomic_max(d.reported_peak_allocated_run, alloc);
    atomic_max(d.reported_peak_reserved_run, reserved);
    const uint64_t key = uint64_t(ptr);
    if (alloc_size > 0) {
      const uint64_t gp = phase_for_alloc();
      const uint32_t gen = cur_gen(gp);
      const uint32_t phase = cur_phase(gp);
      const uint32_t reg = reg_add(key, alloc_size, phase, dev);
      uint32_t stale = kNoReg;
      BlockSlot* slot = table_insert(g_cuda_blocks, key, pack(gen, phase, alloc_size), reg, &stale);
      if (!slot) {
        // No room: leave the block uncounted rather than count a free we cannot tag.
        g_cuda_untracked.fetch_add(1, std::memory_order_relaxed);
        reg_remove(reg);
        return;
      }
      reg_remove(stale);
      hist_append(dev, key, alloc_size);
      if (const uint32_t birth = on_alloc(dev, key, alloc_size, gen, phase)) {
        slot->birth.store(birth, std::memory_order_relaxed);
      }
    } else if (alloc_size < 0) {
      uint64_t tag = 0;
      uint32_t reg = kNoReg;
      if (table_remove(g_cuda_blocks, key, &tag, &reg)) {
        phase_for_free();
        on_free(dev, key, slot_bytes(tag), slot_gen(tag), slot_phase(tag));
        reg_remove(reg);
        hist_append(dev, key, -slot_bytes(tag));
      }
    }
  }

  void reportOutOfMemory(
      int64_t alloc_size,
      size_t total_allocated,
      size_t total_reserved,
      c10::Device device) override {
    g_cuda_ooms_seen.fetch_add(1, std::memory_order_relaxed);
    if (device.type() == c10::DeviceType::CUDA && device.index() >= 0 &&
        device.index() < kMaxCuda) {
      fire_oom(1 + device.index(), alloc_size, int64_t(total_allocated), int64_t(total_reserved));
    }
  }

  bool memoryProfilingEnabled() const override {
    return true;
  }
};

std::string libtorch_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&c10::alloc_cpu), &info) && info.dli_fname) {
    std::string p(info.dli_fname);
    auto slash = p.rfind('/');
    if (slash != std::string::npos) {
      return p.substr(0, slash);
    }
  }
  return "";
}

bool nvidia_driver_present() {
  return access("/proc/driver/nvidia/version", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0;
}

// The CUDA caching allocator; null with the error set when CUDA is not available. Null
// with *uninitialized set (and no error) when it is, but no CUDA tensor was made yet:
// PyTorch's own calls answer then as if nothing was ever allocated.
c10::DeviceAllocator* cuda_allocator(bool* uninitialized) {
  *uninitialized = false;
  if (!g_cuda_loaded.load()) {
    set_error((std::string("CUDA is not available: ") + g_cuda_message).c_str());
    return nullptr;
  }
  auto* alloc = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
  if (!alloc || !alloc->initialized()) {
    *uninitialized = true;
    return nullptr;
  }
  return alloc;
}

// torch::cuda functions of libtorch_cuda.so, looked up by their mangled names.
void* cuda_symbol(const char* mangled) {
  if (!g_cuda_loaded.load()) {
    set_error((std::string("CUDA is not available: ") + g_cuda_message).c_str());
    return nullptr;
  }
  void* f = dlsym(RTLD_DEFAULT, mangled);
  if (!f) {
    set_error((std::string("libtorch_cuda.so lacks ") + mangled).c_str());
  }
  return f;
}

// at::cuda::WorkspaceMapWithMutex of ATen/cuda/CUDAContextLight.h, which cannot be
// included without CUDA's headers: the workspaces PyTorch keeps per (handle, stream),
// read through cublas_handle_stream_to_workspace() and its cuBLASLt twin. Its layout
// is that of the libtorch this file is compiled against (tch links the same version),
// read only for the versions whose headers were checked: a DataPtr in 2.11, the
// DataPtr and its size in 2.13. Any other version reports an error, and the workspaces
// stay unnamed, rather than read a table of a layout not known.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 13
using WorkspaceEntry = std::pair<c10::DataPtr, size_t>;
const c10::DataPtr& entry_ptr(const WorkspaceEntry& e) {
  return e.first;
}
size_t entry_size(const WorkspaceEntry& e, size_t) {
  return e.second;
}
#define MP_WORKSPACE_LAYOUT_KNOWN 1
#elif TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11
using WorkspaceEntry = c10::DataPtr;
const c10::DataPtr& entry_ptr(const WorkspaceEntry& e) {
  return e;
}
size_t entry_size(const WorkspaceEntry&, size_t chosen) {
  return chosen;
}
#define MP_WORKSPACE_LAYOUT_KNOWN 1
#else
#define MP_WORKSPACE_LAYOUT_KNOWN 0
#endif

#if MP_WORKSPACE_LAYOUT_KNOWN
struct WorkspaceMap {
  std::map<std::tuple<void*, void*>, WorkspaceEntry> map;
  std::shared_mutex mutex;
};
using WorkspaceMapFn = WorkspaceMap& (*)();
using SizeFn = size_t (*)();
#endif

using RecordHistoryFn = void (*)(
    bool, bool, int64_t, bool, bool, bool, bool, bool, const std::vector<std::string>&);
using SnapshotFn = std::string (*)();
}  // namespace

bool cuda_loaded() {
  return g_cuda_loaded.load();
}

const char* cuda_load_message() {
  return g_cuda_message;
}

void load_cuda() {
  if (getenv("TCH_MEMPROF_NO_CUDA")) {
    set_message("TCH_MEMPROF_NO_CUDA is set");
    return;
  }
  if (!nvidia_driver_present()) {
    set_message("no NVIDIA driver on this machine (/proc/driver/nvidia absent)");
    return;
  }
  const std::string dir = libtorch_dir();
  const std::string path = dir.empty() ? "libtorch_cuda.so" : dir + "/libtorch_cuda.so";
  if (access(path.c_str(), F_OK) != 0) {
    set_message(path + " not found: this libtorch is CPU-only");
    return;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char* e = dlerror();
    set_message(std::string("dlopen ") + path + " failed: " + (e ? e : "unknown error"));
    return;
  }
  g_cuda_loaded.store(true);
  set_message("loaded " + path);
}

int cuda_report_cost(uint64_t n, int32_t other_thread, uint64_t* ns) {
  if (n == 0 || n > (uint64_t(1) << 18)) {
    set_error("cuda_report_cost: n must be between 1 and 262144");
    return -1;
  }
  if (!g_cuda_blocks.slots) {
    g_cuda_blocks.slots = reserve<BlockSlot>(uint64_t(1) << 20);
    g_cuda_blocks.mask = (uint64_t(1) << 20) - 1;
    if (!g_cuda_blocks.slots) {
      set_error("the CUDA block table could not be reserved (mmap failed)");
      return -1;
    }
  }
  // n blocks of a step's sizes (512 B to 2 MiB, rounded to 512 as the caching allocator
  // does) born, then freed in the same order, at addresses no real block has (not
  // canonical on x86-64: no mapping, host or device, is there). For benches: it moves
  // the cuda:0 counters of a running session as real reports would.
  auto run = [n](uint64_t* out) {
    Reporter r;
    const c10::Device dev(c10::DeviceType::CUDA, 0);
    constexpr uint64_t kBase = uint64_t(0x4000) << 48;
    size_t total = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      const int64_t size = int64_t(512 * (1 + (i * 2654435761u) % 4096));
      total += size_t(size);
      r.reportMemoryUsage(reinterpret_cast<void*>(kBase + i * (uint64_t(4) << 20)), size, total,
                          total, dev);
    }
    for (uint64_t i = 0; i < n; ++i) {
      const int64_t size = int64_t(512 * (1 + (i * 2654435761u) % 4096));
      total -= size_t(size);
      r.reportMemoryUsage(reinterpret_cast<void*>(kBase + i * (uint64_t(4) << 20)), -size, total,
                          total, dev);
    }
    const auto t1 = std::chrono::steady_clock::now();
    *out = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  };
  if (other_thread) {
    // As CUDA's backward reports, from a thread that is not the training thread.
    std::thread t(run, ns);
    t.join();
  } else {
    run(ns);
  }
  return 0;
}

void push_cuda_reporter() {
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::make_shared<Reporter>());
}

void pop_cuda_reporter() {
  auto top = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  if (top && dynamic_cast<Reporter*>(top)) {
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  }
}

int cuda_stats(int32_t index, MpCudaStats* out) {
  bool uninitialized = false;
  auto* alloc = cuda_allocator(&uninitialized);
  if (!alloc) {
    // No CUDA tensor yet: every counter zero, as torch.cuda.memory_stats() answers then
    // (free and total memory too: asking the driver would create the CUDA context).
    if (uninitialized) {
      *out = MpCudaStats{};
      return 0;
    }
    return -1;
  }
  auto s = alloc->getDeviceStats(c10::DeviceIndex(index));
  constexpr auto A = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  out->allocated_current = s.allocated_bytes[A].current;
  out->allocated_peak = s.allocated_bytes[A].peak;
  out->reserved_current = s.reserved_bytes[A].current;
  out->reserved_peak = s.reserved_bytes[A].peak;
  out->active_current = s.active_bytes[A].current;
  out->active_peak = s.active_bytes[A].peak;
  out->requested_current = s.requested_bytes[A].current;
  out->requested_peak = s.requested_bytes[A].peak;
  out->alloc_retries = s.num_alloc_retries;
  out->ooms = s.num_ooms;
  // Free and total memory are the driver's (cuda_memory_info), asked for apart.
  out->free_bytes = 0;
  out->total_bytes = 0;
  return 0;
}

int cuda_memory_info(int32_t index, int64_t* free_bytes, int64_t* total_bytes) {
  bool uninitialized = false;
  auto* alloc = cuda_allocator(&uninitialized);
  if (!alloc) {
    if (uninitialized) {
      *free_bytes = 0;
      *total_bytes = 0;
      return 0;
    }
    return -1;
  }
  // cudaMemGetInfo behind a switch to the device (PyTorch's CUDAAllocator): on a device
  // without a context it would create one, so the callers ask only where the allocator
  // holds memory.
  auto info = alloc->getMemoryInfo(c10::DeviceIndex(index));
  *free_bytes = int64_t(info.first);
  *total_bytes = int64_t(info.second);
  return 0;
}

int cuda_history(bool on, int64_t max_entries) {
  auto f = reinterpret_cast<RecordHistoryFn>(cuda_symbol(
      "_ZN5torch4cuda22_record_memory_historyEbblbbbbbRKSt6vectorINSt7__cxx1112basic_"
      "stringIcSt11char_traitsIcESaIcEEESaIS7_EE"));
  if (!f) {
    return -1;
  }
  // enabled, record_context, trace_alloc_max_entries, trace_alloc_record_context,
  // record_cpp_context (C++ unwinding is slow: off), clearHistory, compileContext,
  // globalRecordAllocations, skip_actions.
  f(on, on, max_entries, on, false, on, false, false, {});
  return 0;
}

int cuda_snapshot(const char* path) {
  auto f = reinterpret_cast<SnapshotFn>(
      cuda_symbol("_ZN5torch4cuda24_memory_snapshot_pickledB5cxx11Ev"));
  if (!f) {
    return -1;
  }
  const std::string bytes = f();
  FILE* out = std::fopen(path, "wb");
  if (!out) {
    set_error((std::string("cannot create ") + path).c_str());
    return -1;
  }
  const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), out);
  const bool closed = std::fclose(out) == 0;
  if (n != bytes.size() || !closed) {
    set_error((std::string("cannot write ") + path).c_str());
    return -1;
  }
  return 0;
}

int cuda_control(int32_t index, int32_t what) {
  if (what != MP_CUDA_RESET_PEAKS && what != MP_CUDA_EMPTY_CACHE &&
      what != MP_CUDA_CLEAR_WORKSPACES) {
    set_error("memprof_cuda_control: unknown action");
    return -1;
  }
  bool uninitialized = false;
  auto* alloc = cuda_allocator(&uninitialized);
  if (!alloc) {
    // No CUDA tensor yet: no peak to reset, no cached block to release.
    return uninitialized ? 0 : -1;
  }
  if (what == MP_CUDA_CLEAR_WORKSPACES) {
    // at::cuda::clearCublasWorkspaces(): what torch._C._cuda_clearCublasWorkspaces()
    // calls. The workspaces go back to the caching allocator (empty_cache returns them).
    using ClearFn = void (*)();
    auto f = reinterpret_cast<ClearFn>(cuda_symbol("_ZN2at4cuda21clearCublasWorkspacesEv"));
    if (!f) {
      return -1;
    }
    f();
  } else if (what == MP_CUDA_RESET_PEAKS) {
    alloc->resetPeakStats(c10::DeviceIndex(index));
  } else {
    alloc->emptyCache();
  }
  return 0;
}

int cuda_workspaces(MpWorkspace* out, int32_t cap) {
#if !MP_WORKSPACE_LAYOUT_KNOWN
  (void)out;
  (void)cap;
  set_error("the cuBLAS workspace table of libtorch " TORCH_VERSION
            " has a layout this build does not know (known: 2.11, 2.13)");
  return -1;
#else
  bool uninitialized = false;
  if (!cuda_allocator(&uninitialized)) {
    return uninitialized ? 0 : -1;  // no CUDA tensor yet: no workspace either
  }
  struct Table {
    const char* map;
    const char* size;
    int32_t kind;
  };
  // at::cuda::cublas_handle_stream_to_workspace(), getChosenWorkspaceSize() and their
  // cuBLASLt twins.
  const Table tables[] = {
      {"_ZN2at4cuda33cublas_handle_stream_to_workspaceEv",
       "_ZN2at4cuda22getChosenWorkspaceSizeEv", MP_WORKSPACE_CUBLAS},
      {"_ZN2at4cuda35cublaslt_handle_stream_to_workspaceEv",
       "_ZN2at4cuda26getCUDABlasLtWorkspaceSizeEv", MP_WORKSPACE_CUBLASLT},
  };
  int32_t n = 0;
  std::vector<void*> seen;  // one block named once (cuBLASLt may share cuBLAS's)
  for (const Table& t : tables) {
    auto map_fn = reinterpret_cast<WorkspaceMapFn>(cuda_symbol(t.map));
    auto size_fn = reinterpret_cast<SizeFn>(cuda_symbol(t.size));
    if (!map_fn || !size_fn) {
      return -1;
    }
    const size_t chosen = size_fn();
    WorkspaceMap& m = map_fn();
    std::shared_lock<std::shared_mutex> lock(m.mutex);
    for (const auto& [key, entry] : m.map) {
      const c10::DataPtr& p = entry_ptr(entry);
      void* ptr = p.get();
      if (!ptr || p.device().type() != c10::DeviceType::CUDA) {
        continue;
      }
      bool dup = false;
      for (void* s : seen) {
        dup = dup || s == ptr;
      }
      if (dup) {
        continue;
      }
      seen.push_back(ptr);
      // The block's bytes as the allocator counts them: the size the reporter saw for
      // that block if the session saw it born, else the requested size rounded to the
      // allocator's 512-byte blocks.
      const int64_t requested = int64_t(entry_size(entry, chosen));
      int64_t bytes = (requested + 511) / 512 * 512;
      uint64_t tag = 0;
      const bool tracked = table_find(g_cuda_blocks, uint64_t(ptr), &tag);
      if (tracked) {
        bytes = slot_bytes(tag);
      }
      if (n < cap && out) {
        out[n] = MpWorkspace{uint64_t(ptr), bytes, int32_t(p.device().index()), t.kind,
                             int32_t(tracked), 0};
      }
      ++n;
    }
  }
  return n;
#endif
}

}  // namespace memprof
