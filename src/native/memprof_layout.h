// The FFI contract's layout table, included by memprof.h after its declarations. build.rs
// reads these lines (one per line, exactly this shape) and asserts the same numbers on the
// Rust mirrors of the same names (in src/ffi/ only); C++ asserts them below.

#ifndef TCH_MEMPROF_LAYOUT_H
#define TCH_MEMPROF_LAYOUT_H

#define MP_LAYOUT_TABLE(MP_SIZE, MP_FIELD, MP_CONST)   \
  MP_CONST(MP_MAX_DEVICES, 17)                         \
  MP_CONST(MP_PHASE_FORWARD, 0)                        \
  MP_CONST(MP_PHASE_BACKWARD, 1)                       \
  MP_CONST(MP_PHASE_OPTIMIZER, 2)                      \
  MP_CONST(MP_PHASE_IDLE, 3)                           \
  MP_CONST(MP_EV_ALLOC, 1)                             \
  MP_CONST(MP_EV_FREE, 2)                              \
  MP_CONST(MP_EV_OP_BEGIN, 3)                          \
  MP_CONST(MP_EV_OP_END, 4)                            \
  MP_CONST(MP_EV_LINK, 5)                              \
  MP_CONST(MP_EV_FLOPS, 6)                             \
  MP_CONST(MP_EV_UNCOUNTED, 7)                         \
  MP_CONST(MP_EV_PHASE, 8)                             \
  MP_CONST(MP_EV_READ, 9)                              \
  MP_CONST(MP_EV_BASELINE, 10)                         \
  MP_CONST(MP_EV_WORKSPACE, 11)                        \
  MP_CONST(MP_EV_TRANSIENT, 12)                        \
  MP_CONST(MP_TRANSIENT_EXACT, 0)                      \
  MP_CONST(MP_TRANSIENT_BOUND, 1)                      \
  MP_CONST(MP_TRANSIENT_MEASURED, 2)                   \
  MP_CONST(MP_TRANSIENT_RULE, 3)                       \
  MP_CONST(MP_TRANSIENT_SPLIT, 4)                      \
  MP_CONST(MP_TARGET_STEP, 0)                          \
  MP_CONST(MP_TARGET_DRY_RUN, 1)                       \
  MP_CONST(MP_SITE_DEPTH, 96)                          \
  MP_CONST(MP_BLOCKS_WATCH, 1)                         \
  MP_CONST(MP_BLOCKS_GRADS_ONLY, 2)                    \
  MP_CONST(MP_WATCH_VARIABLE, 1)                       \
  MP_CONST(MP_WATCH_GRAD, 2)                           \
  MP_SIZE(MpSite, 776)                                 \
  MP_FIELD(MpSite, frames, 0)                          \
  MP_FIELD(MpSite, ips, 8)                             \
  MP_CONST(MP_DEVICE_CPU, 0)                           \
  MP_CONST(MP_DEVICE_CUDA, 1)                          \
  MP_CONST(MP_CUDA_RESET_PEAKS, 0)                     \
  MP_CONST(MP_CUDA_EMPTY_CACHE, 1)                     \
  MP_CONST(MP_CUDA_CLEAR_WORKSPACES, 2)                \
  MP_CONST(MP_WORKSPACE_CUBLAS, 0)                     \
  MP_CONST(MP_WORKSPACE_CUBLASLT, 1)                   \
  MP_SIZE(MpWorkspace, 32)                             \
  MP_FIELD(MpWorkspace, ptr, 0)                        \
  MP_FIELD(MpWorkspace, bytes, 8)                      \
  MP_FIELD(MpWorkspace, device, 16)                    \
  MP_FIELD(MpWorkspace, kind, 20)                      \
  MP_FIELD(MpWorkspace, tracked, 24)                   \
  MP_SIZE(MpDeviceStats, 96)                           \
  MP_FIELD(MpDeviceStats, live, 0)                     \
  MP_FIELD(MpDeviceStats, peak_iter, 8)                \
  MP_FIELD(MpDeviceStats, peak_run, 16)                \
  MP_FIELD(MpDeviceStats, allocs, 24)                  \
  MP_FIELD(MpDeviceStats, optimizer_born_live, 32)     \
  MP_FIELD(MpDeviceStats, feature_maps, 40)            \
  MP_FIELD(MpDeviceStats, reported_allocated, 48)      \
  MP_FIELD(MpDeviceStats, reported_reserved, 56)       \
  MP_FIELD(MpDeviceStats, reported_peak_allocated_iter, 64) \
  MP_FIELD(MpDeviceStats, reported_peak_reserved_iter, 72)  \
  MP_FIELD(MpDeviceStats, reported_peak_allocated_run, 80)  \
  MP_FIELD(MpDeviceStats, reported_peak_reserved_run, 88)   \
  MP_SIZE(MpState, 88)                                 \
  MP_FIELD(MpState, generation, 0)                     \
  MP_FIELD(MpState, phase, 4)                          \
  MP_FIELD(MpState, active_backward, 8)                \
  MP_FIELD(MpState, backward_passes, 16)               \
  MP_FIELD(MpState, log_len, 24)                       \
  MP_FIELD(MpState, log_capacity, 32)                  \
  MP_FIELD(MpState, untagged_frees, 40)                \
  MP_FIELD(MpState, cpu_installed, 48)                 \
  MP_FIELD(MpState, cuda_loaded, 52)                   \
  MP_FIELD(MpState, cuda_ooms_seen, 56)                \
  MP_FIELD(MpState, hook_reentries, 64)                \
  MP_FIELD(MpState, cuda_untracked, 72)                \
  MP_FIELD(MpState, op_records, 80)                    \
  MP_SIZE(MpLogEvent, 24)                              \
  MP_FIELD(MpLogEvent, ptr, 0)                         \
  MP_FIELD(MpLogEvent, delta, 8)                       \
  MP_FIELD(MpLogEvent, generation, 16)                 \
  MP_FIELD(MpLogEvent, device, 20)                     \
  MP_SIZE(MpBlock, 48)                                 \
  MP_FIELD(MpBlock, defined, 0)                        \
  MP_FIELD(MpBlock, device, 4)                         \
  MP_FIELD(MpBlock, tracked, 8)                        \
  MP_FIELD(MpBlock, phase, 12)                         \
  MP_FIELD(MpBlock, generation, 16)                    \
  MP_FIELD(MpBlock, watched, 20)                       \
  MP_FIELD(MpBlock, birth_log, 24)                     \
  MP_FIELD(MpBlock, reserved, 28)                      \
  MP_FIELD(MpBlock, base, 32)                          \
  MP_FIELD(MpBlock, bytes, 40)                         \
  MP_SIZE(MpCudaStats, 96)                             \
  MP_FIELD(MpCudaStats, allocated_current, 0)          \
  MP_FIELD(MpCudaStats, allocated_peak, 8)             \
  MP_FIELD(MpCudaStats, reserved_current, 16)          \
  MP_FIELD(MpCudaStats, reserved_peak, 24)             \
  MP_FIELD(MpCudaStats, active_current, 32)            \
  MP_FIELD(MpCudaStats, active_peak, 40)               \
  MP_FIELD(MpCudaStats, requested_current, 48)         \
  MP_FIELD(MpCudaStats, requested_peak, 56)            \
  MP_FIELD(MpCudaStats, alloc_retries, 64)             \
  MP_FIELD(MpCudaStats, ooms, 72)                      \
  MP_FIELD(MpCudaStats, free_bytes, 80)                \
  MP_FIELD(MpCudaStats, total_bytes, 88)               \
  MP_SIZE(MpTlEvent, 32)                               \
  MP_FIELD(MpTlEvent, kind, 0)                         \
  MP_FIELD(MpTlEvent, phase, 1)                        \
  MP_FIELD(MpTlEvent, device, 2)                       \
  MP_FIELD(MpTlEvent, pad, 3)                          \
  MP_FIELD(MpTlEvent, generation, 4)                   \
  MP_FIELD(MpTlEvent, op, 8)                           \
  MP_FIELD(MpTlEvent, aux, 12)                         \
  MP_FIELD(MpTlEvent, ptr, 16)                         \
  MP_FIELD(MpTlEvent, value, 24)                       \
  MP_SIZE(MpTimelineHeader, 48)                        \
  MP_FIELD(MpTimelineHeader, len, 0)                   \
  MP_FIELD(MpTimelineHeader, capacity, 8)              \
  MP_FIELD(MpTimelineHeader, start_generation, 16)     \
  MP_FIELD(MpTimelineHeader, ops, 20)                  \
  MP_FIELD(MpTimelineHeader, start_live, 24)           \
  MP_FIELD(MpTimelineHeader, on, 32)                   \
  MP_FIELD(MpTimelineHeader, device, 36)               \
  MP_FIELD(MpTimelineHeader, records, 40)              \
  MP_FIELD(MpTimelineHeader, learning, 44)             \
  MP_SIZE(MpLiveBlock, 32)                             \
  MP_FIELD(MpLiveBlock, ptr, 0)                        \
  MP_FIELD(MpLiveBlock, size, 8)                       \
  MP_FIELD(MpLiveBlock, op, 16)                        \
  MP_FIELD(MpLiveBlock, layer, 20)                     \
  MP_FIELD(MpLiveBlock, iter, 24)                      \
  MP_FIELD(MpLiveBlock, phase, 28)                     \
  MP_FIELD(MpLiveBlock, device, 29)                    \
  MP_FIELD(MpLiveBlock, pad, 30)                       \
  MP_SIZE(MpRegistry, 64)                              \
  MP_FIELD(MpRegistry, capacity, 0)                    \
  MP_FIELD(MpRegistry, high_water, 8)                  \
  MP_FIELD(MpRegistry, live, 16)                       \
  MP_FIELD(MpRegistry, dropped, 24)                    \
  MP_FIELD(MpRegistry, entry_bytes, 32)                \
  MP_FIELD(MpRegistry, on, 40)                         \
  MP_FIELD(MpRegistry, pad, 44)                        \
  MP_FIELD(MpRegistry, learned_ops_bytes, 48)          \
  MP_FIELD(MpRegistry, looked_up_ops, 56)              \
  MP_SIZE(MpHistEvent, 32)                             \
  MP_FIELD(MpHistEvent, ptr, 0)                        \
  MP_FIELD(MpHistEvent, size, 8)                       \
  MP_FIELD(MpHistEvent, op, 16)                        \
  MP_FIELD(MpHistEvent, layer, 20)                     \
  MP_FIELD(MpHistEvent, time_dev, 24)                  \
  MP_CONST(MP_META_CAPACITY, 33554432)                 \
  MP_CONST(MP_AUTOCAST_LIST_CUDA, 0)                   \
  MP_CONST(MP_AUTOCAST_LIST_CPU, 1)                    \
  MP_CONST(MP_AUTOCAST_REGISTERED_CUDA, 2)             \
  MP_CONST(MP_AUTOCAST_REGISTERED_CPU, 3)              \
  MP_CONST(MP_INPUT_UNKNOWN, 0)                        \
  MP_CONST(MP_INPUT_TOKENS, 1)                         \
  MP_CONST(MP_INPUT_IMAGES, 2)                         \
  MP_CONST(MP_MARK_NONE, 0)                            \
  MP_CONST(MP_MARK_FORWARD, 1)                         \
  MP_CONST(MP_MARK_BACKWARD, 2)                        \
  MP_CONST(MP_MARK_OPTIMIZER, 3)                       \
  MP_CONST(MP_MARK_BASELINE, 4)                        \
  MP_CONST(MP_MARK_END, 5)                             \
  MP_CONST(MP_MARK_STEP, 6)                            \
  MP_CONST(MP_ATTN_AUTO, 0)                            \
  MP_CONST(MP_ATTN_FLASH, 1)                           \
  MP_CONST(MP_ATTN_EFFICIENT, 2)                       \
  MP_CONST(MP_ATTN_CUDNN, 3)                           \
  MP_CONST(MP_ATTN_MATH, 4)                            \
  MP_SIZE(MpAttention, 40)                             \
  MP_FIELD(MpAttention, sm, 0)                         \
  MP_FIELD(MpAttention, backend, 4)                    \
  MP_FIELD(MpAttention, runs, 8)                       \
  MP_CONST(MP_VALUE_NONE, 0)                           \
  MP_CONST(MP_VALUE_TENSOR, 1)                         \
  MP_CONST(MP_VALUE_INT, 2)                            \
  MP_CONST(MP_VALUE_FLOAT, 3)                          \
  MP_CONST(MP_VALUE_BOOL, 4)                           \
  MP_CONST(MP_VALUE_STRING, 5)                         \
  MP_CONST(MP_VALUE_DEVICE, 6)                         \
  MP_CONST(MP_VALUE_LIST, 7)                           \
  MP_SIZE(MpValue, 48)                                 \
  MP_FIELD(MpValue, kind, 0)                           \
  MP_FIELD(MpValue, len, 4)                            \
  MP_FIELD(MpValue, i, 8)                              \
  MP_FIELD(MpValue, f, 16)                             \
  MP_FIELD(MpValue, tensor, 24)                        \
  MP_FIELD(MpValue, name, 32)                          \
  MP_FIELD(MpValue, str, 40)                           \
  MP_SIZE(MpAutocast, 8)                               \
  MP_FIELD(MpAutocast, enabled, 0)                     \
  MP_FIELD(MpAutocast, dtype, 4)

#ifdef __cplusplus
#define MP_ASSERT_SIZE(S, n) static_assert(sizeof(S) == (n), "size of " #S " (mirrored in src/ffi/)");
#define MP_ASSERT_FIELD(S, f, o) \
  static_assert(offsetof(S, f) == (o), "offset of " #S "." #f " (mirrored in src/ffi/)");
#define MP_ASSERT_CONST(c, v) static_assert((c) == (v), "value of " #c " (mirrored in src/ffi/)");
MP_LAYOUT_TABLE(MP_ASSERT_SIZE, MP_ASSERT_FIELD, MP_ASSERT_CONST)
#undef MP_ASSERT_SIZE
#undef MP_ASSERT_FIELD
#undef MP_ASSERT_CONST
#endif

#endif  // TCH_MEMPROF_LAYOUT_H
