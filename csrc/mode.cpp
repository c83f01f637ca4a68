// The mode on a C++ dispatch key: the key's pass-through, entering and leaving it, the check
// that its slot is free, and the witness below it (eagerdecomp/runtime/keymode.py is the Python
// side; csrc/hit.cpp's ModeState and mode kernel serve the calls the mode decomposes).
#include "mode.h"

#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/Operators.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/stl.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace eagerdecomp::mode {
namespace {

bool unserved(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && (t.key_set().has(c10::DispatchKey::Python) || t.is_meta());
  }
  if (v.isTensorList() || v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (unserved(e)) return true;
    }
  }
  return false;
}

// What the tensors of one argument are: Python-key (fake, subclass), meta, or others that
// fix the call's device (a 0-dim CPU tensor does not: eager lets it mix with any device).
struct Kinds {
  bool python = false, meta = false, other = false;
};

void kinds_of(const c10::IValue& v, Kinds& k) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    if (t.key_set().has(c10::DispatchKey::Python)) {
      k.python = true;
    } else if (t.is_meta()) {
      k.meta = true;
    } else if (!(t.is_cpu() && t.dim() == 0)) {
      k.other = true;
    }
    return;
  }
  if (v.isTensorList() || v.isList()) {
    for (const c10::IValue& e : v.toListRef()) kinds_of(e, k);
  }
}

bool has_tensor(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isTensor() || v.isTensorList() || (v.isList() && !v.toListRef().empty() && v.toListRef()[0].isTensor())) {
      return true;
    }
  }
  return false;
}

void witness_record(const c10::OperatorHandle& op);

bool passes_tls() {
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  return tls.excluded_.has(c10::DispatchKey::Python) || tls.included_.has_backend(c10::BackendComponent::MetaBit);
}

}  // namespace

bool passes_by(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  if (passes_tls()) return true;
  Kinds k;
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) kinds_of((*stack)[i], k);
  // NOTE: meta tensors mixed with tensors on a device are not shape machinery but a call eager
  // refuses: it goes on to the runtime, which raises DeviceMismatchError before any kernel runs,
  // as the Python path does (one error contract on both paths)
  return k.python || (k.meta && !k.other);
}

void pass_below(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKeySet(kKey)};
  if (c10::impl::tls_is_dispatch_key_included(kWitnessKey) && !has_tensor(op, stack)) {
    // NOTE: the witness's blind spot: BackendSelect sends a factory call with no tensor argument
    // straight to the backend, past the witness's key, and the kernel's own calls (randn's
    // normal_) would then reach the witness as if they were the mode's. The mode records the
    // call it passes for the witness, and runs the kernel with the witness off.
    witness_record(op);
    c10::impl::ExcludeDispatchKeyGuard off{c10::DispatchKeySet(kWitnessKey)};
    op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
    return;
  }
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
}

std::string slot_taken(c10::DispatchKey k) {
  auto& d = c10::Dispatcher::singleton();
  if (d.hasBackendFallbackForDispatchKey(k)) return "a fallback is registered for it";
  for (const auto& name : d.getAllOpNames()) {
    auto op = d.findOp(name);
    if (op && op->hasKernelForDispatchKey(k)) return c10::toString(name) + " has a kernel registered for it";
  }
  return "";
}

Token enter(std::shared_ptr<c10::DebugInfoBase> state) {
  Token token{c10::impl::tls_is_dispatch_key_included(kKey), state};
  c10::ThreadLocalDebugInfo::_push(kStateKind, std::move(state));
  c10::impl::tls_set_dispatch_key_included(kKey, true);
  return token;
}

void leave(const Token& token) {
  c10::impl::tls_set_dispatch_key_included(kKey, token.was_included);
  // NOTE: debug info is a stack. An entry pushed above ours and still there (a profiler started
  // inside the mode and left running) is lifted off, ours popped, and it is put back on top. An
  // entry of a kind we cannot name leaves ours in place, unused: get() finds the newest state, and
  // the key, now off, no longer asks for one.
  static const c10::DebugInfoKind kinds[] = {
      c10::DebugInfoKind::PROFILER_STATE, c10::DebugInfoKind::PRODUCER_INFO, c10::DebugInfoKind::MOBILE_RUNTIME_INFO,
      c10::DebugInfoKind::INFERENCE_CONTEXT, c10::DebugInfoKind::PARAM_COMMS_INFO};
  std::vector<std::pair<c10::DebugInfoKind, std::shared_ptr<c10::DebugInfoBase>>> above;
  for (;;) {
    try {
      if (c10::ThreadLocalDebugInfo::_peek(kStateKind) == token.state) {
        c10::ThreadLocalDebugInfo::_pop(kStateKind);
        break;
      }
    } catch (const c10::Error&) {
    }
    bool lifted = false;
    for (const auto& k : kinds) {
      try {
        auto info = c10::ThreadLocalDebugInfo::_peek(k);
        c10::ThreadLocalDebugInfo::_pop(k);
        above.emplace_back(k, std::move(info));
        lifted = true;
        break;
      } catch (const c10::Error&) {
      }
    }
    if (!lifted) break;
  }
  for (auto it = above.rbegin(); it != above.rend(); ++it) c10::ThreadLocalDebugInfo::_push(it->first, it->second);
}

