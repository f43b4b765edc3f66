// Values a policy stores compressed (Node::stored, policies::Decision::save_as): what their readers read, how many
// bytes the packed buffer takes, and encoding into it and decoding from it. Free functions of the graph: Lifetime
// (its layer CompressedValues, compressed_values.hpp) decides when a value is packed and unpacked.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>

#include "remat/compression.hpp"
#include "remat/detail/compression_formats.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/parallel.hpp"

namespace remat::detail {

/// Whether some backward that reads n's value (its own, through reads_output, or a consumer's, through its input
/// read) is one for which `matches(op, read)` holds, `read` being the Reads bit of that read.
template <class T, class Matches>
bool any_backward_read(const Graph<T>& graph, const Node<T>& n, Matches matches) {
  if ((n.reads & reads_output) && matches(*n.op, reads_output)) return true;
  for (std::int32_t e = n.first_use; e >= 0; e = graph[e / max_inputs].next_use[e % max_inputs]) {
    const Node<T>& c = graph[e / max_inputs];
    const unsigned read = reads_input(e % max_inputs);
    if ((c.reads & read) && matches(*c.op, read)) return true;
  }
  return false;
}

/// Every backward that reads n's value reads only its sign (OpBase::sign_reads).
template <class T>
bool only_sign_readers(const Graph<T>& graph, const Node<T>& n) {
  return !any_backward_read(graph, n, [](const OpTable<T>& op, unsigned read) { return !(op.sign_reads & read); });
}

/// Whether node i's backward reads value `id` only through its sign (OpBase::sign_reads), in every read of it: an op
/// may read one value as two inputs, and a full read needs the value decoded as it is.
template <class T>
bool only_sign_read(const Graph<T>& graph, std::int32_t i, std::int32_t id) {
  const Node<T>& n = graph[i];
  for (int k = 0; k < n.arity; ++k)
    if ((n.reads & reads_input(k)) && n.inputs[k] == id && !(n.op->sign_reads & reads_input(k))) return false;
  return !((n.reads & reads_output) && i == id && !(n.op->sign_reads & reads_output));
}

/// Whether n's packed buffer also holds its exact sign, for a reader that reads only that (relu's backward): a lossy
/// format would turn a small positive value into 0 and change relu's derivative there (ActNN keeps relu's mask apart
/// for this reason). A function of the graph: a value's readers are all recorded once it is packed.
template <class T>
bool with_sign_mask(const Graph<T>& graph, const Node<T>& n) {
  if (n.stored_format() != StoredFormat::bf16 && n.stored_format() != StoredFormat::int8) return false;
  return any_backward_read(graph, n, [](const OpTable<T>& op, unsigned read) { return (op.sign_reads & read) != 0; });
}

/// Bytes of n's packed buffer: its Compression's stored_bytes (whole elements of T), then the sign mask of
/// with_sign_mask if it has one.
template <class T>
std::size_t packed_bytes(const Graph<T>& graph, const Node<T>& n) {
  const std::size_t stored = compression_of(n.stored).stored_bytes(n.shape, sizeof(T));
  return with_sign_mask(graph, n) ? stored + Compression::sign().stored_bytes(n.shape, sizeof(T)) : stored;
}

/// `code(first, last)` over blocks of n's elements on remat's thread team, for the formats that encode ranges apart
/// (full, bf16, int8): blocks of about block_elements, each a multiple of range_unit (an int8 group, its codes and its
/// scale, belong to one block) and of 16 elements (aligned vector loads); at once for sign, whose 64-bit words cross
/// the blocks. Which thread runs a block changes no bit, and neither does the split (encode()).
template <class T, class Code>
void by_blocks(const Node<T>& n, Code code) {
  const Index total = n.shape.numel();
  if (n.stored_format() == StoredFormat::sign) {
    code(Index(0), total);
    return;
  }
  const Index unit = range_unit(compression_of(n.stored), n.shape), aligned = unit * (16 / std::gcd<Index>(unit, 16));
  const Index size = std::max(aligned, block_elements / aligned * aligned);
  for_blocks(make_blocks(total, size, above_grain(total, 4)),
             [&](Index first, Index count) { code(first, first + count); });
}

/// Encodes n's value into n.packed (packed_bytes of it).
template <class T>
void encode_packed(const Graph<T>& graph, Node<T>& n) {
  const Compression c = compression_of(n.stored);
  by_blocks(n, [&](Index first, Index last) { encode(c, n.shape, n.value, n.packed, first, last); });
  if (with_sign_mask(graph, n))
    encode(Compression::sign(), n.shape, n.value,
           reinterpret_cast<unsigned char*>(n.packed) + c.stored_bytes(n.shape, sizeof(T)));
}

/// Decodes n.packed into n.value: the value as its format keeps it, or, for a reader of the sign alone
/// (`sign_only`), 1 where it was > 0 and 0 elsewhere, from the mask of with_sign_mask when it has one.
template <class T>
void decode_packed(const Graph<T>& graph, Node<T>& n, bool sign_only) {
  const Compression c = compression_of(n.stored);
  if (!sign_only || !with_sign_mask(graph, n)) {
    by_blocks(n, [&](Index first, Index last) { decode(c, n.shape, n.packed, n.value, first, last); });
    return;
  }
  decode(Compression::sign(), n.shape,
         reinterpret_cast<const unsigned char*>(n.packed) + c.stored_bytes(n.shape, sizeof(T)), n.value);
}

}  // namespace remat::detail
