// What the public headers' comments point a user to must exist and say what the comment promises: a file
// named in a comment exists, a section "docs/x.md §N" or "RESULTS.md §N" is a heading of that file, and
// op.hpp, the op recipe's reference, sends the reader to the section that holds the complete example
// and lists every member an op may declare.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace header_references {

namespace fs = std::filesystem;

const fs::path source_dir = REMAT_SOURCE_DIR;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every header under include/remat, with its text.
std::vector<std::pair<fs::path, std::string>> headers() {
  std::vector<std::pair<fs::path, std::string>> all;
  for (const auto& entry : fs::recursive_directory_iterator(source_dir / "include" / "remat"))
    if (entry.is_regular_file() && entry.path().extension() == ".hpp")
      all.emplace_back(entry.path(), read(entry.path()));
  EXPECT_GT(all.size(), 50u) << "include/remat not found under " << source_dir;
  return all;
}

/// The text of section `number` ("5", "2.1") of the Markdown file `text`: from its heading ("## 5. Title",
/// "### 2.1 Title") to the next heading of the same or a higher level; "" if there is no such heading.
/// Lines in fenced code blocks are not headings (a shell comment starts with '#' too).
std::string section(const std::string& text, const std::string& number) {
  const std::regex heading("(#+) (.*)");
  const std::regex numbered("([0-9]+(?:\\.[0-9]+)*)\\.? .*");
  std::istringstream lines(text);
  std::string line, body;
  std::size_t level = 0;  // the number of '#' of the section's heading; 0 before it
  bool in_code = false;
  while (std::getline(lines, line)) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    std::smatch h;
    const bool is_heading = !in_code && std::regex_match(line, h, heading);
    if (level == 0) {
      const std::string title = is_heading ? h[2].str() : std::string();
      std::smatch n;
      if (is_heading && std::regex_match(title, n, numbered) && n[1] == number)
        level = static_cast<std::size_t>(h[1].length());
    } else {
      if (is_heading && static_cast<std::size_t>(h[1].length()) <= level) break;
      body += line + '\n';
    }
  }
  return level == 0 ? std::string() : body;
}

TEST(HeaderReferences, NamedFilesExist) {
  // Paths relative to the repository (docs/, bench/, tests/, examples/, scripts/, cmake/, include/) and
  // headers named as included (remat/....hpp).
  const std::regex path_pattern(
      "\\b((?:docs|bench|tests|examples|scripts|include|cmake)/[A-Za-z0-9_./-]*[A-Za-z0-9_])|\\b(remat/[A-Za-z0-9_/]+"
      "\\.hpp)");
  for (const auto& [header, text] : headers())
    for (std::sregex_iterator it(text.begin(), text.end(), path_pattern), end; it != end; ++it) {
      const std::string named = (*it)[1].matched ? (*it)[1].str() : "include/" + (*it)[2].str();
      EXPECT_TRUE(fs::exists(source_dir / named))
          << header.lexically_relative(source_dir) << " names " << it->str() << ", which does not exist";
    }
}

TEST(HeaderReferences, NamedSectionsExist) {
  const std::regex reference("(docs/[A-Za-z0-9_-]+\\.md|RESULTS\\.md) §([0-9]+(?:\\.[0-9]+)*)");
  int count = 0;
  for (const auto& [header, text] : headers())
    for (std::sregex_iterator it(text.begin(), text.end(), reference), end; it != end; ++it) {
      const std::string file = (*it)[1] == "RESULTS.md" ? "bench/RESULTS.md" : (*it)[1].str();
      EXPECT_FALSE(section(read(source_dir / file), (*it)[2]).empty())
          << header.lexically_relative(source_dir) << " names " << it->str() << ": " << file << " has no section "
          << (*it)[2];
      ++count;
    }
  EXPECT_GT(count, 10);
}

TEST(HeaderReferences, CustomOpPointsToTheCompleteExample) {
  const std::string text = read(source_dir / "include/remat/op.hpp");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("(docs/[a-z-]+\\.md) has a complete example \\(swiglu\\)")))
      << "op.hpp no longer names the page of its complete example";
  const std::string page = read(source_dir / m[1].str());
  EXPECT_NE(page.find("struct SwigluOp : remat::OpBase"), std::string::npos)
      << "op.hpp says " << m[1] << " has the complete swiglu example; it does not";
}

TEST(HeaderReferences, TheCustomOpPageShowsTheCodeTheTestsCompile) {
  // Every C++ block of docs/custom-ops.md that defines an op struct is, line for line, in the test that checks it.
  const std::string page = read(source_dir / "docs/custom-ops.md");
  const std::string tests = read(source_dir / "tests/ops/custom_op_test.cpp") +
                            read(source_dir / "tests/ops/random_op_test.cpp") +
                            read(source_dir / "tests/ops/packed_shape_op_test.cpp");
  int checked = 0;
  const std::string open = "```cpp\n";
  for (std::size_t at = page.find(open); at != std::string::npos; at = page.find(open, at)) {
    const std::size_t begin = at + open.size();
    at = page.find("```", begin);  // not std::regex: it recurses once per character of a block
    ASSERT_NE(at, std::string::npos) << "an unclosed code block in docs/custom-ops.md";
    const std::string code = page.substr(begin, at - begin);
    at += 3;
    if (code.find("struct ") == std::string::npos && code.find("static double noise(") == std::string::npos) continue;
    EXPECT_NE(tests.find(code), std::string::npos) << "docs/custom-ops.md shows code no test compiles:\n" << code;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(HeaderReferences, CustomOpListsEveryMemberOfOpBase) {
  // The optional members OpBase gives defaults for, which an op may declare.
  const std::string apply = read(source_dir / "include/remat/op.hpp");
  const std::size_t begin = apply.find("struct OpBase {");
  ASSERT_NE(begin, std::string::npos);
  const std::string base = apply.substr(begin, apply.find("\n};", begin) - begin);
  std::set<std::string> members;
  const std::regex member("(?:static (?:constexpr )?[A-Za-z0-9_:]+ |struct )([A-Za-z_]+)");
  for (std::sregex_iterator it(base.begin(), base.end(), member), end; it != end; ++it)
    if ((*it)[1] != "OpBase") members.insert((*it)[1]);
  EXPECT_GE(members.size(), 8u);
  // op.hpp's comment, before #pragma once.
  const std::string text = read(source_dir / "include/remat/op.hpp");
  const std::string comment = text.substr(0, text.find("#pragma once"));
  for (const std::string& name : members)
    EXPECT_NE(comment.find(name), std::string::npos) << "op.hpp does not list OpBase's " << name;
}

}  // namespace header_references
