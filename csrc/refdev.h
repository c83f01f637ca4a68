// The reference device "edref": a strict PrivateUse1 backend over host memory.
// See refdev.cpp for why each piece exists.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace eagerdecomp::refdev {

// Install the allocator, device guard and hooks (once per process), then give each op
// in `ops` ("aten::add.Tensor") a PrivateUse1 kernel that forwards to the CPU kernel.
void register_device(const std::vector<std::string>& ops);

// Op names (overload included) that ran on the device since the last clear, with counts.
std::map<std::string, int64_t> op_log();
void op_log_clear();
void set_logging(bool on);

// A CPU tensor over the same memory as edref tensor `t` (same sizes, strides and offset):
// what the device's process-group backend hands to gloo (eagerdecomp/refdev_dist.py).
at::Tensor host_view(const at::Tensor& t);

}  // namespace eagerdecomp::refdev
