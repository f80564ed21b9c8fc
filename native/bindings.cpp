// The only file that knows Python. Exposes the engine as worker._native.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "backend/backend.h"
#include "engine.h"
#include "gguf.h"
#include "kernels/kernels.h"
#include "kv_format.h"
#include "membw.h"

namespace py = pybind11;
using namespace kvs;

namespace {

py::object to_python(const GgufValue& v) {
  switch (v.type) {
    case GgufType::U8:
    case GgufType::U16:
    case GgufType::U32:
    case GgufType::U64:
      return py::int_(v.u);
    case GgufType::I8:
    case GgufType::I16:
    case GgufType::I32:
    case GgufType::I64:
      return py::int_(v.i);
    case GgufType::F32:
    case GgufType::F64:
      return py::float_(v.f);
    case GgufType::BOOL:
      return py::bool_(v.u != 0);
    case GgufType::STRING: {
      PyObject* s = PyUnicode_DecodeUTF8(v.s.data(), static_cast<Py_ssize_t>(v.s.size()), "surrogateescape");
      if (s == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(s);
    }
    case GgufType::ARRAY: {
      py::list out(v.arr.size());
      for (size_t i = 0; i < v.arr.size(); ++i) out[i] = to_python(v.arr[i]);
      return std::move(out);
    }
  }
  return py::none();
}

py::dict info_dict(const SequenceInfo& i) {
  py::dict d;
  d["id"] = i.id;
  d["n_tokens"] = i.n_tokens;
  d["n_past"] = i.n_past;
  d["generating"] = i.generating;
  d["generated"] = i.generated;
  d["finish_reason"] = i.finish_reason;
  return d;
}

std::vector<float> as_floats(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<float>(a.data(), a.data() + a.size());
}

}  // namespace

// ---- The backend layer (issue 16): build facts, Vulkan device facts, and op hooks for tests. ----
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// One backend per (name, device, integer_dot), made on first use. The op hooks run Vulkan on its float path
// (the shader checks against float64 references) unless integer_dot; the CPU backend as make_backend makes it.
// NOTE: never destroyed: Vulkan drivers tear down their own state at exit before static destructors run.
Backend& cached_backend(const std::string& name, int device, bool integer_dot = false) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, bool>, Backend*> cache;
  std::lock_guard<std::mutex> lock(mu);
  Backend*& b = cache[{name, device, integer_dot}];
  if (b == nullptr) b = make_backend(name, device, /*float_activations=*/name == "vulkan" && !integer_dot).release();
  return *b;
}

std::unique_ptr<Buffer> upload_bytes(Backend& be, const void* data, size_t bytes) {
  auto buf = be.alloc(bytes);
  if (bytes > 0) be.upload(*buf, data, bytes);
  return buf;
}

py::array_t<float> download_floats(Backend& be, const Buffer& buf, std::vector<py::ssize_t> shape) {
  py::array_t<float> out(shape);
  be.download(buf, out.mutable_data(), sizeof(float) * static_cast<size_t>(out.size()));
  return out;
}

// The attention op hooks' AttentionShape: q (T, n_head, head_dim), checked 3-d by the caller, over a pool of
// block_bytes blocks with K at k_offset and V at v_offset. The caller sets what only it has (n_past, window).
AttentionShape attention_shape(const FloatArray& q, int n_head_kv, int block_tokens, float scale, size_t block_bytes,
                               size_t k_offset, size_t v_offset, const std::string& kv_k, const std::string& kv_v) {
  AttentionShape s;
  s.T = static_cast<int>(q.shape(0));
  s.n_head = static_cast<int>(q.shape(1));
  s.head_dim = static_cast<int>(q.shape(2));
  s.n_head_kv = n_head_kv;
  s.block_tokens = block_tokens;
  s.scale = scale;
  s.block_bytes = block_bytes;
  s.k_offset = k_offset;
  s.v_offset = v_offset;
  s.k_format = kv_format_from_string(kv_k);
  s.v_format = kv_format_from_string(kv_v);
  return s;
}

py::dict device_dict(const VulkanDeviceInfo& i) {
  py::dict d;
  d["index"] = i.index;
  d["name"] = i.name;
  d["type"] = i.type;
  d["vendor"] = i.vendor;
  d["vendor_id"] = i.vendor_id;
  d["device_id"] = i.device_id;
  d["driver_name"] = i.driver_name;
  d["driver_info"] = i.driver_info;
  d["driver_version"] = i.driver_version;
  d["api_version"] = i.api_version;
  d["device_local_bytes"] = i.device_local_bytes;
  d["device_local_budget"] = i.device_local_budget;
  d["memory_budget_ext"] = i.memory_budget_ext;
  d["subgroup_size"] = i.subgroup_size;
  d["subgroup_arithmetic"] = i.subgroup_arithmetic;
  d["shader_int8"] = i.shader_int8;
  d["shader_float16"] = i.shader_float16;
  d["integer_dot_product"] = i.integer_dot_product;
  d["integer_dot_4x8_accelerated"] = i.integer_dot_4x8_accelerated;
  d["max_workgroup_size"] = i.max_workgroup_size;
  d["max_storage_buffer_range"] = i.max_storage_buffer_range;
  return d;
}

