// smdebug_torch's one-pass statistics kernel (built on first use by smdebug_torch.native).
//
// torch.classes.smdebug_torch.HealthWatch(weights, grad_params, columns).fill(loss, with_grads, out):
// for each weight, each parameter's gradient and the loss, the l2 norm into out[column] and the max |x|
// into out[n + column] (absent: -1 in both), in one reading of each tensor and one call for all of them;
// True when every value is finite. smdebug_health_fill (a C function, called through ctypes) does the
// same for a watch's address: a custom class's method call from Python costs ~80 us on a step's cold
// caches, a ctypes call ~20.
// On the CPU every torch call costs a microsecond or more, and passing a list of tensors to one costs a
// tenth of that per tensor: more than reading a small tensor. torch's batched calls (stack, norm, abs,
// amax) read and copy a model's hundreds of weights and gradients several times.
#if __has_include(<Python.h>)  // (first, as Python asks: smdebug_reduce_list reads a list of tensors)
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define SMDEBUG_PYTHON 1
#endif
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Functions.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kBlock = 4096;  // values summed in the tensor's precision before a double takes them
constexpr int kLanes = 32;        // independent accumulators: the loop is not bound by one add's latency
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Stats {
  double sumsq = 0;
  double maxabs = 0;
};

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SMDEBUG_CLONES __attribute__((target_clones("avx2", "default")))  // AVX2 where the CPU has it
#else
#define SMDEBUG_CLONES
#endif

template <typename T>
double sumsq_in_double(const T* x, int64_t start, int64_t end) {
  double sum = 0;
  for (int64_t k = start; k < end; ++k) sum += static_cast<double>(x[k]) * static_cast<double>(x[k]);
  return sum;
}

// The sum of squares and the largest |x| of x[0:n]. A block whose float sum overflows (finite values
// above ~1e19) is summed again in double: a finite tensor's statistics stay finite where they can be.
// A NaN makes the sum NaN (squares are never negative: no inf - inf), and then the max too (a compare
// alone would skip it).
template <typename T>
SMDEBUG_CLONES Stats stats_of(const T* x, int64_t n) {
  Stats out;
  if (n < 4 * kLanes) {  // small (a bias): one plain loop, no lanes to set up and sum
    T sum = 0, top = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i];
      sum += v * v;
      const T a = std::fabs(v);
      top = a > top ? a : top;
    }
    out.sumsq = std::isfinite(static_cast<double>(sum)) ? static_cast<double>(sum) : sumsq_in_double(x, 0, n);
    out.maxabs = std::isnan(out.sumsq) ? out.sumsq : static_cast<double>(top);
    return out;
  }
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    T s[kLanes] = {}, m[kLanes] = {};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const T v = x[i + j];
        s[j] += v * v;
        const T a = std::fabs(v);
        m[j] = a > m[j] ? a : m[j];
      }
    }
    T sum = 0, top = 0;
    for (; i < end; ++i) {
      const T v = x[i];
      sum += v * v;
      const T a = std::fabs(v);
      top = a > top ? a : top;
    }
    for (int j = 0; j < kLanes; ++j) {
      sum += s[j];
      top = m[j] > top ? m[j] : top;
    }
    const double block = std::isfinite(static_cast<double>(sum)) ? sum : sumsq_in_double(x, start, end);
    out.sumsq += block;
    out.maxabs = top > out.maxabs ? top : out.maxabs;
  }
  if (std::isnan(out.sumsq)) out.maxabs = out.sumsq;
  return out;
}

