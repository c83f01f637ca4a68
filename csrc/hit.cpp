// The hit path in C++: an exact key -> a straight-line program of boxed operator calls.
//
// A Table belongs to one runtime (eagerdecomp/runtime.py). Python installs a program for
// a key after it has replayed that key's kernel once (eagerdecomp/program.py specializes
// the kernel to the key's sizes); from then on a call with that key is keyed, looked up
// and replayed here, with no Python and without the GIL:
//   * the mode's decompose route calls Table.call(func, args, kwargs) first (one C++ entry);
//   * the device switch registers Fallback (a boxed kernel) on the device's dispatch key,
//     which serves hits itself and hands misses to Python (GIL taken, errors propagated).
// Under compile= a program may instead hold the key's compiled code (a Python callable): a
// hit is still keyed and found here, then that callable runs with the GIL.
//
// The key here is this path's own: words built from the call (op, per tensor its sizes,
// strides, offset, dtype, device, conj/neg bits and which earlier tensor it is, every
// other argument by kind and value, lifted floats by value class, ambient state). It is
// at least as fine as eagerdecomp/key.py's key for the same call, so a program is only
// ever replayed for calls the Python cache would give the same kernel. Anything this path
// does not key (subclasses, symbolic sizes, generators, complex...) is a miss, and Python
// decides, as before.
//
// Concurrency: programs are immutable once installed; the map is behind a shared_mutex
// (readers in parallel, Python's installs exclusive and short); counters are atomics.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <pybind11/stl.h>

#include "host.h"
#include "mode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

namespace py = pybind11;

namespace eagerdecomp::hit {
namespace {

enum Tag : int64_t { kTensor = 1, kInt, kBool, kNone, kFloat, kStr, kDtype, kLayout, kMemFmt, kDevice, kList, kTuple,
                     kLifted, kKw, kSame, kOp };

struct Key {
  std::vector<int64_t> w;
  size_t h = 0;
  bool operator==(const Key& o) const { return h == o.h && w == o.w; }
};
struct KeyHash {
  size_t operator()(const Key& k) const { return k.h; }
};

void seal(Key& k) {
  uint64_t h = 0x84222325cbf29ce4ull;
  for (int64_t x : k.w) h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull + (h >> 29);
  k.h = static_cast<size_t>(h);
}

// eagerdecomp/lift.py's value class: None (-1) for the special values it never lifts.
bool special(double v) {
  return !std::isfinite(v) || v == 0.0 || v == 1.0 || v == -1.0 || v == 0.5 || v == -0.5 || v == 2.0 || v == -2.0;
}

int lift_class(double v) {
  // a float that rounds to a special value in float32 is as special as that value (a special
  // value rounds to itself; an out-of-range one to inf: IEEE conversion, as lift.py's)
  if (special(static_cast<double>(static_cast<float>(v)))) return -1;
  const double a = std::abs(v);
  return (v < 0 ? 3 : 0) + (a < 0.5 ? 0 : a < 1 ? 1 : 2);
}

int64_t float_word(double v) {
  if (v != v) return 0x7ff8000000000000ll;  // every nan is one value, as key.py keys it
  int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// A call's key and its inputs: its tensors in key order, then its lifted floats.
struct Call {
  Key key;
  std::vector<c10::IValue> inputs;
  std::vector<std::pair<int, c10::IValue>> lifted;  // (rank of its position in lift.py's order, value)
  std::vector<const c10::TensorImpl*> ids;
};

const c10::DispatchKeySet kUnkeyed = c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                                           c10::DispatchKey::FuncTorchBatched,
                                                           c10::DispatchKey::PythonTLSSnapshot});

bool push_tensor(Call& c, const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  if (!t.defined() || t.layout() != c10::kStrided || impl->has_symbolic_sizes_strides() ||
      (impl->key_set() & kUnkeyed).empty() == false)
    return false;
  auto& w = c.key.w;
  const auto sizes = t.sizes(), strides = t.strides();
  w.push_back(kTensor);
  w.push_back(static_cast<int64_t>(sizes.size()));
  w.insert(w.end(), sizes.begin(), sizes.end());
  w.insert(w.end(), strides.begin(), strides.end());
  w.push_back(t.storage_offset());
  w.push_back(static_cast<int64_t>(t.scalar_type()));
  w.push_back((static_cast<int64_t>(t.device().type()) << 16) | static_cast<uint16_t>(t.device().index()));
  w.push_back((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0));
  c.ids.push_back(impl);
  c.inputs.emplace_back(t);
  return true;
}

void push_str(Key& k, const char* s, size_t n) {
  k.w.push_back(kStr);
  k.w.push_back(static_cast<int64_t>(n));
  for (size_t i = 0; i < n; i += 8) {
    int64_t word = 0;
    std::memcpy(&word, s + i, std::min<size_t>(8, n - i));
    k.w.push_back(word);
  }
}

// key.py: which earlier tensor each one is, when some tensor object repeats; then the
// ambient state every decomposition may read.
void finish(Call& c) {
  const size_t n = c.ids.size();
  for (size_t i = 1; i < n; ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (c.ids[j] == c.ids[i]) {
        c.key.w.push_back(kSame);
        for (size_t a = 0; a < n; ++a) {
          size_t b = 0;
          while (c.ids[b] != c.ids[a]) ++b;
          c.key.w.push_back(static_cast<int64_t>(b));
        }
        i = n;
        break;
      }
    }
  }
  c.key.w.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())) |
                    (c10::GradMode::is_enabled() ? 1 << 8 : 0) | (c10::InferenceMode::is_enabled() ? 1 << 9 : 0) |
                    (at::globalContext().deterministicAlgorithms() ? 1 << 10 : 0) |
                    (at::globalContext().deterministicAlgorithmsWarnOnly() ? 1 << 11 : 0));
  // the kernel takes lifted floats in lift.py's order of positions (then elements), not the call's
  std::stable_sort(c.lifted.begin(), c.lifted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& v : c.lifted) c.inputs.push_back(std::move(v.second));
  c.lifted.clear();
  seal(c.key);
}

// ---- programs ------------------------------------------------------------------------

struct Arg {
  enum Kind : uint8_t { kConst, kSlot, kList } kind = kConst;
  bool wrap = false;  // a number in a slot passed where the schema wants a Tensor: wrapped, as Python does
  int slot = -1;
  c10::IValue value;
  c10::TypePtr elem;  // kList: the element type
  std::vector<Arg> items;
};

struct Step {
  enum Kind : uint8_t { kCall, kPick, kCheck } kind = kCall;
  std::optional<c10::OperatorHandle> op;
  std::vector<Arg> args;
  int first = 0, count = 0;  // result slots
  int from = 0, index = 0;   // a pick: slot and index
  int rules = 0;             // a check: eagerdecomp/program.py's _RULES bits
  std::vector<int> dests, reads;
  std::vector<int> release;  // slots read for the last time here: freed after it, as FX code does
};

std::string g_partial;  // eagerdecomp/overlap.py's PARTIAL message, eager's own

// eagerdecomp/overlap.py's _status: 2 full, 1 partial, 0 no (also where ATen says "too hard")
int overlap_status(const at::Tensor& a, const at::Tensor& b) {
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return 2;
  if (a.numel() == 0 || b.numel() == 0 || !a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) return 0;
  if (!a.has_storage() || !b.has_storage() || a.storage().unsafeGetStorageImpl() != b.storage().unsafeGetStorageImpl()) return 0;
  const int64_t a0 = a.storage_offset() * a.element_size(), b0 = b.storage_offset() * b.element_size();
  const int64_t a1 = a0 + a.numel() * a.element_size(), b1 = b0 + b.numel() * b.element_size();
  if (a0 == b0 && a1 == b1) return a.strides() == b.strides() ? 2 : 1;
  return a0 < b1 && b0 < a1 ? 1 : 0;
}

