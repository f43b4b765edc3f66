// Strong exception safety by fault injection (docs/design.md §3): recording (leaves, every op, inside and
// outside nested checkpoint regions, opening and closing regions), backward with and without
// retain_graph, and gradient() either succeed or throw std::bad_alloc and leave the tape exactly as it
// was.
//
// Each script below is a whole recorded step. It runs once to count its allocation events (operator new,
// pool misses through remat::detail::allocation_hook and, outside AddressSanitizer builds, every other
// malloc; see allocation_counter.hpp), then once per event k on a fresh tape (an empty pool) with the
// k-th allocation failing. The library call during which it fails must throw std::bad_alloc and leave
// the tape's memory() figures, size(), nodes (values, gradients, lifetime counters, handles), random
// offset and the Parameters' gradients as they were; the same call is then repeated without injection,
// the script goes on, and its final gradients (tape variables, Parameters, gradient() results) and
// memory() figures must be bitwise equal to the run without injection.
//
// conv2d's float kernels run with oneDNN off here (im2col): oneDNN allocates small objects inside each primitive
// call, so an allocation failure in a backward ends the program (conv2d's doc comment), and oneDNN 2.6 itself
// crashed when malloc returned null inside it.
//
// OWN EXECUTABLE: this file replaces the global operator new/delete and malloc (allocation_counter.hpp);
// tests/CMakeLists.txt builds every tests/alloc/*_test.cpp as a separate program.
#include "allocation_counter.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "blas_threads.hpp"
#include "op_list.hpp"
#include "w2_model.hpp"

