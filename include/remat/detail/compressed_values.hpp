// Compressed values, a layer of the lifetime rule (detail/lifetime.hpp) between its questions (LifetimeRule,
// lifetime_rule.hpp) and Lifetime, whose settle() calls settle_packed(): when a value a policy stores compressed is
// packed, when it is unpacked for a read, and when its packed buffer goes. How it is encoded, and which readers read
// only its sign, are packing.hpp's free functions.
//
// A value a policy stores compressed (Node::stored, policies::Decision::save_as) follows the same rule; only its
// buffer changes. Once it is kept only for pending readers (no handle, pin, view, regeneration or schedule holds it),
// it is packed: encoded into Node::packed and its value buffer freed. A read decodes it into a value buffer again
// (unpack: the sweep's backwards and replays), which the next settle frees; the packed buffer goes when no reader
// wants the value. For a replay a packed value is there (replay_plan.hpp). Stored as sign, a value is packed only
// when every reader that may still read it reads only its sign (OpBase::sign_reads) and no open region may add one
// that reads more (packable).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>

#include "remat/detail/buffers.hpp"
#include "remat/detail/lifetime_rule.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/packing.hpp"
#include "remat/detail/trace.hpp"

namespace remat::detail {

template <class T>
class CompressedValues : public LifetimeRule<T> {
  using Base = LifetimeRule<T>;

 public:
  using Base::Base;
  using Base::note, Base::wanted_for_itself, Base::read_at_this_level;

  // ---- compressed values (Node::stored; detail/packing.hpp) ----
  /// Under a memory budget, what makes room for a packed buffer before it is allocated (Evictor::make_room), so that
  /// packing stays within the budget; null without one.
  using RoomMaker = bool (*)(void* context, std::size_t bytes) noexcept;
  void set_room_maker(RoomMaker make_room, void* context) noexcept {
    room_maker_ = make_room;
    room_context_ = context;
  }
  std::size_t packed_bytes(const Node<T>& n) const { return detail::packed_bytes(graph_, n); }
  /// Its value may be kept packed now: only pending readers keep it (at this level), and, stored as sign, every
  /// reader that may read it reads only its sign: no replay, no open region that could add one, no reader from
  /// outside a region that returned it, and each backward that reads it declares the read in sign_reads. For a
  /// value packed already (a decoded copy), the regenerations of its evicted consumers do not count: they read it
  /// decoded too, when they run (EvictorChoice::inputs_regenerable).
  bool packable(const Node<T>& n) const {
    if (n.handles > 0 || n.pins > 0 || (n.regen_reads > 0 && !n.packed) || n.schedule_holds > 0 || n.view_holds > 0 ||
        n.evicted || !n.value_owned() || !read_at_this_level(n))
      return false;
    if (n.stored_format() != StoredFormat::sign) return true;
    return graph_.open.empty() && n.replay_reads == 0 && !n.pending && n.tiers < 0 && only_sign_readers(graph_, n);
  }
  /// Packs n's value when the rule keeps it only for readers, and frees the packed buffer when nothing wants the
  /// value. A pack that cannot get its buffer (std::bad_alloc) leaves the value as it is. Never throws.
  void settle_packed(Node<T>& n) noexcept {
    if (n.packed && !wanted_for_itself(n)) {
      free_packed(n);
      return;
    }
    if (!n.value || !packable(n)) return;
    if (!n.packed) {
      if (room_maker_) room_maker_(room_context_, packed_bytes(n));  // a budget's evictions (noted if it fails)
      try {
        n.packed = buffers_.allocate_elements(packed_bytes(n) / sizeof(T));
      } catch (...) {
        return;
      }
      if (!buffers_.simulating() && !buffers_.shapes_only()) {
        encode_packed(graph_, n);
        if (graph_.trace) graph_.trace->log_pack(graph_, static_cast<std::int32_t>(&n - graph_.nodes.data()));
      }
    }
    buffers_.free(n.value, n.shape);  // a decoded copy, or the value now packed
  }
  /// Decodes node `id`'s packed value into a value buffer for a read: for a backward that reads only its sign
  /// (`sign_only`) 1 where it was > 0 and 0 elsewhere (decode_packed). The sweep's dry run reserved the buffer.
  /// Never throws.
  void unpack(std::int32_t id, bool sign_only = false) noexcept {
    Node<T>& n = graph_[id];
    assert(n.packed && !n.value);
    note(id);
    n.value = buffers_.allocate(n.shape);
    if (!buffers_.simulating() && !buffers_.shapes_only()) {
      decode_packed(graph_, n, sign_only);
      if (graph_.trace) graph_.trace->log_unpack(graph_, id, sign_only);
    }
  }
  void free_packed(Node<T>& n) noexcept {
    note(static_cast<std::int32_t>(&n - graph_.nodes.data()));
    buffers_.free_elements(n.packed, packed_bytes(n) / sizeof(T));
  }

 protected:
  using Base::graph_, Base::buffers_;

 private:
  RoomMaker room_maker_ = nullptr;
  void* room_context_ = nullptr;
};

}  // namespace remat::detail
