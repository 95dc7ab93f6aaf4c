#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "runtime/compile_plan.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_family.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/support.hpp"

using astrai::DType;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::kernel_families;
using astrai::detail::KernelFamily;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::testing::TempDir;

namespace {

// A valid spec of `family` at its first default warm shape.
KernelSpec default_spec(const KernelFamily& family, const std::string& arch) {
  KernelSpec spec;
  spec.kind = family.kind;
  spec.dtype = DType::fp16;
  spec.head_dim = family.warm.shapes.front().first;
  spec.group_size = family.warm.shapes.front().second;
  spec.page_size = family.paged ? family.warm.page_sizes.back() : 0;
  spec.arch = arch;
  return spec;
}

}  // namespace

TEST_SUITE("kernel_family") {

TEST_CASE("the family table lists every kind once, in kind order, with distinct names") {
  std::set<std::string> names;
  for (std::size_t i = 0; i < kernel_families().size(); ++i) {
    const KernelFamily& family = *kernel_families()[i];
    CAPTURE(family.name);
    CHECK(static_cast<std::size_t>(family.kind) == i);
    CHECK(&astrai::detail::kernel_family(family.kind) == &family);
    CHECK(astrai::detail::find_kernel_family(family.name) == &family);
    CHECK(names.insert(family.name).second);
  }
  CHECK(names == std::set<std::string>{"paged_decode", "rotary_emb", "decode", "prefill", "paged_prefill",
                                       "merge_states", "mla_decode"});
  CHECK(astrai::detail::find_kernel_family("attention") == nullptr);
}

TEST_CASE("every family's default warm shapes are valid specs whose names parse back") {
  for (const KernelFamily* family : kernel_families()) {
    CAPTURE(family->name);
    REQUIRE_FALSE(family->warm.shapes.empty());
    CHECK(family->paged == !family->warm.page_sizes.empty());
    CHECK(family->grouped == !family->warm.groups.empty());
    for (const auto& [head_dim, group] : family->warm.shapes) {
      for (int page_size : family->paged ? family->warm.page_sizes : std::vector<int>{0}) {
        KernelSpec spec = default_spec(*family, "sm_90a");
        spec.head_dim = head_dim;
        spec.group_size = group;
        spec.page_size = page_size;
        CAPTURE(spec.name());
        CHECK_NOTHROW(spec.validate());
        CHECK(KernelSpec::parse(spec.name()) == spec);
        CHECK(spec.main_file() == family->main_file);
      }
    }
  }
}

TEST_CASE("variant names carry exactly the fields their family declares") {
  const std::vector<std::pair<KernelKind, std::string>> cases = {
      {KernelKind::paged_decode, "paged_decode.fp16.hd64.ps16.g6.sm_90a"},
      {KernelKind::rotary_emb, "rotary_emb.fp16.hd64.sm_90a"},
      {KernelKind::decode, "decode.fp16.hd64.g6.sm_90a"},
      {KernelKind::prefill, "prefill.fp16.hd64.g6.sm_90a"},
      {KernelKind::paged_prefill, "paged_prefill.fp16.hd64.ps16.g6.sm_90a"},
      {KernelKind::merge_states, "merge_states.fp16.hd64.sm_90a"},
      {KernelKind::mla_decode, "mla_decode.fp16.hd576.ps64.g16.sm_90a"},
  };
  for (const auto& [kind, name] : cases) {
    CHECK(default_spec(astrai::detail::kernel_family(kind), "sm_90a").name() == name);
  }
}

TEST_CASE("the compile request of a spec carries its family's sources, instantiations and target") {
  for (const KernelFamily* family : kernel_families()) {
    const KernelSpec spec = default_spec(*family, "sm_89");
    CAPTURE(spec.name());
    const auto request = astrai::detail::compile_request(spec);
    CHECK(request.variant_name == spec.name());
    CHECK(request.main_file == family->main_file);
    CHECK(request.name_expressions == spec.instantiations());
    CHECK(request.options == spec.compile_options());
    CHECK(request.arch == "sm_89");
    CHECK_FALSE(request.emit_ptx_only);
    bool has_main = false;
    for (const auto& [name, text] : request.headers) has_main = has_main || name == family->main_file;
    CHECK(has_main);
    // The engine's key is the key of this very request.
    TempDir dir;
    EnvConfig config;
    config.cache_dir = dir.path();
    JitEngine engine(config);
    CHECK(engine.key_for(spec) ==
          astrai::detail::compile_request_key(request, astrai::detail::nvrtc_version()));
  }
  KernelSpec ptx = default_spec(astrai::detail::rotary_emb_family(), "compute_90");
  CHECK(astrai::detail::compile_request(ptx).emit_ptx_only);
}

TEST_CASE("the strict-mode hint names the warm flags of every family") {
  struct Case {
    KernelKind kind;
    std::string command;
  };
  const std::vector<Case> cases = {
      // Portable variants the Hopper kernels also serve: warm would add the .tma or .wgmma twin.
      {KernelKind::paged_decode, "astrai-jit warm --arch sm_90a --kernels paged_decode --dtypes fp16 "
                                 "--head-dims 64 --page-sizes 16 --group-sizes 6 --no-hopper"},
      {KernelKind::rotary_emb, "astrai-jit warm --arch sm_90a --kernels rotary_emb --dtypes fp16 "
                               "--head-dims 64"},
      {KernelKind::decode, "astrai-jit warm --arch sm_90a --kernels decode --dtypes fp16 --head-dims 64 "
                           "--group-sizes 6 --no-hopper"},
      {KernelKind::prefill, "astrai-jit warm --arch sm_90a --kernels prefill --dtypes fp16 --head-dims 64 "
                            "--group-sizes 6 --no-hopper"},
      {KernelKind::paged_prefill, "astrai-jit warm --arch sm_90a --kernels paged_prefill --dtypes fp16 "
                                  "--head-dims 64 --page-sizes 16 --group-sizes 6 --no-hopper"},
      {KernelKind::merge_states, "astrai-jit warm --arch sm_90a --kernels merge_states --dtypes fp16 "
                                 "--head-dims 64"},
      {KernelKind::mla_decode, "astrai-jit warm --arch sm_90a --kernels mla_decode --dtypes fp16 "
                               "--head-dims 576 --page-sizes 64 --group-sizes 16 --no-hopper"},
  };
  TempDir dir;
  EnvConfig config;
  config.cache_dir = dir.path();
  config.strict = true;
  JitEngine strict(config);
  for (const Case& c : cases) {
    const KernelSpec spec = default_spec(astrai::detail::kernel_family(c.kind), "sm_90a");
    CAPTURE(spec.name());
    CHECK(spec.warm_command() == c.command);
    std::string message;
    try {
      strict.get(spec);
    } catch (const astrai::CacheMissError& error) {
      message = error.what();
    }
    CHECK(message.find(spec.name()) != std::string::npos);
    // The command ends the message: nothing after it could change the selection.
    CHECK(message.size() >= c.command.size());
    CHECK(message.compare(message.size() - c.command.size(), c.command.size(), c.command) == 0);
  }
  CHECK(strict.counters().compiles == 0);
}

}  // TEST_SUITE
