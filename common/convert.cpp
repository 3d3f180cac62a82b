#include "common/convert.h"

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

const char* round_mode_name(RoundMode m) {
  switch (m) {
    case RoundMode::kRint: return "rint";
    case RoundMode::kFloor: return "floor";
    case RoundMode::kCeil: return "ceil";
    case RoundMode::kAway: return "round";
    case RoundMode::kTrunc: return "trunc";
  }
  return "?";
}

std::optional<RoundMode> round_mode_from_field(int64_t v) {
  if (v < 0 || v >= kNumRoundModes) return std::nullopt;
  return static_cast<RoundMode>(v);
}

double round_to_float_format(double x, int frac_bits, int max_exp, RoundMode m) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const int min_exp = 1 - max_exp;
  // Quantum (ulp) of the destination at x's binade; subnormals share the quantum of the
  // smallest normal binade. Scaling by a power of two is exact in double for these formats.
  int e = std::ilogb(x);
  int q = (e < min_exp ? min_exp : e) - frac_bits;
  double y = std::ldexp(round_to_integral(std::ldexp(x, -q), m), q);
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -frac_bits), max_exp);
  if (std::fabs(y) > max_finite) {
    bool to_inf = m == RoundMode::kRint || m == RoundMode::kAway ||
                  (m == RoundMode::kFloor && x < 0) || (m == RoundMode::kCeil && x > 0);
    y = std::copysign(to_inf ? std::numeric_limits<double>::infinity() : max_finite, x);
  }
  return y;
}

void convert_element(isa::Dtype dst_type, void* dst, isa::Dtype src_type, const void* src,
                     RoundMode m) {
  bool ok = visit_elem_dtype(dst_type, [&](auto d) {
    bool src_ok = visit_elem_dtype(src_type, [&](auto s) {
      using SS = typename Elem<decltype(s)::value>::storage;
      SS sv;
      std::memcpy(&sv, src, sizeof(SS));
      auto dv = convert_element<decltype(d)::value, decltype(s)::value>(sv, m);
      std::memcpy(dst, &dv, sizeof(dv));
    });
    if (!src_ok)
      throw Error(fmt::format("convert_element: source type {} is not an element type",
                              isa::dtype_name(src_type)));
  });
  if (!ok)
    throw Error(fmt::format("convert_element: destination type {} is not an element type",
                            isa::dtype_name(dst_type)));
}

}  // namespace npusim
