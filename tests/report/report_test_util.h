// Helpers shared by the report tests: a written file's text and op_summary.csv's lines.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace npusim::test {

// The whole file (empty if it cannot be read).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A CSV file's data lines, unparsed; *header receives its first line.
inline std::vector<std::string> csv_lines(const std::filesystem::path& p, std::string* header) {
  std::ifstream csv(p);
  std::string line;
  std::getline(csv, *header);
  std::vector<std::string> rows;
  while (std::getline(csv, line)) rows.push_back(line);
  return rows;
}

}  // namespace npusim::test
