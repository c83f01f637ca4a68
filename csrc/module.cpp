// Python bindings of the eagerdecomp C++ library. Importing this module has no side
// effects: the reference device registers itself only when register_device() is called.
#include <torch/extension.h>
#include <torch/headeronly/version.h>

#include "refdev.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "eagerdecomp C++ library: the strict reference device (edref)";
  m.attr("BUILT_WITH_TORCH") = TORCH_VERSION;
  namespace rd = eagerdecomp::refdev;
  m.def("register_device", &rd::register_device, "Install edref and forward each named op to the CPU kernel");
  m.def("op_log", &rd::op_log, "Ops that ran on edref since the last clear, with counts");
  m.def("op_log_clear", &rd::op_log_clear);
  m.def("set_logging", &rd::set_logging);
}
