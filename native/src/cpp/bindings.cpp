// Python bindings for the Nexus native core (module nexus_native._core).
// Every def has py::arg names and a docstring; long calls release the GIL. Keep _core.pyi in sync
// (tests/native/test_stub.py checks it against this module).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "atb.hpp"
#include "buddy.hpp"
#include "llama_state.hpp"
#include "radix.hpp"
#include "rope.hpp"
#include "slb.hpp"
#include "spec.hpp"
#include "util.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using F32In = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32In = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64In = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Work above this many bytes runs without the GIL; below it the release/acquire costs more than it saves.
constexpr std::size_t kGilFreeBytes = 1 << 18;

nx::Isa isa_arg(const std::optional<std::string>& name, nx::Isa dflt) {
    if (!name) return dflt;
    const nx::Isa isa = nx::isa_from_name(*name);
    if (!nx::isa_supported(isa)) throw py::value_error("ISA '" + *name + "' is not supported on this CPU/build");
    return isa;
}

// Read-only contiguous bytes of any buffer-protocol object (bytes, bytearray, memoryview, numpy).
struct Bytes {
    py::buffer_info info;
    const uint8_t* p;
    std::size_t n;
    explicit Bytes(const py::buffer& b) : info(b.request()) {
        if (info.ndim > 1) {
            // require C-contiguity for multi-dimensional buffers
            py::ssize_t expect = info.itemsize;
            for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
                if (info.strides[d] != expect) throw py::value_error("buffer must be C-contiguous");
                expect *= info.shape[d];
            }
        } else if (info.ndim == 1 && info.strides[0] != info.itemsize) {
            throw py::value_error("buffer must be contiguous");
        }
        p = static_cast<const uint8_t*>(info.ptr);
        n = (std::size_t)(info.size * info.itemsize);
    }
};

py::bytes make_bytes(std::size_t n, const std::function<void(uint8_t*)>& fill, bool release_gil) {
    PyObject* o = PyBytes_FromStringAndSize(nullptr, (py::ssize_t)n);
    if (!o) throw py::error_already_set();
    py::bytes b = py::reinterpret_steal<py::bytes>(o);
    uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(o));
    if (release_gil) {
        py::gil_scoped_release nogil;
        fill(dst);
    } else {
        fill(dst);
    }
    return b;
}

// Writable C-contiguous float16 array -> its bits, or ValueError (never a silent converting copy).
uint16_t* f16_inplace(py::array& a, const char* name) {
    if (a.dtype().kind() != 'f' || a.dtype().itemsize() != 2) throw py::value_error(std::string(name) + " must be float16");
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " must be C-contiguous");
    if (!a.writeable()) throw py::value_error(std::string(name) + " must be writable");
    return static_cast<uint16_t*>(a.mutable_data());
}

// The query of the hot search path: a float32, 1-D, contiguous, aligned numpy array is used in place
// (no PyArray_FromAny round trip); anything else is converted once into `keep`.
const float* query_arg(py::handle h, std::size_t dim, F32In& keep) {
    if (py::isinstance<py::array>(h)) {
        auto a = py::reinterpret_borrow<py::array>(h);
        if (a.ndim() == 1 && a.dtype().num() == py::detail::npy_api::NPY_FLOAT_ && a.strides(0) == 4 &&
            (a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) {
            if ((std::size_t)a.shape(0) != dim)
                throw py::value_error("query must have shape (" + std::to_string(dim) + ",)");
            return static_cast<const float*>(a.data());
        }
    }
    keep = F32In::ensure(h);
    if (!keep) throw py::error_already_set();
    if (keep.ndim() != 1 || (std::size_t)keep.shape(0) != dim)
        throw py::value_error("query must have shape (" + std::to_string(dim) + ",)");
    return keep.data();
}

// A fresh 1-D numpy array straight from the numpy C API (pybind11's array_t constructor builds shape
// and stride vectors on the heap: measurable on the ~2 µs search path).
template <typename T>
py::array_t<T> new_1d(std::size_t n) {
    auto& api = py::detail::npy_api::get();
    const Py_intptr_t dims[1] = {(Py_intptr_t)n};
    PyObject* descr = api.PyArray_DescrFromType_(py::detail::npy_format_descriptor<T>::value);  // new reference
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, 1, dims, nullptr, nullptr, 0, nullptr);  // steals descr
    if (!arr) throw py::error_already_set();
    return py::reinterpret_steal<py::array_t<T>>(arr);
}

void set_readonly(py::array& a) { a.attr("setflags")("write"_a = false); }

std::array<uint8_t, 16> fingerprint_arg(const py::bytes& b) {
    const std::string s = b;
    if (s.size() != 16) throw py::value_error("fingerprint must be exactly 16 bytes");
    std::array<uint8_t, 16> f{};
    std::memcpy(f.data(), s.data(), 16);
    return f;
}

py::dict spec_dict(const nx::ModelSpec& s) {
    py::dict d;
    d["fingerprint"] = py::bytes(reinterpret_cast<const char*>(s.fingerprint.data()), 16);
    d["n_layer"] = s.n_layer;
    d["n_head_kv"] = s.n_head_kv;
    d["head_dim"] = s.head_dim;
    d["n_rot"] = s.n_rot;
    d["rope_type"] = s.rope_type;
    d["freq_base"] = s.freq_base;
    d["freq_scale"] = s.freq_scale;
    d["n_ctx_orig"] = s.n_ctx_orig;
    d["ext_factor"] = s.ext_factor;
    d["attn_factor"] = s.attn_factor;
    d["beta_fast"] = s.beta_fast;
    d["beta_slow"] = s.beta_slow;
    if (s.freq_factors.empty())
        d["freq_factors"] = py::none();
    else
        d["freq_factors"] = py::array_t<float>((py::ssize_t)s.freq_factors.size(), s.freq_factors.data());
    return d;
}

