// The CPU tier: an op with no path to a device's kernels, run by the CPU's kernel.
//
// PyTorch ships a boxed CPU fallback for out-of-tree backends, at::native::cpu_fallback
// (ATen/native/CPUFallback.h; torch_xla and MPS use it). Its redispatch to the CPU key is
// what this file does too; the steps around it are what it gets wrong for an eager-exact
// backend, so they are done here instead (docs/device-guide.md, "The CPU tier"):
//   * it copies each tensor to the host on its own (`_to_cpu`): two views of one storage
//     (an out= overlapping an input, x.add_(x.flip(0))) become unrelated tensors, so eager's
//     overlap errors and results are lost, and a non-dense input (an expand) arrives
//     contiguous, so results computed from strides (TensorIterator's layout) differ. Here
//     each device storage a call touches is copied once, over the byte span its tensors
//     use, and every tensor is re-made on the host copy with its own sizes, strides and
//     offset: the CPU kernel sees the same memory layout the device tensors have;
//   * it writes mutated arguments back with `_copy_from_and_resize`, a kernel a device must
//     provide and which resizes contiguously. Here a written storage span is copied back
//     whole, and an out= the CPU kernel resized is resized (and restrided) on the device as
//     the kernel did on the host, then filled;
//   * it moves results to the first tensor argument's device, the host when that argument
//     is a CPU scalar. Here results go to the device of the call's device tensors;
//   * it copies a view's result (a warning at most). Views are refused before this file is
//     reached (eagerdecomp/runtime/host.py), and a result that shares an input's memory is
//     an error here.
// Which ops may come here at all (views, random ops, the allow and deny lists) is decided in
// Python, once per op; this file is the per-call mechanism, with no Python.
#include "host.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <chrono>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace eagerdecomp::host {
namespace {

// One device storage the call touches, copied to the host over bytes [lo, hi).
struct Mirror {
  const c10::StorageImpl* storage = nullptr;
  int64_t lo = 0, hi = 0;
  at::Tensor device_bytes, host_bytes;  // uint8 views of the span, on the device and on the host
  bool written = false;
  // NOTE: a storage only one dense tensor uses is copied as that tensor (one .to(), its strides
  // kept): the span copy is for shared storages and tensors with gaps or overlaps
  const c10::TensorImpl* only = nullptr;
  bool direct = true;
};

// A device tensor of the call: where it sits in the arguments, and its host stand-in.
struct Ref {
  size_t arg;
  int64_t index;  // in a list argument, else -1
  at::Tensor device;
  at::Tensor host;
  int mirror = -1;  // -1: an empty tensor, given its own host storage
  bool written = false;
  std::vector<int64_t> sizes, strides;  // before the call, to see what the CPU kernel resized
  const c10::StorageImpl* host_storage = nullptr;
};

// One past the last element a tensor reaches, in elements of its storage.
int64_t span_end(const at::Tensor& t) {
  int64_t end = t.storage_offset() + 1;
  for (int64_t d = 0; d < t.dim(); ++d) end += (t.size(d) - 1) * t.stride(d);
  return end;
}

// The host tensor standing in for a device one: the same sizes, strides and offset over the
// host copy of its storage (mirror), or its own storage when it has no elements.
at::Tensor host_twin(const at::Tensor& t, const Mirror* m) {
  const auto opts = t.options().device(c10::kCPU);
  at::Tensor h;
  if (m == nullptr) {
    h = at::empty_strided(t.sizes(), t.strides(), opts);
  } else {
    const int64_t item = static_cast<int64_t>(t.element_size());
    h = at::empty({0}, opts).set_(m->host_bytes.storage(), (t.storage_offset() * item - m->lo) / item, t.sizes(),
                                   t.strides());
  }
  if (t.is_conj()) h._set_conj(true);
  if (t.is_neg()) h._set_neg(true);
  return h;
}

at::Tensor to_device(const c10::OperatorHandle& op, const at::Tensor& h, c10::Device device, Traffic& traffic) {
  TORCH_CHECK(h.layout() == c10::kStrided, op.schema().operator_name(), ": its CPU kernel returned a ", h.layout(),
              " tensor, and the CPU tier copies strided results only (a device with strided tensors): expected a "
              "strided result. Register a kernel for it on the device, or deny it the tier "
              "(EAGERDECOMP_CPU_FALLBACK_DENY).");
  traffic.to_device += static_cast<int64_t>(h.nbytes());
  // NOTE: .to() keeps the strides of a dense tensor (preserve_format); others are rebuilt
  if (h.is_non_overlapping_and_dense()) return h.to(device);
  return at::empty_strided(h.sizes(), h.strides(), h.options().device(device)).copy_(h);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool shares(const at::Tensor& h, const std::vector<const c10::StorageImpl*>& inputs) {
  if (!h.defined() || !h.has_storage()) return false;
  return std::find(inputs.begin(), inputs.end(), h.storage().unsafeGetStorageImpl()) != inputs.end();
}

}  // namespace

void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceType device_type, Traffic& traffic) {
  // NOTE: the copies are this tier's mechanism, not the program's ops: Python modes (a
  // recorder, a profiler's mode) see the call that came here, not what it took to run it
  c10::impl::ExcludeDispatchKeyGuard no_modes(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  const auto& schema = op.schema();
  const auto& formals = schema.arguments();
  const size_t n = formals.size();
  const size_t begin = stack->size() - n;
  const std::vector<c10::IValue> original(stack->begin() + begin, stack->end());  // the caller's objects

  // 1. the device tensors of the call, and where its results go
  std::vector<Ref> refs;
  std::optional<c10::Device> target;
  auto take = [&](const at::Tensor& t, size_t arg, int64_t index) {
    if (!t.defined() || t.device().type() != device_type) return;  // CPU scalars stay as they are
    if (!target) target = t.device();
    Ref r{arg, index, t};
    const auto* alias = formals[arg].alias_info();
    r.written = alias != nullptr && alias->isWrite();
    refs.push_back(std::move(r));
  };
  for (size_t i = 0; i < n; ++i) {
    const auto& v = original[i];
    if (v.isTensor()) {
      take(v.toTensor(), i, -1);
    } else if (v.isTensorList()) {
      const auto l = v.toTensorList();
      for (size_t j = 0; j < l.size(); ++j) take(l.get(j), i, static_cast<int64_t>(j));
    } else if (v.isOptionalTensorList()) {
      const auto l = v.toOptionalTensorList();
      for (size_t j = 0; j < l.size(); ++j) {
        const std::optional<at::Tensor> t = l.get(j);
        if (t.has_value()) take(*t, i, static_cast<int64_t>(j));
      }
    } else if (v.isDevice() && v.toDevice().type() == device_type) {
      target = v.toDevice();  // a factory: made on the host, moved to the device named
      (*stack)[begin + i] = c10::IValue(c10::Device(c10::kCPU));
    }
  }

  // 2. one host copy per device storage, over the bytes its tensors span
  std::vector<Mirror> mirrors;
  std::unordered_map<const c10::StorageImpl*, int> by_storage;
  for (auto& r : refs) {
    if (r.device.numel() == 0) continue;
    const auto* s = r.device.storage().unsafeGetStorageImpl();
    const int64_t item = static_cast<int64_t>(r.device.element_size());
    const int64_t lo = r.device.storage_offset() * item, hi = span_end(r.device) * item;
    auto [it, fresh] = by_storage.try_emplace(s, static_cast<int>(mirrors.size()));
    if (fresh) {
      Mirror m;
      m.storage = s;
      m.lo = lo;
      m.hi = hi;
      m.only = r.device.unsafeGetTensorImpl();
      m.direct = r.device.is_non_overlapping_and_dense() && !r.device.is_conj() && !r.device.is_neg();
      mirrors.push_back(m);
    } else {
      auto& m = mirrors[it->second];
      m.lo = std::min(m.lo, lo);
      m.hi = std::max(m.hi, hi);
      m.direct = m.direct && m.only == r.device.unsafeGetTensorImpl();
    }
    r.mirror = it->second;
  }
  int64_t t0 = now_ns();
  for (size_t k = 0; k < mirrors.size(); ++k) {
    auto& m = mirrors[k];
    if (m.direct) continue;
    m.lo -= m.lo % 16;  // every element size divides 16: each tensor's offset stays whole
    const auto& dev = std::find_if(refs.begin(), refs.end(), [&](const Ref& r) { return r.mirror == (int)k; })->device;
    m.device_bytes = at::empty({0}, dev.options().dtype(at::kByte)).set_(dev.storage(), m.lo, {m.hi - m.lo}, {1});
    m.host_bytes = m.device_bytes.to(c10::kCPU);
    traffic.to_host += m.hi - m.lo;
  }

  // 3. the call's arguments on the host: one host tensor per device tensor object
  std::unordered_map<const c10::TensorImpl*, at::Tensor> twins;
  for (auto& r : refs) {
    auto [it, fresh] = twins.try_emplace(r.device.unsafeGetTensorImpl());
    if (fresh) {
      if (r.mirror >= 0 && mirrors[r.mirror].direct) {
        it->second = r.device.to(c10::kCPU);
        traffic.to_host += static_cast<int64_t>(r.device.nbytes());
      } else {
        it->second = host_twin(r.device, r.mirror < 0 ? nullptr : &mirrors[r.mirror]);
      }
    }
    r.host = it->second;
    r.host_storage = r.host.has_storage() ? r.host.storage().unsafeGetStorageImpl() : nullptr;
    r.sizes = r.host.sizes().vec();
    r.strides = r.host.strides().vec();
    if (r.written && r.mirror >= 0) mirrors[r.mirror].written = true;
  }
  size_t next = 0;
  for (size_t i = 0; i < n && next < refs.size(); ++i) {
    const auto& v = original[i];
    if (v.isTensor()) {
      if (refs[next].arg == i) (*stack)[begin + i] = c10::IValue(refs[next++].host);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList().copy();
      while (next < refs.size() && refs[next].arg == i) l.set(refs[next].index, refs[next].host), ++next;
      (*stack)[begin + i] = c10::IValue(std::move(l));
    } else if (v.isOptionalTensorList()) {
      auto l = v.toOptionalTensorList().copy();
      while (next < refs.size() && refs[next].arg == i) l.set(refs[next].index, refs[next].host), ++next;
      (*stack)[begin + i] = c10::IValue(std::move(l));
    }
  }

  traffic.copy_ns += now_ns() - t0;

  // 4. the CPU's kernel (cpu_fallback's step 2)
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  t0 = now_ns();

  // 5. written arguments back into the caller's tensors: spans whole, then what was resized
  for (auto& m : mirrors) {
    if (!m.written || m.direct) continue;
    m.device_bytes.copy_(m.host_bytes);
    traffic.to_device += m.hi - m.lo;
  }
  for (auto& r : refs) {
    if (!r.written) continue;
    const bool moved = r.mirror < 0 || r.host.storage().unsafeGetStorageImpl() != r.host_storage;
    const bool same = !moved && r.host.sizes().equals(r.sizes) && r.host.strides().equals(r.strides);
    if (same && mirrors[r.mirror].direct) {  // written in place on its own host copy
      r.device.copy_(r.host);
      traffic.to_device += static_cast<int64_t>(r.host.nbytes());
      continue;
    }
    if (same) continue;  // (its span went back above)
    // NOTE: as a structured kernel resizes an out= on the device: resize_, then restride
    r.device.resize_(r.host.sizes());
    if (!r.device.strides().equals(r.host.strides())) r.device.as_strided_(r.host.sizes(), r.host.strides());
    if (r.host.numel()) {
      r.device.copy_(r.host);
      traffic.to_device += static_cast<int64_t>(r.host.nbytes());
    }
  }

  // 6. results: a written argument is the caller's own tensor; others are copied to the device
  std::vector<const c10::StorageImpl*> host_inputs;
  for (const auto& r : refs)
    if (r.host_storage) host_inputs.push_back(r.host_storage);
  const auto& returns = schema.returns();
  const size_t rbegin = stack->size() - returns.size();
  const c10::Device device = target.value_or(c10::Device(device_type));
  for (size_t k = 0; k < returns.size(); ++k) {
    auto& v = (*stack)[rbegin + k];
    const auto* alias = returns[k].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      for (size_t i = 0; i < n; ++i) {
        const auto* a = formals[i].alias_info();
        if (a != nullptr && (a == alias || *a == *alias)) {
          v = original[i];
          break;
        }
      }
      continue;
    }
    auto check = [&](const at::Tensor& h) {
      TORCH_CHECK(!shares(h, host_inputs), op.schema().operator_name(),
                  ": its CPU kernel returned a tensor sharing memory with an input, which a copy on the "
                  "device cannot do; expected a fresh result. Register a kernel for it on the device, or "
                  "deny it the CPU tier (EAGERDECOMP_CPU_FALLBACK_DENY).");
    };
    if (v.isTensor() && v.toTensor().defined()) {
      check(v.toTensor());
      v = c10::IValue(to_device(op, v.toTensor(), device, traffic));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& h : v.toTensorVector()) {
        check(h);
        out.push_back(h.defined() ? to_device(op, h, device, traffic) : h);
      }
      v = c10::IValue(c10::List<at::Tensor>(out));
    }
  }
  traffic.copy_ns += now_ns() - t0;
}

