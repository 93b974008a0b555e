// Meta kernels libtorch's C++ lacks (PyTorch's Python registers them in Python),
// registered on the meta device at the estimator's first trace, each only when no meta
// kernel is there already.
//
// The estimate's truth depends on them: the dry run's allocation sequence is the one
// these kernels make, so each allocates what the CUDA kernel allocates (its outputs and
// the tensors it saves for backward, with the CUDA kernel's sizes and dtypes; workspaces
// are the estimator's business). A kernel that allocated more, less, or in another
// dtype than its CUDA counterpart would shift every estimate of a model that uses it.
// `dropout` on meta is routed to the fused kernel, as it is on CUDA (output + a one-byte
// mask instead of a float noise tensor).

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dryrun.h"
#include "kernels.h"

namespace memprof {
namespace {

at::Tensor empty_as(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options());
}

// A tensor's bytes as the caching allocator counts them (a multiple of 512).
int64_t block_bytes(const at::Tensor& t) {
  const int64_t n = t.defined() ? int64_t(t.numel() * t.element_size()) : 0;
  return (n + 511) / 512 * 512;
}

// Whether a convolution is depthwise (a group per input channel).
bool depthwise(const at::Tensor& input, int64_t groups) {
  return input.dim() > 1 && groups > 1 && groups == input.size(1);
}

// cuDNN's workspace inside a CUDA convolution (PyTorch 2.11, cuDNN 9, cudnn.benchmark
// off), as an NVIDIA H200 measured it in 1,244 calls of 9 torchvision, timm and
// transformers models (tests/data/gpu-truth/h200-2026-11-26/workspaces.csv): bytes
// taken after the outputs and freed before the call returns. cuDNN sizes it by the
// execution plan its heuristics pick. On a GPU like the one measured, a measured call
// is charged what it took (conv_workspaces.cpp's table); otherwise the dry run cannot
// know the plan, and the estimate takes the larger plausible figure, in units of the
// call's tensors (each rounded to 512 B):
// - forward, input + weight + output: cuDNN converts them to its kernels' layout. 764
//   of the 804 calls took at most that (the 3x3 ones that take a workspace that in the
//   median, 16-bit image stems charged 1.9 times it, below); the rest up to 1.3 times
//   it (ResNet-50's float32 stride-2 3x3 convolution at 14x14);
// - backward, 1.5 x (output gradient + input + weight): the data and weight
//   gradients' workspaces (377 of the 440 calls took at most that, the rule below included, 3x3 ones 1.2 times
//   in the median, a few up to 4 times);
// - none for a depthwise convolution (a group per input channel) forward (all 144
//   calls), nor backward in the NCHW layout (all 31; in channels-last it takes some);
// - none for a forward pointwise one (1x1, stride 1, one group, NCHW) on at least 14x14
//   positions (all 218 calls took at most 512 B: cuDNN runs it as a matrix product on
//   the tensors as they are); on fewer, up to 0.8 times the sum.
// - none for a float32 NCHW image stem (3 input channels, one group): forward with a
//   kernel of at most 4 or one equal to its stride (all 16 calls: 3x3, 4x4 and 16x16
//   patchify stems; the two 7x7 stride-2 ones took the sum), backward with a kernel of
//   at most 3 (4 calls: none, or 4 KiB in VGG16's).
// - backward of a float32 depthwise one in channels-last on at least 28x28 positions,
//   4.3 times the unit (all 10 such calls, ConvNeXt-T's and ConvNeXtV2-nano's 7x7
//   ones on 56x56 and 28x28, took 4.1 to 4.3 times it; on 14x14 and fewer, 1.0).
// tests/cudnn_workspaces.rs checks these shares against the data and the charge of
// each measured call.
constexpr double kBackwardWorkspace = 1.5;
// A 16-bit image stem's forward (3 input channels, one group): 1.9 times the unit. Under
// bf16 autocast ViT-B's 16x16 patch embedding took 1.88 times it, ResNet-50's 7x7 stem
// 1.27 times (cuDNN converts the 3-channel image to a padded layout of its own).
constexpr double kHalfStemForward = 1.9;
constexpr double kDepthwiseChannelsLastBackward = 4.3;
constexpr int64_t kDepthwiseLargeFrom = 28 * 28;
constexpr int64_t kPointwiseFreeFrom = 14 * 14;

bool nchw(const at::Tensor& t) {
  return t.is_contiguous();
}

// A float32 NCHW convolution of a 3-channel image, one group, not transposed, whose
// kernel is at most `largest` or equal to its stride (`patchify`) in every dimension.
bool free_image_stem(
    const at::Tensor& input,
    const at::Tensor& weight,
    at::IntArrayRef stride,
    bool transposed,
    int64_t groups,
    int64_t largest,
    bool patchify) {
  if (input.dim() != 4 || transposed || groups != 1 || input.size(1) != 3 ||
      input.scalar_type() != at::kFloat || !nchw(input)) {
    return false;
  }
  for (int64_t d = 0; d < 2; ++d) {
    const int64_t k = weight.size(d + 2);
    const int64_t s = stride.empty() ? 1 : stride[std::min<int64_t>(d, int64_t(stride.size()) - 1)];
    if (k > largest && !(patchify && k == s)) {
      return false;
    }
  }
  return true;
}

bool free_pointwise(
    const at::Tensor& input,
    const at::Tensor& weight,
    at::IntArrayRef stride,
    bool transposed,
    int64_t groups) {
  if (input.dim() != 4 || transposed || groups != 1 || !nchw(input) ||
      weight.size(2) != 1 || weight.size(3) != 1) {
    return false;
  }
  for (int64_t s : stride) {
    if (s != 1) {
      return false;
    }
  }
  return input.size(2) * input.size(3) >= kPointwiseFreeFrom;
}

at::Tensor conv_meta(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    at::IntArrayRef stride,
    at::IntArrayRef padding,
    at::IntArrayRef dilation,
    bool transposed,
    at::IntArrayRef output_padding,
    int64_t groups) {
  const int64_t dims = input.dim() - 2;
  TORCH_CHECK(dims >= 1 && weight.dim() == input.dim(), "convolution: input ", input.sizes(),
              " and weight ", weight.sizes(), " do not match");
  auto at_or_last = [](at::IntArrayRef v, int64_t i, int64_t dflt) {
    if (v.empty()) {
      return dflt;
    }
    return v[std::min<int64_t>(i, int64_t(v.size()) - 1)];
  };
  std::vector<int64_t> out{input.size(0)};
  out.push_back(transposed ? weight.size(1) * groups : weight.size(0));
  for (int64_t d = 0; d < dims; ++d) {
    const int64_t in = input.size(d + 2);
    const int64_t k = weight.size(d + 2);
    const int64_t s = at_or_last(stride, d, 1);
    const int64_t p = at_or_last(padding, d, 0);
    const int64_t dl = at_or_last(dilation, d, 1);
    int64_t o;
    if (transposed) {
      o = (in - 1) * s - 2 * p + dl * (k - 1) + at_or_last(output_padding, d, 0) + 1;
    } else {
      o = (in + 2 * p - dl * (k - 1) - 1) / s + 1;
    }
    TORCH_CHECK(o > 0, "convolution: input ", input.sizes(), " is too small for kernel ",
                weight.sizes(), " (output size ", o, ")");
    out.push_back(o);
  }
  at::Tensor output =
      at::empty(out, input.options().memory_format(input.suggest_memory_format()));
  const ConvParams params{stride, padding, dilation, transposed, output_padding, groups};
  if (const auto measured = measured_conv_workspace(input, weight, bias, params)) {
    meta_transient(*measured, kTransientExact);
  } else if (!depthwise(input, groups) &&
             !free_pointwise(input, weight, stride, transposed, groups) &&
             !free_image_stem(input, weight, stride, transposed, groups, 4, true)) {
    const int64_t unit = block_bytes(input) + block_bytes(weight) + block_bytes(output);
    const bool half_stem = input.dim() == 4 && input.size(1) == 3 && groups == 1 && !transposed &&
                           (input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf);
    meta_transient(half_stem ? int64_t(kHalfStemForward * double(unit)) : unit, kTransientBound);
  }
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_backward_meta(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& weight,
    at::IntArrayRef stride,
    at::IntArrayRef padding,
    at::IntArrayRef dilation,
    bool transposed,
    at::IntArrayRef output_padding,
    int64_t groups,
    std::array<bool, 3> mask) {
  // CUDA (cuDNN) gives the input and weight gradients; convolution_backward then sums
  // grad_output for the bias gradient when it is asked for and undefined here.
  const bool channels_last =
      input.dim() == 4 && !nchw(input) && input.is_contiguous(at::MemoryFormat::ChannelsLast);
  const bool free_stem = free_image_stem(input, weight, stride, transposed, groups, 3, false);
  int64_t rule = 0;
  if ((!depthwise(input, groups) || channels_last) && !free_stem) {
    const int64_t tensors = block_bytes(grad_output) + block_bytes(input) + block_bytes(weight);
    const bool large_depthwise = depthwise(input, groups) && channels_last &&
                                 input.scalar_type() == at::kFloat &&
                                 input.size(2) * input.size(3) >= kDepthwiseLargeFrom;
    const double unit = large_depthwise ? kDepthwiseChannelsLastBackward : kBackwardWorkspace;
    rule = int64_t(unit * double(tensors));
  }
  const ConvParams params{stride, padding, dilation, transposed, output_padding, groups};
  const auto measured =
      measured_conv_backward_workspace(grad_output, input, weight, params, mask);
  // cuDNN's data gradient takes its workspace after the input gradient, its weight
  // gradient after the weight gradient: each request as the GPU made it where the
  // trace showed it, at the larger plausible size where the call was not measured.
  // A call measured only as the most it held at once is charged that after both.
  // Beside a measured call, the rule's size, for the pool's other plausible layout.
  const bool split = !measured || measured->data >= 0;
  const int32_t kind = measured ? kTransientSplit : kTransientBound;
  at::Tensor grad_input = mask[0] ? empty_as(input) : at::Tensor();
  if (split) {
    meta_transient(measured ? measured->data : mask[0] ? rule : 0, kind);
  }
  at::Tensor grad_weight = mask[1] ? empty_as(weight) : at::Tensor();
  if (split) {
    meta_transient(measured ? measured->weight : mask[1] ? rule : 0, kind);
  }
  if (measured) {
    if (!split) {
      meta_transient(measured->held, kTransientMeasured);
    }
    meta_transient(rule, kTransientRule);
  }
  return {grad_input, grad_weight, at::Tensor()};
}

at::Tensor adaptive_avg_pool2d_meta(const at::Tensor& input, at::IntArrayRef output_size) {
  TORCH_CHECK(output_size.size() == 2, "adaptive_avg_pool2d: output_size must have 2 values");
  std::vector<int64_t> out(input.sizes().begin(), input.sizes().end() - 2);
  out.push_back(output_size[0]);
  out.push_back(output_size[1]);
  return at::empty(out, input.options());
}

at::Tensor adaptive_avg_pool2d_backward_meta(const at::Tensor&, const at::Tensor& input) {
  return empty_as(input);
}

at::Tensor unary_meta(const at::Tensor& self) {
  return empty_as(self);
}

at::Tensor& unary_inplace_meta(at::Tensor& self) {
  return self;
}

at::Tensor hardswish_backward_meta(const at::Tensor& grad_output, const at::Tensor&) {
  return empty_as(grad_output);
}

std::tuple<at::Tensor, at::Tensor> native_dropout_meta(
    const at::Tensor& input,
    double,
    std::optional<bool>) {
  // CUDA: the output and a one-byte mask (in evaluation, a copy and an all-true mask).
  return {empty_as(input), at::empty(input.sizes(), input.options().dtype(at::kBool))};
}

at::Tensor native_dropout_backward_meta(const at::Tensor& grad_output, const at::Tensor&, double) {
  return empty_as(grad_output);
}

// aten::dropout on meta tensors, as libtorch runs it on CUDA: the fused kernel when
// training with 0 < p < 1 (output + one-byte mask saved for backward), the input
// itself when not training.
at::Tensor dropout_as_on_cuda(const at::Tensor& input, double p, bool train) {
  if (!train || p == 0 || input.numel() == 0) {
    return input;
  }
  if (p >= 1) {
    return input * at::zeros({}, input.options());
  }
  return std::get<0>(at::native_dropout(input, p, train));
}

// index_select (embedding's forward): the output only, self's sizes with `dim` the
// index's length, as the CUDA kernel allocates it.
at::Tensor index_select_meta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (sizes.empty()) {
    return at::empty({}, self.options());
  }
  const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
  sizes[d] = index.numel();
  return at::empty(sizes, self.options());
}

// where.self: the broadcast shape of the three, in the promoted dtype of self and other.
at::Tensor where_meta(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  const auto shape = at::infer_size(at::infer_size(cond.sizes(), self.sizes()), other.sizes());
  const auto dtype = at::result_type(self, other);
  return at::empty(shape, self.options().dtype(dtype));
}

// where.self_out (what where.self's composite kernel calls): `out` resized to the
// broadcast shape (CUDA's kernel allocates it so through its TensorIterator).
at::Tensor& where_out_meta(const at::Tensor& cond, const at::Tensor& self,
                           const at::Tensor& other, at::Tensor& out) {
  out.resize_(at::infer_size(at::infer_size(cond.sizes(), self.sizes()), other.sizes()));
  return out;
}

// embedding_dense_backward: CUDA sorts the indices (two int64 buffers the size of the
// indices, freed when the kernel ends) and returns a `[num_weights, dim]` gradient.
at::Tensor embedding_dense_backward_meta(const at::Tensor& grad, const at::Tensor& indices,
                                         c10::SymInt num_weights, c10::SymInt padding_idx,
                                         bool scale_grad_by_freq) {
  (void)padding_idx;
  (void)scale_grad_by_freq;
  const auto n = indices.numel();
  auto sorted = at::empty({n}, indices.options().dtype(at::kLong));
  auto orig = at::empty({n}, indices.options().dtype(at::kLong));
  const int64_t dim = grad.size(-1);
  auto out = at::empty({num_weights.expect_int(), dim}, grad.options());
  return out;
}

// `aten::equal` on meta tensors (TorchScript's loader compares constants with it): equal
// only when they are the same tensor, since meta tensors have no data. A loader that
// would have merged two equal constants keeps both: at most an over-estimate of their
// bytes, never an under-estimate.
bool equal_meta(const at::Tensor& a, const at::Tensor& b) {
  return a.is_same(b);
}

// tch has no meta device: a meta tensor's device reads as MPS in tch
// (`Tensor::device()` gives `Device::Mps`), so tch code that makes a tensor "on its
// input's device" asks for MPS. This libtorch has no MPS backend; while a dry run is on,
// every op that reaches the MPS dispatch key with an MPS device argument runs again with
// the meta device instead, so such code runs unchanged in the dry run. Outside a dry run
// the op fails as it would have, with a message that says why.
void mps_as_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TORCH_CHECK(meta_trace_on(), op.schema().name(),
              " was asked for the MPS device, which this libtorch does not have "
              "(tch-memprof maps MPS to the meta device only during an estimate's dry run)");
  const size_t n = op.schema().arguments().size();
  bool moved = false;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isDevice() && it->toDevice().type() == c10::DeviceType::MPS) {
      *it = c10::IValue(c10::Device(c10::kMeta));
      moved = true;
    }
  }
  TORCH_CHECK(moved, op.schema().name(),
              " reached the MPS backend without an MPS device argument");
  op.callBoxed(stack);
}

