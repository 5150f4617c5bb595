#include "npy.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include <unistd.h>

namespace flat::tool {
namespace {

// The data is copied between file and memory as it is, so the host must share the file's order.
static_assert(std::endian::native == std::endian::little, "the .npy reader and writer assume a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kPreambleSize = kMagicSize + 2;  // magic, major and minor version
constexpr size_t kAlignment = 64;                 // numpy.save starts the data at a multiple of this

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw NpyError(path.filename().string() + ": " + what);
}

// Elements of an array of this shape; nullopt for a negative axis or for more bytes, at
// element_size each, than size_t counts.
std::optional<size_t> element_count(const std::vector<int64_t>& shape, size_t element_size) {
  size_t count = 1;
  for (int64_t size : shape) {
    if (size < 0) return std::nullopt;
    if (size != 0 && count > std::numeric_limits<size_t>::max() / element_size / size_t(size)) return std::nullopt;
    count *= size_t(size);
  }
  return count;
}

// Bytes of memory this process may still take: the kernel's estimate of what can be allocated
// without swapping (MemAvailable), or the machine's physical memory where that is not reported.
uintmax_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uintmax_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? uintmax_t(pages) * uintmax_t(page_size) : std::numeric_limits<uintmax_t>::max();
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Parsed by hand rather than matched against numpy's exact spelling, so that key order, spacing,
// quote style and trailing commas, all of which numpy accepts, do not matter.
class HeaderParser {
 public:
  HeaderParser(const std::filesystem::path& path, std::string_view text) : path_(path), text_(text) {}

