// expect_error_naming<E>(f, words): f() must throw E whose what() contains every one of `words` (the op,
// the shapes or values involved), as the project's error standard asks.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace remat_test {

template <class E, class F>
void expect_error_naming(F f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "'" << e.what() << "' lacks '" << w << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace remat_test
