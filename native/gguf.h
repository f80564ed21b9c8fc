// Read-only GGUF (v2/v3) over mmap. The file is untrusted: every length, count
// and offset is checked against the bytes left before it is used, and every
// problem is a std::runtime_error naming the file, the offset and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

// One metadata value. Integers keep their signedness; floats widen to double.
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t u = 0;                     // unsigned integers and bool
  int64_t i = 0;                      // signed integers
  double f = 0.0;                     // f32 / f64
  std::string s;                      // STRING
  GgufType elem_type = GgufType::U8;  // ARRAY: element type
  std::vector<GgufValue> arr;         // ARRAY: elements

  bool is_integer() const;
  int64_t as_int() const;   // throws unless integer or bool
  double as_float() const;  // integer or float
};

struct GgufTensor {
  std::string name;
  uint32_t type = 0;           // GgmlType id
  std::vector<int64_t> shape;  // ne0 (contiguous) first
  uint64_t offset = 0;         // relative to the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
};

class MappedFile;

// Where a GgufFile's bytes live. kMapped: a read-only map of the file (pages shared with every process
// that maps it, read in on first touch). kHugePages: a private read-only copy in transparent huge pages
// where the kernel offers them (madvise or always) and the copy fits well inside the memory available;
// otherwise the map. A decode step streams every weight once, and 4 KB pages cost it a page walk every
// 4 KB and stop the hardware prefetchers at each page's end: at depth 0 the copy measured 1.07-1.09x
// the map's tok/s (docs/BENCHMARKS.md, 2026-12-04 second session).
enum class Residency { kMapped, kHugePages };

class GgufFile {
 public:
  explicit GgufFile(const std::string& path, Residency residency = Residency::kMapped);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const;
  // Whether the bytes ended in huge pages (Residency::kHugePages asked and granted).
  bool huge_pages() const;
  // A huge-page copy stays writable until seal(), so that its owner can rewrite tensors in place (the
  // model's weight tiles, quant.h): the writable alias of p (a tensor's data), or null for the file's
  // map, a sealed copy or a pointer outside the file.
  uint8_t* writable(const uint8_t* p);
  // Makes a huge-page copy read-only (a stray write then faults, as on the map); idempotent.
  void seal();

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return meta_; }
  const GgufValue* find(const std::string& key) const;
  // Required scalar lookups; throw naming the missing or mistyped key.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
  double get_float_or(const std::string& key, double fallback) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> meta_;
  std::map<std::string, size_t> meta_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace kvs
