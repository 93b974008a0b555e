// Autocast in the estimator's dry run: the casts CUDA autocast (or CPU autocast, for
// the checks against a real CPU run) makes, applied to meta tensors.
//
// libtorch's own autocast never touches meta tensors (an autocast wrapper casts only
// tensors of its device, and meta tensors carry no autocast dispatch key), so this
// file follows PyTorch 2.11's autocast (aten/src/ATen/autocast_mode.cpp and
// autocast_mode.h; aten/src/ATen/cudnn/AutocastRNN.cpp for _cudnn_rnn) with meta
// tensors standing in for the device's:
// - The op lists and their policies, with the exact overloads: lower_precision_fp
//   (every floating-point tensor argument cast to the autocast dtype), fp32 (cast to
//   float), fp32_set_opt_dtype (an unset `dtype` argument set to float when the first
//   argument is eligible), fp32_append_dtype (norm: redispatched to its overload with a
//   dtype, float when the first argument is eligible), promote (every argument cast to
//   the widest floating type among them), and banned (binary_cross_entropy on CUDA).
// - cached_cast: a tensor is eligible when it is defined, floating-point and not
//   double; a float leaf that requires grad and is not a view is cast once per
//   autocast region (the cast is kept until the region ends: the weights' low-precision
//   copies), every other eligible tensor at each use.
// - The wrapped op runs with the autocast key excluded, so the ops it calls (a
//   composite op's decomposition) are not cast again.
// - The JIT's own casts (_autocast_to_reduced_precision, _autocast_to_full_precision,
//   which its autocast pass inserts into an optimized TorchScript graph when libtorch's
//   autocast flag is on) cast meta tensors as they cast the device's; the region sets
//   that flag as a real autocast region does.
//
// The kernels sit on a dispatch key no tensor of this libtorch carries and on which
// it registers nothing (AutocastIPU), registered at the first autocast region of a dry
// run (only where that key has no kernel for the op) and reached only while the key
// is in the thread's included set: during the dry run's autocast region, nowhere else.

#include <ATen/ATen.h>
#include <ATen/CachedTensorUtils.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>
#include <torch/version.h>

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "dryrun.h"