void bind_backend(py::module_& m) {
  m.def("has_vulkan", &backend_has_vulkan, "True when this build has the Vulkan backend (glslc and headers found).");
  m.def(
      "vulkan_devices",
      [] {
        std::vector<VulkanDeviceInfo> devs;
        {
          py::gil_scoped_release release;
          devs = vulkan_devices();
        }
        py::list out;
        for (const VulkanDeviceInfo& i : devs) out.append(device_dict(i));
        return out;
      },
      "Every Vulkan device: name, vendor, driver, heap size and budget, subgroup size, integer-dot support. "
      "Raises RuntimeError naming what to install when Vulkan was not built or no loader is present.");
  m.def(
      "_backend_name", [](const std::string& backend, int device) { return cached_backend(backend, device).name(); },
      py::arg("backend"), py::arg("device") = 0);

  // W (rows, cols) as raw `type` bytes @ x (T, cols) -> (T, rows), on one backend.
  m.def(
      "_backend_matmul",
      [](const std::string& backend, int device, const std::string& type, py::bytes raw, int64_t rows, int64_t cols,
         FloatArray x, bool integer_dot) {
        const GgmlType t = type_from_name(type);
        const std::string w = raw;
        if (rows <= 0 || cols <= 0 || w.size() != row_bytes(t, cols) * rows) {
          throw std::invalid_argument("_backend_matmul: " + std::to_string(w.size()) +
                                      " weight bytes, expected rows * " + "row_bytes(" + type + ", cols)");
        }
        if (x.ndim() != 2 || x.shape(1) != cols) throw std::invalid_argument("_backend_matmul: x must be (T, cols)");
        const int T = static_cast<int>(x.shape(0));
        Backend& be = cached_backend(backend, device, integer_dot);
        auto wb = upload_bytes(be, w.data(), w.size());
        auto xb = upload_bytes(be, x.data(), sizeof(float) * x.size());
        auto yb = be.alloc(sizeof(float) * T * rows);
        {
          py::gil_scoped_release release;
          be.matmul(t, *wb, rows, cols, *xb, T, *yb);
        }
        return download_floats(be, *yb, {T, static_cast<py::ssize_t>(rows)});
      },
      py::arg("backend"), py::arg("device"), py::arg("type"), py::arg("raw"), py::arg("rows"), py::arg("cols"),
      py::arg("x"), py::arg("integer_dot") = false);
  // The path the backend's matmul takes (Backend::dot_path): "integer dot" or "float".
  m.def(
      "_backend_dot_path",
      [](const std::string& backend, int device, bool integer_dot) {
        return std::string(cached_backend(backend, device, integer_dot).dot_path());
      },
      py::arg("backend"), py::arg("device") = 0, py::arg("integer_dot") = false);
  // Copy bandwidth of one backend's memory (bench/gpu.py, a GPU calibration's read_bytes_per_s): bytes read
  // plus bytes written per second by the fastest of `repeats` copies of `bytes` between two of its buffers,
  // after one untimed copy (first touch).
  m.def(
      "_backend_copy_bandwidth",
      [](const std::string& backend, int device, size_t bytes, int repeats) {
        if (bytes == 0 || repeats < 1) {
          throw std::invalid_argument("_backend_copy_bandwidth: bytes and repeats must be positive, got " +
                                      std::to_string(bytes) + " and " + std::to_string(repeats));
        }
        Backend& be = cached_backend(backend, device);
        py::gil_scoped_release release;
        auto src = be.alloc(bytes);
        auto dst = be.alloc(bytes);
        be.copy(*src, 0, *dst, 0, bytes);
        be.sync();
        double best_s = 0.0;
        for (int r = 0; r < repeats; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          be.copy(*src, 0, *dst, 0, bytes);
          be.sync();
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r == 0 || s < best_s) best_s = s;
        }
        return best_s > 0.0 ? 2.0 * static_cast<double>(bytes) / best_s : 0.0;
      },
      py::arg("backend"), py::arg("device"), py::arg("bytes"), py::arg("repeats") = 5);
  // x (T, n), w (n,) -> (T, n)
  m.def(
      "_backend_rms_norm",
      [](const std::string& backend, int device, FloatArray x, FloatArray w, float eps) {
        if (x.ndim() != 2 || w.ndim() != 1 || w.shape(0) != x.shape(1)) {
          throw std::invalid_argument("_backend_rms_norm: x (T, n) and w (n,) expected");
        }
        const int T = static_cast<int>(x.shape(0)), n = static_cast<int>(x.shape(1));
        Backend& be = cached_backend(backend, device);
        auto xb = upload_bytes(be, x.data(), sizeof(float) * x.size());
        auto wb = upload_bytes(be, w.data(), sizeof(float) * w.size());
        auto yb = be.alloc(sizeof(float) * x.size());
        be.rms_norm(*xb, *wb, T, n, eps, *yb);
        return download_floats(be, *yb, {T, n});
      },
      py::arg("backend"), py::arg("device"), py::arg("x"), py::arg("w"), py::arg("eps"));
  // x (T, n_head, head_dim), pos (T,) -> rotated copy; style 0 adjacent pairs, 1 half split.
  m.def(
      "_backend_rope",
      [](const std::string& backend, int device, FloatArray x, py::array_t<int32_t, py::array::c_style> pos, int n_rot,
         float base, int style) {
        if (x.ndim() != 3 || pos.ndim() != 1 || pos.shape(0) != x.shape(0) || (style != 0 && style != 1)) {
          throw std::invalid_argument("_backend_rope: x (T, n_head, head_dim), pos (T,), style 0 or 1 expected");
        }
        const int T = static_cast<int>(x.shape(0)), nh = static_cast<int>(x.shape(1)),
                  hd = static_cast<int>(x.shape(2));
        Backend& be = cached_backend(backend, device);
        auto xb = upload_bytes(be, x.data(), sizeof(float) * x.size());
        auto pb = upload_bytes(be, pos.data(), sizeof(int32_t) * pos.size());
        be.rope(*xb, *pb, T, nh, hd, n_rot, base, static_cast<RopePairs>(style));
        return download_floats(be, *xb, {T, nh, hd});
      },
      py::arg("backend"), py::arg("device"), py::arg("x"), py::arg("pos"), py::arg("n_rot"), py::arg("base"),
      py::arg("style"));
  // act 0 silu, 1 gelu_tanh: act(g) * u over flat arrays.
  m.def(
      "_backend_gated",
      [](const std::string& backend, int device, int act, FloatArray g, FloatArray u) {
        if (g.size() != u.size() || g.size() == 0 || (act != 0 && act != 1)) {
          throw std::invalid_argument("_backend_gated: g and u of one non-zero length, act 0 or 1 expected");
        }
        Backend& be = cached_backend(backend, device);
        auto gb = upload_bytes(be, g.data(), sizeof(float) * g.size());
        auto ub = upload_bytes(be, u.data(), sizeof(float) * u.size());
        auto ob = be.alloc(sizeof(float) * g.size());
        be.gated(static_cast<GateAct>(act), *gb, *ub, g.size(), *ob);
        return download_floats(be, *ob, {static_cast<py::ssize_t>(g.size())});
      },
      py::arg("backend"), py::arg("device"), py::arg("act"), py::arg("g"), py::arg("u"));
  // The routed experts' ops (qwen3moe on the device). src (T, n), idx (R,) int32 -> (R, n).
  m.def(
      "_backend_gather_rows",
      [](const std::string& backend, int device, FloatArray src, py::array_t<int32_t, py::array::c_style> idx) {
        if (src.ndim() != 2 || idx.ndim() != 1 || src.shape(1) == 0) {
          throw std::invalid_argument("_backend_gather_rows: src (T, n) with n > 0 and idx (R,) expected");
        }
        const int T = static_cast<int>(src.shape(0)), n = static_cast<int>(src.shape(1));
        const int R = static_cast<int>(idx.shape(0));
        Backend& be = cached_backend(backend, device);
        auto sb = upload_bytes(be, src.data(), sizeof(float) * std::max<size_t>(src.size(), 1));
        auto ib = upload_bytes(be, idx.data(), sizeof(int32_t) * std::max<size_t>(idx.size(), 1));
        auto db = be.alloc(sizeof(float) * std::max<size_t>(static_cast<size_t>(R) * n, 1));
        be.gather_rows(*sb, T, n, *ib, R, *db);
        return download_floats(be, *db, {R, n});
      },
      py::arg("backend"), py::arg("device"), py::arg("src"), py::arg("idx"));
  // src (R, n), idx (T, K) int32, weight (T, K) -> (T, n): row t = sum_k weight[t, k] * src[idx[t, k]].
  m.def(
      "_backend_combine_rows",
      [](const std::string& backend, int device, FloatArray src, py::array_t<int32_t, py::array::c_style> idx,
         FloatArray weight) {
        if (src.ndim() != 2 || src.shape(1) == 0 || idx.ndim() != 2 || weight.ndim() != 2 || idx.shape(1) == 0 ||
            idx.shape(0) != weight.shape(0) || idx.shape(1) != weight.shape(1)) {
          throw std::invalid_argument("_backend_combine_rows: src (R, n), idx (T, K) and weight (T, K) expected");
        }
        const int R = static_cast<int>(src.shape(0)), n = static_cast<int>(src.shape(1));
        const int T = static_cast<int>(idx.shape(0)), K = static_cast<int>(idx.shape(1));
        Backend& be = cached_backend(backend, device);
        auto sb = upload_bytes(be, src.data(), sizeof(float) * std::max<size_t>(src.size(), 1));
        auto ib = upload_bytes(be, idx.data(), sizeof(int32_t) * std::max<size_t>(idx.size(), 1));
        auto wb = upload_bytes(be, weight.data(), sizeof(float) * std::max<size_t>(weight.size(), 1));
        auto db = be.alloc(sizeof(float) * std::max<size_t>(static_cast<size_t>(T) * n, 1));
        be.combine_rows(*sb, R, n, *ib, *wb, T, K, *db);
        return download_floats(be, *db, {T, n});
      },
      py::arg("backend"), py::arg("device"), py::arg("src"), py::arg("idx"), py::arg("weight"));
  // matmul_view: raw is the whole weight buffer, W (rows, cols) of `type` from byte w_offset; x (flat f32)
  // the whole x buffer, X (T, cols) from byte x_offset; Y (T, rows) into a buffer of y_floats NaNs from byte
  // y_offset. Returns the whole y buffer (y_floats,), so a test sees what the op left untouched. integer_dot:
  // Vulkan's integer-dot path where the device has it (as _backend_matmul's flag).
  m.def(
      "_backend_matmul_view",
      [](const std::string& backend, int device, const std::string& type, py::bytes raw, size_t w_offset, int64_t rows,
         int64_t cols, FloatArray x, size_t x_offset, int T, size_t y_floats, size_t y_offset, bool integer_dot) {
        const GgmlType t = type_from_name(type);
        const std::string w = raw;
        if (w.empty() || x.size() == 0 || y_floats == 0) {
          throw std::invalid_argument("_backend_matmul_view: raw, x and y_floats must be non-empty");
        }
        Backend& be = cached_backend(backend, device, integer_dot);
        auto wb = upload_bytes(be, w.data(), w.size());
        auto xb = upload_bytes(be, x.data(), sizeof(float) * x.size());
        std::vector<float> nan(y_floats, std::nanf(""));
        auto yb = upload_bytes(be, nan.data(), sizeof(float) * y_floats);
        {
          py::gil_scoped_release release;
          be.matmul_view(t, *wb, w_offset, rows, cols, *xb, x_offset, T, *yb, y_offset);
        }
        return download_floats(be, *yb, {static_cast<py::ssize_t>(y_floats)});
      },
      py::arg("backend"), py::arg("device"), py::arg("type"), py::arg("raw"), py::arg("w_offset"), py::arg("rows"),
      py::arg("cols"), py::arg("x"), py::arg("x_offset"), py::arg("T"), py::arg("y_floats"), py::arg("y_offset"),
      py::arg("integer_dot") = false);
  // q (T, n_head, head_dim) against one layer of a paged pool (raw bytes, kv_cache.h layout) through
  // the block table `blocks` -> (T, n_head, head_dim).
  m.def(
      "_backend_attention",
      [](const std::string& backend, int device, FloatArray q, py::bytes pool,
         py::array_t<int32_t, py::array::c_style> blocks, int n_head_kv, int block_tokens, int n_past, float scale,
         size_t block_bytes, size_t k_offset, size_t v_offset, const std::string& kv_k, const std::string& kv_v) {
        if (q.ndim() != 3) throw std::invalid_argument("_backend_attention: q must be (T, n_head, head_dim)");
        AttentionShape s =
            attention_shape(q, n_head_kv, block_tokens, scale, block_bytes, k_offset, v_offset, kv_k, kv_v);
        s.n_past = n_past;
        const std::string raw = pool;
        Backend& be = cached_backend(backend, device);
        auto qb = upload_bytes(be, q.data(), sizeof(float) * q.size());
        auto pb = upload_bytes(be, raw.data(), raw.size());
        auto bb = upload_bytes(be, blocks.data(), sizeof(int32_t) * blocks.size());
        auto ob = be.alloc(sizeof(float) * q.size());
        {
          py::gil_scoped_release release;
          be.attention(s, *qb, *pb, *bb, *ob);
        }
        return download_floats(be, *ob, {s.T, s.n_head, s.head_dim});
      },
      py::arg("backend"), py::arg("device"), py::arg("q"), py::arg("pool"), py::arg("blocks"), py::arg("n_head_kv"),
      py::arg("block_tokens"), py::arg("n_past"), py::arg("scale"), py::arg("block_bytes"), py::arg("k_offset"),
      py::arg("v_offset"), py::arg("kv_k"), py::arg("kv_v"));
  // The forward's batched attention (Backend::attention_rows): q (T, n_head, head_dim), row t at position
  // rows[t, 0] over the block table starting at entry rows[t, 1] of `tables` -> (T, n_head, head_dim).
  // integer_dot: the Vulkan backend's integer-dot path (8-bit queries for 8-bit keys) where the device has it.
  m.def(
      "_backend_attention_rows",
      [](const std::string& backend, int device, FloatArray q, py::bytes pool,
         py::array_t<int32_t, py::array::c_style> tables, py::array_t<int32_t, py::array::c_style> rows, int n_head_kv,
         int block_tokens, float scale, size_t block_bytes, size_t k_offset, size_t v_offset, const std::string& kv_k,
         const std::string& kv_v, int window, bool integer_dot) {
        if (q.ndim() != 3 || rows.ndim() != 2 || rows.shape(0) != q.shape(0) || rows.shape(1) != 2) {
          throw std::invalid_argument("_backend_attention_rows: q (T, n_head, head_dim) and rows (T, 2) expected");
        }
        AttentionShape s =
            attention_shape(q, n_head_kv, block_tokens, scale, block_bytes, k_offset, v_offset, kv_k, kv_v);
        s.window = window;
        const std::string raw = pool;
        Backend& be = cached_backend(backend, device, integer_dot);
        auto qb = upload_bytes(be, q.data(), sizeof(float) * q.size());
        auto pb = upload_bytes(be, raw.data(), raw.size());
        auto tb = upload_bytes(be, tables.data(), sizeof(int32_t) * tables.size());
        auto rb = upload_bytes(be, rows.data(), sizeof(int32_t) * rows.size());
        auto ob = be.alloc(sizeof(float) * q.size());
        {
          py::gil_scoped_release release;
          be.attention_rows(s, *qb, *pb, *tb, *rb, *ob);
        }
        return download_floats(be, *ob, {s.T, s.n_head, s.head_dim});
      },
      py::arg("backend"), py::arg("device"), py::arg("q"), py::arg("pool"), py::arg("tables"), py::arg("rows"),
      py::arg("n_head_kv"), py::arg("block_tokens"), py::arg("scale"), py::arg("block_bytes"), py::arg("k_offset"),
      py::arg("v_offset"), py::arg("kv_k"), py::arg("kv_v"), py::arg("window") = 0, py::arg("integer_dot") = false);
}

