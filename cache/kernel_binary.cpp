// The check of a kernel binary before it reaches the driver (check_kernel_binary, declared in
// cache/cache_entry.hpp). The driver parses a cubin inside the caller's process and follows its
// offsets and indices without checking them against the buffer, so every offset and index it
// may follow is checked here: the header, the program and section tables, each segment and
// section, the section name table, section links, symbols and relocations.
#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cache/cache_entry.hpp"

namespace astrai::detail {

namespace {

// <elf.h>'s structs are read in place (by memcpy: a payload has no alignment guarantee), which
// matches the file only on a little-endian host; cubins are little-endian ELF.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ELF structs are read in host order");

template <typename T>
T read_at(const char* data, std::uint64_t offset) {
  T value;
  std::memcpy(&value, data + offset, sizeof value);
  return value;
}

// [offset, offset + length) lies inside a buffer of `size` bytes (no overflow possible).
bool inside(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

class CubinCheck {
 public:
  CubinCheck(const char* data, std::size_t size) : data_(data), size_(size) {}

  // Empty when sound, else the reason.
  std::string run() {
    if (size_ < sizeof(Elf64_Ehdr)) return "cubin shorter than an ELF header";
    header_ = read_at<Elf64_Ehdr>(data_, 0);
    if (std::memcmp(header_.e_ident, ELFMAG, SELFMAG) != 0) return "cubin is not an ELF file";
    if (header_.e_ident[EI_CLASS] != ELFCLASS64 || header_.e_ident[EI_DATA] != ELFDATA2LSB)
      return "cubin is not 64-bit little-endian ELF";
    if (header_.e_ehsize < sizeof(Elf64_Ehdr) || header_.e_ehsize > size_)
      return "bad ELF header size";
    if (std::string why = check_segments(); !why.empty()) return why;
    if (std::string why = read_sections(); !why.empty()) return why;
    for (std::size_t i = 0; i < sections_.size(); ++i)
      if (std::string why = check_section(i); !why.empty()) return why;
    return {};
  }

 private:
  std::string check_segments() const {
    // PN_XNUM moves the count into section 0: cubins never need it, and a reader that does not
    // expect it would walk 65535 entries.
    if (header_.e_phnum == PN_XNUM) return "ELF program header count PN_XNUM is not supported";
    if (header_.e_phnum == 0) return {};
    if (header_.e_phentsize != sizeof(Elf64_Phdr) ||
        !inside(header_.e_phoff, std::uint64_t{header_.e_phnum} * sizeof(Elf64_Phdr), size_))
      return "ELF program header table lies outside the cubin";
    for (std::uint16_t i = 0; i < header_.e_phnum; ++i) {
      const auto segment =
          read_at<Elf64_Phdr>(data_, header_.e_phoff + std::uint64_t{i} * sizeof(Elf64_Phdr));
      if (!inside(segment.p_offset, segment.p_filesz, size_))
        return fmt::format("ELF program segment {} lies outside the cubin", i);
    }
    return {};
  }

  std::string read_sections() {
    if (header_.e_shnum == 0) {
      // Extended numbering (the count in section 0's sh_size) is never used by cubins: with no
      // sections, neither a table offset nor a name table index may point anywhere.
      if (header_.e_shoff != 0) return "ELF section table offset set with no sections";
      if (header_.e_shstrndx != SHN_UNDEF)
        return fmt::format("ELF section name table index {} with no sections", header_.e_shstrndx);
      return {};
    }
    if (header_.e_shentsize != sizeof(Elf64_Shdr) ||
        !inside(header_.e_shoff, std::uint64_t{header_.e_shnum} * sizeof(Elf64_Shdr), size_))
      return "ELF section table lies outside the cubin";
    // SHN_XINDEX (0xffff) is >= any count: refused like any index out of range.
    if (header_.e_shstrndx >= header_.e_shnum)
      return fmt::format("ELF section name table index {} out of range ({} sections)",
                         header_.e_shstrndx, header_.e_shnum);
    sections_.resize(header_.e_shnum);
    for (std::uint16_t i = 0; i < header_.e_shnum; ++i)
      sections_[i] =
          read_at<Elf64_Shdr>(data_, header_.e_shoff + std::uint64_t{i} * sizeof(Elf64_Shdr));
    for (std::size_t i = 0; i < sections_.size(); ++i)
      if (sections_[i].sh_type != SHT_NOBITS &&
          !inside(sections_[i].sh_offset, sections_[i].sh_size, size_))
        return "an ELF section lies outside the cubin";
    return {};
  }

  // A string table every offset below sh_size of which ends in a NUL inside the table.
  bool is_string_table(std::uint64_t index) const {
    if (index == SHN_UNDEF || index >= sections_.size()) return false;
    const Elf64_Shdr& table = sections_[index];
    return table.sh_type == SHT_STRTAB && table.sh_size > 0 &&
           data_[table.sh_offset + table.sh_size - 1] == '\0';
  }

  std::string check_section(std::size_t index) const {
    const Elf64_Shdr& section = sections_[index];
    const std::uint64_t count = sections_.size();
    if (header_.e_shstrndx == SHN_UNDEF) {
      if (section.sh_name != 0)
        return fmt::format("ELF section {} has a name but the cubin has no name table", index);
    } else if (!is_string_table(header_.e_shstrndx)) {
      return "the ELF section name table is not a NUL-terminated string table";
    } else if (section.sh_name >= sections_[header_.e_shstrndx].sh_size) {
      return fmt::format("ELF section {}: name offset {} out of range", index, section.sh_name);
    }
    if (section.sh_link >= count)
      return fmt::format("ELF section {}: sh_link {} out of range ({} sections)", index,
                         section.sh_link, count);
    switch (section.sh_type) {
      case SHT_SYMTAB:
      case SHT_DYNSYM: return check_symbols(index);
      case SHT_REL: return check_relocations<Elf64_Rel>(index);
      case SHT_RELA: return check_relocations<Elf64_Rela>(index);
      default: return {};
    }
  }

  std::string check_symbols(std::size_t index) const {
    const Elf64_Shdr& table = sections_[index];
    if (table.sh_entsize != sizeof(Elf64_Sym) || table.sh_size % sizeof(Elf64_Sym) != 0)
      return fmt::format("ELF symbol table {} has entries of {} bytes", index, table.sh_entsize);
    if (table.sh_size == 0) return {};
    if (!is_string_table(table.sh_link))
      return fmt::format("ELF symbol table {}: sh_link {} is not a string table", index,
                         table.sh_link);
    const std::uint64_t names = sections_[table.sh_link].sh_size;
    for (std::uint64_t at = 0; at < table.sh_size; at += sizeof(Elf64_Sym)) {
      const auto symbol = read_at<Elf64_Sym>(data_, table.sh_offset + at);
      const std::uint64_t number = at / sizeof(Elf64_Sym);
      if (symbol.st_name >= names)
        return fmt::format("ELF symbol {} of table {}: name offset {} out of range", number, index,
                           symbol.st_name);
      // Below SHN_LORESERVE a section index; above it only the two meanings cubins use
      // (SHN_XINDEX would need an extended index table, which cubins never have).
      const bool special = symbol.st_shndx == SHN_ABS || symbol.st_shndx == SHN_COMMON;
      if (!special && symbol.st_shndx >= sections_.size())
        return fmt::format("ELF symbol {} of table {}: section index {} out of range", number,
                           index, symbol.st_shndx);
    }
    return {};
  }

  template <typename Relocation>
  std::string check_relocations(std::size_t index) const {
    const Elf64_Shdr& table = sections_[index];
    if (table.sh_entsize != sizeof(Relocation) || table.sh_size % sizeof(Relocation) != 0)
      return fmt::format("ELF relocation table {} has entries of {} bytes", index,
                         table.sh_entsize);
    if (table.sh_size == 0) return {};
    const Elf64_Shdr& symbols = sections_[table.sh_link];
    if (symbols.sh_type != SHT_SYMTAB && symbols.sh_type != SHT_DYNSYM)
      return fmt::format("ELF relocation table {}: sh_link {} is not a symbol table", index,
                         table.sh_link);
    if (table.sh_info >= sections_.size())
      return fmt::format("ELF relocation table {}: target section {} out of range", index,
                         table.sh_info);
    const std::uint64_t symbol_count = symbols.sh_size / sizeof(Elf64_Sym);
    const Elf64_Shdr& target = sections_[table.sh_info];
    for (std::uint64_t at = 0; at < table.sh_size; at += sizeof(Relocation)) {
      const auto relocation = read_at<Relocation>(data_, table.sh_offset + at);
      const std::uint64_t number = at / sizeof(Relocation);
      if (ELF64_R_SYM(relocation.r_info) >= symbol_count)
        return fmt::format("ELF relocation {} of table {}: symbol {} out of range", number, index,
                           ELF64_R_SYM(relocation.r_info));
      if (table.sh_info != SHN_UNDEF && relocation.r_offset >= target.sh_size)
        return fmt::format("ELF relocation {} of table {}: offset {} outside its section", number,
                           index, relocation.r_offset);
    }
    return {};
  }

  const char* data_;
  std::size_t size_;
  Elf64_Ehdr header_{};
  std::vector<Elf64_Shdr> sections_;
};

}  // namespace

bool check_kernel_binary(BinaryKind kind, const char* data, std::size_t size, std::string* why) {
  auto fail = [why](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  if (data == nullptr || size == 0) return fail("empty binary");
  if (kind == BinaryKind::ptx) {
    if (data[size - 1] != '\0') return fail("PTX text does not end in NUL");
    return true;
  }
  if (kind != BinaryKind::cubin) return fail("unknown binary kind");
  try {
    std::string problem = CubinCheck(data, size).run();
    if (!problem.empty()) return fail(std::move(problem));
  } catch (const std::exception&) {
    return fail("out of memory");
  }
  return true;
}

}  // namespace astrai::detail