namespace memprof {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::AutocastIPU;

enum Policy : uint8_t {
  kLower,             // lower_precision_fp
  kFp32,              // fp32
  kFp32SetOptDtype,   // fp32_set_opt_dtype
  kFp32AppendDtype,   // fp32_append_dtype
  kPromote,           // promote
  kBanned,            // binary_cross_entropy on CUDA: an error
  kNotOnMeta,         // _cudnn_rnn (libtorch_cuda): never reached by meta tensors
};

const char* policy_name(Policy p) {
  switch (p) {
    case kLower: return "lower_precision_fp";
    case kFp32: return "fp32";
    case kFp32SetOptDtype: return "fp32_set_opt_dtype";
    case kFp32AppendDtype: return "fp32_append_dtype";
    case kPromote: return "promote";
    case kBanned: return "banned";
    case kNotOnMeta: return "not_on_meta";
  }
  return "?";
}

struct Entry {
  const char* name;      // without "aten::"
  const char* overload;  // "" for the default overload
  Policy policy;
};

// CUDA's (TORCH_LIBRARY_IMPL(aten, Autocast, m) in autocast_mode.cpp: the
// AT_FORALL_* lists of autocast_mode.h, cudnn_convolution(_transpose), norm's three
// fp32_append_dtype overloads, binary_cross_entropy banned; _cudnn_rnn from
// AutocastRNN.cpp, registered by libtorch_cuda).
const Entry kCuda[] = {
    {"_convolution", "deprecated", kLower}, {"_convolution", "", kLower},
    {"conv1d", "", kLower}, {"conv2d", "", kLower}, {"conv3d", "", kLower},
    {"conv_tbc", "", kLower}, {"conv_transpose1d", "", kLower},
    {"conv_transpose2d", "input", kLower}, {"conv_transpose3d", "input", kLower},
    {"convolution", "", kLower}, {"prelu", "", kLower}, {"addmm", "", kLower},
    {"addmv", "", kLower}, {"addr", "", kLower}, {"matmul", "", kLower},
    {"einsum", "", kLower}, {"mm", "", kLower}, {"mv", "", kLower},
    {"linalg_vecdot", "", kLower}, {"linear", "", kLower}, {"addbmm", "", kLower},
    {"baddbmm", "", kLower}, {"bmm", "", kLower}, {"chain_matmul", "", kLower},
    {"linalg_multi_dot", "", kLower}, {"_thnn_fused_lstm_cell", "", kLower},
    {"_thnn_fused_gru_cell", "", kLower}, {"lstm_cell", "", kLower},
    {"gru_cell", "", kLower}, {"rnn_tanh_cell", "", kLower}, {"rnn_relu_cell", "", kLower},
    {"_scaled_dot_product_flash_attention", "", kLower},
    {"scaled_dot_product_attention", "", kLower}, {"acos", "", kFp32}, {"asin", "", kFp32},
    {"cosh", "", kFp32}, {"erfinv", "", kFp32}, {"exp", "", kFp32}, {"expm1", "", kFp32},
    {"log", "", kFp32}, {"log10", "", kFp32}, {"log2", "", kFp32}, {"log1p", "", kFp32},
    {"reciprocal", "", kFp32}, {"rsqrt", "", kFp32}, {"sinh", "", kFp32},
    {"tan", "", kFp32}, {"pow", "Tensor_Scalar", kFp32}, {"pow", "Tensor_Tensor", kFp32},
    {"pow", "Scalar", kFp32}, {"softplus", "", kFp32}, {"layer_norm", "", kFp32},
    {"native_layer_norm", "", kFp32}, {"group_norm", "", kFp32},
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
    {"rms_norm", "", kFp32},  // CUDA's fp32 list from 2.13 on
#endif
    {"frobenius_norm", "dim", kFp32}, {"nuclear_norm", "", kFp32},
    {"nuclear_norm", "dim", kFp32}, {"cosine_similarity", "", kFp32},
    {"poisson_nll_loss", "", kFp32}, {"cosine_embedding_loss", "", kFp32},
    {"nll_loss", "", kFp32}, {"nll_loss2d", "", kFp32}, {"hinge_embedding_loss", "", kFp32},
    {"kl_div", "", kFp32}, {"l1_loss", "", kFp32}, {"smooth_l1_loss", "", kFp32},
    {"huber_loss", "", kFp32}, {"mse_loss", "", kFp32}, {"margin_ranking_loss", "", kFp32},
    {"multilabel_margin_loss", "", kFp32}, {"soft_margin_loss", "", kFp32},
    {"triplet_margin_loss", "", kFp32}, {"multi_margin_loss", "", kFp32},
    {"binary_cross_entropy_with_logits", "", kFp32}, {"dist", "", kFp32},
    {"pdist", "", kFp32}, {"cdist", "", kFp32}, {"renorm", "", kFp32},
    {"logsumexp", "", kFp32}, {"upsample_nearest1d", "", kFp32},
    {"_upsample_nearest_exact1d", "", kFp32}, {"upsample_nearest2d", "", kFp32},
    {"_upsample_nearest_exact2d", "", kFp32}, {"upsample_nearest3d", "", kFp32},
    {"_upsample_nearest_exact3d", "", kFp32}, {"upsample_linear1d", "", kFp32},
    {"upsample_bilinear2d", "", kFp32}, {"_upsample_bilinear2d_aa", "", kFp32},
    {"upsample_trilinear3d", "", kFp32}, {"upsample_bicubic2d", "", kFp32},
    {"_upsample_bicubic2d_aa", "", kFp32}, {"prod", "", kFp32SetOptDtype},
    {"prod", "dim_int", kFp32SetOptDtype}, {"prod", "dim_Dimname", kFp32SetOptDtype},
    {"softmax", "int", kFp32SetOptDtype}, {"softmax", "Dimname", kFp32SetOptDtype},
    {"log_softmax", "int", kFp32SetOptDtype}, {"log_softmax", "Dimname", kFp32SetOptDtype},
    {"cumprod", "", kFp32SetOptDtype}, {"cumprod", "dimname", kFp32SetOptDtype},
    {"cumsum", "", kFp32SetOptDtype}, {"cumsum", "dimname", kFp32SetOptDtype},
    {"linalg_vector_norm", "", kFp32SetOptDtype},
    {"linalg_matrix_norm", "", kFp32SetOptDtype},
    {"linalg_matrix_norm", "str_ord", kFp32SetOptDtype}, {"sum", "", kFp32SetOptDtype},
    {"sum", "dim_IntList", kFp32SetOptDtype}, {"sum", "dim_DimnameList", kFp32SetOptDtype},
    {"addcdiv", "", kPromote}, {"addcmul", "", kPromote}, {"atan2", "", kPromote},
    {"bilinear", "", kPromote}, {"cross", "", kPromote}, {"dot", "", kPromote},
    {"vdot", "", kPromote}, {"grid_sampler", "", kPromote}, {"index_put", "", kPromote},
    {"tensordot", "", kPromote}, {"scatter_add", "", kPromote},
    {"cudnn_convolution", "", kLower}, {"cudnn_convolution_transpose", "", kLower},
    {"norm", "Scalar", kFp32AppendDtype}, {"norm", "ScalarOpt_dim", kFp32AppendDtype},
    {"norm", "names_ScalarOpt_dim", kFp32AppendDtype},
    {"binary_cross_entropy", "", kBanned}, {"_cudnn_rnn", "", kNotOnMeta},
};

// CPU's (TORCH_LIBRARY_IMPL(aten, AutocastCPU, m) in autocast_mode.cpp).
const Entry kCpu[] = {
    {"conv1d", "", kLower}, {"conv1d", "padding", kLower}, {"conv2d", "", kLower},
    {"conv2d", "padding", kLower}, {"conv3d", "", kLower}, {"conv3d", "padding", kLower},
    {"bmm", "", kLower}, {"mm", "", kLower}, {"linalg_vecdot", "", kLower},
    {"baddbmm", "", kLower}, {"addmm", "", kLower}, {"_addmm_activation", "", kLower},
    {"addbmm", "", kLower}, {"linear", "", kLower}, {"_convolution", "deprecated", kLower},
    {"matmul", "", kLower}, {"conv_tbc", "", kLower}, {"mkldnn_rnn_layer", "", kLower},
    {"conv_transpose1d", "", kLower}, {"conv_transpose2d", "input", kLower},
    {"conv_transpose3d", "input", kLower}, {"prelu", "", kLower},
    {"scaled_dot_product_attention", "", kLower},
    {"_native_multi_head_attention", "", kLower}, {"avg_pool3d", "", kFp32},
    {"binary_cross_entropy", "", kFp32}, {"grid_sampler", "", kFp32}, {"polar", "", kFp32},
    {"prod", "", kFp32}, {"prod", "dim_int", kFp32}, {"prod", "dim_Dimname", kFp32},
    {"quantile", "", kFp32}, {"quantile", "scalar", kFp32}, {"nanquantile", "", kFp32},
    {"nanquantile", "scalar", kFp32}, {"stft", "", kFp32}, {"stft", "center", kFp32},
    {"cdist", "", kFp32}, {"grid_sampler_2d", "", kFp32},
    {"_grid_sampler_2d_cpu_fallback", "", kFp32}, {"grid_sampler_3d", "", kFp32},
    {"trace", "", kFp32}, {"view_as_complex", "", kFp32}, {"cholesky", "", kFp32},
    {"cholesky_inverse", "", kFp32}, {"cholesky_solve", "", kFp32}, {"inverse", "", kFp32},
    {"lu_solve", "", kFp32}, {"orgqr", "", kFp32}, {"ormqr", "", kFp32},
    {"pinverse", "", kFp32}, {"max_pool3d", "", kFp32}, {"max_unpool2d", "", kFp32},
    {"max_unpool3d", "", kFp32}, {"adaptive_avg_pool3d", "", kFp32},
    {"reflection_pad1d", "", kFp32}, {"reflection_pad2d", "", kFp32},
    {"replication_pad1d", "", kFp32}, {"replication_pad2d", "", kFp32},
    {"replication_pad3d", "", kFp32}, {"mse_loss", "", kFp32},
    {"cosine_embedding_loss", "", kFp32}, {"nll_loss", "", kFp32},
    {"nll_loss2d", "", kFp32}, {"hinge_embedding_loss", "", kFp32},
    {"poisson_nll_loss", "", kFp32}, {"smooth_l1_loss", "", kFp32},
    {"cross_entropy_loss", "", kFp32}, {"l1_loss", "", kFp32}, {"huber_loss", "", kFp32},
    {"margin_ranking_loss", "", kFp32}, {"soft_margin_loss", "", kFp32},
    {"triplet_margin_loss", "", kFp32}, {"multi_margin_loss", "", kFp32},
    {"ctc_loss", "IntList", kFp32}, {"ctc_loss", "Tensor", kFp32}, {"kl_div", "", kFp32},
    {"multilabel_margin_loss", "", kFp32}, {"binary_cross_entropy_with_logits", "", kFp32},
    {"fft_fft", "", kFp32}, {"fft_ifft", "", kFp32}, {"fft_fft2", "", kFp32},
    {"fft_ifft2", "", kFp32}, {"fft_fftn", "", kFp32}, {"fft_ifftn", "", kFp32},
    {"fft_rfft", "", kFp32}, {"fft_irfft", "", kFp32}, {"fft_rfft2", "", kFp32},
    {"fft_irfft2", "", kFp32}, {"fft_rfftn", "", kFp32}, {"fft_irfftn", "", kFp32},
    {"fft_hfft", "", kFp32}, {"fft_ihfft", "", kFp32}, {"linalg_cond", "", kFp32},
    {"linalg_cond", "p_str", kFp32}, {"linalg_matrix_rank", "", kFp32},
    {"linalg_matrix_rank", "tol_tensor", kFp32},
    {"linalg_matrix_rank", "atol_rtol_tensor", kFp32},
    {"linalg_matrix_rank", "atol_rtol_float", kFp32}, {"linalg_solve", "", kFp32},
    {"linalg_cholesky", "", kFp32}, {"linalg_svdvals", "", kFp32},
    {"linalg_eigvals", "", kFp32}, {"linalg_eigvalsh", "", kFp32},
    {"linalg_inv", "", kFp32}, {"linalg_householder_product", "", kFp32},
    {"linalg_tensorinv", "", kFp32}, {"linalg_tensorsolve", "", kFp32},
    {"fake_quantize_per_tensor_affine", "", kFp32}, {"geqrf", "", kFp32},
    {"_lu_with_info", "", kFp32}, {"qr", "", kFp32}, {"svd", "", kFp32},
    {"triangular_solve", "", kFp32}, {"fractional_max_pool2d", "", kFp32},
    {"fractional_max_pool3d", "", kFp32}, {"adaptive_max_pool3d", "", kFp32},
    {"multilabel_margin_loss_forward", "", kFp32}, {"linalg_qr", "", kFp32},
    {"linalg_cholesky_ex", "", kFp32}, {"linalg_svd", "", kFp32}, {"linalg_eig", "", kFp32},
    {"linalg_eigh", "", kFp32}, {"linalg_lstsq", "", kFp32}, {"linalg_inv_ex", "", kFp32},
    {"stack", "", kPromote}, {"cat", "", kPromote}, {"index_copy", "", kPromote},
    {"index_copy", "dimname", kPromote},
};

struct List {
  const Entry* begin;
  size_t n;
};

List list_of(int32_t which) {
  if (which == MP_AUTOCAST_LIST_CPU) {
    return {kCpu, sizeof kCpu / sizeof kCpu[0]};
  }
  return {kCuda, sizeof kCuda / sizeof kCuda[0]};
}

// The op a fp32_append_dtype overload redispatches to (autocast_mode.h:
// AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE).
const char* append_dtype_target(const char* overload) {
  if (std::strcmp(overload, "Scalar") == 0) {
    return "ScalarOpt_dtype";
  }
  if (std::strcmp(overload, "ScalarOpt_dim") == 0) {
    return "ScalarOpt_dim_dtype";
  }
  return "names_ScalarOpt_dim_dtype";
}

// The autocast region of this thread.
thread_local int32_t tls_list = -1;  // MP_AUTOCAST_LIST_*, -1: none
thread_local c10::ScalarType tls_dtype = c10::ScalarType::Undefined;
thread_local bool tls_saved_included = false;
thread_local bool tls_saved_excluded = true;
// libtorch's own autocast flag of the device the list stands for, as it was before the
// region: the region sets it, as a real autocast region does, so that what reads it
// (the JIT's autocast pass, when a TorchScript graph is optimized) sees autocast on.
thread_local bool tls_saved_flag = false;
thread_local c10::ScalarType tls_saved_flag_dtype = c10::ScalarType::Undefined;

c10::DeviceType flag_device(int32_t list) {
  return list == MP_AUTOCAST_LIST_CUDA ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
}

// The cast cache (autocast_mode.cpp's cached_casts): the source's TensorImpl* to a
// weak reference keeping it from being reused, and the cast.
using Weak = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
std::mutex g_cache_mutex;
std::unordered_map<c10::TensorImpl*, std::tuple<Weak, at::Tensor>>* g_cache = nullptr;

bool eligible(const at::Tensor& t) {
  return t.defined() && t.is_meta() && t.is_floating_point() &&
      t.scalar_type() != at::kDouble;
}

at::Tensor cached_cast(c10::ScalarType to, const at::Tensor& arg) {
  if (!eligible(arg) || arg.scalar_type() == to) {
    return arg;
  }
  const bool can_try_cache = to == tls_dtype && arg.scalar_type() == at::kFloat &&
      arg.requires_grad() && arg.is_leaf() && !arg.is_view() &&
      at::autocast::is_autocast_cache_enabled() && !at::caching::is_cached_tensor(arg);
  if (!can_try_cache) {
    return arg.to(to);
  }
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (!g_cache) {
    g_cache = new std::unordered_map<c10::TensorImpl*, std::tuple<Weak, at::Tensor>>();
  }
  auto it = g_cache->find(arg.unsafeGetTensorImpl());
  if (it != g_cache->end()) {
    return std::get<1>(it->second);
  }
  at::Tensor cast = arg.to(to);
  g_cache->emplace(arg.unsafeGetTensorImpl(), std::make_tuple(Weak(arg.getIntrusivePtr()), cast));
  return cast;
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (g_cache) {
    g_cache->clear();
  }
}

enum class ArgKind { kOther, kTensor, kOptionalTensor, kTensorList };

ArgKind kind_of(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::TensorType) {
    return ArgKind::kTensor;
  }
  if (auto o = t->cast<c10::OptionalType>()) {
    if (o->getElementType()->kind() == c10::TypeKind::TensorType) {
      return ArgKind::kOptionalTensor;
    }
  }
  if (auto l = t->cast<c10::ListType>()) {
    // Tensor[] (TensorList, ITensorListRef); Tensor?[] is neither cast nor weighed.
    if (l->getElementType()->kind() == c10::TypeKind::TensorType) {
      return ArgKind::kTensorList;
    }
  }
  return ArgKind::kOther;
}