// eagerdecomp/overlap.py's check, for the rules that depend on more than the key (partial, any)
void check_overlap(const Step& s, const std::vector<c10::IValue>& slots) {
  for (int d : s.dests) {
    for (int r : s.reads) {
      const int status = overlap_status(slots[d].toTensor(), slots[r].toTensor());
      if ((status == 1 && (s.rules & 6)) || (status == 2 && (s.rules & 4))) throw std::runtime_error(g_partial);
    }
  }
}

struct Counter {
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> to_host{0}, to_device{0}, copy_ns{0};  // what the CPU tier's calls copied
};

// False while the interpreter is gone or going: a Python reference must then be leaked, not
// released (taking the GIL there crashes)
bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  return Py_IsInitialized() && !finalizing;
}

// Drops a Python reference from any thread (a program may die on a hit served without the GIL).
struct PyDecRef {
  void operator()(PyObject* o) const {
    if (!python_alive()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(o);
  }
};

// Compiled code called directly, with what eagerdecomp/compiled.py's Compiled.flat does around
// it done here: the inputs it writes in place (each with how far replay advances its version),
// and per output of the op an input (index >= 0) or a result of the code (-1 - i).
struct Direct {
  std::shared_ptr<PyObject> code;  // Inductor's call: one list of inputs
  std::vector<int> fused;
  std::vector<int64_t> versions;
  std::vector<int> outs;
  std::vector<double> values;  // the lifted floats it was compiled for (by value)
};

struct Program {
  std::vector<Step> steps;
  std::vector<int> outputs;
  int n_slots = 0;
  bool list_out = false;  // the op returns one Tensor[]
  PyObject* op = nullptr;            // its OpOverload (a reference held for the process' life)
  bool lifted = false;               // some float of the key was lifted: the report says so
  std::shared_ptr<Counter> total;    // the table's hits, for cache_info()
  std::string name;                  // its profiler range, as eagerdecomp/observe.py names it
  // compile= (eagerdecomp/compiled.py): the key's compiled code instead of the steps, a Python
  // callable from the inputs list to the flat outputs, or MISS for a call it leaves to Python
  std::shared_ptr<PyObject> call;
  // or the compiled code itself, called directly: one, or per value of the lifted floats
  // (which start at input `values_from`) one for each value compiled, others going to Python
  std::vector<Direct> direct;
  int values_from = -1;
  // the CPU tier (csrc/host.cpp) instead of steps: the token of the tier that installed it
  // (a fallback with another tier, or none, leaves such a key to Python), and the device type
  int64_t host = 0;
  c10::DeviceType host_type = c10::DeviceType::CPU;

