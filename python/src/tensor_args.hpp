// The DLPack side of astrai_jit._C: tensor arguments read through DLPack (one C call where the
// framework publishes the exchange API), and the per-call checker that names a bad argument,
// its value and what is allowed. Included once, by astrai_jit_ext.cpp.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "astrai/runtime.hpp"

namespace nb = nanobind;

namespace {

template <typename T>
using Opt = std::optional<T>;

enum class Kind { index, boolean, float32 };

template <typename T>
std::string shape_string(const T& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape(i));
  }
  return s + "]";
}

std::string dtype_string(nb::dlpack::dtype d) {
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    case nb::dlpack::dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
    case nb::dlpack::dtype_code::Float8_E5M2: return "float8_e5m2";
    default: base = "code" + std::to_string(d.code) + "_"; break;
  }
  return base + std::to_string(d.bits);
}

// An attention dtype as the tensors' dtypes are spelled in messages.
const char* torch_dtype_name(astrai::DType d) { return d == astrai::DType::bf16 ? "bfloat16" : "float16"; }

std::string device_string(int type, int id) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda:" + std::to_string(id);
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed:" + std::to_string(id);
    default: return "device type " + std::to_string(type);
  }
}

[[noreturn]] void invalid(const char* call, const std::string& message) {
  throw astrai::InvalidArgument(std::string(call) + ": " + message);
}

// Benchmark mode (python/bench/host_overhead.py --cpu): calls check and convert their arguments
// as usual, accept CPU tensors, and launch nothing, so the host path can be timed without a GPU.
bool host_only = false;

template <typename Args>
void launch(void (astrai::Runtime::*call)(const Args&), const Args& a) {
  if (host_only) return;
  nb::gil_scoped_release release;
  (astrai::Runtime::get().*call)(a);
}

// DLPack's C exchange API (DLPack >= 1.2): a table of C functions that a framework publishes on
// its tensor type as the capsule `__dlpack_c_exchange_api__` named "dlpack_exchange_api"
// (PyTorch 2.11 does). Declared here with the members this module calls; the others stay opaque.
struct DlpackExchangeApi {
  std::uint32_t version_major;
  std::uint32_t version_minor;
  const void* prev_api;
  const void* managed_tensor_allocator;
  const void* managed_tensor_from_py_object_no_sync;
  const void* managed_tensor_to_py_object_no_sync;
  // Fills a DLTensor that views the object's data, shape and strides (no copy, no allocation).
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  // The framework's current stream on a device (for PyTorch, the current CUDA stream).
  int (*current_work_stream)(int device_type, std::int32_t device_id, void** out_stream);
};

// The exchange API fills a DLTensor, whose C layout nanobind's dltensor mirrors.
static_assert(sizeof(nb::dlpack::dltensor) == 48 && offsetof(nb::dlpack::dltensor, shape) == 24,
              "nb::dlpack::dltensor must have DLTensor's layout");

// The exchange API of `type`, or null. The last type that had one is remembered (and kept
// alive, so its address cannot be reused): every tensor of a call is usually of one type.
const DlpackExchangeApi* exchange_api(PyTypeObject* type) {
  static PyTypeObject* last_type = nullptr;
  static const DlpackExchangeApi* last_api = nullptr;
  if (type == last_type) return last_api;
  static PyObject* const name = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  PyObject* capsule = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), name);
  if (!capsule) {
    PyErr_Clear();
    return nullptr;
  }
  auto* api = static_cast<const DlpackExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
  Py_DECREF(capsule);
  if (!api) {
    PyErr_Clear();
    return nullptr;
  }
  if (api->version_major != 1 || !api->dltensor_from_py_object_no_sync || !api->current_work_stream)
    return nullptr;
  // PyTypeObject is opaque under the stable ABI (the cp312-abi3 wheel): cast to PyObject*.
  Py_INCREF(reinterpret_cast<PyObject*>(type));
  Py_XDECREF(reinterpret_cast<PyObject*>(last_type));
  last_type = type;
  last_api = api;
  return api;
}

