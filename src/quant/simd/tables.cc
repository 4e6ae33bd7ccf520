// Split-half candidate tables (tables.h), built once from kScaleTables.
#include "quant/simd/tables.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>

namespace scalesweep::simd {

static_assert(kSplitRows - 1 + kSplitVariants - 1 < kTabRows, "split rows stay in the table");
static_assert(126 + 15 < kTabStride, "split columns stay in the table");

const SplitTable* split_tables() {
  struct Deleter {
    void operator()(SplitTable* p) const { std::free(p); }
  };
  static const std::unique_ptr<SplitTable, Deleter> tables = [] {
    constexpr size_t kCount = 127 * kSplitVariants;
    auto* t = static_cast<SplitTable*>(
        std::aligned_alloc(alignof(SplitTable), sizeof(SplitTable) * kCount));
    if (!t) throw std::bad_alloc();
    const ScaleTables& T = kScaleTables;
    for (int c = 0; c <= 126; ++c)
      for (int d = 0; d < kSplitVariants; ++d) {
        SplitTable& s = t[kSplitVariants * c + d];
        for (int r = 0; r < kSplitRows; ++r)
          for (int j = 0; j < 16; ++j) {
            const int row = j < 8 ? r + d : r;  // <= 9 + 2 < kTabRows
            const int col = c + j;              // <= 141 < kTabStride: copies of 126 past it
            s.thr[r][j] = T.thr[row][col];
            s.lvl[r][j] = T.lvl[row][col];
          }
      }
    return std::unique_ptr<SplitTable, Deleter>(t);
  }();
  return tables.get();
}

}  // namespace scalesweep::simd