// l2 norm and max |x| of one tensor into out[column] and out[n + column] (absent: -1)
void put(const at::Tensor& t, float* o, int64_t n, int64_t column) {
  if (!t.defined()) {
    o[column] = o[n + column] = -1.0f;
    return;
  }
  const auto dtype = t.scalar_type();
  const bool plain = t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && t.has_storage();
  Stats s;
  // (a negative view's bit changes neither a square nor an absolute value)
  if (plain && dtype == at::kFloat) {
    s = stats_of(t.const_data_ptr<float>(), t.numel());
  } else if (plain && dtype == at::kDouble) {
    s = stats_of(t.const_data_ptr<double>(), t.numel());
  } else {  // other dtypes, layouts and devices: torch's own calls (float16/bfloat16 summed in float32)
    const at::NoGradGuard no_grad;  // (a parameter's statistics are no part of its graph)
    const bool low = dtype == at::kHalf || dtype == at::kBFloat16;
    const auto into = low ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt;
    o[column] = at::linalg_vector_norm(t, 2, std::nullopt, false, into).item<float>();
    o[n + column] =
        t.numel() ? at::linalg_vector_norm(t, std::numeric_limits<double>::infinity()).item<float>() : 0.0f;
    return;
  }
  o[column] = static_cast<float>(std::sqrt(s.sumsq));
  o[n + column] = static_cast<float>(s.maxabs);
}

float* row_of(const at::Tensor& out, int64_t n) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.device().is_cpu() &&
                  out.numel() == 2 * n,
              "smdebug_torch: a health row must be a contiguous float32 CPU tensor of 2 x its tensors' count");
  return out.data_ptr<float>();
}

// A model's parameters, held once: a step's row is filled from them, their gradients (read here, no
// list of them is made in Python) and the loss, by one call that converts no tensor list.
struct Watch : torch::CustomClassHolder {
  std::vector<at::Tensor> params;
  std::vector<int64_t> columns;  // each tensor's column: the weights, their gradients, the loss
  int64_t grads = 0;             // the parameters (the last ones) whose gradients are watched

  Watch(std::vector<at::Tensor> weights, std::vector<at::Tensor> grad_params, std::vector<int64_t> cols)
      : params(std::move(weights)), columns(std::move(cols)) {
    grads = static_cast<int64_t>(grad_params.size());
    params.insert(params.end(), grad_params.begin(), grad_params.end());
    TORCH_CHECK(columns.size() == params.size() || columns.size() == params.size() + 1,
                "smdebug_torch: a column for each weight, gradient and the loss");
  }

  // the row: the weights', the gradients' (with_grads false: all absent) and the loss's statistics;
  // True when every value is finite
  bool fill(const std::optional<at::Tensor>& loss, bool with_grads, at::Tensor out) {
    const int64_t n = static_cast<int64_t>(columns.size());
    float* o = row_of(out, n);
    fill_params(with_grads, o);
    if (n > static_cast<int64_t>(params.size())) put(loss.has_value() ? *loss : at::Tensor(), o, n, columns[n - 1]);
    return finite(o);
  }

  void fill_params(bool with_grads, float* o) const {
    const int64_t n = static_cast<int64_t>(columns.size());
    const int64_t weights = static_cast<int64_t>(params.size()) - grads;
    for (int64_t k = 0; k < weights; ++k) put(params[k], o, n, columns[k]);
    for (int64_t k = weights; k < weights + grads; ++k)
      put(with_grads ? params[k].grad() : at::Tensor(), o, n, columns[k]);
  }

  bool finite(const float* o) const {  // (a max |x| is NaN or inf where any value of its tensor is)
    const int64_t n = static_cast<int64_t>(columns.size());
    bool all = true;
    for (int64_t k = n; k < 2 * n; ++k) all &= std::isfinite(o[k]);
    return all;
  }

  int64_t address() { return reinterpret_cast<int64_t>(this); }
};


// -- partial statistics and reductions of any list of tensors ----------------------------------------
// A tensor's statistics, with numpy's semantics: a NaN makes every one NaN; an inf makes the squared
// deviations NaN (inf - inf), and the sums infinite (NaN when both signs are there).
struct Partial {
  double n = 0, sum = 0, m2 = 0, min = kInf, max = -kInf, asum = 0, am2 = 0, amin = kInf, amax = -kInf,
         sumsq = 0, nonfinite = 0;
};
// the columns of a row of partials (smdebug_torch.native.STATS names them)
constexpr int kStats = 11;
constexpr int kWide = 16;  // lanes of finite_stats (four to six accumulators: more would not fit the registers)

