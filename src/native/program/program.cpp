// Exported programs (torch.export, .pt2). The graph is read and walked in Rust
// (src/program/); each node's op is called here, through the dispatcher, so autograd,
// autocast, the dry run's meta kernels and both op recorders see it as they see an eager
// call. Arguments come by name and are matched to the op's schema, the schema's defaults
// filling the ones the node leaves out, as torch.export's own deserializer does.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <ATen/ScalarOps.h>

#include <cstring>
#include <string>
#include <vector>

#include "program.h"

namespace memprof {
namespace {

// The module path of the node running on this thread (NULL: none runs).
thread_local const char* tls_module = nullptr;

struct ModuleScope {
  const char* prev;
  explicit ModuleScope(const char* m) : prev(tls_module) { tls_module = m != nullptr ? m : ""; }
  ~ModuleScope() { tls_module = prev; }
};

const char* kind_name(int32_t kind) {
  switch (kind) {
    case MP_VALUE_NONE: return "None";
    case MP_VALUE_TENSOR: return "a tensor";
    case MP_VALUE_INT: return "an int";
    case MP_VALUE_FLOAT: return "a float";
    case MP_VALUE_BOOL: return "a bool";
    case MP_VALUE_STRING: return "a string";
    case MP_VALUE_DEVICE: return "a device";
    case MP_VALUE_LIST: return "a list";
    default: return "an unknown value";
  }
}

const at::Tensor& tensor_of(const MpValue& v, const std::string& arg) {
  TORCH_CHECK(v.kind == MP_VALUE_TENSOR && v.tensor != nullptr, "argument '", arg,
              "' wants a tensor, the node gives ", kind_name(v.kind));
  return *static_cast<const at::Tensor*>(v.tensor);
}

// One non-list value as the schema type `type` (its Optional unwrapped) wants it.
c10::IValue scalar_value(const c10::TypePtr& type, const MpValue& v, const std::string& arg) {
  if (v.kind == MP_VALUE_NONE) {
    return c10::IValue();
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      // `aten.sub.Tensor(x, 1)`: Python wraps the number as a 0-dim CPU tensor marked a
      // wrapped number (it takes part in type promotion as a scalar); so does this.
      if (v.kind == MP_VALUE_INT || v.kind == MP_VALUE_FLOAT || v.kind == MP_VALUE_BOOL) {
        const c10::Scalar s = v.kind == MP_VALUE_FLOAT ? c10::Scalar(v.f)
                              : v.kind == MP_VALUE_BOOL ? c10::Scalar(v.i != 0)
                                                        : c10::Scalar(v.i);
        at::Tensor t = c10::scalar_to_tensor(s);
        t.unsafeGetTensorImpl()->set_wrapped_number(true);
        return t;
      }
      return tensor_of(v, arg);
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      TORCH_CHECK(v.kind == MP_VALUE_INT || v.kind == MP_VALUE_BOOL, "argument '", arg,
                  "' wants an int, the node gives ", kind_name(v.kind));
      return c10::IValue(v.i);
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      TORCH_CHECK(v.kind == MP_VALUE_FLOAT || v.kind == MP_VALUE_INT, "argument '", arg,
                  "' wants a float, the node gives ", kind_name(v.kind));
      return c10::IValue(v.kind == MP_VALUE_FLOAT ? v.f : double(v.i));
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      TORCH_CHECK(v.kind == MP_VALUE_BOOL || v.kind == MP_VALUE_INT, "argument '", arg,
                  "' wants a bool, the node gives ", kind_name(v.kind));
      return c10::IValue(v.i != 0);
    case c10::TypeKind::NumberType:
      if (v.kind == MP_VALUE_FLOAT) {
        return c10::IValue(v.f);
      }
      if (v.kind == MP_VALUE_BOOL) {
        return c10::IValue(v.i != 0);
      }
      TORCH_CHECK(v.kind == MP_VALUE_INT, "argument '", arg, "' wants a number, the node gives ",
                  kind_name(v.kind));
      return c10::IValue(v.i);
    case c10::TypeKind::StringType:
      TORCH_CHECK(v.kind == MP_VALUE_STRING, "argument '", arg, "' wants a string, the node gives ",
                  kind_name(v.kind));
      return c10::IValue(std::string(v.str, size_t(v.len)));
    case c10::TypeKind::DeviceObjType:
      TORCH_CHECK(v.kind == MP_VALUE_DEVICE, "argument '", arg, "' wants a device, the node gives ",
                  kind_name(v.kind));
      return c10::IValue(c10::Device(std::string(v.str, size_t(v.len))));
    default:
      TORCH_CHECK(false, "argument '", arg, "' has type ", type->str(),
                  ", which exported programs are not read with");
  }
}

// The argument `arg` of type `type` from args[*k] (a list's elements after it); *k
// moves past what it took.
c10::IValue argument_value(const c10::Argument& schema_arg, const MpValue* args, size_t n,
                           size_t* k) {
  const std::string& arg = schema_arg.name();
  c10::TypePtr type = schema_arg.type();
  const MpValue& v = args[*k];
  *k += 1;
  if (auto opt = type->cast<c10::OptionalType>()) {
    if (v.kind == MP_VALUE_NONE) {
      return c10::IValue();
    }
    type = opt->getElementType();
  }
  auto list = type->cast<c10::ListType>();
  if (!list) {
    return scalar_value(type, v, arg);
  }
  const c10::TypePtr elem = list->getElementType();
  if (v.kind != MP_VALUE_LIST) {
    // `int[2] stride=1`: one int stands for the whole list.
    TORCH_CHECK(v.kind == MP_VALUE_INT && (elem->kind() == c10::TypeKind::IntType ||
                                           elem->kind() == c10::TypeKind::SymIntType),
                "argument '", arg, "' wants a list, the node gives ", kind_name(v.kind));
    const size_t times = schema_arg.N().value_or(1);
    return c10::IValue(std::vector<int64_t>(times, v.i));
  }
  const size_t len = size_t(v.len);
  TORCH_CHECK(*k + len <= n, "argument '", arg, "': the list's elements are missing");
  const MpValue* items = args + *k;
  *k += len;
  switch (elem->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: {
      std::vector<int64_t> xs;
      xs.reserve(len);
      for (size_t j = 0; j < len; ++j) {
        xs.push_back(scalar_value(elem, items[j], arg).toInt());
      }
      return c10::IValue(std::move(xs));
    }
    case c10::TypeKind::FloatType: {
      std::vector<double> xs;
      for (size_t j = 0; j < len; ++j) {
        xs.push_back(scalar_value(elem, items[j], arg).toDouble());
      }
      return c10::IValue(std::move(xs));
    }
    case c10::TypeKind::BoolType: {
      c10::List<bool> xs;
      for (size_t j = 0; j < len; ++j) {
        xs.push_back(scalar_value(elem, items[j], arg).toBool());
      }
      return c10::IValue(std::move(xs));
    }
    case c10::TypeKind::TensorType: {
      c10::List<at::Tensor> xs;
      xs.reserve(len);
      for (size_t j = 0; j < len; ++j) {
        xs.push_back(tensor_of(items[j], arg));
      }
      return c10::IValue(std::move(xs));
    }
    case c10::TypeKind::OptionalType: {
      auto inner = elem->cast<c10::OptionalType>()->getElementType();
      TORCH_CHECK(inner->kind() == c10::TypeKind::TensorType, "argument '", arg, "' has type ",
                  type->str(), ", which exported programs are not read with");
      c10::List<std::optional<at::Tensor>> xs;
      for (size_t j = 0; j < len; ++j) {
        if (items[j].kind == MP_VALUE_NONE) {
          xs.push_back(std::nullopt);
        } else {
          xs.push_back(tensor_of(items[j], arg));
        }
      }
      return c10::IValue(std::move(xs));
    }
    default:
      TORCH_CHECK(false, "argument '", arg, "' has type ", type->str(),
                  ", which exported programs are not read with");
  }
}

// Writes one returned value to out[*k...]; false when out is full.
bool put_result(const c10::IValue& r, MpValue* out, size_t cap, size_t* k) {
  auto slot = [&]() -> MpValue* {
    if (*k >= cap) {
      return nullptr;
    }
    MpValue* v = &out[(*k)++];
    std::memset(v, 0, sizeof(MpValue));
    return v;
  };
  auto scalar = [&](const c10::IValue& x, MpValue* v) {
    if (x.isTensor()) {
      const at::Tensor& t = x.toTensor();
      if (t.defined()) {
        v->kind = MP_VALUE_TENSOR;
        v->tensor = new at::Tensor(t);
      }
    } else if (x.isInt()) {
      v->kind = MP_VALUE_INT;
      v->i = x.toInt();
    } else if (x.isSymInt()) {
      v->kind = MP_VALUE_INT;
      v->i = x.toSymInt().guard_int(__FILE__, __LINE__);
    } else if (x.isDouble()) {
      v->kind = MP_VALUE_FLOAT;
      v->f = x.toDouble();
    } else if (x.isBool()) {
      v->kind = MP_VALUE_BOOL;
      v->i = x.toBool() ? 1 : 0;
    } else {
      TORCH_CHECK(x.isNone(), "the op returned ", x.tagKind(),
                  ", which exported programs are not read with");
    }
  };
  if (r.isTensorList() || r.isList()) {
    const auto items = r.toListRef();
    MpValue* head = slot();
    if (head == nullptr) {
      return false;
    }
    head->kind = MP_VALUE_LIST;
    head->len = int32_t(items.size());
    for (const c10::IValue& x : items) {
      MpValue* v = slot();
      if (v == nullptr) {
        return false;
      }
      scalar(x, v);
    }
    return true;
  }
  MpValue* v = slot();
  if (v == nullptr) {
    return false;
  }
  scalar(r, v);
  return true;
}

void free_results(MpValue* out, size_t k) {
  for (size_t j = 0; j < k; ++j) {
    if (out[j].kind == MP_VALUE_TENSOR) {
      delete static_cast<at::Tensor*>(out[j].tensor);
      out[j].tensor = nullptr;
      out[j].kind = MP_VALUE_NONE;
    }
  }
}
}  // namespace

int program_call(const char* op, const char* overload, const char* module, const MpValue* args,
                 size_t n, MpValue* out, size_t cap, size_t* n_out) {
  *n_out = 0;
  const c10::OperatorHandle handle =
      c10::Dispatcher::singleton().findSchemaOrThrow(op, overload != nullptr ? overload : "");
  const c10::FunctionSchema& schema = handle.schema();
  // The named arguments' positions (a list's elements are not named).
  std::vector<size_t> named;
  for (size_t k = 0; k < n; ++k) {
    if (args[k].name != nullptr) {
      named.push_back(k);
    }
    if (args[k].kind == MP_VALUE_LIST) {
      k += size_t(args[k].len);
    }
  }
  std::vector<bool> used(named.size(), false);
  torch::jit::Stack stack;
  stack.reserve(schema.arguments().size());
  for (const c10::Argument& a : schema.arguments()) {
    size_t found = named.size();
    for (size_t j = 0; j < named.size(); ++j) {
      if (!used[j] && a.name() == args[named[j]].name) {
        found = j;
        break;
      }
    }
    if (found == named.size()) {
      TORCH_CHECK(a.default_value().has_value(), op, ": the node gives no argument '", a.name(),
                  "', which has no default");
      stack.push_back(*a.default_value());
      continue;
    }
    used[found] = true;
    size_t k = named[found];
    stack.push_back(argument_value(a, args, n, &k));
  }
  for (size_t j = 0; j < named.size(); ++j) {
    TORCH_CHECK(used[j], op, ".", overload, " has no argument '", args[named[j]].name,
                "' (the program was exported by a PyTorch whose schema differs)");
  }
  {
    ModuleScope scope(module);
    handle.callBoxed(stack);
  }
  size_t k = 0;
  bool fitted = true;
  try {
    for (const c10::IValue& r : stack) {
      if (!put_result(r, out, cap, &k)) {
        fitted = false;
        break;
      }
    }
  } catch (...) {
    free_results(out, k);  // the handles made before a return that cannot be passed
    throw;
  }
  if (!fitted) {
    free_results(out, k);
    TORCH_CHECK(false, op, " returned more than ", cap, " values");
  }
  *n_out = k;
  return 0;
}

bool program_module_path(char* buf, size_t cap, bool* fits) {
  const char* m = tls_module;
  if (m == nullptr) {
    return false;
  }
  const size_t len = std::strlen(m);
  *fits = len < cap;
  if (*fits) {
    std::memcpy(buf, m, len + 1);
  } else {
    buf[0] = 0;
  }
  return true;
}

}  // namespace memprof
