// A small but complete 64-bit ELF, as a cubin is one, for the tests and fuzz targets of the
// cubin check (check_kernel_binary): section names, a symbol table, a relocated text section and
// a segment over it. The check accepts it as built; accessors change one field at a time.
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache_entry.hpp"

namespace astrai::testing {

// Section indices of ElfImage.
namespace elf_sections {
enum : std::uint16_t { kNull, kShstrtab, kStrtab, kSymtab, kText, kRelText, kSections };
}  // namespace elf_sections

// A relocatable 64-bit ELF laid out as: header, one program header (PT_LOAD over .text), the
// sections' contents, then the section table.
class ElfImage {
 public:
  ElfImage() {
    const std::string names = std::string("\0.shstrtab\0.strtab\0.symtab\0.text\0.rel.text\0", 43);
    const std::string strings = std::string("\0kernel\0", 8);
    bytes_.resize(sizeof(Elf64_Ehdr) + sizeof(Elf64_Phdr));
    const std::uint64_t names_at = append(names.data(), names.size());
    const std::uint64_t strings_at = append(strings.data(), strings.size());
    Elf64_Sym symbols[2] = {};
    symbols[1].st_name = 1;  // "kernel"
    symbols[1].st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
    symbols[1].st_shndx = elf_sections::kText;
    symbols[1].st_size = 16;
    const std::uint64_t symbols_at = append(symbols, sizeof symbols);
    const char text[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const std::uint64_t text_at = append(text, sizeof text);
    Elf64_Rel relocation{};
    relocation.r_offset = 8;
    relocation.r_info = ELF64_R_INFO(1, 1);
    const std::uint64_t relocations_at = append(&relocation, sizeof relocation);
    while (bytes_.size() % 8 != 0) bytes_.push_back(0);

    Elf64_Shdr table[elf_sections::kSections] = {};
    table[elf_sections::kShstrtab] = section(1, SHT_STRTAB, names_at, names.size());
    table[elf_sections::kStrtab] = section(11, SHT_STRTAB, strings_at, strings.size());
    table[elf_sections::kSymtab] = section(19, SHT_SYMTAB, symbols_at, sizeof symbols);
    table[elf_sections::kSymtab].sh_link = elf_sections::kStrtab;
    table[elf_sections::kSymtab].sh_info = 1;  // first global symbol
    table[elf_sections::kSymtab].sh_entsize = sizeof(Elf64_Sym);
    table[elf_sections::kText] = section(27, SHT_PROGBITS, text_at, sizeof text);
    table[elf_sections::kRelText] = section(33, SHT_REL, relocations_at, sizeof relocation);
    table[elf_sections::kRelText].sh_link = elf_sections::kSymtab;
    table[elf_sections::kRelText].sh_info = elf_sections::kText;
    table[elf_sections::kRelText].sh_entsize = sizeof(Elf64_Rel);
    const std::uint64_t table_at = append(table, sizeof table);

    Elf64_Ehdr header{};
    std::memcpy(header.e_ident, ELFMAG, SELFMAG);
    header.e_ident[EI_CLASS] = ELFCLASS64;
    header.e_ident[EI_DATA] = ELFDATA2LSB;
    header.e_ident[EI_VERSION] = EV_CURRENT;
    header.e_type = ET_EXEC;
    header.e_machine = 190;  // EM_CUDA
    header.e_version = EV_CURRENT;
    header.e_phoff = sizeof(Elf64_Ehdr);
    header.e_shoff = table_at;
    header.e_ehsize = sizeof(Elf64_Ehdr);
    header.e_phentsize = sizeof(Elf64_Phdr);
    header.e_phnum = 1;
    header.e_shentsize = sizeof(Elf64_Shdr);
    header.e_shnum = elf_sections::kSections;
    header.e_shstrndx = elf_sections::kShstrtab;
    set(0, header);
    Elf64_Phdr segment{};
    segment.p_type = PT_LOAD;
    segment.p_offset = text_at;
    segment.p_filesz = sizeof text;
    segment.p_memsz = sizeof text;
    set(sizeof(Elf64_Ehdr), segment);
  }

  Elf64_Ehdr header() const { return get<Elf64_Ehdr>(0); }
  void set_header(const Elf64_Ehdr& header) { set(0, header); }
  Elf64_Phdr segment() const { return get<Elf64_Phdr>(sizeof(Elf64_Ehdr)); }
  void set_segment(const Elf64_Phdr& segment) { set(sizeof(Elf64_Ehdr), segment); }
  Elf64_Shdr section_header(std::uint16_t index) const {
    return get<Elf64_Shdr>(header().e_shoff + index * sizeof(Elf64_Shdr));
  }
  void set_section(std::uint16_t index, const Elf64_Shdr& value) {
    set(header().e_shoff + index * sizeof(Elf64_Shdr), value);
  }
  Elf64_Sym symbol(std::size_t index) const {
    return get<Elf64_Sym>(section_header(elf_sections::kSymtab).sh_offset + index * sizeof(Elf64_Sym));
  }
  void set_symbol(std::size_t index, const Elf64_Sym& value) {
    set(section_header(elf_sections::kSymtab).sh_offset + index * sizeof(Elf64_Sym), value);
  }
  Elf64_Rel relocation() const { return get<Elf64_Rel>(section_header(elf_sections::kRelText).sh_offset); }
  void set_relocation(const Elf64_Rel& value) { set(section_header(elf_sections::kRelText).sh_offset, value); }

  const std::vector<char>& bytes() const { return bytes_; }

  // The check's verdict: empty when accepted, else its reason.
  std::string verdict() const {
    std::string why;
    return detail::check_kernel_binary(detail::BinaryKind::cubin, bytes_.data(), bytes_.size(),
                                       &why)
               ? std::string()
               : why;
  }

 private:
  static Elf64_Shdr section(std::uint32_t name, std::uint32_t type, std::uint64_t offset,
                            std::uint64_t size) {
    Elf64_Shdr header{};
    header.sh_name = name;
    header.sh_type = type;
    header.sh_offset = offset;
    header.sh_size = size;
    return header;
  }
  std::uint64_t append(const void* data, std::size_t size) {
    const std::uint64_t at = bytes_.size();
    bytes_.resize(at + size);
    std::memcpy(bytes_.data() + at, data, size);
    return at;
  }
  template <typename T>
  T get(std::uint64_t at) const {
    T value;
    std::memcpy(&value, bytes_.data() + at, sizeof value);
    return value;
  }
  template <typename T>
  void set(std::uint64_t at, const T& value) {
    std::memcpy(bytes_.data() + at, &value, sizeof value);
  }
  std::vector<char> bytes_;
};

}  // namespace astrai::testing
