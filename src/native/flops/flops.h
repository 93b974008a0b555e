// FLOP counting from an op's boxed inputs, for the step timeline.
//
// Conventions (documented in docs/step-anatomy.md):
// - A multiply-add counts 2 FLOPs. Bias additions fused into addmm/baddbmm/convolution
//   are not counted (the published ResNet costs do not count them either).
// - Convolutions: 2 * batch * output positions * weight elements (transposed: input
//   positions). convolution_backward: that amount once for the input gradient and once
//   for the weight gradient, each only when its output_mask entry is set.
// - Normalizations, per element: statistics 4 (when computed: training batch norm,
//   group norm, layer norm), normalize 2, affine 2 (when a weight is given). Their
//   backward: twice the forward cost.
// - Elementwise ops: a fixed cost per element of their largest tensor input (table
//   below); the backward op of an activation costs the same as the activation.
// - Pooling: max/avg pool cost output elements * kernel elements; adaptive average
//   pooling costs its input elements; max-pool backward one per gradient element.
// Counted once, at the outermost counted op (conv2d -> convolution -> mkldnn counts at
// convolution; linear -> addmm counts at addmm).
//
// The formulas and the table of op names are in flops.cpp; this header declares what
// the op callbacks (ops.cpp) and the name table (names.cpp) call.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>

namespace memprof_flops {

enum Family : uint8_t {
  kUnknown = 0,
  kZero,       // known to do no arithmetic (views, copies, allocation, RNG fill)
  kMm,         // (a, b)
  kAddmm,      // (self, a, b)
  kConv,       // convolution / _convolution
  kConvBwd,    // convolution_backward
  kBatchNorm,  // (input, weight, bias, rm, rv, training, ...)
  kBatchNormEval,  // _native_batch_norm_legit_no_training
  kGroupNorm,  // group_norm (input, groups, weight, ...)
  kNativeGroupNorm,  // native_group_norm (input, weight, bias, N, C, HxW, group, eps)
  kLayerNorm,  // layer_norm / native_layer_norm (input, shape, weight, ...)
  kBatchNormBwd,  // native_batch_norm_backward (grad, input, weight, rm, rv, sm, si, train, ...)
  kLayerNormBwd,  // native_layer_norm_backward (grad, input, shape, mean, rstd, weight, ...)
  kGroupNormBwd,  // native_group_norm_backward (grad, input, mean, rstd, weight, ...)
  kElementwise,   // cost per element of the largest tensor input
  kMaxPool,    // (input, kernel, stride, padding, dilation, ceil_mode)
  kAvgPool,    // (input, kernel, stride, padding, ceil_mode, ...)
  kAdaptivePool,  // input elements
  kMaxPoolBwd,    // grad_output elements
  kAvgPoolBwd,    // (grad_output, input, kernel, ...): grad elements * kernel
  kAdaptivePoolBwd,  // (grad_output, input): input elements
  kSdpa,       // fused attention forward (query, key, value, ...): its two matmuls
  kSdpaBwd,    // fused attention backward (grad_out, query, key, value, ...): five matmuls
};

struct Kind {
  uint8_t family;
  uint8_t per_element;
};

// The kind of an op by its full name ("aten::relu_"), or kUnknown. Called once per
// name, when it is interned.
Kind classify(const char* full);

// FLOPs of one op of kind `k` with the given boxed inputs.
int64_t count(Kind k, c10::ArrayRef<const c10::IValue> in);

inline bool counted(Kind k) {
  return k.family != kUnknown && k.family != kZero;
}

}  // namespace memprof_flops
