// What a policy sees of an operation: its name, kind, tag, shape, bytes and FLOPs.
#pragma once

#include <cstddef>
#include <string_view>

#include "remat/matrix.hpp"

namespace remat {

/// Broad class of an operation, used by policies (dots_saveable) and planners.
enum class OpKind {
  leaf,           ///< constant or variable
  dot,            ///< matmul, linear: GEMM work
  convolution,    ///< conv2d: products over sliding windows (JAX's conv_general_dilated)
  elementwise,    ///< tanh, +, exp, ...
  reduction,      ///< sum, mean, sum_rows
  normalization,  ///< softmax, log_softmax, layer_norm
  loss,           ///< cross_entropy, mse_loss
  random,         ///< dropout
  identity,       ///< checkpoint_name
  data_movement,  ///< embedding, slice_cols, concat_cols, transpose, reshape, detach: copies, no arithmetic
  constant,       ///< full_like, zeros_like, ones_like: written from the op's attributes, reading no tensor
};

/// Name of an OpKind, as printed in reports ("dot", "elementwise", ...).
inline const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::leaf:
      return "leaf";
    case OpKind::dot:
      return "dot";
    case OpKind::convolution:
      return "convolution";
    case OpKind::elementwise:
      return "elementwise";
    case OpKind::reduction:
      return "reduction";
    case OpKind::normalization:
      return "normalization";
    case OpKind::loss:
      return "loss";
    case OpKind::random:
      return "random";
    case OpKind::identity:
      return "identity";
    case OpKind::data_movement:
      return "data_movement";
    case OpKind::constant:
      return "constant";
  }
  return "unknown";
}

/// Description of one recorded operation, passed to a checkpoint policy when the op is recorded
/// inside a checkpoint region. A policy returns true when the op's output may be saved as a residual.
struct OpInfo {
  std::string_view name;              ///< op name, e.g. "matmul"
  OpKind kind = OpKind::elementwise;  ///< what the op computes: a product (dots_saveable keeps it), elementwise, …
  std::string_view tag;               ///< name given by checkpoint_name(), empty otherwise
  bool batch_dims = false;            ///< a dot with batch dimensions (a batched product, e.g. attention scores)
  Shape shape;                        ///< output shape
  std::size_t bytes = 0;              ///< output bytes (rows * cols * sizeof(T))
  double flops = 0;                   ///< FLOP estimate of the forward computation
};

}  // namespace remat