  // what the report tells apart
  int kind() const { return (lifted ? 1 : 0) | (call || !direct.empty() ? 2 : 0) | (host ? 4 : 0); }
};

c10::IValue wrapped(const c10::IValue& v) {
  at::Tensor t = at::scalar_to_tensor(v.toScalar());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

c10::IValue materialize(const Arg& a, const std::vector<c10::IValue>& slots) {
  switch (a.kind) {
    case Arg::kConst:
      return a.value;
    case Arg::kSlot: {
      const c10::IValue& v = slots[a.slot];
      return a.wrap && !v.isTensor() ? wrapped(v) : v;
    }
    case Arg::kList: {
      c10::impl::GenericList list(a.elem);
      list.reserve(a.items.size());
      for (const Arg& item : a.items) list.push_back(materialize(item, slots));
      return list;
    }
  }
  return {};
}

// Runs the program on `inputs`; returns its flat outputs.
// `counted`: a hit (false: Python answers the call and records it, the program only runs it).
std::vector<c10::IValue> run(const Program& p, std::vector<c10::IValue>&& inputs, bool counted = true) {
  at::RecordFunction range(at::RecordScope::USER_SCOPE);  // a flag test unless a profiler runs
  if (range.isActive()) range.before(p.name.c_str());
  if (counted) p.total->hits.fetch_add(1, std::memory_order_relaxed);
  std::vector<c10::IValue> slots(std::move(inputs));
  slots.resize(p.n_slots);
  torch::jit::Stack stack;
  for (const Step& s : p.steps) {
    if (s.kind == Step::kPick) {
      slots[s.first] = slots[s.from].toListRef()[s.index];
      continue;
    }
    if (s.kind == Step::kCheck) {
      check_overlap(s, slots);
      continue;
    }
    stack.clear();
    stack.reserve(s.args.size());
    for (const Arg& a : s.args) stack.push_back(materialize(a, slots));
    s.op->callBoxed(stack);
    for (int j = 0; j < s.count; ++j) slots[s.first + j] = std::move(stack[j]);
    // NOTE: an intermediate freed at its last use lets the allocator hand its memory to the next
    // one; held to the end, large tensors cost fresh pages on every call (1.2x at 1M elements)
    for (int r : s.release) slots[r] = c10::IValue();
  }
  std::vector<c10::IValue> out;
  out.reserve(p.outputs.size());
  for (int i : p.outputs) out.push_back(slots[i]);
  return out;
}

bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType()->kind() == c10::TypeKind::TensorType;
  return false;
}

bool has_slot(py::handle x, PyObject* slot_type) {
  if (PyObject_IsInstance(x.ptr(), slot_type) == 1) return true;
  if (PyList_Check(x.ptr()) || PyTuple_Check(x.ptr())) {
    for (py::handle y : x) {
      if (has_slot(y, slot_type)) return true;
    }
  }
  return false;
}

Arg make_arg(py::handle x, const c10::TypePtr& type, PyObject* slot_type) {
  Arg a;
  if (PyObject_IsInstance(x.ptr(), slot_type) == 1) {
    a.kind = Arg::kSlot;
    a.slot = x.attr("i").cast<int>();
    a.wrap = is_tensor_type(type);
    return a;
  }
  if (has_slot(x, slot_type)) {
    c10::TypePtr t = type;
    if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
    auto list = t->cast<c10::ListType>();
    if (!list) throw std::runtime_error("a program value inside a non-list argument");
    a.kind = Arg::kList;
    a.elem = list->getElementType();
    for (py::handle y : x) a.items.push_back(make_arg(y, a.elem, slot_type));
    return a;
  }
  PyTypeObject* t = Py_TYPE(x.ptr());
  if (is_tensor_type(type) &&
      (t == &PyFloat_Type || t == &PyLong_Type || t == &PyBool_Type || t == &PyComplex_Type)) {
    // NOTE: a number where the schema wants a Tensor becomes a *wrapped* number, as Python's
    // operator call makes it: it promotes like a scalar and takes the kernels' scalar fast path
    a.value = wrapped(t == &PyFloat_Type   ? c10::IValue(PyFloat_AS_DOUBLE(x.ptr()))
                      : t == &PyBool_Type  ? c10::IValue(x.ptr() == Py_True)
                      : t == &PyComplex_Type
                          ? c10::IValue(c10::complex<double>(PyComplex_RealAsDouble(x.ptr()),
                                                             PyComplex_ImagAsDouble(x.ptr())))
                          : c10::IValue(static_cast<int64_t>(x.cast<int64_t>())));
    return a;
  }
  a.value = torch::jit::toIValue(x, type);
  return a;
}

c10::OperatorHandle find_op(const std::string& name, const std::string& overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

void reads_of(const Arg& a, std::vector<int>& out) {
  if (a.kind == Arg::kSlot) out.push_back(a.slot);
  for (const Arg& item : a.items) reads_of(item, out);
}

// Each slot's last reader releases it (outputs excepted; a check step releases nothing).
void plan_releases(Program& p) {
  std::vector<int> last(p.n_slots, -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    std::vector<int> reads;
    for (const Arg& a : s.args) reads_of(a, reads);
    if (s.kind == Step::kPick) reads.push_back(s.from);
    for (int r : reads) last[r] = static_cast<int>(i);
  }
  for (int o : p.outputs) last[o] = -1;
  for (int slot = 0; slot < p.n_slots; ++slot) {
    if (last[slot] >= 0 && p.steps[last[slot]].kind != Step::kCheck) p.steps[last[slot]].release.push_back(slot);
  }
}

Program build(py::list calls, py::list outputs, int n_slots, py::handle slot_type) {
  Program p;
  p.n_slots = n_slots;
  for (py::handle o : outputs) p.outputs.push_back(o.cast<int>());
  for (py::handle c : calls) {
    py::tuple t = c.cast<py::tuple>();
    Step s;
    const std::string kind = t[0].cast<std::string>();
    if (kind == "pick") {  // ("pick", list_slot, index, slot)
      s.kind = Step::kPick;
      s.from = t[1].cast<int>();
      s.index = t[2].cast<int>();
      s.first = t[3].cast<int>();
      p.steps.push_back(std::move(s));
      continue;
    }
    if (kind == "check") {  // ("check", rules, dest slots, input slots)
      s.kind = Step::kCheck;
      s.rules = t[1].cast<int>();
      s.dests = t[2].cast<std::vector<int>>();
      s.reads = t[3].cast<std::vector<int>>();
      p.steps.push_back(std::move(s));
      continue;
    }
    // ("call", name, overload, args, kwargs, first, count)
    s.op = find_op(t[1].cast<std::string>(), t[2].cast<std::string>());
    const auto& schema = s.op->schema();
    py::tuple args = t[3].cast<py::tuple>();
    py::dict kwargs = t[4].cast<py::dict>();
    s.first = t[5].cast<int>();
    s.count = t[6].cast<int>();
    const auto& formals = schema.arguments();
    if (args.size() > formals.size()) throw std::runtime_error("too many arguments for " + schema.name());
    for (size_t i = 0; i < formals.size(); ++i) {
      const auto& f = formals[i];
      if (i < args.size()) {
        s.args.push_back(make_arg(args[i], f.type(), slot_type.ptr()));
      } else if (kwargs.contains(f.name().c_str())) {
        s.args.push_back(make_arg(kwargs[f.name().c_str()], f.type(), slot_type.ptr()));
      } else if (f.default_value()) {
        Arg a;
        a.value = *f.default_value();
        s.args.push_back(std::move(a));
      } else {
        throw std::runtime_error("no value for argument " + f.name() + " of " + schema.name());
      }
    }
    p.steps.push_back(std::move(s));
  }
  plan_releases(p);
  return p;
}

// ---- the arguments Python is handed ----------------------------------------------------

// NOTE: as PyTorch hands a boxed call to a Python mode (__torch_dispatch__): a keyword-only
// argument at its default is left out, and so is every positional one at its default after the
// last that is not. The Python path keys and traces its calls so; a miss on the C++ key (or the
// device switch) hands its call over the same way and keys a defaulted float by value, as the
// Python key does, so a kernel made on one path (the disk cache, a bundle) serves the other.
bool at_default(const c10::Argument& a, const c10::IValue& v) {
  const auto& d = a.default_value();
  return d.has_value() && *d == v;  // (IValue's ==, as PyTorch's own comparison there)
}

struct Handed {
  size_t positional;  // arguments [0, positional) are handed positionally
  size_t kw_start;    // [kw_start, n) are keyword-only: handed unless at their default

  Handed(const c10::FunctionSchema& s, const c10::IValue* args, size_t n) : positional(n), kw_start(n) {
    const auto& a = s.arguments();
    while (kw_start > 0 && a[kw_start - 1].kwarg_only()) --kw_start;
    positional = kw_start;
    while (positional > 0 && at_default(a[positional - 1], args[positional - 1])) --positional;
  }
  bool operator()(const c10::FunctionSchema& s, const c10::IValue* args, size_t i) const {
    return i < positional || (i >= kw_start && !at_default(s.arguments()[i], args[i]));
  }
};

// ---- the table -----------------------------------------------------------------------

// How an op's floats are lifted (eagerdecomp/lift.py's positions, in its order).
struct Lift {
  std::vector<int> index;          // a positional argument, or -1
  std::vector<std::string> name;   // a keyword-only argument's name, or ""
  std::vector<int> schema_index;   // where it sits in the full argument list
  std::vector<bool> each;          // a float list: its elements are lifted one by one

  // the rank of the position of argument `index` (or keyword `name`), or -1
  int rank(int i, PyObject* kw) const {
    for (size_t j = 0; j < index.size(); ++j) {
      if (i >= 0 && index[j] == i) return static_cast<int>(j);
      if (kw && !name[j].empty() && PyUnicode_CompareWithASCIIString(kw, name[j].c_str()) == 0) return static_cast<int>(j);
    }
    return -1;
  }
  int rank_at(int schema_i) const {
    for (size_t j = 0; j < schema_index.size(); ++j)
      if (schema_index[j] == schema_i) return static_cast<int>(j);
    return -1;
  }
};

}  // namespace

class Table {
 public:
  explicit Table(size_t maxsize) : maxsize_(maxsize) {}

