// The examples' command lines and the settings their state files carry, through the built binaries (mlp, gpt):
// out-of-range and NaN flags refused with exit code 2, integer flags read as decimal, a hand-built MLP state file
// resumed, state files whose settings would crash (a zero batch, a huge history count, zero heads) refused, a
// diverged training named by its learning rate, --save into a missing directory failing before training.
//
// The binaries are looked up next to this program's build directory (<build>/examples/mlp/mlp,
// <build>/examples/gpt/gpt); the tests that run them are skipped when they were not built
// (cmake --build <build> --target mlp gpt).
//
// State files are built here from the format's documentation, never by the code under test. A "Regression:"
// comment states what the example did before and the behaviour expected.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../io/file_helpers.hpp"
#include "common/state_file.hpp"
#include "expect_error.hpp"
#include "gpt/corpus.hpp"
#include "mlp/idx.hpp"
#include "mlp/state_file.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace example_command_lines_test {

using namespace io_files;  // NOLINT(google-build-using-namespace): this directory's shared helpers

/// A tiny Fashion-MNIST-shaped data set the MLP example reads: 20 training and 10 test images of 28x28
/// (plain IDX bytes under the .gz names: zlib reads uncompressed files as they are).
void write_mlp_dataset(const std::string& dir, std::uint32_t train = 20, std::uint32_t test = 10) {
  fs::create_directories(dir);
  auto labels = [](std::uint32_t n) {
    Bytes b(n);
    for (std::uint32_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i % 10);
    return b;
  };
  write_file(dir + "/train-images-idx3-ubyte.gz", idx_images(train, 28, 28, pattern_bytes(train * 784u, 1)));
  write_file(dir + "/train-labels-idx1-ubyte.gz", idx_labels(train, labels(train)));
  write_file(dir + "/t10k-images-idx3-ubyte.gz", idx_images(test, 28, 28, pattern_bytes(test * 784u, 2)));
  write_file(dir + "/t10k-labels-idx1-ubyte.gz", idx_labels(test, labels(test)));
}

/// The settings of an MLP state file, in the order examples/mlp/main.cpp's encode_state writes them.
struct MlpState {
  std::uint64_t seed = 42;
  std::uint32_t batch = 4;
  double dropout = 0;
  std::uint64_t train_count = 20;
  std::uint32_t activation = 0;  // relu
  double lr = 1e-3;
  std::uint32_t schedule = 1;  // cosine
  std::uint32_t epochs = 2;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  std::uint64_t steps = 5;
  std::uint64_t shuffle = 12345;
  std::uint32_t history_count = 1;  // as written in the file; history_count records follow only if it is 1
};
/// A complete state file of the MLP "--hidden 8" (784→8→10): the layer count, then value, first and second
/// moment of W0 [784,8], b0 [1,8], W1 [8,10], b1 [1,10], then the history: examples/common/state_file.hpp's
/// layout, built here from its documentation (header: magic, version, payload length, CRC-32).
void write_mlp_state(const std::string& path, const MlpState& s) {
  examples::StateWriter w;
  w.u64(s.seed);
  w.u32(s.batch);
  w.f64(s.dropout);
  w.u64(s.train_count);
  w.u32(s.activation);
  w.f64(s.lr);
  w.u32(s.schedule);
  w.u32(s.epochs);
  w.f64(s.beta1);
  w.f64(s.beta2);
  w.f64(s.epsilon);
  w.u64(s.steps);
  w.u64(s.shuffle);
  w.u32(2);
  const remat::Index shapes[4][2] = {{784, 8}, {1, 8}, {8, 10}, {1, 10}};
  for (const auto& shape : shapes) {
    w.matrix(MF::Constant(shape[0], shape[1], 0.01f));
    w.matrix(MF::Zero(shape[0], shape[1]));
    w.matrix(MF::Constant(shape[0], shape[1], 1e-6f));
  }
  w.u32(s.history_count);
  if (s.history_count == 1)
    for (double v : {2.0, 0.5, 0.5, 1.0}) w.f64(v);
  examples::write_state_file(path, mlp::state_format, w.bytes());
}

