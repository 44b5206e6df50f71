// Ops that make several arrays: the caller passes a uint64 buffer of `cap`
// slots; on success every handle is written (all or none) and the count
// returned; on failure -1 and nothing written. The TS side reads the slots
// back with bun:ffi `read.ptr`, never through the TypedArray it passed.
#pragma once
#include <string>
#include <vector>

#include "internal.h"

namespace mlxb {
inline int write_handles(std::vector<mx::array> outs, uint64_t* out, int cap) {
  if (static_cast<int>(outs.size()) > cap)
    throw std::invalid_argument("op made " + std::to_string(outs.size()) + " arrays but the caller expected at most " +
                                std::to_string(cap));
  if (!outs.empty() && !out) throw std::invalid_argument("null output buffer");
  for (size_t i = 0; i < outs.size(); i++) out[i] = reinterpret_cast<uint64_t>(wrap(std::move(outs[i])));
  return static_cast<int>(outs.size());
}
}  // namespace mlxb
