// The reference devices "edref" and "edprims": a PrivateUse1 backend whose memory is host
// memory and which has kernels for exactly the ops Python names at registration (core ATen,
// or the prims_fusion preset, plus the runtime ops a device needs to exist; the lists live in
// eagerdecomp/device/refdev.py). One process registers one of them (PrivateUse1 is one key). Every
// kernel is the same boxed function: it re-wraps device tensors as CPU tensors over the
// same memory, redispatches to the CPU key, and maps the outputs back, keeping aliasing.
// Any other op fails with PyTorch's own "could not run ... on edref" error: the device is
// strict, which is what eagerdecomp is tested against.
#include "refdev.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/util/SmallVector.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace eagerdecomp::refdev {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kType, 0);
const c10::Device kHost(c10::kCPU);

// Host memory, tagged with the device so tensors built on it report device edref:0.
struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    return {p, p, &c10::free_cpu, kDevice};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &c10::free_cpu; }
  void copy_data(void* dst, const void* src, size_t n) const override { std::memcpy(dst, src, n); }
};
HostAllocator g_allocator;

// One device, one synchronous stream: guards have nothing to switch.
struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override { setDevice(d); return kDevice; }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType && d.index() <= 0, c10::get_privateuse1_backend(), " has one device (index 0), got ", d);
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override { return c10::Stream(c10::Stream::DEFAULT, kDevice); }
  c10::Stream exchangeStream(c10::Stream) const override { return getStream(kDevice); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // work is done when the call returns, so events are always complete
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  // NOTE: random ops run as CPU kernels on host memory, so they draw from the CPU
  // generator: a seeded run on edref draws the same numbers as the same run on CPU.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return kDevice; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override {
    auto* s = storage.unsafeGetStorageImpl();
    TORCH_CHECK(s->resizable(), c10::get_privateuse1_backend(), ": trying to resize a storage that is not resizable");
    c10::DataPtr fresh = g_allocator.allocate(n);
    size_t keep = std::min(n, s->nbytes());
    if (keep) std::memcpy(fresh.get(), s->data_ptr().get(), keep);
    s->set_data_ptr_noswap(std::move(fresh));
    s->set_nbytes(n);
  }
};

// ---- the op log: the device's own witness of what ran on it ----------------------
std::atomic<bool> g_logging{false};
std::mutex g_log_mutex;
std::map<std::string, int64_t> g_log;

void log_op(const c10::OperatorHandle& op) {
  if (!g_logging.load(std::memory_order_relaxed)) return;
  const auto& name = op.operator_name();
  std::string key = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  ++g_log[key];
}

bool is_device(const at::Tensor& t) { return t.defined() && t.device().type() == kType; }

void copy_view_metadata(c10::TensorImpl* dst, const at::Tensor& src) {
  dst->set_sizes_and_strides(src.sizes(), src.strides(), src.storage_offset());
  dst->_set_conj(src.is_conj());
  dst->_set_neg(src.is_neg());
}

// A map from storage to V for the few storages one call touches: a linear scan of an
// inline array, because hash maps cost an allocation per entry on every forwarded call.
template <class V>
class StorageMap {
 public:
  V* find(const c10::StorageImpl* k) {
    for (auto& [key, value] : items_)
      if (key == k) return &value;
    return nullptr;
  }
  V& operator[](c10::StorageImpl* k) {
    if (V* v = find(k)) return *v;
    items_.emplace_back(k, V{});
    return items_.back().second;
  }
  void emplace(c10::StorageImpl* k, V v) { items_.emplace_back(k, std::move(v)); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }

 private:
  c10::SmallVector<std::pair<c10::StorageImpl*, V>, 4> items_;
};

// One forwarded call: the device<->host storage maps, so every alias of one device
// storage is one host storage for the CPU kernel, and back.
class Call {
 public:
  c10::IValue to_host(const c10::IValue& v) {
    if (v.isTensor()) return host_tensor(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      out.reserve(v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList()) out.push_back(host_tensor(t));
      return out;
    }
    if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {  // Tensor?[]
      auto in = v.toList();
      c10::impl::GenericList out(in.elementType());
      out.reserve(in.size());
      for (const c10::IValue& e : in) out.push_back(e.isTensor() ? c10::IValue(host_tensor(e.toTensor())) : e);
      return out;
    }
    if (v.isDevice()) {
      if (v.toDevice().type() == kType) return kHost;
      host_outputs_ = true;  // e.g. _to_copy(x, device="cpu"): fresh outputs belong on the host
      return v;
    }
    if (v.isStorage() && v.toStorage().device_type() == kType) return host_storage(v.toStorage());
    return v;
  }