/// The settings at the head of a GPT state file, as examples/gpt/main.cpp's encode_state writes them (what
/// decode_settings reads before --estimate returns: the rest of the file is not needed for --estimate).
struct GptSettings {
  std::uint64_t seed = 42;
  std::uint32_t layers = 1, width = 8, heads = 2, seq_len = 8, batch = 2, warmup = 0;
  std::uint64_t steps = 3;
  double dropout = 0, lr = 3e-3;
};
void write_gpt_settings_state(const std::string& path, const GptSettings& s) {
  examples::StateWriter w;
  w.u64(s.seed);
  for (std::uint32_t v : {s.layers, s.width, s.heads, s.seq_len, s.batch, s.warmup}) w.u32(v);
  w.u64(s.steps);
  w.f64(s.dropout);
  w.f64(s.lr);
  const examples::StateFormat gpt_format{{'R', 'E', 'M', 'A', 'T', 'G', 'P', 'T'}, 1, "remat GPT"};
  examples::write_state_file(path, gpt_format, w.bytes());
}

// ================================================================ the examples' command lines and state files

TEST(ExampleCommandLines, MlpRefusesOutOfRangeFlagsWithExitCode2AndResumesAHandBuiltStateFile) {
  const std::string mlp_binary = example_binary("mlp");
  if (mlp_binary.empty()) GTEST_SKIP() << "examples/mlp/mlp not built (cmake --build <build> --target mlp)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string base = "--data " + data + " --hidden 8 --batch 4 --epochs 1 ";
  for (const std::string& bad : std::vector<std::string>{
           "--epochs -1", "--batch 0", "--batch -3", "--threads -1", "--threads 1000", "--checkpoint everything",
           "--hidden 0", "--limit -1", "--eval-batch 0", "--lr 0", "--lr -1", "--dropout 1", "--dropout -0.1",
           "--activation swish", "--schedule linear", "--epochs abc"}) {
    const RunResult r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, bad.substr(0, bad.find(' ')))) << bad << "\n" << describe(r);
  }
  // A batch larger than the data set is one batch of every image; 0 epochs only evaluates.
  RunResult r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --batch 1000 --epochs 1");
  EXPECT_EQ(r.code, 0) << describe(r);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --epochs 0");
  EXPECT_EQ(r.code, 0) << describe(r);
  // The hand-built state file (the format as documented) resumes: the builder the tests below use is right.
  const std::string state = dir / "ok.state";
  write_mlp_state(state, MlpState{});
  r = run_binary(dir, mlp_binary, base.substr(0, base.find("--epochs")) + "--resume " + state);
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "resumed from " + state + " after epoch 1 (step 5)")) << describe(r);
  // A state file of another network, another data set or an unknown activation: exit 2 naming the file.
  MlpState other;
  other.train_count = 21;
  write_mlp_state(state, other);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --resume " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "21 images")) << describe(r);
  other = {};
  other.activation = 7;
  write_mlp_state(state, other);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --resume " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "activation id 7")) << describe(r);
  write_mlp_state(state, MlpState{});
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 16 --resume " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "check --hidden")) << describe(r);
}

