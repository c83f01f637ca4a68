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
//     each device storage a call touches is copied once (over what a CPU kernel may touch:
//     see Mirror), and every tensor is re-made on the host copy with its own sizes, strides
//     and offset: the CPU kernel sees the same memory layout the device tensors have;
//   * it writes mutated arguments back with `_copy_from_and_resize`, a kernel a device must
//     provide and which resizes contiguously. Here a written storage is copied back whole
//     (grown first if the kernel grew it), and an out= the CPU kernel resized or restrided
//     gets the same sizes, strides and offset on the device, all below autograd;
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
#include <exception>
#include <limits>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace eagerdecomp::host {
namespace {

// One device storage the call touches, copied to the host over bytes [lo, hi).
// NOTE: what a CPU kernel may touch through a tensor is more than its strided span: fused and
// foreach kernels read and write numel elements from the data pointer whatever the strides
// (an expanded parameter of _fused_adamw_), and a kernel that resizes an out= reuses or grows
// its storage by the storage's size. So a storage the call writes is mirrored whole, at the
// same offsets (the CPU kernel then makes eager's decisions on eager's layout), and a storage
// it only reads is mirrored over each tensor's reach: its span and numel elements from its data
// pointer. The host copy is never smaller than what the kernel can address, zeros past the device
// storage's end where a reach goes beyond it (eager's own kernel overruns its heap block there):
// no heap overrun on the host.
struct Mirror {
  c10::Storage storage;  // the device storage
  int64_t lo = 0, hi = 0;
  at::Tensor device_bytes, host_bytes;  // uint8 views of [lo, hi), on the device and on the host
  int64_t host_size = 0;                // the host storage's size before the kernel: did it grow it?
  bool written = false;
  // NOTE: a storage only one dense tensor reads is copied as that tensor (one .to(), its strides
  // kept): the byte copy is for shared storages, written ones, and tensors with gaps or overlaps
  const c10::TensorImpl* only = nullptr;
  bool direct = true;
};

// A device tensor of the call: where it sits in the arguments, and its host stand-in.
struct Ref {
  size_t arg;
  int64_t index;  // in a list argument, else -1
  at::Tensor device;
  bool written = false;
  at::Tensor host;
  int mirror = -1;  // -1: an empty tensor only read, given its own host storage
  const c10::StorageImpl* host_storage = nullptr;
};

// The bytes [lo, hi) of its storage a CPU kernel may address through t (see Mirror).
std::pair<int64_t, int64_t> reach(const at::Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.element_size());
  int64_t end = t.storage_offset() + 1;
  for (int64_t d = 0; d < t.dim(); ++d) end += (t.size(d) - 1) * t.stride(d);
  end = std::max(end, t.storage_offset() + t.numel());
  return {t.storage_offset() * item, end * item};
}

