#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "runtime/kernel_family.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/specs.hpp"

using astrai::DType;
using astrai::detail::arch_number;
using astrai::detail::kernel_source;
using astrai::detail::kernel_source_closure;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::testing::paged_decode_spec;
using astrai::testing::rotary_spec;

namespace {

bool same_fields(const KernelSpec& a, const KernelSpec& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.head_dim == b.head_dim &&
         a.page_size == b.page_size && a.group_size == b.group_size && a.flags == b.flags &&
         a.force_no_mma == b.force_no_mma && a.arch == b.arch;
}

std::size_t count_of(const std::vector<std::string>& items, const std::string& value) {
  return static_cast<std::size_t>(std::count(items.begin(), items.end(), value));
}

// The message of the InvalidArgument that validate() throws, or "" when it accepts the spec.
std::string validate_message(const KernelSpec& spec) {
  try {
    spec.validate();
  } catch (const astrai::InvalidArgument& error) {
    return error.what();
  }
  return "";
}

// Quoted include targets of one source text, found line by line without regular expressions.
std::vector<std::string> quoted_includes(const std::string& text) {
  std::vector<std::string> found;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] != '#') continue;
    std::size_t pos = line.find_first_not_of(" \t", first + 1);
    if (pos == std::string::npos || line.compare(pos, 7, "include") != 0) continue;
    pos = line.find_first_not_of(" \t", pos + 7);
    if (pos == std::string::npos || line[pos] != '"') continue;
    const std::size_t close = line.find('"', pos + 1);
    if (close != std::string::npos) found.push_back(line.substr(pos + 1, close - pos - 1));
  }
  return found;
}

std::set<std::string> transitive_includes(const std::string& main_file) {
  std::set<std::string> seen;
  std::vector<std::string> todo = {main_file};
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    if (!seen.insert(name).second) continue;
    for (const auto& child : quoted_includes(std::string(kernel_source(name)))) todo.push_back(child);
  }
  return seen;
}

}  // namespace

TEST_SUITE("kernel_spec") {

TEST_CASE("variant names follow the pinned dotted format") {
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a").name() == "paged_decode.bf16.hd128.ps16.g4.sm_90a");
  CHECK(paged_decode_spec(DType::fp16, 64, 1, 1, "sm_80").name() == "paged_decode.fp16.hd64.ps1.g1.sm_80");
  CHECK(paged_decode_spec(DType::bf16, 256, 256, 128, "sm_75").name() ==
        "paged_decode.bf16.hd256.ps256.g128.sm_75");
  CHECK(rotary_spec(DType::fp16, 64, "sm_89").name() == "rotary_emb.fp16.hd64.sm_89");
  CHECK(rotary_spec(DType::bf16, 512, "compute_90").name() == "rotary_emb.bf16.hd512.compute_90");
}

TEST_CASE("a compute_ target names itself and selects kernels by its number, never the Hopper ones") {
  // ASTRAI_JIT_ARCH=compute_80 on an H200: the sm_80 code path, PTX the driver finishes.
  const KernelSpec fp8 = KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.kv_e4m3.compute_80");
  CHECK(fp8.arch == "compute_80");
  CHECK(fp8.uses_mma());
  CHECK(fp8.warm_command().find("--arch compute_80 ") != std::string::npos);
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "compute_80", true).name() ==
        "paged_decode.bf16.hd128.ps16.g4.nomma.compute_80");
  CHECK_FALSE(paged_decode_spec(DType::bf16, 128, 16, 4, "compute_75").uses_mma());
  // Hopper kernels exist only for the sm_90a cubin target, not for compute_90a PTX.
  KernelSpec prefill = astrai::testing::make_spec(KernelKind::prefill, DType::bf16, 128, 0, 4, "sm_90a");
  CHECK(astrai::detail::hopper_serves(prefill));
  for (const char* arch : {"compute_90a", "compute_90", "sm_90"}) {
    CAPTURE(arch);
    prefill.arch = arch;
    CHECK_FALSE(astrai::detail::hopper_serves(prefill));
    CHECK(prefill.warm_command().find("wgmma") == std::string::npos);
    KernelSpec wgmma = prefill;
    wgmma.hopper = true;
    CHECK_THROWS_AS(wgmma.validate(), astrai::InvalidArgument);
  }
}