enum Want : int64_t { kAbs = 1, kVar = 2 };  // also the sums and minimum of |x|; also the squared deviations

// A block's (n, mean, squared deviations) merged into the running ones (Chan et al.'s pairwise update).
inline void merge(double& n, double& mean, double& m2, double nb, double mean_b, double m2_b) {
  const double total = n + nb, delta = mean_b - mean;
  mean += delta * nb / total;
  m2 += m2_b + delta * delta * n * nb / total;
  n = total;
}

// Every value finite (and no float sum of squares overflowing): the statistics in blocks, each summed
// in the tensor's precision over independent lanes, then in double; the squared deviations by a second
// (corrected) pass over the block while it is in the cache, merged across blocks. False: a block holds
// a NaN or an inf, or finite values whose squares overflow (the caller then reads it in double).
template <typename T, bool Abs, bool Var>
SMDEBUG_CLONES bool finite_stats(const T* x, int64_t n, Partial& p) {
  double seen = 0, mean = 0, m2 = 0, aseen = 0, amean = 0, am2 = 0;
  T lo = std::numeric_limits<T>::infinity(), hi = -lo, alo = lo;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    T s[kWide] = {}, q[kWide] = {}, as[kWide] = {}, l[kWide], h[kWide], al[kWide];
    for (int j = 0; j < kWide; ++j) l[j] = lo, h[j] = hi, al[j] = alo;
    const auto take = [&](const T v, const int j) {  // one value into lane j
      s[j] += v;
      q[j] += v * v;
      l[j] = v < l[j] ? v : l[j];
      h[j] = v > h[j] ? v : h[j];
      if (Abs) {
        const T a = std::fabs(v);
        as[j] += a;
        al[j] = a < al[j] ? a : al[j];
      }
    };
    int64_t i = start;
    for (; i + kWide <= end; i += kWide)
      for (int j = 0; j < kWide; ++j) take(x[i + j], j);
    for (int j = 0; i < end; ++i, ++j) take(x[i], j);  // the tail, spread over the lanes
    T bs = 0, bq = 0, bas = 0;
    for (int j = 0; j < kWide; ++j) {
      bs += s[j], bq += q[j], bas += as[j];
      lo = l[j] < lo ? l[j] : lo;
      hi = h[j] > hi ? h[j] : hi;
      alo = al[j] < alo ? al[j] : alo;
    }
    if (!std::isfinite(static_cast<double>(bq))) return false;
    p.sum += bs, p.sumsq += bq, p.asum += bas;
    if (Var) {
      const double nb = static_cast<double>(end - start);
      const T c = static_cast<T>(bs / static_cast<T>(nb)), ac = static_cast<T>(bas / static_cast<T>(nb));
      T d[kWide] = {}, dd[kWide] = {}, e[kWide] = {}, ee[kWide] = {};
      const auto deviate = [&](const T v, const int j) {  // one value's deviations into lane j
        const T u = v - c;
        d[j] += u;
        dd[j] += u * u;
        if (Abs) {
          const T w = std::fabs(v) - ac;
          e[j] += w;
          ee[j] += w * w;
        }
      };
      int64_t k = start;
      for (; k + kWide <= end; k += kWide)
        for (int j = 0; j < kWide; ++j) deviate(x[k + j], j);
      for (int j = 0; k < end; ++k, ++j) deviate(x[k], j);
      double sd = 0, sdd = 0, se = 0, see = 0;
      for (int j = 0; j < kWide; ++j) sd += d[j], sdd += dd[j], se += e[j], see += ee[j];
      // the deviations from c, corrected to the block's own mean
      merge(seen, mean, m2, nb, c + sd / nb, sdd - sd * sd / nb);
      if (Abs) merge(aseen, amean, am2, nb, ac + se / nb, see - se * se / nb);
    }
  }
  p.n = static_cast<double>(n);
  p.min = lo, p.max = hi, p.amax = std::fmax(-static_cast<double>(lo), static_cast<double>(hi));
  p.amin = Abs ? static_cast<double>(alo) : kInf;
  p.m2 = m2 > 0 ? m2 : 0.0, p.am2 = am2 > 0 ? am2 : 0.0;
  return true;
}