// One tensor argument for the length of a call: a view of its DLPack description. A tensor whose
// type publishes the exchange API is read through one C call; any other DLPack or buffer-protocol
// object is imported by nb::ndarray (through its __dlpack__, several microseconds a tensor), and
// the import is kept here. An output (kWritable) refuses a read-only import.
template <bool kWritable>
class TensorArg {
 public:
  // False when `object` is not a tensor this module can read (nanobind then raises its TypeError
  // naming the signature).
  bool read(nb::handle object) noexcept {
    if (const DlpackExchangeApi* api = exchange_api(Py_TYPE(object.ptr()))) {
      if (api->dltensor_from_py_object_no_sync(object.ptr(), &view_) == 0 && (view_.strides || view_.ndim == 0)) {
        api_ = api;
        return true;
      }
      PyErr_Clear();  // one the C API cannot describe: __dlpack__ decides
    }
    api_ = nullptr;
    if constexpr (kWritable) {
      nb::ndarray<> writable;
      if (!nb::try_cast(object, writable, false)) return false;
      import_ = nb::ndarray<nb::ro>(writable);
    } else {
      if (!nb::try_cast(object, import_, false)) return false;
    }
    view_ = {};
    view_.data = const_cast<void*>(import_.data());
    view_.device = {import_.device_type(), import_.device_id()};
    view_.ndim = static_cast<std::int32_t>(import_.ndim());
    view_.dtype = import_.dtype();
    view_.shape = const_cast<std::int64_t*>(import_.shape_ptr());
    view_.strides = const_cast<std::int64_t*>(import_.stride_ptr());
    return true;
  }

  std::size_t ndim() const { return static_cast<std::size_t>(view_.ndim); }
  std::size_t shape(std::size_t i) const { return static_cast<std::size_t>(view_.shape[i]); }
  std::int64_t stride(std::size_t i) const { return view_.strides[i]; }
  nb::dlpack::dtype dtype() const { return view_.dtype; }
  int device_type() const { return view_.device.device_type; }
  int device_id() const { return view_.device.device_id; }
  void* data() const { return static_cast<char*>(view_.data) + view_.byte_offset; }
  // The exchange API it was read through (null after a __dlpack__ import).
  const DlpackExchangeApi* api() const { return api_; }

 private:
  nb::dlpack::dltensor view_;
  const DlpackExchangeApi* api_ = nullptr;
  nb::ndarray<nb::ro> import_;
};

using Input = TensorArg<false>;
using Output = TensorArg<true>;

// An index tensor (dtype checked as Kind::index) as the runtime reads it: int32 or int64.
astrai::IndexTable index_table(const Input& t) {
  if (t.dtype().bits == 64) return static_cast<const std::int64_t*>(t.data());
  return static_cast<const std::int32_t*>(t.data());
}

}  // namespace

namespace nanobind::detail {
template <bool kWritable>
struct type_caster<TensorArg<kWritable>> {
  NB_TYPE_CASTER(TensorArg<kWritable>, const_name("ndarray"))
  template <typename Flags>
  bool from_python(handle src, Flags, cleanup_list*) noexcept {
    return value.read(src);
  }
};
}  // namespace nanobind::detail

namespace {

// The stream a call launches on: the handle given, else the current stream of the tensors'
// device as their framework reports it (the current PyTorch stream, one capturing a CUDA graph
// included). Runs after the device check.
template <typename T>
void* launch_stream(const char* call, Opt<std::uintptr_t> stream, const T& t) {
  if (stream) return reinterpret_cast<void*>(*stream);
  if (!t.api())
    invalid(call, "stream None needs the tensors' framework to report its current stream through "
                  "DLPack's C exchange API (allowed: a stream handle)");
  void* current = nullptr;
  if (t.api()->current_work_stream(t.device_type(), t.device_id(), &current) != 0) throw nb::python_error();
  return current;
}

// One call's argument checks. Tensors are recorded as they are checked so the device check,
// which runs last, covers all of them.
class Checker {
 public:
  explicit Checker(const char* call) : call_(call) {}

