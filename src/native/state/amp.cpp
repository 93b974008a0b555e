// Autocast and random-generator state, for checkpointing and mixed precision: autocast
// entered and left per device type (the previous state handed back to the caller), and
// the default generator's state read and restored.

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include <mutex>

#include "../internal.h"

namespace memprof {

namespace {
c10::DeviceType device_type_of(int32_t device_type) {
  return device_type == MP_DEVICE_CPU ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
}

// The default random generator of a device.
at::Generator default_generator(int32_t device_type, int32_t index) {
  const c10::Device d = device_type == MP_DEVICE_CPU
      ? c10::Device(c10::DeviceType::CPU)
      : c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(index));
  return at::globalContext().defaultGenerator(d);
}
}  // namespace

bool valid_device_type(int32_t device_type) {
  if (device_type != MP_DEVICE_CPU && device_type != MP_DEVICE_CUDA) {
    set_error("unknown device type (0: CPU, 1: CUDA)");
    return false;
  }
  return true;
}

void autocast_enter(int32_t device_type, int32_t enabled, int32_t dtype, MpAutocast* prev) {
  const auto dt = device_type_of(device_type);
  prev->enabled = at::autocast::is_autocast_enabled(dt) ? 1 : 0;
  prev->dtype = int32_t(at::autocast::get_autocast_dtype(dt));
  at::autocast::set_autocast_enabled(dt, enabled != 0);
  if (enabled) {
    at::autocast::set_autocast_dtype(dt, c10::ScalarType(dtype));
  }
  at::autocast::increment_nesting();
}

void autocast_exit(int32_t device_type, const MpAutocast* prev) {
  const auto dt = device_type_of(device_type);
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();  // the cached low-precision copies of the weights
  }
  at::autocast::set_autocast_enabled(dt, prev->enabled != 0);
  at::autocast::set_autocast_dtype(dt, c10::ScalarType(prev->dtype));
}

void rng_get(int32_t device_type, int32_t index, void** out) {
  *out = nullptr;
  at::Generator gen = default_generator(device_type, index);
  std::lock_guard<std::mutex> lock(gen.mutex());
  *out = new at::Tensor(gen.get_state());
}

void rng_set(int32_t device_type, int32_t index, const at::Tensor& state) {
  at::Generator gen = default_generator(device_type, index);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace memprof