  // ---- keys from Python objects (the mode) ----
  bool visit_py(PyObject* x, Call& c) {
    PyTypeObject* t = Py_TYPE(x);
    auto& w = c.key.w;
    if (t == reinterpret_cast<PyTypeObject*>(THPVariableClass) || t == parameter_) {
      return push_tensor(c, THPVariable_Unpack(x));
    }
    if (t == &PyLong_Type) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
      if (overflow) return false;
      w.push_back(kInt);
      w.push_back(v);
      return true;
    }
    if (t == &PyFloat_Type) {
      w.push_back(kFloat);
      w.push_back(float_word(PyFloat_AS_DOUBLE(x)));
      return true;
    }
    if (t == &PyBool_Type) {
      w.push_back(kBool);
      w.push_back(x == Py_True);
      return true;
    }
    if (x == Py_None) {
      w.push_back(kNone);
      return true;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(x);
      w.push_back(t == &PyList_Type ? kList : kTuple);
      w.push_back(n);
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (!visit_py(PySequence_Fast_GET_ITEM(x, i), c)) return false;
      }
      return true;
    }
    if (t == &THPDtypeType) {
      w.push_back(kDtype);
      w.push_back(static_cast<int64_t>(reinterpret_cast<THPDtype*>(x)->scalar_type));
      return true;
    }
    if (t == &THPDeviceType) {
      const auto& d = reinterpret_cast<THPDevice*>(x)->device;
      w.push_back(kDevice);
      w.push_back((static_cast<int64_t>(d.type()) << 16) | static_cast<uint16_t>(d.index()));
      return true;
    }
    if (t == &THPLayoutType) {
      w.push_back(kLayout);
      w.push_back(static_cast<int64_t>(reinterpret_cast<THPLayout*>(x)->layout));
      return true;
    }
    if (t == &THPMemoryFormatType) {
      w.push_back(kMemFmt);
      w.push_back(static_cast<int64_t>(reinterpret_cast<THPMemoryFormat*>(x)->memory_format));
      return true;
    }
    if (t == &PyUnicode_Type) {
      Py_ssize_t n = 0;
      const char* s = PyUnicode_AsUTF8AndSize(x, &n);
      if (!s) {
        PyErr_Clear();
        return false;
      }
      push_str(c.key, s, static_cast<size_t>(n));
      return true;
    }
    return false;  // anything else: Python decides (key.py knows it, or bypasses it)
  }

  // A float at a lifted position: its class in the key, its value an input.
  bool lifted_py(PyObject* x, Call& c, int rank) {
    if (Py_TYPE(x) != &PyFloat_Type) return false;
    const double v = PyFloat_AS_DOUBLE(x);
    const int cls = lift_class(v);
    if (cls < 0) return false;
    c.key.w.push_back(kLifted);
    c.key.w.push_back(cls);
    c.lifted.emplace_back(rank, v);
    return true;
  }

  // an argument at a lifted position (rank): the float, or each float of the list
  bool visit_lifted_py(PyObject* x, Call& c, int rank, bool each) {
    PyTypeObject* t = Py_TYPE(x);
    if (!each) return lifted_py(x, c, rank) || visit_py(x, c);
    if (t != &PyList_Type && t != &PyTuple_Type) return visit_py(x, c);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(x);
    c.key.w.push_back(t == &PyList_Type ? kList : kTuple);
    c.key.w.push_back(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* y = PySequence_Fast_GET_ITEM(x, i);
      if (!lifted_py(y, c, rank) && !visit_py(y, c)) return false;
    }
    return true;
  }

  bool key_py(PyObject* func, PyObject* args, PyObject* kwargs, Call& c) {
    c.key.w.reserve(48);
    c.key.w.push_back(kOp);
    c.key.w.push_back(reinterpret_cast<int64_t>(func));
    const auto lift = lift_for(func);
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* a = PyTuple_GET_ITEM(args, i);
      const int rank = lift ? lift->rank(static_cast<int>(i), nullptr) : -1;
      if (!(rank >= 0 ? visit_lifted_py(a, c, rank, lift->each[rank]) : visit_py(a, c))) return false;
    }
    if (PyDict_GET_SIZE(kwargs)) {
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      while (PyDict_Next(kwargs, &pos, &k, &v)) {
        c.key.w.push_back(kKw);
        if (!visit_py(k, c)) return false;
        const int rank = lift ? lift->rank(-1, k) : -1;
        if (!(rank >= 0 ? visit_lifted_py(v, c, rank, lift->each[rank]) : visit_py(v, c))) return false;
      }
    }
    return true;
  }

  // ---- keys from a boxed stack (the device switch) ----
  // rank >= 0: a lifted position (each: a float list whose elements are lifted)
  bool visit_iv(const c10::IValue& v, Call& c, int rank, bool each = false) {
    auto& w = c.key.w;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        w.push_back(kNone);
        return true;
      }
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        // NOTE: Python receives a wrapped number back as the number: keyed as that number
        if (t.scalar_type() == at::kDouble) return visit_iv(c10::IValue(t.item<double>()), c, rank);
        if (t.scalar_type() == at::kLong) return visit_iv(c10::IValue(t.item<int64_t>()), c, -1);
        if (t.scalar_type() == at::kBool) return visit_iv(c10::IValue(t.item<bool>()), c, -1);
        return false;
      }
      return push_tensor(c, t);
    }
    if (v.isDouble()) {
      const double d = v.toDouble();
      const int cls = rank >= 0 && !each ? lift_class(d) : -1;
      if (cls >= 0) {
        w.push_back(kLifted);
        w.push_back(cls);
        c.lifted.emplace_back(rank, d);
      } else {
        w.push_back(kFloat);
        w.push_back(float_word(d));
      }
      return true;
    }
    if (v.isInt()) {
      w.push_back(kInt);
      w.push_back(v.toInt());
      return true;
    }
    if (v.isBool()) {
      w.push_back(kBool);
      w.push_back(v.toBool());
      return true;
    }
    if (v.isNone()) {
      w.push_back(kNone);
      return true;
    }
    if (v.isDevice()) {
      const auto d = v.toDevice();
      w.push_back(kDevice);
      w.push_back((static_cast<int64_t>(d.type()) << 16) | static_cast<uint16_t>(d.index()));
      return true;
    }
    if (v.isString()) {
      const auto& s = v.toStringRef();
      push_str(c.key, s.data(), s.size());
      return true;
    }
    if (v.isList()) {
      auto list = v.toListRef();
      w.push_back(kList);
      w.push_back(static_cast<int64_t>(list.size()));
      for (const c10::IValue& item : list) {
        if (!visit_iv(item, c, each ? rank : -1)) return false;
      }
      return true;
    }
    return false;
  }

  bool key_stack(const c10::OperatorHandle& op, const c10::IValue* args, size_t n, Call& c) {
    c.key.w.reserve(48);
    c.key.w.push_back(kOp);
    c.key.w.push_back(reinterpret_cast<int64_t>(&op.schema()));
    const auto lift = lift_for(&op.schema());
    if (!lift) {
      for (size_t i = 0; i < n; ++i) {
        if (!visit_iv(args[i], c, -1)) return false;
      }
      return true;
    }
    const Handed handed(op.schema(), args, n);
    for (size_t i = 0; i < n; ++i) {
      int rank = lift->rank_at(static_cast<int>(i));
      if (rank >= 0 && !handed(op.schema(), args, i)) rank = -1;  // (Python never sees it: keyed by value)
      if (!visit_iv(args[i], c, rank, rank >= 0 && lift->each[rank])) return false;
    }
    return true;
  }

  // ---- lookup and install ----
  // NOTE: bounded as an approximate LRU in two generations: installs go to the young map; when it
  // holds half the bound it becomes the old one and the old one is dropped; a key found in the old
  // map moves back to the young one. A key used within the last half-bound of installs survives,
  // so a server meeting new shapes all day keeps its hot keys in C++ (a dropped key comes back from
  // Python's LRU at the cost of one specialization, never a trace).
  std::shared_ptr<const Program> find(const Key& k) {
    {
      std::shared_lock<std::shared_mutex> g(mu_);
      auto it = young_.find(k);
      if (it != young_.end()) return it->second;
      if (old_.empty()) return nullptr;
    }
    std::unique_lock<std::shared_mutex> g(mu_);  // (an old hit: rare once the hot keys are young)
    auto it = young_.find(k);  // (another thread may have moved it meanwhile)
    if (it != young_.end()) return it->second;
    auto old = old_.find(k);
    if (old == old_.end()) return nullptr;
    auto p = old->second;
    old_.erase(old);
    put(Key(k), p);
    return p;
  }

  void insert(Key&& k, std::shared_ptr<const Program> p) {
    std::unique_lock<std::shared_mutex> g(mu_);
    old_.erase(k);
    put(std::move(k), std::move(p));
  }

  void erase(const Key& k) {
    std::unique_lock<std::shared_mutex> g(mu_);
    young_.erase(k);
    old_.erase(k);
  }

  void set_lift(const void* op, Lift lift) {
    auto p = lift.schema_index.empty() ? nullptr : std::make_shared<const Lift>(std::move(lift));
    std::unique_lock<std::shared_mutex> g(mu_);
    lifts_[op] = std::move(p);
  }

  // held by the caller while it keys: a concurrent install may replace the table's entry
  std::shared_ptr<const Lift> lift_for(const void* op) {
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = lifts_.find(op);
    return it == lifts_.end() ? nullptr : it->second;
  }

  void clear() {
    std::unique_lock<std::shared_mutex> g(mu_);
    young_.clear();
    old_.clear();
    total_->hits.store(0);
  }

  int64_t total() { return total_->hits.load(std::memory_order_relaxed); }
  std::shared_ptr<Counter> total_ = std::make_shared<Counter>();

  size_t size() {
    std::shared_lock<std::shared_mutex> g(mu_);
    return young_.size() + old_.size();
  }

  PyTypeObject* parameter_ = nullptr;

 private:
  // (held exclusively) the young generation full at half the bound: it ages, the old one goes
  void put(Key&& k, std::shared_ptr<const Program> p) {
    if (young_.size() >= std::max<size_t>(1, maxsize_ / 2)) {
      old_ = std::move(young_);
      young_ = {};
    }
    young_[std::move(k)] = std::move(p);
  }

  size_t maxsize_;
  std::shared_mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Program>, KeyHash> young_, old_;
  std::unordered_map<const void*, std::shared_ptr<const Lift>> lifts_;
};