TEST_CASE("a forced CUDA-core variant carries the nomma field before the arch") {
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a", true).name() ==
        "paged_decode.bf16.hd128.ps16.g4.nomma.sm_90a");
  CHECK(rotary_spec(DType::fp16, 64, "sm_89", true).name() == "rotary_emb.fp16.hd64.nomma.sm_89");
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a", true).name() !=
        paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a", false).name());
}

TEST_CASE("flag bits that name no feature appear as a hex field in the name") {
  KernelSpec spec = paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a");
  spec.flags = 0x3800;
  CHECK(spec.name() == "paged_decode.bf16.hd128.ps16.g4.f3800.sm_90a");
  spec.force_no_mma = true;
  CHECK(spec.name() == "paged_decode.bf16.hd128.ps16.g4.f3800.nomma.sm_90a");
}

TEST_CASE("parse inverts name for many valid specs") {
  std::vector<KernelSpec> specs;
  for (DType dtype : {DType::bf16, DType::fp16}) {
    for (const char* arch : {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120",
                             "compute_90"}) {
      for (bool no_mma : {false, true}) {
        for (int head_dim : {32, 48, 64, 80, 128, 256})
          for (int page_size : {1, 2, 16, 256})
            for (int group : {1, 6, 20, 128})
              specs.push_back(paged_decode_spec(dtype, head_dim, page_size, group, arch, no_mma));
        for (int head_dim : {8, 24, 64, 128, 512}) specs.push_back(rotary_spec(dtype, head_dim, arch, no_mma));
      }
    }
  }
  REQUIRE(specs.size() > 1000);
  std::set<std::string> names;
  for (const auto& spec : specs) {
    const std::string name = spec.name();
    CAPTURE(name);
    const KernelSpec parsed = KernelSpec::parse(name);
    CHECK(same_fields(parsed, spec));
    CHECK(parsed.name() == name);
    CHECK(parsed == spec);
    names.insert(name);
  }
  CHECK(names.size() == specs.size());  // names are unique
}