// Ops PyTorch runs on meta from Python (its meta registrations and decompositions) and
// libtorch's C++ does not. Each allocates what the CUDA kernel allocates.

// roll: a new tensor of the input's sizes.
at::Tensor roll_meta(const at::Tensor& self, at::IntArrayRef, at::IntArrayRef) {
  return empty_as(self);
}

// hardtanh_backward (ReLU6 in MobileNets), hardsigmoid_backward: a gradient the size
// of grad_output.
at::Tensor hardtanh_backward_meta(const at::Tensor& grad_output, const at::Tensor&,
                                  const at::Scalar&, const at::Scalar&) {
  return empty_as(grad_output);
}

at::Tensor hardsigmoid_backward_meta(const at::Tensor& grad_output, const at::Tensor&) {
  return empty_as(grad_output);
}

// The `.out` form of a unary op whose functional form is a composite that makes its
// output and calls it (abs): `out` takes self's sizes.
at::Tensor& unary_out_meta(const at::Tensor& self, at::Tensor& out) {
  out.resize_(self.sizes());
  return out;
}

// The dtype a reduction accumulates half and bfloat16 in on CUDA.
at::ScalarType acc_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

// _weight_norm_interface (weight_norm, as wav2vec2's positional convolution uses it):
// the weight, and the norms of g's shape in the accumulation dtype, saved for backward.
std::tuple<at::Tensor, at::Tensor> weight_norm_meta(const at::Tensor& v, const at::Tensor& g,
                                                    int64_t) {
  return {empty_as(v), at::empty(g.sizes(), g.options().dtype(acc_type(g.scalar_type())))};
}