// One runtime's hits per (op, lifted): the table is shared by the runtimes of one cache (a
// new mode per step starts warm), the report is each runtime's own.
class Counts {
 public:
  // counted before the program runs, as Python records a replay: a hit whose check raises is a hit
  Counter& bump(const Program& p) {
    const std::pair<PyObject*, int> k{p.op, p.kind()};
    {
      std::shared_lock<std::shared_mutex> g(mu_);
      auto it = map_.find(k);
      if (it != map_.end()) {
        it->second->hits.fetch_add(1, std::memory_order_relaxed);
        return *it->second;
      }
    }
    std::unique_lock<std::shared_mutex> g(mu_);
    auto& slot = map_[k];
    if (!slot) slot = std::make_shared<Counter>();
    slot->hits.fetch_add(1, std::memory_order_relaxed);
    return *slot;  // (counters are never removed: the reference stays valid)
  }

  // (op, kind, hits, bytes to host, bytes to device, seconds copying) per (op, kind) with hits
  py::list counts() {
    std::shared_lock<std::shared_mutex> g(mu_);
    py::list out;
    for (auto& [k, c] : map_) {
      const int64_t n = c->hits.load(std::memory_order_relaxed);
      if (n) {
        out.append(py::make_tuple(py::handle(k.first), k.second, n, c->to_host.load(), c->to_device.load(),
                                  1e-9 * static_cast<double>(c->copy_ns.load())));
      }
    }
    return out;
  }

  void clear_counts() {
    std::shared_lock<std::shared_mutex> g(mu_);
    for (auto& [k, c] : map_) c->hits.store(0), c->to_host.store(0), c->to_device.store(0), c->copy_ns.store(0);
  }

 private:
  struct PairHash {
    size_t operator()(const std::pair<PyObject*, int> p) const { return std::hash<void*>()(p.first) ^ p.second; }
  };
  std::shared_mutex mu_;
  std::unordered_map<std::pair<PyObject*, int>, std::shared_ptr<Counter>, PairHash> map_;
};

namespace {

Lift make_lift(const c10::FunctionSchema& schema, py::handle positions) {
  Lift lift;
  const auto& formals = schema.arguments();
  for (py::handle p : positions) {  // (index or -1, name or "", each)
    py::tuple t = p.cast<py::tuple>();
    const int index = t[0].cast<int>();
    const std::string name = t[1].cast<std::string>();
    for (size_t i = 0; i < formals.size(); ++i) {
      if ((index >= 0 && static_cast<int>(i) == index) || (!name.empty() && formals[i].name() == name)) {
        lift.index.push_back(index);
        lift.name.push_back(name);
        lift.schema_index.push_back(static_cast<int>(i));
        lift.each.push_back(t[2].cast<bool>());
      }
    }
  }
  return lift;
}

py::object to_python(const c10::IValue& v) {
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  return torch::jit::toPyObject(v);
}

PyObject* g_miss = nullptr;  // eagerdecomp.program's MISS sentinel

c10::IValue from_python(py::handle o) {
  if (o.is_none()) return {};
  if (THPVariable_Check(o.ptr())) return THPVariable_Unpack(o.ptr());
  throw std::runtime_error("eagerdecomp: compiled code returned a non-tensor output");
}

bool shares_storage(const std::vector<c10::IValue>& inputs, int i) {
  const at::Tensor& w = inputs[i].toTensor();
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (static_cast<int>(j) == i || !inputs[j].isTensor()) continue;
    const at::Tensor& t = inputs[j].toTensor();
    if (t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == w.storage().unsafeGetStorageImpl()) return true;
  }
  return false;
}

// The program's direct code for this call (by value: the one compiled for its floats), or null.
const Direct* direct_for(const Program& p, const std::vector<c10::IValue>& inputs) {
  if (p.values_from < 0) return &p.direct[0];
  const size_t n = inputs.size() - p.values_from;
  for (const Direct& d : p.direct) {
    bool same = d.values.size() == n;
    for (size_t k = 0; same && k < n; ++k) {
      const c10::IValue& v = inputs[p.values_from + k];
      same = v.isDouble() && v.toDouble() == d.values[k];
    }
    if (same) return &d;
  }
  return nullptr;
}

// A direct program (the GIL held): Compiled.flat's fast case, in C++.
bool run_direct(const Program& p, const std::vector<c10::IValue>& inputs, std::vector<c10::IValue>& out) {
  const Direct* d = direct_for(p, inputs);
  if (!d) return false;  // a value not compiled: Python counts it (and may compile it)
  std::vector<int64_t> want;
  for (size_t k = 0; k < d->fused.size(); ++k) {
    const at::Tensor& w = inputs[d->fused[k]].toTensor();
    if (!w.has_storage() || !w.unsafeGetTensorImpl()->version_counter().enabled()) return false;  // Python decides
    if (shares_storage(inputs, d->fused[k])) {
      // NOTE: the code was compiled for a written input that shares memory with no other:
      // this call replays (the steps, eager's overlap checks included), as Compiled.flat does
      py::gil_scoped_release nogil;
      out = run(p, std::vector<c10::IValue>(inputs));
      return true;
    }
    want.push_back(w.unsafeGetTensorImpl()->version_counter().current_version() + d->versions[k]);
  }
  py::list args(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) args[i] = to_python(inputs[i]);
  py::object r = py::reinterpret_borrow<py::object>(d->code.get())(args);
  // NOTE: the code advances a written input's version as it sees fit; eager's count is replay's
  for (size_t k = 0; k < d->fused.size(); ++k) {
    auto& vc = const_cast<c10::VariableVersion&>(inputs[d->fused[k]].toTensor().unsafeGetTensorImpl()->version_counter());
    vc.set_version(want[k]);
  }
  py::sequence results = py::reinterpret_borrow<py::sequence>(r);
  for (int o : d->outs) out.push_back(o >= 0 ? inputs[o] : from_python(results[-1 - o]));
  p.total->hits.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A compiled program's call (the GIL held): false when its callable left this call to Python.
bool run_python(const Program& p, const std::vector<c10::IValue>& inputs, std::vector<c10::IValue>& out) {
  if (!p.direct.empty()) return run_direct(p, inputs, out);
  py::list args(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) args[i] = to_python(inputs[i]);
  py::object r = py::reinterpret_borrow<py::object>(p.call.get())(args);
  if (r.ptr() == g_miss) return false;
  p.total->hits.fetch_add(1, std::memory_order_relaxed);
  for (py::handle o : r) out.push_back(from_python(o));
  return true;
}

}  // namespace

// ---- the mode's entry point ----------------------------------------------------------

