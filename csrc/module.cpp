// Python bindings of the eagerdecomp C++ library. Importing this module has no side
// effects: the reference device registers itself only when register_device() is called.
#include <torch/extension.h>
#include <torch/headeronly/version.h>

#include "refdev.h"

namespace eagerdecomp::key {  // csrc/key.cpp
void init_key(pybind11::handle bypass, pybind11::tuple extra_plain_types);
pybind11::object make_key(pybind11::handle func, pybind11::handle args, pybind11::handle kwargs);
}  // namespace eagerdecomp::key

namespace eagerdecomp::hit {  // csrc/hit.cpp
void init(pybind11::module_& m);
}  // namespace eagerdecomp::hit

namespace eagerdecomp::mode {  // csrc/mode.cpp
void init(pybind11::module_& m);
}  // namespace eagerdecomp::mode

namespace eagerdecomp::host {  // csrc/host.cpp
void init(pybind11::module_& m);
}  // namespace eagerdecomp::host

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "eagerdecomp C++ library: the strict reference device (edref)";
  m.attr("BUILT_WITH_TORCH") = TORCH_VERSION;
  namespace rd = eagerdecomp::refdev;
  m.def("register_device", &rd::register_device, "Install edref and forward each named op to the CPU kernel");
  m.def("op_log", &rd::op_log, "Ops that ran on edref since the last clear, with counts");
  m.def("op_log_clear", &rd::op_log_clear);
  m.def("set_logging", &rd::set_logging);
  m.def("host_view", &rd::host_view, "A CPU tensor over an edref tensor's memory (for host collectives)");
  m.def("_init_key", &eagerdecomp::key::init_key, "Bypass class and extra plain types for make_key (key.py calls it)");
  m.def("make_key", &eagerdecomp::key::make_key, "(parts, tensors) of a call: eagerdecomp/key.py's make_key_py in C++");
  eagerdecomp::hit::init(m);
  eagerdecomp::host::init(m);
  eagerdecomp::mode::init(m);
}
