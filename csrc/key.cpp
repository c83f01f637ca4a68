// The cache key builder in C++: eagerdecomp/key.py's make_key_py, field for field.
//
// make_key(func, args, kwargs) returns (parts, tensors) where `parts` is a tuple that
// compares equal (and hashes equal) to the one make_key_py builds for the same call, so
// the two builders are interchangeable. key.py is the contract; every branch below
// mirrors one branch of its _visit, in the same order, with the same Bypass reasons.
//
// Only the common cases are done natively (plain tensors, plain scalars, lists); every
// rare case (non-strided layout, symbolic sizes, Python-dispatch tensors, error
// messages) asks Python the very questions key.py asks, so the two cannot drift apart
// where speed does not matter.
#include <torch/extension.h>

#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <ATen/Context.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>

#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace eagerdecomp::key {
namespace {

// Set once by _init_key; borrowed forever (types and the Bypass class never die).
struct Types {
  PyObject* bypass = nullptr;
  PyTypeObject* tensor = nullptr;     // torch.Tensor
  PyTypeObject* parameter = nullptr;  // torch.nn.Parameter
  PyTypeObject* generator = nullptr;  // torch.Generator
  PyObject* tensor_class = nullptr;   // for isinstance(x, torch.Tensor)
  PyObject* sym_types = nullptr;      // (SymInt, SymFloat, SymBool)
  std::vector<PyTypeObject*> plain;   // key.py's _PLAIN
};
Types T;

// Owned references, released on every exit path.
struct Refs {
  std::vector<PyObject*> items;
  ~Refs() {
    for (PyObject* o : items) Py_XDECREF(o);
  }
  // Takes ownership of `o`; false (with the Python error set) when `o` is null.
  bool push(PyObject* o) {
    if (!o) return false;
    items.push_back(o);
    return true;
  }
  PyObject* to_tuple() {
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    if (!t) return nullptr;
    for (size_t i = 0; i < items.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), items[i]);
    items.clear();  // the tuple owns them now
    return t;
  }
};

bool raise_bypass(PyObject* reason /* stolen */) {
  if (!reason) return false;
  PyObject* exc = PyObject_CallOneArg(T.bypass, reason);
  Py_DECREF(reason);
  if (!exc) return false;
  PyErr_SetObject(T.bypass, exc);
  Py_DECREF(exc);
  return false;
}

// f"{prefix}{type(x).__name__}", as key.py formats it.
bool raise_bypass_named(const char* prefix, PyTypeObject* t) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(t), "__name__");
  if (!name) return false;
  PyObject* msg = PyUnicode_FromFormat("%s%S", prefix, name);
  Py_DECREF(name);
  return raise_bypass(msg);
}

// (type, value): the type object itself, as key.py's `(t, x)`.
PyObject* pair(PyTypeObject* t, PyObject* value /* stolen */) {
  if (!value) return nullptr;
  PyObject* p = PyTuple_New(2);
  if (!p) {
    Py_DECREF(value);
    return nullptr;
  }
  Py_INCREF(t);
  PyTuple_SET_ITEM(p, 0, reinterpret_cast<PyObject*>(t));
  PyTuple_SET_ITEM(p, 1, value);
  return p;
}

PyObject* new_ref(PyObject* o) {
  Py_INCREF(o);
  return o;
}

PyObject* call_method0(PyObject* x, const char* name) {
  return PyObject_CallMethod(x, name, nullptr);
}

// The tensor's key tuple asked of Python, exactly as key.py asks it: used when the
// sizes are symbolic, the tensor is Python-dispatched, or a native read threw (Python
// then raises the same error key.py would).
PyObject* tensor_meta_py(PyObject* x) {
  // one question at a time, in key.py's order: the first failure is the error raised
  Refs fields;
  const bool ok = fields.push(PyObject_GetAttrString(x, "shape")) && fields.push(call_method0(x, "stride")) &&
                  fields.push(call_method0(x, "storage_offset")) && fields.push(PyObject_GetAttrString(x, "dtype")) &&
                  fields.push(PyObject_GetAttrString(x, "device")) && fields.push(call_method0(x, "is_conj")) &&
                  fields.push(call_method0(x, "is_neg"));
  return ok ? fields.to_tuple() : nullptr;
}

PyObject* int_tuple(c10::IntArrayRef v, PyTypeObject* type) {
  // torch.Size is a tuple subtype: allocate it as such, then fill like a tuple.
  const auto n = static_cast<Py_ssize_t>(v.size());
  PyObject* t = type == &PyTuple_Type ? PyTuple_New(n) : type->tp_alloc(type, n);
  if (!t) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* e = PyLong_FromLongLong(v[i]);
    if (!e) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, i, e);
  }
  return t;
}

