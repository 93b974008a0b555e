// Meta kernels from the inventory's gap (ops PyTorch runs on meta from Python and
// libtorch's C++ does not), registered with kernels.cpp's: each allocates its output
// as the CUDA kernel does. tests/meta_kernels.rs checks each against the CPU kernel's
// sizes and dtypes.

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/index_add_meta_dispatch.h>
#include <ATen/ops/scatter_add_meta_dispatch.h>
#include <ATen/ops/scatter_meta_dispatch.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "dryrun.h"
#include "kernels.h"

namespace memprof {
namespace {

at::Tensor empty_as(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options());
}

// An op whose output has the input's sizes and dtype (flip, hardtanh, logit, isnan's
// sizes, channel_shuffle) and the backward of an op whose input gradient does.
at::Tensor flip_meta(const at::Tensor& self, at::IntArrayRef) {
  return empty_as(self);
}

at::Tensor hardtanh_meta(const at::Tensor& self, const at::Scalar&, const at::Scalar&) {
  return empty_as(self);
}

at::Tensor logit_meta(const at::Tensor& self, std::optional<double>) {
  return empty_as(self);
}

at::Tensor isnan_meta(const at::Tensor& self) {
  return at::empty(self.sizes(), self.options().dtype(at::kBool));
}

at::Tensor channel_shuffle_meta(const at::Tensor& self, c10::SymInt) {
  return empty_as(self);
}

// Two tensors broadcast together, in their promoted dtype (rsub, floor_divide).
at::Tensor broadcast_meta(const at::Tensor& self, const at::Tensor& other) {
  return at::empty(at::infer_size(self.sizes(), other.sizes()),
                   self.options().dtype(at::result_type(self, other)));
}

at::Tensor rsub_meta(const at::Tensor& self, const at::Tensor& other, const at::Scalar&) {
  return broadcast_meta(self, other);
}

// A full reduction to a scalar tensor (dot, vdot, trace, max, min).
at::Tensor scalar_of_meta(const at::Tensor& self) {
  return at::empty({}, self.options());
}

at::Tensor dot_meta(const at::Tensor& self, const at::Tensor&) {
  return at::empty({}, self.options());
}

// Padding by reflection: the last two sizes grow by their pads.
at::Tensor reflection_pad2d_meta(const at::Tensor& self, c10::SymIntArrayRef padding) {
  TORCH_CHECK(padding.size() == 4 && self.dim() >= 2, "reflection_pad2d: padding ",
              padding, " for input ", self.sizes());
  auto sizes = self.sizes().vec();
  const size_t h = sizes.size() - 2, w = sizes.size() - 1;
  sizes[w] += padding[0].expect_int() + padding[1].expect_int();
  sizes[h] += padding[2].expect_int() + padding[3].expect_int();
  return at::empty(sizes, self.options());
}

// The gradient of an input shaped as `self` (the padding backwards, glu's, the losses').
at::Tensor pad2d_backward_meta(const at::Tensor&, const at::Tensor& self, c10::SymIntArrayRef) {
  return empty_as(self);
}

at::Tensor glu_backward_meta(const at::Tensor&, const at::Tensor& self, int64_t) {
  return empty_as(self);
}

at::Tensor mse_loss_backward_meta(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                  int64_t) {
  return empty_as(self);
}

at::Tensor bce_backward_meta(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                             const std::optional<at::Tensor>&, int64_t) {
  return empty_as(self);
}

// binary_cross_entropy: the loss per element without reduction, else a scalar.
at::Tensor bce_meta(const at::Tensor& self, const at::Tensor&, const std::optional<at::Tensor>&,
                    int64_t reduction) {
  return reduction == 0 ? empty_as(self) : at::empty({}, self.options());
}

// nll_loss2d (a segmentation loss): the loss per pixel without reduction, else a
// scalar, and the total weight.
std::tuple<at::Tensor, at::Tensor> nll_loss2d_meta(const at::Tensor& self,
                                                   const at::Tensor& target,
                                                   const std::optional<at::Tensor>&,
                                                   int64_t reduction, c10::SymInt) {
  return {reduction == 0 ? at::empty(target.sizes(), self.options())
                         : at::empty({}, self.options()),
          at::empty({}, self.options())};
}

at::Tensor nll_loss2d_backward_meta(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t, c10::SymInt,
                                    const at::Tensor&) {
  return empty_as(self);
}

// log_sigmoid: CUDA's forward returns an empty buffer beside its output.
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward_meta(const at::Tensor& self) {
  return {empty_as(self), at::empty({0}, self.options())};
}

at::Tensor log_sigmoid_backward_meta(const at::Tensor&, const at::Tensor& self, const at::Tensor&) {
  return empty_as(self);
}

// PReLU: the output as the input; its backward the input's and the weight's gradients.
at::Tensor prelu_meta(const at::Tensor& self, const at::Tensor&) {
  return empty_as(self);
}

std::tuple<at::Tensor, at::Tensor> prelu_backward_meta(const at::Tensor&, const at::Tensor& self,
                                                       const at::Tensor& weight) {
  return {empty_as(self), empty_as(weight)};
}

// grid_sample: [N, C] of the input, the grid's spatial sizes; its backward the
// gradients asked for.
at::Tensor grid_sampler_2d_meta(const at::Tensor& input, const at::Tensor& grid, int64_t,
                                int64_t, bool) {
  TORCH_CHECK(input.dim() == 4 && grid.dim() == 4, "grid_sampler_2d: input ", input.sizes(),
              " and grid ", grid.sizes());
  return at::empty({input.size(0), input.size(1), grid.size(1), grid.size(2)}, input.options());
}

std::tuple<at::Tensor, at::Tensor> grid_sampler_2d_backward_meta(
    const at::Tensor&, const at::Tensor& input, const at::Tensor& grid, int64_t, int64_t, bool,
    std::array<bool, 2> mask) {
  return {mask[0] ? empty_as(input) : at::Tensor(), empty_as(grid)};
}

// unfold's backward: a gradient of the unfolded input's sizes.
at::Tensor unfold_backward_meta(const at::Tensor& grad_in, c10::SymIntArrayRef input_sizes,
                                int64_t, int64_t, int64_t) {
  return at::empty(C10_AS_INTARRAYREF_SLOW(input_sizes), grad_in.options());
}

// The `.out` form of a binary op whose functional form is a composite that makes its
// output and calls it (logical_and, logical_or, logical_xor): `out` takes the
// broadcast sizes.
at::Tensor& binary_out_meta(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  out.resize_(at::infer_size(self.sizes(), other.sizes()));
  return out;
}

// take: the index's sizes, the input's dtype.
at::Tensor take_meta(const at::Tensor& self, const at::Tensor& index) {
  return at::empty(index.sizes(), self.options());
}

// The batch norms core ATen writes (torch.export's run_decompositions()): as CUDA's
// batch_norm_cuda, the output like the input and, in training, the batch mean and
// inverse deviation per channel (f32 for half inputs); empty in evaluation. The
// functional form also returns the updated running statistics.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit(const at::Tensor& input, bool training) {
  const int64_t c = input.dim() > 1 ? input.size(1) : 1;
  const auto st = input.scalar_type();
  auto stat = input.options().dtype((st == at::kHalf || st == at::kBFloat16) ? at::kFloat : st);
  return {at::empty(input.sizes(), input.options()), at::empty({training ? c : 0}, stat),
          at::empty({training ? c : 0}, stat)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit_meta(
    const at::Tensor& input, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    at::Tensor&, at::Tensor&, bool training, double, double) {
  return bn_legit(input, training);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit_no_stats_meta(
    const at::Tensor& input, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    bool training, double, double) {
  return bn_legit(input, training);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> bn_legit_functional_meta(
    const at::Tensor& input, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const at::Tensor& running_mean, const at::Tensor& running_var, bool training, double,
    double) {
  auto [out, mean, invstd] = bn_legit(input, training);
  return {out, mean, invstd, empty_as(running_mean), empty_as(running_var)};
}

}  // namespace

const MetaKernel kGapKernels[] = {
    {"flip", [] { return torch::CppFunction(TORCH_FN(flip_meta)); }},
    {"hardtanh", [] { return torch::CppFunction(TORCH_FN(hardtanh_meta)); }},
    {"logit", [] { return torch::CppFunction(TORCH_FN(logit_meta)); }},
    {"isnan", [] { return torch::CppFunction(TORCH_FN(isnan_meta)); }},
    {"channel_shuffle", [] { return torch::CppFunction(TORCH_FN(channel_shuffle_meta)); }},
    {"rsub.Tensor", [] { return torch::CppFunction(TORCH_FN(rsub_meta)); }},
    {"floor_divide", [] { return torch::CppFunction(TORCH_FN(broadcast_meta)); }},
    {"dot", [] { return torch::CppFunction(TORCH_FN(dot_meta)); }},
    {"vdot", [] { return torch::CppFunction(TORCH_FN(dot_meta)); }},
    {"trace", [] { return torch::CppFunction(TORCH_FN(scalar_of_meta)); }},
    {"max", [] { return torch::CppFunction(TORCH_FN(scalar_of_meta)); }},
    {"min", [] { return torch::CppFunction(TORCH_FN(scalar_of_meta)); }},
    {"reflection_pad2d", [] { return torch::CppFunction(TORCH_FN(reflection_pad2d_meta)); }},
    {"reflection_pad2d_backward",
     [] { return torch::CppFunction(TORCH_FN(pad2d_backward_meta)); }},
    {"replication_pad2d_backward",
     [] { return torch::CppFunction(TORCH_FN(pad2d_backward_meta)); }},
    {"glu_backward", [] { return torch::CppFunction(TORCH_FN(glu_backward_meta)); }},
    {"mse_loss_backward", [] { return torch::CppFunction(TORCH_FN(mse_loss_backward_meta)); }},
    {"binary_cross_entropy", [] { return torch::CppFunction(TORCH_FN(bce_meta)); }},
    {"binary_cross_entropy_backward",
     [] { return torch::CppFunction(TORCH_FN(bce_backward_meta)); }},
    {"nll_loss2d_forward", [] { return torch::CppFunction(TORCH_FN(nll_loss2d_meta)); }},
    {"nll_loss2d_backward",
     [] { return torch::CppFunction(TORCH_FN(nll_loss2d_backward_meta)); }},
    {"log_sigmoid_forward",
     [] { return torch::CppFunction(TORCH_FN(log_sigmoid_forward_meta)); }},
    {"log_sigmoid_backward",
     [] { return torch::CppFunction(TORCH_FN(log_sigmoid_backward_meta)); }},
    {"_prelu_kernel", [] { return torch::CppFunction(TORCH_FN(prelu_meta)); }},
    {"_prelu_kernel_backward", [] { return torch::CppFunction(TORCH_FN(prelu_backward_meta)); }},
    {"grid_sampler_2d", [] { return torch::CppFunction(TORCH_FN(grid_sampler_2d_meta)); }},
    {"grid_sampler_2d_backward",
     [] { return torch::CppFunction(TORCH_FN(grid_sampler_2d_backward_meta)); }},
    {"unfold_backward", [] { return torch::CppFunction(TORCH_FN(unfold_backward_meta)); }},
    {"take", [] { return torch::CppFunction(TORCH_FN(take_meta)); }},
    {"logical_and.out", [] { return torch::CppFunction(TORCH_FN(binary_out_meta)); }},
    {"logical_or.out", [] { return torch::CppFunction(TORCH_FN(binary_out_meta)); }},
    {"logical_xor.out", [] { return torch::CppFunction(TORCH_FN(binary_out_meta)); }},
    {"_native_batch_norm_legit", [] { return torch::CppFunction(TORCH_FN(bn_legit_meta)); }},
    {"_native_batch_norm_legit.no_stats",
     [] { return torch::CppFunction(TORCH_FN(bn_legit_no_stats_meta)); }},
    {"_native_batch_norm_legit_functional",
     [] { return torch::CppFunction(TORCH_FN(bn_legit_functional_meta)); }},
};
const size_t kGapKernelCount = sizeof(kGapKernels) / sizeof(kGapKernels[0]);

namespace {

// Whether a dry run may answer an out-of-place op on `self` as its in-place form, as CUDA
// runs it: `self` a plain dense meta tensor nobody else holds (the caller's last
// reference), the result of `self`'s sizes and dtype.
bool in_place_as_on_cuda(const at::Tensor& self, at::IntArrayRef result, at::ScalarType st) {
  return !at::GradMode::is_enabled() && !self._is_zerotensor() && !self.is_nested() &&
         self.is_non_overlapping_and_dense() && self.use_count() == 1 && self.has_storage() &&
         self.storage().use_count() == 1 && self.sizes() == result && self.scalar_type() == st;
}

// Gradient accumulation as the autograd engine does it on CUDA. Where a node's input
// gets a second gradient (every residual join of a backward), the engine's input buffer
// adds it into the first in place when the first is a plain dense tensor whose last
// reference the buffer holds, and makes a new tensor otherwise; on the meta device it
// always makes a new one, as a meta tensor counts as a tensor subclass there
// (InputBuffer's accumulate, PyTorch 2.11). The engine's add, the buffer's tensor its
// `self`, is answered here as CUDA's in-place add: `self`, no new block. Every other
// add runs the meta kernel libtorch has.
at::Tensor add_as_accumulated_on_cuda(
    const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (dry_run_parent_record() == kRecordEngine &&
      in_place_as_on_cuda(self, other.sizes(), other.scalar_type())) {
    return self;
  }
  return at::meta::add(self, other, alpha);
}

// Backward formulas that write into a tensor they just made (`zeros(...).scatter_add_`:
// gather's backward, index_select's with `index_add_`, a max or min over a dimension's
// with `scatter_`) call the out-of-place op instead when an argument is a tensor
// subclass, as a meta tensor counts there: a second block of the input's size that CUDA
// does not make. Called inside a node (gather_backward is an op of its own) with a
// tensor only the caller holds, each is answered as the in-place op: `self`, no new
// block.
bool formula_in_place(const at::Tensor& self, const at::Tensor& src) {
  return dry_run_in_node() && in_place_as_on_cuda(self, self.sizes(), src.scalar_type());
}

at::Tensor scatter_add_as_on_cuda(
    const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  return formula_in_place(self, src) ? self : at::meta::scatter_add(self, dim, index, src);
}

at::Tensor index_add_as_on_cuda(
    const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
    const at::Scalar& alpha) {
  return formula_in_place(self, source) ? self
                                        : at::meta::index_add(self, dim, index, source, alpha);
}

at::Tensor scatter_as_on_cuda(
    const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  return formula_in_place(self, src) ? self : at::meta::scatter(self, dim, index, src);
}

}  // namespace

void register_engine_kernels(torch::Library& meta) {
  meta.impl("add.Tensor", TORCH_FN(add_as_accumulated_on_cuda));
  meta.impl("scatter_add", TORCH_FN(scatter_add_as_on_cuda));
  meta.impl("index_add", TORCH_FN(index_add_as_on_cuda));
  meta.impl("scatter.src", TORCH_FN(scatter_as_on_cuda));
}

}  // namespace memprof
