// The profiling session: starting and stopping it (the op callback, the CUDA reporter,
// the step log and the registry switched on and off together), the iteration boundary,
// and the readings of its state and per-device counters.
//
// Start and stop are serialised by a mutex (never taken by a hook); every check of
// memprof_start runs before any state changes.

#include <ATen/record_function.h>

#include <cstdlib>
#include <mutex>

#include "../internal.h"

namespace memprof {

namespace {
struct Session {
  bool on = false;  // the op callback is used by the session
  bool reporter_pushed = false;
  bool leaks_requested = false;  // restored when the memory history stops
};
Session g_session;
std::mutex g_session_mutex;  // session start and stop only (never a hook)

constexpr uint64_t kCudaTableSlots = uint64_t(1) << 20;
}  // namespace

int session_start(int32_t want_cuda, int32_t timeline_slot, int32_t leaks) {
  std::lock_guard<std::mutex> lock(g_session_mutex);
  // Every check before any state changes.
  if (g_session.on) {
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
  if (want_cuda) {
    forget_cuda_blocks();
  }
  g_active_backward.store(0);
  g_backward_passes.store(0);
  g_log_len.store(0);
  for (auto& d : g_dev) {
    d.restart_peaks(true);
    d.feature_maps.store(-1);
    d.reported_peak_allocated_iter.store(d.reported_allocated.load());
    d.reported_peak_reserved_iter.store(d.reported_reserved.load());
    d.reported_peak_allocated_run.store(d.reported_allocated.load());
    d.reported_peak_reserved_run.store(d.reported_reserved.load());
  }
  tls_hot.training_thread = true;
  claim_own_lane();
  tls_ops.last_layer1 = 0;
  g_session_id.fetch_add(1);
  g_iter.store(1);
  g_origin_on.store(leaks != 0);
  g_session.leaks_requested = leaks != 0;
  if (want_cuda) {
    push_cuda_reporter();
    g_session.reporter_pushed = true;
  }
  // Leak hunting and the timeline ask for op inputs only while they learn what the ops
  // take from them (op_seq.cpp): the first iteration does.
  op_seq_start(leaks != 0 || timeline_slot >= 0, timeline_slot >= 0);
  // The step log is turned on below: the timeline records ops from the start.
  op_callback_use(MP_TARGET_STEP, true, timeline_slot >= 0 || leaks != 0, false,
                  step_records_ops() || timeline_slot >= 0);
  g_session.on = true;
  // Start iteration 1 in the forward phase.
  const uint32_t gen = cur_gen(g_genphase.load()) + 1;
  g_genphase.store(genphase(gen, kForward));
  if (timeline_slot >= 0) {
    g_steplog_device.store(timeline_slot);
    begin_steplog(gen);
    g_steplog_on.store(true);
  }
  return 0;
}

void session_stop() {
  std::lock_guard<std::mutex> lock(g_session_mutex);
  if (g_session.on) {
    op_callback_use(MP_TARGET_STEP, false, false, false, false);
    g_session.on = false;
  }
  g_steplog_on.store(false);
  g_detail_on.store(false);
  // The memory history is the session's: a profiler dropped with it on leaves no
  // history being written by the process's allocations, nor a next session that
  // records every op for it.
  g_hist_on.store(false);
  g_origin_on.store(false);
  clear_params(MP_TARGET_STEP);
  g_genphase.store(genphase(cur_gen(g_genphase.load()) + 1, kIdle));
  tls_hot.training_thread = false;
  if (g_session.reporter_pushed) {
    g_session.reporter_pushed = false;
    pop_cuda_reporter();
  }
}

bool session_leaks_requested() {
  return g_session.leaks_requested;
}

bool step_records_ops() {
  return g_origin_on.load() || g_steplog_on.load() || g_hist_on.load();
}

int begin_iteration() {
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
  const bool steplog = g_steplog_on.load();
  if (steplog) {
    begin_steplog(gen);
  }
  const bool history = g_hist_on.load();
  const bool inputs = op_seq_next_iteration(!history);
  if (steplog || g_session.leaks_requested) {
    // Every op's record while something takes it from them: the memory history, the
    // step timeline and leak hunting in an iteration that learns (or not by blocks).
    // Between those, the timeline's op events are the learned iteration's (its log,
    // kept by the Rust side) and leak hunting's origins the learned blocks'.
    const bool functions = history || !op_seq_origins_learned();
    op_seq_set_records(functions ? MP_RECORDS_ALL : MP_RECORDS_NONE);
    op_callback_use(MP_TARGET_STEP, true, inputs, false, functions);
  }
  for (auto& d : g_dev) {
    d.restart_peaks(false);
    d.feature_maps.store(-1);
    d.reported_peak_allocated_iter.store(d.reported_allocated.load());
    d.reported_peak_reserved_iter.store(d.reported_reserved.load());
  }
  return 0;
}

void read_state(MpState* out) {
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
  // What the dispatcher asks before it builds an op's record.
  const bool records = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value();
  out->op_records = records ? 1 : 0;
  out->graph_task_direct = graph_task_read_direct() ? 1 : 0;
}

void read_device_stats(int32_t slot, MpDeviceStats* out) {
  const DeviceState& d = g_dev[slot];
  out->live = d.live();
  out->peak_iter = d.peak_iter();
  out->peak_run = d.peak_run();
  out->allocs = d.allocs();
  out->optimizer_born_live = phase_live(d, kOptimizer);
  out->feature_maps = d.feature_maps.load();
  out->reported_allocated = d.reported_allocated.load();
  out->reported_reserved = d.reported_reserved.load();
  out->reported_peak_allocated_iter = d.reported_peak_allocated_iter.load();
  out->reported_peak_reserved_iter = d.reported_peak_reserved_iter.load();
  out->reported_peak_allocated_run = d.reported_peak_allocated_run.load();
  out->reported_peak_reserved_run = d.reported_peak_reserved_run.load();
}

}  // namespace memprof