TEST_CASE("parse rejects malformed names with a message that quotes the text") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "too few fields"},
      {"paged_decode", "too few fields"},
      {"paged_decode.bf16.hd128", "too few fields"},
      {"paged_decode.bf16.hd128.ps16.sm_90a", "too few fields"},
      {"attention.bf16.hd128.ps16.g4.sm_90a", "unknown kernel 'attention'"},
      {"Paged_decode.bf16.hd128.ps16.g4.sm_90a", "unknown kernel 'Paged_decode'"},
      {"paged_decode.f32.hd128.ps16.g4.sm_90a", "unknown dtype 'f32'"},
      {"rotary_emb.BF16.hd64.sm_89", "unknown dtype 'BF16'"},
      {"paged_decode.bf16.h128.ps16.g4.sm_90a", "bad head dim field 'h128'"},
      {"paged_decode.bf16.hd.ps16.g4.sm_90a", "bad head dim field 'hd'"},
      {"paged_decode.bf16.hd12x.ps16.g4.sm_90a", "bad head dim field 'hd12x'"},
      {"paged_decode.bf16.hd-64.ps16.g4.sm_90a", "bad head dim field 'hd-64'"},
      {"rotary_emb.bf16.hd1234567.sm_89", "bad head dim field 'hd1234567'"},
      {"paged_decode.bf16.hd128.p16.g4.sm_90a", "bad page size field 'p16'"},
      {"paged_decode.bf16.hd128.ps.g4.sm_90a", "bad page size field 'ps'"},
      {"paged_decode.bf16.hd128.ps16.group4.sm_90a", "bad group field 'group4'"},
      {"paged_decode.bf16.hd128.ps16.g.sm_90a", "bad group field 'g'"},
      {"rotary_emb.bf16.hd64.fzz.sm_89", "bad flags field 'fzz'"},
      {"rotary_emb.bf16.hd64.extra.sm_89", "unexpected field 'extra'"},
      {"rotary_emb.bf16.hd64.ps16.g4.sm_89", "unexpected field 'ps16'"},
      {"paged_decode.bf16.hd128.ps16.g4.nomma.nomma.sm_90a", "unexpected field 'nomma'"},
      {"paged_decode.bf16.hd128.ps16.g4..sm_90a", "unexpected field ''"},
      {"paged_decode.bf16.hd128.ps16.g4.sm_90a.sm_90a", "unexpected field 'sm_90a'"},
  };
  for (const auto& entry : cases) {
    // Named variables, not structured bindings: clang 14 cannot capture those in CAPTURE.
    const std::string& text = entry.first;
    const std::string& why = entry.second;
    CAPTURE(text);
    const std::string expected = "variant name '" + text + "' is malformed: " + why;
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains(expected.c_str()),
                         astrai::InvalidArgument);
    // The message also shows what a good name looks like.
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text),
                         doctest::Contains("paged_decode.bf16.hd128.ps16.g4.sm_90a"),
                         astrai::InvalidArgument);
  }
}

TEST_CASE("parse accepts only the canonical spelling of a name") {
  // Each of these would parse to a valid spec whose name() is a different string; accepting
  // them would give one variant several names.
  for (const std::string text : {"paged_decode.bf16.hd128.ps16.g4.sm_90a.",
                                 "rotary_emb.fp16.hd64.sm_89.",
                                 "paged_decode.bf16.hd0128.ps16.g4.sm_90a",
                                 "paged_decode.bf16.hd128.ps016.g4.sm_90a",
                                 "paged_decode.bf16.hd128.ps16.g04.sm_90a",
                                 "rotary_emb.fp16.hd64.f0.sm_89"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains(("'" + text + "'").c_str()),
                         astrai::InvalidArgument);
  }
}

TEST_CASE("parse rejects names whose fields are well formed but unsupported") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"paged_decode.bf16.hd72.ps16.g4.sm_90a", "head_dim 72 is not supported"},
      {"paged_decode.bf16.hd128.ps3.g4.sm_90a", "page_size 3 is not supported"},
      {"paged_decode.bf16.hd128.ps16.g0.sm_90a", "group size 0 is not supported"},
      {"paged_decode.bf16.hd128.ps16.g4.sm_70", "arch 'sm_70' is not supported"},
      {"rotary_emb.bf16.hd64.sm_89x", "arch 'sm_89x' is not supported"},
      {"rotary_emb.bf16.hd12.sm_89", "head_dim 12 is not supported"},
      {"rotary_emb.bf16.hd64.f800.sm_89", "flags 0x800 name no feature (allowed: none)"},
      {"rotary_emb.bf16.hd64.cap.sm_89", "rotary_emb does not support the feature cap (allowed: none)"},
  };
  for (const auto& entry : cases) {
    // Named variables, not structured bindings: clang 14 cannot capture those in CAPTURE.
    const std::string& text = entry.first;
    const std::string& why = entry.second;
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains(text.c_str()),
                         astrai::InvalidArgument);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains(why.c_str()),
                         astrai::InvalidArgument);
  }
}