// autocast_mode.h's prioritize: float wins over the autocast dtype; double ignored.
c10::ScalarType prioritize(c10::ScalarType current, const at::Tensor& next) {
  TORCH_CHECK(current != at::kDouble, "promote type is double in at::autocast::prioritize");
  if (!(next.is_meta() && next.is_floating_point())) {  // is_autocast_eligible
    return current;
  }
  const auto t = next.scalar_type();
  if (t == at::kDouble) {
    return current;
  }
  if (current == at::kFloat || t == at::kFloat) {
    return at::kFloat;
  }
  TORCH_CHECK(current == tls_dtype && t == tls_dtype,
              "Unexpected floating ScalarType in at::autocast::prioritize");
  return tls_dtype;
}

// The casts are made last argument first: PyTorch's wrappers cast in a call's argument
// list (`F(cached_cast(to, args)...)`), which GCC, the compiler of PyTorch's Linux
// builds, evaluates right to left. The order decides which cast is allocated first and,
// through the casts' autograd sequence numbers, the order of their backward nodes.
void cast_args(const c10::FunctionSchema& schema, torch::jit::Stack* stack, c10::ScalarType to) {
  const size_t n = schema.arguments().size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
  for (size_t i = n; i-- > 0;) {
    c10::IValue& v = *(first + static_cast<std::ptrdiff_t>(i));
    switch (kind_of(schema.arguments()[i])) {
      case ArgKind::kTensor:
      case ArgKind::kOptionalTensor:
        if (v.isTensor()) {
          v = cached_cast(to, v.toTensor());
        }
        break;
      case ArgKind::kTensorList:
        if (v.isTensorList()) {
          c10::List<at::Tensor> out;
          for (const at::Tensor& t : v.toTensorList()) {
            out.push_back(cached_cast(to, t));
          }
          v = c10::IValue(std::move(out));
        }
        break;
      case ArgKind::kOther:
        break;
    }
  }
}

