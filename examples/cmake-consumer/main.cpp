// Trains nothing: checks that an installed remat compiles, links and differentiates, and that its matrix
// products reach OpenBLAS when remat was installed with REMAT_USE_BLAS (and only then). The install test
// (tests/consumer) builds and runs it; it exits non-zero when either check fails.
#include <dlfcn.h>

#include <remat/blas.hpp>
#include <remat/remat.hpp>

#include <cmath>
#include <iostream>
#include <string>

#ifndef REMAT_CONSUMER_EXPECT_BLAS
#error "CMakeLists.txt defines REMAT_CONSUMER_EXPECT_BLAS: 1 if remat's products should reach OpenBLAS, else 0"
#endif

namespace {

/// The file of the shared library that defines `symbol` in this process, where the dynamic linker binds the
/// program's calls to it (the global scope); "" if none does.
std::string library_defining(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return {};
  return info.dli_fname;
}

/// Whether Eigen's matrix products, and so remat's matmul, run on OpenBLAS: Eigen calls BLAS's ?gemm_ only
/// with EIGEN_USE_BLAS (remat::remat defines it when remat was installed with REMAT_USE_BLAS), and the
/// dgemm_ those calls bind to must be OpenBLAS's (whose own openblas_get_corename() then answers too).
bool products_reach_openblas(std::string& how) {
#ifdef EIGEN_USE_BLAS
  const bool eigen_calls_blas = true;
#else
  const bool eigen_calls_blas = false;
#endif
  const std::string gemm = library_defining("dgemm_");
  const std::string kernels = remat::openblas_corename();
  how = std::string(eigen_calls_blas ? "EIGEN_USE_BLAS defined" : "EIGEN_USE_BLAS not defined") + ", dgemm_ from " +
        (gemm.empty() ? std::string("nowhere") : gemm) + ", OpenBLAS kernels " +
        (kernels.empty() ? std::string("none") : kernels);
  return eigen_calls_blas && gemm.find("openblas") != std::string::npos && !kernels.empty();
}

}  // namespace

int main() {
  remat::Tape<double> tape;
  remat::Matrix<double> w(1, 1);
  w << 0.5;
  auto x = tape.variable(w);
  auto loss = remat::sum(remat::tanh(x));
  tape.backward(loss);
  const double expected = 1 - std::tanh(0.5) * std::tanh(0.5);
  const double got = x.grad()(0, 0);
  std::cout << "d tanh(0.5) / dx = " << got << " (expected " << expected << ")\n";
  bool ok = std::abs(got - expected) < 1e-12;

  // A product large enough for Eigen's GEMM (and so for BLAS under EIGEN_USE_BLAS): d sum(a·b) / da has
  // every row equal to b's row sums.
  tape.clear();
  const remat::Matrix<double> b_value = remat::Matrix<double>::Random(64, 64);
  auto a = tape.variable(remat::Matrix<double>::Random(64, 64));
  auto b = tape.constant(b_value);
  tape.backward(remat::sum(remat::matmul(a, b)));
  const remat::Matrix<double> row_sums = b_value.rowwise().sum().transpose();
  const double product_error = (a.grad().rowwise() - row_sums.row(0)).cwiseAbs().maxCoeff();
  std::cout << "d sum(a b) / da: largest error " << product_error << "\n";
  ok = ok && product_error < 1e-12;

  std::string how;
  const bool blas = products_reach_openblas(how);
  const bool expect_blas = REMAT_CONSUMER_EXPECT_BLAS != 0;
  std::cout << "matrix products: " << (blas ? "OpenBLAS" : "Eigen's own GEMM") << " (" << how << "; expected "
            << (expect_blas ? "OpenBLAS" : "no BLAS") << ")\n";
  if (blas != expect_blas) {
    std::cout << (expect_blas ? "error: remat was installed with REMAT_USE_BLAS but this program's products do not "
                                "reach OpenBLAS through remat::remat\n"
                              : "error: remat was installed without REMAT_USE_BLAS but this program's products "
                                "reach OpenBLAS\n");
    ok = false;
  }
  return ok ? 0 : 1;
}