TEST_CASE("validate accepts the supported ranges of every field") {
  for (int head_dim = 32; head_dim <= 256; head_dim += 16)
    CHECK(validate_message(paged_decode_spec(DType::bf16, head_dim, 16, 4, "sm_80")) == "");
  for (int page_size = 1; page_size <= 256; page_size *= 2)
    CHECK(validate_message(paged_decode_spec(DType::fp16, 64, page_size, 1, "sm_89")) == "");
  for (int group : {1, 2, 7, 64, 128})
    CHECK(validate_message(paged_decode_spec(DType::bf16, 128, 16, group, "sm_90a")) == "");
  for (int head_dim = 8; head_dim <= 512; head_dim += 8)
    CHECK(validate_message(rotary_spec(DType::bf16, head_dim, "sm_75")) == "");
  for (const char* arch : {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a",
                           "sm_120f", "compute_75", "compute_120"})
    CHECK(validate_message(rotary_spec(DType::fp16, 64, arch)) == "");
}

TEST_CASE("validate rejects unsupported paged decode fields and names the value") {
  struct Case {
    KernelSpec spec;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {paged_decode_spec(DType::bf16, 72, 16, 4, "sm_90a"),
       "paged_decode.bf16.hd72.ps16.g4.sm_90a: head_dim 72 is not supported (allowed: 32..256, step 16)"},
      {paged_decode_spec(DType::bf16, 16, 16, 4, "sm_90a"),
       "paged_decode.bf16.hd16.ps16.g4.sm_90a: head_dim 16 is not supported (allowed: 32..256, step 16)"},
      {paged_decode_spec(DType::bf16, 272, 16, 4, "sm_90a"),
       "paged_decode.bf16.hd272.ps16.g4.sm_90a: head_dim 272 is not supported (allowed: 32..256, step 16)"},
      {paged_decode_spec(DType::fp16, 0, 16, 4, "sm_80"), "head_dim 0 is not supported"},
      {paged_decode_spec(DType::fp16, 128, 3, 4, "sm_80"),
       "paged_decode.fp16.hd128.ps3.g4.sm_80: page_size 3 is not supported (allowed: a power of two in 1..256)"},
      {paged_decode_spec(DType::fp16, 128, 512, 4, "sm_80"),
       "paged_decode.fp16.hd128.ps512.g4.sm_80: page_size 512 is not supported (allowed: a power of two in 1..256)"},
      {paged_decode_spec(DType::fp16, 128, 0, 4, "sm_80"), "page_size 0 is not supported"},
      {paged_decode_spec(DType::fp16, 128, -16, 4, "sm_80"), "page_size -16 is not supported"},
      {paged_decode_spec(DType::bf16, 128, 16, 0, "sm_89"),
       "paged_decode.bf16.hd128.ps16.g0.sm_89: group size 0 is not supported (allowed: 1..128)"},
      {paged_decode_spec(DType::bf16, 128, 16, 129, "sm_89"), "group size 129 is not supported (allowed: 1..128)"},
      {paged_decode_spec(DType::bf16, 128, 16, 4, "sm_70"),
       "paged_decode.bf16.hd128.ps16.g4.sm_70: arch 'sm_70' is not supported (allowed: sm_75 or newer"},
      {paged_decode_spec(DType::bf16, 128, 16, 4, ""), "arch '' is not supported"},
      {paged_decode_spec(DType::bf16, 128, 16, 4, "gfx90a"), "arch 'gfx90a' is not supported"},
      {paged_decode_spec(DType::bf16, 128, 16, 4, "compute_61"), "arch 'compute_61' is not supported"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.spec.name());
    CHECK_THROWS_WITH_AS(c.spec.validate(), doctest::Contains(c.expected.c_str()),
                         astrai::InvalidArgument);
  }
}

