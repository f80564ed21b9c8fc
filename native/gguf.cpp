#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <stdexcept>

#include "huge_pages.h"
#include "quant.h"

namespace kvs {

// Sanity limits for counts read from an untrusted header. Real models have a
// few hundred tensors and tens of metadata keys (plus vocab arrays of ~10^5).
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxMetadata = 1u << 20;
constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr uint64_t kMaxArrayDepth = 2;  // arrays of arrays are legal but never deep
constexpr uint64_t kMaxStringBytes = 1u << 28;

namespace {

// /sys/kernel/mm/transparent_hugepage/enabled reads "always [madvise] never" with the mode in brackets.
bool transparent_huge_pages_offered() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(f, line) && line.find('[') != std::string::npos && line.find("[never]") == std::string::npos;
}

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
size_t memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (f >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    f.ignore(1 << 10, '\n');
  }
  return 0;
}

}  // namespace

class MappedFile {
 public:
  MappedFile(const std::string& path, Residency residency) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      throw std::runtime_error("cannot open model file '" + path + "': " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw std::runtime_error("model file '" + path + "' is not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (residency == Residency::kHugePages && copy_into_huge_pages()) return;
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        throw std::runtime_error("cannot mmap model file '" + path + "': " + std::strerror(errno));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() {
    if (copy_ == nullptr && data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);  // a copy frees itself
    if (fd_ >= 0) ::close(fd_);
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool huge_pages() const { return copy_ != nullptr; }
  // The copy's bytes until seal(); null for the map or once sealed.
  uint8_t* writable() const { return copy_ != nullptr && !sealed_ ? copy_.get() : nullptr; }
  // Makes the copy read-only (a stray write faults, as on the map). False where mprotect fails, which
  // leaves the copy writable and is harmless.
  bool seal() {
    if (copy_ == nullptr || sealed_) return true;
    sealed_ = ::mprotect(copy_.get(), copy_bytes_, PROT_READ) == 0;
    return sealed_;
  }

 private:
  // Residency::kHugePages: reads the file into a private anonymous region aligned to 2 MiB and advised
  // MADV_HUGEPAGE (map_huge_pages), writable until seal() (the model packs weight tiles in it first). False, with
  // nothing held, where huge pages are not offered, the file is under one huge page, the copy would take more than half
  // of MemAvailable (the map's pages can be dropped under pressure, an anonymous copy cannot without swap), or any call
  // fails: the caller maps the file instead.
  bool copy_into_huge_pages() {
    if (size_ < kHugePageBytes || !transparent_huge_pages_offered() || size_ > memory_available() / 2) return false;
    const size_t bytes = (size_ + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    std::shared_ptr<uint8_t> copy;
    bool ok = false;  // the advice taken
    try {
      copy = map_huge_pages(bytes, &ok);
    } catch (const std::bad_alloc&) {
      return false;
    }
    for (size_t got = 0; ok && got < size_;) {
      const ssize_t n = ::pread(fd_, copy.get() + got, size_ - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) got += static_cast<size_t>(n);
    }
    if (!ok) return false;  // the copy unmaps itself
    copy_ = std::move(copy);
    copy_bytes_ = bytes;
    data_ = copy_.get();
    return true;
  }

  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<uint8_t> copy_;  // the huge-page copy (data_ is its start), or null for the map
  size_t copy_bytes_ = 0;
  bool sealed_ = false;
};

namespace {

// Bounds-checked little-endian cursor over the mapped bytes.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid GGUF file '" + path_ + "' at byte " + std::to_string(pos_) + ": " + what);
  }
  void need(uint64_t n, const char* what) const {
    if (n > left()) {
      fail(std::string("truncated while reading ") + what + " (need " + std::to_string(n) + " bytes, " +
           std::to_string(left()) + " left)");
    }
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > kMaxStringBytes) fail(std::string(what) + " has absurd length " + std::to_string(n));
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  std::string path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest encoded size of one value of a type, to bound array counts before reserving.
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
    case GgufType::STRING:
      return 8;
    case GgufType::ARRAY:
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::F64);
}

GgufValue read_value(Cursor& c, GgufType type, uint64_t depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8:
      v.u = c.read<uint8_t>("u8 value");
      break;
    case GgufType::I8:
      v.i = c.read<int8_t>("i8 value");
      break;
    case GgufType::U16:
      v.u = c.read<uint16_t>("u16 value");
      break;
    case GgufType::I16:
      v.i = c.read<int16_t>("i16 value");
      break;
    case GgufType::U32:
      v.u = c.read<uint32_t>("u32 value");
      break;
    case GgufType::I32:
      v.i = c.read<int32_t>("i32 value");
      break;
    case GgufType::U64:
      v.u = c.read<uint64_t>("u64 value");
      break;
    case GgufType::I64:
      v.i = c.read<int64_t>("i64 value");
      break;
    case GgufType::F32:
      v.f = c.read<float>("f32 value");
      break;
    case GgufType::F64:
      v.f = c.read<double>("f64 value");
      break;
    case GgufType::BOOL: {
      const uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.fail("bool value must be 0 or 1, got " + std::to_string(b));
      v.u = b;
      break;
    }
    case GgufType::STRING:
      v.s = c.read_string("string value");
      break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth) c.fail("arrays nested too deeply");
      const uint32_t et = c.read<uint32_t>("array element type");
      if (!valid_type(et)) c.fail("unknown array element type " + std::to_string(et));
      const uint64_t n = c.read<uint64_t>("array length");
      const uint64_t min_bytes = min_encoded_size(static_cast<GgufType>(et));
      if (n > c.left() / min_bytes) {
        c.fail("array length " + std::to_string(n) + " cannot fit in the " + std::to_string(c.left()) + " bytes left");
      }
      v.elem_type = static_cast<GgufType>(et);
      v.arr.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(c, v.elem_type, depth + 1));
      break;
    }
  }
  return v;
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::BOOL:
      return true;
    default:
      return false;
  }
}