c10::ScalarType promote_type(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const size_t n = schema.arguments().size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
  c10::ScalarType current = tls_dtype;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = *(first + static_cast<std::ptrdiff_t>(i));
    switch (kind_of(schema.arguments()[i])) {
      case ArgKind::kTensor:  // an optional tensor is cast but not weighed
        if (v.isTensor()) {
          current = prioritize(current, v.toTensor());
        }
        break;
      case ArgKind::kTensorList:
        if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorList()) {
            current = prioritize(current, t);
          }
        }
        break;
      default:
        break;
    }
  }
  return current;
}

bool first_arg_eligible(const c10::FunctionSchema& schema, const torch::jit::Stack* stack) {
  const size_t n = schema.arguments().size();
  const c10::IValue& v = *(stack->end() - static_cast<std::ptrdiff_t>(n));
  return v.isTensor() && eligible(v.toTensor());
}

// One kernel per op, knowing the op's entry in each list (null: not in that list,
// where the op passes through uncast, as on a key with a fallthrough).
class AutocastKernel final : public c10::OperatorKernel {
 public:
  AutocastKernel(const Entry* cuda, const Entry* cpu) : rules_{cuda, cpu} {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const Entry* e = tls_list >= 0 ? rules_[size_t(tls_list)] : nullptr;
    if (!e) {
      op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
      return;
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    const c10::FunctionSchema& schema = op.schema();
    switch (e->policy) {
      case kLower:
        cast_args(schema, stack, tls_dtype);
        break;
      case kFp32:
        cast_args(schema, stack, at::kFloat);
        break;
      case kFp32SetOptDtype:
        if (first_arg_eligible(schema, stack)) {
          const size_t n = schema.arguments().size();
          for (size_t i = 0; i < n; ++i) {
            if (schema.arguments()[i].name() == "dtype") {
              c10::IValue& v = *(stack->end() - static_cast<std::ptrdiff_t>(n - i));
              if (v.isNone()) {
                v = c10::IValue(at::kFloat);
              }
            }
          }
        }
        break;
      case kFp32AppendDtype: {
        const size_t n = schema.arguments().size();
        const c10::IValue& self = *(stack->end() - static_cast<std::ptrdiff_t>(n));
        const c10::ScalarType out = first_arg_eligible(schema, stack)
            ? at::kFloat
            : self.toTensor().scalar_type();
        stack->emplace_back(out);
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("aten::norm", append_dtype_target(e->overload))
            .callBoxed(stack);
        return;
      }
      case kPromote:
        cast_args(schema, stack, promote_type(schema, stack));
        break;
      case kBanned:
        TORCH_CHECK(false,
                    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe "
                    "to autocast (CUDA autocast refuses them; use "
                    "binary_cross_entropy_with_logits)");
        break;
      case kNotOnMeta:
        TORCH_CHECK(false, schema.name(), " under autocast is not modelled in the dry run");
        break;
    }
    op.callBoxed(stack);
  }

 private:
  std::array<const Entry*, 2> rules_;
};

// The casts the JIT's autocast pass puts in a TorchScript graph (the profiling
// executor's optimized graph, under autocast: torch/csrc/jit/passes/autocast.cpp),
// which cast only tensors of the device whose flag they carry (TensorConversions.cpp):
// a meta tensor stands for that device here, as in the op lists above. Reduced: a
// float tensor to the autocast dtype; full: a bfloat16 or float16 tensor to float.
// Neither caches: each is a new tensor, held for backward where the autodiff graph
// needs it.
bool jit_cast_applies(const at::Tensor& self, bool cuda_enabled, bool cpu_enabled) {
  if (!self.defined() || !self.is_meta() || tls_list < 0) {
    return false;
  }
  return tls_list == MP_AUTOCAST_LIST_CUDA ? cuda_enabled : cpu_enabled;
}

at::Tensor jit_to_reduced(c10::DispatchKeySet ks, const at::Tensor& self, bool cuda_enabled,
                          bool cpu_enabled, at::ScalarType cuda_dtype,
                          at::ScalarType cpu_dtype) {
  if (jit_cast_applies(self, cuda_enabled, cpu_enabled) && self.scalar_type() == at::kFloat) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    return self.to(tls_list == MP_AUTOCAST_LIST_CUDA ? cuda_dtype : cpu_dtype);
  }
  return at::_ops::_autocast_to_reduced_precision::redispatch(
      ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), self, cuda_enabled,
      cpu_enabled, cuda_dtype, cpu_dtype);
}