std::tuple<at::Tensor, at::Tensor> weight_norm_backward_meta(
    const at::Tensor&, const at::Tensor& saved_v, const at::Tensor& saved_g, const at::Tensor&,
    int64_t) {
  return {empty_as(saved_v), empty_as(saved_g)};
}

// native_group_norm_backward: the gradients asked for, and (as CUDA's kernel does) two
// [N, C] partial sums in the accumulation dtype, freed when the kernel ends.
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_backward_meta(
    const at::Tensor&, const at::Tensor& input, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>& weight, c10::SymInt n, c10::SymInt c, c10::SymInt,
    int64_t, std::array<bool, 3> mask) {
  const auto acc = input.options().dtype(acc_type(input.scalar_type()));
  {
    auto ds = at::empty({n.expect_int(), c.expect_int()}, acc);
    auto db = at::empty({n.expect_int(), c.expect_int()}, acc);
  }
  auto opts = (weight && weight->defined()) ? weight->options() : input.options();
  return {mask[0] ? empty_as(input) : at::Tensor(),
          mask[1] ? at::empty({c.expect_int()}, opts) : at::Tensor(),
          mask[2] ? at::empty({c.expect_int()}, opts) : at::Tensor()};
}

// The sizes a reduction over `dim` (all dimensions when none) leaves.
std::vector<int64_t> reduced_sizes(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                   bool keepdim) {
  std::vector<bool> reduce(size_t(self.dim()), !dim.has_value() || dim->empty());
  if (dim.has_value()) {
    for (int64_t d : *dim) {
      reduce[size_t(c10::maybe_wrap_dim(d, self.dim()))] = true;
    }
  }
  std::vector<int64_t> out;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!reduce[size_t(d)]) {
      out.push_back(self.size(d));
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

at::ScalarType real_type(at::ScalarType t) {
  return at::isComplexType(t) ? c10::toRealValueType(t) : t;
}

// var.correction and std.correction (a hand-written LayerNorm's `x.var(-1)`): the
// reduced tensor, real for complex input.
at::Tensor var_meta(const at::Tensor& self, at::OptionalIntArrayRef dim,
                    const std::optional<at::Scalar>&, bool keepdim) {
  return at::empty(reduced_sizes(self, dim, keepdim),
                   self.options().dtype(real_type(self.scalar_type())));
}

std::tuple<at::Tensor, at::Tensor> var_mean_meta(const at::Tensor& self,
                                                 at::OptionalIntArrayRef dim,
                                                 const std::optional<at::Scalar>&,
                                                 bool keepdim) {
  const auto sizes = reduced_sizes(self, dim, keepdim);
  return {at::empty(sizes, self.options().dtype(real_type(self.scalar_type()))),
          at::empty(sizes, self.options())};
}

// _native_multi_head_attention (nn.MultiheadAttention's inference fast path, as in
// torchvision's ViT in eval mode), as CUDA runs it: the packed input projection, q, k
// and v laid out per head by _transform_bias_rescale_qkv (one [3, B, H, L, D] tensor),
// scaled_dot_product_attention (the backend the dry run's attention rules pick), the
// heads joined and the output projection; with need_weights, the math path's weights.
std::tuple<at::Tensor, at::Tensor> native_mha_meta(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim,
    int64_t num_head, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
    const at::Tensor& proj_weight, const at::Tensor& proj_bias,
    const std::optional<at::Tensor>& mask, bool need_weights, bool average_attn_weights,
    std::optional<int64_t>) {
  TORCH_CHECK(query.dim() == 3 && num_head > 0 && embed_dim % num_head == 0,
              "_native_multi_head_attention: query ", query.sizes(), " with ", num_head,
              " heads of embedding ", embed_dim);
  (void)key;
  (void)value;
  const int64_t b = query.size(0), l = query.size(1), h = num_head, d = embed_dim / num_head;
  const int64_t s = key.dim() == 3 ? key.size(1) : l;
  at::Tensor qkv_heads;
  {
    auto qkv = at::linear(query, qkv_weight, qkv_bias);
    qkv_heads = at::empty({3, b, h, l, d}, query.options());
  }
  at::Tensor joined, weights;
  if (need_weights) {
    auto scores = at::empty({b, h, l, s}, query.options());
    auto probs = at::empty({b, h, l, s}, query.options());
    scores.reset();
    auto heads = at::empty({b, h, l, d}, query.options());
    qkv_heads.reset();
    joined = at::empty({b, l, embed_dim}, query.options());
    heads.reset();
    weights = average_attn_weights ? at::empty({b, l, s}, query.options()) : probs;
  } else {
    auto parts = qkv_heads.unbind(0);
    auto heads = at::scaled_dot_product_attention(
        parts[0], parts[1], parts[2], mask.has_value() ? *mask : std::optional<at::Tensor>());
    parts.clear();
    qkv_heads.reset();
    joined = at::empty({b, l, embed_dim}, query.options());
    weights = at::empty({0}, query.options());
  }
  auto out = at::linear(joined, proj_weight, proj_bias);
  return {out, weights};
}

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}


