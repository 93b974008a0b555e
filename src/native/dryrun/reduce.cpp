// The global-memory buffers of CUDA's reductions in the dry run.
//
// CUDA's sum and mean (aten/src/ATen/native/cuda/Reduce.cuh of PyTorch 2.11,
// gpu_reduce_kernel) split a reduction across thread blocks when each output has many
// inputs and there are few outputs: a bias gradient (the sum of a [tokens, features]
// gradient over its tokens), a convolution's bias gradient, a loss's mean. The blocks'
// partial results go through a staging buffer and a semaphore array taken from the
// caching allocator after the output and freed before the call returns. On an NVIDIA
// H200 they are what a training step takes beside its tensors in backward: 9.4 MiB and
// 24 B for each of ConvNeXt-T's last-stage bias gradients, 132 MiB and 96 B for each of
// ViT-B's MLP ones (the H200's own snapshots of those runs, recorded request by request).
//
// Their sizes follow from the reduction's TensorIterator and the GPU's multiprocessors,
// as setReduceConfig computes them; the port below is that function's host side,
// checked against those snapshots byte for byte (tests/cudnn_workspaces.rs). The meta
// kernels compute no TensorIterator for a reduction (a structured meta function sizes
// the output only), so the buffers are logged at the op's end from its inputs and
// output, as a workspace the kernel takes (meta_transient, of its exact size).

#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "dryrun.h"

namespace memprof {
namespace {

// The GPU's streaming multiprocessors and threads each holds at once (an A100's until
// set: the GPU the estimate assumes when none is named).
std::atomic<int32_t> g_multiprocessors{108};
std::atomic<int32_t> g_threads_per_multiprocessor{2048};

int64_t div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// floor to a power of two, at least 1 (Reduce.cuh's last_pow2).
int64_t last_pow2(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) {
    p *= 2;
  }
  return p;
}

// Reduce.cuh's ReduceConfig, the fields its buffer sizes read.
struct Config {
  int64_t element_size;  // the accumulator's bytes (arg_t)
  int64_t num_inputs;
  int64_t num_outputs;
  int64_t step_input = 1;
  int64_t step_output = 1;
  int64_t ctas_per_output = 1;
  bool block_x_reduce = false;  // input_mult[BLOCK_X] != 0
  bool block_y_reduce = false;  // input_mult[BLOCK_Y] != 0
  bool global_reduce = false;   // input_mult[CTA] != 0
  int64_t block_width = 1;
  int64_t block_height = 1;
  int64_t output_vec_size = 1;

  void set_block_dimension(int64_t dim0, int64_t dim1, int64_t max_threads) {
    const int64_t most = max_threads / output_vec_size;
    const int64_t d0 = dim0 < most ? last_pow2(dim0) : most;
    const int64_t d1 = dim1 < most ? last_pow2(dim1) : most;
    block_width = std::min<int64_t>(d0, 32);  // the warp
    block_height = std::min(d1, most / block_width);
    block_width = std::min(d0, most / block_height);
  }
  int64_t split_input(int64_t parallelism) {
    const int64_t step = step_input;
    step_input *= parallelism;
    return step;
  }
  void split_output(int64_t parallelism) {
    step_output *= parallelism;
  }
  int64_t grid_x() const {
    return div_up(num_outputs / output_vec_size, step_output);
  }
  int64_t values_per_thread() const {
    return div_up(num_inputs, step_input);
  }
  int64_t global_memory_size() const {
    if (!global_reduce) {
      return 0;
    }
    int64_t size = element_size * num_outputs * ctas_per_output;
    if (!block_x_reduce) {
      size *= block_width * output_vec_size;
    }
    return size;
  }
  int64_t semaphore_size() const {
    return global_reduce ? int64_t(sizeof(int)) * grid_x() : 0;
  }
};

// A reduction's iteration space as CUDA's TensorIterator has it: the dims reordered
// (reduced ones first) and then coalesced. On meta tensors TensorIterator reorders but
// does not coalesce (nor set data pointers), so the coalescing is done here, as
// TensorIteratorBase::coalesce_dimensions does it for the output and the input.
struct Geometry {
  std::vector<int64_t> shape;
  std::vector<int64_t> out_strides;  // bytes
  std::vector<int64_t> in_strides;   // bytes
  int64_t in_address = 0;            // the input's offset from its block's start, bytes