// Any values, one at a time in double (a tensor with a NaN or an inf, or with overflowing squares).
template <typename T>
void any_stats(const T* x, int64_t n, Partial& p) {
  int64_t nans = 0, infs = 0;
  double seen = 0, mean = 0, m2 = 0, amean = 0, am2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]), a = std::fabs(v);
    if (std::isnan(v)) {
      ++nans;
      continue;
    }
    p.sum += v, p.asum += a, p.sumsq += v * v;
    p.min = std::fmin(p.min, v), p.max = std::fmax(p.max, v);
    p.amin = std::fmin(p.amin, a), p.amax = std::fmax(p.amax, a);
    if (std::isinf(v)) {
      ++infs;
      continue;
    }
    seen += 1;  // Welford's update, of the values and of their magnitudes
    const double d = v - mean, e = a - amean;
    mean += d / seen, amean += e / seen;
    m2 += d * (v - mean), am2 += e * (a - amean);
  }
  p.n = static_cast<double>(n);
  p.nonfinite = static_cast<double>(nans + infs);
  p.m2 = infs ? kNaN : m2, p.am2 = infs ? kNaN : am2;
  if (nans) p.sum = p.m2 = p.min = p.max = p.asum = p.am2 = p.amin = p.amax = p.sumsq = kNaN;
}

template <typename T>
Partial stats_of_values(const T* x, int64_t n, int64_t want) {
  Partial p;
  if (n == 0) return p;
  const bool abs = want & kAbs, var = want & kVar;
  const bool ok = abs ? (var ? finite_stats<T, true, true>(x, n, p) : finite_stats<T, true, false>(x, n, p))
                      : (var ? finite_stats<T, false, true>(x, n, p) : finite_stats<T, false, false>(x, n, p));
  if (!ok) {
    p = Partial();
    any_stats(x, n, p);
  }
  return p;
}

// A plain CPU tensor whose memory this reads: dense, strided, with memory of its own (not a tensor
// subclass's or a torch.func transform's wrapper), values as they read (no negative view).
bool readable(const at::Tensor& t) {
  const auto keys = t.key_set();
  return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && t.has_storage() &&
         !keys.has_any(c10::python_ks) && !keys.has_any(c10::functorch_transforms_ks) && !t.is_neg() &&
         !t.is_conj();
}

Partial stats_of_tensor(const at::Tensor& t, int64_t want) {
  const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  return c.scalar_type() == at::kFloat ? stats_of_values(c.const_data_ptr<float>(), c.numel(), want)
                                       : stats_of_values(c.const_data_ptr<double>(), c.numel(), want);
}

// partials(tensors, want, out): each tensor's statistics into its row of out ([tensors, 11] float64:
// count, sum, m2, min, max, sum |x|, m2 of |x|, min |x|, max |x|, sum of squares, non-finite count); an
// empty tensor's row holds the neutral values (0, 0, 0, inf, -inf, 0, 0, inf, -inf, 0, 0). Other dtypes
// are read as numpy reduces them: float16/bfloat16 in float32, integers and booleans in float64,
// complex values as their magnitudes. The abs columns but max |x| are filled where want has kAbs, the
// squared deviations where it has kVar.
void partials(at::TensorList tensors, int64_t want, at::Tensor out) {
  const int64_t n = static_cast<int64_t>(tensors.size());
  TORCH_CHECK(out.scalar_type() == at::kDouble && out.is_contiguous() && out.device().is_cpu() &&
                  out.numel() == n * kStats,
              "smdebug_torch: partials need a contiguous float64 CPU tensor of [tensors, 11]");
  for (const auto& t : tensors)
    TORCH_CHECK(readable(t) || (t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
                                !t.key_set().has_any(c10::python_ks) && t.has_storage()),
                "smdebug_torch: partials of a tensor that is not a plain CPU tensor");
  double* o = out.data_ptr<double>();
  for (int64_t k = 0; k < n; ++k) {
    at::Tensor t = tensors[k];
    if (t.is_neg() || t.is_conj()) t = t.resolve_conj().resolve_neg();
    if (t.is_complex()) t = t.abs();
    if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) t = t.to(at::kFloat);
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) t = t.to(at::kDouble);
    const Partial p = stats_of_tensor(t, want);
    double* row = o + k * kStats;
    row[0] = p.n, row[1] = p.sum, row[2] = p.m2, row[3] = p.min, row[4] = p.max, row[5] = p.asum;
    row[6] = p.am2, row[7] = p.amin, row[8] = p.amax, row[9] = p.sumsq, row[10] = p.nonfinite;
  }
}

