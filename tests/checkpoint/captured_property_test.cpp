// Property test: the random programs of random_program.hpp (mixed ops, transformer ops, nested checkpoint
// regions under every policy, constants, tape variables and Parameters), each captured once by
// remat::CapturedStep and replayed with new leaf data and updated Parameters, against the same program recorded
// afresh on a Tape with those values (the oracle: the plain path, which shares none of the trace's
// bookkeeping). Loss and every gradient must agree bit for bit at every replay, with and without a memory budget
// that evicts. Evaluation mode on both sides: dropout records nothing (a captured step refuses random ops).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "checkpoint_support.hpp"
#include "random_program.hpp"
#include "remat/remat.hpp"

namespace captured_property_test {

using namespace random_program;

constexpr int program_count = 60;

/// Loss and the differentiable leaves' gradients of `program` recorded on a fresh Tape (the oracle).
template <class T>
std::vector<Matrix<T>> recorded(const Program& program, std::size_t budget) {
  Tape<T> tape;
  tape.set_training(false);
  if (budget) tape.set_memory_budget(budget);
  Recorder<T> rec(tape, /*checkpoint=*/true, /*describe=*/false);
  std::vector<std::unique_ptr<Parameter<T>>> parameters;
  std::vector<typename Recorder<T>::Value> leaves;
  for (const LeafSpec& l : program.leaves) leaves.push_back(record_leaf(rec, l, parameters));
  const Var<T> loss = Executor<T>(program, rec).run(leaves).var;
  std::vector<Matrix<T>> out{Matrix<T>(loss.value())};
  tape.backward(loss);
  // The budget is the step's. Reading a variable's gradient afterwards allocates zeros for one the loss does not
  // reach (a CapturedStep returns its zeros without allocating), which a tight budget may not hold: a program
  // whose views leave its peak just under its leaves and gradients would throw here and nowhere in the step.
  tape.set_memory_budget(0);
  std::size_t p = 0;
  for (std::size_t k = 0; k < program.leaves.size(); ++k) {
    const auto kind = program.leaves[k].kind;
    if (kind == remat_oracle::Leaf::variable) out.push_back(Matrix<T>(leaves[k].var.grad()));
    if (kind == remat_oracle::Leaf::parameter) out.push_back(Matrix<T>(parameters[p++]->grad()));
  }
  return out;
}

/// The same program captured once; replay r uses leaf data `data(r)` (constants and variables through
/// set_input, Parameters assigned in place).
template <class T>
class Captured {
 public:
  Captured(const Program& program, std::size_t budget) : program_(program) {
    for (const LeafSpec& l : program.leaves)
      if (l.kind == remat_oracle::Leaf::parameter) parameters_.push_back(make_parameter<T>(l.shape, l.data.cast<T>()));
    step_ = std::make_unique<remat::CapturedStep<T>>([&](Tape<T>& tape) {
      tape.set_training(false);
      if (budget) tape.set_memory_budget(budget);
      Recorder<T> rec(tape, /*checkpoint=*/true, /*describe=*/false);
      std::vector<typename Recorder<T>::Value> leaves;
      std::size_t p = 0;
      for (const LeafSpec& l : program.leaves) {
        if (l.kind == remat_oracle::Leaf::constant)
          leaves.push_back(rec.constant(l.shape, l.data.cast<T>()));
        else if (l.kind == remat_oracle::Leaf::variable)
          leaves.push_back(rec.variable(l.shape, l.data.cast<T>()));
        else
          leaves.push_back(rec.parameter(*parameters_[p++], l.shape));
        leaves_.push_back(leaves.back().var);
      }
      return Executor<T>(program, rec).run(leaves).var;
    });
  }