// ---- the witness ---------------------------------------------------------------------
namespace {

std::mutex g_seen_mu;
std::unordered_map<std::string, int64_t> g_seen;  // "ns::name.overload" -> calls seen below the mode
std::vector<std::unique_ptr<torch::Library>> g_witness_libs;

}  // namespace

namespace {

void witness_record(const c10::OperatorHandle& op) {
  const auto& s = op.schema();
  std::string name = s.name();
  if (!s.overload_name().empty()) name += "." + s.overload_name();
  std::lock_guard<std::mutex> g(g_seen_mu);
  ++g_seen[name];
}

// Per thread, for each dispatcher call in progress (RecordFunction's start and end, while a
// witness records): whether the op takes no tensor argument. Such a factory call may skip the
// witness's key (BackendSelect sends it straight to the backend), and then the calls its kernel
// makes (randn's normal_, full's fill_) reach the witness as if the mode had made them: a call
// whose caller is one is not counted.
thread_local std::vector<char> t_factory;
std::optional<at::CallbackHandle> g_callback;

std::unique_ptr<at::ObserverContext> call_started(const at::RecordFunction& fn) {
  bool factory = false;
  if (auto name = fn.operator_name()) {
    if (auto h = c10::Dispatcher::singleton().findOp(*name)) {
      factory = true;
      for (const auto& a : h->schema().arguments()) {
        if (a.type()->kind() == c10::TypeKind::TensorType || a.type()->isSubtypeOf(*c10::ListType::ofTensors()) ||
            a.type()->isSubtypeOf(*c10::OptionalType::ofTensor())) {
          factory = false;
          break;
        }
      }
    }
  }
  t_factory.push_back(factory);
  return nullptr;
}

void call_ended(const at::RecordFunction&, at::ObserverContext*) {
  if (!t_factory.empty()) t_factory.pop_back();
}

bool made_by_factory() { return t_factory.size() >= 2 && t_factory[t_factory.size() - 2]; }

void witness(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  // NOTE: what reaches the kernels, not what they call: the kernel runs with the witness off,
  // as a Python recording mode pops itself around func(*args). Fake and meta calls are compile
  // and shape machinery, not kernel calls.
  bool shapes_only = false;  // (fake, meta or Python-key tensors)
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size() && !shapes_only; ++i) shapes_only = unserved((*stack)[i]);
  if (!shapes_only && !made_by_factory()) witness_record(op);
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKeySet(kWitnessKey)};
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kWitnessKey), stack);
}

// The witness's kernels: its fallback, and per op for every op named (those with a composite
// kernel, which would otherwise run at the backend key and hide the op).
void register_witness(const std::vector<std::string>& names) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kWitnessKey, __FILE__, __LINE__);
  lib->fallback(torch::CppFunction::makeFromBoxedFunction<&witness>());
  g_witness_libs.push_back(std::move(lib));
  std::unordered_map<std::string, std::unique_ptr<torch::Library>> by_ns;
  for (const auto& full : names) {
    const auto sep = full.find("::");
    const std::string ns = full.substr(0, sep);
    auto& l = by_ns[ns];
    if (!l) l = std::make_unique<torch::Library>(torch::Library::IMPL, ns, kWitnessKey, __FILE__, __LINE__);
    l->impl(full.substr(sep + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&witness>());
  }
  for (auto& kv : by_ns) g_witness_libs.push_back(std::move(kv.second));
}

}  // namespace

void init(py::module_& m) {
  auto h = m.def_submodule("mode", "The mode on a C++ dispatch key (csrc/mode.cpp)");
  h.attr("KEY") = c10::toString(kKey);
  h.attr("WITNESS_KEY") = c10::toString(kWitnessKey);
  h.def("slot_taken", [](const std::string& key) { return slot_taken(c10::parseDispatchKey(key)); },
        "What holds a dispatch key's slot in this process, '' when it is free");
  h.def("included", []() { return c10::impl::tls_is_dispatch_key_included(kKey); },
        "Whether the mode's key is in this thread's included set");
  h.def("register_witness", &register_witness);
  h.def("witness_on", [](bool on) {
    const bool prev = c10::impl::tls_is_dispatch_key_included(kWitnessKey);
    c10::impl::tls_set_dispatch_key_included(kWitnessKey, on);
    if (on && !g_callback) {
      g_callback = at::addGlobalCallback(
          at::RecordFunctionCallback(&call_started, &call_ended).scopes({at::RecordScope::FUNCTION}));
    } else if (!on && g_callback) {
      at::removeCallback(*g_callback);
      g_callback.reset();
      t_factory.clear();
    }
    return prev;
  }, "Include (or not) the witness's key in this thread; returns the previous state");
  h.def("witness_seen", []() {
    std::lock_guard<std::mutex> g(g_seen_mu);
    return g_seen;
  });
  h.def("witness_clear", []() {
    std::lock_guard<std::mutex> g(g_seen_mu);
    g_seen.clear();
  });
}

}  // namespace eagerdecomp::mode