// The op's outputs on a hit, else MISS (Python's decompose goes on as without this table).
// `counts` null: run for Python, which has recorded the call (a shape family's new key, just
// installed), uncounted; a compiled program is then a MISS.
py::object answer(Table& table, Counts* counts, py::handle func, py::handle args, py::handle kwargs) {
  Call c;
  if (!PyTuple_Check(args.ptr()) || !PyDict_Check(kwargs.ptr()) || !table.key_py(func.ptr(), args.ptr(), kwargs.ptr(), c)) {
    return py::reinterpret_borrow<py::object>(g_miss);
  }
  finish(c);
  auto p = table.find(c.key);
  if (!p || p->host) return py::reinterpret_borrow<py::object>(g_miss);  // (host programs: the device's own)
  std::vector<c10::IValue> out;
  if (p->call || !p->direct.empty()) {  // counted once it answered: a MISS goes on to Python, which records the call
    if (!counts || !run_python(*p, c.inputs, out)) return py::reinterpret_borrow<py::object>(g_miss);
    counts->bump(*p);
  } else {
    if (counts) counts->bump(*p);
    py::gil_scoped_release nogil;  // the ops may take long, or call back into Python
    out = run(*p, std::move(c.inputs), counts != nullptr);
  }
  if (p->list_out) {
    py::list l(out.size());
    for (size_t i = 0; i < out.size(); ++i) l[i] = to_python(out[i]);
    return std::move(l);
  }
  if (out.size() == 1) return to_python(out[0]);
  if (out.empty()) return py::none();
  py::tuple t(out.size());
  for (size_t i = 0; i < out.size(); ++i) t[i] = to_python(out[i]);
  return std::move(t);
}

py::object mode_call(Table& table, Counts& counts, py::handle func, py::handle args, py::handle kwargs) {
  return answer(table, &counts, func, args, kwargs);
}

py::object mode_run(Table& table, py::handle func, py::handle args, py::handle kwargs) {
  return answer(table, nullptr, func, args, kwargs);
}

// Removes this call's key (a program whose outputs Python found wrong must not answer again).
void mode_discard(Table& table, py::handle func, py::handle args, py::handle kwargs) {
  Call c;
  if (table.key_py(func.ptr(), args.ptr(), kwargs.ptr(), c)) {
    finish(c);
    table.erase(c.key);
  }
}

// The words of a key after its op (kOp and the op's address, which only this process
// knows): what eagerdecomp/native.py writes to disk, to install the program again in the
// next process (install_words) before its first call.
py::list words_after_op(const Key& k) {
  py::list out(k.w.size() - 2);
  for (size_t i = 2; i < k.w.size(); ++i) out[i - 2] = py::int_(k.w[i]);
  return out;
}

void finish_program(Program& p, const Table& table, const c10::FunctionSchema& schema, py::handle func, bool lifted) {
  p.list_out = schema.returns().size() == 1 && schema.returns()[0].type()->kind() == c10::TypeKind::ListType;
  p.op = func.inc_ref().ptr();
  p.lifted = lifted;
  p.total = table.total_;
  p.name = "eagerdecomp.replay " + py::str(func).cast<std::string>();
}

std::shared_ptr<Program> make_program(const Table& table, const c10::FunctionSchema& schema, py::handle func,
                                      py::list calls, py::list outputs, int n_slots, py::handle slot_type, bool lifted,
                                      py::handle call) {
  auto p = std::make_shared<Program>(build(calls, outputs, n_slots, slot_type));
  // call: None, a callable, (code, fused, versions, outs) for a direct program, or
  // [values_from, (values, (code, fused, versions, outs)), ...] for direct ones by value
  auto add_direct = [&](py::handle spec, py::handle values) {
    auto t = py::reinterpret_borrow<py::tuple>(spec);
    Direct d;
    d.code = std::shared_ptr<PyObject>(py::handle(t[0]).inc_ref().ptr(), PyDecRef{});
    d.fused = t[1].cast<std::vector<int>>();
    d.versions = t[2].cast<std::vector<int64_t>>();
    d.outs = t[3].cast<std::vector<int>>();
    if (!values.is_none()) d.values = values.cast<std::vector<double>>();
    p->direct.push_back(std::move(d));
  };
  if (PyTuple_Check(call.ptr())) {
    add_direct(call, py::none());
  } else if (PyList_Check(call.ptr())) {
    auto l = py::reinterpret_borrow<py::list>(call);
    p->values_from = l[0].cast<int>();
    for (size_t i = 1; i < l.size(); ++i) {
      auto e = py::reinterpret_borrow<py::tuple>(l[i]);
      add_direct(e[1], e[0]);
    }
  } else if (!call.is_none()) {
    p->call = std::shared_ptr<PyObject>(call.inc_ref().ptr(), PyDecRef{});
  }
  finish_program(*p, table, schema, func, lifted);
  return p;
}

const c10::FunctionSchema& schema_of(py::handle func) {
  return find_op(func.attr("_schema").attr("name").cast<std::string>(),
                 func.attr("_schema").attr("overload_name").cast<std::string>()).schema();
}

// Installs a program for this call's key (the mode): Python has just replayed its kernel.
// Returns the key's words after its op, or None when this path does not key the call.
py::object mode_install(Table& table, py::handle func, py::handle args, py::handle kwargs, py::handle positions,
                        py::list calls, py::list outputs, int n_slots, py::handle slot_type, py::handle call) {
  const auto& schema = schema_of(func);
  table.set_lift(func.ptr(), make_lift(schema, positions));
  Call c;
  if (!table.key_py(func.ptr(), args.ptr(), kwargs.ptr(), c)) return py::none();
  finish(c);
  auto p = make_program(table, schema, func, calls, outputs, n_slots, slot_type, c.inputs.size() > c.ids.size(), call);
  py::list words = words_after_op(c.key);
  table.insert(std::move(c.key), std::move(p));
  return std::move(words);
}

// A shape family's program made once (eagerdecomp/runtime/program.py's plan, at one key's
// sizes): a new exact key of the family copies it and remakes only the arguments its sizes
// change, `patches` = [(step, argument position or keyword name, value)], instead of building
// every step again from Python values. Returns the key's words, or None as mode_install.
py::object mode_install_patched(Table& table, py::handle func, py::handle args, py::handle kwargs,
                                py::handle positions, const Program& tmpl, py::list patches, py::handle slot_type) {
  const auto& schema = schema_of(func);
  auto p = std::make_shared<Program>(tmpl);
  for (py::handle h : patches) {
    auto t = py::reinterpret_borrow<py::tuple>(h);
    Step& s = p->steps.at(t[0].cast<size_t>());
    const auto& formals = s.op->schema().arguments();
    size_t i = 0;
    if (PyLong_Check(py::handle(t[1]).ptr())) {
      i = t[1].cast<size_t>();
    } else {
      const auto name = t[1].cast<std::string>();
      while (i < formals.size() && formals[i].name() != name) ++i;
    }
    if (i >= formals.size() || i >= s.args.size()) throw std::runtime_error("a patch names no argument");
    s.args[i] = make_arg(t[2], formals[i].type(), slot_type.ptr());
  }
  table.set_lift(func.ptr(), make_lift(schema, positions));
  Call c;
  if (!table.key_py(func.ptr(), args.ptr(), kwargs.ptr(), c)) return py::none();
  finish(c);
  finish_program(*p, table, schema, func, c.inputs.size() > c.ids.size());
  py::list words = words_after_op(c.key);
  table.insert(std::move(c.key), std::move(p));
  return std::move(words);
}

// Installs a program under words a previous process recorded (mode_install's, or the
// device fallback's when `stack`): the op's word is this process's address of the op.
void install_words(Table& table, py::handle func, bool stack, const std::vector<int64_t>& words, py::handle positions,
                   py::list calls, py::list outputs, int n_slots, py::handle slot_type, bool lifted) {
  const auto& schema = schema_of(func);
  const void* op = stack ? static_cast<const void*>(&schema) : static_cast<const void*>(func.ptr());
  table.set_lift(op, make_lift(schema, positions));
  Key k;
  k.w.reserve(words.size() + 2);
  k.w.push_back(kOp);
  k.w.push_back(reinterpret_cast<int64_t>(op));
  k.w.insert(k.w.end(), words.begin(), words.end());
  seal(k);
  table.insert(std::move(k), make_program(table, schema, func, calls, outputs, n_slots, slot_type, lifted, py::none()));
}

// ---- the device switch ---------------------------------------------------------------

