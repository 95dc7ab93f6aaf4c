// The attention options as astrai_jit._C takes them: one argument, `options`, a tuple laid out
// as kOptionFields below. The Python op table (_library._PACKED_OPTIONS) packs the same names in
// the same order, and python/tests/test_marshalling.py holds the two together (names, order,
// kinds, defaults), so an option is added as one row here and one there: no extension signature
// and no marshalling code changes. A shorter tuple leaves the trailing options at their defaults,
// so a caller written before an option existed keeps working. Included once, by
// astrai_jit_ext.cpp, after tensor_args.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "tensor_args.hpp"

namespace {

enum class OptionKind {
  scale,     // the softmax scale (each Args struct's own `scale`; <= 0 means 1/sqrt(head_dim))
  real,      // a float field of astrai::AttentionOptions
  integer,   // an int field of astrai::AttentionOptions
  flag,      // a bool field of astrai::AttentionOptions
  per_head,  // an f32 [n_heads] tensor; its data fills a pointer field of astrai::AttentionOptions
  kv_scale,  // an FP8 cache's K or V scale, read with the cache's format (set_kv_format)
  q_scale,   // FP8 attention's q scale: an f32 tensor, [] or [1], or [n_heads] (one per query head)
};

// One row of the pack: its name (the Python table's), what it is, and the field it sets. The
// member pointers make the rows data: reading, checking and filling the Args are one loop each.
struct OptionField {
  const char* name;
  OptionKind kind;
  float astrai::AttentionOptions::*real = nullptr;
  int astrai::AttentionOptions::*integer = nullptr;
  const float* astrai::AttentionOptions::*per_head = nullptr;
  bool astrai::AttentionOptions::*flag = nullptr;
};

constexpr OptionField softmax_scale(const char* name) { return {name, OptionKind::scale}; }
constexpr OptionField real_option(const char* name, float astrai::AttentionOptions::*field) {
  return {name, OptionKind::real, field};
}
constexpr OptionField int_option(const char* name, int astrai::AttentionOptions::*field) {
  return {name, OptionKind::integer, nullptr, field};
}
constexpr OptionField per_head_option(const char* name, const float* astrai::AttentionOptions::*field) {
  return {name, OptionKind::per_head, nullptr, nullptr, field};
}
constexpr OptionField flag_option(const char* name, bool astrai::AttentionOptions::*field) {
  return {name, OptionKind::flag, nullptr, nullptr, nullptr, field};
}
constexpr OptionField kv_scale_option(const char* name) { return {name, OptionKind::kv_scale}; }
constexpr OptionField q_scale_option(const char* name) { return {name, OptionKind::q_scale}; }

// The pack, in order. New options go at the end (a shorter pack then still reads as before).
constexpr OptionField kOptionFields[] = {
    softmax_scale("scale"),
    real_option("logit_cap", &astrai::AttentionOptions::logit_cap),
    per_head_option("sinks", &astrai::AttentionOptions::sinks),
    int_option("window_left", &astrai::AttentionOptions::window_left),
    kv_scale_option("k_scale"),
    kv_scale_option("v_scale"),
    per_head_option("alibi_slopes", &astrai::AttentionOptions::alibi_slopes),
    q_scale_option("q_scale"),
    flag_option("p_fp16", &astrai::AttentionOptions::p_fp16),
};
constexpr std::size_t kOptionCount = sizeof(kOptionFields) / sizeof(kOptionFields[0]);

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// A row's index by name, at compile time (kOptionCount when there is none).
constexpr std::size_t option_index(const char* name) {
  for (std::size_t i = 0; i < kOptionCount; ++i)
    if (same_name(kOptionFields[i].name, name)) return i;
  return kOptionCount;
}

// The rows the KV format reads by name; the rest are read by kind.
constexpr std::size_t kKScale = option_index("k_scale");
constexpr std::size_t kVScale = option_index("v_scale");
constexpr std::size_t kQScale = option_index("q_scale");
static_assert(kKScale < kOptionCount && kVScale < kOptionCount, "the KV format reads k_scale and v_scale");
static_assert(kQScale < kOptionCount, "FP8 attention reads q_scale");

// One call's options as read from its pack: the scalars in an AttentionOptions (copied into the
// Args with the other options), the tensors by row (checked once the call's shapes are known).
struct AttentionOptionArgs {
  float scale = 0.f;
  astrai::AttentionOptions scalars;
  std::array<Opt<Input>, kOptionCount> tensors;