// Regression: --dropout nan (examples/mlp/main.cpp:516, CLI::Range(0.0, 0.99)) and --temperature nan
// (examples/gpt/main.cpp:587, CLI::Range(0.0, 100.0)) pass: CLI11's Range tests `v < min || v > max`, which is
// false for NaN. The MLP then trains with "dropout nan" (its mask test p > 0 is false, so no dropout at all) and
// its --json prints "dropout":nan, which is not JSON; the GPT samples with softmax(logits / nan): every byte is
// the same (the last, 0xFF) and exit 0. Expected: exit 2 with a usage error naming the flag, as for
// --dropout 1. (gpt --dropout nan is refused later, by gpt::Model.) Fix: add a check that rejects non-finite
// values, e.g. ->check(CLI::Validator([](std::string& s) { return std::isfinite(std::stod(s)) ? "" : "not a
// number"; }, "FINITE")) before the Range, for every floating-point flag of both examples.
TEST(ExampleCommandLines, ExamplesRefuseNaNForFloatingPointFlags) {
  const std::string mlp_binary = example_binary("mlp"), gpt_binary = example_binary("gpt");
  if (mlp_binary.empty() || gpt_binary.empty())
    GTEST_SKIP() << "examples not built (cmake --build <build> --target mlp gpt)";
  TempDir dir;
  RunResult r = run_binary(dir, mlp_binary, "--estimate --hidden 8 --batch 4 --dropout nan");
  EXPECT_EQ(r.code, 2) << "mlp --dropout nan\n" << describe(r);
  EXPECT_TRUE(contains(r.err, "--dropout")) << describe(r);
  r = run_binary(dir, gpt_binary, "--estimate --layers 1 --width 8 --heads 2 --seq-len 8 --batch 2 --temperature nan");
  EXPECT_EQ(r.code, 2) << "gpt --temperature nan\n" << describe(r);
  EXPECT_TRUE(contains(r.err, "--temperature")) << describe(r);
}

// Regression: examples/mlp/main.cpp:179-258 (decode_state) takes the batch size, dropout and epochs of a state file
// as they are, without the checks the flags get (--batch 1..2^20, --dropout 0..0.99): a file with a valid
// checksum whose batch is 0 (a file of another program version, a hand-edited or fuzzed one) makes
// main.cpp:356 divide by zero (SIGFPE; UBSan "division by zero"); a batch of 0xFFFFFFFF becomes the int -1 and
// Eigen aborts on Matrix(-1, 784); a dropout of 5 fails later as "dropout: p must be in [0, 1), got 5.000000"
// without naming the file. And main.cpp:247 allocates `r.u32()` history records (32 bytes each) before checking
// that the payload holds them: a count of 0xFFFFFFFF is a 137 GB allocation (std::bad_alloc → "out of memory",
// or an ASan out-of-memory abort). Expected (state_file.hpp: "validated completely when read"; state_error:
// "does not fit the model ... what() is one line naming the file"): exit 2 with a state_error naming the file
// and the field. Fix: in decode_state, throw state_error unless 1 ≤ batch ≤ 2^20, 0 ≤ dropout ≤ 0.99 (finite) and
// epochs ≤ 100000, as the flags' ranges; read the history count and check count·32 ≤ bytes left (a
// StateReader::need-like check, e.g. a public `remaining()`) before allocating.
TEST(ExampleCommandLines, MlpStateFileWithAZeroBatchOrAHugeHistoryCountIsAStateErrorNotACrash) {
  const std::string mlp_binary = example_binary("mlp");
  if (mlp_binary.empty()) GTEST_SKIP() << "examples/mlp/mlp not built (cmake --build <build> --target mlp)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string state = dir / "bad.state";
  struct Case {
    const char* what;
    MlpState s;
    const char* word;
  };
  std::vector<Case> cases;
  MlpState s;
  s.batch = 0;
  cases.push_back({"batch 0", s, "batch"});
  s = {};
  s.batch = 0xFFFFFFFFu;
  cases.push_back({"batch 0xFFFFFFFF", s, "batch"});
  s = {};
  s.dropout = 5;
  cases.push_back({"dropout 5", s, "dropout"});
  s = {};
  s.dropout = 0.9900001;  // just above the flag's 0.99: the message must not round it onto the bound
  cases.push_back({"dropout 0.9900001", s, "--dropout 0.9900001"});
  s = {};
  s.history_count = 0xFFFFFFFFu;
  cases.push_back({"history count 0xFFFFFFFF", s, ""});  // any message that names the file
  for (const Case& c : cases) {
    write_mlp_state(state, c.s);
    const RunResult r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --resume " + state);
    EXPECT_EQ(r.code, 2) << c.what << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, state) && contains(r.err, c.word)) << c.what << "\n" << describe(r);
  }
}