TEST_CASE("validate rejects unsupported rotary fields and any flags") {
  CHECK(validate_message(rotary_spec(DType::bf16, 4, "sm_80")) ==
        "rotary_emb.bf16.hd4.sm_80: head_dim 4 is not supported (allowed: 8..512, step 8)");
  CHECK(validate_message(rotary_spec(DType::bf16, 12, "sm_80")).find("head_dim 12 is not supported") !=
        std::string::npos);
  CHECK(validate_message(rotary_spec(DType::bf16, 520, "sm_80")).find("head_dim 520 is not supported") !=
        std::string::npos);
  CHECK(validate_message(rotary_spec(DType::bf16, 64, "sm_61")).find("arch 'sm_61' is not supported") !=
        std::string::npos);

  KernelSpec with_page = rotary_spec(DType::fp16, 64, "sm_80");
  with_page.page_size = 16;
  CHECK(validate_message(with_page) ==
        "rotary_emb.fp16.hd64.sm_80: rotary_emb takes no page size or group");
  KernelSpec with_group = rotary_spec(DType::fp16, 64, "sm_80");
  with_group.group_size = 4;
  CHECK(validate_message(with_group).find("takes no page size or group") != std::string::npos);

  KernelSpec flagged = paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a");
  flagged.flags = 0x1000;
  CHECK(validate_message(flagged).rfind("paged_decode.bf16.hd128.ps16.g4.f1000.sm_90a: flags 0x1000 name no "
                                        "feature (allowed: kv_e4m3, kv_e5m2, swa, cap, sink, alibi, q2..q8)",
                                        0) == 0);
}

TEST_CASE("instantiations name the kernel templates with the spec's constants") {
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a").instantiations() ==
        std::vector<std::string>{"astrai::paged_decode_kernel<astrai::bf16_t, 128, 16, 4, 0>",
                                 "astrai::split_combine_kernel<astrai::bf16_t, 128>"});
  CHECK(paged_decode_spec(DType::fp16, 64, 1, 20, "sm_75").instantiations() ==
        std::vector<std::string>{"astrai::paged_decode_kernel<astrai::fp16_t, 64, 1, 20, 0>",
                                 "astrai::split_combine_kernel<astrai::fp16_t, 64>"});
  CHECK(rotary_spec(DType::fp16, 64, "sm_89").instantiations() ==
        std::vector<std::string>{"astrai::rotary_emb_kernel<astrai::fp16_t, 64>"});
  CHECK(rotary_spec(DType::bf16, 512, "sm_80").instantiations() ==
        std::vector<std::string>{"astrai::rotary_emb_kernel<astrai::bf16_t, 512>"});
  // The arch and the MMA switch are compile options, not template arguments.
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_80", true).instantiations() ==
        paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a").instantiations());
}

TEST_CASE("main_file points at the header that holds the kernel") {
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a").main_file() == "paged_decode.cuh");
  CHECK(rotary_spec(DType::bf16, 128, "sm_90a").main_file() == "rotary_emb.cuh");
}

TEST_CASE("compile options define ASTRAI_NO_MMA exactly when tensor cores are not used") {
  struct Case {
    std::string arch;
    bool force;
    bool expect_no_mma;
  };
  const std::vector<Case> cases = {
      {"sm_75", false, true},      {"sm_75", true, true},       {"compute_75", false, true},
      {"sm_80", false, false},     {"sm_80", true, true},       {"sm_86", false, false},
      {"sm_89", false, false},     {"sm_89", true, true},       {"sm_90a", false, false},
      {"sm_90a", true, true},      {"sm_100a", false, false},   {"sm_120", false, false},
      {"compute_90", false, false}, {"compute_90", true, true},
  };
  for (const auto& c : cases) {
    for (const KernelSpec& spec : {paged_decode_spec(DType::bf16, 128, 16, 4, c.arch, c.force),
                                   rotary_spec(DType::fp16, 64, c.arch, c.force)}) {
      CAPTURE(spec.name());
      const auto options = spec.compile_options();
      CHECK(count_of(options, "-DASTRAI_NO_MMA") == (c.expect_no_mma ? 1u : 0u));
      CHECK(spec.uses_mma() == !c.expect_no_mma);
      CHECK(count_of(options, "--gpu-architecture=" + c.arch) == 1);
      CHECK(count_of(options, "--std=c++17") == 1);
      for (const auto& option : options)
        CHECK((option.rfind("--gpu-architecture=", 0) != 0 || option == "--gpu-architecture=" + c.arch));
    }
  }
}

