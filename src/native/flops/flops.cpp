// FLOP counting from an op's boxed inputs (conventions: flops.h): the table of op
// names and their kinds, the boxed-argument readers, and the formulas.

#include "flops.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <cstring>

namespace memprof_flops {

namespace {
struct Entry {
  const char* name;
  Kind kind;
};

// Op names without the "aten::" prefix. In-place variants get the same kind.
const Entry* table(size_t* n) {
  static const Entry entries[] = {
      {"mm", {kMm, 0}},
      // Fused attention, every backend, counted as PyTorch's FlopCounterMode counts
      // the CUDA ones: the full L x S score matrix (no causal discount).
      {"_scaled_dot_product_flash_attention_for_cpu", {kSdpa, 0}},
      {"_scaled_dot_product_flash_attention", {kSdpa, 0}},
      {"_scaled_dot_product_efficient_attention", {kSdpa, 0}},
      {"_scaled_dot_product_cudnn_attention", {kSdpa, 0}},
      {"_scaled_dot_product_flash_attention_for_cpu_backward", {kSdpaBwd, 0}},
      {"_scaled_dot_product_flash_attention_backward", {kSdpaBwd, 0}},
      {"_scaled_dot_product_efficient_attention_backward", {kSdpaBwd, 0}},
      {"_scaled_dot_product_cudnn_attention_backward", {kSdpaBwd, 0}},
      // The embedding's backward adds each gradient row into its weight row; the loss.
      {"embedding_dense_backward", {kElementwise, 1}},
      {"nll_loss_forward", {kElementwise, 1}},
      {"nll_loss_backward", {kElementwise, 1}},
      {"nll_loss", {kElementwise, 1}},
      {"bmm", {kMm, 0}},
      {"addmm", {kAddmm, 0}},
      {"baddbmm", {kAddmm, 0}},
      {"convolution", {kConv, 0}},
      {"_convolution", {kConv, 0}},
      {"convolution_backward", {kConvBwd, 0}},
      {"batch_norm", {kBatchNorm, 0}},
      {"_batch_norm_impl_index", {kBatchNorm, 0}},
      {"native_batch_norm", {kBatchNorm, 0}},
      {"_native_batch_norm_legit", {kBatchNorm, 0}},
      {"cudnn_batch_norm", {kBatchNorm, 0}},
      {"_native_batch_norm_legit_no_training", {kBatchNormEval, 0}},
      {"group_norm", {kGroupNorm, 0}},
      {"native_group_norm", {kNativeGroupNorm, 0}},
      {"layer_norm", {kLayerNorm, 0}},
      {"native_layer_norm", {kLayerNorm, 0}},
      {"native_batch_norm_backward", {kBatchNormBwd, 0}},
      {"cudnn_batch_norm_backward", {kBatchNormBwd, 0}},
      {"native_layer_norm_backward", {kLayerNormBwd, 0}},
      {"native_group_norm_backward", {kGroupNormBwd, 0}},
      // Activations and their backward ops.
      {"relu", {kElementwise, 1}},
      {"threshold", {kElementwise, 1}},
      {"threshold_backward", {kElementwise, 1}},
      {"relu6", {kElementwise, 2}},
      {"hardtanh", {kElementwise, 2}},
      {"hardtanh_backward", {kElementwise, 2}},
      {"leaky_relu", {kElementwise, 2}},
      {"leaky_relu_backward", {kElementwise, 2}},
      {"gelu", {kElementwise, 8}},
      {"gelu_backward", {kElementwise, 8}},
      {"sigmoid", {kElementwise, 4}},
      {"sigmoid_backward", {kElementwise, 4}},
      {"tanh", {kElementwise, 4}},
      {"tanh_backward", {kElementwise, 4}},
      {"hardswish", {kElementwise, 4}},
      {"hardswish_backward", {kElementwise, 4}},
      {"hardsigmoid", {kElementwise, 3}},
      {"hardsigmoid_backward", {kElementwise, 3}},
      {"silu", {kElementwise, 5}},
      {"silu_backward", {kElementwise, 5}},
      {"softmax", {kElementwise, 5}},
      {"_softmax", {kElementwise, 5}},
      {"log_softmax", {kElementwise, 5}},
      {"_log_softmax", {kElementwise, 5}},
      {"_softmax_backward_data", {kElementwise, 5}},
      {"_log_softmax_backward_data", {kElementwise, 5}},
      // Plain arithmetic (residual additions, optimizer updates).
      {"add", {kElementwise, 1}},
      {"sub", {kElementwise, 1}},
      {"rsub", {kElementwise, 1}},
      {"mul", {kElementwise, 1}},
      {"div", {kElementwise, 1}},
      {"neg", {kElementwise, 1}},
      {"sqrt", {kElementwise, 1}},
      {"rsqrt", {kElementwise, 1}},
      {"reciprocal", {kElementwise, 1}},
      {"exp", {kElementwise, 1}},
      {"log", {kElementwise, 1}},
      {"pow", {kElementwise, 1}},
      {"addcmul", {kElementwise, 2}},
      {"addcdiv", {kElementwise, 2}},
      {"lerp", {kElementwise, 2}},
      {"sum", {kElementwise, 1}},
      {"mean", {kElementwise, 1}},
      // Pooling.
      {"max_pool1d", {kMaxPool, 0}},
      {"max_pool2d", {kMaxPool, 0}},
      {"max_pool3d", {kMaxPool, 0}},
      {"max_pool1d_with_indices", {kMaxPool, 0}},
      {"max_pool2d_with_indices", {kMaxPool, 0}},
      {"max_pool3d_with_indices", {kMaxPool, 0}},
      {"mkldnn_max_pool2d", {kMaxPool, 0}},
      {"avg_pool1d", {kAvgPool, 0}},
      {"avg_pool2d", {kAvgPool, 0}},
      {"avg_pool3d", {kAvgPool, 0}},
      {"adaptive_avg_pool1d", {kAdaptivePool, 0}},
      {"adaptive_avg_pool2d", {kAdaptivePool, 0}},
      {"adaptive_avg_pool3d", {kAdaptivePool, 0}},
      {"_adaptive_avg_pool2d", {kAdaptivePool, 0}},
      {"_adaptive_avg_pool3d", {kAdaptivePool, 0}},
      {"adaptive_max_pool1d", {kAdaptivePool, 0}},
      {"adaptive_max_pool2d", {kAdaptivePool, 0}},
      {"adaptive_max_pool3d", {kAdaptivePool, 0}},
      {"max_pool2d_with_indices_backward", {kMaxPoolBwd, 0}},
      {"max_pool3d_with_indices_backward", {kMaxPoolBwd, 0}},
      {"adaptive_max_pool2d_backward", {kMaxPoolBwd, 0}},
      {"avg_pool2d_backward", {kAvgPoolBwd, 0}},
      {"avg_pool3d_backward", {kAvgPoolBwd, 0}},
      {"_adaptive_avg_pool2d_backward", {kAdaptivePoolBwd, 0}},
      {"_adaptive_avg_pool3d_backward", {kAdaptivePoolBwd, 0}},
      // No arithmetic: views, layout, copies, allocation, fills, random init, indexing.
      {"view", {kZero, 0}}, {"_unsafe_view", {kZero, 0}}, {"reshape", {kZero, 0}},
      {"_reshape_alias", {kZero, 0}}, {"view_as", {kZero, 0}}, {"reshape_as", {kZero, 0}},
      {"t", {kZero, 0}}, {"transpose", {kZero, 0}}, {"permute", {kZero, 0}},
      {"expand", {kZero, 0}}, {"expand_as", {kZero, 0}}, {"squeeze", {kZero, 0}},
      {"unsqueeze", {kZero, 0}}, {"flatten", {kZero, 0}}, {"unflatten", {kZero, 0}},
      {"contiguous", {kZero, 0}}, {"clone", {kZero, 0}}, {"copy_", {kZero, 0}},
      {"detach", {kZero, 0}}, {"detach_", {kZero, 0}}, {"alias", {kZero, 0}},
      {"lift_fresh", {kZero, 0}}, {"empty", {kZero, 0}}, {"empty_like", {kZero, 0}},
      {"empty_strided", {kZero, 0}}, {"new_empty", {kZero, 0}},
      {"new_empty_strided", {kZero, 0}}, {"zeros", {kZero, 0}}, {"zeros_like", {kZero, 0}},
      {"new_zeros", {kZero, 0}}, {"ones", {kZero, 0}}, {"ones_like", {kZero, 0}},
      {"new_ones", {kZero, 0}}, {"full", {kZero, 0}}, {"full_like", {kZero, 0}},
      {"fill_", {kZero, 0}}, {"zero_", {kZero, 0}}, {"to", {kZero, 0}},
      {"_to_copy", {kZero, 0}}, {"as_strided", {kZero, 0}}, {"slice", {kZero, 0}},
      {"select", {kZero, 0}}, {"narrow", {kZero, 0}}, {"cat", {kZero, 0}},
      {"stack", {kZero, 0}}, {"split", {kZero, 0}}, {"chunk", {kZero, 0}},
      {"split_with_sizes", {kZero, 0}}, {"unbind", {kZero, 0}}, {"resize_", {kZero, 0}},
      {"set_", {kZero, 0}}, {"item", {kZero, 0}}, {"_local_scalar_dense", {kZero, 0}},
      {"is_nonzero", {kZero, 0}}, {"result_type", {kZero, 0}}, {"arange", {kZero, 0}},
      {"randn", {kZero, 0}}, {"rand", {kZero, 0}}, {"randint", {kZero, 0}},
      {"randperm", {kZero, 0}}, {"normal_", {kZero, 0}}, {"uniform_", {kZero, 0}},
      {"random_", {kZero, 0}}, {"bernoulli_", {kZero, 0}}, {"scalar_tensor", {kZero, 0}},
      {"index_select", {kZero, 0}}, {"gather", {kZero, 0}}, {"index", {kZero, 0}},
      {"embedding", {kZero, 0}}, {"from_file", {kZero, 0}}, {"_has_compatible_shallow_copy_type", {kZero, 0}},
      {"_to_dense", {kZero, 0}}, {"pin_memory", {kZero, 0}}, {"_pin_memory", {kZero, 0}},
      {"numpy_T", {kZero, 0}}, {"matrix_H", {kZero, 0}}, {"mT", {kZero, 0}},
      {"movedim", {kZero, 0}}, {"swapaxes", {kZero, 0}}, {"diagonal", {kZero, 0}},
      {"constant_pad_nd", {kZero, 0}}, {"pad", {kZero, 0}}, {"repeat", {kZero, 0}},
      {"masked_fill_", {kZero, 0}}, {"_foreach_zero_", {kZero, 0}},
  };
  *n = sizeof(entries) / sizeof(entries[0]);
  return entries;
}
}  // namespace

// The kind of an op by its full name ("aten::relu_"), or kUnknown.
Kind classify(const char* full) {
  if (!full || std::strncmp(full, "aten::", 6) != 0) {
    return Kind{kUnknown, 0};
  }
  const char* name = full + 6;
  size_t len = std::strlen(name);
  // In-place variants ("relu_", "add_") share the kind of the plain op, except the
  // ones listed with their underscore (copy_, fill_, ...).
  size_t n = 0;
  const Entry* e = table(&n);
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(e[i].name, name) == 0) {
      return e[i].kind;
    }
  }
  if (len > 1 && name[len - 1] == '_' && name[0] != '_') {
    for (size_t i = 0; i < n; ++i) {
      if (std::strlen(e[i].name) == len - 1 && std::strncmp(e[i].name, name, len - 1) == 0) {
        return e[i].kind;
      }
    }
  }
  return Kind{kUnknown, 0};
}