// Regression: examples/gpt/main.cpp:136-164 (decode_settings, the loop at :155) takes --layers, --width, --heads,
// --seq-len, --batch and
// --warmup from a state file without the flags' range checks, and main.cpp:323 then computes o.width % o.heads:
// a file (valid checksum) with heads 0 divides by zero (SIGFPE; UBSan "division by zero") — even with
// --estimate, which reads nothing else. Other bad values are caught later by messages that blame a flag the
// user did not give and do not name the file ("--batch 0 is smaller than the 1 ranks", "gpt::Model: ... S = -1").
// Expected (state_file.hpp: "validated completely"; state_error names the file): exit 2 with a message naming the
// file and "heads". Fix: after reading each u32, throw state_error naming the file unless it is in the flag's
// range (layers 1..1024, width/heads/seq_len 1..65536, batch 1..2^20, warmup 0..2^30, steps 1..2^30).
TEST(ExampleCommandLines, GptStateFileWithZeroHeadsIsAStateErrorNotADivisionByZero) {
  const std::string gpt_binary = example_binary("gpt");
  if (gpt_binary.empty()) GTEST_SKIP() << "examples/gpt/gpt not built (cmake --build <build> --target gpt)";
  TempDir dir;
  const std::string state = dir / "g.state";
  write_gpt_settings_state(state, GptSettings{});
  RunResult r = run_binary(dir, gpt_binary, "--estimate --state " + state);  // the control: settings applied
  ASSERT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "L=1 H=8 heads=2 S=8")) << describe(r);
  GptSettings bad;
  bad.heads = 0;
  write_gpt_settings_state(state, bad);
  r = run_binary(dir, gpt_binary, "--estimate --state " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "heads")) << describe(r);
}

// Regression: the MLP example never checked that training stayed finite (the GPT example does): with --lr 1e308 it
// exited 0 and its --json printed "loss":-nan, which is not JSON. Now a learning rate that diverges (1e20)
// stops it after the epoch, as the GPT example does, naming --lr; 1e308 is refused by nn::Adam<float> before
// training; and a sane run's JSON has no NaN.
TEST(ExampleCommandLines, MlpDivergedTrainingIsAnErrorNamingTheLearningRate) {
  const std::string mlp_binary = example_binary("mlp");
  if (mlp_binary.empty()) GTEST_SKIP() << "examples/mlp/mlp not built (cmake --build <build> --target mlp)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string flags = "--data " + data + " --hidden 8 --batch 4 --epochs 2 --threads 1 --json --lr ";
  RunResult r = run_binary(dir, mlp_binary, flags + "1e20");
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "diverged in epoch 1") && contains(r.err, "--lr")) << describe(r);
  r = run_binary(dir, mlp_binary, flags + "1e308");  // Adam's first step would be inf in float: refused
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "nn::Adam: learning_rate 1e+308") && contains(r.err, "float")) << describe(r);
  r = run_binary(dir, mlp_binary, flags + "1e-3");
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_FALSE(contains(r.out, "nan")) << describe(r);
}