  Header parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<int64_t>> shape;
    expect('{');
    while (!accept('}')) {
      const std::string key = string();
      expect(':');
      if (key == "descr") set(descr, key, string());
      else if (key == "fortran_order") set(fortran_order, key, boolean());
      else if (key == "shape") set(shape, key, tuple());
      else fail("unexpected key '" + key + "'");
      if (!accept(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the dict");
    return {take(descr, "descr"), take(fortran_order, "fortran_order"), take(shape, "shape")};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { tool::fail(path_, "bad header: " + what); }

  template <class T>
  void set(std::optional<T>& field, const std::string& key, T value) const {
    if (field) fail("duplicate key '" + key + "'");
    field = std::move(value);
  }

  template <class T>
  T take(std::optional<T>& field, const char* key) const {
    if (!field) fail(std::string("missing key '") + key + "'");
    return std::move(*field);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool accept(char c) {
    skip_space();
    if (pos_ == text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }

  bool accept_word(std::string_view word) {
    skip_space();
    if (!text_.substr(pos_).starts_with(word)) return false;
    pos_ += word.size();
    return true;
  }

  std::string string() {
    skip_space();
    if (pos_ == text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail("expected a quoted string");
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }

  bool boolean() {
    if (accept_word("True")) return true;
    if (accept_word("False")) return false;
    fail("expected True or False for 'fortran_order'");
  }

  // "()", "(3,)", "(2, 3)"; a trailing comma is optional.
  std::vector<int64_t> tuple() {
    std::vector<int64_t> values;
    expect('(');
    while (!accept(')')) {
      values.push_back(integer());
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return values;
  }

  int64_t integer() {
    skip_space();
    const char* begin = text_.data() + pos_;
    int64_t value = 0;
    const auto [next, error] = std::from_chars(begin, text_.data() + text_.size(), value);
    if (error != std::errc() || value < 0) fail("expected a non-negative integer in 'shape'");
    pos_ += size_t(next - begin);
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 wrote its longs as "3L"
    return value;
  }

  const std::filesystem::path& path_;
  std::string_view text_;
  size_t pos_ = 0;
};

// An element type a reader takes: numpy's descr for it, its name in errors and its bytes.
struct Stored {
  std::string_view descr;
  std::string_view name;
  size_t size;
};
constexpr Stored kFloat32[] = {{"<f4", "float32", sizeof(float)}};
// numpy saves an integer array as int64 on most platforms and int32 on some (and after astype).
constexpr Stored kIndices[] = {{"<i8", "int64", sizeof(int64_t)}, {"<i4", "int32", sizeof(int32_t)}};

// A file whose header has been read and checked, positioned at its data.
struct DataFile {
  std::ifstream file;
  std::vector<int64_t> shape;
  size_t count = 0;                // elements
  const Stored* stored = nullptr;  // the accepted dtype it holds
};

// Opens `path` and checks its header: a dtype among `accepted`, C order, data of exactly the
// shape's size, and memory for it at `memory_size` bytes per element.
DataFile open_data(const std::filesystem::path& path, std::span<const Stored> accepted, size_t memory_size) {
  if (!std::filesystem::exists(path)) fail(path, "no such file");
  if (!std::filesystem::is_regular_file(path)) fail(path, "not a regular file");
  const uintmax_t file_size = std::filesystem::file_size(path);
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path, "cannot open");

  char preamble[kPreambleSize];
  if (!file.read(preamble, kPreambleSize) || std::memcmp(preamble, kMagic, kMagicSize) != 0)
    fail(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(preamble[kMagicSize]);
  const int minor = static_cast<unsigned char>(preamble[kMagicSize + 1]);
  if (major < 1 || major > 3 || minor != 0)
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (expected 1.0, 2.0 or 3.0)");

  // Version 1.0 gives the header length in 2 bytes, later versions in 4, little-endian.
  const size_t length_size = major == 1 ? 2 : 4;
  unsigned char length_bytes[4] = {};
  if (!file.read(reinterpret_cast<char*>(length_bytes), std::streamsize(length_size))) fail(path, "truncated header");
  size_t header_size = 0;
  for (size_t i = length_size; i-- > 0;) header_size = header_size << 8 | length_bytes[i];
  const uintmax_t data_offset = kPreambleSize + length_size + header_size;
  if (data_offset > file_size) fail(path, "truncated header");
  std::string text(header_size, '\0');
  if (!file.read(text.data(), std::streamsize(header_size))) fail(path, "truncated header");

  Header header = HeaderParser(path, text).parse();
  const auto found = std::ranges::find(accepted, std::string_view(header.descr), &Stored::descr);
  if (found == accepted.end()) {
    std::string descrs, names;
    for (size_t i = 0; i < accepted.size(); ++i) {
      descrs += (i ? " or '" : "'") + std::string(accepted[i].descr) + "'";
      names += (i ? " or " : "") + std::string(accepted[i].name);
    }
    fail(path, "expected dtype " + descrs + " (little-endian " + names + "), got '" + header.descr + "'");
  }
  const Stored* stored = &*found;
  if (header.fortran_order) fail(path, "Fortran-order arrays are not supported, expected C order");
  const std::optional<size_t> count = element_count(header.shape, std::max(stored->size, memory_size));
  if (!count) fail(path, "shape " + format_shape(header.shape) + " is too large");
  const uintmax_t data_size = file_size - data_offset;
  const uintmax_t expected_size = *count * stored->size;
  if (data_size != expected_size)
    fail(path, std::string(data_size < expected_size ? "truncated data" : "trailing bytes after the data") +
                   ": shape " + format_shape(header.shape) + " takes " + std::to_string(expected_size) +
                   " bytes, the file holds " + std::to_string(data_size));

  const uintmax_t memory = available_memory(), needed = *count * memory_size;
  if (needed > memory)
    fail(path, "shape " + format_shape(header.shape) + " takes " + std::to_string(needed) +
                   " bytes, more than the " + std::to_string(memory) + " bytes of memory available");
  return {std::move(file), std::move(header.shape), *count, stored};
}

// Reads the data of `in`, in.count elements of T (the size of in.stored).
template <class T>
void read_data(DataFile& in, const std::filesystem::path& path, std::vector<T>& data) {
  const size_t bytes = in.count * sizeof(T);
  try {
    data.resize(in.count);
  } catch (const std::bad_alloc&) {
    fail(path, "out of memory for shape " + format_shape(in.shape) + " (" + std::to_string(bytes) + " bytes)");
  }
  if (!in.file.read(reinterpret_cast<char*>(data.data()), std::streamsize(bytes))) fail(path, "read error");
}

}  // namespace

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

NpyArray read_npy(const std::filesystem::path& path) {
  DataFile in = open_data(path, kFloat32, sizeof(float));
  NpyArray array{std::move(in.shape), {}};
  read_data(in, path, array.data);
  return array;
}

NpyIndices read_npy_indices(const std::filesystem::path& path) {
  DataFile in = open_data(path, kIndices, sizeof(int64_t));
  NpyIndices array{std::move(in.shape), {}};
  if (in.stored->size == sizeof(int64_t)) {
    read_data(in, path, array.data);
    return array;
  }
  std::vector<int32_t> narrow;
  read_data(in, path, narrow);
  array.data.assign(narrow.begin(), narrow.end());
  return array;
}

void write_npy(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data) {
  const std::optional<size_t> count = element_count(shape, sizeof(float));
  if (!count) fail(path, "invalid shape " + format_shape(shape));
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
  // Spaces and a final newline pad the header so that the data starts aligned, as in numpy.save.
  const size_t unpadded = kPreambleSize + 2 + header.size() + 1;
  header.append((kAlignment - unpadded % kAlignment) % kAlignment, ' ');
  header += '\n';
  if (header.size() > 0xffff) fail(path, "shape " + format_shape(shape) + " has too many axes for format 1.0");

  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) fail(path, "cannot create file");
  const char version_and_length[4] = {1, 0, char(header.size() & 0xff), char(header.size() >> 8)};
  file.write(kMagic, kMagicSize);
  file.write(version_and_length, sizeof version_and_length);
  file.write(header.data(), std::streamsize(header.size()));
  file.write(reinterpret_cast<const char*>(data), std::streamsize(*count * sizeof(float)));
  file.close();
  if (!file) fail(path, "write failed");
}

}  // namespace flat::tool