// The kernels above, by the op (and overload) each is the meta kernel of.

const MetaKernel kMetaKernels[] = {
    {"convolution_overrideable", [] { return torch::CppFunction(TORCH_FN(conv_meta)); }},
    {"convolution_backward_overrideable",
     [] { return torch::CppFunction(TORCH_FN(conv_backward_meta)); }},
    {"_adaptive_avg_pool2d",
     [] { return torch::CppFunction(TORCH_FN(adaptive_avg_pool2d_meta)); }},
    {"_adaptive_avg_pool2d_backward",
     [] { return torch::CppFunction(TORCH_FN(adaptive_avg_pool2d_backward_meta)); }},
    {"relu", [] { return torch::CppFunction(TORCH_FN(unary_meta)); }},
    {"relu_", [] { return torch::CppFunction(TORCH_FN(unary_inplace_meta)); }},
    {"hardswish_backward", [] { return torch::CppFunction(TORCH_FN(hardswish_backward_meta)); }},
    {"native_dropout", [] { return torch::CppFunction(TORCH_FN(native_dropout_meta)); }},
    {"native_dropout_backward",
     [] { return torch::CppFunction(TORCH_FN(native_dropout_backward_meta)); }},
    {"index_select", [] { return torch::CppFunction(TORCH_FN(index_select_meta)); }},
    {"where.self", [] { return torch::CppFunction(TORCH_FN(where_meta)); }},
    {"where.self_out", [] { return torch::CppFunction(TORCH_FN(where_out_meta)); }},
    {"embedding_dense_backward",
     [] { return torch::CppFunction(TORCH_FN(embedding_dense_backward_meta)); }},
    {"equal", [] { return torch::CppFunction(TORCH_FN(equal_meta)); }},
    {"roll", [] { return torch::CppFunction(TORCH_FN(roll_meta)); }},
    {"hardswish", [] { return torch::CppFunction(TORCH_FN(unary_meta)); }},
    {"hardswish_", [] { return torch::CppFunction(TORCH_FN(unary_inplace_meta)); }},
    {"hardtanh_backward", [] { return torch::CppFunction(TORCH_FN(hardtanh_backward_meta)); }},
    {"hardsigmoid_backward",
     [] { return torch::CppFunction(TORCH_FN(hardsigmoid_backward_meta)); }},
    {"abs.out", [] { return torch::CppFunction(TORCH_FN(unary_out_meta)); }},
    {"_weight_norm_interface", [] { return torch::CppFunction(TORCH_FN(weight_norm_meta)); }},
    {"_weight_norm_interface_backward",
     [] { return torch::CppFunction(TORCH_FN(weight_norm_backward_meta)); }},
    {"native_group_norm_backward",
     [] { return torch::CppFunction(TORCH_FN(group_norm_backward_meta)); }},
    {"var.correction", [] { return torch::CppFunction(TORCH_FN(var_meta)); }},
    {"std.correction", [] { return torch::CppFunction(TORCH_FN(var_meta)); }},
    {"var_mean.correction", [] { return torch::CppFunction(TORCH_FN(var_mean_meta)); }},
    {"std_mean.correction", [] { return torch::CppFunction(TORCH_FN(var_mean_meta)); }},
    {"_native_multi_head_attention",
     [] { return torch::CppFunction(TORCH_FN(native_mha_meta)); }},
    {"logical_not.out", [] { return torch::CppFunction(TORCH_FN(unary_out_meta)); }},
    {"conj_physical.out", [] { return torch::CppFunction(TORCH_FN(unary_out_meta)); }},
    {"angle.out", [] { return torch::CppFunction(TORCH_FN(unary_out_meta)); }},
};

}  // namespace