// A uint8 tensor over bytes [lo, hi) of a storage.
at::Tensor bytes_of(const c10::Storage& s, const at::TensorOptions& opts, int64_t lo, int64_t hi) {
  return at::empty({0}, opts.dtype(at::kByte)).set_(s, lo, {hi - lo}, {1});
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

// A fresh result on the device, as the CPU kernel made it on the host.
// NOTE: a dense result that is its whole storage is one .to() (its strides kept); any other (a
// view into a larger buffer, as lstsq's solution, results sharing one buffer) gets a device
// copy of its whole host storage, made once per storage, at the same offset and strides
using Storages = std::unordered_map<const c10::StorageImpl*, c10::Storage>;
at::Tensor to_device(const c10::OperatorHandle& op, const at::Tensor& h, c10::Device device, Storages& made,
                     Traffic& traffic) {
  TORCH_CHECK(h.layout() == c10::kStrided, op.schema().operator_name(), ": its CPU kernel returned a ", h.layout(),
              " tensor, and the CPU tier copies strided results only (a device with strided tensors): expected a "
              "strided result. Register a kernel for it on the device, or deny it the tier "
              "(EAGERDECOMP_CPU_FALLBACK_DENY).");
  const int64_t size = static_cast<int64_t>(h.storage().nbytes());
  auto [it, fresh] = made.try_emplace(h.storage().unsafeGetStorageImpl());
  if (fresh && h.is_non_overlapping_and_dense() && h.storage_offset() == 0 && size == static_cast<int64_t>(h.nbytes())) {
    traffic.to_device += size;
    at::Tensor d = h.to(device);
    it->second = d.storage();
    return d;
  }
  if (fresh) {
    it->second = bytes_of(h.storage(), h.options(), 0, size).to(device).storage();
    traffic.to_device += size;
  }
  at::Tensor d = at::empty({0}, h.options().device(device)).set_(it->second, h.storage_offset(), h.sizes(), h.strides());
  if (h.is_conj()) d._set_conj(true);
  if (h.is_neg()) d._set_neg(true);
  return d;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool shares(const at::Tensor& h, const std::vector<const c10::StorageImpl*>& inputs) {
  if (!h.defined() || !h.has_storage()) return false;
  return std::find(inputs.begin(), inputs.end(), h.storage().unsafeGetStorageImpl()) != inputs.end();
}

// Written arguments back into the caller's tensors: each written storage's bytes whole (grown
// first where the CPU kernel grew its host copy, as eager's resize_ grows the storage in
// place), then each written tensor's sizes, strides and offset as the kernel left them.
void write_back(std::vector<Mirror>& mirrors, const std::vector<Ref>& refs, Traffic& traffic) {
  for (auto& m : mirrors) {
    if (!m.written) continue;
    const int64_t grown = static_cast<int64_t>(m.host_bytes.storage().nbytes());
    at::Tensor device = bytes_of(m.storage, m.device_bytes.options(), 0, static_cast<int64_t>(m.storage.nbytes()));
    const int64_t size = grown != m.host_size ? grown : device.numel();  // (the zeros past the end stay here)
    if (size > device.numel()) device.resize_({size});  // resizes the storage itself: every view sees it
    if (size == 0) continue;
    device.narrow(0, 0, size).copy_(bytes_of(m.host_bytes.storage(), m.host_bytes.options(), 0, size));
    traffic.to_device += size;
  }
  for (const auto& r : refs) {
    if (!r.written) continue;
    const at::Tensor& h = r.host;
    if (h.storage().unsafeGetStorageImpl() != r.host_storage) {
      // the kernel gave the out a storage of its own (set_): so does the device, of its size
      const int64_t size = static_cast<int64_t>(h.storage().nbytes());
      at::Tensor fresh = at::empty({size}, r.device.options().dtype(at::kByte));
      if (size) fresh.copy_(bytes_of(h.storage(), h.options(), 0, size));
      r.device.set_(fresh.storage(), h.storage_offset(), h.sizes(), h.strides());
      traffic.to_device += size;
    } else if (!(r.device.sizes().equals(h.sizes()) && r.device.strides().equals(h.strides()) &&
                 r.device.storage_offset() == h.storage_offset())) {
      r.device.as_strided_(h.sizes(), h.strides(), h.storage_offset());  // (a written mirror's offsets are the device's)
    }
  }
}

}  // namespace

void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceType device_type, Traffic& traffic) {
  // NOTE: the copies are this tier's mechanism, not the program's ops: Python modes (a
  // recorder, a profiler's mode) see the call that came here, not what it took to run it
  c10::impl::ExcludeDispatchKeyGuard no_modes(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  // NOTE: and autograd's: eager's version bumps (and its "inference tensor" refusals) happen
  // above the backend kernel this is, once per written tensor; a copy_ back into the caller's
  // tensor that went through ADInplaceOrView would bump again (twice for a tensor listed twice)
  at::AutoDispatchBelowADInplaceOrView below_autograd;
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
    const auto* alias = formals[arg].alias_info();
    refs.push_back(Ref{arg, index, t, alias != nullptr && alias->isWrite()});
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

  // 2. one host copy per device storage: whole if the call writes it, else over its tensors' reach
  std::vector<Mirror> mirrors;
  std::unordered_map<const c10::StorageImpl*, int> by_storage;
  for (auto& r : refs) {
    if (r.device.numel() == 0 && !r.written) continue;
    const auto* s = r.device.storage().unsafeGetStorageImpl();
    auto [it, fresh] = by_storage.try_emplace(s, static_cast<int>(mirrors.size()));
    if (fresh) {
      Mirror m;
      m.storage = r.device.storage();
      m.lo = std::numeric_limits<int64_t>::max();
      m.only = r.device.unsafeGetTensorImpl();
      m.direct = r.device.is_non_overlapping_and_dense() && !r.device.is_conj() && !r.device.is_neg();
      mirrors.push_back(std::move(m));
    }
    auto& m = mirrors[it->second];
    m.written = m.written || r.written;
    m.direct = m.direct && !m.written && m.only == r.device.unsafeGetTensorImpl();
    if (r.device.numel() > 0) {
      const auto [lo, hi] = reach(r.device);
      m.lo = std::min(m.lo, lo);
      m.hi = std::max(m.hi, hi);
    }
    r.mirror = it->second;
  }
  int64_t t0 = now_ns();
  for (size_t k = 0; k < mirrors.size(); ++k) {
    auto& m = mirrors[k];
    if (m.direct) continue;
    const int64_t size = static_cast<int64_t>(m.storage.nbytes());
    if (m.written) {
      m.lo = 0, m.hi = std::max(size, m.hi);  // (past the storage's end: zeros, never written back)
    } else {
      m.lo -= m.lo % 16;  // every element size divides 16: each tensor's offset stays whole
    }
    const auto& dev = std::find_if(refs.begin(), refs.end(), [&](const Ref& r) { return r.mirror == (int)k; })->device;
    const int64_t have = std::min(m.hi, size);  // a reach past the storage's end (eager reads garbage there)
    m.device_bytes = bytes_of(m.storage, dev.options(), m.lo, have);
    if (have == m.hi) {
      m.host_bytes = m.device_bytes.to(c10::kCPU);
    } else {
      m.host_bytes = at::zeros({m.hi - m.lo}, dev.options().device(c10::kCPU).dtype(at::kByte));
      m.host_bytes.narrow(0, 0, have - m.lo).copy_(m.device_bytes);
    }
    m.host_size = static_cast<int64_t>(m.host_bytes.storage().nbytes());
    traffic.to_host += have - m.lo;
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

  // 4. the CPU's kernel (cpu_fallback's step 2). NOTE: a kernel that raises may have written
  // or resized its outs first (eager's out= is resized before a later check fails): the
  // caller's tensors get what the kernel left, then its error
  std::exception_ptr failed;
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (...) {
    failed = std::current_exception();
  }
  t0 = now_ns();
  write_back(mirrors, refs, traffic);
  traffic.copy_ns += now_ns() - t0;
  if (failed) std::rethrow_exception(failed);
  t0 = now_ns();

  // 6. results: a written argument is the caller's own tensor; others are copied to the device
  std::vector<const c10::StorageImpl*> host_inputs;
  for (const auto& r : refs)
    if (r.host_storage) host_inputs.push_back(r.host_storage);
  const auto& returns = schema.returns();
  const size_t rbegin = stack->size() - returns.size();
  const c10::Device device = target.value_or(c10::Device(device_type));
  Storages made;
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
      v = c10::IValue(to_device(op, v.toTensor(), device, made, traffic));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& h : v.toTensorVector()) {
        check(h);
        out.push_back(h.defined() ? to_device(op, h, device, made, traffic) : h);
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