  c10::IValue to_device(const c10::IValue& v) {
    if (v.isTensor()) return device_tensor(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      out.reserve(v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList()) out.push_back(device_tensor(t));
      return out;
    }
    return v;
  }

  // Count the references outputs hold to each fresh host storage, so adoption can tell a
  // storage only the outputs own (steal its memory) from one held elsewhere (copy it).
  void count_output_refs(const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.has_storage()) ++output_refs_[t.storage().unsafeGetStorageImpl()];
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) count_output_refs(t);
    }
  }

  // A CPU kernel may have resized a host storage (resize_, out= of the wrong size): move
  // the new memory into the device storage it stands for.
  void sync_resized() {
    for (auto& [host, dev] : to_dev_) {
      auto* d = dev.unsafeGetStorageImpl();
      if (host->data_ptr().get() == d->data_ptr().get() && host->nbytes() == d->nbytes()) continue;
      size_t n = host->nbytes();
      c10::DataPtr moved = host->set_data_ptr(c10::DataPtr(nullptr, kHost));
      void* raw = moved.get();
      moved.unsafe_set_device(kDevice);
      d->set_data_ptr_noswap(std::move(moved));
      d->set_nbytes(n);
      host->set_data_ptr_noswap(c10::DataPtr(raw, kHost));  // the host view stays valid, unowned
    }
  }

  // A mutated device argument takes the host tensor's storage and view metadata
  // (set_, resize_, as_strided_, squeeze_ ... change them in place).
  void sync_argument(const at::Tensor& dev, const at::Tensor& host) {
    if (!is_device(dev) || !host.defined()) return;
    c10::Storage storage = device_storage(host.storage().unsafeGetStorageImpl(), /*steal=*/false);
    auto* impl = dev.unsafeGetTensorImpl();
    if (!impl->storage().is_alias_of(storage)) impl->set_storage_keep_dtype(std::move(storage));
    if (dev.sizes() != host.sizes() || dev.strides() != host.strides() || dev.storage_offset() != host.storage_offset())
      impl->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
  }

  // A real device would reject a CPU tensor (other than a 0-dim one) among its operands;
  // the CPU kernels below would not, so the reference device checks it itself.
  void check_devices(const c10::OperatorHandle& op) const {
    if (!saw_device_ || !host_operand_.defined() || mixes_devices(op)) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found a CPU tensor of shape ",
                host_operand_.sizes(), " among the operands of ", op.operator_name(),
                " on ", c10::get_privateuse1_backend(), " (only 0-dim CPU tensors may join device tensors)");
  }

 private:
  c10::Storage host_storage(const c10::Storage& dev) {
    auto* d = dev.unsafeGetStorageImpl();
    if (auto* host = to_host_.find(d)) return c10::Storage(*host);
    // NOTE: the host storage does not own the memory; resizable with the CPU allocator
    // so a CPU resize can reallocate it (sync_resized moves the result back).
    auto host = c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), d->nbytes(), c10::DataPtr(d->data_ptr().get(), kHost),
        c10::GetCPUAllocator(), d->resizable());
    to_host_.emplace(d, host);
    to_dev_.emplace(host.get(), dev);
    return c10::Storage(host);
  }

  at::Tensor host_tensor(const at::Tensor& t) {
    if (!is_device(t)) {
      if (t.defined() && t.has_storage()) host_inputs_[t.storage().unsafeGetStorageImpl()] = true;
      if (t.defined() && t.dim() > 0 && !host_operand_.defined()) host_operand_ = t;
      return t;
    }
    saw_device_ = true;
    c10::Storage host = host_storage(t.storage());
    if (!base_keys_.find(host.unsafeGetStorageImpl())) base_keys_.emplace(host.unsafeGetStorageImpl(), t.key_set());
    auto out = at::detail::make_tensor<c10::TensorImpl>(
        std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    auto* impl = out.unsafeGetTensorImpl();
    copy_view_metadata(impl, t);
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) impl->set_wrapped_number(true);  // promotes like a scalar
    impl->set_allow_tensor_metadata_change(t.unsafeGetTensorImpl()->allow_tensor_metadata_change());
    return out;
  }

  // The device storage for a host storage: the one it wraps, or a new one adopting a
  // fresh host allocation (its memory stolen when only the outputs own it, else copied).
  c10::Storage device_storage(c10::StorageImpl* host, bool steal) {
    if (auto* dev = to_dev_.find(host)) return *dev;
    size_t n = host->nbytes();
    c10::intrusive_ptr<c10::StorageImpl> dev;
    if (steal) {
      c10::DataPtr moved = host->set_data_ptr(c10::DataPtr(nullptr, kHost));
      void* raw = moved.get();
      moved.unsafe_set_device(kDevice);
      dev = c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), n, std::move(moved), &g_allocator, host->resizable());
      host->set_data_ptr_noswap(c10::DataPtr(raw, kHost));
    } else {
      dev = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), n, &g_allocator, true);
      if (n) std::memcpy(dev->mutable_data(), host->data(), n);
    }
    c10::Storage storage(dev);
    to_dev_.emplace(host, storage);
    return storage;
  }

  at::Tensor device_tensor(const at::Tensor& h) {
    if (!h.defined() || h.device().type() != c10::kCPU || !h.has_storage()) return h;
    auto* s = h.storage().unsafeGetStorageImpl();
    bool ours = to_dev_.find(s) != nullptr;
    if (!ours && (host_outputs_ || host_inputs_.find(s))) return h;  // a host tensor, rightly
    at::Tensor out;
    if (const c10::DispatchKeySet* keys = base_keys_.find(s)) {
      // NOTE: a view of an input, made as ATen makes views (TensorImpl::VIEW with its base's
      // keys): under inference mode a view of a normal tensor is a normal tensor, which
      // autograd's view tracking then gives its base's version counter (a weight's t() in
      // F.linear); made as a fresh tensor it was an inference tensor and that failed
      out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, device_storage(s, false), *keys, h.dtype());
    } else {
      const int64_t* refs = output_refs_.find(s);
      bool steal = !ours && c10::raw::intrusive_ptr::use_count(s) <= static_cast<size_t>(refs ? *refs : 0);
      out = at::detail::make_tensor<c10::TensorImpl>(
          device_storage(s, steal), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), h.dtype());
    }
    copy_view_metadata(out.unsafeGetTensorImpl(), h);
    return out;
  }

  static bool mixes_devices(const c10::OperatorHandle& op) {
    // NOTE: copies move data between devices, and indexing accepts CPU indices, as on CUDA;
    // _has_compatible_shallow_copy_type compares a CPU tensor with its device copy (Module.to)
    static const std::unordered_set<std::string> mixers = {
        "aten::copy_", "aten::_to_copy", "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
        "aten::_has_compatible_shallow_copy_type"};
    return mixers.count(op.operator_name().name) > 0;
  }

  bool saw_device_ = false;
  at::Tensor host_operand_;
  StorageMap<c10::intrusive_ptr<c10::StorageImpl>> to_host_;
  StorageMap<c10::Storage> to_dev_;
  StorageMap<c10::DispatchKeySet> base_keys_;  // per host storage of a device input: that input's keys
  StorageMap<bool> host_inputs_;
  StorageMap<int64_t> output_refs_;
  bool host_outputs_ = false;
};

