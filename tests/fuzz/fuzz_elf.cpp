// libFuzzer target: the cubin check before the driver (check_kernel_binary). It may not crash
// on any bytes, and a refusal names a reason. What it accepts is then walked the way a loader
// walks a cubin, following every offset and index without checks of its own: AddressSanitizer
// turns any read outside the input (which libFuzzer allocates at its exact size) into a crash,
// so an offset or index the check let through unchecked is found.
#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache_entry.hpp"
#include "tests/support/elf_image.hpp"
#include "tests/support/fuzz.hpp"

using astrai::fuzz::require;

namespace {

template <typename T>
T read_at(const char* data, std::uint64_t offset) {
  T value;
  std::memcpy(&value, data + offset, sizeof value);
  return value;
}

// Touches the first and last byte of [offset, offset + size): a read outside the input is an
// ASan report. `sink` keeps the reads from being optimized away.
void touch(const char* data, std::uint64_t offset, std::uint64_t size, volatile char* sink) {
  if (size == 0) return;
  *sink ^= data[offset];
  *sink ^= data[offset + size - 1];
}

std::size_t name_length(const char* data, std::uint64_t table_offset, std::uint64_t name) {
  return std::strlen(data + table_offset + name);
}

void walk(const char* data, volatile char* sink) {
  const auto header = read_at<Elf64_Ehdr>(data, 0);
  for (std::uint16_t i = 0; i < header.e_phnum; ++i) {
    const auto segment = read_at<Elf64_Phdr>(data, header.e_phoff + i * sizeof(Elf64_Phdr));
    touch(data, segment.p_offset, segment.p_filesz, sink);
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  for (std::uint16_t i = 0; i < header.e_shnum; ++i)
    sections[i] = read_at<Elf64_Shdr>(data, header.e_shoff + i * sizeof(Elf64_Shdr));
  for (const auto& section : sections) {
    if (header.e_shstrndx != SHN_UNDEF)
      *sink ^= static_cast<char>(
          name_length(data, sections[header.e_shstrndx].sh_offset, section.sh_name));
    if (section.sh_type != SHT_NOBITS) touch(data, section.sh_offset, section.sh_size, sink);
    const Elf64_Shdr& linked = sections[section.sh_link];
    if (section.sh_type == SHT_SYMTAB && section.sh_size > 0) {
      for (std::uint64_t at = 0; at < section.sh_size; at += sizeof(Elf64_Sym)) {
        const auto symbol = read_at<Elf64_Sym>(data, section.sh_offset + at);
        *sink ^= static_cast<char>(name_length(data, linked.sh_offset, symbol.st_name));
        if (symbol.st_shndx < SHN_LORESERVE)
          *sink ^= static_cast<char>(sections[symbol.st_shndx].sh_type);
      }
    }
    if ((section.sh_type == SHT_REL || section.sh_type == SHT_RELA) && section.sh_size > 0) {
      const std::uint64_t step =
          section.sh_type == SHT_REL ? sizeof(Elf64_Rel) : sizeof(Elf64_Rela);
      const Elf64_Shdr& target = sections[section.sh_info];
      for (std::uint64_t at = 0; at < section.sh_size; at += step) {
        const auto relocation = read_at<Elf64_Rel>(data, section.sh_offset + at);
        const auto symbol = read_at<Elf64_Sym>(
            data, linked.sh_offset + ELF64_R_SYM(relocation.r_info) * sizeof(Elf64_Sym));
        *sink ^= static_cast<char>(symbol.st_info);
        if (section.sh_info != SHN_UNDEF && target.sh_type != SHT_NOBITS)
          *sink ^= data[target.sh_offset + relocation.r_offset];
      }
    }
  }
}

std::string as_string(const std::vector<char>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  astrai::testing::ElfImage elf;
  std::vector<std::string> seeds = {as_string(elf.bytes())};
  Elf64_Ehdr header = elf.header();
  header.e_phnum = 0;
  elf.set_header(header);
  seeds.push_back(as_string(elf.bytes()));
  seeds.push_back(as_string(elf.bytes()).substr(0, sizeof(Elf64_Ehdr)));
  astrai::fuzz::write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  std::string why;
  if (!astrai::detail::check_kernel_binary(astrai::detail::BinaryKind::cubin, bytes, size, &why)) {
    require(!why.empty(), "a refused cubin gives no reason");
    return 0;
  }
  volatile char sink = 0;
  walk(bytes, &sink);
  return 0;
}