  /// Runs the step again on `program`'s leaf data (same shapes) and returns loss and gradients as recorded().
  std::vector<Matrix<T>> replay(const Program& program) {
    std::size_t p = 0;
    for (std::size_t k = 0; k < program.leaves.size(); ++k) {
      const LeafSpec& l = program.leaves[k];
      if (l.kind == remat_oracle::Leaf::parameter) {
        parameters_[p]->mutable_value() = l.data.cast<T>();  // in place: same shape, same storage
        parameters_[p++]->zero_grad();
      } else {
        step_->set_input(leaves_[k], l.data.cast<T>());
      }
    }
    std::vector<Matrix<T>> out{Matrix<T>::Constant(1, 1, step_->replay())};
    collect(out);
    return out;
  }
  std::vector<Matrix<T>> first() {
    std::vector<Matrix<T>> out{Matrix<T>::Constant(1, 1, step_->last_loss())};
    collect(out);
    return out;
  }
  const remat::MemoryStats memory() const { return step_->memory(); }

 private:
  void collect(std::vector<Matrix<T>>& out) {
    std::size_t p = 0;
    for (std::size_t k = 0; k < program_.leaves.size(); ++k) {
      const auto kind = program_.leaves[k].kind;
      if (kind == remat_oracle::Leaf::variable) out.push_back(Matrix<T>(leaves_[k].grad()));
      if (kind == remat_oracle::Leaf::parameter) out.push_back(Matrix<T>(parameters_[p++]->grad()));
    }
  }
  const Program& program_;
  std::vector<std::unique_ptr<Parameter<T>>> parameters_;  // outlive the step
  std::vector<Var<T>> leaves_;
  std::unique_ptr<remat::CapturedStep<T>> step_;
};

/// `program` with every leaf's data drawn anew from `seed`.
Program with_new_data(const Program& program, std::uint64_t seed) {
  Program p = program;
  for (std::size_t k = 0; k < p.leaves.size(); ++k)
    p.leaves[k].data = remat_test::random_matrix<double>(p.leaves[k].shape.rows(), p.leaves[k].shape.cols(),
                                                         seed * 1000 + k, remat_test::anywhere);
  return p;
}

template <class T>
void check(const std::vector<Matrix<T>>& got, const std::vector<Matrix<T>>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < got.size(); ++k)
    EXPECT_TRUE(checkpoint_test::BitwiseEqual(got[k], want[k])) << what << ": output " << k << " (0 = the loss)";
}

template <class T>
void run_programs(bool budgeted) {
  std::size_t evicting = 0, replaying = 0;
  for (int i = 0; i < program_count; ++i) {
    const Program program = Generator(9100 + static_cast<std::uint64_t>(i)).generate();
    SCOPED_TRACE(describe(program));
    std::size_t budget = 0;
    if (budgeted) {  // a budget below the program's unbudgeted peak, which some programs cannot meet
      Tape<T> probe_tape;
      probe_tape.set_training(false);
      Recorder<T> rec(probe_tape, true, false);
      std::vector<typename Recorder<T>::Value> leaves;
      std::vector<std::unique_ptr<Parameter<T>>> parameters;
      for (const LeafSpec& l : program.leaves) leaves.push_back(record_leaf(rec, l, parameters));
      const Var<T> loss = Executor<T>(program, rec).run(leaves).var;
      probe_tape.backward(loss);
      budget = probe_tape.memory().peak_bytes * 4 / 5;
    }
    std::unique_ptr<Captured<T>> captured;
    try {
      captured = std::make_unique<Captured<T>>(program, budget);
    } catch (const remat::memory_budget_error&) {
      EXPECT_THROW(recorded<T>(program, budget), remat::memory_budget_error) << "program " << i;
      continue;
    }
    check(captured->first(), recorded<T>(program, budget), "the capture");
    for (int r = 1; r <= 2; ++r) {
      const Program next = with_new_data(program, 77 * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(r));
      check(captured->replay(next), recorded<T>(next, budget), r == 1 ? "replay 1" : "replay 2");
    }
    evicting += captured->memory().evictions > 0;
    replaying += captured->memory().replayed_ops > 0;
  }
  // The programs exercise what the capture must replay.
  EXPECT_GT(replaying, 10u);
  if (budgeted) {
    EXPECT_GT(evicting, 5u);
  }
}

TEST(CapturedProperty, RandomProgramsReplayBitwiseAsRecordedAfresh) {
  run_programs<double>(false);
}

TEST(CapturedProperty, RandomProgramsUnderABudgetReplayBitwise) {
  run_programs<float>(true);
}

}  // namespace captured_property_test