PyObject* py_bool(bool b) {
  return b ? Py_True : Py_False;
}

// key.py's ambient_state(), read from the same C++ state its torch calls read. The
// tuple is immutable and compared by value, so the last one is reused while the state
// holds (per thread: grad and inference mode are thread-local).
PyObject* ambient_state() {
  thread_local PyObject* last = nullptr;  // owned; lives as long as the thread
  PyObject* dtype = reinterpret_cast<PyObject*>(
      torch::getTHPDtype(c10::typeMetaToScalarType(c10::get_default_dtype())));
  PyObject* grad = py_bool(c10::GradMode::is_enabled());
  PyObject* inference = py_bool(c10::InferenceMode::is_enabled());
  PyObject* deterministic = py_bool(at::globalContext().deterministicAlgorithms());
  PyObject* warn_only = py_bool(at::globalContext().deterministicAlgorithmsWarnOnly());
  if (last && PyTuple_GET_ITEM(last, 0) == dtype && PyTuple_GET_ITEM(last, 1) == grad &&
      PyTuple_GET_ITEM(last, 2) == inference && PyTuple_GET_ITEM(last, 3) == deterministic &&
      PyTuple_GET_ITEM(last, 4) == warn_only) {
    return new_ref(last);
  }
  PyObject* state = PyTuple_Pack(5, dtype, grad, inference, deterministic, warn_only);
  if (!state) return nullptr;
  Py_XSETREF(last, new_ref(state));
  return state;
}

// torch.device objects are immutable and compare by value: one per device, kept.
PyObject* device_object(const c10::Device& device) {
  static std::unordered_map<int32_t, PyObject*> cache;  // (type << 16 | index) -> device
  const int32_t code = (static_cast<int32_t>(device.type()) << 16) | static_cast<uint16_t>(device.index());
  auto it = cache.find(code);
  if (it != cache.end()) return new_ref(it->second);
  PyObject* d = THPDevice_New(device);
  if (d) cache.emplace(code, new_ref(d));
  return d;
}

// (x.shape, x.stride(), x.storage_offset(), x.dtype, x.device, x.is_conj(), x.is_neg())
PyObject* tensor_meta(PyObject* x, const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  // NOTE: symbolic sizes come back as SymInts, and a Python-dispatched tensor answers
  // size queries in Python: both are rare, so let Python build them exactly.
  if (impl->has_symbolic_sizes_strides() || impl->key_set().has(c10::DispatchKey::Python)) {
    return tensor_meta_py(x);
  }
  // read everything that can throw first (a strided layout without strides, as nested
  // tensors have), then build; on a throw, Python raises what key.py would raise
  c10::IntArrayRef sizes, strides;
  int64_t offset = 0;
  at::ScalarType dtype = at::ScalarType::Undefined;
  c10::Device device(c10::kCPU);
  bool conj = false, neg = false;
  try {
    sizes = t.sizes();
    strides = t.strides();
    offset = t.storage_offset();
    dtype = t.scalar_type();
    device = t.device();
    conj = t.is_conj();
    neg = t.is_neg();
  } catch (const std::exception&) {
    return tensor_meta_py(x);
  }
  Refs fields;
  try {
    const bool ok = fields.push(int_tuple(sizes, &THPSizeType)) && fields.push(int_tuple(strides, &PyTuple_Type)) &&
                    fields.push(PyLong_FromLongLong(offset)) &&
                    fields.push(new_ref(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)))) &&
                    fields.push(device_object(device)) && fields.push(new_ref(py_bool(conj))) &&
                    fields.push(new_ref(py_bool(neg)));
    return ok ? fields.to_tuple() : nullptr;
  } catch (const std::exception& e) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// NOTE: nan != nan would make every nan call a miss, and 0.0 == -0.0 would let
// mul(x, -0.0) replay a kernel traced with 0.0: key.py keys those two by repr.
PyObject* float_key(PyObject* x) {
  const double v = PyFloat_AS_DOUBLE(x);
  if (v != v || v == 0.0) return pair(&PyFloat_Type, PyObject_Repr(x));
  return pair(&PyFloat_Type, new_ref(x));
}

bool is_plain(PyTypeObject* t) {
  for (PyTypeObject* p : T.plain)
    if (p == t) return true;
  return false;
}