TEST_CASE("compile options are the same for equal specs and differ across archs") {
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_89").compile_options() ==
        paged_decode_spec(DType::fp16, 64, 1, 1, "sm_89").compile_options());
  CHECK(paged_decode_spec(DType::bf16, 128, 16, 4, "sm_89").compile_options() !=
        paged_decode_spec(DType::bf16, 128, 16, 4, "sm_86").compile_options());
}

TEST_CASE("arch_number reads the number out of sm and compute targets") {
  CHECK(arch_number("sm_90a") == 90);
  CHECK(arch_number("sm_90") == 90);
  CHECK(arch_number("compute_89") == 89);
  CHECK(arch_number("sm_75") == 75);
  CHECK(arch_number("sm_100a") == 100);
  CHECK(arch_number("sm_120f") == 120);
  CHECK(arch_number("compute_120a") == 120);
}

TEST_CASE("arch_number returns 0 for anything that is not a target") {
  for (const char* text : {"", "sm_", "sm_9", "sm_1000", "sm_8x", "sm_90aa", "sm_90b", "90",
                           "sm90", "SM_90", "compute_", "gfx90a", "sm_-80", "sm_ 80"}) {
    CAPTURE(text);
    CHECK(arch_number(text) == 0);
  }
}

TEST_CASE("kernel kind names parse back to their kinds") {
  CHECK(std::string(astrai::detail::kernel_kind_name(KernelKind::paged_decode)) == "paged_decode");
  CHECK(std::string(astrai::detail::kernel_kind_name(KernelKind::rotary_emb)) == "rotary_emb");
  CHECK(std::string(astrai::detail::kernel_kind_name(KernelKind::decode)) == "decode");
  CHECK(std::string(astrai::detail::kernel_kind_name(KernelKind::paged_prefill)) == "paged_prefill");
  const auto& names = astrai::detail::kernel_kind_names();
  CHECK(std::string(astrai::detail::kernel_kind_name(KernelKind::merge_states)) == "merge_states");
  CHECK(std::string(astrai::detail::kernel_kind_name(KernelKind::mla_decode)) == "mla_decode");
  REQUIRE(names.size() == 7);
  for (const auto& name : names) {
    KernelKind kind = KernelKind::rotary_emb;
    REQUIRE(astrai::detail::parse_kernel_kind(name, &kind));
    CHECK(std::string(astrai::detail::kernel_kind_name(kind)) == name);
  }
  KernelKind untouched = KernelKind::rotary_emb;
  CHECK_FALSE(astrai::detail::parse_kernel_kind("rotary", &untouched));
  CHECK_FALSE(astrai::detail::parse_kernel_kind("", &untouched));
  CHECK(untouched == KernelKind::rotary_emb);
}

TEST_CASE("the paged decode closure holds exactly its transitive includes") {
  const auto& closure = kernel_source_closure("paged_decode.cuh");
  std::set<std::string> names;
  for (const auto& source : closure) {
    const std::string_view name = source.first;
    const std::string_view text = source.second;
    CAPTURE(std::string(name));
    CHECK(text == kernel_source(name));  // exact bytes, and the embedded storage itself
    CHECK(text.data() == kernel_source(name).data());
    CHECK_FALSE(text.empty());
    names.insert(std::string(name));
  }
  CHECK(names.size() == closure.size());  // no duplicates
  // The decode's rooms, both paths' (the closure follows every #include line, #if or not).
  for (const char* expected :
       {"paged_decode.cuh", "kernel_params.h", "astrai_common.cuh", "mma_utils.cuh", "attention_combine.cuh",
        "kv_layout.cuh", "decode_work.cuh", "decode_append.cuh", "decode_start.cuh", "decode_kv_loaders.cuh", "decode_kv8_layout.cuh",
        "decode_kv8_loaders.cuh", "decode_q_tile.cuh", "decode_softmax.cuh", "decode_mma_steps.cuh",
        "decode_merge.cuh", "paged_decode_mma.cuh", "paged_decode_cuda_cores.cuh"}) {
    CAPTURE(expected);
    CHECK(names.count(expected) == 1);
  }
  CHECK(names.count("paged_decode_sm90.cuh") == 0);
  CHECK(names.count("prefill.cuh") == 0);
  CHECK(names.count("rotary_emb.cuh") == 0);
  CHECK(names == transitive_includes("paged_decode.cuh"));
  // Sorted by name.
  for (std::size_t i = 1; i < closure.size(); ++i) CHECK(closure[i - 1].first < closure[i].first);
  // Memoized: the same vector on every call.
  CHECK(&kernel_source_closure("paged_decode.cuh") == &closure);
}

