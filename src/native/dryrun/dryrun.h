// The estimator's dry run on the meta device (dryrun/): the meta trace allocator and its
// marks (trace.cpp), the meta kernels libtorch's C++ lacks (kernels.cpp), CUDA autocast
// on meta tensors (autocast.cpp) and scaled_dot_product_attention as CUDA runs it
// (attention.cpp). Included by the C ABI, by the op recorder (hooks/ops.cpp, whose dry
// run sink is here) and by TorchScript loading (script/).

#ifndef TCH_MEMPROF_DRYRUN_H
#define TCH_MEMPROF_DRYRUN_H

#include <array>
#include <optional>

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
// What the parent of the innermost open record of this dry-run thread is: kRecordNode
// (an autograd node: the op is one its backward formula calls), kRecordEngine (the
// engine's evaluate_function around a node: an op the engine runs itself, such as
// gradient accumulation in an input buffer), 0 another op; -1 none or not a dry run.
constexpr int kRecordNode = 1;
constexpr int kRecordEngine = 2;
int dry_run_parent_record();
// Whether the innermost open record of this dry-run thread runs inside an autograd node
// (an op its backward formula calls, directly or through another op).
bool dry_run_in_node();
char* dry_run_module_buf();
// A CUDA kernel's workspace of `bytes`, taken after its outputs and freed before it
// returns (the kernels below log cuDNN's): replayed through the caching allocator only,
// never in the bytes a CPU run holds. `kind` (the event's aux) says what the size is:
// - kTransientExact: the size the kernel takes;
// - kTransientBound: the larger plausible size (a convolution not measured on the GPU
//   estimated for, whose workspace cuDNN's plan sets at run time);
// - kTransientMeasured: the most a measured call held at once, over requests whose
//   sizes and order are not known (a convolution backward's data and weight gradients');
// - kTransientRule: the larger plausible size of that same call, logged beside it: the
//   replay of the pool's other plausible layout takes it in the measured one's place;
// - kTransientSplit: one of a measured call's requests whose sizes are known one by one
//   (a convolution backward's data and weight gradients'), with a kTransientRule beside
//   them as for kTransientMeasured.
constexpr int32_t kTransientExact = MP_TRANSIENT_EXACT;
constexpr int32_t kTransientBound = MP_TRANSIENT_BOUND;
constexpr int32_t kTransientMeasured = MP_TRANSIENT_MEASURED;
constexpr int32_t kTransientRule = MP_TRANSIENT_RULE;
constexpr int32_t kTransientSplit = MP_TRANSIENT_SPLIT;
void meta_transient(int64_t bytes, int32_t kind);

// reduce.cpp: the global-memory buffers CUDA's sum and mean take (the input kept at the
// op's start, the buffers logged at its end with its output) and the GPU that sizes them.
void reduce_started(const at::RecordFunction& fn, int depth);
void reduce_ended(const at::RecordFunction& fn, int depth);
void set_reduce_gpu(int32_t multiprocessors, int32_t threads_per_multiprocessor);
// The GPU a reduction's buffers are sized for.
struct ReduceGpu {
  int64_t multiprocessors;
  int64_t threads_per_multiprocessor;
};
// The buffers CUDA's sum or mean of an input of `sizes`, `strides` and element `offset`
// (dtype `in`) into `out` over `dims` (none: all) takes on `gpu`, in the order taken (a
// staging buffer and its semaphores per part; none where it is not split across blocks):
// a reduction recorded outside a dry run (a step captured without a GPU).
std::vector<int64_t> reduction_buffers_of(at::IntArrayRef sizes, at::IntArrayRef strides,
                                          int64_t offset, at::ScalarType in, at::ScalarType out,
                                          at::OptionalIntArrayRef dims, bool keepdim,
                                          const ReduceGpu& gpu);

// conv_workspaces.cpp: cuDNN's convolution workspaces as a GPU measured them, a line a
// call (`key\tbytes\n`, the key the measuring script's arguments, the bytes the most
// the call held at once above what it left); the lookups the convolution kernels make
// (nullopt: not measured, the rule's size is charged).
void set_conv_workspaces(const char* table, size_t len);
// A measured call: the most it held at once; for a backward call whose requests the
// allocator's trace showed, the bytes its data gradient's workspace asked for (after
// the input gradient) and its weight gradient's (after the weight gradient), else -1.
struct ConvWorkspace {
  int64_t held = 0;
  int64_t data = -1;
  int64_t weight = -1;
};
// A convolution's arguments after its tensors, as aten::convolution takes them.
struct ConvParams {
  at::IntArrayRef stride;
  at::IntArrayRef padding;
  at::IntArrayRef dilation;
  bool transposed;
  at::IntArrayRef output_padding;
  int64_t groups;
};
std::optional<int64_t> measured_conv_workspace(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    const ConvParams& params);
std::optional<ConvWorkspace> measured_conv_backward_workspace(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvParams& params,
    std::array<bool, 3> mask);

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