namespace {

// ---------------------------------------------------------------------------------
// Reading boxed arguments. Everything checks its type first: a wrong guess gives 0.

const at::Tensor* tensor_at(c10::ArrayRef<const c10::IValue> in, size_t i) {
  if (i < in.size() && in[i].isTensor()) {
    const at::Tensor& t = in[i].toTensor();
    if (t.defined()) {
      return &t;
    }
  }
  return nullptr;
}

// Unused by the formulas today; kept with its siblings for the next one.
[[maybe_unused]] bool int_at(c10::ArrayRef<const c10::IValue> in, size_t i, int64_t* out) {
  if (i >= in.size()) {
    return false;
  }
  const c10::IValue& v = in[i];
  if (v.isInt()) {
    *out = v.toInt();
    return true;
  }
  if (v.isSymInt()) {
    auto s = v.toSymInt();
    if (auto c = s.maybe_as_int()) {
      *out = *c;
      return true;
    }
  }
  return false;
}

bool bool_at(c10::ArrayRef<const c10::IValue> in, size_t i, bool def) {
  if (i < in.size() && in[i].isBool()) {
    return in[i].toBool();
  }
  return def;
}

// Reads an int list (or SymInt list with concrete values) into out[0..max); returns
// its length, or -1 when the argument is not such a list.
int ints_at(c10::ArrayRef<const c10::IValue> in, size_t i, int64_t* out, int max) {
  if (i >= in.size()) {
    return -1;
  }
  const c10::IValue& v = in[i];
  if (v.isIntList()) {
    auto l = v.toIntList();
    int n = 0;
    for (size_t k = 0; k < l.size() && n < max; ++k) {
      out[n++] = l.get(k);
    }
    return n;
  }
  if (v.isList()) {
    auto l = v.toListRef();
    int n = 0;
    for (const auto& e : l) {
      if (n >= max) {
        break;
      }
      if (e.isInt()) {
        out[n++] = e.toInt();
      } else if (e.isSymInt()) {
        auto c = e.toSymInt().maybe_as_int();
        if (!c) {
          return -1;
        }
        out[n++] = *c;
      } else {
        return -1;
      }
    }
    return n;
  }
  return -1;
}

// Value k of a per-dimension argument that may be given once for all dimensions.
int64_t per_dim(const int64_t* v, int n, int k, int64_t def) {
  if (n <= 0) {
    return def;
  }
  return n == 1 ? v[0] : (k < n ? v[k] : def);
}

int64_t numel(const at::Tensor* t) {
  return t ? t->numel() : 0;
}

// Forward cost of a convolution: 2 * batch * positions * weight elements, where
// positions are the output positions (transposed: input positions).
int64_t conv_cost(
    const at::Tensor* input,
    const at::Tensor* weight,
    const int64_t* positions_from,  // sizes of the tensor whose spatial dims count
    int64_t positions_dim) {
  if (!input || !weight) {
    return 0;
  }
  const int64_t wdim = weight->dim();
  const int64_t spatial = wdim - 2;
  if (spatial < 1 || positions_dim < spatial) {
    return 0;
  }
  const int64_t batch = input->dim() == wdim ? input->size(0) : 1;
  int64_t pos = 1;
  for (int64_t k = 0; k < spatial; ++k) {
    pos *= positions_from[positions_dim - spatial + k];
  }
  return 2 * batch * pos * weight->numel();
}

int64_t count_conv(c10::ArrayRef<const c10::IValue> in) {
  const at::Tensor* input = tensor_at(in, 0);
  const at::Tensor* weight = tensor_at(in, 1);
  if (!input || !weight) {
    return 0;
  }
  const bool transposed = bool_at(in, 6, false);
  const int64_t spatial = weight->dim() - 2;
  if (spatial < 1 || spatial > 3 || input->dim() < spatial) {
    return 0;
  }
  auto isz = input->sizes();
  if (transposed) {
    return conv_cost(input, weight, isz.data(), int64_t(isz.size()));
  }
  int64_t stride[3], pad[3], dil[3];
  const int ns = ints_at(in, 3, stride, 3);
  const int np = ints_at(in, 4, pad, 3);
  const int nd = ints_at(in, 5, dil, 3);
  int64_t out[3];
  auto wsz = weight->sizes();
  for (int64_t k = 0; k < spatial; ++k) {
    const int64_t i = isz[isz.size() - spatial + k];
    const int64_t kk = wsz[2 + k];
    const int64_t s = per_dim(stride, ns, int(k), 1);
    const int64_t p = per_dim(pad, np, int(k), 0);
    const int64_t d = per_dim(dil, nd, int(k), 1);
    if (s <= 0) {
      return 0;
    }
    const int64_t o = (i + 2 * p - d * (kk - 1) - 1) / s + 1;
    out[k] = o > 0 ? o : 0;
  }
  return conv_cost(input, weight, out, spatial);
}

int64_t count_conv_backward(c10::ArrayRef<const c10::IValue> in) {
  const at::Tensor* grad = tensor_at(in, 0);
  const at::Tensor* input = tensor_at(in, 1);
  const at::Tensor* weight = tensor_at(in, 2);
  if (!grad || !input || !weight) {
    return 0;
  }
  const bool transposed = bool_at(in, 7, false);
  auto from = transposed ? input->sizes() : grad->sizes();
  const int64_t f = conv_cost(input, weight, from.data(), int64_t(from.size()));
  int64_t times = 0;
  if (10 < in.size() && in[10].isBoolList()) {
    auto mask = in[10].toBoolList();
    times = (mask.size() > 0 && mask.get(0) ? 1 : 0) + (mask.size() > 1 && mask.get(1) ? 1 : 0);
  } else {
    times = 2;
  }
  return f * times;
}

// Per-element forward cost of a normalization.
int64_t norm_cost(bool stats, bool affine) {
  return (stats ? 4 : 0) + 2 + (affine ? 2 : 0);
}

int64_t largest_input(c10::ArrayRef<const c10::IValue> in) {
  int64_t best = 0;
  for (const auto& v : in) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.numel() > best) {
        best = t.numel();
      }
    }
  }
  return best;
}