// NOTE: a copy-on-write storage (Tensor._lazy_clone) shares its memory until someone writes;
// CPU kernels copy it when they ask for a writable pointer, which the host wrapper below
// would hide from them. So a storage an op writes is copied here first, as CPU would.
void materialize(const c10::IValue& v) {
  auto one = [](const at::Tensor& t) {
    if (is_device(t) && t.has_storage()) t.storage().unsafeGetStorageImpl()->mutable_data();
  };
  if (v.isTensor()) {
    one(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) one(t);
  }
}

// Whether an op that marks an argument written changes only its metadata, never its memory:
// the inplace_view ops (t_, squeeze_, as_strided_) and prims::as_strided, a view whose schema
// marks its input written (Tensor(a!)). CPU kernels ask none of them for a writable pointer, so
// a copy-on-write storage stays shared (test_lazy_clone_view on edprims, where view lowers to it).
bool writes_metadata_only(const c10::OperatorHandle& op) {
  static const c10::OperatorName as_strided("prims::as_strided", "");
  return op.hasTag(at::Tag::inplace_view) || op.operator_name() == as_strided;
}

// Index of the argument a return aliases (by alias set), or -1.
int aliased_argument(const c10::FunctionSchema& schema, const c10::AliasInfo* ret) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (!a) continue;
    for (const auto& set : ret->beforeSets())
      if (a->beforeSets().count(set)) return static_cast<int>(i);
  }
  return -1;
}

