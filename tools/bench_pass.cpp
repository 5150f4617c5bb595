#include "bench_pass.h"

#include <cmath>
#include <cstdio>
#include <ostream>

#include "timing.h"

namespace flat::tool {

double timed_pass(std::ostream* progress, const std::string& what, int repeats, const std::function<void()>& run) {
  if (progress) *progress << what << " ..." << std::flush;
  const double s = median_seconds(repeats, run);
  if (progress) {
    char text[32];
    std::snprintf(text, sizeof text, " %.2f ms\n", s * 1e3);
    *progress << text << std::flush;
  }
  return s;
}

std::vector<int64_t> rows_of_set(const std::vector<int64_t>& rows, int64_t set, int64_t rows_per_set) {
  std::vector<int64_t> moved = rows;
  for (int64_t& row : moved)
    if (row >= 0) row += set * rows_per_set;
  return moved;
}

void write_pass_table(const std::vector<PassResult>& results, std::optional<double> copy_gbs, std::ostream& out) {
  char line[256];
  out << "| pass | fused ms | GB/s | % of copy | GFLOP/s | naive ms | speedup |\n";
  out << "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const PassResult& r : results) {
    std::string share = "-", naive = "-", speedup = "-";
    if (copy_gbs) share = std::to_string(int(std::lround(100.0 * r.gbs() / *copy_gbs))) + "%";
    if (r.baseline_seconds) {
      std::snprintf(line, sizeof line, "%.2f", *r.baseline_seconds * 1e3);
      naive = line;
      std::snprintf(line, sizeof line, "%.1fx", *r.speedup());
      speedup = line;
    }
    std::snprintf(line, sizeof line, "| %s | %.2f | %.1f | %s | %.1f | %s | %s |\n", r.pass.c_str(), r.seconds * 1e3,
                  r.gbs(), share.c_str(), r.gflops(), naive.c_str(), speedup.c_str());
    out << line;
  }
}

}  // namespace flat::tool