bool visit(PyObject* x, Refs& parts, Refs& tensors);

bool visit_sequence(PyObject* x, PyTypeObject* t, Refs& parts, Refs& tensors) {
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(x);
  if (!parts.push(pair(t, PyLong_FromSsize_t(n)))) return false;
  if (Py_EnterRecursiveCall(" while building a cache key")) return false;
  // NOTE: re-read the size and hold each item, as Python's `for y in x` does: an
  // isinstance check on an odd item may run Python code that touches the list.
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(x); ++i) {
    PyObject* item = new_ref(PySequence_Fast_GET_ITEM(x, i));
    ok = visit(item, parts, tensors);
    Py_DECREF(item);
  }
  Py_LeaveRecursiveCall();
  return ok;
}

// key.py's _visit, branch for branch and in the same order.
bool visit(PyObject* x, Refs& parts, Refs& tensors) {
  PyTypeObject* t = Py_TYPE(x);
  if (t == T.tensor || t == T.parameter) {
    const at::Tensor& tensor = THPVariable_Unpack(x);
    if (tensor.layout() != c10::kStrided) {
      PyObject* layout = PyObject_GetAttrString(x, "layout");
      if (!layout) return false;
      PyObject* msg = PyUnicode_FromFormat("%S tensor", layout);
      Py_DECREF(layout);
      return raise_bypass(msg);
    }
    tensors.push(new_ref(x));
    return parts.push(tensor_meta(x, tensor));
  }
  if (is_plain(t)) return parts.push(pair(t, new_ref(x)));
  if (t == &PyFloat_Type) return parts.push(float_key(x));
  if (t == &PyList_Type || t == &PyTuple_Type) return visit_sequence(x, t, parts, tensors);
  if (t == &PyComplex_Type) return parts.push(pair(t, PyObject_Repr(x)));
  int r = PyObject_IsInstance(x, T.tensor_class);
  if (r < 0) return false;
  if (r) return raise_bypass_named("tensor subclass ", t);
  r = PyObject_IsInstance(x, T.sym_types);
  if (r < 0) return false;
  if (r) return raise_bypass(PyUnicode_FromString("symbolic shape argument"));
  // a traced kernel would bake the generator object in; run eagerly with it instead
  if (t == T.generator) return raise_bypass(PyUnicode_FromString("explicit generator argument"));
  return raise_bypass_named("unkeyable argument of type ", t);
}

bool visit_all(PyObject* seq, Refs& parts, Refs& tensors) {
  PyObject* fast = PySequence_Fast(seq, "make_key: args must be a sequence");
  if (!fast) return false;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* item = new_ref(PySequence_Fast_GET_ITEM(fast, i));
    ok = visit(item, parts, tensors);
    Py_DECREF(item);
  }
  Py_DECREF(fast);
  return ok;
}

bool visit_kwargs(PyObject* kwargs, Refs& parts, Refs& tensors) {
  if (PyDict_Check(kwargs)) {
    // hold each value while visiting it: an odd value's isinstance check runs Python code
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(kwargs, &pos, &k, &v)) {
      if (!parts.push(new_ref(k))) return false;
      Py_INCREF(v);
      const bool ok = visit(v, parts, tensors);
      Py_DECREF(v);
      if (!ok) return false;
    }
    return true;
  }
  // any other mapping: its items(), as key.py iterates them
  PyObject* items = PyMapping_Items(kwargs);
  if (!items) return false;
  const Py_ssize_t n = PyList_GET_SIZE(items);
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    PyObject* kv = PyList_GET_ITEM(items, i);
    ok = PyTuple_Check(kv) && PyTuple_GET_SIZE(kv) == 2;
    if (!ok) {
      PyErr_SetString(PyExc_TypeError, "make_key: kwargs.items() must yield (name, value) pairs");
      break;
    }
    ok = parts.push(new_ref(PyTuple_GET_ITEM(kv, 0))) && visit(PyTuple_GET_ITEM(kv, 1), parts, tensors);
  }
  Py_DECREF(items);
  return ok;
}