at::Tensor jit_to_full(c10::DispatchKeySet ks, const at::Tensor& self, bool cuda_enabled,
                       bool cpu_enabled) {
  if (jit_cast_applies(self, cuda_enabled, cpu_enabled) &&
      (self.scalar_type() == at::kBFloat16 || self.scalar_type() == at::kHalf)) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    return self.to(at::kFloat);
  }
  return at::_ops::_autocast_to_full_precision::redispatch(
      ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), self, cuda_enabled,
      cpu_enabled);
}

const char* const kJitCasts[] = {"_autocast_to_reduced_precision",
                                 "_autocast_to_full_precision"};

std::string op_name(const Entry& e) {
  std::string s = std::string("aten::") + e.name;
  if (e.overload[0] != 0) {
    s += ".";
    s += e.overload;
  }
  return s;
}

std::once_flag g_register_once;
char g_register_error[512] = "";

void register_kernels() {
  // (name, overload) -> entries in the CUDA and CPU lists.
  std::map<std::pair<std::string, std::string>, std::array<const Entry*, 2>> ops;
  for (int32_t which : {MP_AUTOCAST_LIST_CUDA, MP_AUTOCAST_LIST_CPU}) {
    const List l = list_of(which);
    for (size_t i = 0; i < l.n; ++i) {
      ops[{l.begin[i].name, l.begin[i].overload}][size_t(which)] = &l.begin[i];
    }
  }
  auto& d = c10::Dispatcher::singleton();
  // Check before registering anything: over an existing kernel libtorch would warn.
  for (const auto& [key, rules] : ops) {
    auto op = d.findSchema({"aten::" + key.first, key.second});
    if (op.has_value() && op->hasKernelForDispatchKey(kKey)) {
      std::snprintf(g_register_error, sizeof g_register_error,
                    "%s already has an AutocastIPU kernel in this libtorch: the dry run cannot "
                    "model autocast",
                    op_name(*(rules[0] ? rules[0] : rules[1])).c_str());
      return;
    }
  }
  for (const char* name : kJitCasts) {
    auto op = d.findSchema({std::string("aten::") + name, ""});
    if (op.has_value() && op->hasKernelForDispatchKey(kKey)) {
      std::snprintf(g_register_error, sizeof g_register_error,
                    "aten::%s already has an AutocastIPU kernel in this libtorch: the dry run "
                    "cannot model autocast",
                    name);
      return;
    }
  }
  // Kept for the life of the process (a registration ends with its Library).
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", kKey, __FILE__, __LINE__);
  for (const auto& [key, rules] : ops) {
    if (!d.findSchema({"aten::" + key.first, key.second}).has_value()) {
      continue;  // not in this libtorch (the list test says so)
    }
    const std::string name = key.second.empty() ? key.first : key.first + "." + key.second;
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                std::make_unique<AutocastKernel>(rules[0], rules[1])));
  }
  lib->impl("_autocast_to_reduced_precision", TORCH_FN(jit_to_reduced));
  lib->impl("_autocast_to_full_precision", TORCH_FN(jit_to_full));
  if (!d.hasBackendFallbackForDispatchKey(kKey)) {
    auto* fallback = new torch::Library(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    fallback->fallback(torch::CppFunction::makeFallthrough());
  }
}