py::dict header_dict(const nx::AtbHeader& h) {
    py::dict d = spec_dict(h.spec);
    d.attr("pop")("freq_factors");
    d["version"] = h.version;
    d["flags"] = h.flags;
    d["freq_factors_crc"] = h.freq_factors_crc;
    d["n_tokens"] = h.n_tokens;
    d["anchor"] = h.anchor;
    d["token_hash"] = h.token_hash;
    d["k_type"] = h.k_type;
    d["v_type"] = h.v_type;
    d["v_layout"] = h.v_layout;
    d["align_log2"] = h.align_log2;
    d["data_offset"] = h.data_offset;
    d["plane_stride"] = h.plane_stride;
    d["plane_bytes"] = h.plane_bytes;
    d["file_size"] = h.file_size;
    d["payload_crc"] = h.payload_crc;
    d["header_crc"] = h.header_crc;
    return d;
}

// A plane-stack view (n_layer, a, b) of float16 into a block; `base` keeps the block alive.
py::array plane_view(nx::AtbBlock& b, bool v, py::handle base) {
    const auto E = (py::ssize_t)b.spec().n_embd(), T = (py::ssize_t)b.n_tokens();
    const bool transposed = v && b.v_layout() == nx::VLayout::Transposed;
    const py::ssize_t a = transposed ? E : T, c = transposed ? T : E;
    const py::ssize_t layer_stride = (py::ssize_t)(2 * b.mem_stride_elems() * 2);
    py::array arr(py::dtype("float16"), {(py::ssize_t)b.spec().n_layer, a, c}, {layer_stride, c * 2, (py::ssize_t)2},
                  v ? (void*)b.v(0) : (void*)b.k(0), base);
    set_readonly(arr);
    return arr;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "Nexus native core: INT8 SLB scan, .atb codec, llama.cpp state conversion, RoPE reanchor, "
              "buddy allocator and L0 radix arena.";
    m.attr("__version__") = "0.1.0";

    // ---- exceptions --------------------------------------------------------------------------------
    auto& atb_error = py::register_exception<nx::AtbError>(m, "AtbError", PyExc_ValueError);
    atb_error.doc() = "Malformed or unsupported .atb data (magic, version, sizes, offsets, checksums).";
    auto& mismatch = py::register_exception<nx::AtbMismatchError>(m, "AtbMismatchError", atb_error.ptr());
    mismatch.doc() = "A well-formed .atb block compiled for another model or RoPE regime.";
    auto& blob_error = py::register_exception<nx::StateBlobError>(m, "StateBlobError", PyExc_ValueError);
    blob_error.doc() = "Malformed or unsupported llama.cpp sequence-state blob.";

    // ---- ISA / utilities ---------------------------------------------------------------------------
    m.def("isa", [] { return std::string(nx::isa_name(nx::best_isa())); },
          "Name of the SIMD path the kernels use by default on this CPU: 'avx512vnni', 'avx2', 'neon' or 'scalar'.");
    m.def(
        "available_isas",
        [] {
            std::vector<std::string> v;
            for (nx::Isa i : {nx::Isa::Scalar, nx::Isa::Avx2, nx::Isa::Avx512Vnni, nx::Isa::Neon})
                if (nx::isa_supported(i)) v.emplace_back(nx::isa_name(i));
            return v;
        },
        "Every SIMD path this CPU and build can run (each can be forced with an ``isa=`` argument).");
    m.def(
        "crc32",
        [](py::buffer data, uint32_t value) {
            Bytes b(data);
            if (b.n >= kGilFreeBytes) {
                py::gil_scoped_release nogil;
                return nx::crc32_update(value, b.p, b.n);
            }
            return nx::crc32_update(value, b.p, b.n);
        },
        py::arg("data"), py::arg("value") = 0,
        "CRC-32 (zlib polynomial, equal to ``zlib.crc32(data, value)``) of a contiguous buffer.");
    m.def(
        "memory_read_sum",
        [](py::buffer data) {
            Bytes b(data);
            if (b.n >= kGilFreeBytes) {
                py::gil_scoped_release nogil;
                return nx::memory_read_sum(b.p, b.n);
            }
            return nx::memory_read_sum(b.p, b.n);
        },
        py::arg("data"),
        "Sum of all bytes of a contiguous buffer, streamed with the widest loads: the memory-bandwidth floor "
        "for a scan over the same number of bytes.");
    m.def(
        "quantize_int8",
        [](F32In x, std::optional<std::string> isa) {
            const nx::Isa i = isa_arg(isa, nx::best_isa());
            if (x.ndim() < 1) throw py::value_error("x must have at least one dimension");
            const std::size_t dim = (std::size_t)x.shape(x.ndim() - 1);
            if (dim == 0) throw py::value_error("the last dimension must be > 0");
            const std::size_t rows = dim ? (std::size_t)x.size() / dim : 0;
            std::vector<py::ssize_t> qshape(x.shape(), x.shape() + x.ndim());
            py::array_t<int8_t> q(qshape);
            std::vector<py::ssize_t> sshape(x.shape(), x.shape() + x.ndim() - 1);
            py::array_t<float> s(sshape);
            const float* xp = x.data();
            int8_t* qp = q.mutable_data();
            float* sp = s.mutable_data();
            for (std::size_t r = 0; r < rows; ++r) sp[r] = nx::quantize_int8(xp + r * dim, dim, qp + r * dim, i);
            return py::make_tuple(q, s);
        },
        py::arg("x"), py::arg("isa") = py::none(),
        "Symmetric per-vector INT8 quantisation along the last axis: returns ``(q, scale)`` with "
        "``q = clip(rint(x * 127 / max|x|), -127, 127)`` (int8) and ``scale = max|x| / 127`` (float32, 0 for an "
        "all-zero vector). Raises ValueError on nan/inf. ``isa`` forces a kernel (all give the same bits).");

    // ---- SLB ---------------------------------------------------------------------------------------
    py::class_<nx::Int8Index>(m, "Int8Index",
                              "INT8 semantic lookaside buffer: quantised unit-norm embeddings in 64-byte aligned "
                              "rows, scanned with AVX-512-VNNI / AVX2 / NEON / scalar kernels.")
        .def(py::init([](std::size_t dim, std::size_t capacity, std::optional<std::string> isa) {
                 return new nx::Int8Index(dim, capacity, isa_arg(isa, nx::best_isa()));
             }),
             py::arg("dim"), py::arg("capacity") = 0, py::arg("isa") = py::none(),
             "Empty index of ``dim``-dimensional vectors; ``capacity`` pre-reserves rows; ``isa`` forces a "
             "kernel ('scalar', 'avx2', 'avx512vnni', 'neon'), default the best this CPU runs.")
        .def_property_readonly("dim", &nx::Int8Index::dim, "Vector dimension.")
        .def_property_readonly("stride", &nx::Int8Index::stride, "Bytes between rows (dim rounded up to 64).")
        .def_property_readonly("capacity", &nx::Int8Index::capacity, "Rows reserved before the next growth.")
        .def_property_readonly("next_id", &nx::Int8Index::next_id, "Id that ``add`` assigns next when ids are omitted.")
        .def_property(
            "isa", [](const nx::Int8Index& ix) { return std::string(nx::isa_name(ix.isa())); },
            [](nx::Int8Index& ix, const std::string& name) {
                std::unique_lock<std::shared_mutex> lk(ix.mutex());
                ix.set_isa(isa_arg(name, nx::Isa::Scalar));
            },
            "Kernel in use; assignable to force another supported path.")
        .def("__len__", &nx::Int8Index::size, "Number of rows.")
        .def(
            "__contains__", [](const nx::Int8Index& ix, int64_t id) { return ix.contains(id); }, py::arg("id"),
            "Whether ``id`` is in the index.")
        .def(
            "add",
            [](nx::Int8Index& ix, F32In x, std::optional<I64In> ids) {
                if (x.ndim() == 1) x = x.reshape({(py::ssize_t)1, x.shape(0)});
                if (x.ndim() != 2 || (std::size_t)x.shape(1) != ix.dim())
                    throw py::value_error("vectors must have shape (n, " + std::to_string(ix.dim()) + ") or (" +
                                          std::to_string(ix.dim()) + ",)");
                const std::size_t n = (std::size_t)x.shape(0);
                py::array_t<int64_t> out((py::ssize_t)n);
                int64_t* o = out.mutable_data();
                if (ids) {
                    if (ids->ndim() != 1 || (std::size_t)ids->shape(0) != n) throw py::value_error("ids must have shape (n,)");
                    std::memcpy(o, ids->data(), n * 8);
                } else {
                    for (std::size_t i = 0; i < n; ++i) o[i] = ix.next_id() + (int64_t)i;
                }
                std::unique_lock<std::shared_mutex> lk(ix.mutex());
                ix.add(x.data(), n, o);
                return out;
            },
            py::arg("vectors"), py::arg("ids") = py::none(),
            "Quantise and append vectors of shape (n, dim) or (dim,); ``ids`` (int64, unique, new) default to "
            "``next_id, next_id + 1, ...``. Returns the ids. Nothing is added if any check fails.")
        .def(
            "replace",
            [](nx::Int8Index& ix, int64_t id, F32In x) {
                if (x.ndim() != 1 || (std::size_t)x.shape(0) != ix.dim())
                    throw py::value_error("vector must have shape (" + std::to_string(ix.dim()) + ",)");
                std::unique_lock<std::shared_mutex> lk(ix.mutex());
                if (!ix.contains(id)) throw py::key_error(std::to_string(id));
                ix.replace(id, x.data());
            },
            py::arg("id"), py::arg("vector"), "Re-quantise the row of ``id`` from a new vector (KeyError if absent).")
        .def(
            "remove",
            [](nx::Int8Index& ix, int64_t id) {
                std::unique_lock<std::shared_mutex> lk(ix.mutex());
                if (!ix.contains(id)) throw py::key_error(std::to_string(id));
                ix.remove(id);
            },
            py::arg("id"), "Remove the row of ``id`` in O(1) (the last row moves into its place). KeyError if absent.")
        .def(
            "clear",
            [](nx::Int8Index& ix) {
                std::unique_lock<std::shared_mutex> lk(ix.mutex());
                ix.clear();
            },
            "Remove every row (capacity is kept).")
        .def(
            "search",
            [](const nx::Int8Index& ix, py::handle query, py::ssize_t k) {
                F32In keep;
                const float* qp = query_arg(query, ix.dim(), keep);
                if (k < 0) throw py::value_error("k must be >= 0");
                const std::size_t kk = std::min((std::size_t)k, ix.size());
                py::array_t<int64_t> ids = new_1d<int64_t>(kk);
                py::array_t<float> scores = new_1d<float>(kk);
                auto* ip = static_cast<int64_t*>(ids.mutable_data());
                auto* sp = static_cast<float*>(scores.mutable_data());
                if (ix.size() * ix.stride() >= kGilFreeBytes) {
                    py::gil_scoped_release nogil;
                    std::shared_lock<std::shared_mutex> lk(ix.mutex());
                    if (ix.search(qp, kk, ip, sp) != kk) throw std::logic_error("index changed during search");
                } else {
                    std::shared_lock<std::shared_mutex> lk(ix.mutex());
                    ix.search(qp, kk, ip, sp);
                }
                PyObject* t = PyTuple_New(2);
                if (!t) throw py::error_already_set();
                PyTuple_SET_ITEM(t, 0, ids.release().ptr());
                PyTuple_SET_ITEM(t, 1, scores.release().ptr());
                return py::reinterpret_steal<py::tuple>(t);
            },
            py::arg("query"), py::arg("k"),
            "Top-``k`` rows for a float32 query of shape (dim,): ``(ids int64, scores float32)``, "
            "score = int_dot * row_scale * query_scale, best first, ties by smaller id; min(k, len) results.")
        .def(
            "scores",
            [](const nx::Int8Index& ix, F32In q) {
                if (q.ndim() != 1 || (std::size_t)q.shape(0) != ix.dim())
                    throw py::value_error("query must have shape (" + std::to_string(ix.dim()) + ",)");
                py::array_t<float> out((py::ssize_t)ix.size());
                float* op = out.mutable_data();
                const float* qp = q.data();
                py::gil_scoped_release nogil;
                std::shared_lock<std::shared_mutex> lk(ix.mutex());
                ix.scores(qp, op);
                return out;
            },
            py::arg("query"), "Score of every row (in ``ids()`` order) for a float32 query of shape (dim,).")
        .def(
            "ids",
            [](const nx::Int8Index& ix) {
                std::shared_lock<std::shared_mutex> lk(ix.mutex());
                return py::array_t<int64_t>((py::ssize_t)ix.size(), ix.ids());
            },
            "Copy of the ids in row order.")
        .def(
            "rows",
            [](const nx::Int8Index& ix) {
                std::shared_lock<std::shared_mutex> lk(ix.mutex());
                py::array_t<int8_t> out({(py::ssize_t)ix.size(), (py::ssize_t)ix.dim()});
                for (std::size_t i = 0; i < ix.size(); ++i)
                    std::memcpy(out.mutable_data(i, 0), ix.rows() + i * ix.stride(), ix.dim());
                return out;
            },
            "Copy of the quantised rows, shape (len, dim), in row order.")
        .def(
            "scales",
            [](const nx::Int8Index& ix) {
                std::shared_lock<std::shared_mutex> lk(ix.mutex());
                return py::array_t<float>((py::ssize_t)ix.size(), ix.scales());
            },
            "Copy of the per-row scales in row order.")
        .def(
            "stream_read_sum",
            [](const nx::Int8Index& ix) {
                if (ix.size() * ix.stride() >= kGilFreeBytes) {  // same GIL policy as search: a fair floor
                    py::gil_scoped_release nogil;
                    std::shared_lock<std::shared_mutex> lk(ix.mutex());
                    return nx::memory_read_sum(ix.rows(), ix.size() * ix.stride());
                }
                std::shared_lock<std::shared_mutex> lk(ix.mutex());
                return nx::memory_read_sum(ix.rows(), ix.size() * ix.stride());
            },
            "Stream-read the index's own row memory (len * stride bytes) and sum it: the bandwidth floor of a scan.");

    // ---- model spec ---------------------------------------------------------------------------------
    py::enum_<nx::RopeType>(m, "RopeType", "RoPE pairing, with llama.cpp's LLAMA_ROPE_TYPE_* values.")
        .value("NORM", nx::RopeType::Norm, "adjacent pairs (2i, 2i+1), e.g. llama")
        .value("NEOX", nx::RopeType::Neox, "half-split pairs (i, i + n_rot/2), e.g. qwen2, gpt-neox");
    py::enum_<nx::VLayout>(m, "VLayout", "Layout of V planes.")
        .value("ROWS", nx::VLayout::Rows, "token-major rows (llama.cpp with flash attention)")
        .value("TRANSPOSED", nx::VLayout::Transposed, "element-major (llama.cpp's transposed V, flash attention off)");

    py::class_<nx::ModelSpec>(m, "ModelSpec",
                              "KV geometry and RoPE regime of the runtime model (llama.cpp cparams/hparams); an .atb "
                              "block is only accepted when its header matches exactly.")
        .def(py::init([](py::bytes fingerprint, uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim,
                         std::optional<uint32_t> n_rot, nx::RopeType rope_type, float freq_base, float freq_scale,
                         uint32_t n_ctx_orig, float ext_factor, float attn_factor, float beta_fast, float beta_slow,
                         std::optional<F32In> freq_factors) {
                 nx::ModelSpec s;
                 s.fingerprint = fingerprint_arg(fingerprint);
                 s.n_layer = n_layer;
                 s.n_head_kv = n_head_kv;
                 s.head_dim = head_dim;
                 s.n_rot = n_rot ? *n_rot : head_dim;
                 s.rope_type = rope_type;
                 s.freq_base = freq_base;
                 s.freq_scale = freq_scale;
                 s.n_ctx_orig = n_ctx_orig;
                 s.ext_factor = ext_factor;
                 s.attn_factor = attn_factor;
                 s.beta_fast = beta_fast;
                 s.beta_slow = beta_slow;
                 if (freq_factors) s.freq_factors.assign(freq_factors->data(), freq_factors->data() + freq_factors->size());
                 s.validate();
                 return s;
             }),
             py::kw_only(), py::arg("fingerprint"), py::arg("n_layer"), py::arg("n_head_kv"), py::arg("head_dim"),
             py::arg("n_rot") = py::none(), py::arg("rope_type") = nx::RopeType::Norm, py::arg("freq_base") = 10000.0f,
             py::arg("freq_scale") = 1.0f, py::arg("n_ctx_orig") = 0, py::arg("ext_factor") = 0.0f,
             py::arg("attn_factor") = 1.0f, py::arg("beta_fast") = 32.0f, py::arg("beta_slow") = 1.0f,
             py::arg("freq_factors") = py::none(),
             "Keyword-only. ``fingerprint``: 16 opaque bytes naming the model; ``n_rot`` defaults to head_dim; "
             "``freq_factors``: optional n_rot/2 float32 divisors (llama.cpp rope_freqs). Raises ValueError when "
             "out of range.")
        .def_property_readonly("fingerprint", [](const nx::ModelSpec& s) { return py::bytes(reinterpret_cast<const char*>(s.fingerprint.data()), 16); }, "16-byte model fingerprint.")
        .def_readonly("n_layer", &nx::ModelSpec::n_layer, "Layers holding KV.")
        .def_readonly("n_head_kv", &nx::ModelSpec::n_head_kv, "KV heads per layer.")
        .def_readonly("head_dim", &nx::ModelSpec::head_dim, "Elements per head.")
        .def_readonly("n_rot", &nx::ModelSpec::n_rot, "Rotated elements per head.")
        .def_readonly("rope_type", &nx::ModelSpec::rope_type, "RoPE pairing.")
        .def_readonly("freq_base", &nx::ModelSpec::freq_base, "RoPE frequency base.")
        .def_readonly("freq_scale", &nx::ModelSpec::freq_scale, "RoPE frequency scale (linear scaling).")
        .def_readonly("n_ctx_orig", &nx::ModelSpec::n_ctx_orig, "YaRN original context length.")
        .def_readonly("ext_factor", &nx::ModelSpec::ext_factor, "YaRN extrapolation mix factor.")
        .def_readonly("attn_factor", &nx::ModelSpec::attn_factor, "YaRN magnitude factor.")
        .def_readonly("beta_fast", &nx::ModelSpec::beta_fast, "YaRN beta_fast.")
        .def_readonly("beta_slow", &nx::ModelSpec::beta_slow, "YaRN beta_slow.")
        .def_property_readonly("freq_factors", [](const nx::ModelSpec& s) -> py::object {
            if (s.freq_factors.empty()) return py::none();
            return py::array_t<float>((py::ssize_t)s.freq_factors.size(), s.freq_factors.data());
        }, "Per-pair frequency divisors (copy) or None.")
        .def_property_readonly("n_embd", &nx::ModelSpec::n_embd, "n_head_kv * head_dim.")
        .def("to_dict", &spec_dict, "All fields as a dict (``ModelSpec(**d)`` round-trips).")
        .def(
            "diff", [](const nx::ModelSpec& a, const nx::ModelSpec& b) { return a.diff(b, true); }, py::arg("other"),
            "Human-readable differences to ``other`` (empty list when equal).")
        .def(
            "__eq__", [](const nx::ModelSpec& a, const nx::ModelSpec& b) { return a.diff(b, true).empty(); },
            py::is_operator(), py::arg("other"), "Field-wise (bitwise for floats) equality.")
        .def("__repr__", [](const nx::ModelSpec& s) {
            return py::str("ModelSpec(n_layer={}, n_head_kv={}, head_dim={}, n_rot={}, rope_type={}, freq_base={}, freq_scale={})")
                .format(s.n_layer, s.n_head_kv, s.head_dim, s.n_rot, s.rope_type, s.freq_base, s.freq_scale);
        }, "Short summary.");

    // ---- RoPE ----------------------------------------------------------------------------------------
    m.def(
        "rope_cache",
        [](const nx::ModelSpec& spec, int64_t delta, bool fma) {
            py::array_t<float> c((py::ssize_t)spec.n_rot);
            nx::rope_cache(spec, delta, c.mutable_data(), fma);
            return c;
        },
        py::arg("spec"), py::arg("delta"), py::arg("fma") = true,
        "cos/sin table for a rotation by ``delta`` positions, interleaved ``[cos0, sin0, cos1, sin1, ...]`` "
        "(n_rot float32), computed with ggml's float math (incl. YaRN and freq_factors; ``fma`` only changes "
        "the YaRN terms).");
    m.def(
        "rope_reanchor",
        [](py::array k, int64_t delta, const nx::ModelSpec& spec, std::optional<std::string> isa, bool fma) {
            uint16_t* p = f16_inplace(k, "k");
            if ((std::size_t)k.size() % spec.head_dim) throw py::value_error("k.size must be a multiple of head_dim");
            const std::size_t heads = (std::size_t)k.size() / spec.head_dim;
            const nx::Isa i = isa_arg(isa, nx::best_isa());
            py::gil_scoped_release nogil;
            nx::rope_reanchor_f16(p, heads, spec, delta, i, fma);
        },
        py::arg("k"), py::arg("delta"), py::arg("spec"), py::arg("isa") = py::none(), py::arg("fma") = true,
        "Re-rotate RoPE'd K in place by ``delta`` positions (= target - anchor), exactly like llama.cpp's "
        "K-shift: ``k`` is a writable C-contiguous float16 array of head vectors (last axes n_head_kv * head_dim "
        "or head_dim); the first n_rot dims of each head rotate (NORM: adjacent pairs, NEOX: half split). "
        "``fma=True`` rounds like an FMA build of ggml (llama-cpp-python's native build: "
        "``y0 = fma(x0, c, -(x1*s))``, ``y1 = fma(x0, s, x1*c)``), bit-identical to its K-shift; "
        "``fma=False`` is plain IEEE (a build without FMA contraction).");

    // ---- .atb ----------------------------------------------------------------------------------------
    m.attr("ATB_HEADER_SIZE") = nx::kAtbHeaderSize;
    m.attr("ATB_VERSION") = nx::kAtbVersion;
    m.attr("ATB_PAGE_ALIGN_LOG2") = nx::kAtbDefaultAlignLog2;
    m.attr("ATB_COMPACT_ALIGN_LOG2") = nx::kAtbMinAlignLog2;

    m.def(
        "read_atb_header",
        [](py::buffer data) {
            Bytes b(data);
            return header_dict(nx::AtbHeader::parse(b.p, b.n));
        },
        py::arg("data"),
        "Parse and structurally validate the header of an encoded block (whole block bytes; the payload is not "
        "checksummed and no model is checked). Returns every header field as a dict; raises AtbError.");

    m.def(
        "state_info",
        [](py::buffer data) {
            Bytes b(data);
            const nx::StateLayout L = nx::parse_state(b.p, b.n);
            py::dict d;
            d["seq_id"] = L.seq_id;
            d["n_stream"] = L.n_stream;
            d["stream"] = L.stream;
            d["cell_count"] = L.cell_count;
            d["positions"] = py::array_t<int32_t>((py::ssize_t)L.pos.size(), L.pos.data());
            d["v_trans"] = L.v_trans;
            d["n_layer"] = L.n_layer;
            py::list k, v;
            for (const auto& pl : L.k) k.append(py::dict("type"_a = pl.type, "row_size"_a = pl.row_size, "offset"_a = pl.offset));
            for (const auto& pl : L.v)
                v.append(py::dict("type"_a = pl.type, "row_size"_a = pl.row_size, "el_size"_a = pl.el_size,
                                  "n_embd_v"_a = pl.n_embd_v, "offset"_a = pl.offset));
            d["k"] = k;
            d["v"] = v;
            return d;
        },
        py::arg("data"),
        "Parse a llama.cpp sequence-state blob (llama_state_seq_get_data) without a model: stream/cell counts, "
        "cell positions, V layout and per-layer plane types/sizes/offsets. Raises StateBlobError.");

    py::class_<nx::AtbBlock>(m, "AtbBlock",
                             "One compiled tool block: header fields plus per-layer F16 K and V planes in 64-byte "
                             "aligned memory.")
        .def(py::init([](const nx::ModelSpec& spec, py::array k, py::array v, int32_t anchor, uint64_t token_hash,
                         nx::VLayout v_layout) {
                 auto np = py::module_::import("numpy");
                 py::array kk = np.attr("ascontiguousarray")(k, "dtype"_a = "float16");
                 py::array vv = np.attr("ascontiguousarray")(v, "dtype"_a = "float16");
                 if (kk.ndim() < 2 || (uint32_t)kk.shape(0) != spec.n_layer)
                     throw py::value_error("k must have shape (n_layer, n_tokens, n_embd)");
                 const auto T = (std::size_t)kk.shape(1), E = (std::size_t)spec.n_embd();
                 if (T < 1 || (std::size_t)kk.size() != spec.n_layer * T * E)
                     throw py::value_error("k must have shape (n_layer, n_tokens, n_head_kv * head_dim)");
                 const bool tr = v_layout == nx::VLayout::Transposed;
                 if (vv.ndim() != 3 || (uint32_t)vv.shape(0) != spec.n_layer ||
                     (std::size_t)vv.shape(1) != (tr ? E : T) || (std::size_t)vv.shape(2) != (tr ? T : E))
                     throw py::value_error(tr ? "v must have shape (n_layer, n_embd, n_tokens) for TRANSPOSED"
                                              : "v must have shape (n_layer, n_tokens, n_embd) for ROWS");
                 auto* b = new nx::AtbBlock(spec, (uint32_t)T, anchor, token_hash, v_layout);
                 const auto* kp = static_cast<const uint16_t*>(kk.data());
                 const auto* vp = static_cast<const uint16_t*>(vv.data());
                 for (uint32_t l = 0; l < spec.n_layer; ++l) {
                     std::memcpy(b->k(l), kp + l * T * E, T * E * 2);
                     std::memcpy(b->v(l), vp + l * T * E, T * E * 2);
                 }
                 return b;
             }),
             py::arg("spec"), py::arg("k"), py::arg("v"), py::arg("anchor"), py::arg("token_hash") = 0,
             py::arg("v_layout") = nx::VLayout::Rows,
             "Block from arrays (copied, cast to float16): ``k`` (n_layer, n_tokens, n_embd) with RoPE applied at "
             "positions anchor .. anchor + n_tokens - 1; ``v`` as ``v_layout`` says.")
        .def_property_readonly("spec", &nx::AtbBlock::spec, "The model spec the block belongs to (a copy).")
        .def_property_readonly("n_tokens", &nx::AtbBlock::n_tokens, "Tokens (KV cells) in the block.")
        .def_property_readonly("anchor", &nx::AtbBlock::anchor, "RoPE anchor m0: position of the first token.")
        .def_property_readonly("token_hash", &nx::AtbBlock::token_hash, "64-bit hash of the token sequence.")
        .def_property_readonly("v_layout", &nx::AtbBlock::v_layout, "Layout of the V planes.")
        .def_property_readonly("n_layer", [](const nx::AtbBlock& b) { return b.spec().n_layer; }, "Layers.")
        .def_property_readonly("nbytes", [](const nx::AtbBlock& b) { return 2 * b.spec().n_layer * b.plane_bytes(); },
                               "Payload bytes (all K and V planes).")
        .def_property_readonly("k", [](py::object self) { return plane_view(self.cast<nx::AtbBlock&>(), false, self); },
                               "Read-only float16 view of K, shape (n_layer, n_tokens, n_head_kv * head_dim).")
        .def_property_readonly("v", [](py::object self) { return plane_view(self.cast<nx::AtbBlock&>(), true, self); },
                               "Read-only float16 view of V: (n_layer, n_tokens, n_embd) for ROWS, "
                               "(n_layer, n_embd, n_tokens) for TRANSPOSED.")
        .def(
            "copy",
            [](const nx::AtbBlock& b) {
                auto* c = new nx::AtbBlock(b.spec(), b.n_tokens(), b.anchor(), b.token_hash(), b.v_layout());
                std::memcpy(c->raw(), b.raw(), 2 * b.spec().n_layer * b.mem_stride_elems() * 2);
                return c;
            },
            "Deep copy.")
        .def(
            "reanchor",
            [](nx::AtbBlock& b, int32_t position, std::optional<std::string> isa, bool fma) {
                const nx::Isa i = isa_arg(isa, nx::best_isa());
                py::gil_scoped_release nogil;
                b.reanchor(position, i, fma);
            },
            py::arg("position"), py::arg("isa") = py::none(), py::arg("fma") = true,
            "Rotate every K row in place from the current anchor to ``position`` and make it the new anchor "
            "(``fma`` as in ``rope_reanchor``).")
        .def(
            "payload_crc",
            [](const nx::AtbBlock& b) {
                py::gil_scoped_release nogil;
                return b.payload_crc();
            },
            "CRC-32 of all planes in file order (K0, V0, K1, V1, ...).")
        .def("encoded_size", &nx::AtbBlock::encoded_size, py::arg("align_log2") = nx::kAtbDefaultAlignLog2,
             "Bytes of the encoding with planes aligned to 2**align_log2.")
        .def(
            "to_bytes",
            [](const nx::AtbBlock& b, uint32_t align_log2) {
                if (align_log2 < nx::kAtbMinAlignLog2 || align_log2 > nx::kAtbMaxAlignLog2)
                    throw py::value_error("align_log2 must be in [6, 21]");
                const std::size_t n = b.encoded_size(align_log2);
                return make_bytes(n, [&](uint8_t* out) { b.encode(out, n, align_log2); }, true);
            },
            py::arg("align_log2") = nx::kAtbDefaultAlignLog2,
            "Encode as .atb bytes. Default: planes on 2 MiB boundaries (the format's page alignment); "
            "``ATB_COMPACT_ALIGN_LOG2`` (64 B) gives the compact encoding for network stores.")
        .def(
            "save",
            [](const nx::AtbBlock& b, const std::filesystem::path& path, uint32_t align_log2) {
                if (align_log2 < nx::kAtbMinAlignLog2 || align_log2 > nx::kAtbMaxAlignLog2)
                    throw py::value_error("align_log2 must be in [6, 21]");
                const std::string p = path.string();
                py::gil_scoped_release nogil;
                b.save(p, align_log2);
            },
            py::arg("path"), py::arg("align_log2") = nx::kAtbDefaultAlignLog2,
            "Write an .atb file atomically (tmp + rename). The padding between 2 MiB-aligned planes is left as "
            "file holes, so the file's disk usage is about its payload.")
        .def_static(
            "from_bytes",
            [](py::buffer data, const nx::ModelSpec& spec) {
                Bytes b(data);
                py::gil_scoped_release nogil;
                return new nx::AtbBlock(nx::AtbBlock::decode(b.p, b.n, spec));
            },
            py::arg("data"), py::arg("spec"),
            "Decode and fully validate an encoded block against the runtime model ``spec``: AtbError for "
            "malformed data (magic, version, sizes, offsets, checksums), AtbMismatchError when it was compiled "
            "for another model / RoPE regime.")
        .def_static(
            "load",
            [](const std::filesystem::path& path, const nx::ModelSpec& spec) {
                const std::string p = path.string();
                py::gil_scoped_release nogil;
                return new nx::AtbBlock(nx::AtbBlock::load(p, spec));
            },
            py::arg("path"), py::arg("spec"),
            "Read and fully validate an .atb file (same checks as ``from_bytes``; OSError if unreadable).")
        .def_static(
            "from_state",
            [](py::buffer blob, const nx::ModelSpec& spec, uint64_t token_hash) {
                Bytes b(blob);
                py::gil_scoped_release nogil;
                return new nx::AtbBlock(nx::atb_from_state(b.p, b.n, spec, token_hash));
            },
            py::arg("blob"), py::arg("spec"), py::arg("token_hash") = 0,
            "Block from a llama.cpp ``llama_state_seq_get_data`` blob (F16 K/V, row-major or transposed V). "
            "The cells must cover one contiguous run of positions; the first is the anchor. StateBlobError on a "
            "malformed blob or one that does not fit ``spec``.")
        .def(
            "to_state",
            [](const nx::AtbBlock& b, int32_t position, std::optional<bool> v_trans, uint32_t n_stream, int32_t seq_id,
               bool reanchor, std::optional<std::string> isa, bool fma) {
                const bool vt = v_trans ? *v_trans : b.v_layout() == nx::VLayout::Transposed;
                const nx::Isa i = isa_arg(isa, nx::best_isa());
                if (n_stream < 1 || n_stream > 4096) throw py::value_error("n_stream must be in [1, 4096]");
                if (position < 0 || (int64_t)position + b.n_tokens() - 1 > INT32_MAX) throw py::value_error("position out of range");
                if (seq_id < 0) throw py::value_error("seq_id must be >= 0");
                const std::size_t n = nx::state_blob_size(b, vt, n_stream);
                return make_bytes(
                    n, [&](uint8_t* out) { nx::write_state_blob(b, position, vt, n_stream, seq_id, reanchor, i, fma, out, n); },
                    true);
            },
            py::arg("position"), py::kw_only(), py::arg("v_trans") = py::none(), py::arg("n_stream") = 1,
            py::arg("seq_id") = 0, py::arg("reanchor") = true, py::arg("isa") = py::none(), py::arg("fma") = true,
            "Sequence-state blob for ``llama_state_seq_set_data`` with the block's cells at positions "
            "``position ..``; K re-rotated from the anchor to ``position`` (unless ``reanchor=False``); V written "
            "transposed or row-major per ``v_trans`` (default: the block's layout; must match the target context, "
            "i.e. ``not flash_attn``); ``n_stream`` = the target context's KV streams (1 with kv_unified); ``fma`` as "
            "in ``rope_reanchor``.")
        .def(
            "state_size",
            [](const nx::AtbBlock& b, std::optional<bool> v_trans, uint32_t n_stream) {
                const bool vt = v_trans ? *v_trans : b.v_layout() == nx::VLayout::Transposed;
                if (n_stream < 1 || n_stream > 4096) throw py::value_error("n_stream must be in [1, 4096]");
                return nx::state_blob_size(b, vt, n_stream);
            },
            py::kw_only(), py::arg("v_trans") = py::none(), py::arg("n_stream") = 1,
            "Byte size of the blob ``to_state`` / ``to_state_into`` produce with these options.")
        .def(
            "to_state_into",
            [](const nx::AtbBlock& b, py::buffer out, int32_t position, std::optional<bool> v_trans, uint32_t n_stream,
               int32_t seq_id, bool reanchor, std::optional<std::string> isa, bool fma) {
                const bool vt = v_trans ? *v_trans : b.v_layout() == nx::VLayout::Transposed;
                const nx::Isa i = isa_arg(isa, nx::best_isa());
                if (n_stream < 1 || n_stream > 4096) throw py::value_error("n_stream must be in [1, 4096]");
                if (position < 0 || (int64_t)position + b.n_tokens() - 1 > INT32_MAX) throw py::value_error("position out of range");
                if (seq_id < 0) throw py::value_error("seq_id must be >= 0");
                py::buffer_info info = out.request(true);
                if (info.ndim != 1 || info.strides[0] != info.itemsize) throw py::value_error("out must be a contiguous 1-D buffer");
                const std::size_t cap = (std::size_t)(info.size * info.itemsize);
                const std::size_t n = nx::state_blob_size(b, vt, n_stream);
                if (cap < n) throw py::value_error("out holds " + std::to_string(cap) + " bytes, the blob needs " + std::to_string(n));
                auto* dst = static_cast<uint8_t*>(info.ptr);
                py::gil_scoped_release nogil;
                nx::write_state_blob(b, position, vt, n_stream, seq_id, reanchor, i, fma, dst, n);
                return n;
            },
            py::arg("out"), py::arg("position"), py::kw_only(), py::arg("v_trans") = py::none(), py::arg("n_stream") = 1,
            py::arg("seq_id") = 0, py::arg("reanchor") = true, py::arg("isa") = py::none(), py::arg("fma") = true,
            "``to_state`` into a caller-owned writable buffer (bytearray, numpy uint8, ctypes array) of at least "
            "``state_size()`` bytes, reused across splices so no fresh pages are touched; returns the blob length.");

    // ---- buddy allocator -------------------------------------------------------------------------------
    py::class_<nx::BuddyAllocator>(m, "BuddyAllocator",
                                   "Thread-safe power-of-two buddy allocator over one reserved arena (alignas(128), "
                                   "mutex alone on its own cache line).")
        .def(py::init<std::size_t, std::size_t>(), py::arg("arena_bytes"), py::arg("min_block") = 4096,
             "Reserve ``arena_bytes`` (power of two) split into blocks of ``min_block`` (power of two, >= 64) << k.")
        .def_property_readonly("arena_bytes", &nx::BuddyAllocator::arena_bytes, "Arena size.")
        .def_property_readonly("min_block", &nx::BuddyAllocator::min_block, "Smallest block size.")
        .def_property_readonly("free_bytes", &nx::BuddyAllocator::free_bytes, "Bytes in free blocks.")
        .def_property_readonly("used_bytes", &nx::BuddyAllocator::used_bytes, "Bytes in allocated blocks (rounded sizes).")
        .def_property_readonly("largest_free", &nx::BuddyAllocator::largest_free, "Largest free block size.")
        .def_property_readonly("allocations", &nx::BuddyAllocator::allocations, "Live allocations.")
        .def("free_blocks_per_order", &nx::BuddyAllocator::free_blocks_per_order,
             "Free-block counts by order (index k: blocks of min_block << k).")
        .def(
            "alloc",
            [](nx::BuddyAllocator& a, std::size_t size) -> std::optional<int64_t> {
                int64_t off;
                {
                    py::gil_scoped_release nogil;  // lets Python threads really contend on the mutex
                    off = a.alloc(size);
                }
                if (off < 0) return std::nullopt;
                return off;
            },
            py::arg("size"),
            "Offset of a new block of >= ``size`` bytes, or None when no block fits (evict, then retry).")
        .def(
            "free",
            [](nx::BuddyAllocator& a, int64_t offset) {
                py::gil_scoped_release nogil;
                a.free(offset);
            },
            py::arg("offset"), "Free a block (coalescing buddies). ValueError for an unknown offset or a double free.")
        .def("block_size", &nx::BuddyAllocator::block_size, py::arg("offset"), "Size of the allocated block at ``offset``.")
        .def(
            "view",
            [](py::object self, int64_t offset, std::optional<std::size_t> size) {
                auto& a = self.cast<nx::BuddyAllocator&>();
                const std::size_t bs = a.block_size(offset);
                const std::size_t n = size ? *size : bs;
                if (n > bs) throw py::value_error("size exceeds the block");
                return py::array(py::dtype::of<uint8_t>(), {(py::ssize_t)n}, {(py::ssize_t)1}, a.base() + offset, self);
            },
            py::arg("offset"), py::arg("size") = py::none(),
            "Writable uint8 view of an allocated block (keeps the allocator alive; do not use after ``free``).")
        .def(
            "stress",
            [](nx::BuddyAllocator& a, int threads, int iterations, std::optional<std::size_t> max_size, uint64_t seed) {
                const std::size_t ms = max_size ? *max_size : a.arena_bytes() / 64;
                py::gil_scoped_release nogil;
                return a.stress(threads, iterations, ms, seed);
            },
            py::arg("threads") = 4, py::arg("iterations") = 10000, py::arg("max_size") = py::none(), py::arg("seed") = 0,
            "C++ multi-thread stress run (GIL released): random alloc/free with per-thread fill patterns checked "
            "before every free. Returns the number of corrupted (overlapping) blocks seen, 0 when correct.")
        .def_static(
            "layout",
            [] {
                return py::dict("alignof"_a = alignof(nx::BuddyAllocator), "sizeof"_a = sizeof(nx::BuddyAllocator),
                                "mutex_offset"_a = nx::BuddyAllocator::mutex_offset(),
                                "mutex_line_bytes"_a = sizeof(nx::PaddedMutex), "cache_line"_a = nx::kCacheLine);
            },
            "Compile-time layout facts (also enforced by static_assert): alignment, size, mutex offset.");

    // ---- radix arena -----------------------------------------------------------------------------------
    py::class_<nx::RadixArena> radix(m, "RadixArena",
                               "L0 exact-token radix arena: 32 fixed sequence slots, longest-common-prefix lookup of "
                               "warm prefixes, LRU eviction, nothing allocated after construction.");
    radix.attr("n_slots") = nx::RadixArena::kSlots;  // class constant: 32
    radix.def(py::init<std::size_t>(), py::arg("max_tokens") = 8192,
              "Reserve 32 slots of up to ``max_tokens`` int32 tokens each.")
        .def_property_readonly("max_tokens", &nx::RadixArena::max_tokens, "Capacity of one slot in tokens.")
        .def_property_readonly("node_count", &nx::RadixArena::node_count, "Radix-tree nodes in use (incl. the root).")
        .def("__len__", &nx::RadixArena::size, "Occupied slots.")
        .def(
            "lookup",
            [](nx::RadixArena& r, I32In t, bool touch) {
                if (t.ndim() != 1) throw py::value_error("tokens must be 1-D");
                const auto mt = r.lookup(t.data(), (std::size_t)t.size(), touch);
                return py::make_tuple(mt.slot, mt.length);
            },
            py::arg("tokens"), py::arg("touch") = true,
            "``(slot, length)`` of the cached sequence sharing the longest prefix with ``tokens`` (ties: most "
            "recently used), ``(-1, 0)`` if none shares the first token. ``touch`` marks the slot used.")
        .def(
            "insert",
            [](nx::RadixArena& r, I32In t, int64_t value) {
                if (t.ndim() != 1) throw py::value_error("tokens must be 1-D");
                const auto ins = r.insert(t.data(), (std::size_t)t.size(), value);
                return py::make_tuple(ins.slot, ins.evicted, ins.existed);
            },
            py::arg("tokens"), py::arg("value") = 0,
            "Cache a sequence with a user ``value`` (e.g. a KV location): ``(slot, evicted_slot or -1, existed)``. "
            "An exact duplicate reuses its slot; when all 32 are taken the least recently used is evicted.")
        .def("remove", &nx::RadixArena::remove, py::arg("slot"), "Empty a slot.")
        .def("touch", &nx::RadixArena::touch, py::arg("slot"), "Mark a slot most recently used.")
        .def("clear", &nx::RadixArena::clear, "Empty every slot.")
        .def("occupied", &nx::RadixArena::occupied, py::arg("slot"), "Whether a slot holds a sequence.")
        .def(
            "tokens",
            [](const nx::RadixArena& r, int slot) {
                std::size_t n;
                const int32_t* p = r.tokens(slot, &n);
                return py::array_t<int32_t>((py::ssize_t)n, p);
            },
            py::arg("slot"), "Copy of a slot's tokens.")
        .def("value", &nx::RadixArena::value, py::arg("slot"), "A slot's user value.")
        .def("set_value", &nx::RadixArena::set_value, py::arg("slot"), py::arg("value"), "Set a slot's user value.")
        .def("lru_order", &nx::RadixArena::lru_order, "Occupied slots, least recently used first.")
        .def("check", &nx::RadixArena::check, "Structural self-check of the radix tree: '' when consistent.");
}