  int64_t ndim() const {
    return int64_t(shape.size());
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) {
      n *= d;
    }
    return n;
  }
  int64_t num_reduce_dims() const {
    int64_t n = 0;
    while (n < ndim() && out_strides[n] == 0) {
      ++n;
    }
    return n;
  }
  int64_t num_output_elements() const {
    int64_t n = 1;
    for (int64_t d = 0; d < ndim(); ++d) {
      if (out_strides[d] != 0) {
        n *= shape[d];
      }
    }
    return n;
  }
};

Geometry coalesced(const at::TensorIteratorBase& iter, const at::Tensor& self) {
  Geometry g;
  g.shape.assign(iter.shape().begin(), iter.shape().end());
  const auto out = iter.strides(0);
  const auto in = iter.strides(iter.ntensors() - 1);
  g.out_strides.assign(out.begin(), out.end());
  g.in_strides.assign(in.begin(), in.end());
  g.in_address = self.storage_offset() * int64_t(self.element_size());
  const int64_t n = g.ndim();
  if (n <= 1) {
    return g;
  }
  auto can_coalesce = [&g](int64_t d0, int64_t d1) {
    const int64_t s0 = g.shape[d0];
    const int64_t s1 = g.shape[d1];
    if (s0 == 1 || s1 == 1) {
      return true;
    }
    return s0 * g.out_strides[d0] == g.out_strides[d1] &&
           s0 * g.in_strides[d0] == g.in_strides[d1];
  };
  auto replace_stride = [&g](int64_t d0, int64_t d1) {
    g.out_strides[d0] = g.out_strides[d1];
    g.in_strides[d0] = g.in_strides[d1];
  };
  int64_t prev = 0;
  for (int64_t d = 1; d < n; ++d) {
    if (can_coalesce(prev, d)) {
      if (g.shape[prev] == 1) {
        replace_stride(prev, d);
      }
      g.shape[prev] *= g.shape[d];
    } else {
      ++prev;
      if (prev != d) {
        replace_stride(prev, d);
        g.shape[prev] = g.shape[d];
      }
    }
  }
  g.shape.resize(prev + 1);
  g.out_strides.resize(prev + 1);
  g.in_strides.resize(prev + 1);
  return g;
}

// Reduce.cuh's get_output_vec_size: 4 lanes unless the input's address (a fresh CUDA
// block starts aligned: the input's offset from its start), the output dimension or a
// stride is not a multiple.
int64_t output_vec_size(const Geometry& g, int64_t scalar_size) {
  int64_t vec = 4;
  auto fit = [&vec](uint64_t n) {
    while (n % uint64_t(vec) != 0) {
      vec /= 2;
    }
  };
  fit(uint64_t(g.in_address / scalar_size));
  const int64_t output_index = g.num_reduce_dims();
  fit(uint64_t(g.shape[output_index]));
  for (int64_t j = 0; j < g.ndim(); ++j) {
    if (j != output_index) {
      fit(uint64_t(g.in_strides[j] / scalar_size));
    }
  }
  return vec;
}