// Regression: CLI11 2.1.2 converts integers with base 0 and narrows unsigned ones silently: `--epochs 0x10` trained 16
// epochs, `--batch 010` was 8 (octal), `--seed -1` and `--seed 18446744073709551616` became 2^64 − 1, and
// `--hidden 8,,8` was read as two layers. Integer flags now take decimal digits only ("010" is 10), in range.
TEST(ExampleCommandLines, ExamplesReadIntegerFlagsAsDecimalAndRefuseTheRest) {
  const std::string mlp_binary = example_binary("mlp"), gpt_binary = example_binary("gpt");
  if (mlp_binary.empty() || gpt_binary.empty())
    GTEST_SKIP() << "examples not built (cmake --build <build> --target mlp gpt)";
  TempDir dir;
  for (const std::string bad :
       {"--seed -1", "--seed 18446744073709551616", "--seed -18446744073709551615", "--seed 1e3", "--epochs 0x10",
        "--eval-batch 0x8", "--batch +4", "--hidden 8,,8", "--hidden 8,", "--hidden ,8", "--hidden 0x8"}) {
    const RunResult r = run_binary(dir, mlp_binary, "--estimate " + bad);
    EXPECT_EQ(r.code, 2) << "mlp " << bad << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, bad.substr(0, bad.find(' ')))) << "mlp " << bad << "\n" << describe(r);
  }
  RunResult r = run_binary(dir, mlp_binary, "--estimate --json --batch 010 --hidden 016,8");
  ASSERT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "\"batch\":10")) << describe(r);
  EXPECT_TRUE(contains(r.out, "784→16→8→10")) << describe(r);
  const std::string gpt_flags = "--estimate --layers 1 --width 8 --seq-len 8 --warmup 0 ";
  for (const std::string bad : {"--seed -1", "--seed 18446744073709551616", "--steps 0x10", "--heads 02x"}) {
    const RunResult g =
        run_binary(dir, gpt_binary, gpt_flags + (bad.rfind("--heads", 0) == 0 ? "" : "--heads 2 ") + bad);
    EXPECT_EQ(g.code, 2) << "gpt " << bad << "\n" << describe(g);
    EXPECT_TRUE(contains(g.err, bad.substr(0, bad.find(' ')))) << "gpt " << bad << "\n" << describe(g);
  }
  r = run_binary(dir, gpt_binary, gpt_flags + "--heads 02");
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "heads=2")) << describe(r);
}

// Regression: `mlp --save /missing/dir/state` trained a whole epoch and only then failed ("cannot
// create a temporary file next to it"); `gpt --state` the same after --save-every steps. Both now fail before
// training, naming the path: the check makes and removes the temporary file the write would make.
TEST(ExampleCommandLines, SaveIntoAMissingDirectoryFailsBeforeTraining) {
  const std::string mlp_binary = example_binary("mlp"), gpt_binary = example_binary("gpt");
  if (mlp_binary.empty() || gpt_binary.empty())
    GTEST_SKIP() << "examples not built (cmake --build <build> --target mlp gpt)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string save = dir / "absent/state";
  RunResult r =
      run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --batch 4 --epochs 1 --threads 1 --save " + save);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, save) && contains(r.err, "cannot create a temporary file next to it")) << describe(r);
  EXPECT_FALSE(contains(r.out, "epoch  1/1")) << "an epoch was trained first\n" << describe(r);
  // A name that fits the file system's 255 bytes but not with ".tmp.XXXXXX" added.
  const std::string long_name = dir / std::string(250, 'a');
  r = run_binary(dir, mlp_binary,
                 "--data " + data + " --hidden 8 --batch 4 --epochs 1 --threads 1 --save " + long_name);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "File name too long")) << describe(r);
  EXPECT_FALSE(contains(r.out, "epoch  1/1")) << "an epoch was trained first\n" << describe(r);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --batch 4 --epochs 1 --threads 1 --save " + data);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "it is a directory")) << describe(r);
  const std::string corpus = dir / "corpus";
  fs::create_directories(corpus);
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "a fortune, " + std::to_string(i) + "\n%\n";
  write_file(corpus + "/text", Bytes(text.begin(), text.end()));
  r = run_binary(dir, gpt_binary,
                 "--data " + corpus +
                     " --layers 1 --width 8 --heads 2 --seq-len 8 --batch 2 --steps 3 --warmup 1 "
                     "--threads 1 --state " +
                     save);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, save) && contains(r.err, "cannot create a temporary file next to it")) << describe(r);
}

}  // namespace example_command_lines_test
