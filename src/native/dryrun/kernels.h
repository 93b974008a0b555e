// The table the dry run's meta kernels are registered from (kernels.cpp), and the part
// of it gap_kernels.cpp and norm_kernels.cpp hold.

#ifndef TCH_MEMPROF_KERNELS_H
#define TCH_MEMPROF_KERNELS_H

#include <torch/library.h>

#include <cstddef>

namespace memprof {

// A meta kernel, by the op (and overload) it is the meta kernel of.
struct MetaKernel {
  const char* op;  // `name` or `name.overload`
  torch::CppFunction (*kernel)();
};

extern const MetaKernel kGapKernels[];
extern const size_t kGapKernelCount;
// The normalizations' kernels (norm_kernels.cpp).
extern const MetaKernel kNormKernels[];
extern const size_t kNormKernelCount;
// The kernels that replace libtorch's meta kernel of an op where the autograd engine or a
// backward formula calls it (gap_kernels.cpp), registered always.
void register_engine_kernels(torch::Library& meta);

}  // namespace memprof

#endif  // TCH_MEMPROF_KERNELS_H