TEST_CASE("every family's closure, Hopper templates included, holds exactly its transitive includes") {
  std::set<std::string> main_files;
  for (const astrai::detail::KernelFamily* family : astrai::detail::kernel_families()) {
    main_files.insert(family->main_file);
    if (family->hopper.main_file != nullptr) main_files.insert(family->hopper.main_file);
  }
  CHECK(main_files.count("merge_states.cuh") == 1);
  CHECK(main_files.count("mla_decode.cuh") == 1);
  for (const std::string& main_file : main_files) {
    CAPTURE(main_file);
    std::set<std::string> names;
    for (const auto& source : kernel_source_closure(main_file)) names.insert(std::string(source.first));
    CHECK(names == transitive_includes(main_file));
  }
}

TEST_CASE("no decode kernel source is over 800 lines") {
  // The decode's rooms stay small enough to read whole; the sm_90a decode's closure holds them all.
  const auto& closure = kernel_source_closure("paged_decode_sm90.cuh");
  std::set<std::string> names;
  for (const auto& source : closure) {
    names.insert(std::string(source.first));
    CAPTURE(std::string(source.first));
    CHECK(std::count(source.second.begin(), source.second.end(), '\n') <= 800);
  }
  CHECK(names.count("decode_sm90_parts.cuh") == 1);
  CHECK(names.count("paged_decode.cuh") == 1);
  CHECK(names.count("decode_merge.cuh") == 1);
}

TEST_CASE("the rotary closure holds its includes and none of the attention headers") {
  const auto closure = kernel_source_closure("rotary_emb.cuh");
  std::set<std::string> names;
  for (const auto& entry : closure) names.insert(std::string(entry.first));
  CHECK(names.count("rotary_emb.cuh") == 1);
  CHECK(names.count("astrai_common.cuh") == 1);
  CHECK(names.count("kernel_params.h") == 1);
  CHECK(names.count("paged_decode.cuh") == 0);
  CHECK(names.count("mma_utils.cuh") == 0);
  CHECK(names.count("attention_combine.cuh") == 0);
  CHECK(names == transitive_includes("rotary_emb.cuh"));
}

TEST_CASE("every embedded kernel source has a distinct name and is reachable by name") {
  const auto& sources = astrai::detail::embedded_kernel_sources();
  REQUIRE(sources.size() >= 6);
  std::set<std::string> names;
  for (const auto& source : sources) {
    CAPTURE(source.name);
    CHECK(names.insert(source.name).second);
    CHECK(kernel_source(source.name) == source.text);
    CHECK_FALSE(source.text.empty());
  }
  CHECK_THROWS_AS(kernel_source("no_such_file.cuh"), astrai::Error);
  CHECK_THROWS_WITH(kernel_source("no_such_file.cuh"), doctest::Contains("no_such_file.cuh"));
  CHECK_THROWS_AS(kernel_source_closure("no_such_file.cuh"), astrai::Error);
}

}  // TEST_SUITE