  // The attention dtype (bf16 / fp16) of `t`; anything else is a TypeError.
  template <typename T>
  astrai::DType attention_dtype(const char* name, const T& t) {
    const nb::dlpack::dtype d = t.dtype();
    const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
    if (d.lanes == 1 && d.bits == 16 && code == nb::dlpack::dtype_code::Bfloat) return astrai::DType::bf16;
    if (d.lanes == 1 && d.bits == 16 && code == nb::dlpack::dtype_code::Float) return astrai::DType::fp16;
    // An FP8 q: FP8 attention is prefill's alone (which reads q's dtype before this).
    type_error(name, d, is_e4m3(d) && std::string(name) == "q"
                            ? "bfloat16, float16; float8_e4m3fn q, k and v are served by prefill and paged_prefill only"
                            : "bfloat16, float16");
  }

  static bool is_e4m3(nb::dlpack::dtype d) {
    return d.lanes == 1 && d.bits == 8 && static_cast<nb::dlpack::dtype_code>(d.code) ==
                                              nb::dlpack::dtype_code::Float8_E4M3FN;
  }

  // The format of a K or V cache: q's dtype, or an FP8 format the kernels dequantize.
  template <typename T>
  astrai::KvDType kv_dtype(const char* name, const T& t, astrai::DType q_dtype) {
    const nb::dlpack::dtype d = t.dtype();
    const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
    if (d.lanes == 1 && d.bits == 8 && code == nb::dlpack::dtype_code::Float8_E4M3FN) return astrai::KvDType::e4m3;
    if (d.lanes == 1 && d.bits == 8 && code == nb::dlpack::dtype_code::Float8_E5M2) return astrai::KvDType::e5m2;
    if (d.lanes == 1 && d.bits == 16 && attention_dtype(name, t) == q_dtype) return astrai::KvDType::same;
    type_error(name, d, q_dtype == astrai::DType::bf16 ? "bfloat16 (the dtype of q), float8_e4m3fn, float8_e5m2"
                                                        : "float16 (the dtype of q), float8_e4m3fn, float8_e5m2");
  }

  // Checks the fixed dtype of an index, mask or LSE tensor.
  template <typename T>
  void dtype(const char* name, const T& t, Kind kind) {
    const nb::dlpack::dtype d = t.dtype();
    const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
    const bool scalar = d.lanes == 1;
    switch (kind) {
      case Kind::index:  // index tables are read in place at either width
        if (!(scalar && code == nb::dlpack::dtype_code::Int && (d.bits == 32 || d.bits == 64)))
          type_error(name, d, "int32 or int64");
        return;
      case Kind::boolean:
        if (!(scalar && code == nb::dlpack::dtype_code::Bool && d.bits == 8)) type_error(name, d, "bool");
        return;
      case Kind::float32:
        if (!(scalar && code == nb::dlpack::dtype_code::Float && d.bits == 32)) type_error(name, d, "float32");
        return;
    }
  }

  template <typename T>
  void same_dtype(const char* name, const T& t, astrai::DType expected, const char* reference = "q") {
    if (attention_dtype(name, t) != expected)
      throw nb::type_error((std::string(call_) + ": " + name + " has dtype " + dtype_string(t.dtype()) +
                            " (allowed: " + (expected == astrai::DType::bf16 ? "bfloat16" : "float16") +
                            ", the dtype of " + reference + ")").c_str());
  }

  template <typename T>
  void rank(const char* name, const T& t, std::size_t ndim, const char* layout) {
    if (count_ == tensors_.size())
      throw std::logic_error(std::string(call_) + ": more tensor arguments than Checker has room for");
    tensors_[count_++] = {name, t.device_type(), t.device_id()};
    if (t.ndim() != ndim)
      invalid(call_, std::string(name) + " has shape " + shape_string(t) + " (allowed: " + layout + ")");
  }

