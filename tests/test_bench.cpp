// `flat bench` in process on a tiny shape with quick ceilings: its tables, the JSON it writes
// (parsed here) and the roofline SVG; and the bad options it must reject with one line and
// exit status 2 before measuring anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "bench.h"
#include "bench_workload.h"
#include "cpu/on_target.h"
#include "cpu/targets.h"
#include "params.h"
#include "vector_work.h"

namespace flat::test {
namespace {

namespace fs = std::filesystem;

// A JSON value and a strict parser for it, enough to read back what the bench writes.
struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json& operator[](const std::string& key) const {
    for (const auto& [name, value] : fields)
      if (name == key) return value;
    throw std::runtime_error("no key " + key);
  }
  const Json& operator[](size_t i) const { return items.at(i); }
  bool is_null() const { return kind == Kind::null; }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  Json document() {
    Json v = value();
    skip_space();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool take(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool take_word(const std::string& word) {
    if (s_.compare(i_, word.size(), word) != 0) return false;
    i_ += word.size();
    return true;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    skip_space();
    Json v;
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::Kind::object;
      ++i_;
      if (take('}')) return v;
      do {
        std::string key = string();
        expect(':');
        v.fields.emplace_back(std::move(key), value());
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::Kind::array;
      ++i_;
      if (take(']')) return v;
      do v.items.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::string;
      v.text = string();
    } else if (take_word("null")) {
      v.kind = Json::Kind::null;
    } else if (take_word("true") || take_word("false")) {
      v.kind = Json::Kind::boolean;
    } else {
      v.kind = Json::Kind::number;
      size_t used = 0;
      try {
        v.number = std::stod(s_.substr(i_, 32), &used);
      } catch (const std::exception&) {
        fail("bad value");
      }
      i_ += used;
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void expect_positive(const Json& v, const std::string& what) {
  EXPECT_EQ(v.kind, Json::Kind::number) << what;
  EXPECT_TRUE(std::isfinite(v.number) && v.number > 0) << what << " = " << v.number;
}

void expect_timing(const Json& t, const std::string& what) {
  for (const char* key : {"ms", "flops", "bytes", "gflop_per_s", "gb_per_s", "flop_per_byte"})
    expect_positive(t[key], what + "." + key);
}

// Output files of this test, removed at the end.
struct OutputFiles {
  fs::path json, plot;
  OutputFiles() {
    const fs::path base = fs::temp_directory_path() / ("flat_bench_" + std::to_string(::getpid()));
    json = base.string() + ".json";
    plot = base.string() + ".svg";
  }
  ~OutputFiles() {
    std::error_code ignored;
    fs::remove(json, ignored);
    fs::remove(plot, ignored);
  }
};

TEST(Bench, TinyShapeTablesJsonAndPlot) {
  const OutputFiles files;
  std::ostringstream out, err;
  const int status = tool::bench_command({"--shape", "1,64,2,16,16", "--variant", "gla", "--repeats", "1",
                                          "--threads", "2", "--quick-ceilings", "--serving-shape", "3,2,40,2", "--json",
                                          files.json.string(), "--plot", files.plot.string()},
                                         out, err);
  ASSERT_EQ(status, 0) << err.str();
  // The vector work of the forward and the backward where the build has the stages without
  // products (not under the sanitizers).
  const bool vector_work = tool::vector_work_target(cpu::default_target()).has_value();

  // Progress on the error stream, tables on the output.
  const std::string total = vector_work ? "/25] " : "/21] ";
  EXPECT_NE(err.str().find("[1" + total + "ceilings (quick) ... "), std::string::npos) << err.str();
  // Each pass through the driver's entry, then with every row in cache.
  const std::string own = cpu::default_target().name;
  for (const std::string& line : {"[3" + total + "gla forward, fused on " + own + " (driver) ... ",
                                  "[4" + total + "gla forward, every row in cache (token stride 0, results wrong) ... "})
    EXPECT_NE(err.str().find(line), std::string::npos) << err.str();
  if (vector_work) {
    for (const char* line :
         {"[5/25] gla forward, vector work alone (products zeroed, results wrong) ... ",
          "[21/25] gla backward, model gates, vector work alone (products zeroed, results wrong) ... "}) {
      EXPECT_NE(err.str().find(line), std::string::npos) << err.str();
    }
  }
  EXPECT_NE(err.str().find((vector_work ? "[17" : "[15") + total + "gla forward, model gates, subnormals kept ... "),
            std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find((vector_work ? "[25" : "[21") + total + "gla decode, fp32 recurrent baseline ... "),
            std::string::npos)
      << err.str();
  EXPECT_EQ(count(err.str(), "not measured"), 0u) << err.str();
  const std::string table = out.str();
  EXPECT_NE(table.find("| copy bandwidth GB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("| fp32 FMA peak GFLOP/s"), std::string::npos) << table;
  // Forward and backward in both kernel tables and in the gates table.
  EXPECT_EQ(count(table, "| gla    | forward  |"), 4u) << table;
  EXPECT_EQ(count(table, "| gla    | backward |"), 4u) << table;
  EXPECT_EQ(count(table, "| gla    | fwd+bwd  |"), 3u) << table;
  EXPECT_NE(table.find("| variant | pass | driver ms | rows in cache ms | in cache / driver | exposed ms |"),
            std::string::npos)
      << table;
  EXPECT_EQ(count(table, "| gla    | decode   |"), 2u) << table;
  EXPECT_NE(table.find("| in-place update GB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("| variant | pass | weak gates ms | model gates ms |"), std::string::npos) << table;
  // Serving: 3 decodes, 2 prefills of 40 and 20 tokens, 2 speculative tokens each.
  for (const char* row : {"| gla | decode | 3 | 3 |", "| gla | speculative | 3 | 6 |", "| gla | prefill | 2 | 60 |",
                          "| gla | mixed | 5 | 63 |"})
    EXPECT_EQ(count(table, row), 1u) << row << "\n" << table;

  const Json json = JsonParser(read_file(files.json)).document();
  EXPECT_EQ(json["shape"]["S"].number, 64);
  EXPECT_EQ(json["shape"]["K"].number, 16);
  EXPECT_EQ(json["dtype"].text, "bf16");
  EXPECT_EQ(json["precision"].text, "exact");
  EXPECT_EQ(json["threads"].number, 2);
  EXPECT_FALSE(json["isa"].text.empty());
  const Json& ceilings = json["ceilings"];
  for (const char* key : {"copy_gb_per_s", "update_gb_per_s", "fp32_fma_gflop_per_s"}) {
    expect_positive(ceilings[key]["one_thread"], key);
    expect_positive(ceilings[key]["all_threads"], key);
  }
  if (!ceilings["bf16_dot_gflop_per_s"].is_null())
    expect_positive(ceilings["bf16_dot_gflop_per_s"]["all_threads"], "bf16_dot_gflop_per_s");
  // The tile peak where the amx target runs, and every kernel's percent of it; null elsewhere.
  const cpu::Target* amx = cpu::find_target("amx");
  const bool tiles = amx && cpu::supported(*amx);
  ASSERT_EQ(ceilings["bf16_tile_gflop_per_s"].is_null(), !tiles);
  if (tiles) {
    expect_positive(ceilings["bf16_tile_gflop_per_s"]["one_thread"], "bf16_tile_gflop_per_s");
    expect_positive(ceilings["bf16_tile_gflop_per_s"]["all_threads"], "bf16_tile_gflop_per_s");
  }
  EXPECT_NE(table.find(tiles ? "| bf16 tile peak GFLOP/s (amx tdpbf16ps" : "| bf16 tile peak GFLOP/s (amx) | none"),
            std::string::npos)
      << table;
  EXPECT_TRUE(json["against"].is_null());

  const Json& kernels = json["kernels"];
  ASSERT_EQ(kernels.items.size(), 4u);
  const char* passes[] = {"forward", "backward", "fwd+bwd", "decode"};
  for (size_t i = 0; i < 4; ++i) {
    const Json& k = kernels[i];
    const std::string what = std::string("gla ") + passes[i];
    EXPECT_EQ(k["variant"].text, "gla");
    EXPECT_EQ(k["pass"].text, passes[i]);
    for (const char* timing : {"fused", "fused_1_thread", "unfused", "recurrent_fp32"})
      expect_timing(k[timing], what + " " + timing);
    for (const char* number : {"memory_ms", "products_ms", "roofline_ms", "percent_of_roofline",
                               "percent_of_product_peak", "thread_scaling", "speedup_over_unfused",
                               "speedup_over_recurrent"})
      expect_positive(k[number], what + " " + number);
    // The roofline: the larger of the bytes at the copy bandwidth and the FLOPs at the peak of the
    // unit each runs on by the pass's product census (the forward's, the backward's and their sum;
    // where the build has the counting stages), or all at the product peak without one (decode),
    // both all threads, and the pass's time against it.
    const double memory_ms = k["fused"]["bytes"].number / (ceilings["copy_gb_per_s"]["all_threads"].number * 1e6);
    const double flops = k["fused"]["flops"].number;
    const Json& fma_flops = k["fused"]["fma_flops"];
    double products_ms = flops / (json["product_peak_gflop_per_s"].number * 1e6);
    if (vector_work && i < 3) {
      ASSERT_EQ(fma_flops.kind, Json::Kind::number) << what;
      EXPECT_TRUE(fma_flops.number >= 0 && fma_flops.number <= flops) << what << ": " << fma_flops.number;
      products_ms = (flops - fma_flops.number) / (json["product_unit_peak_gflop_per_s"].number * 1e6) +
                    fma_flops.number / (ceilings["fp32_fma_gflop_per_s"]["all_threads"].number * 1e6);
    } else {
      EXPECT_TRUE(fma_flops.is_null()) << what;
    }
    EXPECT_NEAR(k["memory_ms"].number, memory_ms, 1e-4 * memory_ms) << what;
    EXPECT_NEAR(k["products_ms"].number, products_ms, 1e-4 * products_ms) << what;
    EXPECT_EQ(k["roofline_ms"].number, std::max(k["memory_ms"].number, k["products_ms"].number)) << what;
    EXPECT_EQ(k["bound"].text, products_ms >= memory_ms ? "compute" : "memory") << what;
    EXPECT_NEAR(k["percent_of_roofline"].number, 100 * k["roofline_ms"].number / k["fused"]["ms"].number,
                1e-4 * k["percent_of_roofline"].number)
        << what;
    EXPECT_NEAR(k["percent_of_product_peak"].number, 100 * products_ms / k["fused"]["ms"].number,
                1e-4 * k["percent_of_product_peak"].number)
        << what;
    // The vector work of the forward and the backward (and their sum), against the memory time.
    if (vector_work && i < 3) {
      expect_timing(k["vector_work"], what + " vector_work");
      EXPECT_NEAR(k["vector_work_over_memory"].number, k["vector_work"]["ms"].number / k["memory_ms"].number,
                  1e-4 * k["vector_work_over_memory"].number)
          << what;
    } else {
      EXPECT_TRUE(k["vector_work"].is_null() && k["vector_work_over_memory"].is_null()) << what;
    }
    EXPECT_EQ(k["percent_of_bf16_tile_peak"].is_null(), !tiles) << what;
    EXPECT_TRUE(k["against"].is_null() && k["speedup_over_against"].is_null()) << what;
    // The forward and the backward (and their sum) through the driver's entry and with every row in
    // cache, and the time of the rows' traffic the work does not hide, against the memory time.
    if (i < 3) {
      expect_timing(k["compared"], what + " compared");
      expect_timing(k["rows_in_cache"], what + " rows_in_cache");
      const double exposed = k["compared"]["ms"].number - k["rows_in_cache"]["ms"].number;
      EXPECT_NEAR(k["exposed_memory_ms"].number, exposed, 1e-4 * k["compared"]["ms"].number) << what;
      EXPECT_NEAR(k["exposed_over_memory"].number, k["exposed_memory_ms"].number / k["memory_ms"].number,
                  1e-4 * std::abs(k["exposed_over_memory"].number))
          << what;
    } else {
      EXPECT_TRUE(k["compared"].is_null() && k["rows_in_cache"].is_null() && k["exposed_memory_ms"].is_null() &&
                  k["exposed_over_memory"].is_null())
          << what;
    }
  }
  EXPECT_NEAR(kernels[2]["rows_in_cache"]["ms"].number,
              kernels[0]["rows_in_cache"]["ms"].number + kernels[1]["rows_in_cache"]["ms"].number,
              1e-3 * kernels[2]["rows_in_cache"]["ms"].number);
  EXPECT_NEAR(kernels[2]["fused"]["ms"].number, kernels[0]["fused"]["ms"].number + kernels[1]["fused"]["ms"].number,
              1e-3 * kernels[2]["fused"]["ms"].number);
  if (vector_work) {
    EXPECT_NEAR(kernels[2]["vector_work"]["ms"].number,
                kernels[0]["vector_work"]["ms"].number + kernels[1]["vector_work"]["ms"].number,
                1e-3 * kernels[2]["vector_work"]["ms"].number);
    EXPECT_NEAR(kernels[2]["fused"]["fma_flops"].number,
                kernels[0]["fused"]["fma_flops"].number + kernels[1]["fused"]["fma_flops"].number,
                1e-6 * kernels[2]["fused"]["flops"].number);
  }
  // The product unit: the tile unit's for a target with tile products, the bf16 dot products' for
  // one that needs them, the FMA units' otherwise; its peak among the ceilings, and the roof of a
  // pass without a census (the dot products': the faster of them and the FMA units).
  const cpu::Target& target = cpu::default_target();
  const double fma = ceilings["fp32_fma_gflop_per_s"]["all_threads"].number;
  double unit_peak = fma, census_free_peak = fma;
  if (target.tile_products) {
    EXPECT_EQ(json["product_unit"].text, "bf16 tiles");
    unit_peak = census_free_peak = ceilings["bf16_tile_gflop_per_s"]["all_threads"].number;
  } else if (target.needs & cpu::kCpuAvx512Bf16) {
    EXPECT_EQ(json["product_unit"].text, "bf16 dot products");
    unit_peak = ceilings["bf16_dot_gflop_per_s"]["all_threads"].number;
    census_free_peak = std::max(fma, unit_peak);
  } else {
    EXPECT_EQ(json["product_unit"].text, "fp32 FMA");
  }
  EXPECT_NEAR(json["product_unit_peak_gflop_per_s"].number, unit_peak, 1e-5 * unit_peak);
  EXPECT_NEAR(json["product_peak_gflop_per_s"].number, census_free_peak, 1e-5 * census_free_peak);
  // gla at exact precision: on a target of fp32 FMA alone every FLOP there; on the tiles its
  // products of bf16 values (v) but not its diagonal blocks.
  if (vector_work && !target.tile_products && !(target.needs & cpu::kCpuAvx512Bf16)) {
    EXPECT_EQ(kernels[0]["fused"]["fma_flops"].number, kernels[0]["fused"]["flops"].number);
  }
  if (vector_work && target.tile_products)
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_GT(kernels[i]["fused"]["fma_flops"].number, 0) << passes[i];
      EXPECT_LT(kernels[i]["fused"]["fma_flops"].number, kernels[i]["fused"]["flops"].number) << passes[i];
    }
  EXPECT_NE(table.find("| variant | pass | time ms | GFLOP/s | GB/s | FLOP/B | memory ms | products ms | on FMA | "
                       "bound | % of roofline | % of product peak | vector work ms | vector work / memory |"),
            std::string::npos)
      << table;

  const Json& gates = json["gates"];
  ASSERT_EQ(gates.items.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(gates[i]["variant"].text, "gla");
    EXPECT_EQ(gates[i]["pass"].text, passes[i]);
    for (const char* timing : {"weak", "model", "model_subnormals_kept"})
      expect_timing(gates[i][timing], std::string("gates ") + passes[i] + " " + timing);
    EXPECT_EQ(gates[i]["weak"]["ms"].number, kernels[i]["fused"]["ms"].number);
    if (vector_work) {
      expect_timing(gates[i]["model_vector_work"], std::string("gates ") + passes[i] + " model_vector_work");
    } else {
      EXPECT_TRUE(gates[i]["model_vector_work"].is_null());
    }
  }

  const Json& serving = json["serving"];
  EXPECT_EQ(serving["decodes"].number, 3);
  EXPECT_EQ(serving["draft"].number, 2);
  const Json& calls = serving["calls"];
  ASSERT_EQ(calls.items.size(), 4u);
  const char* parts[] = {"decode", "speculative", "prefill", "mixed"};
  const double tokens[] = {3, 6, 60, 63};
  for (size_t i = 0; i < 4; ++i) {
    const Json& c = calls[i];
    EXPECT_EQ(c["call"].text, parts[i]);
    EXPECT_EQ(c["tokens"].number, tokens[i]) << parts[i];
    expect_timing(c["timing"], std::string("serving ") + parts[i]);
    for (const char* number : {"tokens_per_s", "percent_of_copy", "percent_of_update", "percent_of_fp32_fma_peak"})
      expect_positive(c[number], std::string(parts[i]) + " " + number);
    // Only the mixed call is compared with its parts.
    EXPECT_EQ(c["against_parts_alone"].is_null(), i != 3) << parts[i];
  }
  expect_positive(calls[3]["against_parts_alone"], "mixed against its parts");

  // The plot: one marker per pass and implementation (plus one each in the legend), labelled.
  const std::string svg = read_file(files.plot);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<g"), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<circle"), 4u);
  EXPECT_EQ(count(svg, "<polygon"), 4u);
  EXPECT_EQ(count(svg, ">gla fwd</text>"), 3u);
  EXPECT_EQ(count(svg, ">gla bwd</text>"), 3u);
  EXPECT_EQ(count(svg, ">gla dec</text>"), 3u);
  EXPECT_NE(svg.find("fp32 FMA peak"), std::string::npos);
}

// --against: every fused pass timed on a second target in the same run (here the default target
// itself, which every machine runs), its table and its JSON.
TEST(Bench, AgainstASecondTargetSideBySide) {
  const OutputFiles files;
  const std::string other = cpu::default_target().name;
  std::ostringstream out, err;
  const int status = tool::bench_command({"--shape", "1,64,2,16,16", "--variant", "la", "--repeats", "1", "--threads",
                                          "2", "--quick-ceilings", "--serving-shape", "1,1,8,1", "--against", other,
                                          "--json", files.json.string()},
                                         out, err);
  ASSERT_EQ(status, 0) << err.str();
  // The pass on the bench's own target, then on the other, both through the driver's entry.
  const bool vector_work = tool::vector_work_target(cpu::default_target()).has_value();
  const std::string total = vector_work ? "/23] " : "/21] ";
  EXPECT_NE(err.str().find("[3" + total + "la forward, fused on " + other + " (driver) ... "), std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("[4" + total + "la forward, fused on " + other + " (driver) ... "), std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find((vector_work ? "[23" : "[21") + total + "la decode, fp32 recurrent baseline ... "),
            std::string::npos)
      << err.str();
  const std::string table = out.str();
  EXPECT_NE(table.find("The same fused kernels on " + other + " and " + other + " in this run"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| variant | pass | " + other + " ms | " + other + " ms | speedup |"), std::string::npos)
      << table;

  const Json json = JsonParser(read_file(files.json)).document();
  EXPECT_EQ(json["against"].text, other);
  const Json& kernels = json["kernels"];
  ASSERT_EQ(kernels.items.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    expect_timing(kernels[i]["against"], "la " + kernels[i]["pass"].text + " against");
    expect_timing(kernels[i]["compared"], "la " + kernels[i]["pass"].text + " compared");
    EXPECT_NEAR(kernels[i]["speedup_over_against"].number,
                kernels[i]["against"]["ms"].number / kernels[i]["compared"]["ms"].number,
                1e-3 * kernels[i]["speedup_over_against"].number);
    expect_positive(kernels[i]["speedup_over_against"], "la " + kernels[i]["pass"].text + " speedup");
  }
  EXPECT_NEAR(kernels[2]["against"]["ms"].number,
              kernels[0]["against"]["ms"].number + kernels[1]["against"]["ms"].number,
              1e-3 * kernels[2]["against"]["ms"].number);
}

// The vector work's targets: every target of the library this CPU runs has one (none under
// the sanitizers, whose build compiles none), none of them is among the library's targets, and
// its passes write every output: y all zeros, every product being zero, and every gradient finite.
TEST(Bench, VectorWorkTargetsZeroTheProducts) {
  const bool built = tool::vector_work_target(cpu::default_target()).has_value();
  tool::BenchOptions o;
  o.B = 1, o.S = 70, o.N = 2, o.K = 16, o.V = 16;  // a chunk of 64 and one of 6
  o.dtype = DType::f32;
  const float poison = std::numeric_limits<float>::quiet_NaN();
  for (const cpu::Target* target : cpu::supported_targets()) {
    const std::optional<cpu::Target> stripped = tool::vector_work_target(*target);
    ASSERT_EQ(stripped.has_value(), built) << target->name;
    if (!stripped) continue;
    for (const cpu::Target* library : cpu::compiled_targets())
      EXPECT_NE(library->sequence.forward, stripped->sequence.forward) << target->name << " " << library->name;
    for (Variant variant : tool::every_variant()) {
      const std::string what = std::string(target->name) + " " + std::string(info(variant).name);
      tool::Workload w(o, variant);
      const Options options = w.options(o);
      std::fill(w.y.f32.begin(), w.y.f32.end(), poison);
      cpu::forward_on(*stripped, describe_forward(variant, w.forward_args(), options), {});
      EXPECT_TRUE(std::all_of(w.y.f32.begin(), w.y.f32.end(), [](float y) { return y == 0.0f; })) << what;
      cpu::forward_on(*target, describe_forward(variant, w.forward_args(), options), {});
      EXPECT_TRUE(std::any_of(w.y.f32.begin(), w.y.f32.end(), [](float y) { return y != 0.0f; })) << what;
      for (tool::Workload::Array* gradient : {&w.dq, &w.dk, &w.dv, &w.dg, &w.dbeta, &w.db, &w.dw})
        std::fill(gradient->f32.begin(), gradient->f32.end(), poison);
      cpu::backward_on(*stripped, describe_backward(variant, w.backward_args(), options), {});
      const BackwardArgs written = w.backward_args();
      const std::pair<const char*, std::pair<const Tensor*, const tool::Aligned<float>*>> gradients[] = {
          {"dq", {&written.dq, &w.dq.f32}},       {"dk", {&written.dk, &w.dk.f32}}, {"dv", {&written.dv, &w.dv.f32}},
          {"dg", {&written.dg, &w.dg.f32}},       {"dbeta", {&written.dbeta, &w.dbeta.f32}},
          {"db", {&written.db, &w.db.f32}},       {"dw", {&written.dw, &w.dw.f32}}};
      for (const auto& [name, gradient] : gradients) {
        const Tensor& view = *gradient.first;
        if (!view.present()) continue;
        int64_t elements = 1;  // the tensor's, at the start of its array (retnet's dg [N] is shorter)
        for (int axis = 0; axis < view.rank; ++axis) elements *= view.shape[size_t(axis)];
        EXPECT_TRUE(std::all_of(gradient.second->begin(), gradient.second->begin() + elements,
                                [](float x) { return std::isfinite(x); }))
            << what << " " << name;
      }
    }
  }
}

// The product census on every target this CPU runs: the multiply-adds the formula counts
// (tests/test_product_work.cpp; la has no delta rule's extras), each product on the unit the
// target's table takes it to. On a target with a product unit (bf16 tiles, bf16 dot products):
// every one of la's there at fast precision, and at exact those of its forward on the tiles (each
// has an operand of bf16 values); at exact its backward's (the scaled output gradients' products of
// fp32 values on FMA) and on the dot products both passes' (only products of bf16 values on both
// sides there) split between the two; none of kda's on the tiles at exact (fp32 operands on both
// sides of each). On the other targets every one on FMA.
TEST(Bench, ProductCensusCountsEachProductOnItsUnit) {
  const bool built = tool::vector_work_target(cpu::default_target()).has_value();
  tool::BenchOptions o;
  o.B = 1, o.S = 150, o.N = 2, o.K = 32, o.V = 48;
  for (const cpu::Target* target : cpu::supported_targets()) {
    const bool unit = target->tile_products || (target->needs & cpu::kCpuAvx512Bf16);
    const auto census = [&](Variant variant, Precision precision, bool backward) {
      o.precision = precision;
      tool::Workload w(o, variant);
      const Options options = w.options(o);
      const std::optional<tool::ProductCensus> counted = tool::product_census(*target, [&](const cpu::Target& counting) {
        backward ? cpu::backward_on(counting, describe_backward(variant, w.backward_args(), options), {})
                 : cpu::forward_on(counting, describe_forward(variant, w.forward_args(), options), {});
      });
      EXPECT_EQ(counted.has_value(), built) << target->name;
      return std::pair{counted.value_or(tool::ProductCensus{}), tool::chunk_flops(info(variant), w.sh, backward) / 2};
    };
    for (bool backward : {false, true}) {
      const std::string what = std::string(target->name) + (backward ? " backward" : " forward");
      for (Precision precision : {Precision::fast, Precision::exact}) {
        const auto [la, formula] = census(Variant::la, precision, backward);
        if (!built) continue;
        EXPECT_EQ(double(la.on_unit + la.on_fma), formula) << what;
        if (!unit) {
          EXPECT_EQ(la.on_unit, 0) << what;
          EXPECT_EQ(la.fma_share(), 1.0) << what;
        } else if (precision == Precision::fast || (target->tile_products && !backward)) {
          EXPECT_EQ(la.on_fma, 0) << what;
          EXPECT_EQ(la.fma_share(), 0.0) << what;
        } else {
          EXPECT_GT(la.on_unit, 0) << what;
          EXPECT_GT(la.on_fma, 0) << what;
        }
      }
      const auto [kda, formula] = census(Variant::kda, Precision::exact, backward);
      if (!built) continue;
      if (target->tile_products || !unit) {
        EXPECT_EQ(kda.on_unit, 0) << what << " kda";
      }
      EXPECT_GT(kda.on_fma, 0) << what << " kda";
    }
  }
}

// The convolution alone, at a shape of its own: its table and its JSON section.
TEST(Bench, ConvolutionTableAndJson) {
  const OutputFiles files;
  std::ostringstream out, err;
  const int status = tool::bench_command({"--variant", "conv", "--conv-shape", "1,300,40,3", "--repeats", "1",
                                          "--threads", "2", "--quick-ceilings", "--json", files.json.string()},
                                         out, err);
  ASSERT_EQ(status, 0) << err.str();
  const std::string table = out.str();
  EXPECT_NE(table.find("Short convolution: B=1 S=300 C=40 W=3, bias, silu, bf16"), std::string::npos) << table;
  EXPECT_EQ(count(table, "| forward |"), 1u) << table;
  EXPECT_EQ(count(table, "| backward |"), 1u) << table;
  EXPECT_EQ(count(table, "| decode, 64 sequences from a pool |"), 1u) << table;

  const Json json = JsonParser(read_file(files.json)).document();
  EXPECT_EQ(json["kernels"].items.size(), 0u);
  const Json& conv = json["conv"];
  EXPECT_EQ(conv["shape"]["S"].number, 300);
  EXPECT_EQ(conv["shape"]["C"].number, 40);
  EXPECT_EQ(conv["shape"]["W"].number, 3);
  EXPECT_EQ(conv["activation"].text, "silu");
  EXPECT_EQ(conv["dtype"].text, "bf16");
  ASSERT_EQ(conv["passes"].items.size(), 3u);
  const char* passes[] = {"forward", "backward", "decode, 64 sequences from a pool"};
  for (size_t i = 0; i < 3; ++i) {
    const Json& p = conv["passes"][i];
    EXPECT_EQ(p["pass"].text, passes[i]);
    for (const char* number : {"ms", "bytes", "flops", "gb_per_s", "percent_of_copy", "gflop_per_s"})
      expect_positive(p[number], std::string(passes[i]) + " " + number);
    // The decode has no naive baseline.
    for (const char* number : {"naive_ms", "speedup_over_naive"}) {
      if (i < 2) expect_positive(p[number], std::string(passes[i]) + " " + number);
      else EXPECT_TRUE(p[number].is_null()) << number;
    }
  }
}

// The output norm and gate alone, at a shape of its own: its table and its JSON section.
TEST(Bench, NormGateTableAndJson) {
  const OutputFiles files;
  std::ostringstream out, err;
  const int status = tool::bench_command({"--variant", "norm_gate", "--norm-shape", "1,20,3,40", "--repeats", "1",
                                          "--threads", "2", "--quick-ceilings", "--json", files.json.string()},
                                         out, err);
  ASSERT_EQ(status, 0) << err.str();
  EXPECT_NE(err.str().find("norm_gate backward, naive ... "), std::string::npos) << err.str();
  const std::string table = out.str();
  EXPECT_NE(table.find("Output norm and gate: B=1 S=20 N=3 D=40, silu gate, norm first, weight [D], bf16"),
            std::string::npos)
      << table;
  EXPECT_EQ(count(table, "| forward |"), 1u) << table;
  EXPECT_EQ(count(table, "| backward |"), 1u) << table;
  EXPECT_EQ(count(table, "Short convolution"), 0u) << table;

  const Json json = JsonParser(read_file(files.json)).document();
  EXPECT_EQ(json["kernels"].items.size(), 0u);
  EXPECT_THROW(json["conv"], std::runtime_error);
  const Json& norm = json["norm_gate"];
  EXPECT_EQ(norm["shape"]["B"].number, 1);
  EXPECT_EQ(norm["shape"]["S"].number, 20);
  EXPECT_EQ(norm["shape"]["N"].number, 3);
  EXPECT_EQ(norm["shape"]["D"].number, 40);
  EXPECT_EQ(norm["activation"].text, "silu");
  EXPECT_EQ(norm["dtype"].text, "bf16");
  ASSERT_EQ(norm["passes"].items.size(), 2u);
  const char* passes[] = {"forward", "backward"};
  for (size_t i = 0; i < 2; ++i) {
    const Json& p = norm["passes"][i];
    EXPECT_EQ(p["pass"].text, passes[i]);
    for (const char* number :
         {"ms", "bytes", "flops", "gb_per_s", "percent_of_copy", "gflop_per_s", "naive_ms", "speedup_over_naive"})
      expect_positive(p[number], std::string(passes[i]) + " " + number);
    // The rates are the counted work over the time.
    EXPECT_NEAR(p["gb_per_s"].number, p["bytes"].number / p["ms"].number * 1e-6, 1e-4 * p["gb_per_s"].number);
    EXPECT_NEAR(p["speedup_over_naive"].number, p["naive_ms"].number / p["ms"].number,
                1e-4 * p["speedup_over_naive"].number);
  }
  // x, g, y in bf16 and the fp32 weight; the backward adds dy, dx, dg and dweight.
  const double n = 1 * 20 * 3 * 40;
  EXPECT_EQ(norm["passes"][0]["bytes"].number, 3 * n * 2 + 40 * 4);
  EXPECT_EQ(norm["passes"][1]["bytes"].number, 5 * n * 2 + 2 * 40 * 4);
}

// Rejected before anything is measured: exit status 2, one line naming the problem, no output.
TEST(Bench, BadOptionsFailWithOneLine) {
  const std::vector<std::vector<std::string>> cases = {
      {"--shape", "1,2"},
      {"--shape", "1,x,2,16,16"},
      {"--shape", "0,64,2,16,16"},
      {"--variant", "nope"},
      {"--dtype", "f16"},
      {"--threads", "-1"},
      {"--repeats", "0"},
      {"--chunk"},
      {"--frobnicate"},
      {"--shape", "1,64,2,16,16", "--chunk", "24"},
      {"--shape", "1,64,2,300,16"},
      {"--shape", "1,64,2,16,16", "--json", "/nonexistent-dir/out.json"},
      {"--conv-shape", "1,64,16"},
      {"--conv-shape", "1,64,16,9"},
      {"--norm-shape", "1,64,16"},
      {"--norm-shape", "1,0,2,16"},
      {"--serving-shape", "64,4,1024"},
      {"--serving-shape", "64,0,1024,4"},
      {"--against", "nope"},
      {"--against"},
  };
  for (const auto& args : cases) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    std::ostringstream out, err;
    EXPECT_EQ(tool::bench_command(args, out, err), 2) << joined;
    EXPECT_TRUE(out.str().empty()) << joined;
    const std::string message = err.str();
    EXPECT_EQ(count(message, "\n"), 1u) << joined << ": " << message;
    EXPECT_EQ(message.rfind("flat", 0), 0u) << joined << ": " << message;
  }
  // A compiled target this CPU does not run is refused by name.
  for (const cpu::Target* target : cpu::compiled_targets()) {
    if (cpu::supported(*target)) continue;
    std::ostringstream out, err;
    EXPECT_EQ(tool::bench_command({"--against", target->name}, out, err), 2) << target->name;
    EXPECT_EQ(err.str(), std::string("flat bench: --against: this CPU (or its OS) does not run the ") + target->name +
                             " target\n");
  }
}

}  // namespace
}  // namespace flat::test