  const Opt<Input>& k_scale() const { return tensors[kKScale]; }
  const Opt<Input>& v_scale() const { return tensors[kVScale]; }
  const Opt<Input>& q_scale() const { return tensors[kQScale]; }
};

// The name of a value's type, as the Python wrappers' TypeErrors spell it.
std::string value_type_name(nb::handle value) {
  nb::object name = nb::getattr(value.type(), "__name__", nb::none());
  return nb::isinstance<nb::str>(name) ? nb::borrow<nb::str>(name).c_str() : "object";
}

// Reads the pack of `call` (a TypeError names the option, its value's type and what is allowed).
AttentionOptionArgs read_options(const char* call, const nb::tuple& pack) {
  AttentionOptionArgs o;
  const std::size_t given = pack.size();
  if (given > kOptionCount) {
    std::string names;
    for (const OptionField& f : kOptionFields) names += std::string(names.empty() ? "" : ", ") + f.name;
    throw nb::type_error((std::string(call) + ": options has " + std::to_string(given) + " values (allowed: at most " +
                          std::to_string(kOptionCount) + ": " + names + ")").c_str());
  }
  std::size_t i = 0;
  for (nb::handle value : pack) {
    const OptionField& f = kOptionFields[i];
    const char* allowed = nullptr;
    switch (f.kind) {
      case OptionKind::scale:
      case OptionKind::real: {
        double number = 0.0;
        if (!nb::try_cast(value, number)) {
          allowed = "a float";
          break;
        }
        (f.kind == OptionKind::scale ? o.scale : o.scalars.*f.real) = static_cast<float>(number);
        break;
      }
      case OptionKind::integer:
        if (!nb::try_cast(value, o.scalars.*f.integer)) allowed = "an int";
        break;
      case OptionKind::flag:
        if (!nb::isinstance<nb::bool_>(value)) {
          allowed = "a bool";
          break;
        }
        o.scalars.*f.flag = nb::cast<bool>(value);
        break;
      case OptionKind::per_head:
      case OptionKind::kv_scale:
      case OptionKind::q_scale:
        if (value.is_none()) break;
        if (!o.tensors[i].emplace().read(value)) allowed = "a tensor, or None";
        break;
    }
    if (allowed != nullptr)
      throw nb::type_error((std::string(call) + ": " + f.name + " is a " + value_type_name(value) + " (allowed: " +
                            allowed + ")").c_str());
    ++i;
  }
  return o;
}

// The options into the Args, by row: the scalars as read (the runtime checks their values), each
// per-head tensor after its shape checks. The KV scales were read with the cache.
template <typename Args>
void set_features(Checker& c, Args& a, const AttentionOptionArgs& o) {
  astrai::AttentionOptions& options = a;
  a.scale = o.scale;
  for (std::size_t i = 0; i < kOptionCount; ++i) {
    const OptionField& f = kOptionFields[i];
    if (f.kind == OptionKind::real) {
      options.*f.real = o.scalars.*f.real;
    } else if (f.kind == OptionKind::integer) {
      options.*f.integer = o.scalars.*f.integer;
    } else if (f.kind == OptionKind::flag) {
      options.*f.flag = o.scalars.*f.flag;
    } else if (f.kind == OptionKind::per_head && o.tensors[i]) {
      const Input& t = *o.tensors[i];
      c.rank(f.name, t, 1, "[n_heads]");
      c.dtype(f.name, t, Kind::float32);
      c.dim(f.name, t, 0, a.n_heads, "n_heads of q");
      c.contiguous(f.name, t);
      options.*f.per_head = static_cast<const float*>(t.data());
    } else if (f.kind == OptionKind::q_scale && o.tensors[i]) {
      // One scale ([] or [1]) or one per query head; only with FP8 attention (the call read
      // q's dtype into qkv_dtype first).
      const Input& t = *o.tensors[i];
      if (options.qkv_dtype == astrai::KvDType::same)
        c.fail(std::string(f.name) + " is given but q is not float8_e4m3fn (allowed: None; q_scale scales FP8 "
               "attention's q, k and v: prefill with float8_e4m3fn q, k and v)");
      c.rank(f.name, t, t.ndim() <= 1 ? t.ndim() : 1, "[] or [1] for one scale, or [n_heads]");
      c.dtype(f.name, t, Kind::float32);
      const std::int64_t count = t.ndim() == 0 ? 1 : static_cast<std::int64_t>(t.shape(0));
      if (count != 1) c.dim(f.name, t, 0, a.n_heads, "n_heads of q, or 1 for one scale");
      c.contiguous(f.name, t);
      options.q_scale = static_cast<const float*>(t.data());
      options.q_scale_per_head = count > 1;
    }
  }
}

// What every attention call does last: the options, the runtime's own checks, the devices, the
// stream.
template <typename Args>
void finish_attention_args(Checker& c, Args& a, const Input& q, const AttentionOptionArgs& o,
                           Opt<std::uintptr_t> stream) {
  set_features(c, a, o);
  astrai::validate_args(a);
  c.devices();
  a.stream = launch_stream(c.call(), stream, q);
}

// The table as Python sees it, for the drift test: (name, schema kind, default) a row, the kind
// spelled as the op table's schemas spell it and the default as a shorter pack leaves it.
nb::list option_fields() {
  const AttentionOptionArgs defaults;
  nb::list rows;
  for (const OptionField& f : kOptionFields) {
    switch (f.kind) {
      case OptionKind::scale: rows.append(nb::make_tuple(f.name, "float", defaults.scale)); break;
      case OptionKind::real: rows.append(nb::make_tuple(f.name, "float", defaults.scalars.*f.real)); break;
      case OptionKind::integer: rows.append(nb::make_tuple(f.name, "int", defaults.scalars.*f.integer)); break;
      case OptionKind::flag: rows.append(nb::make_tuple(f.name, "bool", defaults.scalars.*f.flag)); break;
      case OptionKind::per_head:
      case OptionKind::kv_scale:
      case OptionKind::q_scale: rows.append(nb::make_tuple(f.name, "Tensor?", nb::none())); break;
    }
  }
  return rows;
}

}  // namespace