  // A caller's scratch buffer (any dtype and shape, contiguous, on the call's device): its bytes.
  template <typename T>
  std::size_t scratch(const char* name, const T& t) {
    if (count_ == tensors_.size())
      throw std::logic_error(std::string(call_) + ": more tensor arguments than Checker has room for");
    tensors_[count_++] = {name, t.device_type(), t.device_id()};
    contiguous(name, t);
    std::size_t elements = 1;
    for (std::size_t k = 0; k < t.ndim(); ++k) elements *= t.shape(k);
    return elements * ((t.dtype().bits + 7u) / 8u);
  }

  // Checks dim `i` of `t` against `expected`, described as `what`.
  template <typename T>
  void dim(const char* name, const T& t, std::size_t i, std::int64_t expected, const char* what) {
    if (static_cast<std::int64_t>(t.shape(i)) != expected)
      invalid(call_, std::string(name) + " has shape " + shape_string(t) + ": dim " + std::to_string(i) +
                         " is " + std::to_string(t.shape(i)) + " (allowed: " + std::to_string(expected) +
                         ", " + what + ")");
  }

  template <typename T, typename R>
  void same_shape(const char* name, const T& t, const char* ref_name, const R& ref) {
    bool same = t.ndim() == ref.ndim();
    for (std::size_t i = 0; same && i < t.ndim(); ++i) same = t.shape(i) == ref.shape(i);
    if (!same)
      invalid(call_, std::string(name) + " has shape " + shape_string(t) + " (allowed: " + shape_string(ref) +
                         ", the shape of " + ref_name + ")");
  }

  // Stride of dim `i` in elements, for a runtime that reads 0 as "contiguous": a dim of size 1
  // is never stepped over, so it gets the contiguous value; a broadcast (stride 0) or negative
  // stride over a real dim is refused.
  template <typename T>
  std::int64_t stride(const char* name, const T& t, std::size_t i) {
    std::int64_t natural = 1;
    for (std::size_t j = i + 1; j < t.ndim(); ++j) natural *= static_cast<std::int64_t>(t.shape(j));
    if (t.shape(i) <= 1) return natural > 0 ? natural : 1;
    const std::int64_t s = t.stride(i);
    if (s <= 0)
      invalid(call_, std::string(name) + " has stride " + std::to_string(s) + " in dim " + std::to_string(i) +
                         " (allowed: a positive stride; broadcast or flipped views need .contiguous())");
    return s;
  }

  // The innermost dim must be contiguous (the kernels load it in vectors).
  template <typename T>
  void unit_last(const char* name, const T& t) {
    const std::size_t last = t.ndim() - 1;
    if (t.shape(last) > 1 && t.stride(last) != 1)
      invalid(call_, std::string(name) + " has stride " + std::to_string(t.stride(last)) +
                         " in its last dim (allowed: 1, the innermost dim must be contiguous)");
  }

  // Every stride must match a C-contiguous layout (for arguments that take no strides).
  template <typename T>
  void contiguous(const char* name, const T& t) {
    std::int64_t expected = 1;
    for (std::size_t k = t.ndim(); k-- > 0;) {
      if (t.shape(k) > 1 && t.stride(k) != expected)
        invalid(call_, std::string(name) + " is not contiguous (allowed: a contiguous tensor; call .contiguous())");
      expected *= static_cast<std::int64_t>(t.shape(k));
    }
  }

  const char* call() const { return call_; }
  [[noreturn]] void fail(const std::string& what) { invalid(call_, what); }