namespace {

using remat::Matrix;
using V = remat::Var<float>;
using Pause = remat_alloc::Injection::Pause;

std::uint64_t hash(const float* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

std::string describe(const remat::MemoryStats& m) {
  std::ostringstream s;
  s << "live " << m.live_bytes << " peak " << m.peak_bytes << " saved " << m.saved_bytes << " replayed "
    << m.replayed_bytes << " (" << m.replayed_ops << " ops) cached " << m.cached_bytes;
  return s.str();
}
bool same(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes;
}

// ---- everything observable about a tape and its Parameters ----

struct NodeState {
  const float *value, *extra, *grad;
  std::uint64_t value_hash, grad_hash;
  std::int32_t handles, backward_reads, replay_reads;
  bool pending, extra_read, grad_assigned;
  int level;
  bool evicted;  // under a memory budget
  std::int32_t regen_reads, pins;

  bool operator==(const NodeState& o) const {
    return value == o.value && extra == o.extra && grad == o.grad && value_hash == o.value_hash &&
           grad_hash == o.grad_hash && handles == o.handles && backward_reads == o.backward_reads &&
           replay_reads == o.replay_reads && pending == o.pending && extra_read == o.extra_read &&
           grad_assigned == o.grad_assigned && level == o.level && evicted == o.evicted &&
           regen_reads == o.regen_reads && pins == o.pins;
  }
};

struct ParameterState {
  std::uint64_t version;
  bool has_grad;
  const float* grad;
  std::uint64_t grad_hash;
  bool operator==(const ParameterState& o) const {
    return version == o.version && has_grad == o.has_grad && grad == o.grad && grad_hash == o.grad_hash;
  }
};

struct Snapshot {
  remat::MemoryStats memory;
  std::size_t size = 0;
  int open_depth = 0;
  std::uint64_t random_offset = 0;
  std::vector<NodeState> nodes;
  std::vector<ParameterState> parameters;
};

/// Where each call of a script falls in its sequence of allocation events (from the uninjected run):
/// call number c (in the order calls begin) saw events (begin, end].
struct CallSpan {
  long begin = 0, end = 0;
};

/// Runs every library call of a script (W2Model's `call`, and the scripts below). Before the call in
/// which the injected failure will happen it takes a Snapshot; when that call throws std::bad_alloc it
/// compares the tape with the Snapshot and repeats the call.
class Driver {
 public:
  Driver(remat::Tape<float>& tape, remat_alloc::Injection& injection, long fail_at, std::vector<CallSpan>* spans)
      : tape_(tape), injection_(injection), fail_at_(fail_at), spans_(spans) {}

  /// Parameters whose gradient state the snapshots compare (pointers must stay valid).
  void track(remat::Parameter<float>& p) { parameters_.push_back(&p); }

  template <class F>
  auto operator()(const char* what, F&& f) -> decltype(f()) {
    using R = decltype(f());
    remat_alloc::Injection::Scope scope;
    const std::size_t index = next_call_++;
    if (fail_at_ == 0) {  // the reference run: learn each call's events
      {
        Pause pause;
        spans_->push_back({injection_.events(), 0});
      }
      struct Close {
        Driver* d;
        std::size_t index;
        ~Close() { (*d->spans_)[index].end = d->injection_.events(); }
      } close{this, index};
      return finish<R>(f);
    }
    const bool fails_here = !injection_.fired() && index < spans_->size() && (*spans_)[index].begin < fail_at_ &&
                            fail_at_ <= (*spans_)[index].end;
    if (!fails_here) return finish<R>(f);
    Snapshot before;
    {
      Pause pause;
      before = snapshot();
    }
    try {
      return finish<R>(f);
    } catch (const std::bad_alloc&) {
      if (!injection_.fired()) throw;
      Pause pause;
      if (caught_in.empty()) caught_in = what;
      ++caught;
      compare(before, snapshot());
    }
    return finish<R>(f);  // the same call, without injection now
  }

  int caught = 0;
  std::string caught_in;              ///< the innermost call that caught the injected failure
  std::vector<std::string> problems;  ///< how the tape differed from its state before that call

 private:
  template <class R, class F>
  R finish(F& f) {
    if constexpr (std::is_void_v<R>) {
      f();
    } else {
      R r = f();
      if constexpr (std::is_same_v<R, V>) {
        if (auto* s = remat::detail::VarAccess::state(r)) state_ = s;
      }
      return r;
    }
  }

  Snapshot snapshot() const {
    Snapshot s;
    s.memory = tape_.memory();
    s.size = tape_.size();
    if (state_) {
      s.open_depth = state_->open_depth();
      s.random_offset = state_->random_offset();
      for (std::int32_t i = 0; i < state_->size(); ++i) {
        const auto& n = state_->node(i);
        s.nodes.push_back({n.value, n.extra, n.grad, n.value ? hash(n.value, std::size_t(n.shape.numel())) : 0,
                           n.grad ? hash(n.grad, std::size_t(n.shape.numel())) : 0, n.handles, n.backward_reads,
                           n.replay_reads, n.pending, n.extra_read, n.grad_assigned, n.level, n.evicted, n.regen_reads,
                           n.pins});
      }
    }
    for (remat::Parameter<float>* p : parameters_) {
      const auto& storage = *remat::detail::ParameterAccess::storage(*p);
      s.parameters.push_back({p->version(), p->has_grad(), storage.grad,
                              p->has_grad() ? hash(storage.grad, std::size_t(storage.grad_size)) : 0});
    }
    return s;
  }

  void compare(const Snapshot& a, const Snapshot& b) {
    auto problem = [&](const std::string& s) { problems.push_back(s); };
    if (!same(a.memory, b.memory)) problem("memory() " + describe(a.memory) + " became " + describe(b.memory));
    if (a.size != b.size) problem("size() " + std::to_string(a.size) + " became " + std::to_string(b.size));
    if (a.open_depth != b.open_depth)
      problem("open regions " + std::to_string(a.open_depth) + " became " + std::to_string(b.open_depth));
    if (a.random_offset != b.random_offset) problem("the random offset changed");
    for (std::size_t i = 0; i < std::min(a.nodes.size(), b.nodes.size()); ++i) {
      if (!(a.nodes[i] == b.nodes[i])) problem("node #" + std::to_string(i) + " changed");
      if (b.nodes[i].handles > 0 && !b.nodes[i].value && !b.nodes[i].evicted)
        problem("node #" + std::to_string(i) + " has a handle but no value");
    }
    for (std::size_t i = 0; i < a.parameters.size(); ++i)
      if (!(a.parameters[i] == b.parameters[i]))
        problem("the gradient state of Parameter " + std::to_string(i) + " changed");
  }

  remat::Tape<float>& tape_;
  remat_alloc::Injection& injection_;
  long fail_at_;
  std::vector<CallSpan>* spans_;
  std::vector<remat::Parameter<float>*> parameters_;
  remat::detail::TapeState<float>* state_ = nullptr;
  std::size_t next_call_ = 0;
};

/// What a script ends with: the matrices to compare bitwise, and the tape's figures.
struct Outcome {
  std::vector<Matrix<float>> results;
  remat::MemoryStats memory;
  long events = 0;
  bool fired = false;
  int caught = 0;
  std::string caught_in, escaped;
  std::vector<std::string> problems;
};

using Script = std::vector<Matrix<float>> (*)(remat::Tape<float>&, Driver&);

Outcome run(Script script, long fail_at, std::vector<CallSpan>& spans) {
  Outcome o;
  remat_alloc::Injection injection(fail_at);
  {
    remat::Tape<float> tape;  // fresh: the pool starts empty
    Driver d(tape, injection, fail_at, &spans);
    try {
      o.results = script(tape, d);
    } catch (const std::bad_alloc&) {
      o.escaped = "std::bad_alloc escaped every call";
    } catch (const std::exception& e) {
      o.escaped = std::string("exception: ") + e.what();
    }
    o.memory = tape.memory();
    o.caught = d.caught;
    o.caught_in = d.caught_in;
    o.problems = d.problems;
  }
  o.events = injection.events();
  o.fired = injection.fired();
  return o;
}

bool bitwise_equal(const Matrix<float>& a, const Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), std::size_t(a.size()) * sizeof(float)) == 0;
}