int64_t GgufValue::as_int() const {
  switch (type) {
    case GgufType::U8:
    case GgufType::U16:
    case GgufType::U32:
    case GgufType::BOOL:
      return static_cast<int64_t>(u);
    case GgufType::U64:
      if (u > static_cast<uint64_t>(INT64_MAX)) throw std::runtime_error("u64 metadata value out of range");
      return static_cast<int64_t>(u);
    case GgufType::I8:
    case GgufType::I16:
    case GgufType::I32:
    case GgufType::I64:
      return i;
    default:
      throw std::runtime_error("metadata value is not an integer");
  }
}

double GgufValue::as_float() const {
  if (type == GgufType::F32 || type == GgufType::F64) return f;
  return static_cast<double>(as_int());
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GgufFile::GgufFile(const std::string& path, Residency residency)
    : path_(path), map_(std::make_unique<MappedFile>(path, residency)) {
  Cursor c(path, map_->data(), map_->size());
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != 0x46554747u) {  // "GGUF" little-endian
    c.fail("bad magic (not a GGUF file); expected the bytes 'GGUF' at the start");
  }
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    c.fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_tensors > kMaxTensors) c.fail("absurd tensor count " + std::to_string(n_tensors));
  if (n_kv > kMaxMetadata) c.fail("absurd metadata count " + std::to_string(n_kv));
  // Each tensor entry takes at least 24 bytes (name length, dims, type, offset), each metadata entry 12.
  if (n_tensors > c.left() / 24 || n_kv > c.left() / 12) {
    c.fail("file truncated: " + std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) +
           " metadata entries cannot fit in the " + std::to_string(c.left()) + " bytes left");
  }

  meta_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key");
    const uint32_t t = c.read<uint32_t>("metadata type");
    if (!valid_type(t)) c.fail("metadata '" + key + "' has unknown value type " + std::to_string(t));
    GgufValue v = read_value(c, static_cast<GgufType>(t), 0);
    if (meta_index_.count(key) != 0) c.fail("duplicate metadata key '" + key + "'");
    meta_index_[key] = meta_.size();
    meta_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer()) c.fail("general.alignment must be an integer");
    const int64_t al = a->as_int();
    if (al <= 0 || al > (1 << 16) || (al & (al - 1)) != 0) {
      c.fail("general.alignment must be a power of two up to 65536, got " + std::to_string(al));
    }
    alignment_ = static_cast<size_t>(al);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.read_string("tensor name");
    const uint32_t n_dims = c.read<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      c.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (expected 1.." +
             std::to_string(kMaxDims) + ")");
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>("tensor shape");
      if (ne == 0 || ne > (1ull << 40) || numel > (1ull << 40) / ne) {
        c.fail("tensor '" + t.name + "' has an absurd shape (dimension " + std::to_string(ne) + ")");
      }
      numel *= ne;
      t.shape.push_back(static_cast<int64_t>(ne));
    }
    t.type = c.read<uint32_t>("tensor type");
    t.offset = c.read<uint64_t>("tensor offset");
    if (!type_supported(t.type)) {
      // A well-formed file in a format we lack: not "invalid GGUF", and it says how to fix it.
      throw std::runtime_error(unsupported_type_message(t.type, t.name));
    }
    const TypeTraits tt = type_traits(t.type);
    if (t.shape[0] % tt.block_elems != 0) {
      c.fail("tensor '" + t.name + "' row length " + std::to_string(t.shape[0]) + " is not a multiple of the " +
             tt.name + " block size " + std::to_string(tt.block_elems));
    }
    t.nbytes = static_cast<size_t>(numel / tt.block_elems * tt.block_bytes);
    if (tensor_index_.count(t.name) != 0) c.fail("duplicate tensor name '" + t.name + "'");
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // Data section starts at the next multiple of the alignment.
  const size_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  const size_t size = map_->size();
  if (data_start > size && !tensors_.empty()) {
    c.fail("file ends before its tensor data section");
  }
  for (GgufTensor& t : tensors_) {
    if (t.offset % alignment_ != 0) {
      c.fail("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not aligned to " +
             std::to_string(alignment_));
    }
    if (t.offset > size - data_start || t.nbytes > size - data_start - t.offset) {
      c.fail("tensor '" + t.name + "' (" + std::to_string(t.nbytes) + " bytes at data offset " +
             std::to_string(t.offset) + ") runs past the end of the " + std::to_string(size) +
             "-byte file; the file is truncated or corrupt");
    }
    t.data = map_->data() + data_start + t.offset;
  }
}

