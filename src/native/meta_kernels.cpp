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
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "internal.h"

namespace memprof {
namespace {

at::Tensor empty_as(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options());
}

at::Tensor conv_meta(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>&,
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
  return at::empty(out, input.options().memory_format(input.suggest_memory_format()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_backward_meta(
    const at::Tensor&,
    const at::Tensor& input,
    const at::Tensor& weight,
    at::IntArrayRef,
    at::IntArrayRef,
    at::IntArrayRef,
    bool,
    at::IntArrayRef,
    int64_t,
    std::array<bool, 3> mask) {
  // CUDA (cuDNN) gives the input and weight gradients; convolution_backward then sums
  // grad_output for the bias gradient when it is asked for and undefined here.
  return {
      mask[0] ? empty_as(input) : at::Tensor(),
      mask[1] ? empty_as(weight) : at::Tensor(),
      at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_meta(
    const at::Tensor& input,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    bool training,
    double,
    double) {
  // CUDA saves the batch mean and inverse deviation per channel in training; in
  // evaluation both are empty.
  const int64_t c = input.dim() > 1 ? input.size(1) : 1;
  const auto st = input.scalar_type();
  auto stat = input.options().dtype(
      (st == at::kHalf || st == at::kBFloat16) ? at::kFloat : st);
  return {
      empty_as(input),
      at::empty({training ? c : 0}, stat),
      at::empty({training ? c : 0}, stat)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_meta(
    const at::Tensor&,
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    bool,
    double,
    std::array<bool, 3> mask) {
  const int64_t c = input.dim() > 1 ? input.size(1) : 1;
  auto opts = (weight && weight->defined()) ? weight->options() : input.options();
  return {
      mask[0] ? empty_as(input) : at::Tensor(),
      mask[1] ? at::empty({c}, opts) : at::Tensor(),
      mask[2] ? at::empty({c}, opts) : at::Tensor()};
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

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

void register_meta_kernels() {
  // Kept for the life of the process (a registration ends with its Library).
  auto* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  if (!has_meta_kernel("aten::convolution_overrideable", "")) {
    lib->impl("convolution_overrideable", TORCH_FN(conv_meta));
  }
  if (!has_meta_kernel("aten::convolution_backward_overrideable", "")) {
    lib->impl("convolution_backward_overrideable", TORCH_FN(conv_backward_meta));
  }
  if (!has_meta_kernel("aten::native_batch_norm", "")) {
    lib->impl("native_batch_norm", TORCH_FN(batch_norm_meta));
  }
  if (!has_meta_kernel("aten::native_batch_norm_backward", "")) {
    lib->impl("native_batch_norm_backward", TORCH_FN(batch_norm_backward_meta));
  }
  if (!has_meta_kernel("aten::_adaptive_avg_pool2d", "")) {
    lib->impl("_adaptive_avg_pool2d", TORCH_FN(adaptive_avg_pool2d_meta));
  }
  if (!has_meta_kernel("aten::_adaptive_avg_pool2d_backward", "")) {
    lib->impl("_adaptive_avg_pool2d_backward", TORCH_FN(adaptive_avg_pool2d_backward_meta));
  }
  if (!has_meta_kernel("aten::relu", "")) {
    lib->impl("relu", TORCH_FN(unary_meta));
  }
  if (!has_meta_kernel("aten::relu_", "")) {
    lib->impl("relu_", TORCH_FN(unary_inplace_meta));
  }
  if (!has_meta_kernel("aten::hardswish_backward", "")) {
    lib->impl("hardswish_backward", TORCH_FN(hardswish_backward_meta));
  }
  if (!has_meta_kernel("aten::native_dropout", "")) {
    lib->impl("native_dropout", TORCH_FN(native_dropout_meta));
  }
  if (!has_meta_kernel("aten::native_dropout_backward", "")) {
    lib->impl("native_dropout_backward", TORCH_FN(native_dropout_backward_meta));
  }
  auto* autograd = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
  autograd->impl("dropout", TORCH_FN(dropout_as_on_cuda));
}

}  // namespace memprof