/// Fails each allocation event of `script` in turn (see the file comment).
void fail_every_allocation(Script script) {
  std::vector<CallSpan> spans;
  run(script, 0, spans);  // warms up what allocates once per process (OpenBLAS, the op list)
  spans.clear();
  const Outcome reference = run(script, 0, spans);
  ASSERT_TRUE(reference.escaped.empty()) << reference.escaped;
  ASSERT_GT(reference.events, 0);
  std::map<std::string, int> caught_per_call, broken_per_call;
  std::string report;
  int broken = 0;
  for (long k = 1; k <= reference.events; ++k) {
    const Outcome o = run(script, k, spans);
    std::vector<std::string> problems = o.problems;
    if (!o.fired) problems.push_back("never reached");
    if (o.caught != 1) problems.push_back("caught " + std::to_string(o.caught) + " times");
    if (!o.escaped.empty()) problems.push_back(o.escaped);
    if (o.escaped.empty()) {
      if (!same(o.memory, reference.memory))
        problems.push_back("final memory() " + describe(o.memory) + ", without injection " +
                           describe(reference.memory));
      if (o.results.size() != reference.results.size())
        problems.push_back("the script ended with " + std::to_string(o.results.size()) + " results, not " +
                           std::to_string(reference.results.size()));
      else
        for (std::size_t i = 0; i < o.results.size(); ++i)
          if (!bitwise_equal(o.results[i], reference.results[i])) {
            problems.push_back("final result " + std::to_string(i) + " differs");
            break;
          }
    }
    ++caught_per_call[o.caught_in];
    if (problems.empty()) continue;
    ++broken_per_call[o.caught_in];
    if (++broken <= 25) {
      report += "  allocation event " + std::to_string(k) + " (in " + o.caught_in + "):";
      for (const std::string& p : problems) report += " " + p + ";";
      report += "\n";
    }
  }
  std::string calls;
  for (const auto& [call, count] : caught_per_call) calls += " " + call + " " + std::to_string(count) + ",";
  std::printf("%ld allocation events%s; failures injected per call:%s\n", reference.events,
              remat_alloc::sanitizer_build ? " (AddressSanitizer build: plain mallocs not injected)" : "",
              calls.c_str());
  std::string broken_calls;
  for (const auto& [call, count] : broken_per_call) broken_calls += " " + call + " " + std::to_string(count) + ",";
  EXPECT_EQ(broken, 0) << "calls that broke the guarantee (failures per call):" << broken_calls << "\n" << report;
}

// ---- the scripts ----

/// The op list's entries, each on its first shape set with more than one element (or its only one).
const std::vector<std::pair<const remat_test::OpCase*, remat_test::ShapeSet>>& op_cases() {
  Pause pause;  // built once, by the first (uncounted) run
  static const auto cases = [] {
    std::vector<std::pair<const remat_test::OpCase*, remat_test::ShapeSet>> c;
    for (const remat_test::OpCase& op : remat_test::op_list()) {
      // The guarantee is per op: an entry composing ops (softmax of causal scores, a three-part concat)
      // can fail after its first op, which then stays recorded. Their ops are covered on their own (the
      // causal temporary by scaled_dot_product_attention_causal, concat_cols by its two-part entry).
      if (op.recorded_ops > 1) continue;
      const remat_test::ShapeSet* shapes = &op.shape_sets[0];
      for (const auto& s : op.shape_sets)
        if (s[0].size() > 1) {
          shapes = &s;
          break;
        }
      c.emplace_back(&op, *shapes);
    }
    return c;
  }();
  return cases;
}

