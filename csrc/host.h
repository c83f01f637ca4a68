// The CPU tier (csrc/host.cpp): an op with no path to a device's kernels, run on the host.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

namespace eagerdecomp::host {

// What one call copied: bytes each way, and the nanoseconds spent copying.
struct Traffic {
  int64_t to_host = 0;
  int64_t to_device = 0;
  int64_t copy_ns = 0;
};

// Runs the boxed call on `stack` (its arguments on top) with the CPU's kernel: tensors of
// `device_type` are mirrored to host memory (strides, offsets and shared storage kept),
// written arguments are written back into the caller's tensors, fresh results are copied to
// the device. Leaves the op's returns on the stack, as a kernel does.
void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceType device_type, Traffic& traffic);

}  // namespace eagerdecomp::host