// the reductions, in the order of their codes (code = 2 x index + abs)
enum Reduction : int64_t { kMin, kMax, kMean, kStd, kVariance, kSum, kL1, kL2, kReductions };

// Each tensor's reductions (codes[0:m]) into its row of o ([n, m] float64), when every tensor is a
// non-empty plain CPU tensor and all are float32 or all float64: returns 32 or 64 (the dtype the
// reductions are stored in: float32's are rounded to float32 here, so the caller's cast is exact), else 0
// and computes nothing.
int64_t reduce_into(const at::Tensor* tensors, int64_t n, const int64_t* codes, int64_t m, double* o) {
  if (n == 0) return 0;
  const auto dtype = tensors[0].defined() ? tensors[0].scalar_type() : at::kFloat;
  if (dtype != at::kFloat && dtype != at::kDouble) return 0;
  for (int64_t k = 0; k < n; ++k)
    if (!readable(tensors[k]) || tensors[k].scalar_type() != dtype || tensors[k].numel() == 0) return 0;
  int64_t want = 0;
  for (int64_t c = 0; c < m; ++c) {
    const int64_t code = codes[c];
    TORCH_CHECK(code >= 0 && code < 2 * kReductions, "smdebug_torch: unknown reduction code");
    const int64_t r = code / 2;
    if (r == kL1 || (code % 2 && r != kMax && r != kL2)) want |= kAbs;
    if (r == kStd || r == kVariance) want |= kVar;
  }
  for (int64_t k = 0; k < n; ++k) {
    const Partial p = stats_of_tensor(tensors[k], want);
    double* row = o + k * m;
    for (int64_t c = 0; c < m; ++c) {
      const bool a = codes[c] % 2;
      switch (codes[c] / 2) {
        case kMin: row[c] = a ? p.amin : p.min; break;
        case kMax: row[c] = a ? p.amax : p.max; break;
        case kMean: row[c] = (a ? p.asum : p.sum) / p.n; break;
        case kStd: row[c] = std::sqrt((a ? p.am2 : p.m2) / p.n); break;
        case kVariance: row[c] = (a ? p.am2 : p.m2) / p.n; break;
        case kSum: row[c] = a ? p.asum : p.sum; break;
        case kL1: row[c] = p.asum; break;
        default: row[c] = std::sqrt(p.sumsq); break;
      }
      if (dtype == at::kFloat) row[c] = static_cast<float>(row[c]);
    }
  }
  return dtype == at::kFloat ? 32 : 64;
}

// reduce(tensors, codes, out): reduce_into out ([tensors, codes] float64).
int64_t reduce(at::TensorList tensors, at::IntArrayRef codes, at::Tensor out) {
  const int64_t n = static_cast<int64_t>(tensors.size()), m = static_cast<int64_t>(codes.size());
  TORCH_CHECK(out.scalar_type() == at::kDouble && out.is_contiguous() && out.device().is_cpu() &&
                  out.numel() == n * m,
              "smdebug_torch: reductions need a contiguous float64 CPU tensor of [tensors, reductions]");
  return reduce_into(tensors.data(), n, codes.data(), m, out.data_ptr<double>());
}

}  // namespace