// key.py: tuple(ids.index(i) for i in ids), only when some tensor object repeats.
bool same_object_pattern(const std::vector<PyObject*>& ts, Refs& parts) {
  const size_t n = ts.size();
  if (n < 2) return true;
  std::vector<Py_ssize_t> first(n);
  bool repeated = false;
  if (n <= 32) {
    for (size_t i = 0; i < n; ++i) {
      size_t j = 0;
      while (ts[j] != ts[i]) ++j;
      first[i] = static_cast<Py_ssize_t>(j);
      repeated |= j != i;
    }
  } else {
    std::unordered_map<PyObject*, Py_ssize_t> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto it = seen.emplace(ts[i], static_cast<Py_ssize_t>(i)).first;
      first[i] = it->second;
      repeated |= first[i] != static_cast<Py_ssize_t>(i);
    }
  }
  if (!repeated) return true;
  PyObject* pattern = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (!pattern) return false;
  for (size_t i = 0; i < n; ++i) {
    PyObject* e = PyLong_FromSsize_t(first[i]);
    if (!e) {
      Py_DECREF(pattern);
      return false;
    }
    PyTuple_SET_ITEM(pattern, static_cast<Py_ssize_t>(i), e);
  }
  return parts.push(pattern);
}

PyObject* make_key_impl(PyObject* func, PyObject* args, PyObject* kwargs) {
  if (!T.bypass) {
    PyErr_SetString(PyExc_RuntimeError, "eagerdecomp._C.make_key: call _init_key(Bypass, extra_plain_types) first");
    return nullptr;
  }
  Refs parts, tensors;
  parts.items.reserve(16);
  if (!parts.push(new_ref(func))) return nullptr;
  if (!visit_all(args, parts, tensors)) return nullptr;
  if (!visit_kwargs(kwargs, parts, tensors)) return nullptr;
  if (!same_object_pattern(tensors.items, parts)) return nullptr;
  if (!parts.push(ambient_state())) return nullptr;
  PyObject* tensor_list = PyList_New(static_cast<Py_ssize_t>(tensors.items.size()));
  if (!tensor_list) return nullptr;
  for (size_t i = 0; i < tensors.items.size(); ++i) {
    PyList_SET_ITEM(tensor_list, static_cast<Py_ssize_t>(i), tensors.items[i]);
  }
  tensors.items.clear();
  PyObject* parts_tuple = parts.to_tuple();
  if (!parts_tuple) {
    Py_DECREF(tensor_list);
    return nullptr;
  }
  PyObject* out = PyTuple_New(2);
  if (!out) {
    Py_DECREF(parts_tuple);
    Py_DECREF(tensor_list);
    return nullptr;
  }
  PyTuple_SET_ITEM(out, 0, parts_tuple);
  PyTuple_SET_ITEM(out, 1, tensor_list);
  return out;
}

PyTypeObject* type_attr(py::handle mod, const char* dotted) {
  py::object o = py::reinterpret_borrow<py::object>(mod);
  std::string path(dotted);
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    o = o.attr(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start).c_str());
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!PyType_Check(o.ptr())) throw py::type_error(std::string("eagerdecomp._C: torch.") + dotted + " is not a type");
  return reinterpret_cast<PyTypeObject*>(o.release().ptr());  // kept for the process' life
}

}  // namespace

void init_key(py::handle bypass, py::tuple extra_plain_types) {
  if (!PyType_Check(bypass.ptr()) || !PyObject_IsSubclass(bypass.ptr(), PyExc_Exception)) {
    throw py::type_error("_init_key: expected the Bypass exception class as first argument");
  }
  py::module_ torch = py::module_::import("torch");
  Types t;
  t.bypass = bypass.inc_ref().ptr();
  t.tensor = type_attr(torch, "Tensor");
  t.parameter = type_attr(torch, "nn.Parameter");
  t.generator = type_attr(torch, "Generator");
  t.tensor_class = reinterpret_cast<PyObject*>(t.tensor);
  t.sym_types = py::make_tuple(torch.attr("SymInt"), torch.attr("SymFloat"), torch.attr("SymBool")).release().ptr();
  // key.py's _PLAIN: hashable, compared by value, keyed as (type(x), x)
  t.plain = {&PyLong_Type, &PyBool_Type, &PyUnicode_Type, Py_TYPE(Py_None),
             type_attr(torch, "dtype"), type_attr(torch, "device"), type_attr(torch, "layout"),
             type_attr(torch, "memory_format")};
  for (py::handle e : extra_plain_types) {
    if (!PyType_Check(e.ptr())) throw py::type_error("_init_key: extra plain types must be types");
    t.plain.push_back(reinterpret_cast<PyTypeObject*>(e.inc_ref().ptr()));
  }
  T = std::move(t);
}

py::object make_key(py::handle func, py::handle args, py::handle kwargs) {
  PyObject* out = make_key_impl(func.ptr(), args.ptr(), kwargs.ptr());
  if (!out) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(out);
}

}  // namespace eagerdecomp::key