std::string listing(int32_t which) {
  std::string out;
  if (which == MP_AUTOCAST_LIST_CUDA || which == MP_AUTOCAST_LIST_CPU) {
    const List l = list_of(which);
    auto& d = c10::Dispatcher::singleton();
    for (size_t i = 0; i < l.n; ++i) {
      // Overloads this libtorch no longer has (the named-tensor ones, gone in 2.13).
      if (!d.findSchema({std::string("aten::") + l.begin[i].name, l.begin[i].overload})
               .has_value()) {
        continue;
      }
      out += op_name(l.begin[i]);
      out += ' ';
      out += policy_name(l.begin[i].policy);
      out += '\n';
    }
    return out;
  }
  // What this libtorch registers on AutocastCUDA / AutocastCPU (fallthroughs apart).
  const c10::DispatchKey k = which == MP_AUTOCAST_REGISTERED_CUDA ? c10::DispatchKey::AutocastCUDA
                                                                  : c10::DispatchKey::AutocastCPU;
  auto& d = c10::Dispatcher::singleton();
  for (const auto& name : d.getAllOpNames()) {
    auto op = d.findOp(name);
    if (op.has_value() && op->hasKernelForDispatchKey(k) && !op->isKernelFallthroughKernel(k)) {
      out += c10::toString(name);
      out += '\n';
    }
  }
  return out;
}

}  // namespace