// One call of attn_scores and of attn_accum at `level` over cnt K/V rows stored in kfmt / vfmt:
// k, v (cnt, hd); q (G, hd); w (G, cnt) -> (scores (G, cnt) = q_g . k_j, acc (G, hd) = sum_j w[g, j] v_j).
py::tuple attn_block(const std::string& level, const std::string& kfmt, const std::string& vfmt, const float* k,
                     const float* v, const float* q, const float* w, int cnt, int hd, int G) {
  const KvFormat kf = kv_format_from_string(kfmt), vf = kv_format_from_string(vfmt);
  const size_t kr = kv_row_bytes(kf, hd), vr = kv_row_bytes(vf, hd);
  std::vector<uint8_t> kb(kr * cnt), vb(vr * cnt);
  for (int j = 0; j < cnt; ++j) {
    kv_store_row(kf, k + static_cast<size_t>(j) * hd, kb.data() + j * kr, hd);
    kv_store_row(vf, v + static_cast<size_t>(j) * hd, vb.data() + j * vr, hd);
  }
  const Kernels& kn = kernels_for(level);
  std::vector<BlockQ8A> qq(static_cast<size_t>(G) * (hd / kQK));
  for (int g = 0; g < G && hd % kQK == 0; ++g) {
    if (kf == KvFormat::Q8_HEAD) {
      quantize_head(q + g * hd, qq.data() + g * (hd / kQK), hd);
    } else {
      kn.quantize_act(q + g * hd, qq.data() + g * (hd / kQK), hd);
    }
  }
  py::array_t<float> scores({G, cnt});
  std::fill(scores.mutable_data(), scores.mutable_data() + static_cast<size_t>(G) * cnt,
            std::numeric_limits<float>::quiet_NaN());
  kn.attn_scores(kf, kb.data(), kr, cnt, q, qq.data(), G, hd, scores.mutable_data(), cnt);
  py::array_t<float> acc({G, hd});
  std::fill(acc.mutable_data(), acc.mutable_data() + static_cast<size_t>(G) * hd, 0.0f);
  kn.attn_accum(vf, vb.data(), vr, cnt, w, cnt, acc.mutable_data(), G, hd);
  return py::make_tuple(scores, acc);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "kvswarm native engine (C++17): GGUF reader, KV formats, kernels, Llama forward, batched engine";

  static py::exception<KvBudgetError> kv_budget_error(m, "KvBudgetError", PyExc_MemoryError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KvBudgetError& e) {
      py::set_error(kv_budget_error, e.what());
    } catch (const std::out_of_range& e) {
      py::set_error(PyExc_KeyError, e.what());
    }
  });

  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init([](float temperature, int top_k, float top_p, float repetition_penalty, int repeat_last_n,
                       uint64_t seed, int max_new_tokens, std::vector<int32_t> stop_tokens) {
             SamplingParams sp;
             sp.temperature = temperature;
             sp.top_k = top_k;
             sp.top_p = top_p;
             sp.repetition_penalty = repetition_penalty;
             sp.repeat_last_n = repeat_last_n;
             sp.seed = seed;
             sp.max_new_tokens = max_new_tokens;
             sp.stop_tokens = std::move(stop_tokens);
             return sp;
           }),
           py::kw_only(), py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
           py::arg("repetition_penalty") = 1.0f, py::arg("repeat_last_n") = 64, py::arg("seed") = 0,
           py::arg("max_new_tokens") = -1, py::arg("stop_tokens") = std::vector<int32_t>{})
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readwrite("repeat_last_n", &SamplingParams::repeat_last_n)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("max_new_tokens", &SamplingParams::max_new_tokens)
      .def_readwrite("stop_tokens", &SamplingParams::stop_tokens);

  py::class_<Engine>(m, "Engine")
      .def(py::init([](const std::string& model, const std::string& kv_k, const std::string& kv_v,
                       size_t kv_budget_bytes, int threads, int block_tokens, int max_batch_tokens,
                       const std::string& isa, bool float_activations, bool prefix_sharing, const std::string& backend,
                       int device, bool huge_pages) {
             EngineOptions o;
             o.model_path = model;
             o.kv_k = kv_k;
             o.kv_v = kv_v;
             o.kv_budget_bytes = kv_budget_bytes;
             o.threads = threads;
             o.block_tokens = block_tokens;
             o.max_batch_tokens = max_batch_tokens;
             o.isa = isa;
             o.float_activations = float_activations;
             o.prefix_sharing = prefix_sharing;
             o.backend = backend;
             o.device = device;
             o.huge_pages = huge_pages;
             py::gil_scoped_release release;
             return std::make_unique<Engine>(o);
           }),
           py::arg("model"), py::kw_only(), py::arg("kv_k") = "f16", py::arg("kv_v") = "f16",
           py::arg("kv_budget_bytes") = 0, py::arg("threads") = 2, py::arg("block_tokens") = 16,
           py::arg("max_batch_tokens") = 256, py::arg("isa") = "", py::arg("float_activations") = false,
           py::arg("prefix_sharing") = true, py::arg("backend") = "cpu", py::arg("device") = 0,
           py::arg("huge_pages") = true)
      .def_property_readonly("isa", &Engine::isa)
      .def_property_readonly("backend", &Engine::backend_name)
      .def_property_readonly("dot_path", &Engine::dot_path)
      .def("last_logits",
           [](const Engine& e) {
             std::vector<float> l = e.last_logits();
             const auto nv = static_cast<py::ssize_t>(e.config().n_vocab);
             py::array_t<float> out({static_cast<py::ssize_t>(l.size()) / nv, nv});
             std::copy(l.begin(), l.end(), out.mutable_data());
             return out;
           })
      .def_property_readonly("config",
                             [](const Engine& e) {
                               const ModelConfig& c = e.config();
                               py::dict d;
                               d["arch"] = c.arch;
                               d["n_vocab"] = c.n_vocab;
                               d["n_embd"] = c.n_embd;
                               d["n_layer"] = c.n_layer;
                               d["n_head"] = c.n_head;
                               d["n_head_kv"] = c.n_head_kv;
                               d["head_dim"] = c.head_dim;
                               d["n_ff"] = c.n_ff;
                               d["n_ctx_train"] = c.n_ctx_train;
                               d["rope_base"] = c.rope_base;
                               d["rms_eps"] = c.rms_eps;
                               d["sliding_window"] = c.sliding_window;
                               d["n_layer_swa"] = c.n_layer_swa;
                               d["n_expert"] = c.n_expert;
                               d["n_expert_used"] = c.n_expert_used;
                               d["weight_bytes"] = e.model().weight_bytes();
                               return d;
                             })
      .def("add_sequence", &Engine::add_sequence, py::arg("tokens"), py::arg("sampling"), py::arg("generate") = true,
           py::call_guard<py::gil_scoped_release>())
      .def("append", &Engine::append, py::arg("id"), py::arg("tokens"), py::arg("sampling"), py::arg("generate") = true,
           py::call_guard<py::gil_scoped_release>())
      .def("finish", &Engine::finish, py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def("free", &Engine::free, py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def("step", &Engine::step, py::call_guard<py::gil_scoped_release>())
      .def("busy", &Engine::busy, py::call_guard<py::gil_scoped_release>())
      .def("set_token_mask", &Engine::set_token_mask, py::arg("id"), py::arg("bits"),
           py::call_guard<py::gil_scoped_release>())
      .def("clear_token_mask", &Engine::clear_token_mask, py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def(
          "score",
          [](Engine& e, int id, const std::vector<int32_t>& tokens) {
            std::vector<float> l;
            {
              py::gil_scoped_release release;
              l = e.score(id, tokens);
            }
            const int nv = e.config().n_vocab;
            py::array_t<float> out({static_cast<py::ssize_t>(l.size() / nv), static_cast<py::ssize_t>(nv)});
            std::copy(l.begin(), l.end(), out.mutable_data());
            return out;
          },
          py::arg("id"), py::arg("tokens"))
      .def("fill_kv", &Engine::fill_kv, py::arg("id"), py::arg("n"), py::arg("seed") = 0,
           py::call_guard<py::gil_scoped_release>())
      // KV snapshots (issue 18; native/kv_transfer.h).
      .def(
          "export_kv",
          [](const Engine& e, int id) {
            std::string blob;
            {
              py::gil_scoped_release release;
              blob = e.export_kv(id);
            }
            return py::bytes(blob);
          },
          py::arg("id"))
      .def("kv_export_bytes", &Engine::kv_export_bytes, py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def(
          "import_kv",
          [](Engine& e, const py::buffer& blob, const SamplingParams& sp, bool generate) {
            const py::buffer_info view = blob.request();
            if (view.ndim != 1 || view.strides[0] != view.itemsize) {
              throw std::invalid_argument("import_kv: the blob must be contiguous bytes (Engine.export_kv's result)");
            }
            const auto* data = static_cast<const uint8_t*>(view.ptr);
            const size_t n = static_cast<size_t>(view.size) * static_cast<size_t>(view.itemsize);
            py::gil_scoped_release release;  // the buffer stays exported (and alive) until view is destroyed
            return e.import_kv(data, n, sp, generate);
          },
          py::arg("blob"), py::arg("sampling"), py::arg("generate") = false)
      .def("set_timers", &Engine::set_timers, py::arg("on"), py::call_guard<py::gil_scoped_release>())
      .def(
          "timers",
          [](Engine& e, bool reset) {
            const StepTimers t = e.timers(reset);
            py::dict d;
            d["on"] = t.on;
            d["steps"] = t.steps;
            d["tokens"] = t.tokens;
            d["total_s"] = t.total_s;
            d["weights_s"] = t.weights_s;
            d["attention_s"] = t.attention_s;
            d["other_s"] = t.total_s - t.weights_s - t.attention_s;
            d["weight_bytes"] = t.weight_bytes;
            d["kv_bytes"] = t.kv_bytes;
            return d;
          },
          py::arg("reset") = true)
      .def("reset_timers", &Engine::reset_timers, py::call_guard<py::gil_scoped_release>())
      .def(
          "info", [](const Engine& e, int id) { return info_dict(e.info(id)); }, py::arg("id"))
      .def("sequence_ids", &Engine::sequence_ids)
      .def("tokens", &Engine::tokens, py::arg("id"))
      .def("set_kv_budget", &Engine::set_kv_budget, py::arg("bytes"), py::call_guard<py::gil_scoped_release>())
      .def("memory", [](const Engine& e) {
        const MemoryStats s = e.memory();
        py::dict d;
        d["bytes_per_token"] = s.bytes_per_token;
        d["block_bytes"] = s.block_bytes;
        d["block_tokens"] = s.block_tokens;
        d["budget_bytes"] = s.budget_bytes;
        d["bytes_reserved"] = s.bytes_reserved;
        d["bytes_used"] = s.bytes_used;
        d["bytes_allocated"] = s.bytes_allocated;
        d["blocks_in_use"] = s.blocks_in_use;
        d["sliding_window"] = s.sliding_window;
        d["swa_bytes_per_token"] = s.swa_bytes_per_token;
        d["swa_block_bytes"] = s.swa_block_bytes;
        d["swa_blocks_in_use"] = s.swa_blocks_in_use;
        d["swa_blocks_allocated"] = s.swa_blocks_allocated;
        d["blocks_shared"] = s.blocks_shared;
        d["prefix_tokens_reused"] = s.prefix_tokens_reused;
        d["weight_bytes"] = s.weight_bytes;
        d["scratch_bytes"] = s.scratch_bytes;
        d["sequences"] = s.sequences;
        d["key_tiles"] = s.key_tiles;
        d["value_tiles"] = s.value_tiles;
        d["weights_huge_pages"] = s.weights_huge_pages;
        d["weight_tile_bytes"] = s.weight_tile_bytes;
        py::list tile_types;  // GGML type ids, ascending
        for (uint32_t t = 0; t < 64; ++t) {
          if ((s.weight_tile_types >> t) & 1) tile_types.append(t);
        }
        d["weight_tile_types"] = tile_types;
        return d;
      });

  m.def(
      "read_gguf",
      [](const std::string& path) {
        std::unique_ptr<GgufFile> f;
        {
          py::gil_scoped_release release;
          f = std::make_unique<GgufFile>(path);
        }
        py::dict meta;
        for (const auto& [k, v] : f->metadata()) meta[py::str(k)] = to_python(v);
        py::list tensors;
        for (const GgufTensor& t : f->tensors()) {
          py::dict d;
          d["name"] = t.name;
          d["type"] = type_traits(t.type).name;
          d["shape"] = t.shape;
          d["offset"] = t.offset;
          d["nbytes"] = t.nbytes;
          tensors.append(d);
        }
        py::dict out;
        out["version"] = f->version();
        out["alignment"] = f->alignment();
        out["metadata"] = meta;
        out["tensors"] = tensors;
        return out;
      },
      py::arg("path"), "Parse and validate a GGUF file; returns version, alignment, metadata and the tensor table.");

  m.def("measure_read_bandwidth", &measure_read_bandwidth, py::arg("threads") = 2, py::arg("bytes") = size_t{1} << 30,
        py::arg("repeats") = 3, py::call_guard<py::gil_scoped_release>(),
        "Read bandwidth in bytes/s with the engine's thread pool (bench/ uses it as the machine's limit).");
  m.def("isa_levels", &available_isa_levels, "ISA levels this machine can run, best last.");
  m.def("kv_row_bytes",
        [](const std::string& fmt, int head_dim) { return kv_row_bytes(kv_format_from_string(fmt), head_dim); });

  // Kernel hooks for the test suite: run one kernel of one ISA level.
  m.def("_kernel_dot", [](const std::string& level, py::array_t<float, py::array::c_style | py::array::forcecast> a,
                          py::array_t<float, py::array::c_style | py::array::forcecast> b) {
    if (a.size() != b.size()) throw std::invalid_argument("_kernel_dot: length mismatch");
    return kernels_for(level).dot_f32(a.data(), b.data(), static_cast<int>(a.size()));
  });
  m.def("_kernel_dequant", [](const std::string& level, const std::string& type, py::bytes raw, int64_t n) {
    static const std::map<std::string, GgmlType> types{
        {"F32", GgmlType::F32},   {"F16", GgmlType::F16},       {"BF16", GgmlType::BF16},    {"Q4_0", GgmlType::Q4_0},
        {"Q4_1", GgmlType::Q4_1}, {"Q8_0", GgmlType::Q8_0},     {"Q5_0", GgmlType::Q5_0},    {"Q5_1", GgmlType::Q5_1},
        {"Q2_K", GgmlType::Q2_K}, {"Q3_K", GgmlType::Q3_K},     {"Q4_K", GgmlType::Q4_K},    {"Q5_K", GgmlType::Q5_K},
        {"Q6_K", GgmlType::Q6_K}, {"IQ4_NL", GgmlType::IQ4_NL}, {"IQ4_XS", GgmlType::IQ4_XS}};
    auto it = types.find(type);
    if (it == types.end()) throw std::invalid_argument("unknown weight type " + type);
    const std::string bytes = raw;
    if (n <= 0 || bytes.size() != row_bytes(it->second, n)) {
      throw std::invalid_argument("_kernel_dequant: byte length does not match n");
    }
    py::array_t<float> out(n);
    kernels_for(level).dequant_row(it->second, bytes.data(), out.mutable_data(), n);
    return out;
  });
  m.def("_kernel_quantize_act",
        [](const std::string& level, py::array_t<float, py::array::c_style | py::array::forcecast> x) {
          const int64_t n = x.size();
          if (n % kQK != 0) throw std::invalid_argument("_kernel_quantize_act: length must be a multiple of 32");
          std::vector<BlockQ8A> q(n / kQK);
          kernels_for(level).quantize_act(x.data(), q.data(), n);
          py::array_t<float> values(n), d(n / kQK), ds(n / kQK);
          for (int64_t b = 0; b < n / kQK; ++b) {
            d.mutable_data()[b] = q[b].d;
            ds.mutable_data()[b] = q[b].ds;
            for (int i = 0; i < kQK; ++i) values.mutable_data()[b * kQK + i] = static_cast<float>(q[b].qs[i]);
          }
          return py::make_tuple(values, d, ds);
        });
  m.def("_kernel_dot_q", [](const std::string& level, const std::string& type, py::bytes raw,
                            py::array_t<float, py::array::c_style | py::array::forcecast> x) {
    static const std::map<std::string, GgmlType> types{
        {"Q4_0", GgmlType::Q4_0}, {"Q4_1", GgmlType::Q4_1}, {"Q8_0", GgmlType::Q8_0},     {"Q5_0", GgmlType::Q5_0},
        {"Q5_1", GgmlType::Q5_1}, {"Q2_K", GgmlType::Q2_K}, {"Q3_K", GgmlType::Q3_K},     {"Q4_K", GgmlType::Q4_K},
        {"Q5_K", GgmlType::Q5_K}, {"Q6_K", GgmlType::Q6_K}, {"IQ4_NL", GgmlType::IQ4_NL}, {"IQ4_XS", GgmlType::IQ4_XS}};
    auto it = types.find(type);
    if (it == types.end()) throw std::invalid_argument("_kernel_dot_q: quantized weight type expected, got " + type);
    const int64_t n = x.size();
    const std::string bytes = raw;
    if (n % kQK != 0 || bytes.size() != row_bytes(it->second, n)) {
      throw std::invalid_argument("_kernel_dot_q: byte length does not match n");
    }
    const Kernels& k = kernels_for(level);
    std::vector<BlockQ8A> q(n / kQK);
    k.quantize_act(x.data(), q.data(), n);
    return k.dot_q(it->second, bytes.data(), q.data(), n);
  });
  m.def("_kernel_attn", [](const std::string& level, const std::string& kfmt, const std::string& vfmt,
                           py::array_t<float, py::array::c_style | py::array::forcecast> k,
                           py::array_t<float, py::array::c_style | py::array::forcecast> v,
                           py::array_t<float, py::array::c_style | py::array::forcecast> q,
                           py::array_t<float, py::array::c_style | py::array::forcecast> w) {
    // k, v: (hd,) stored in kfmt / vfmt; q: (G, hd); w: (G,) -> (scores (G,), acc (G, hd) = w_g * v)
    const int hd = static_cast<int>(k.size());
    const int G = static_cast<int>(w.size());
    if (v.size() != hd || q.size() != static_cast<py::ssize_t>(G) * hd || G > kMaxGroup || hd > kMaxHeadDim) {
      throw std::invalid_argument("_kernel_attn: bad shapes");
    }
    py::tuple out = attn_block(level, kfmt, vfmt, k.data(), v.data(), q.data(), w.data(), 1, hd, G);
    return py::make_tuple(out[0].cast<py::array_t<float>>().reshape({G}), out[1]);
  });
  m.def("_kernel_attn_rows", [](const std::string& level, const std::string& kfmt, const std::string& vfmt,
                                py::array_t<float, py::array::c_style | py::array::forcecast> k,
                                py::array_t<float, py::array::c_style | py::array::forcecast> v,
                                py::array_t<float, py::array::c_style | py::array::forcecast> q,
                                py::array_t<float, py::array::c_style | py::array::forcecast> w) {
    // k, v: (cnt, hd) rows stored in kfmt / vfmt; q: (G, hd); w: (G, cnt)
    // -> (scores (G, cnt) = q_g . k_j, acc (G, hd) = sum_j w[g, j] v_j), one call of each kernel
    if (k.ndim() != 2 || v.ndim() != 2 || q.ndim() != 2 || w.ndim() != 2) {
      throw std::invalid_argument("_kernel_attn_rows: k, v, q, w must be 2-D");
    }
    const int cnt = static_cast<int>(k.shape(0)), hd = static_cast<int>(k.shape(1));
    const int G = static_cast<int>(q.shape(0));
    if (v.shape(0) != cnt || v.shape(1) != hd || q.shape(1) != hd || w.shape(0) != G || w.shape(1) != cnt ||
        G > kMaxGroup || hd > kMaxHeadDim) {
      throw std::invalid_argument("_kernel_attn_rows: expected k, v (cnt, hd), q (G, hd), w (G, cnt), G <= " +
                                  std::to_string(kMaxGroup));
    }
    return attn_block(level, kfmt, vfmt, k.data(), v.data(), q.data(), w.data(), cnt, hd, G);
  });
  m.def("_kernel_exp_sum",
        [](const std::string& level, py::array_t<float, py::array::c_style | py::array::forcecast> x, float mx) {
          py::array_t<float> out(x.size());
          std::copy(x.data(), x.data() + x.size(), out.mutable_data());
          const float sum = kernels_for(level).exp_sum(out.mutable_data(), static_cast<int>(x.size()), mx);
          return py::make_tuple(out, sum);
        });
  m.def("_kv_roundtrip", [](const std::string& level, const std::string& fmt,
                            py::array_t<float, py::array::c_style | py::array::forcecast> x) {
    const KvFormat f = kv_format_from_string(fmt);
    const int n = static_cast<int>(x.size());
    std::vector<uint8_t> buf(kv_row_bytes(f, n));
    kv_store_row(f, x.data(), buf.data(), n);
    py::array_t<float> out(n);
    kernels_for(level).kv_load_row(f, buf.data(), out.mutable_data(), n);
    return py::make_tuple(out, py::bytes(reinterpret_cast<const char*>(buf.data()), buf.size()));
  });

  bind_backend(m);  // the backend layer (issue 16)
}