/// Leaves and ops of the op list, kept for the end of a script.
struct OpsRecording {
  std::vector<remat::Parameter<float>> parameters;  // reserved: pointers stay valid
  std::vector<V> variables;                         // tape variables (their gradients are compared)
  std::vector<V> outputs;                           // one per op
};

/// Records every op of the list on leaves made here: input 0 of op j is a tape variable (j even) or a
/// Parameter (j odd), further inputs rotate through variable, Parameter, constant. With `internal`,
/// every input passes through affine(·, 1, 0) first, so that the ops read values computed inside the
/// enclosing region. Returns Σ_j sum(op_j ⊙ weights_j) recorded on the tape.
V record_ops(remat::Tape<float>& tape, Driver& d, OpsRecording& rec, std::size_t first, std::size_t last,
             bool internal) {
  const auto& cases = op_cases();
  V total;
  for (std::size_t j = first; j < last && j < cases.size(); ++j) {
    const remat_test::OpCase& op = *cases[j].first;
    const remat_test::ShapeSet& shapes = cases[j].second;
    std::vector<Matrix<float>> values;
    remat_test::Inputs<float> in;
    {
      Pause pause;
      values = remat_test::make_inputs<float>(op, shapes, 100 + j);
      in.reserve(values.size());
    }
    for (std::size_t k = 0; k < values.size(); ++k) {
      const std::size_t kind = k == 0 ? j % 2 : (j + k) % 3;
      V leaf;
      if (kind == 0) {
        leaf = d("variable", [&] { return remat_test::leaf(tape, values[k], shapes[k]); });
        Pause pause;
        rec.variables.push_back(leaf);
      } else if (kind == 1) {
        remat::Parameter<float>* p;
        {
          Pause pause;
          rec.parameters.push_back(remat_test::parameter(values[k], shapes[k]));
          p = &rec.parameters.back();
          d.track(*p);
        }
        leaf = d("variable (Parameter)", [&] { return tape.variable(*p); });
      } else {
        leaf = d("constant", [&] { return remat_test::leaf(tape, values[k], shapes[k], /*variable=*/false); });
      }
      if (internal) leaf = d("affine", [&] { return remat::affine(leaf, 1.0, 0.0); });
      Pause pause;
      in.push_back(leaf);
    }
    V out = d(op.name.c_str(), [&] { return op.build(in); });
    {
      Pause pause;
      rec.outputs.push_back(out);
    }
    // remat_test::scalar_loss, one call per recorded node: sum(out ⊙ weights)
    Matrix<float> weights;
    {
      Pause pause;
      weights = remat_test::loss_weights<float>(out.shape(), 7 + j);
    }
    V w = d("constant", [&] { return remat_test::leaf(tape, weights, out.shape(), /*variable=*/false); });
    V weighted = d("multiply", [&] { return out * w; });
    V term = d("sum", [&] { return remat::sum(weighted); });
    total = total.valid() ? d("add", [&] { return total + term; }) : term;
  }
  return total;
}

/// The gradients a script compares: tape variables', Parameters', then `extra`.
std::vector<Matrix<float>> gradients(const OpsRecording& rec, std::vector<Matrix<float>> extra) {
  std::vector<Matrix<float>> out;
  for (const V& v : rec.variables) out.emplace_back(v.grad());
  for (const auto& p : rec.parameters) out.emplace_back(p.grad());
  for (auto& m : extra) out.push_back(std::move(m));
  return out;
}

/// backward(retain_graph) → gradient(retain_graph) for the first variable and an op output → backward.
std::vector<Matrix<float>> sweeps(remat::Tape<float>& tape, Driver& d, OpsRecording& rec, const V& loss) {
  d("backward (retain_graph)", [&] { tape.backward(loss, true); });
  const V& wrt = rec.outputs.front().requires_grad() ? rec.outputs.front() : rec.variables.front();
  std::vector<Matrix<float>> g = d("gradient (retain_graph)", [&] {
    return tape.gradient(loss, {rec.variables.front(), wrt}, true);
  });
  d("backward", [&] { tape.backward(loss); });
  std::vector<Matrix<float>> extra{Matrix<float>::Constant(1, 1, loss.item())};
  for (auto& m : g) extra.push_back(m);
  return gradients(rec, extra);
}