// Reduce.cuh's setReduceConfig for sum's and mean's kernels (vt0 = 4; input_vec_size 4,
// 8 for 16-bit inputs, which moves nothing here: it divides dim0 only where an output
// has at least 128 inputs along the fastest dim, and the buffers need 256 a thread),
// input elements of `scalar_size` bytes and accumulators of `arg_size`.
Config reduce_config(const Geometry& g, int64_t scalar_size, int64_t arg_size,
                     int64_t max_threads, const ReduceGpu& gpu) {
  const int64_t input_vec_size = scalar_size == 2 ? 8 : 4;
  Config c;
  c.element_size = arg_size;
  c.num_outputs = g.num_output_elements();
  c.num_inputs = g.numel() / c.num_outputs;
  int64_t dim0 = 1;
  int64_t dim1 = 1;
  int64_t fastest_stride = scalar_size;
  bool on_fastest = true;
  const int64_t reduce_dims = g.num_reduce_dims();
  if (g.ndim() > 0) {
    on_fastest = reduce_dims == g.ndim() || g.in_strides[0] < g.in_strides[reduce_dims];
    if (on_fastest) {
      dim0 = c.num_inputs;
      dim1 = c.num_outputs;
      fastest_stride = g.in_strides[0];
    } else {
      dim0 = c.num_outputs;
      dim1 = c.num_inputs;
      fastest_stride = g.in_strides[reduce_dims];
    }
  }
  if (fastest_stride == scalar_size) {
    if (on_fastest && dim0 >= 128 && reduce_dims == 1) {
      dim0 /= input_vec_size;
    } else if (!on_fastest) {
      c.output_vec_size = output_vec_size(g, scalar_size);
      dim0 /= c.output_vec_size;
    }
  }
  c.set_block_dimension(dim0, dim1, max_threads);
  if (g.ndim() == 0 || on_fastest) {
    c.block_x_reduce = c.split_input(c.block_width) != 0;
  } else {
    c.split_output(c.block_width);
  }
  constexpr int64_t kMinValuesPerThread = 16;
  constexpr int64_t kMaxValuesPerThread = 256;
  const int64_t warp_split = std::min(c.block_height * 16, kMaxValuesPerThread);
  if (c.values_per_thread() >= warp_split) {
    c.block_y_reduce = c.split_input(c.block_height) != 0;
  } else {
    c.split_output(c.block_height);
  }
  const int64_t threads = c.block_width * c.block_height;
  const int64_t blocks_per_sm = gpu.threads_per_multiprocessor / threads;
  const int64_t target_grid = gpu.multiprocessors * blocks_per_sm;
  const int64_t grid = c.grid_x();
  if (c.block_y_reduce && c.values_per_thread() >= kMaxValuesPerThread && grid <= target_grid) {
    const int64_t ctas1 = div_up(target_grid, grid);
    const int64_t ctas2 = div_up(c.values_per_thread(), kMinValuesPerThread);
    const int64_t ctas3 = div_up(c.values_per_thread(), kMaxValuesPerThread);
    c.ctas_per_output = std::max(std::min(ctas1, ctas2), ctas3);
    if (c.ctas_per_output > 1) {
      c.global_reduce = c.split_input(c.ctas_per_output) != 0;
    }
  }
  return c;
}

// The accumulator's bytes of sum's and mean's CUDA kernels (acc_type: float for the
// 16-bit floats and float, double for double, int64 for the integers); 0 for a dtype
// left out (complex).
int64_t accumulator_size(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
    case at::kBFloat16:
    case at::kFloat:
      return 4;
    case at::kDouble:
    case at::kLong:
      return 8;
    default:
      return 0;
  }
}

void buffers(const at::TensorIteratorBase& iter, const at::Tensor& self, int64_t arg_size,
             int64_t max_threads, const ReduceGpu& gpu, std::vector<int64_t>& out) {
  const int64_t scalar_size = int64_t(self.element_size());
  const Config c = reduce_config(coalesced(iter, self), scalar_size, arg_size, max_threads, gpu);
  if (c.global_reduce) {
    // The staging buffer, then the semaphores. CUDA holds both until the kernel is
    // launched; they are taken one after the other (so the peak inside the call is at
    // most the semaphores' 512-byte block low).
    out.push_back(c.global_memory_size());
    out.push_back(c.semaphore_size());
  }
}

// A reduction begun on this thread: its input, dims and keepdim (the inputs are gone
// from the record at its end, where its output is known).
struct Pending {
  int depth = -1;
  at::Tensor self;
  std::vector<int64_t> dims;
  bool has_dims = false;
  bool keepdim = false;
};
thread_local Pending tls_pending;

// Whether `fn` is sum's or mean's overload with dims: the others call it (at::sum(self)
// is at::sum(self, {}, false)), so each reduction is seen once.
bool dim_reduction(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const bool sum = std::strcmp(name, "aten::sum") == 0;
  if (!sum && std::strcmp(name, "aten::mean") != 0) {
    return false;
  }
  const auto op = fn.operator_name();
  return op.has_value() && op->overload_name == (sum ? "dim_IntList" : "dim");
}