bool meta_autocast_begin(int32_t list, int32_t dtype) {
  if (!meta_trace_on()) {
    set_error("the dry run's autocast is only for a meta trace (an estimate's dry run)");
    return false;
  }
  if (tls_list >= 0) {
    set_error("the dry run's autocast is already on in this thread");
    return false;
  }
  const auto st = c10::ScalarType(dtype);
  if (st != at::kBFloat16 && st != at::kHalf) {
    set_error("the autocast dtype must be bfloat16 or float16");
    return false;
  }
  std::call_once(g_register_once, []() {
    try {
      register_kernels();
    } catch (const std::exception& e) {
      std::snprintf(g_register_error, sizeof g_register_error, "%s", e.what());
    }
  });
  if (g_register_error[0] != 0) {
    set_error(g_register_error);
    return false;
  }
  tls_saved_included = c10::impl::tls_is_dispatch_key_included(kKey);
  tls_saved_excluded = c10::impl::tls_is_dispatch_key_excluded(kKey);
  tls_list = list;
  tls_dtype = st;
  tls_saved_flag = at::autocast::is_autocast_enabled(flag_device(list));
  tls_saved_flag_dtype = at::autocast::get_autocast_dtype(flag_device(list));
  at::autocast::set_autocast_enabled(flag_device(list), true);
  at::autocast::set_autocast_dtype(flag_device(list), st);
  c10::impl::tls_set_dispatch_key_excluded(kKey, false);
  c10::impl::tls_set_dispatch_key_included(kKey, true);
  return true;
}

void meta_autocast_end() {
  if (tls_list < 0) {
    return;
  }
  c10::impl::tls_set_dispatch_key_included(kKey, tls_saved_included);
  c10::impl::tls_set_dispatch_key_excluded(kKey, tls_saved_excluded);
  at::autocast::set_autocast_enabled(flag_device(tls_list), tls_saved_flag);
  at::autocast::set_autocast_dtype(flag_device(tls_list), tls_saved_flag_dtype);
  tls_list = -1;
  tls_dtype = c10::ScalarType::Undefined;
  clear_cache();  // the outermost region ends: the cached casts go
}

std::string autocast_listing(int32_t which) {
  return listing(which);
}

}  // namespace memprof
