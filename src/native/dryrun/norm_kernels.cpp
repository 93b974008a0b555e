// The normalizations' meta kernels (batch norm, layer norm, forward and backward),
// registered with kernels.cpp's: each allocates what CUDA's kernel allocates, its
// temporaries included.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace memprof {
namespace {

at::Tensor empty_as(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options());
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

// native_layer_norm as CUDA's kernel (layer_norm_cuda) allocates: the input made
// contiguous (a copy where it is not, as after a permute to channels-last, freed when
// the call returns), the output in the contiguous layout, then the mean and inverse
// deviation per normalized row in the accumulate type (float for float, half and
// bfloat16): per layer norm of ConvNeXt-T, two input-sized blocks and the two
// statistics in the H200's recorded trace (tests/data/gpu-truth/h200-2026-11-27/
// snapshots/traced/tv_convnext_tiny.infer.cpu.pickle.gz). Without it the meta device
// runs the composite math_native_layer_norm, whose temporaries CUDA does not make.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_meta(
    const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, double) {
  const int64_t axis = input.dim() - int64_t(normalized_shape.size());
  TORCH_CHECK(axis >= 0, "layer_norm: input ", input.sizes(), " has fewer dimensions than ",
              "normalized_shape ", normalized_shape);
  const at::Tensor x = input.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  int64_t rows = 1;
  std::vector<int64_t> stat_shape;
  for (int64_t i = 0; i < input.dim(); ++i) {
    if (i < axis) {
      rows *= input.size(i);
    }
    stat_shape.push_back(i < axis ? input.size(i) : 1);
  }
  const auto st = input.scalar_type();
  const auto acc = x.options().dtype((st == at::kHalf || st == at::kBFloat16) ? at::kFloat : st);
  at::Tensor mean = at::empty({rows}, acc);
  at::Tensor rstd = at::empty({rows}, acc);
  return {y, mean.view(stat_shape), rstd.view(stat_shape)};
}

// native_layer_norm_backward as CUDA's kernel (layer_norm_backward_cuda, PyTorch 2.11)
// allocates: the input made contiguous (a copy where it is not, as after ConvNeXt's
// permute to channels-last), the gradients asked for by `mask` (input, weight, bias),
// the output gradient made contiguous; for over 64Ki rows and fewer than 66x32 columns
// (half a Hopper GPU's 132 multiprocessors' worth: the kernel splits the rows then),
// partial sums of the weight and bias gradients ([blocks, N], N the weight's last size, blocks = min(32768 /
// ceil(N / 32), ceil(M / 32))) summed into new gradients that replace the first ones.
// The temporaries are freed when the call returns: the partial sums, then the output
// gradient's copy, then the input's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_meta(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  (void)mean;
  (void)rstd;
  const int64_t axis = input.dim() - int64_t(normalized_shape.size());
  TORCH_CHECK(axis >= 0, "layer_norm_backward: input ", input.sizes(),
              " has fewer dimensions than normalized_shape ", normalized_shape);
  int64_t rows = 1;
  for (int64_t i = 0; i < axis; ++i) {
    rows *= input.size(i);
  }
  const int64_t cols = rows > 0 ? input.numel() / rows : 0;
  const at::Tensor x = input.contiguous();
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    gi = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  }
  if (mask[1] && weight.has_value() && weight->defined()) {
    gw = at::empty(weight->sizes(), weight->options());
  }
  if (mask[2] && bias.has_value() && bias->defined()) {
    gb = at::empty(bias->sizes(), bias->options());
  }
  if (rows > 0 && cols > 0) {
    const at::Tensor dy = grad_out.contiguous();
    constexpr int64_t kHopperMultiprocessors = 132;
    if ((gw.defined() || gb.defined()) && rows > 64 * 1024 &&
        cols / 32 < kHopperMultiprocessors / 2) {
      const int64_t bx = (cols + 31) / 32;
      const int64_t by = std::min<int64_t>(32768 / bx, (rows + 31) / 32);
      const at::Tensor& like = gw.defined() ? gw : gb;
      at::Tensor gw_blocks, gb_blocks;
      if (gw.defined()) {
        gw_blocks = at::empty({by, like.size(-1)}, gw.options());
      }
      if (gb.defined()) {
        gb_blocks = at::empty({by, like.size(-1)}, gb.options());
      }
      if (gw.defined()) {
        gw = at::empty(gw.sizes(), gw.options());
      }
      if (gb.defined()) {
        gb = at::empty(gb.sizes(), gb.options());
      }
    }
  }
  return {gi, gw, gb};
}

}  // namespace

const MetaKernel kNormKernels[] = {
    {"native_batch_norm", [] { return torch::CppFunction(TORCH_FN(batch_norm_meta)); }},
    {"native_batch_norm_backward",
     [] { return torch::CppFunction(TORCH_FN(batch_norm_backward_meta)); }},
    {"native_layer_norm", [] { return torch::CppFunction(TORCH_FN(layer_norm_meta)); }},
    {"native_layer_norm_backward",
     [] { return torch::CppFunction(TORCH_FN(layer_norm_backward_meta)); }},
};
const size_t kNormKernelCount = sizeof(kNormKernels) / sizeof(kNormKernels[0]);

}  // namespace memprof