// Python's side of a miss: handler(name, overload, args, kwargs) -> (out, program or None),
// program = (func, positions, calls, outputs, n_slots, slot_type, lifted[, call]).
class Fallback final : public c10::OperatorKernel {
 public:
  Fallback(std::shared_ptr<Table> table, std::shared_ptr<Counts> counts, py::object handler, py::object on_install,
           int64_t host)
      : table_(std::move(table)), counts_(std::move(counts)), handler_(std::move(handler)),
        on_install_(std::move(on_install)), host_(host) {}
  ~Fallback() override {
    release(on_install_);
    release(handler_);
  }

 private:
  static void release(py::object& o) {
    // NOTE: at interpreter exit the registration may die after Python has finalized: the
    // handler is then leaked, not released
    if (!python_alive()) {
      o.release();
      return;
    }
    py::gil_scoped_acquire gil;
    o = py::object();
  }

 public:
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    const c10::IValue* args = stack->data() + stack->size() - n;
    Call c;
    const bool keyed = table_->key_stack(op, args, n, c);
    if (keyed) {
      finish(c);
      if (auto p = table_->find(c.key)) {
        if (p->host) {  // the CPU tier: a key Python sent to the host, if this fallback has that tier
          if (p->host != host_) return miss(op, stack, n, nullptr);
          auto& counter = counts_->bump(*p);
          host::Traffic traffic;
          host::run(op, stack, p->host_type, traffic);
          counter.to_host.fetch_add(traffic.to_host, std::memory_order_relaxed);
          counter.to_device.fetch_add(traffic.to_device, std::memory_order_relaxed);
          counter.copy_ns.fetch_add(traffic.copy_ns, std::memory_order_relaxed);
          return;
        }
        std::vector<c10::IValue> out;
        if (p->call || !p->direct.empty()) {
          py::gil_scoped_acquire gil;
          if (!run_python(*p, c.inputs, out)) return miss(op, stack, n, nullptr);
          counts_->bump(*p);
        } else {
          counts_->bump(*p);
          out = run(*p, std::move(c.inputs));
        }
        torch::jit::drop(*stack, n);
        if (fresh_result(schema)) out[0] = fresh(out[0].toTensor());  // (a prim's Python kernel made it)
        push_outputs(schema, *p, std::move(out), stack);
        return;
      }
    }
    miss(op, stack, n, keyed ? &c.key : nullptr);
  }

 private:
  static void push_outputs(const c10::FunctionSchema& schema, const Program& p, std::vector<c10::IValue>&& out,
                           torch::jit::Stack* stack) {
    if (p.list_out) {
      c10::List<at::Tensor> l;
      for (auto& v : out) l.push_back(v.toTensor());
      stack->emplace_back(std::move(l));
      return;
    }
    for (auto& v : out) stack->push_back(std::move(v));
  }

  // NOTE: PyTorch calls detach (Tensor._make_subclass, so nn.Parameter()) and alias
  // (Tensor.as_subclass) where it has stashed the Python mode stack, to get a tensor with no
  // Python object yet; no Python mode sees those calls, the mode's key does. A miss answers them
  // from Python, whose result already owns a Python object ("raw Tensor object is already
  // associated"): the caller gets a fresh TensorImpl over the same storage and metadata instead,
  // as their own kernels return (views: never one of the inputs). So does a hit: its program's
  // view op may be a prim whose kernel is Python's (prims.view_of).
  static bool fresh_result(const c10::FunctionSchema& schema) {
    static const c10::FunctionSchema* detach = &find_op("aten::detach", "").schema();
    static const c10::FunctionSchema* alias = &find_op("aten::alias", "").schema();
    return &schema == detach || &schema == alias;
  }
  static at::Tensor fresh(const at::Tensor& t) {
    auto* impl = t.unsafeGetTensorImpl();
    return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), impl->allow_tensor_metadata_change()));
  }

  // `before`: the call's key read before the call (an out= it resizes changes its arguments)
  void miss(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, Key* before) {
    const auto& schema = op.schema();
    std::vector<c10::IValue> saved(stack->end() - n, stack->end());
    py::gil_scoped_acquire gil;
    py::list pargs;
    py::dict pkwargs;
    const Handed handed(schema, saved.data(), n);  // (what a Python mode would be handed)
    for (size_t i = 0; i < n; ++i) {
      if (!handed(schema, saved.data(), i)) continue;
      const auto& f = schema.arguments()[i];
      py::object v = argument_to_python(saved[i], f.real_type());  // real: dtypes are not ints
      if (f.kwarg_only()) {
        pkwargs[f.name().c_str()] = v;
      } else {
        pargs.append(v);
      }
    }
    py::tuple result = handler_(schema.name(), schema.overload_name(), py::tuple(pargs), pkwargs);
    torch::jit::drop(*stack, n);
    py::object out = result[0];
    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      stack->push_back(torch::jit::toIValue(out, returns[0].type()));
      if (fresh_result(schema)) stack->back() = fresh(stack->back().toTensor());
    } else if (!returns.empty()) {
      py::tuple outs = out.cast<py::tuple>();
      for (size_t i = 0; i < returns.size(); ++i) stack->push_back(torch::jit::toIValue(outs[i], returns[i].type()));
    }
    if (!result[1].is_none()) install(op, saved, result[1].cast<py::tuple>(), before);
  }

  void install(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, py::tuple prog, Key* before) {
    const auto& schema = op.schema();
    auto lift = make_lift(schema, prog[1]);
    const auto old = table_->lift_for(&schema);
    const bool same_lift = old ? old->schema_index == lift.schema_index && old->each == lift.each
                               : lift.schema_index.empty();
    table_->set_lift(&schema, std::move(lift));
    if (py::isinstance<py::str>(prog[2])) {  // ("host", token, device): the CPU tier; never saved to disk
      // NOTE: filed under the key read before the call: an out= the CPU kernel resized reads
      // differently now, and such calls (structured ops' out= forms) are the tier's common case
      if (before == nullptr || !same_lift) return;  // (the next call keys with the new lift)
      auto p = std::make_shared<Program>();
      p->op = py::object(prog[0]).release().ptr();  // held for the process' life, as make_program's
      p->total = table_->total_;
      p->host = prog[3].cast<int64_t>();
      p->host_type = prog[4].cast<c10::Device>().type();
      table_->insert(std::move(*before), std::move(p));
      return;
    }
    Call c;
    if (!table_->key_stack(op, args.data(), args.size(), c)) return;
    finish(c);
    auto p = make_program(*table_, schema, prog[0], prog[2].cast<py::list>(), prog[3].cast<py::list>(),
                          prog[4].cast<int>(), prog[5], c.inputs.size() > c.ids.size(),
                          prog.size() > 7 ? prog[7] : py::handle(Py_None));
    py::list words = words_after_op(c.key);
    table_->insert(std::move(c.key), std::move(p));
    // (the GIL is held: we are in miss()); a program with compiled code is not saved
    if (!on_install_.is_none() && (prog.size() <= 7 || prog[7].is_none())) on_install_(words, prog);
  }

  static py::object argument_to_python(const c10::IValue& v, const c10::TypePtr& type) {
    c10::TypePtr t = type;
    if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
    if (v.isInt()) {
      // NOTE: the boxed stack carries dtypes, layouts and memory formats as ints; decompositions
      // expect torch.dtype objects (x.is_floating_point), as Python's own fallback gives them
      switch (t->kind()) {
        case c10::TypeKind::ScalarTypeType:
          return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
        case c10::TypeKind::LayoutType:
          return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(v.toInt()))));
        case c10::TypeKind::MemoryFormatType:
          return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(v.toInt())));
        default:
          break;
      }
    }
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
      return torch::jit::toPyObject(v.toTensor().item());  // a Python number, as Python's fallback gives it
    }
    return to_python(v);
  }

  std::shared_ptr<Table> table_;
  std::shared_ptr<Counts> counts_;
  py::object handler_;
  py::object on_install_;  // called with (words, program) after each install, or None
  int64_t host_;           // the token of its CPU tier (eagerdecomp/runtime/host.py), 0 without one
};

