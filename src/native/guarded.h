// guarded(): the wrapper of every C ABI function (api.cpp, api_estimate.cpp), which
// turns any C++ exception into -1 and a message in the calling thread's last-error slot.

#ifndef TCH_MEMPROF_GUARDED_H
#define TCH_MEMPROF_GUARDED_H

#include <exception>
#include <string>

#include "internal.h"

namespace memprof {

template <class F>
int guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    try {
      set_error((std::string("unknown C++ exception in ") + what).c_str());
    } catch (...) {
    }
  }
  return -1;
}

}  // namespace memprof

#endif  // TCH_MEMPROF_GUARDED_H