namespace {

const c10::OperatorHandle& find(py::handle func) {
  py::object s = func.attr("_schema");
  static thread_local std::unordered_map<PyObject*, c10::OperatorHandle> known;
  auto it = known.find(func.ptr());
  if (it != known.end()) return it->second;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(s.attr("name").cast<std::string>().c_str(),
                                                           s.attr("overload_name").cast<std::string>().c_str());
  func.inc_ref();  // an OpOverload lives as long as the process: the map's key stays valid
  return known.emplace(func.ptr(), op).first->second;
}

// A Python call's boxed stack. NOTE: a Python number where the schema takes a Tensor (mul.Tensor
// given 2.0, as __torch_dispatch__ sees it) becomes a wrapped-number tensor, as the binding
// makes it: type promotion treats it as a scalar.
torch::jit::Stack stack_of(const c10::OperatorHandle& op, py::handle args, py::handle kwargs) {
  const auto& formals = op.schema().arguments();
  auto a = py::reinterpret_borrow<py::tuple>(args);
  auto kw = py::reinterpret_borrow<py::dict>(kwargs);
  TORCH_CHECK(a.size() <= formals.size(), op.schema().name(), ": too many arguments");
  torch::jit::Stack stack;
  stack.reserve(formals.size());
  for (size_t i = 0; i < formals.size(); ++i) {
    const auto& f = formals[i];
    py::handle v = i < a.size() ? a[i] : kw.contains(f.name().c_str()) ? py::handle(kw[f.name().c_str()]) : py::handle();
    if (!v) {
      TORCH_CHECK(f.default_value().has_value(), op.schema().name(), ": no value for argument ", f.name());
      stack.push_back(*f.default_value());
    } else if (f.type()->kind() == c10::TypeKind::TensorType && !THPVariable_Check(v.ptr())) {
      auto t = at::scalar_to_tensor(torch::jit::toIValue(v, c10::NumberType::get()).toScalar());
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      stack.emplace_back(std::move(t));
    } else {
      stack.push_back(torch::jit::toIValue(v, f.type()));
    }
  }
  return stack;
}

// Python's entry (the first call of a key, and the mode): (outputs, bytes to host, bytes back,
// seconds copying).
py::tuple run_py(py::handle func, py::handle args, py::handle kwargs, c10::Device device) {
  const auto& op = find(func);
  auto stack = stack_of(op, args, kwargs);
  Traffic traffic;
  run(op, &stack, device.type(), traffic);
  return py::make_tuple(torch::jit::createPyObjectForStack(std::move(stack)), traffic.to_host, traffic.to_device,
                        1e-9 * static_cast<double>(traffic.copy_ns));
}

// at::native::cpu_fallback called directly on the same call, for bench/fallback.py.
py::object cpu_fallback_py(py::handle func, py::handle args, py::handle kwargs) {
  const auto& op = find(func);
  auto stack = stack_of(op, args, kwargs);
  at::native::cpu_fallback(op, &stack);
  return torch::jit::createPyObjectForStack(std::move(stack));
}

// Whether the device's default generator is the CPU's: a CPU kernel then draws from the
// stream the device's own kernel would (edref); otherwise random ops are refused.
bool draws_from_cpu(c10::Device device) {
  const auto& gen = at::globalContext().defaultGenerator(device);
  return gen.unsafeGetGeneratorImpl() == at::detail::getDefaultCPUGenerator().unsafeGetGeneratorImpl();
}

}  // namespace

void init(py::module_& m) {
  auto h = m.def_submodule("host", "The CPU tier (csrc/host.cpp)");
  h.def("run", &run_py, py::arg("func"), py::arg("args"), py::arg("kwargs"), py::arg("device"));
  h.def("cpu_fallback", &cpu_fallback_py, "at::native::cpu_fallback on this call (benchmarks)");
  h.def("draws_from_cpu", &draws_from_cpu);
}

}  // namespace eagerdecomp::host
