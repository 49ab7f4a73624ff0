// The dims a reduction reduces: reduce_sum's and mean's `axes` (empty: all)
// and `keep_dims`, read the same way by their CPU kernel (reduce_sum.py) and
// their GPU kernel (reduce_sum.cu).
#ifndef OPFORGE_BUILTINS_REDUCE_AXES_H_
#define OPFORGE_BUILTINS_REDUCE_AXES_H_

#include <cstdint>
#include <vector>

#include "custom_aot_extra.h"

// reduced[d] for each of x's `rank` dims.  Returns 0; 1 for axes out of range
// or named twice (the op's check rejects these first); 2 when y's rank
// `out_rank` disagrees with the attributes.
inline int ReducedAxes(AotExtra *extra, int rank, int out_rank, std::vector<bool> *reduced) {
  const std::vector<int64_t> axes = extra->Attr<std::vector<int64_t>>("axes");
  const bool keep_dims = extra->Attr<bool>("keep_dims");
  reduced->assign(rank, axes.empty());
  for (int64_t axis : axes) {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || (*reduced)[axis]) return 1;
    (*reduced)[axis] = true;
  }
  int n_reduced = 0;
  for (int d = 0; d < rank; d++) n_reduced += (*reduced)[d];
  return out_rank == (keep_dims ? rank : rank - n_reduced) ? 0 : 2;
}

#endif  // OPFORGE_BUILTINS_REDUCE_AXES_H_
