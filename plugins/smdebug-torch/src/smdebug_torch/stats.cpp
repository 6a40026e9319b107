// smdebug_torch's one-pass statistics kernel (built on first use by smdebug_torch.native).
//
// torch.classes.smdebug_torch.HealthWatch(weights, grad_params, columns).fill(loss, with_grads, out):
// for each weight, each parameter's gradient and the loss, the l2 norm into out[column] and the max |x|
// into out[n + column] (absent: -1 in both), in one reading of each tensor and one call for all of them.
// On the CPU every torch call costs a microsecond or more, and passing a list of tensors to one costs a
// tenth of that per tensor: more than reading a small tensor. torch's batched calls (stack, norm, abs,
// amax) read and copy a model's hundreds of weights and gradients several times.
#include <ATen/core/Tensor.h>
#include <ATen/Functions.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>

namespace {

constexpr int64_t kBlock = 4096;  // values summed in the tensor's precision before a double takes them
constexpr int kLanes = 32;        // independent accumulators: the loop is not bound by one add's latency

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

  // the row: the weights', the gradients' (with_grads false: all absent) and the loss's statistics
  void fill(const std::optional<at::Tensor>& loss, bool with_grads, at::Tensor out) {
    const int64_t n = static_cast<int64_t>(columns.size());
    float* o = row_of(out, n);
    const int64_t weights = static_cast<int64_t>(params.size()) - grads;
    for (int64_t k = 0; k < weights; ++k) put(params[k], o, n, columns[k]);
    for (int64_t k = weights; k < weights + grads; ++k)
      put(with_grads ? params[k].grad() : at::Tensor(), o, n, columns[k]);
    if (n > weights + grads) put(loss.has_value() ? *loss : at::Tensor(), o, n, columns[n - 1]);
  }
};

}  // namespace

TORCH_LIBRARY(smdebug_torch, m) {
  m.class_<Watch>("HealthWatch")
      .def(torch::init<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<int64_t>>())
      .def("fill", &Watch::fill);
}