/// Every op of the list recorded outside any region, a leaf made from an Eigen product expression, then
/// backward with retain_graph, gradient() with retain_graph and a final backward.
std::vector<Matrix<float>> ops_outside_regions(remat::Tape<float>& tape, Driver& d) {
  OpsRecording rec;
  rec.parameters.reserve(200);
  V loss = record_ops(tape, d, rec, 0, 1000, false);
  Matrix<float> a = remat_test::random_matrix<float>(12, 12, 3), b = remat_test::random_matrix<float>(12, 1, 4);
  V product = d("constant (product expression)", [&] { return tape.constant(a * a * b); });  // an Eigen temporary
  V summed = d("sum", [&] { return remat::sum(product); });
  V scaled = d("affine", [&] { return summed * 1e-3; });
  loss = d("add", [&] { return loss + scaled; });
  return sweeps(tape, d, rec, loss);
}

/// The same ops inside nested regions: an outer dots_saveable region holding a nothing_saveable region
/// (first half of the list) and a save_only_these_names({"tagged"}) region (second half); leaves are
/// recorded inside the inner regions and every op reads values computed there.
std::vector<Matrix<float>> ops_inside_nested_regions(remat::Tape<float>& tape, Driver& d) {
  OpsRecording rec;
  rec.parameters.reserve(200);
  const std::size_t half = op_cases().size() / 2;
  const auto names = remat::policies::save_only_these_names({"tagged"});
  V anchor = d("variable", [&] { return tape.variable(Matrix<float>::Constant(2, 3, 0.5f)); });
  rec.variables.push_back(anchor);
  V loss = d("checkpoint (outer, dots_saveable)", [&] {
    return remat::checkpoint(
        [&](V x) {
          V first = d("checkpoint (inner, nothing_saveable)", [&] {
            return remat::checkpoint(
                [&](V y) {
                  V t = record_ops(tape, d, rec, 0, half, true);
                  V s = d("sum", [&] { return remat::sum(y); });
                  return d("add", [&] { return t + s; });
                },
                remat::policies::nothing_saveable)(x);
          });
          V second = d("checkpoint (inner, names)", [&] {
            return remat::checkpoint([&](V) { return record_ops(tape, d, rec, half, 1000, true); }, names)(x);
          });
          return d("add", [&] { return first + second; });
        },
        remat::policies::dots_saveable)(anchor);
  });
  return sweeps(tape, d, rec, loss);
}

/// Two W2-like training steps, then a forward, backward with retain_graph and gradient(), on a tape under
/// `budget` (0: none; `call`: the Driver, or Identity for the probe runs).
template <class Call>
std::vector<Matrix<float>> w2_steps_under_budget(remat::Tape<float>& tape, Call& d, std::size_t budget) {
  remat_alloc_test::W2Shape shape;
  shape.batch = 4;
  shape.width = 8;
  shape.hidden = 12;
  shape.classes = 5;
  tape.set_memory_budget(budget);
  remat_alloc_test::W2Model model(shape);
  if constexpr (std::is_same_v<Call, Driver>)
    for (auto& p : model.parameters()) d.track(p);
  std::vector<Matrix<float>> out;
  out.emplace_back(Matrix<float>::Constant(1, 1, model.step(tape, d, 1)));
  out.emplace_back(Matrix<float>::Constant(1, 1, model.step(tape, d, 2)));
  V loss = model.record_forward(tape, d);
  d("backward (retain_graph)", [&] { tape.backward(loss, true); });
  const auto& p = model.parameter_vars();
  std::vector<Matrix<float>> g = d("gradient", [&] {
    return tape.gradient(loss, {p[0], p[2], p[9], p.back()}, false);
  });
  const remat::MemoryStats m = tape.memory();
  if (budget != 0) {
    EXPECT_LE(m.peak_bytes, budget);
  }
  out.emplace_back(Matrix<float>::Constant(1, 1, loss.item()));
  out.emplace_back(Matrix<float>::Constant(1, 1, static_cast<float>(m.evictions)));
  out.emplace_back(Matrix<float>::Constant(1, 1, static_cast<float>(m.rematerialized_ops)));
  for (auto& m2 : g) out.push_back(m2);
  for (auto& param : model.parameters()) {
    out.emplace_back(param.value());
    out.emplace_back(param.grad());
  }
  return out;
}

