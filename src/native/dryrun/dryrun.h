// The estimator's dry run on the meta device (dryrun/): the meta trace allocator and its
// marks (trace.cpp), the meta kernels libtorch's C++ lacks (kernels.cpp), CUDA autocast
// on meta tensors (autocast.cpp) and scaled_dot_product_attention as CUDA runs it
// (attention.cpp). Included by the C ABI, by the op recorder (hooks/ops.cpp, whose dry
// run sink is here) and by TorchScript loading (script/).

#ifndef TCH_MEMPROF_DRYRUN_H
#define TCH_MEMPROF_DRYRUN_H

#include "../internal.h"

namespace memprof {

// trace.cpp: a trace at a time per process; meta_ensure_ready installs the trace
// allocator and the kernels below once.
bool meta_begin();
void meta_end();
void meta_mark(int32_t what);
bool meta_sites(bool on);
uint64_t meta_read(MpTlEvent* out, uint64_t cap, uint64_t* total);
bool meta_ensure_ready();
at::Tensor* meta_empty(const int64_t* sizes, size_t n, const at::Tensor& like);
void meta_convert(at::Tensor* t);
// Whether a meta trace (an estimate's dry run) is on: read by the op callback at every
// record, so inline.
extern std::atomic<bool> g_meta_on;
inline bool meta_trace_on() {
  return g_meta_on.load(std::memory_order_relaxed);
}
// Whether this thread runs a dry run (from meta_begin to meta_end on it; the meta
// device's backward runs on the calling thread too): its ops go to the meta trace, never
// to a profiled step.
bool dry_run_thread();
// The dry run's side of the op recorder (hooks/ops.cpp's DryRunSink): its phase (set by
// its marks), its training step (from 1), the trace's live bytes, a new op number in the
// step, an event appended to the trace, the hooks at an op's start and end (depth: its
// nesting on this thread), and the buffer the module path of the op running goes to
// (what a failing TorchScript forward names).
uint32_t meta_phase();
uint32_t meta_step();
int64_t meta_live();
int32_t meta_next_op();
void meta_append(const MpTlEvent& e);
void dry_run_op_started(const at::RecordFunction& fn, int depth);
void dry_run_op_ended(const at::RecordFunction& fn, int depth);
char* dry_run_module_buf();
// A CUDA kernel's workspace of `bytes`, taken after its outputs and freed before it
// returns (the kernels below log cuDNN's): replayed through the caching allocator only,
// never in the bytes a CPU run holds. `bound`: the larger plausible size, not the size
// the kernel takes (a convolution's, whose size cuDNN's plan sets at run time).
void meta_transient(int64_t bytes, bool bound);

// reduce.cpp: the global-memory buffers CUDA's sum and mean take (the input kept at the
// op's start, the buffers logged at its end with its output) and the GPU that sizes them.
void reduce_started(const at::RecordFunction& fn, int depth);
void reduce_ended(const at::RecordFunction& fn, int depth);
void set_reduce_gpu(int32_t multiprocessors, int32_t threads_per_multiprocessor);

// kernels.cpp: the meta kernels libtorch's C++ lacks (at the first trace).
void register_meta_kernels();
// The meta-kernel inventory (memprof_meta_inventory's lines).
std::string meta_inventory();

// attention.cpp: scaled_dot_product_attention as CUDA runs it in a dry run.
void register_attention_kernels();
void set_attention(int32_t sm, int32_t backend);
void attention_get(MpAttention* out);

// autocast.cpp: autocast in the dry run (kernels registered at the first begin).
bool meta_autocast_begin(int32_t list, int32_t dtype);
void meta_autocast_end();
std::string autocast_listing(int32_t which);

}  // namespace memprof

#endif  // TCH_MEMPROF_DRYRUN_H
