// Where FP8 attention's V transposition (prefill_sm90_fp8.cuh) reads and writes: byte offsets
// of a transposer thread's accesses in a round, shared by the kernel and the host's unit test
// (tests/unit/test_prefill_sm90_fp8.cpp), which holds them to the swizzle, the token permutation
// and the banks.
#pragma once

namespace astrai {

// Byte b of row r of a tile of 128-byte rows, 128-byte swizzled, as TMA lands them and the wgmma
// descriptors read them: 16-byte piece p of row r at p ^ r % 8.
constexpr unsigned swizzle128_offset(unsigned row, unsigned b) {
  return row * 128 + ((((b >> 4) ^ row) & 7) << 4) + (b & 15);
}

// Lane l's task in round w of a V block's 128-byte chunk (128 tokens x 128 bytes): column group
// c = l (bytes 4c..4c+3 of each token, V^T rows 4c..4c+3), the 8 tokens whose V^T slots make
// half h of 16-byte piece z, z = l % 8 ^ w % 8 and h = l / 8 % 2 ^ w / 8. Its 8 loads: u = 0..3
// and e = 0, 1 take token 16z + 4h + u + 8e, into word u % 2 + 2e of group u / 2 (slots 4q..4q+3
// of a V^T row hold tokens +0, +1, +8, +9 of 16z + 4h + 2 (q % 2)). Its 4 stores: V^T row 4c + j,
// slots 16z + 8h .. + 7. The offsets are the swizzle taken apart: a load's token has 4h + u as
// its low bits, so its piece is (c / 4 ^ 4h) ^ u and the 8e rows an immediate; a store's row has
// 4 (c % 2) + j as its low bits, so its piece is (z ^ 4 (c % 2)) ^ j.
struct Fp8TransposeTask {
  static constexpr unsigned kRounds = 16;  // 32 column groups x 16 half pieces, 32 a round
  unsigned c, z, h;
  constexpr Fp8TransposeTask(unsigned lane, unsigned round)
      : c(lane), z((lane % 8) ^ (round % 8)), h(((lane / 8) % 2) ^ (round / 8)) {}
  constexpr unsigned token(unsigned u, unsigned e) const { return 16 * z + 4 * h + u + 8 * e; }
  // The load of token(u, e), bytes 4c..4c+3, from the block's first byte.
  constexpr unsigned load_offset(unsigned u, unsigned e) const {
    return (c % 4) * 4 + z * 16 * 128 + h * 4 * 128 + u * 128 + ((((c / 4) ^ (h * 4)) ^ u) << 4) + e * 8 * 128;
  }
  // The 8-byte store into V^T row 4c + j, slots 16z + 8h .. + 7, from the tile's first byte.
  constexpr unsigned store_offset(unsigned j) const {
    return c * 4 * 128 + h * 8 + j * 128 + (((z ^ ((c % 2) * 4)) ^ j) << 4);
  }
};

// Byte b of row r of a tile of 64-byte rows, 64-byte swizzled (hd64's rows of bytes): 16-byte
// piece p of row r at p ^ (r / 2) % 4.
constexpr unsigned swizzle64_offset(unsigned row, unsigned b) {
  return row * 64 + ((((b >> 4) ^ (row >> 1)) & 3) << 4) + (b & 15);
}

// The same task at hd64: V's block is 128 tokens of 64 bytes (64-byte swizzled), V^T 64 rows of
// 128 token bytes (128-byte swizzled, as at hd128). Lane l takes column group c = l % 16 and half
// h = l / 8 % 2 ^ l / 16 of piece z = c % 8 ^ w: lanes c and c + 16 share a column group and split
// its halves, and a 16-lane phase of a store writes 16 different 8-byte places (the halves split
// the phase, z ^ 4 (c % 2) is one-to-one on c % 8). A load's 32 lanes meet in pairs: a token row
// is 16 banks, and its parity is the load's (u's), so 32 lanes reading one parity share 16 banks.
struct Fp8TransposeTask64 {
  static constexpr unsigned kRounds = 8;  // 16 column groups x 16 half pieces, 32 a round
  unsigned c, z, h;
  constexpr Fp8TransposeTask64(unsigned lane, unsigned round)
      : c(lane % 16), z((lane % 8) ^ (round % 8)), h(((lane / 8) % 2) ^ (lane / 16)) {}
  constexpr unsigned token(unsigned u, unsigned e) const { return 16 * z + 4 * h + u + 8 * e; }
  // The load of token(u, e), bytes 4c..4c+3: the token's (t / 2) % 4 is 2h + u / 2.
  constexpr unsigned load_offset(unsigned u, unsigned e) const {
    return token(u, e) * 64 + ((((c / 4) ^ (2 * h)) ^ (u / 2)) << 4) + (c % 4) * 4;
  }
  // The 8-byte store into V^T row 4c + j, slots 16z + 8h .. + 7.
  constexpr unsigned store_offset(unsigned j) const {
    return c * 4 * 128 + h * 8 + j * 128 + (((z ^ ((c % 2) * 4)) ^ j) << 4);
  }
};

}  // namespace astrai