// The buffers of the reduction of `self` into `result` (its dims, keepdim) on `gpu`, in
// the order CUDA takes them (none where the reduction is not split across blocks).
std::vector<int64_t> reduction_buffers(const at::Tensor& self, at::Tensor result,
                                       at::OptionalIntArrayRef dims, bool keepdim,
                                       const ReduceGpu& gpu) {
  std::vector<int64_t> out;
  if (!self.defined() || !result.defined() || self.numel() == 0 || !self.is_meta()) {
    return out;
  }
  // CUDA reduces a 16-bit float into a float32 result directly; any other dtype change
  // casts the input first (a copy the dry run does not make), left out here.
  const at::ScalarType in = self.scalar_type();
  const at::ScalarType out_type = result.scalar_type();
  const bool lowp_to_f32 = (in == at::kHalf || in == at::kBFloat16) && out_type == at::kFloat;
  if (in != out_type && !lowp_to_f32) {
    return out;
  }
  const int64_t arg_size = accumulator_size(in);
  if (arg_size == 0) {
    return out;
  }
  // The view below is an op of its own: neither recorded (it would re-enter the op
  // recorder inside this op's end) nor seen by autograd (no node, no sequence number).
  at::DisableRecordFunctionGuard no_record;
  at::AutoDispatchBelowADInplaceOrView no_autograd;
  const int64_t ndim = self.dim();
  const auto mask = at::native::make_dim_mask(dims, ndim);
  at::Tensor viewed = at::native::review_reduce_result(result, ndim, mask, keepdim);
  auto iter = at::TensorIterator::reduce_op(viewed, self);
  if (iter.numel() == 0) {
    return out;
  }
  constexpr int64_t kMaxThreads = 512;  // Reduce.cuh's MAX_NUM_THREADS (complex double aside)
  if (iter.can_use_32bit_indexing()) {
    buffers(iter, self, arg_size, kMaxThreads, gpu, out);
  } else {
    for (auto& sub : iter.with_32bit_indexing()) {
      buffers(sub, self, arg_size, kMaxThreads, gpu, out);
    }
  }
  return out;
}

}  // namespace

void set_reduce_gpu(int32_t multiprocessors, int32_t threads_per_multiprocessor) {
  g_multiprocessors.store(multiprocessors);
  g_threads_per_multiprocessor.store(threads_per_multiprocessor);
}

void reduce_started(const at::RecordFunction& fn, int depth) {
  if (!dim_reduction(fn)) {
    return;
  }
  try {
    const auto inputs = fn.inputs();
    if (inputs.size() < 3 || !inputs[0].isTensor()) {
      return;
    }
    Pending p;
    p.depth = depth;
    p.self = inputs[0].toTensor();
    p.has_dims = inputs[1].isIntList();
    if (p.has_dims) {
      p.dims = inputs[1].toIntVector();
    }
    p.keepdim = inputs[2].isBool() && inputs[2].toBool();
    tls_pending = std::move(p);
  } catch (...) {
    tls_pending = Pending{};
  }
}

void reduce_ended(const at::RecordFunction& fn, int depth) {
  if (tls_pending.depth != depth || !dim_reduction(fn)) {
    return;
  }
  Pending p = std::move(tls_pending);
  tls_pending = Pending{};
  try {
    const auto outputs = fn.outputs();
    if (outputs.empty() || !outputs[0].isTensor()) {
      return;
    }
    at::OptionalIntArrayRef dims;
    if (p.has_dims) {
      dims = at::IntArrayRef(p.dims);
    }
    const ReduceGpu gpu{g_multiprocessors.load(), g_threads_per_multiprocessor.load()};
    for (const int64_t bytes : reduction_buffers(p.self, outputs[0].toTensor(), dims, p.keepdim, gpu)) {
      meta_transient(bytes, kTransientExact);
    }
  } catch (...) {
    // A reduction the port cannot size takes no buffer: never an error in the model's
    // step.
  }
}

std::vector<int64_t> reduction_buffers_of(at::IntArrayRef sizes, at::IntArrayRef strides,
                                          int64_t offset, at::ScalarType in, at::ScalarType out,
                                          at::OptionalIntArrayRef dims, bool keepdim,
                                          const ReduceGpu& gpu) {
  // Meta tensors of the recorded geometry (no memory): the input as a view at its offset
  // into a storage that holds it, the output as the reduction makes it.
  at::DisableRecordFunctionGuard no_record;
  at::AutoDispatchBelowADInplaceOrView no_autograd;
  int64_t extent = offset + 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) {
      return {};
    }
    extent += (sizes[d] - 1) * strides[d];
  }
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor self = at::empty({extent}, meta.dtype(in)).as_strided(sizes, strides, offset);
  const at::Tensor result = at::sum(self, dims, keepdim, out);
  return reduction_buffers(self, result, dims, keepdim, gpu);
}

}  // namespace memprof