  // Runs last: every tensor on one CUDA device.
  void devices() {
    if (count_ == 0) return;
    const Seen& first = tensors_[0];
    for (std::size_t i = 1; i < count_; ++i) {
      const Seen& seen = tensors_[i];
      if (seen.type != first.type || seen.id != first.id)
        invalid(call_, std::string(seen.name) + " is on " + device_string(seen.type, seen.id) + " but " +
                           first.name + " is on " + device_string(first.type, first.id) +
                           " (allowed: every tensor on one CUDA device)");
    }
    if (first.type != nb::device::cuda::value && !(host_only && first.type == nb::device::cpu::value))
      invalid(call_, std::string(first.name) + " is on " + device_string(first.type, first.id) +
                         " (allowed: a CUDA device)");
  }

 private:
  struct Seen {
    const char* name;
    int type;
    int id;
  };

  [[noreturn]] void type_error(const char* name, nb::dlpack::dtype d, const char* allowed) {
    throw nb::type_error((std::string(call_) + ": " + name + " has dtype " + dtype_string(d) +
                          " (allowed: " + allowed + ")").c_str());
  }

  const char* call_;
  // Room for the call with the most tensors (paged_decode: 14), so checking allocates nothing.
  std::array<Seen, 32> tensors_;
  std::size_t count_ = 0;
};

int as_int(const char* call, const char* what, std::size_t value) {
  if (value > 0x7fffffffULL) invalid(call, std::string(what) + " " + std::to_string(value) + " is too large");
  return static_cast<int>(value);
}

// The K and V scales of FP8 K and V (`fp8`: an FP8 cache, or FP8 attention's k and v): f32, one
// ([] or [1]) or one per KV head ([n_kv_heads]), the same shape for K and V; a missing scale
// with FP8, or a scale without, is refused by name.
template <typename Args>
void set_kv_scales(Checker& c, Args& a, bool fp8, const char* k_name, const Input& k, const Opt<Input>& k_scale,
                   const Opt<Input>& v_scale) {
  const Opt<Input>* scales[2] = {&k_scale, &v_scale};
  const char* names[2] = {"k_scale", "v_scale"};
  for (int i = 0; i < 2; ++i) {
    if (!fp8 && *scales[i])
      c.fail(std::string(names[i]) + " is given but " + k_name + " has dtype " + dtype_string(k.dtype()) +
             " (allowed: scales with a float8_e4m3fn or float8_e5m2 cache only)");
    if (fp8 && !*scales[i])
      c.fail(std::string(k_name) + " has dtype " + dtype_string(k.dtype()) + " but " + names[i] +
             " is missing (allowed: an f32 scale, [] or [1], or [n_kv_heads])");
  }
  std::int64_t counts[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    if (!*scales[i]) continue;
    const Input& scale = **scales[i];
    const char* layout = "[] or [1] for one scale, or [n_kv_heads]";
    c.rank(names[i], scale, scale.ndim() <= 1 ? scale.ndim() : 1, layout);
    c.dtype(names[i], scale, Kind::float32);
    counts[i] = scale.ndim() == 0 ? 1 : static_cast<std::int64_t>(scale.shape(0));
    if (counts[i] != 1) c.dim(names[i], scale, 0, a.n_kv_heads, "n_kv_heads, or 1 for one scale");
    c.contiguous(names[i], scale);
  }
  if (k_scale && v_scale && counts[0] != counts[1])
    c.fail("v_scale has " + std::to_string(counts[1]) + " values but k_scale has " + std::to_string(counts[0]) +
           " (allowed: one scale each, or one per KV head each)");
  if (k_scale) a.k_scale = static_cast<const float*>(k_scale->data());
  if (v_scale) a.v_scale = static_cast<const float*>(v_scale->data());
  a.kv_scale_per_head = counts[0] > 1 || counts[1] > 1;
}

// The cache format from K and V (the same for both), and the FP8 scales (set_kv_scales).
template <typename Args>
void set_kv_format(Checker& c, Args& a, const char* k_name, const Input& k, const char* v_name, const Input& v,
                   const Opt<Input>& k_scale, const Opt<Input>& v_scale) {
  a.kv_dtype = c.kv_dtype(k_name, k, a.dtype);
  if (c.kv_dtype(v_name, v, a.dtype) != a.kv_dtype)
    throw nb::type_error((std::string(c.call()) + ": " + v_name + " has dtype " + dtype_string(v.dtype()) +
                          " (allowed: " + dtype_string(k.dtype()) + ", the dtype of " + k_name + ")").c_str());
  set_kv_scales(c, a, a.kv_dtype != astrai::KvDType::same, k_name, k, k_scale, v_scale);
}

// FP8 attention's K and V (a.qkv_dtype e4m3, read from q first): both e4m3, with q_scale given
// (checked here, after k's and v's dtypes, so that the scales are named in order; set_features
// reads it) and k_scale and v_scale.
template <typename Args>
void set_fp8_attention_kv(Checker& c, Args& a, const char* k_name, const Input& k, const char* v_name,
                          const Input& v, const Opt<Input>& k_scale, const Opt<Input>& v_scale, bool has_q_scale) {
  for (const auto& [name, t] : {std::pair{k_name, &k}, std::pair{v_name, &v}})
    if (!Checker::is_e4m3(t->dtype()))
      throw nb::type_error((std::string(c.call()) + ": " + name + " has dtype " + dtype_string(t->dtype()) +
                            " (allowed: float8_e4m3fn, the dtype of q: FP8 attention takes q, k and v in e4m3)")
                               .c_str());
  if (!has_q_scale)
    c.fail("q has dtype float8_e4m3fn but q_scale is missing (allowed: an f32 scale, [] or [1], or [n_heads])");
  set_kv_scales(c, a, true, k_name, k, k_scale, v_scale);
}

// A paged K/V cache pair, [num_pages, page_size, n_kv_heads, head_dim] each (q's head_dim, read
// into `a` first): its shape into num_pages, page_size and n_kv_heads, its format and scales,
// its pointers and strides. With FP8 attention (a.qkv_dtype e4m3) the cache is e4m3 as q is.
template <typename Args>
void set_paged_cache(Checker& c, Args& a, const Input& k_cache, const Input& v_cache, const Opt<Input>& k_scale,
                     const Opt<Input>& v_scale, bool has_q_scale = false) {
  const char* kLayout = "[num_pages, page_size, n_kv_heads, head_dim]";
  c.rank("k_cache", k_cache, 4, kLayout);
  c.rank("v_cache", v_cache, 4, kLayout);
  a.num_pages = as_int(c.call(), "num_pages", k_cache.shape(0));
  a.page_size = as_int(c.call(), "page_size", k_cache.shape(1));
  a.n_kv_heads = as_int(c.call(), "n_kv_heads", k_cache.shape(2));
  if constexpr (std::is_same_v<Args, astrai::PagedPrefillArgs>) {
    if (a.qkv_dtype == astrai::KvDType::e4m3)
      set_fp8_attention_kv(c, a, "k_cache", k_cache, "v_cache", v_cache, k_scale, v_scale, has_q_scale);
    else
      set_kv_format(c, a, "k_cache", k_cache, "v_cache", v_cache, k_scale, v_scale);
  } else {
    set_kv_format(c, a, "k_cache", k_cache, "v_cache", v_cache, k_scale, v_scale);
  }
  c.dim("k_cache", k_cache, 3, a.head_dim, "head_dim of q");
  c.same_shape("v_cache", v_cache, "k_cache", k_cache);
  c.unit_last("k_cache", k_cache);
  c.unit_last("v_cache", v_cache);
  a.k_cache = k_cache.data();
  a.k_stride_page = c.stride("k_cache", k_cache, 0);
  a.k_stride_token = c.stride("k_cache", k_cache, 1);
  a.k_stride_head = c.stride("k_cache", k_cache, 2);
  a.v_cache = v_cache.data();
  a.v_stride_page = c.stride("v_cache", v_cache, 0);
  a.v_stride_token = c.stride("v_cache", v_cache, 1);
  a.v_stride_head = c.stride("v_cache", v_cache, 2);
}

// What contiguous K and V may be: an FP8 cache beside a 16-bit q (decode), or q's dtype (prefill),
// where e4m3 q, k and v together are FP8 attention (a.qkv_dtype, read from q first).
enum class ContiguousKv { fp8_cache, q_dtype };

// Contiguous K and V, [batch, kv_len, n_kv_heads, head_dim] each (q's batch and head_dim read
// into `a` first): kv_len and n_kv_heads, pointers and strides, and with FP8 the scales k_scale
// and v_scale (FP8 attention's q_scale is checked for here too, after k's and v's dtypes, so that
// the scales are named in order; set_features reads it).
template <typename Args>
void set_contiguous_kv(Checker& c, Args& a, const Input& k, const Input& v, ContiguousKv kind,
                       const Opt<Input>& k_scale, const Opt<Input>& v_scale, bool has_q_scale = false) {
  const char* kLayout = "[batch, kv_len, n_kv_heads, head_dim]";
  c.rank("k", k, 4, kLayout);
  c.rank("v", v, 4, kLayout);
  a.kv_len = as_int(c.call(), "kv_len", k.shape(1));
  a.n_kv_heads = as_int(c.call(), "n_kv_heads", k.shape(2));
  if (kind == ContiguousKv::fp8_cache) {
    set_kv_format(c, a, "k", k, "v", v, k_scale, v_scale);
  } else if (a.qkv_dtype == astrai::KvDType::e4m3) {
    set_fp8_attention_kv(c, a, "k", k, "v", v, k_scale, v_scale, has_q_scale);
  } else {
    for (const auto& [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}})
      if (Checker::is_e4m3(t->dtype()))
        throw nb::type_error((std::string(c.call()) + ": " + name + " has dtype float8_e4m3fn but q has dtype " +
                              torch_dtype_name(a.dtype) + " (allowed: " + torch_dtype_name(a.dtype) +
                              ", the dtype of q; or float8_e4m3fn q, k and v together, FP8 attention)").c_str());
    for (const auto& [name, scale] : {std::pair{"k_scale", &k_scale}, std::pair{"v_scale", &v_scale}})
      if (*scale)
        c.fail(std::string(name) + " is given but q has dtype " + torch_dtype_name(a.dtype) + " (allowed: None; "
               "scales come with float8_e4m3fn q, k and v, FP8 attention)");
    c.same_dtype("k", k, a.dtype);
    c.same_dtype("v", v, a.dtype);
  }
  c.dim("k", k, 0, a.batch, "batch of q");
  c.dim("k", k, 3, a.head_dim, "head_dim of q");
  c.same_shape("v", v, "k", k);
  c.unit_last("k", k);
  c.unit_last("v", v);
  a.k = k.data();
  a.k_stride_batch = c.stride("k", k, 0);
  a.k_stride_seq = c.stride("k", k, 1);
  a.k_stride_head = c.stride("k", k, 2);
  a.v = v.data();
  a.v_stride_batch = c.stride("v", v, 0);
  a.v_stride_seq = c.stride("v", v, 1);
  a.v_stride_head = c.stride("v", v, 2);
}

// One dimension an output must have: its size and where that size comes from ("n_heads of q").
struct ExpectedDim {
  std::int64_t size;
  const char* what;
};

// The optional f32 LSE output: `dims` in order, contiguous.
inline float* lse_pointer(Checker& c, const Opt<Output>& lse, const char* layout,
                          std::initializer_list<ExpectedDim> dims) {
  if (!lse) return nullptr;
  c.rank("lse", *lse, dims.size(), layout);
  c.dtype("lse", *lse, Kind::float32);
  std::size_t i = 0;
  for (const ExpectedDim& dim : dims) c.dim("lse", *lse, i++, dim.size, dim.what);
  c.contiguous("lse", *lse);
  return static_cast<float*>(lse->data());
}

}  // namespace