// The ops whose meta kernel the dry run registered (`aten::name.overload`), in
// register_meta_kernels (once, before any dry run).
std::vector<std::string>& registered_kernels() {
  static std::vector<std::string> ops;
  return ops;
}

std::string meta_inventory() {
  auto& dispatcher = c10::Dispatcher::singleton();
  std::vector<std::string> lines;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    const auto op = dispatcher.findOp(name);
    if (!op.has_value() || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    const std::string full = name.overload_name.empty()
        ? name.name
        : name.name + "." + name.overload_name;
    const bool meta = op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
    const auto& mine = registered_kernels();
    const bool ours = std::find(mine.begin(), mine.end(), full) != mine.end();
    if (ours || !meta) {
      lines.push_back(full + (ours ? "\tours\n" : "\tmissing\n"));
    }
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) {
    out += l;
  }
  return out;
}

void register_meta_kernels() {
  // Kept for the life of the process (a registration ends with its Library).
  auto* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  // Each only where this libtorch has no meta kernel for the op.
  std::vector<MetaKernel> all(std::begin(kMetaKernels), std::end(kMetaKernels));
  all.insert(all.end(), kGapKernels, kGapKernels + kGapKernelCount);
  all.insert(all.end(), kNormKernels, kNormKernels + kNormKernelCount);
  for (const MetaKernel& k : all) {
    const std::string op = k.op;
    const size_t dot = op.find('.');
    const std::string name = "aten::" + op.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : op.substr(dot + 1);
    if (!has_meta_kernel(name.c_str(), overload.c_str())) {
      // An op this libtorch does not have, or whose schema differs from the kernel's,
      // is left out (the inventory then lists it as missing) rather than failing every
      // dry run.
      try {
        lib->impl(op.c_str(), k.kernel());
        registered_kernels().push_back(name + (overload.empty() ? "" : "." + overload));
      } catch (const std::exception&) {
      }
    }
  }
  register_engine_kernels(*lib);
  // A device guard for MPS that does nothing (as meta's does), so that `.to(MPS)` and
  // other ops that take a device guard reach the fallback below instead of failing with
  // "not linked with support for mps devices". Only where this libtorch has none.
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::MPS)) {
    c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::MPS)].store(
        new c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::MPS>());
  }
  if (!c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::MPS)) {
    auto* mps = new torch::Library(
        torch::Library::IMPL, "_", c10::DispatchKey::MPS, __FILE__, __LINE__);
    mps->fallback(torch::CppFunction::makeFromBoxedFunction<&mps_as_meta>());
  }
  auto* autograd = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
  autograd->impl("dropout", TORCH_FN(dropout_as_on_cuda));
  register_attention_kernels();
}

}  // namespace memprof
