// The cubin check before the driver (check_kernel_binary) on crafted ELF files: every offset and
// index the driver follows must stay inside the binary. Each case breaks one field of a small but
// complete ELF (tests/support/elf_image.hpp) that the check accepts, and real NVRTC cubins must
// still pass.
#include <doctest/doctest.h>

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache_entry.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/elf_image.hpp"
#include "tests/support/support.hpp"
#include "tests/unit/cache_trust_support.hpp"

using astrai::DType;
using astrai::detail::BinaryKind;
using astrai::detail::CacheMode;
using astrai::detail::check_kernel_binary;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::testing::config_for;
using astrai::testing::QuietLog;
using astrai::testing::rotary_spec;
using astrai::testing::TempDir;

using astrai::testing::ElfImage;
using namespace astrai::testing::elf_sections;

TEST_SUITE("trust") {

TEST_CASE("a complete small ELF passes the cubin check") { CHECK(ElfImage().verdict().empty()); }

TEST_CASE("no section table with a section table offset is refused") {
  ElfImage elf;
  Elf64_Ehdr header = elf.header();
  header.e_shnum = 0;            // extended numbering would read the count from section 0...
  header.e_shoff = 0x7fff0000;   // ...at an offset far outside the file
  header.e_shstrndx = SHN_UNDEF;
  elf.set_header(header);
  CHECK(elf.verdict() == "ELF section table offset set with no sections");
  header.e_shoff = 0;
  header.e_shstrndx = 3;
  elf.set_header(header);
  CHECK(elf.verdict() == "ELF section name table index 3 with no sections");
}

TEST_CASE("a section name table index out of range or SHN_XINDEX is refused") {
  for (std::uint16_t index : {std::uint16_t{kSections}, std::uint16_t{200}, std::uint16_t{SHN_XINDEX}}) {
    CAPTURE(index);
    ElfImage elf;
    Elf64_Ehdr header = elf.header();
    header.e_shstrndx = index;
    elf.set_header(header);
    CHECK(elf.verdict().find("ELF section name table index") == 0);
  }
  ElfImage elf;  // in range, but not a string table
  Elf64_Ehdr header = elf.header();
  header.e_shstrndx = kText;
  elf.set_header(header);
  CHECK(elf.verdict() == "the ELF section name table is not a NUL-terminated string table");
}

TEST_CASE("a program segment outside the file is refused") {
  ElfImage elf;
  Elf64_Phdr segment = elf.segment();
  segment.p_filesz = 1 << 20;
  elf.set_segment(segment);
  CHECK(elf.verdict() == "ELF program segment 0 lies outside the cubin");
  segment.p_filesz = 16;
  segment.p_offset = ~std::uint64_t{0} - 4;  // no wrap-around
  elf.set_segment(segment);
  CHECK(elf.verdict() == "ELF program segment 0 lies outside the cubin");
  Elf64_Ehdr header = elf.header();
  header.e_phnum = PN_XNUM;
  elf.set_header(header);
  CHECK(elf.verdict() == "ELF program header count PN_XNUM is not supported");
}

TEST_CASE("section names and links out of range are refused") {
  {
    ElfImage elf;
    Elf64_Shdr text = elf.section_header(kText);
    text.sh_name = 43;  // the name table's size: one past its end
    elf.set_section(kText, text);
    CHECK(elf.verdict() == "ELF section 4: name offset 43 out of range");
  }
  {
    ElfImage elf;
    Elf64_Shdr text = elf.section_header(kText);
    text.sh_link = kSections;
    elf.set_section(kText, text);
    CHECK(elf.verdict() == "ELF section 4: sh_link 6 out of range (6 sections)");
  }
  {
    ElfImage elf;  // a name table that does not end in NUL lets a name run off its end
    Elf64_Shdr names = elf.section_header(kShstrtab);
    names.sh_size -= 1;
    elf.set_section(kShstrtab, names);
    CHECK(elf.verdict() == "the ELF section name table is not a NUL-terminated string table");
  }
}

TEST_CASE("symbols whose name or section lies out of range are refused") {
  {
    ElfImage elf;
    Elf64_Sym symbol = elf.symbol(1);
    symbol.st_name = 8;  // the string table's size
    elf.set_symbol(1, symbol);
    CHECK(elf.verdict() == "ELF symbol 1 of table 3: name offset 8 out of range");
  }
  for (std::uint16_t index : {std::uint16_t{kSections}, std::uint16_t{SHN_XINDEX}}) {
    ElfImage elf;
    Elf64_Sym symbol = elf.symbol(1);
    symbol.st_shndx = index;
    elf.set_symbol(1, symbol);
    CHECK(elf.verdict().find("ELF symbol 1 of table 3: section index") == 0);
  }
  {
    ElfImage elf;
    Elf64_Shdr table = elf.section_header(kSymtab);
    table.sh_link = kText;
    elf.set_section(kSymtab, table);
    CHECK(elf.verdict() == "ELF symbol table 3: sh_link 4 is not a string table");
    table.sh_link = kStrtab;
    table.sh_entsize = 16;
    elf.set_section(kSymtab, table);
    CHECK(elf.verdict() == "ELF symbol table 3 has entries of 16 bytes");
  }
}

TEST_CASE("relocations of a symbol or at an offset out of range are refused") {
  {
    ElfImage elf;
    Elf64_Rel relocation = elf.relocation();
    relocation.r_info = ELF64_R_INFO(2, 1);  // the table holds symbols 0 and 1
    elf.set_relocation(relocation);
    CHECK(elf.verdict() == "ELF relocation 0 of table 5: symbol 2 out of range");
  }
  {
    ElfImage elf;
    Elf64_Rel relocation = elf.relocation();
    relocation.r_offset = 16;  // .text is 16 bytes
    elf.set_relocation(relocation);
    CHECK(elf.verdict() == "ELF relocation 0 of table 5: offset 16 outside its section");
  }
  {
    ElfImage elf;
    Elf64_Shdr table = elf.section_header(kRelText);
    table.sh_info = 9;
    elf.set_section(kRelText, table);
    CHECK(elf.verdict() == "ELF relocation table 5: target section 9 out of range");
    table.sh_info = kText;
    table.sh_link = kStrtab;
    elf.set_section(kRelText, table);
    CHECK(elf.verdict() == "ELF relocation table 5: sh_link 2 is not a symbol table");
  }
}

TEST_CASE("cubins compiled by NVRTC pass the cubin check") {
  QuietLog quiet;
  TempDir dir;
  JitEngine engine(config_for(dir.path() / "cache", CacheMode::off));
  KernelSpec decode;
  decode.kind = KernelKind::paged_decode;
  decode.dtype = DType::bf16;
  decode.head_dim = 128;
  decode.page_size = 16;
  decode.group_size = 4;
  decode.arch = "sm_90a";
  for (const KernelSpec& spec : {rotary_spec(), decode}) {
    CAPTURE(spec.name());
    const auto variant = engine.get(spec);
    REQUIRE(variant);
    std::string why;
    CHECK(check_kernel_binary(variant->kind, variant->binary.data(), variant->binary.size(), &why));
    CHECK(why.empty());
  }
}

}  // TEST_SUITE
