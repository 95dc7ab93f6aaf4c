#include "cache/network_fs.hpp"

#include <sys/vfs.h>

namespace astrai::detail {

bool is_network_fs_type(long f_type) {
  // Magic numbers from linux/magic.h and the file systems' own headers.
  switch (static_cast<unsigned long>(f_type) & 0xffffffffUL) {
    case 0x6969UL:      // NFS
    case 0x517bUL:      // SMB
    case 0xff534d42UL:  // CIFS
    case 0xfe534d42UL:  // SMB2
    case 0x0bd00bd0UL:  // Lustre
    case 0x47504653UL:  // GPFS
    case 0x00c36400UL:  // Ceph
    case 0x19830326UL:  // BeeGFS
    case 0x01021997UL:  // 9P
    case 0x5346414fUL:  // AFS
    case 0x6b414653UL:  // kAFS
    case 0x65735546UL:  // FUSE (sshfs, s3fs, ...: no reliable locks either)
      return true;
    default:
      return false;
  }
}

bool on_network_fs(int fd) {
  struct statfs info {};
  if (::fstatfs(fd, &info) != 0) return false;
  return is_network_fs_type(static_cast<long>(info.f_type));
}

}  // namespace astrai::detail