// smdebug_health_fill(watch, out, with_grads, loss, loss_bits): Watch::fill for the watch at this address
// (kept alive by its Python object), into a contiguous float32 row of 2 x its columns at out; the loss a
// single float32 (loss_bits 32) or float64 (64) value at loss, or none (0). 1: every value finite, 0: not,
// -1: it failed (the caller then calls the method, which says why).
extern "C" int smdebug_health_fill(void* watch, float* out, int with_grads, const void* loss, int loss_bits) {
  try {
    const Watch& w = *static_cast<const Watch*>(watch);
    const int64_t n = static_cast<int64_t>(w.columns.size());
    w.fill_params(with_grads != 0, out);
    if (n > static_cast<int64_t>(w.params.size())) {
      const int64_t column = w.columns[n - 1];
      const double v = loss_bits == 32 ? *static_cast<const float*>(loss)
                       : loss_bits == 64 ? *static_cast<const double*>(loss)
                                        : -1.0;
      out[column] = out[n + column] = loss_bits ? static_cast<float>(std::fabs(v)) : -1.0f;
    }
    return w.finite(out) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

#ifdef SMDEBUG_PYTHON
// smdebug_reduce_list (a C function, called through ctypes with the GIL held): the op reduce's work for a
// Python list of tensors, without the op's dispatch and list conversion (~10x its cost on a step's cold
// caches). Only torch.Tensor and torch.nn.Parameter themselves are taken (smdebug_reduce_init names
// them), each by its TensorImpl (its _cdata); any other value, or any failure, returns 0 (the caller then
// calls the op, which takes or refuses it).
namespace {
PyObject* g_plain_types[2] = {nullptr, nullptr};
PyObject* g_cdata = nullptr;
}  // namespace

extern "C" int smdebug_reduce_init(PyObject* tensor_type, PyObject* parameter_type) {
  if (g_cdata == nullptr) g_cdata = PyUnicode_InternFromString("_cdata");
  if (g_cdata == nullptr) {
    PyErr_Clear();
    return 0;
  }
  Py_INCREF(tensor_type), Py_INCREF(parameter_type);  // (held for the process's life)
  g_plain_types[0] = tensor_type, g_plain_types[1] = parameter_type;
  return 1;
}

// reduce_into(values, codes[0:m]) into out ([rows, m] float64); values a list of rows tensors.
extern "C" int64_t smdebug_reduce_list(PyObject* values, const int64_t* codes, int64_t m, double* out,
                                       int64_t rows) {
  if (g_plain_types[0] == nullptr || !PyList_Check(values) || PyList_GET_SIZE(values) != rows) return 0;
  try {
    std::vector<at::Tensor> tensors;
    tensors.reserve(static_cast<size_t>(rows));
    for (int64_t k = 0; k < rows; ++k) {
      PyObject* item = PyList_GET_ITEM(values, k);
      const PyObject* type = reinterpret_cast<const PyObject*>(Py_TYPE(item));
      if (type != g_plain_types[0] && type != g_plain_types[1]) return 0;
      PyObject* address = PyObject_GetAttr(item, g_cdata);
      if (address == nullptr) {
        PyErr_Clear();
        return 0;
      }
      auto* impl = static_cast<c10::TensorImpl*>(PyLong_AsVoidPtr(address));
      Py_DECREF(address);
      if (impl == nullptr) {
        PyErr_Clear();
        return 0;
      }
      tensors.emplace_back(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
    }
    // the reading without the GIL, as the op's (the tensors are held here): a large model's other
    // Python threads are not stopped for it
    PyThreadState* state = PyEval_SaveThread();
    int64_t bits = 0;
    try {
      bits = reduce_into(tensors.data(), rows, codes, m, out);
    } catch (...) {
    }
    PyEval_RestoreThread(state);
    return bits;
  } catch (...) {
    return 0;
  }
}
#endif

TORCH_LIBRARY(smdebug_torch, m) {
  m.class_<Watch>("HealthWatch")
      .def(torch::init<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<int64_t>>())
      .def("fill", &Watch::fill)
      .def("address", &Watch::address);
  m.def("partials(Tensor[] tensors, int want, Tensor(a!) out) -> ()", &partials);
  m.def("reduce(Tensor[] tensors, int[] codes, Tensor(a!) out) -> int", &reduce);
}
