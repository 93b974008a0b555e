// The step detail, for one profiled step (off unless asked for): which blocks each op
// reads, and where in the program each block of the timeline device was allocated.
//
// Reads: every op record (nested ones too: a backward node reads its saved tensors
// through the ops it calls) logs the storages of its tensor inputs as read by the
// timeline op it runs in, once per timeline op and storage among its last few (the op
// recorder in ops.cpp, which logs a dry run's reads the same way).
//
// Sites: at every allocation, the call stack's return addresses are copied into a
// table reserved at load (kSiteCapacity stacks of MP_SITE_DEPTH frames, touched as
// used) with libgcc's unwinder, which neither allocates through the watched allocator
// nor takes a lock of ours; the Rust side symbolises the few it needs after the step.

#include <unwind.h>

#include "../internal.h"

namespace memprof {

MpSite* g_sites = nullptr;
namespace {
std::atomic<uint64_t> g_sites_len{0};

struct Walk {
  uint64_t* ips;
  uint32_t n;
  uint32_t skip;  // frames left out at the top: take_site's own
};

_Unwind_Reason_Code on_frame(_Unwind_Context* ctx, void* arg) {
  Walk* w = static_cast<Walk*>(arg);
  const uintptr_t ip = _Unwind_GetIP(ctx);
  if (ip == 0) {
    return _URC_END_OF_STACK;
  }
  if (w->skip > 0) {
    --w->skip;
    return _URC_NO_REASON;
  }
  w->ips[w->n++] = uint64_t(ip);
  return w->n < MP_SITE_DEPTH ? _URC_NO_REASON : _URC_END_OF_STACK;
}

}  // namespace

void reset_sites() {
  g_sites_len.store(0);
}

int32_t take_site(uint32_t skip) {
  const uint64_t i = g_sites_len.fetch_add(1, std::memory_order_relaxed);
  if (!g_sites || i >= kSiteCapacity) {
    return 0;
  }
  MpSite& s = g_sites[i];
  Walk w{s.ips, 0, skip};
  _Unwind_Backtrace(&on_frame, &w);
  s.frames = w.n;
  return int32_t(i + 1);
}

int set_detail(bool on) {
  if (on && !g_steplog_on.load()) {
    set_error("the step detail needs the timeline on");
    return -1;
  }
  if (on && !g_sites) {
    set_error("the site table could not be reserved (mmap failed)");
    return -1;
  }
  g_detail_on.store(false);
  g_sites_len.store(0);
  tls_ops.read_op = -1;
  tls_ops.n_read = 0;
  g_detail_on.store(on);
  if (on) {
    op_seq_record_all();  // the reads are every op's inputs
  }
  return 0;
}

int read_site(uint64_t id, MpSite* out) {
  const uint64_t n = g_sites_len.load(std::memory_order_acquire);
  if (!g_sites || id >= n || id >= kSiteCapacity) {
    set_error("memprof_site: no such site in this step");
    return -1;
  }
  *out = g_sites[id];
  return 0;
}

}  // namespace memprof
