// Checkpoint diagnostics: findings about checkpoint regions that save no memory (Tape::diagnostics,
// Tape::diagnose, Tape::set_diagnostics_handler; docs/checkpointing.md §Diagnostics).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace remat {

/// One checkpoint region that saves (almost) no memory, and why. The cases are the ones users of
/// jax.checkpoint and torch.utils.checkpoint report as surprises (jax#19822: checkpointing the last
/// layer before the loss; PyTorch forum: checkpointing a block whose inputs need no gradient).
struct CheckpointDiagnostic {
  /// Why the region saves (almost) nothing.
  enum class Kind {
    /// No op in the region requires a gradient (its inputs and captured values are constants or detached):
    /// its backward never runs, so it has nothing to drop and nothing to replay.
    needs_no_gradient,
    /// Its policy keeps every value its backward reads (or its ops read nothing they compute), so it drops
    /// nothing and replays nothing; `kept_bytes` is what its own values hold for the backward.
    drops_nothing,
    /// The first region the backward sweep replays (the last top-level one before the loss, or the one
    /// that contains it), when the sweep frees less than half of what that replay regenerates before it
    /// reaches the region: the `replay_bytes` come back while everything else is still saved, so the
    /// checkpoint lowers the peak by at most `freed_before_replay` bytes, less than half of what it drops.
    /// Leave the last segment unchecked, as checkpoint_sequential does.
    replays_at_once,
  };
  Kind kind = Kind::drops_nothing;      ///< which of the cases above
  int region = 0;                       ///< index of the region, in the order the regions were opened
  std::int32_t first_node = 0;          ///< its nodes are [first_node, end_node)
  std::int32_t end_node = 0;            ///< one past its last node
  int depth = 1;                        ///< 1 for a top-level region, 2 for a region inside it, …
  std::size_t replay_bytes = 0;         ///< bytes of values (and extras) its replay regenerates
  std::size_t kept_bytes = 0;           ///< drops_nothing: bytes of its values saved for the backward
  std::size_t freed_before_replay = 0;  ///< replays_at_once: saved bytes the sweep frees before reaching it
  std::int32_t loss = -1;               ///< replays_at_once: the node taken as the loss
  std::string message;                  ///< one line naming the region, the case and the bytes
};

/// Kind's name: "needs_no_gradient", "drops_nothing", "replays_at_once".
inline const char* to_string(CheckpointDiagnostic::Kind k) {
  switch (k) {
    case CheckpointDiagnostic::Kind::needs_no_gradient:
      return "needs_no_gradient";
    case CheckpointDiagnostic::Kind::drops_nothing:
      return "drops_nothing";
    case CheckpointDiagnostic::Kind::replays_at_once:
      return "replays_at_once";
  }
  return "?";
}

}  // namespace remat