/// Two W2-like training steps (Adam, clear), then a third forward, backward with retain_graph and
/// gradient() without it.
std::vector<Matrix<float>> w2_training(remat::Tape<float>& tape, Driver& d) {
  return w2_steps_under_budget(tape, d, 0);
}

/// The W2-like steps under the lowest budget, in 4 % steps of the plain step's peak, at which all of them run
/// (found by probe runs without injection): every recorded op, backward and gradient() may evict and
/// regenerate, and each allocation event of those (the trials' reservations, the dry runs') fails in turn.
std::vector<Matrix<float>> w2_training_under_budget(remat::Tape<float>& tape, Driver& d) {
  static const std::size_t budget = [] {
    Pause pause;
    remat_alloc_test::Identity identity;
    std::size_t peak = 0, lowest = 0;
    {
      remat::Tape<float> t;
      remat_alloc_test::W2Shape shape;
      shape.batch = 4;
      shape.width = 8;
      shape.hidden = 12;
      shape.classes = 5;
      remat_alloc_test::W2Model m(shape);
      V loss = m.record_forward(t, identity);
      t.backward(loss);
      peak = t.memory().peak_bytes;
    }
    for (int pct = 100; pct >= 40; pct -= 4) {
      remat::Tape<float> t;
      try {
        const std::vector<Matrix<float>> r = w2_steps_under_budget(t, identity, peak * pct / 100);
        if (r[3](0, 0) > 0) lowest = peak * pct / 100;  // evicted
      } catch (const remat::memory_budget_error&) {
        break;
      }
    }
    return lowest;
  }();
  EXPECT_GT(budget, 0u) << "no budget below the plain peak evicts and runs";
  return w2_steps_under_budget(tape, d, budget);
}

/// Recording products big enough for Eigen's own GEMM (without BLAS) to malloc its packing buffers in
/// the forward: there the failure hits an op's forward after its buffers were taken, which the tape
/// undoes. The backward runs outside the driver: without BLAS, a product in the sweep (which cannot
/// throw once it changes the tape) that fails to allocate terminates (docs/design.md §2.5).
std::vector<Matrix<float>> large_products(remat::Tape<float>& tape, Driver& d) {
  remat::Parameter<float> w1(remat_test::random_matrix<float>(128, 512, 21));
  remat::Parameter<float> w2(remat_test::random_matrix<float>(512, 128, 22));
  d.track(w1);
  d.track(w2);
  const Matrix<float> xm = remat_test::random_matrix<float>(32, 128, 23);
  V x = d("variable", [&] { return tape.variable(xm); });
  V a = d("variable (Parameter)", [&] { return tape.variable(w1); });
  V b = d("variable (Parameter)", [&] { return tape.variable(w2); });
  V h = d("matmul", [&] { return remat::matmul(x, a); });
  h = d("tanh", [&] { return remat::tanh(h); });
  h = d("matmul", [&] { return remat::matmul(h, b); });
  V loss = d("mean", [&] { return remat::mean(h); });
  tape.backward(loss);
  return {Matrix<float>(x.grad()), Matrix<float>(w1.grad()), Matrix<float>(w2.grad())};
}

// See the file comment: the op list's conv2d takes im2col, whose kernels allocate nothing.
const bool onednn_off = (remat::backends::onednn::set_enabled(false), true);

TEST(StrongExceptionSafety, EveryOpOutsideRegionsAndBackward) {
  fail_every_allocation(&ops_outside_regions);
}

TEST(StrongExceptionSafety, EveryOpInsideNestedRegionsAndBackward) {
  fail_every_allocation(&ops_inside_nested_regions);
}

TEST(StrongExceptionSafety, W2TrainingSteps) {
  fail_every_allocation(&w2_training);
}

TEST(StrongExceptionSafety, W2TrainingStepsUnderAMemoryBudget) {
  fail_every_allocation(&w2_training_under_budget);
}

TEST(StrongExceptionSafety, RecordingLargeProducts) {
  fail_every_allocation(&large_products);
}

}  // namespace