// The one kernel of every op on edref: run the CPU kernel on the same memory.
void forward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  log_op(op);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(nargs);
  c10::SmallVector<c10::IValue, 8> original(first, stack->end());
  c10::SmallVector<c10::IValue, 8> host(nargs);
  if (!writes_metadata_only(op)) {
    for (size_t i = 0; i < nargs; ++i) {
      const c10::AliasInfo* a = schema.arguments()[i].alias_info();
      if (a && a->isWrite()) materialize(original[i]);
    }
  }
  Call call;
  for (size_t i = 0; i < nargs; ++i) host[i] = call.to_host(original[i]);
  call.check_devices(op);
  for (size_t i = 0; i < nargs; ++i) first[i] = host[i];

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  call.sync_resized();
  for (size_t i = 0; i < nargs; ++i) {  // mutated arguments take the host side's storage and view
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (!a || !a->isWrite()) continue;
    if (original[i].isTensor()) {
      call.sync_argument(original[i].toTensor(), host[i].toTensor());
    } else if (original[i].isTensorList()) {
      auto o = original[i].toTensorList(), h = host[i].toTensorList();
      for (size_t j = 0; j < o.size(); ++j) call.sync_argument(o.get(j), h.get(j));
    }
  }
  const auto& returns = schema.returns();
  auto out = stack->end() - static_cast<std::ptrdiff_t>(returns.size());
  for (size_t j = 0; j < returns.size(); ++j) call.count_output_refs(out[j]);
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::AliasInfo* r = returns[j].alias_info();
    int arg = r && r->isWrite() ? aliased_argument(schema, r) : -1;
    // NOTE: in-place and out= ops return the caller's own objects, as on any device. A view
    // whose schema marks its input written (prims::as_strided(Tensor(a!) a) -> Tensor(a!))
    // returns a new tensor, not its argument: that one is mapped back as a view like any other.
    bool same = arg >= 0 && out[j].isTensor() && host[arg].isTensor() &&
                out[j].toTensor().unsafeGetTensorImpl() == host[arg].toTensor().unsafeGetTensorImpl();
    bool returns_argument = arg >= 0 && (same || !out[j].isTensor());
    out[j] = returns_argument ? original[arg] : call.to_device(out[j]);
  }
}

std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static std::vector<std::unique_ptr<torch::Library>> libs;  // registrations live while these do
  return libs;
}

// Autocast (torch.autocast("edref")): PyTorch registers its cast policies per device key and
// none for PrivateUse1, so a device registers its own. edref takes the op lists PyTorch
// keeps for backends to share (CUDA's, XPU's and MPS's policies), and lets every other op
// fall through, as CUDA does.
void register_autocast(torch::Library& fallthrough, torch::Library& m) {
  using at::IntArrayRef;  // the shared lists name these unqualified (ATen expands them in at::)
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
  fallthrough.fallback(torch::CppFunction::makeFallthrough());
#define EDREF_LOW(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define EDREF_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define EDREF_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define EDREF_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(EDREF_LOW)
  AT_FORALL_FP32(EDREF_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(EDREF_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(EDREF_PROMOTE)
#undef EDREF_LOW
#undef EDREF_FP32
#undef EDREF_FP32_OPT
#undef EDREF_PROMOTE
}

void install_device() {
  c10::SetAllocator(kType, &g_allocator);
  static c10::impl::DeviceGuardImplRegistrar guard(kType, new Guard());
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  auto fallthrough = std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  auto policies = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  register_autocast(*fallthrough, *policies);
  libraries().push_back(std::move(fallthrough));
  libraries().push_back(std::move(policies));
}

}  // namespace

void register_device(const std::vector<std::string>& ops) {
  static std::once_flag once;
  std::call_once(once, install_device);
  // one IMPL block per namespace (aten::, prims::): a block takes only its own namespace's ops
  std::map<std::string, std::unique_ptr<torch::Library>> blocks;
  for (const auto& name : ops) {
    auto sep = name.find("::");
    std::string ns = sep == std::string::npos ? "aten" : name.substr(0, sep);
    auto& lib = blocks[ns];
    if (!lib) lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&forward>());
  }
  for (auto& block : blocks) libraries().push_back(std::move(block.second));
}

at::Tensor host_view(const at::Tensor& t) {
  TORCH_CHECK(is_device(t), "host_view: expected an edref tensor, got one on ", t.device());
  // NOTE: the host storage points at the device storage's memory and holds a reference to
  // that storage, so the memory outlives every view; it is not resizable (a resize would
  // leave the device storage behind).
  auto* keep = new c10::Storage(t.storage());
  void* data = keep->unsafeGetStorageImpl()->data_ptr().get();
  c10::DataPtr ptr(data, keep, [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, kHost);
  auto host = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), keep->nbytes(), std::move(ptr), nullptr, /*resizable=*/false);
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(std::move(host)), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  copy_view_metadata(out.unsafeGetTensorImpl(), t);
  return out;
}

std::map<std::string, int64_t> op_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_log;
}

void op_log_clear() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log.clear();
}

void set_logging(bool on) { g_logging.store(on); }

}  // namespace eagerdecomp::refdev