GgufFile::~GgufFile() = default;

size_t GgufFile::file_size() const {
  return map_->size();
}

bool GgufFile::huge_pages() const {
  return map_->huge_pages();
}

uint8_t* GgufFile::writable(const uint8_t* p) {
  uint8_t* base = map_->writable();
  if (base == nullptr || p < map_->data() || p >= map_->data() + map_->size()) return nullptr;
  return base + (p - map_->data());
}

void GgufFile::seal() {
  map_->seal();
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = meta_index_.find(key);
  return it == meta_index_.end() ? nullptr : &meta_[it->second].second;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) throw std::runtime_error("model file '" + path_ + "' lacks required metadata '" + key + "'");
  if (!v->is_integer()) throw std::runtime_error("model metadata '" + key + "' must be an integer");
  return v->as_int();
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) throw std::runtime_error("model file '" + path_ + "' lacks required metadata '" + key + "'");
  if (!v->is_integer() && v->type != GgufType::F32 && v->type != GgufType::F64) {
    throw std::runtime_error("model metadata '" + key + "' must be a number");
  }
  return v->as_float();
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) throw std::runtime_error("model file '" + path_ + "' lacks required metadata '" + key + "'");
  if (v->type != GgufType::STRING) throw std::runtime_error("model metadata '" + key + "' must be a string");
  return v->s;
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t fallback) const {
  return find(key) == nullptr ? fallback : get_int(key);
}

double GgufFile::get_float_or(const std::string& key, double fallback) const {
  return find(key) == nullptr ? fallback : get_float(key);
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kvs