int64_t count_pool(c10::ArrayRef<const c10::IValue> in, bool max_pool) {
  const at::Tensor* input = tensor_at(in, 0);
  if (!input) {
    return 0;
  }
  int64_t kernel[3], stride[3], pad[3], dil[3];
  const int nk = ints_at(in, 1, kernel, 3);
  if (nk <= 0) {
    return 0;
  }
  const int ns = ints_at(in, 2, stride, 3);
  const int np = ints_at(in, 3, pad, 3);
  const int nd = max_pool ? ints_at(in, 4, dil, 3) : 0;
  const bool ceil_mode = bool_at(in, max_pool ? 5 : 4, false);
  auto isz = input->sizes();
  // Spatial dims: 1 for *_pool1d etc.; taken from the kernel length, or from the
  // input rank when one kernel size is given for all dims.
  int64_t spatial = nk;
  if (nk == 1 && isz.size() >= 3) {
    spatial = int64_t(isz.size()) - 2;
    if (spatial > 3) {
      spatial = 3;
    }
  }
  if (int64_t(isz.size()) < spatial) {
    return 0;
  }
  int64_t out_elems = 1;
  for (size_t k = 0; k < isz.size() - size_t(spatial); ++k) {
    out_elems *= isz[k];
  }
  int64_t kernel_elems = 1;
  for (int64_t k = 0; k < spatial; ++k) {
    const int64_t i = isz[isz.size() - spatial + k];
    const int64_t kk = per_dim(kernel, nk, int(k), 1);
    const int64_t s = ns > 0 ? per_dim(stride, ns, int(k), kk) : kk;  // empty stride = kernel
    const int64_t p = per_dim(pad, np, int(k), 0);
    const int64_t d = per_dim(dil, nd, int(k), 1);
    if (s <= 0) {
      return 0;
    }
    const int64_t span = i + 2 * p - d * (kk - 1) - 1;
    int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (ceil_mode && (o - 1) * s >= i + p) {
      --o;
    }
    out_elems *= o > 0 ? o : 0;
    kernel_elems *= kk;
  }
  return out_elems * kernel_elems;
}

}  // namespace

