// What the policies of the open checkpoint regions decide for an op's output, a layer of the recorder between regions
// (RegionRecorder, region_recorder.hpp) and Recorder (recorder.hpp): the OpInfo a policy is asked with, and the
// answers of the open regions (which of them drop the value, and how one that saves it keeps it), refused for a
// compression where it is not supported yet. Recorder asks when it records an op and when it names one in place.
#pragma once

#include <cstdint>
#include <string>

#include "remat/detail/buffers.hpp"
#include "remat/detail/compression_formats.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/region_recorder.hpp"
#include "remat/errors.hpp"
#include "remat/op_info.hpp"

namespace remat::detail {

template <class T>
class PolicyDecisions : public RegionRecorder<T> {
  using Base = RegionRecorder<T>;

 public:
  using Base::Base;

  /// What a policy is told about op node `n`'s output, or about the output of shape `shape` of an op recorded with
  /// these attributes, whose forward FLOPs (OpTable::flops of its input shapes) are `flops` (OpInfo).
  OpInfo op_info(const Node<T>& n) const {
    Shape in[max_inputs];
    for (int k = 0; k < n.arity; ++k) in[k] = graph_[n.inputs[k]].shape;
    return op_info(n.op, n.attributes, n.shape, n.op->flops(in, n.arity, n.shape, n.attributes));
  }
  OpInfo op_info(const OpTable<T>* table, const Attributes& attributes, const Shape& shape, double flops) const {
    OpInfo info;
    info.name = table->name;
    info.kind = table->kind;
    info.batch_dims = table->batch_dims;
    if (attributes.tag >= 0) info.tag = graph_.tags[static_cast<std::size_t>(attributes.tag)];
    info.shape = shape;
    info.bytes = Buffers<T>::bytes(shape);
    info.flops = flops;
    return info;
  }

 protected:
  using Base::graph_;

  /// What the open regions answer for an op's output (Decision): the regions that drop it, and how it is kept.
  struct Answers {
    std::uint64_t drop_mask = 0;  // bit d: the open region at depth d does not save it
    std::uint8_t stored = 0;      // compression_code() of the innermost save_as, or 0
    int compressed_depth = 0;     // that region's depth (0: none)
    /// How the value is kept with this drop mask: the innermost save_as if no deeper region drops it (Decision).
    std::uint8_t stored_with(std::uint64_t mask) const { return compressed_depth > level_of(mask) ? stored : 0; }
  };
  /// The answers of the open regions (those opened at or before node `first`, when given: the regions enclosing
  /// an existing node). May throw (a user policy); throws tape_error naming the op and the policy's answer for a
  /// compressed answer where compression is not supported yet (a chain run by its schedule).
  Answers policy_decisions(const OpInfo& info, std::int32_t first = -1) const {
    Answers a;
    for (std::int32_t rid : graph_.open) {  // outermost first
      const Region& r = graph_.region(rid);
      if (first >= 0 && r.begin > first) break;
      const policies::Decision d = r.policy(r.policy_object, info);
      if (!d.saves()) {
        a.drop_mask |= std::uint64_t{1} << r.depth;
      } else if (d.compression() != Compression()) {
        a.compressed_depth = r.depth;  // deeper regions come later: the innermost answer wins
        a.stored = compression_code(d.compression());
      }
    }
    if (a.stored_with(a.drop_mask) != 0) check_compression_supported(info, a.stored);
    return a;
  }

 private:
  void check_compression_supported(const OpInfo& info, std::uint8_t stored) const {
    const char* where = nullptr;
    for (std::int32_t rid : graph_.open)
      if (!where && graph_.region(rid).plan >= 0) where = "inside a chain run by its schedule (run_schedule)";
    if (where)
      throw tape_error("checkpoint: the policy answered save_as(" + compression_of(stored).name() + ") for " +
                       std::string(info.name) + "'s output " + to_string(info.shape) +
                       ", and compressed residuals are not supported " + where +
                       " yet; use a policy that answers save or recompute there");
  }
};

}  // namespace remat::detail