// A registration of Fallback on a dispatch key (the whole key, and named ops of aten).
class Registration {
 public:
  Registration(std::shared_ptr<Table> table, std::shared_ptr<Counts> counts, py::object handler, const std::string& key,
               py::list ops, py::object on_install, int64_t host) {
    const auto k = c10::parseDispatchKey(key);
    fallback_ = std::make_unique<torch::Library>(torch::Library::IMPL, "_", k, __FILE__, __LINE__);
    fallback_->fallback(torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Fallback>(table, counts, handler, on_install, host)));
    if (py::len(ops)) {
      ops_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", k, __FILE__, __LINE__);
      for (py::handle name : ops) {
        ops_->impl(name.cast<std::string>().c_str(),
                   torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Fallback>(table, counts, handler, on_install, host)));
      }
    }
  }
  void remove() {
    ops_.reset();
    fallback_.reset();
  }

 private:
  std::unique_ptr<torch::Library> fallback_, ops_;
};

// ---- the mode on a dispatch key (csrc/mode.cpp) --------------------------------------

// One EagerDecompMode's C++ side: its opset (each op's pass-through count) and the Fallback
// that serves everything else from its runtime's table, handing misses to its Python handler.
// Entered, it rides in the thread's debug info (mode::enter), where the key's kernel finds it.
class ModeState final : public c10::DebugInfoBase {
 public:
  ModeState(std::shared_ptr<Table> table, std::shared_ptr<Counts> counts, py::object handler, py::object on_install,
            int64_t host, py::list opset)
      : fallback_(std::move(table), std::move(counts), std::move(handler), std::move(on_install), host),
        passed_(py::len(opset)) {
    auto& d = c10::Dispatcher::singleton();
    size_t i = 0;
    for (py::handle op : opset) {
      py::object schema = op.attr("_schema");
      auto h = d.findOp(c10::OperatorName(schema.attr("name").cast<std::string>(),
                                          schema.attr("overload_name").cast<std::string>()));
      ops_.push_back(py::reinterpret_borrow<py::object>(op));
      if (h) index_.emplace(&h->schema(), i);
      ++i;
    }
  }
  ~ModeState() override {
    if (!python_alive()) {
      for (auto& o : ops_) o.release();
      return;
    }
    py::gil_scoped_acquire gil;
    ops_.clear();
  }

  // This opset op's pass-through counter, or null for an op outside the opset.
  std::atomic<int64_t>* passed(const c10::FunctionSchema* s) {
    auto it = index_.find(s);
    return it == index_.end() ? nullptr : &passed_[it->second];
  }
  py::list passed_counts() {
    py::list out;
    for (size_t i = 0; i < ops_.size(); ++i) {
      const int64_t n = passed_[i].load(std::memory_order_relaxed);
      if (n) out.append(py::make_tuple(ops_[i], n));
    }
    return out;
  }
  void clear_passed() {
    for (auto& n : passed_) n.store(0, std::memory_order_relaxed);
  }
  Fallback& fallback() { return fallback_; }

 private:
  Fallback fallback_;
  std::vector<std::atomic<int64_t>> passed_;
  std::vector<py::object> ops_;
  std::unordered_map<const c10::FunctionSchema*, size_t> index_;
};

// The kernel of the mode's key: every op reaching it in a thread that entered a mode.
void mode_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto* state = static_cast<ModeState*>(c10::ThreadLocalDebugInfo::get(mode::kStateKind));
  if (state == nullptr || mode::passes_by(op, stack)) return mode::pass_below(op, ks, stack);
  if (auto* n = state->passed(&op.schema())) {
    n->fetch_add(1, std::memory_order_relaxed);
    return mode::pass_below(op, ks, stack);
  }
  // NOTE: every dispatcher call made from here on is the mode's own (keying a wrapped number
  // with item(), a program's steps, the Python miss path's trace and replay): none may come back
  // to this kernel
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKeySet(mode::kKey)};
  state->fallback()(op, ks, stack);
}

std::unique_ptr<torch::Library> g_mode_lib;

void register_mode() {
  if (g_mode_lib) return;
  const std::string taken = mode::slot_taken(mode::kKey);
  if (!taken.empty()) throw std::runtime_error("dispatch key " + std::string(c10::toString(mode::kKey)) + ": " + taken);
  g_mode_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", mode::kKey, __FILE__, __LINE__);
  g_mode_lib->fallback(torch::CppFunction::makeFromBoxedFunction<&mode_kernel>());
}

void init(py::module_& m) {
  auto h = m.def_submodule("hit", "The C++ hit path (csrc/hit.cpp)");
  py::class_<Table, std::shared_ptr<Table>>(h, "Table")
      .def(py::init([](size_t maxsize) {
        auto t = std::make_shared<Table>(maxsize);
        t->parameter_ = reinterpret_cast<PyTypeObject*>(py::module_::import("torch").attr("nn").attr("Parameter").ptr());
        return t;
      }))
      .def("call", &mode_call)
      .def("run", &mode_run)
      .def("discard", &mode_discard)
      .def("install", &mode_install)
      .def("install_words", &install_words)
      .def("install_patched", &mode_install_patched)
      .def("clear", &Table::clear)
      .def("total", &Table::total)
      .def("__len__", &Table::size);
  py::class_<Counts, std::shared_ptr<Counts>>(h, "Counts")
      .def(py::init<>())
      .def("counts", &Counts::counts)
      .def("clear_counts", &Counts::clear_counts);
  py::class_<Registration>(h, "Registration")
      .def(py::init<std::shared_ptr<Table>, std::shared_ptr<Counts>, py::object, const std::string&, py::list, py::object,
                    int64_t>(),
           py::arg("table"), py::arg("counts"), py::arg("handler"), py::arg("key"), py::arg("ops"),
           py::arg("on_install") = py::none(), py::arg("host") = 0)
      .def("remove", &Registration::remove);
  // the layout of a key's words (Tag, push_tensor, finish...): bumped when it changes, so
  // a shape family's program at one key, copied and patched for its others (install_patched)
  py::class_<ModeState, std::shared_ptr<ModeState>>(h, "ModeState")
      .def(py::init<std::shared_ptr<Table>, std::shared_ptr<Counts>, py::object, py::object, int64_t, py::list>(),
           py::arg("table"), py::arg("counts"), py::arg("handler"), py::arg("on_install"), py::arg("host"),
           py::arg("opset"))
      .def("passed", &ModeState::passed_counts)
      .def("clear_passed", &ModeState::clear_passed);
  py::class_<mode::Token>(h, "ModeToken");
  h.def("register_mode", &register_mode, "The mode key's kernel (once per process; raises if the slot is taken)");
  h.def("enter", [](std::shared_ptr<ModeState> s) { return mode::enter(std::move(s)); },
        "The mode's key into this thread's included set, its state into the thread's debug info");
  h.def("leave", &mode::leave, "Both put back exactly as enter found them");
  py::class_<Program, std::shared_ptr<Program>>(h, "Program");
  h.def("template", [](py::list calls, py::list outputs, int n_slots, py::handle slot_type) {
    return std::make_shared<Program>(build(calls, outputs, n_slots, slot_type));
  });
  // words written to disk by another build are never read as this one's
  h.attr("WORDS") = 1;
  h.def("_init", [](py::object miss, std::string partial) {
    g_miss = miss.release().ptr();
    g_partial = std::move(partial);
  });
}

}  // namespace eagerdecomp::hit