// FLOPs of one op of kind `k` with the given boxed inputs.
int64_t count(Kind k, c10::ArrayRef<const c10::IValue> in) {
  switch (k.family) {
    case kMm: {
      const at::Tensor* a = tensor_at(in, 0);
      const at::Tensor* b = tensor_at(in, 1);
      return a && b && b->dim() >= 1 ? 2 * a->numel() * b->size(-1) : 0;
    }
    case kAddmm: {
      const at::Tensor* a = tensor_at(in, 1);
      const at::Tensor* b = tensor_at(in, 2);
      return a && b && b->dim() >= 1 ? 2 * a->numel() * b->size(-1) : 0;
    }
    case kSdpa:
    case kSdpaBwd: {
      // query [b, h, L, E], key [b, h', S, E], value [b, h', S, Ev] (h' divides h).
      const size_t base = k.family == kSdpaBwd ? 1 : 0;
      const at::Tensor* q = tensor_at(in, base);
      const at::Tensor* kk = tensor_at(in, base + 1);
      const at::Tensor* v = tensor_at(in, base + 2);
      if (!q || !kk || !v || q->dim() != 4 || kk->dim() != 4 || v->dim() != 4) {
        return 0;
      }
      const int64_t bh = q->size(0) * q->size(1);
      const int64_t l = q->size(2), e = q->size(3), s = kk->size(2), ev = v->size(3);
      // Forward: scores = q k^T, out = scores v. Backward (FlopCounterMode's
      // sdpa_backward_flop_count): the scores again, grad scores, grad v, grad q, grad k.
      return k.family == kSdpa ? 2 * bh * l * s * (e + ev) : 2 * bh * l * s * (3 * e + 2 * ev);
    }
    case kConv:
      return count_conv(in);
    case kConvBwd:
      return count_conv_backward(in);
    case kBatchNorm:
      return numel(tensor_at(in, 0)) *
          norm_cost(bool_at(in, 5, true), tensor_at(in, 1) != nullptr);
    case kBatchNormEval:
      return numel(tensor_at(in, 0)) * norm_cost(false, tensor_at(in, 1) != nullptr);
    case kGroupNorm:
    case kLayerNorm:
      return numel(tensor_at(in, 0)) * norm_cost(true, tensor_at(in, 2) != nullptr);
    case kNativeGroupNorm:
      return numel(tensor_at(in, 0)) * norm_cost(true, tensor_at(in, 1) != nullptr);
    case kBatchNormBwd:
      return 2 * numel(tensor_at(in, 1)) *
          norm_cost(bool_at(in, 7, true), tensor_at(in, 2) != nullptr);
    case kLayerNormBwd:
      return 2 * numel(tensor_at(in, 1)) * norm_cost(true, tensor_at(in, 5) != nullptr);
    case kGroupNormBwd:
      return 2 * numel(tensor_at(in, 1)) * norm_cost(true, tensor_at(in, 4) != nullptr);
    case kElementwise:
      return largest_input(in) * k.per_element;
    case kMaxPool:
      return count_pool(in, true);
    case kAvgPool:
      return count_pool(in, false);
    case kAdaptivePool:
      return numel(tensor_at(in, 0));
    case kMaxPoolBwd:
      return numel(tensor_at(in, 0));
    case kAvgPoolBwd: {
      int64_t kernel[3];
      const int nk = ints_at(in, 2, kernel, 3);
      int64_t ke = 1;
      const at::Tensor* input = tensor_at(in, 1);
      const int spatial = nk == 1 && input && input->dim() >= 3 ? int(input->dim()) - 2 : nk;
      for (int k = 0; k < spatial && k < 3; ++k) {
        ke *= per_dim(kernel, nk, k, 1);
      }
      return numel(tensor_at(in, 0)) * ke;
    }
    case kAdaptivePoolBwd:
      return numel(tensor_at(in, 1));
    default:
      return 0;
  }
}

}  // namespace memprof_flops
